"""benchmarks/gpu_throughput.py keeps working: its CPU smoke run prints every row with a positive, finite
number (the numbers themselves say nothing about a GPU)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, bound

pytestmark = pytest.mark.integration


def test_the_smoke_run_prints_the_table():
    path = os.pathsep.join(str(ROOT / package) for package in ("operator", "trainer_image"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py"), "--smoke", "--peak-tflops", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=bound(300), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in result.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| measure")
    }
    assert "CPU smoke run: says nothing about GPU performance" in result.stdout
    for label in (
        "plain torch loop, tokens/s",
        "largebatch trainer, tokens/s",
        "trainer / plain (median of rounds; goal >= 0.97)",
        "MFU of the trainer",
        "accumulation 4 / 1 at the same global batch, time per sample (goal <= 1.02)",
    ):
        number = float(rows[label].split("%")[0].split()[0])
        assert math.isfinite(number) and number > 0, (label, rows[label])
    assert "(peak 1 TFLOP/s bf16 (--peak-tflops))" in rows["MFU of the trainer"]
    assert rows["host syncs in a backward pass under the comm hook (fp32 / bf16 all-reduce)"] == (
        "not measured: needs a CUDA device"
    )

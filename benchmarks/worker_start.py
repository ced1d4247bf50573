"""Worker start: trainer processes forked from their torchrun agent (largebatch_trainer.forked, the
default) against torchrun's own start of a fresh interpreter per worker (LARGEBATCH_WORKER_START=exec),
side by side, alternating, on the same short job.

    .venv/bin/python benchmarks/worker_start.py [--runs 5] [--ranks 2 4] [--hog N]

A launch is one `python -m largebatch_trainer.torchrun --standalone --nproc-per-node=R` of a
`linreg` job of a few steps. Reported per mode, as medians over the runs: seconds from the launch to
the first step's report, seconds to the end, and the CPU seconds of the whole process tree (the agent and
its workers); then fork's share of exec's for each. The hog is N busy processes (default: none), the
busy machine the tests run on.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from load import cpu_hogs, side_by_side

PYTHON = sys.executable
MODES = ("exec", "fork")


def job_file(directory: Path, ranks: int) -> Path:
    batch = 16 * ranks
    job = {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": "start"},
        "spec": {
            "image": "bench",
            "task": {"entrypoint": "largebatch_trainer.tasks:linreg", "args": {"dim": 8, "samples": 512}},
            "workers": {"min": 1, "max": 1, "accelerator": "none"},
            "batch": {"initial": batch, "max": batch, "microBatchPerDevice": 16, "policy": {"type": "constant"}},
            "optimizer": {"name": "sgd", "lr": 0.05},
            "schedule": {"totalSamples": batch * 5, "warmupSamples": batch},
            "checkpoint": {"path": str(directory / "ckpt"), "everySteps": 1000},
        },
    }
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def launch(job: Path, ranks: int, mode: str) -> dict[str, float]:
    """One launch: seconds to the first step's report and to the end, CPU seconds of the tree."""
    env = dict(os.environ, LARGEBATCH_WORKER_START=mode, OMP_NUM_THREADS="1", LARGEBATCH_DEVICE="cpu",
               LARGEBATCH_METRICS_PORT="0", PYTHONUNBUFFERED="1")  # fmt: skip
    command = [
        PYTHON, "-m", "largebatch_trainer.torchrun", "--standalone", f"--nproc-per-node={ranks}",
        "--max-restarts=0", f"--log-dir={job.with_name('torchelastic')}", "-m", "largebatch_trainer", "--job", str(job),
    ]  # fmt: skip
    shutil.rmtree(job.with_name("ckpt"), ignore_errors=True)  # each launch trains from the start
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    first = None
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as agent:
        for line in agent.stdout:
            if first is None and line.startswith("step 1 "):
                first = time.monotonic() - start
    end = time.monotonic() - start
    if agent.returncode != 0 or first is None:
        raise SystemExit(f"{mode} launch of {ranks} ranks failed (exit {agent.returncode})")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"first step s": first, "end s": end, "CPU s": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--hog", type=int, default=0)
    args = parser.parse_args()
    with cpu_hogs(args.hog):
        side_by_side(MODES, args.ranks, "ranks", args.runs, job_file, lambda mode, job, ranks: launch(job, ranks, mode))


if __name__ == "__main__":
    main()

"""The zygote the process tests fork their trainers and agents from (tests/zygote.py) gives each child
what a fresh interpreter in the child's environment would have had."""

from __future__ import annotations

import os

from tests import zygote
from tests.helpers import ROOT, bound


def test_a_child_runs_as_many_intra_op_threads_as_its_environment_asks_for(tmp_path):
    # OpenMP reads OMP_NUM_THREADS once, when torch is loaded: in the zygote, from the zygote's environment.
    for threads in (1, 3):
        out, err = tmp_path / f"{threads}.out", tmp_path / f"{threads}.err"
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        child = zygote.shared().start("tests.integration.threads_probe", [], env, ROOT, out, err)
        assert child.wait(timeout=bound(120)) == 0, err.read_text()
        assert out.read_text().strip() == str(threads), f"asked for {threads} threads; stderr: {err.read_text()}"

"""Node start in `lbctl run --local`: agents forked from the run's zygote (largebatch.local.zygote, the
default) against agents started as new interpreters (`subprocess.Popen`, what the runner does without
a zygote), side by side, alternating, on the same short job.

    .venv/bin/python benchmarks/node_start.py [--runs 3] [--nodes 1 2 4] [--hog N]

A run is the local runner (largebatch.local.runner.LocalRun, as `lbctl run --local` drives it, in a
process of its own that has imported torch as lbctl has) of a `linreg` job of a few steps on NODES nodes
of one rank each. Reported per mode, as medians over the runs: seconds from the runner's start to the
first step and to the end, and the CPU seconds of the whole process tree (the runner, the zygote, the
agents and their workers); then the zygote's share of Popen's. The hog is N busy processes (default:
none), the busy machine the tests run on.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from load import cpu_hogs, side_by_side

MODES = ("popen", "zygote")


def job_file(directory: Path, nodes: int) -> Path:
    batch = 16 * nodes
    job = {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": "nodes"},
        "spec": {
            "image": "bench",
            "task": {"entrypoint": "largebatch_trainer.tasks:linreg", "args": {"dim": 8, "samples": 512}},
            "workers": {"min": nodes, "max": nodes, "accelerator": "none"},
            "batch": {"initial": batch, "max": batch, "microBatchPerDevice": 16, "policy": {"type": "constant"}},
            "optimizer": {"name": "sgd", "lr": 0.05},
            "schedule": {"totalSamples": batch * 5, "warmupSamples": batch},
            "checkpoint": {"everySteps": 1000},
        },
    }
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


class Timings:
    """The runner's display, which only notes when the first step was reported."""

    reason = ""

    def __init__(self):
        self.started = time.monotonic()
        self.first_step: float | None = None

    def event(self, text: str) -> None:
        pass

    def update(self, _runner, progress, _capacity) -> None:
        if self.first_step is None and progress.step >= 1:
            self.first_step = time.monotonic() - self.started


def one_run(mode: str, job_path: Path, run_dir: Path, nodes: int) -> None:
    """In a process of its own: one local run; prints its timings as JSON."""
    import torch  # noqa: F401  (lbctl has imported it when it starts the zygote)

    from largebatch.api import LargeBatchJob
    from largebatch.local.nodes import AGENT_MODULES
    from largebatch.local.runner import LocalRun, RunOptions
    from largebatch.local.zygote import Zygote

    timings = Timings()
    zygote = Zygote.fork(AGENT_MODULES) if mode == "zygote" else None
    job = LargeBatchJob.model_validate(yaml.safe_load(job_path.read_text()))
    runner = LocalRun(job, job_path, RunOptions(run_dir=run_dir, slots=nodes, zygote=zygote), timings)
    code = runner.run()
    if zygote is not None:
        zygote.close()  # after its children: their CPU reaches ours through it
    if code != 0 or timings.first_step is None:
        raise SystemExit(f"{mode} run of {nodes} nodes failed (exit {code}); logs: {run_dir / 'logs'}")
    print(json.dumps({"first step s": timings.first_step, "end s": time.monotonic() - timings.started}))


def measure(mode: str, job: Path, nodes: int) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(dir=job.parent))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, __file__, "--one", mode, str(job), str(run_dir), str(nodes)]
    env = dict(os.environ, LARGEBATCH_DEVICE="cpu")
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(result.stdout.splitlines()[-1]) | {"CPU s": cpu}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        mode, job, run_dir, nodes = sys.argv[2:6]
        one_run(mode, Path(job), Path(run_dir), int(nodes))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--hog", type=int, default=0)
    args = parser.parse_args()
    with cpu_hogs(args.hog):
        side_by_side(MODES, args.nodes, "nodes", args.runs, job_file, measure)


if __name__ == "__main__":
    main()

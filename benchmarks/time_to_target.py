"""Time to target: `pylm` with the same data budget under (a) constant batch with cosine decay,
(b) Seesaw and (c) the critical-batch policy, each run by the local runner, side by side in one run.

    .venv/bin/python benchmarks/time_to_target.py [--samples 100000] [--slots 2]

For each: the final held-out loss, the serial optimizer steps and wall-clock seconds, and the steps and
seconds it took to reach the constant-batch run's final training loss (training loss smoothed over the
last 10 observations; the runner observes every 0.5 s).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

BASE = {
    "apiVersion": "largebatch.io/v1alpha1",
    "kind": "LargeBatchJob",
    "metadata": {"name": "ttt"},
    "spec": {
        "image": "bench",
        "task": {
            "entrypoint": "largebatch_trainer.tasks:pylm",
            "args": {"width": 64, "depth": 2, "heads": 2, "context": 64},
        },
        "workers": {"min": 1, "max": 2, "accelerator": "none"},
        "batch": {"initial": 16, "max": 64, "microBatchPerDevice": 8},
        "optimizer": {"name": "adamw", "lr": 0.003, "baseBatch": 16, "scaling": "sqrt", "weightDecay": 0.1},
        "schedule": {"decay": "cosine", "minLrRatio": 0.05},
        "checkpoint": {"everySteps": 200},
    },
}
POLICIES = {
    "constant": {"type": "constant"},
    "seesaw": {"type": "seesaw", "seesaw": {"factor": 2}},
    "criticalBatch": {"type": "criticalBatch", "criticalBatch": {"multiplier": 1.0, "minStepsBetweenChanges": 100}},
}


def run(name: str, policy: dict, samples: int, slots: int, workdir: Path) -> dict:
    job = copy.deepcopy(BASE)
    job["metadata"]["name"] = f"ttt-{name.lower()}"
    job["spec"]["batch"]["policy"] = policy
    job["spec"]["schedule"] |= {"totalSamples": samples, "warmupSamples": samples // 100}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    run_dir = workdir / name
    command = [sys.executable, "-m", "largebatch", "run", str(path), "--local", "--run-dir", str(run_dir)]
    command += ["--metrics-port", "0", "--slots", str(slots)]
    subprocess.run(command, check=True, capture_output=True, env=dict(os.environ))
    return json.loads((run_dir / "run.json").read_text())


def smoothed(timeline: list[dict], window: int = 10) -> list[tuple[int, float, float]]:
    """(step, seconds, moving-average training loss) along the run."""
    points = [t for t in timeline if t.get("loss") is not None]
    out = []
    for i, t in enumerate(points):
        recent = [p["loss"] for p in points[max(0, i - window + 1) : i + 1]]
        out.append((t["step"], t["seconds"], sum(recent) / len(recent)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--slots", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        records = {name: run(name, policy, args.samples, args.slots, Path(tmp)) for name, policy in POLICIES.items()}
    target = smoothed(records["constant"]["timeline"])[-1][2]
    print(f"pylm {BASE['spec']['task']['args']}, {args.samples:,} samples, batch 16 → max 64, micro-batch 8,")
    print(f"{args.slots} local nodes at most; target = constant batch's final smoothed training loss {target:.4f}\n")
    columns = [("policy", -14), ("held-out loss", 14), ("serial steps", 14), ("wall s", 9)]
    columns += [("steps to target", 17), ("s to target", 13)]
    print("".join(f"{name:<{-width}}" if width < 0 else f"{name:>{width}}" for name, width in columns))
    base_steps = records["constant"]["serialSteps"]
    for name, record in records.items():
        reached = next(((step, sec) for step, sec, loss in smoothed(record["timeline"]) if loss <= target), None)
        to_target = f"{reached[0]:,} ({reached[0] / base_steps:.0%})" if reached else "not reached"
        print(
            f"{name:<14}{record['evalLoss']:>14.4f}{record['serialSteps']:>14,}{record['wallSeconds']:>9.0f}"
            f"{to_target:>17}{(f'{reached[1]:.0f}' if reached else '–'):>13}"
        )


if __name__ == "__main__":
    main()

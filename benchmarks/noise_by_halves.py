"""The cost of measuring the noise scale by halves: one worker whose whole batch is one micro-batch
runs a measuring step as two half micro-batches (`criticalBatch.measureEverySteps`). Side by side in
one process: the same model and batch under a constant policy (one micro-batch, nothing measured) and
under a critical-batch policy that cannot grow (batch.max = batch.initial) and measures on every step.

    .venv/bin/python benchmarks/noise_by_halves.py [--steps 300] [--block 10] [--batch 64] [--width 128]

The two trainers alternate blocks of steps, so that drift in the machine's speed hits both; the result
is the median of the paired block ratios (measuring / plain). One measuring step in k costs about
1/k of that ratio's excess.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def job(policy: dict, batch: int, width: int, checkpoints: str) -> dict:
    return {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": "halves"},
        "spec": {
            "image": "bench",
            "task": {
                "entrypoint": "largebatch_trainer.tasks:pylm",
                "args": {"width": width, "depth": 2, "heads": 4, "context": 64},
            },
            "workers": {"min": 1, "max": 1, "accelerator": "none"},
            "batch": {"initial": batch, "max": batch, "microBatchPerDevice": batch, "policy": policy},
            "optimizer": {"name": "adamw", "lr": 1e-3, "weightDecay": 0.1},
            "schedule": {"totalSamples": batch * 10**6, "warmupSamples": 0, "decay": "constant"},
            "checkpoint": {"path": checkpoints, "everySteps": 10**9},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    args = parser.parse_args()
    import torch

    from largebatch.api import LargeBatchJob
    from largebatch_trainer.loop import Options, Trainer

    torch.set_num_threads(1)
    trainers = {
        name: Trainer(LargeBatchJob.model_validate(job(policy, args.batch, args.width, tempfile.mkdtemp())),
                      Options(checkpoint_dir=Path(tempfile.mkdtemp()), device="cpu"))
        for name, policy in (
            ("plain", {"type": "constant"}),
            ("halves", {"type": "criticalBatch", "criticalBatch": {"measureEverySteps": 1}}),
        )
    }  # fmt: skip
    for trainer in trainers.values():  # warm up allocators and kernels
        for _ in range(args.block):
            trainer._step()
    ratios = []
    for _ in range(args.steps // args.block):
        seconds = {}
        for name, trainer in trainers.items():
            started = time.perf_counter()
            for _ in range(args.block):
                trainer._step()
            seconds[name] = time.perf_counter() - started
        ratios.append(seconds["halves"] / seconds["plain"])
    measured = trainers["halves"].noise.value
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"pylm width {args.width}, batch {args.batch} in one micro-batch, {args.steps} steps each, one thread")
    print(f"step time, measuring by halves / plain: {statistics.median(ratios):.3f} "
          f"(quartiles {quartiles[0]:.3f} – {quartiles[2]:.3f}); noise scale measured: {measured:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()

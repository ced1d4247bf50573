"""How long the trainer's checkpoint takes, for the built-in tasks at their example sizes and a larger GPT:
what a worker's grace period must cover when it is preempted (docs/operations.md, "Preemption").

    .venv/bin/python benchmarks/checkpoint_time.py [--dir /path/on/the/checkpoint/volume] [--repeats 5]

Each payload is what the trainer writes (model, AdamW state after one step, progress); the baseline is a
plain `torch.save` of the same payload to the same folder, alternated with largebatch's
`checkpoint.save` (hashed while written, fsynced, renamed into place, with a manifest), so that both meet
the same disk. Reported: the payload's size, the median seconds of each, their ratio, and the write rate
that sizes a grace period for a model these tasks are not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from largebatch_trainer import checkpoint
from largebatch_trainer.tasks import load_task

TASKS = [
    ("linreg (examples/quickstart.yaml)", "largebatch_trainer.tasks:linreg", {"dim": 64}),
    ("digits (examples/digits.yaml)", "largebatch_trainer.tasks:digits", {"width": 16, "blocks": 2}),
    ("pylm 64x2 (examples/job.yaml)", "largebatch_trainer.tasks:pylm", {"width": 64, "depth": 2, "heads": 2}),
    ("pylm 256x4 (examples/seesaw.yaml)", "largebatch_trainer.tasks:pylm", {"width": 256, "depth": 4, "context": 128}),
    ("pylm 1024x8", "largebatch_trainer.tasks:pylm", {"width": 1024, "depth": 8, "context": 128}),
]


def payload(entrypoint: str, args: dict) -> dict:
    """What the trainer's `_save` writes, after one AdamW step (its moments exist then)."""
    task = load_task(entrypoint, args, seed=0)
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=1e-3)
    batch = task.collate([task.dataset[i] for i in range(4)])
    loss, count = task.loss(task.model, batch)
    (loss / count).backward()
    optimizer.step()
    return {"model": task.model.state_dict(), "optimizer": optimizer.state_dict(),
            "progress": {"step": 1, "samples": 4}, "history": [[0, 0, 4, 1, 1]]}  # fmt: skip


def plain_save(folder: Path, state: dict) -> None:
    torch.save(state, folder / "plain.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="a folder on the disk to measure (default: /tmp)")
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'task':36} {'MB':>8} {'torch.save s':>13} {'checkpoint s':>13} {'ratio':>6} {'MB/s':>7}")
    with tempfile.TemporaryDirectory(dir=options.dir) as scratch:
        folder = Path(scratch)
        for name, entrypoint, args in TASKS:
            state = payload(entrypoint, args)
            plain, ours = [], []
            for step in range(options.repeats):
                started = time.perf_counter()
                plain_save(folder, state)
                plain.append(time.perf_counter() - started)
                started = time.perf_counter()
                written = checkpoint.save(folder / "ckpt", step, state, keep=1)
                ours.append(time.perf_counter() - started)
            megabytes = os.path.getsize(written) / 1e6
            p, o = statistics.median(plain), statistics.median(ours)
            print(f"{name:36} {megabytes:8.2f} {p:13.3f} {o:13.3f} {o / p:6.2f} {megabytes / o:7.0f}")


if __name__ == "__main__":
    main()

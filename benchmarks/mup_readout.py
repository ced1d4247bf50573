"""μP's readout, zeroed (as built, as TP5 does) or drawn like the standard model's (std 0.02): how far the
best LR moves from width 16 to 128 on the drift test's runs (`tests/unit/test_mup.py`: a tiny `pylm`,
depth 1, base width 16, AdamW at six LRs ×3 apart, the mean training loss of the last 10 steps), per seed.

    .venv/bin/python benchmarks/mup_readout.py --steps 40 --seeds 0,1,2,3
    .venv/bin/python benchmarks/mup_readout.py --steps 120 --seeds 0,1,2,3

The drawn readout is drawn after the model is built, as `mup_suspects.py`'s `readout` variant does.
"""

from __future__ import annotations

import argparse
import math

import torch

from largebatch.api import OptimizerSpec
from largebatch_trainer import optim
from largebatch_trainer.tasks import pylm

GRID = [0.001 * 3**k for k in range(6)]  # the drift test's
WIDTHS = (16, 128)


def trained_loss(width: int, lr: float, seed: int, drawn: bool, steps: int) -> float:
    torch.manual_seed(seed)
    task = pylm(width=width, depth=1, heads=2, context=16, parametrization="mup", baseWidth=16)
    if drawn:
        with torch.no_grad():
            task.model.head.weight.normal_(std=0.02)
    optimizer = optim.build(OptimizerSpec(name="adamw", lr=lr), task.model)
    samples = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        optim.set_lr(optimizer, lr * min(1.0, (step + 1) / 5))
        picks = torch.randint(len(task.dataset), (16,), generator=samples)
        loss, count = task.loss(task.model, torch.stack([task.dataset[int(i)] for i in picks]))
        (loss / count).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item() / count)
    mean = sum(losses[-10:]) / 10
    return mean if math.isfinite(mean) else math.inf


def moved(seed: int, drawn: bool, steps: int) -> int:
    """Grid steps the best LR moved from the narrow width to the wide one."""
    best = []
    for width in WIDTHS:
        losses = [trained_loss(width, lr, seed, drawn, steps) for lr in GRID]
        best.append(losses.index(min(losses)))
    return best[1] - best[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", default="0,1,2,3")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the test: the same sums on any machine
    seeds = [int(s) for s in args.seeds.split(",")]
    for drawn in (False, True):
        moves = ", ".join(f"{moved(seed, drawn, args.steps):+d}" for seed in seeds)
        readout = "drawn" if drawn else "zero"
        print(f"{args.steps} steps, readout {readout}: grid steps moved, seeds {args.seeds}: {moves}")


if __name__ == "__main__":
    main()

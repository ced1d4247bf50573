"""μP's readout, drawn like the standard model's (std 0.02, as built) or zeroed (as TP5 does, and as built
until 2026-12-03), and the standard parametrization: how far the best LR moves from width 16 to 128 on
the drift test's runs (`tests/unit/test_mup.py`: a tiny `pylm`, depth 1, base width 16, AdamW at six LRs
×3 apart, the mean training loss of the last 10 steps), per seed.

    .venv/bin/python benchmarks/mup_readout.py --steps 40 --seeds 0,1,2,3
    .venv/bin/python benchmarks/mup_readout.py --steps 120 --seeds 0,1,2,3

The runs are the test's own (`trained_loss`); the zero readout is zeroed after the model is built, as
`mup_suspects.py`'s `zeroreadout` variant does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.unit.test_mup import GRID, trained_loss  # noqa: E402

WIDTHS = (16, 128)


def moved(parametrization: str, seed: int, zero: bool, steps: int) -> int:
    """Grid steps the best LR moved from the narrow width to the wide one."""
    best = []
    for width in WIDTHS:
        losses = [trained_loss(parametrization, width, lr, steps, seed, zero_readout=zero) for lr in GRID]
        best.append(losses.index(min(losses)))
    return best[1] - best[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", default="0,1,2,3")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the test: the same sums on any machine
    seeds = [int(s) for s in args.seeds.split(",")]
    configurations = [("μP, readout drawn (as built)", "mup", False), ("μP, readout zero", "mup", True),
                      ("standard", "standard", False)]  # fmt: skip
    for name, parametrization, zero in configurations:
        moves = ", ".join(f"{moved(parametrization, seed, zero, args.steps):+d}" for seed in seeds)
        print(f"{args.steps} steps, {name}: grid steps moved, seeds {args.seeds}: {moves}")


if __name__ == "__main__":
    main()

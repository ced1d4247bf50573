"""μTransfer measured: the same `lbctl sweep` (widths × learning rates, short `lbctl run --local` proxies)
under the standard parametrization and under μP, side by side, and how far the best LR moves with
width in each. Under μP it should stay put; under the standard parametrization it should fall as the
model widens, so that the narrow proxy's best LR over- or under-shoots the wide model's.

    .venv/bin/python benchmarks/mup_transfer.py --keep /tmp/mup   # both sweeps, then the table
    .venv/bin/python benchmarks/mup_transfer.py --keep /tmp/mup   # again: every finished run is read back

For each parametrization and width the table gives the best LR and its held-out loss, and for the
widest width the loss it gets with the narrowest width's best LR (what transferring costs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

from largebatch.sweep import parse_grid

WIDTHS = "32,128"
GRID = "3e-4:1e-1:8"


def job(parametrization: str, base_width: int, samples: int) -> dict:
    return {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": f"transfer-{parametrization}"},
        "spec": {
            "image": "largebatch/trainer:bench",
            "task": {
                "entrypoint": "largebatch_trainer.tasks:pylm",
                "args": {
                    "width": 512,
                    "depth": 2,
                    "heads": 4,
                    "context": 64,
                    "parametrization": parametrization,
                    "baseWidth": base_width,
                },
            },
            "workers": {"min": 1, "max": 1, "accelerator": "none"},
            "batch": {"initial": 32, "max": 32, "microBatchPerDevice": 32, "policy": {"type": "constant"}},
            "optimizer": {"name": "adamw", "lr": 0.01, "weightDecay": 0.0},
            "schedule": {"totalSamples": samples, "warmupSamples": samples // 20, "decay": "cosine", "minLrRatio": 0.1},
            "evaluation": {"samples": 1024},
            "checkpoint": {"everySteps": 10_000},
        },
    }


def sweep(folder: Path, parametrization: str, args: argparse.Namespace) -> dict:
    path = folder / f"{parametrization}.yaml"
    path.write_text(yaml.safe_dump(job(parametrization, args.base_width, args.samples), sort_keys=False))
    command = [sys.executable, "-m", "largebatch", "sweep", str(path), "--widths", args.widths, "--lr", args.lr,
               "--local", "--parallel", str(args.parallel), "--out-dir", str(folder / parametrization)]  # fmt: skip
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return json.loads((folder / parametrization / "results.json").read_text())


def rows(parametrization: str, results: dict) -> list[str]:
    loss = {(r["width"], r["lr"]): r["loss"] for r in results["runs"]}
    best = {int(w): lr for w, lr in results["best"].items()}
    widths = sorted(best)
    narrow, wide = widths[0], widths[-1]
    grid = sorted({lr for _, lr in loss})
    steps = grid.index(best[wide]) - grid.index(best[narrow])
    transferred = loss[(wide, best[narrow])]
    cost = "diverged" if transferred is None else f"{transferred - loss[(wide, best[wide])]:+.4f}"
    cells = [f"{best[w]:.3g} ({loss[(w, best[w])]:.4f})" for w in widths]
    moved = f"×{best[wide] / best[narrow]:.3g} ({steps:+d} grid steps)"
    return [f"| {parametrization} | {' | '.join(cells)} | {moved} | {cost} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, required=True, help="folder for both sweeps (resumable)")
    parser.add_argument("--widths", default=WIDTHS)
    parser.add_argument("--lr", default=GRID)
    parser.add_argument("--samples", type=int, default=6_400, help="samples per proxy run")
    parser.add_argument("--base-width", type=int, default=32)
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    args.keep.mkdir(parents=True, exist_ok=True)
    results = {p: sweep(args.keep, p, args) for p in ("standard", "mup")}
    widths = sorted(int(w) for w in args.widths.split(","))
    print()
    print(f"| parametrization | {' | '.join(f'best LR at width {w} (held-out loss)' for w in widths)} "
          f"| best LR moved, width {widths[0]} → {widths[-1]} "
          f"| loss at width {widths[-1]} with width {widths[0]}'s best LR, − its best |")  # fmt: skip
    print("|---" * (len(widths) + 3) + "|")
    for parametrization, found in results.items():
        print("\n".join(rows(parametrization, found)))
    grid = parse_grid(args.lr)
    print(f"\nGrid {args.lr}: {', '.join(f'{lr:.3g}' for lr in grid)}; {args.samples:,} samples per run")


if __name__ == "__main__":
    main()

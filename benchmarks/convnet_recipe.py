"""The convnet recipe (Goyal et al. 2017; You et al. 2017) on the `digits` task: does 8x the batch with
LARS, the linear LR rule and gradual warmup reach the small batch's held-out accuracy, and does the
same 8x batch without them fall short? Three jobs, three seeds each, side by side in one run.

    .venv/bin/python benchmarks/convnet_recipe.py [--quick] [--seeds 3] [--epochs 20] [--sgd-lr 0.1]
        [--lars-lr 0.2] [--trust 0.02] [--warmup-epochs 2] [--out DIR] [--keep DIR] [--again DIR]

Every run is `lbctl run --local` on one node with one thread: the small ResNet with BatchNorm (width 16,
two blocks, the last BN of each block with γ = 0), BN over `batch.bnBatch` = 32 samples in every job
(so a batch of 256 is 8 BN batches of the small batch's size, in accumulation), the same data budget
(`--epochs` epochs of the 1,437 training images, rounded down to whole batches of 256), cosine decay to
0, weight decay 5e-4 on the convolutions and the head (none on γ, β and biases), momentum 0.9. The seed
moves the initialisation and the data order.

- small: batch 32, SGD, LR `--sgd-lr`, no warmup (the reference);
- recipe: batch 256 (8x), LARS with `--trust` as its trust coefficient, LR `--lars-lr` at batch 32 under
  the linear rule (x8), gradual warmup over the first `--warmup-epochs`;
- naive: batch 256, SGD, LR `--sgd-lr` under the linear rule (x8), no warmup.

Reported: mean ± standard deviation over the seeds of the final held-out accuracy (all 360 held-out
images: one image is 0.28 points) and of its gap to the small batch's run of the same seed (the seed
moves every job alike), in points; the final held-out loss; serial steps; wall time per run.
`--again DIR` redraws the table from runs kept with `--keep DIR`.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

from time_to_target import mean_sd, run  # the same `lbctl run --local` driver and table cells

TRAINING_IMAGES = 1437
BN_BATCH = 32
LARGE = 256
BASE = {
    "apiVersion": "largebatch.io/v1alpha1",
    "kind": "LargeBatchJob",
    "metadata": {"name": "convnet"},
    "spec": {
        "image": "bench",
        "task": {"entrypoint": "largebatch_trainer.tasks:digits", "args": {"width": 16, "blocks": 2}},
        "workers": {"min": 1, "max": 1, "accelerator": "none"},
        "batch": {"microBatchPerDevice": 256, "bnBatch": BN_BATCH, "policy": {"type": "constant"}},
        "optimizer": {"baseBatch": 32, "scaling": "linear", "momentum": 0.9, "weightDecay": 5e-4},
        "schedule": {"decay": "cosine", "minLrRatio": 0.0},
        "evaluation": {"samples": 360},
        "checkpoint": {"everySteps": 100_000},
    },
}
# Two slots for a one-worker job: its node gets one thread (cores / slots). Two threads on this busy
# 2-core machine ran the small convolutions up to 15x slower than one.
SLOTS = 2


def jobs_for(seed: int, epochs: int, args: argparse.Namespace) -> dict[str, dict]:
    """The three jobs of one seed."""
    warmup = round(min(args.warmup_epochs, epochs / 2) * TRAINING_IMAGES)
    total = epochs * TRAINING_IMAGES // LARGE * LARGE  # whole steps of every job, whole BN batches
    settings = {
        "small": (32, {"name": "sgd", "lr": args.sgd_lr}, 0),
        "recipe": (LARGE, {"name": "lars", "lr": args.lars_lr, "trustCoefficient": args.trust}, warmup),
        "naive": (LARGE, {"name": "sgd", "lr": args.sgd_lr}, 0),
    }
    jobs = {}
    for name, (batch, optimizer, warmup_samples) in settings.items():
        job = copy.deepcopy(BASE)
        job["metadata"]["name"] = f"convnet-{name}-{seed}"
        spec = job["spec"]
        spec["task"]["seed"] = seed
        spec["batch"] |= {"initial": batch, "max": batch}
        spec["optimizer"] |= optimizer
        spec["schedule"] |= {"totalSamples": total, "warmupSamples": warmup_samples}
        jobs[name] = job
    return jobs


def table(records: dict[str, list[dict]]) -> list[str]:
    lines = [
        "| job | held-out accuracy, % | − small batch's, same seed (points) | held-out loss | serial steps "
        "| wall s per run |",
        "|---|---|---|---|---|---|",
    ]
    small = records["small"]
    for name, runs in records.items():
        accuracy = [100 * r["evalAccuracy"] for r in runs]
        gap = [100 * (r["evalAccuracy"] - s["evalAccuracy"]) for r, s in zip(runs, small, strict=True)]
        lines.append(
            f"| {name} | {mean_sd(accuracy, 2)} | {mean_sd(gap, 2) if name != 'small' else '0'} "
            f"| {mean_sd([r['evalLoss'] for r in runs], 4)} | {mean_sd([r['serialSteps'] for r in runs])} "
            f"| {mean_sd([r['wallSeconds'] for r in runs])} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 epochs and one seed (a check that it runs)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sgd-lr", type=float, default=0.1, help="SGD's LR at batch 32")
    parser.add_argument("--lars-lr", type=float, default=0.2, help="LARS's LR at batch 32")
    parser.add_argument("--trust", type=float, default=0.02, help="LARS's trust coefficient")
    parser.add_argument("--warmup-epochs", type=float, default=2.0, help="the recipe's warmup (at most half)")
    parser.add_argument("--out", type=Path, help="write the table and every run's summary here as JSON")
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument("--again", type=Path, help="no runs: the table from the runs kept in this folder")
    args = parser.parse_args()
    epochs, seeds = (3, 1) if args.quick else (args.epochs, args.seeds)
    jobs = [jobs_for(seed, epochs, args) for seed in range(seeds)]
    records: dict[str, list[dict]] = {name: [] for name in jobs[0]}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.again or args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        # Seeds outermost: a job's runs spread over the whole benchmark, not one stretch of load.
        for by_name in jobs:
            for name, job in by_name.items():
                if args.again:
                    records[name].append(json.loads((workdir / job["metadata"]["name"] / "run.json").read_text()))
                else:
                    records[name].append(run(job, workdir, SLOTS))
    title = (
        f"digits ResNet (width 16, 2 blocks), {epochs} epochs of {TRAINING_IMAGES:,} images, bnBatch {BN_BATCH}, "
        f"{seeds} seed(s); small and naive: SGD lr {args.sgd_lr} at batch 32; recipe: LARS lr {args.lars_lr} at "
        f"batch 32, trust coefficient {args.trust}, warmup {min(args.warmup_epochs, epochs / 2):g} epochs"
    )
    lines = table(records)
    print(title + "\n")
    print("\n".join(lines))
    if args.out:
        keys = ("job", "evalAccuracy", "evalLoss", "finalLoss", "serialSteps", "wallSeconds", "evaluations")
        summary = {n: [{k: r[k] for k in keys} for r in rs] for n, rs in records.items()}
        (args.out / "convnet_recipe.json").write_text(json.dumps({"title": title, "table": lines, "records": summary}))


if __name__ == "__main__":
    main()

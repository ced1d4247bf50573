"""Time to target: the batch policies on `pylm` with the same data budget, three seeds each, judged by
held-out loss, side by side in one run.

    .venv/bin/python benchmarks/time_to_target.py [--quick] [--seeds 3] [--first-seed 0] [--samples 40000]
        [--policies constant seesaw ...] [--scaling linear] [--moments perSample] [--multiplier M]
        [--width 64 --depth 2] [--optimizer adamw --lr 3e-3 --weight-decay 0.1] [--out benchmarks] [--keep DIR]

Every run is `lbctl run --local` on one node with the batch growing at most 16x (16 -> 256), the
initial batch in one micro-batch, AdamW with the linear LR rule (`--scaling`), and cosine decay to 1% (so
Seesaw takes its full set of cuts). The trainer evaluates the held-out loss on the same held-out
samples every 5% of the data budget and at the end (`spec.evaluation`, recorded in run.json). The seed
moves the initialisation and the data order.

For each policy: mean ± standard deviation over the seeds of the final held-out loss (and of its
difference from the constant run of the same seed: the seed moves every policy alike), of the serial
optimizer steps, and of the steps at which the held-out loss first reaches the constant-batch run's
final mean held-out loss (interpolated between evaluations; also where the mean curve reaches it);
`lbctl plan`'s predicted serial-step saving beside the measured one; and a plot
(`time_to_target.png`): held-out loss against serial steps, one band (mean ± sd) per policy.
`--again DIR` redraws the table and plot from runs kept with `--keep DIR`.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from largebatch import schedule
from largebatch.api import LargeBatchJob

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
        "workers": {"min": 1, "max": 1, "accelerator": "none"},
        "batch": {"initial": 16, "max": 256, "microBatchPerDevice": 16},
        "optimizer": {"name": "adamw", "lr": 0.003, "baseBatch": 16, "weightDecay": 0.1},
        "schedule": {"decay": "cosine", "minLrRatio": 0.01},
        "evaluation": {"samples": 2048},
        "checkpoint": {"everySteps": 1000},
    },
}
POLICIES = {
    "constant": {"type": "constant"},
    "linearRamp": {"type": "linearRamp", "linearRamp": {"increment": 16, "rampSamples": None}},
    "seesaw": {"type": "seesaw", "seesaw": {"factor": 2}},
    "seesaw-uncapped": {"type": "seesaw", "seesaw": {"factor": 2, "capAtCriticalBatch": False}},
    "criticalBatch": {"type": "criticalBatch"},
    # Before the defaults were revisited: a change at most every 100 steps, then also smoothed harder.
    "critical-min100": {"type": "criticalBatch", "criticalBatch": {"minStepsBetweenChanges": 100}},
    "critical-min100-smooth99": {
        "type": "criticalBatch",
        "criticalBatch": {"minStepsBetweenChanges": 100, "smoothing": 0.99},
    },
    "critical-preconditioned": {"type": "criticalBatch", "criticalBatch": {"estimator": "preconditioned"}},
}


def job_for(
    name: str, seed: int, samples: int, scaling: str, multiplier: float | None, config: dict | None = None
) -> dict:
    """The job of policy `name`; `config` overrides the task's args and the optimizer's fields (a held-out
    configuration: another model size, SGD)."""
    job = copy.deepcopy(BASE)
    config = config or {}
    job["spec"]["task"]["args"] |= config.get("args", {})
    job["spec"]["optimizer"] |= config.get("optimizer", {})
    job["metadata"]["name"] = f"ttt-{name.lower()}-{seed}"
    policy = copy.deepcopy(POLICIES[name])
    if policy["type"] == "linearRamp":
        policy["linearRamp"]["rampSamples"] = samples // 2  # 16 -> 256 over the first half
    if multiplier is not None:  # the critical batch of criticalBatch and of Seesaw's cap
        policy.setdefault("criticalBatch", {})["multiplier"] = multiplier
    spec = job["spec"]
    # A Megatron/GPT-3 batch ramp leaves the LR schedule alone; a 16x ramp under the linear rule would
    # multiply the peak LR by 16.
    spec["optimizer"]["scaling"] = "none" if policy["type"] == "linearRamp" else scaling
    spec["batch"]["policy"] = policy
    spec["task"]["seed"] = seed
    spec["schedule"] |= {"totalSamples": samples, "warmupSamples": samples // 100}
    spec["evaluation"]["everySamples"] = samples // 20
    return job


def run(job: dict, workdir: Path, slots: int = 1) -> dict:
    """`lbctl run --local` of `job` in `workdir`, its run.json. Each node gets cores / `slots` threads."""
    name = job["metadata"]["name"]
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    run_dir = workdir / name
    command = [sys.executable, "-m", "largebatch", "run", str(path), "--local", "--run-dir", str(run_dir)]
    command += ["--metrics-port", "0", "--slots", str(slots)]
    if (run_dir / "run.json").exists():  # kept from an earlier, interrupted benchmark
        return json.loads((run_dir / "run.json").read_text())
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{name} failed with exit code {result.returncode}:\n{result.stderr[-3000:]}")
    print(f"  {name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return json.loads((run_dir / "run.json").read_text())


def steps_to(record: dict, target: float) -> float | None:
    """Serial steps at which the held-out loss first reaches `target`, linear between evaluations."""
    points = [(0, None)] + [(e["step"], e["evalLoss"]) for e in record["evaluations"]]
    for (s0, l0), (s1, l1) in zip(points, points[1:], strict=False):
        if l1 <= target:
            if l0 is None or l0 == l1:
                return float(s1)
            return s0 + (l0 - target) / (l0 - l1) * (s1 - s0)
    return None


def mean_curve(runs: list[dict]) -> list[tuple[float, float]]:
    """(mean steps, mean held-out loss) at each evaluation, over the seeds."""
    count = min(len(r["evaluations"]) for r in runs)
    return [
        (statistics.mean(r["evaluations"][i]["step"] for r in runs),
         statistics.mean(r["evaluations"][i]["evalLoss"] for r in runs))
        for i in range(count)
    ]  # fmt: skip


def predicted_saving(job: dict, record: dict) -> float:
    """`lbctl plan`'s serial-step saving against constant batch, with the noise scale the run measured
    (its median over the run) where the policy reads it."""
    spec = LargeBatchJob.model_validate(job).spec
    measured = [t["noiseScale"] for t in record["timeline"] if t.get("noiseScale")]
    noise = statistics.median(measured) if measured else None
    steps = sum(p.steps for p in schedule.phases(spec, noise))
    base = sum(p.steps for p in schedule.phases(schedule.constant_baseline(spec)))
    return 1 - steps / base


def mean_sd(values: list[float], digits: int = 0) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):,.{digits}f} ± {sd:,.{digits}f}"


def table(records: dict[str, list[dict]], jobs: dict[str, list[dict]]) -> tuple[list[str], float]:
    target = statistics.mean(r["evalLoss"] for r in records["constant"])
    base_steps = statistics.mean(r["serialSteps"] for r in records["constant"])
    lines = [
        "| policy | final held-out loss | − constant's, same seed | serial steps | saving measured "
        "| saving planned | steps to target (runs reaching it) | mean curve reaches target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in records.items():
        reached = [s for s in (steps_to(r, target) for r in runs) if s is not None]
        curve = steps_to({"evaluations": [{"step": s, "evalLoss": v} for s, v in mean_curve(runs)]}, target)
        steps = [r["serialSteps"] for r in runs]
        # The seed moves every policy's loss alike (initialisation, data order): compare seed by seed.
        paired = [r["evalLoss"] - c["evalLoss"] for r, c in zip(runs, records["constant"], strict=True)]
        planned = statistics.mean(predicted_saving(j, r) for j, r in zip(jobs[name], runs, strict=True))
        lines.append(
            f"| {name} | {mean_sd([r['evalLoss'] for r in runs], 4)} | {mean_sd(paired, 4)} | {mean_sd(steps)} "
            f"| {1 - statistics.mean(steps) / base_steps:+.1%} | {planned:+.1%} "
            f"| {mean_sd(reached)} ({len(reached)}/{len(runs)}) | {'–' if curve is None else f'{curve:,.0f}'} |"
        )
    return lines, target


def plot(records: dict[str, list[dict]], target: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, runs in records.items():
        steps, mean = zip(*mean_curve(runs), strict=True)
        losses = [[r["evaluations"][i]["evalLoss"] for r in runs] for i in range(len(steps))]
        sd = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in losses]
        (line,) = ax.plot(steps, mean, label=name, linewidth=1.5)
        low = [m - s for m, s in zip(mean, sd, strict=True)]
        high = [m + s for m, s in zip(mean, sd, strict=True)]
        ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
    ax.axhline(target, color="black", linestyle=":", linewidth=1, label="target: constant's final mean")
    ax.set_xlabel("serial optimizer steps")
    ax.set_ylabel("held-out loss (mean ± sd over seeds)")
    ax.set_title(title.replace("; ", "\n"), fontsize=9)
    ax.set_ylim(target - 0.1, target + 0.6)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _summary(record: dict) -> dict:
    keys = ("job", "evalLoss", "finalLoss", "serialSteps", "wallSeconds", "evaluations", "history")
    return {key: record[key] for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="12,000 samples and two seeds (about 4 minutes)")
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    parser.add_argument("--width", type=int, help="pylm's width (default 64); with --depth, a held-out size")
    parser.add_argument("--depth", type=int, help="pylm's depth (default 2)")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--lr", type=float, help="peak LR at batch 16 (default 3e-3 for adamw)")
    parser.add_argument("--weight-decay", type=float, help="optimizer.weightDecay (default 0.1: AdamW's)")
    parser.add_argument("--moments", choices=["perSample", "perStep"], help="optimizer.moments (default: the API's)")
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    parser.add_argument(
        "--scaling", choices=["linear", "sqrt", "none"], default="linear", help="the LR rule of every job"
    )
    parser.add_argument("--multiplier", type=float, help="criticalBatch.multiplier of every job (default: the API's)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument("--again", type=Path, help="no runs: the table and plot from the runs kept in this folder")
    args = parser.parse_args()
    samples, seeds = (12_000, 2) if args.quick else (args.samples, args.seeds)
    names = ["constant"] + [n for n in args.policies if n != "constant"]
    config = {
        "args": {k: v for k, v in (("width", args.width), ("depth", args.depth)) if v is not None},
        "optimizer": {"name": args.optimizer}
        | ({"lr": args.lr} if args.lr else {})
        | ({"weightDecay": args.weight_decay} if args.weight_decay is not None else {})
        | ({"moments": args.moments} if args.moments else {}),
    }
    seed_range = range(args.first_seed, args.first_seed + seeds)
    jobs = {
        name: [job_for(name, seed, samples, args.scaling, args.multiplier, config) for seed in seed_range]
        for name in names
    }
    records: dict[str, list[dict]] = {name: [] for name in names}
    if args.again:
        for name in names:
            records[name] = [
                json.loads((args.again / j["metadata"]["name"] / "run.json").read_text()) for j in jobs[name]
            ]
    else:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = args.keep or Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            # Seeds outermost: a policy's runs spread over the whole benchmark, not one stretch of load.
            for i in range(seeds):
                for name in names:
                    records[name].append(run(jobs[name][i], workdir))
    lines, target = table(records, jobs)
    args_text = BASE["spec"]["task"]["args"] | config["args"]
    multiplier = "" if args.multiplier is None else f", multiplier {args.multiplier}"
    optimizer = BASE["spec"]["optimizer"] | config["optimizer"]
    title = (
        f"pylm {args_text}, {optimizer}, {samples:,} samples, batch 16 -> 256, {args.scaling} LR rule{multiplier}, "
        f"seeds {seed_range.start}-{seed_range.stop - 1}; target {target:.4f} (constant's final mean held-out loss)"
    )
    print(title + "\n")
    print("\n".join(lines))
    (args.out / ("time_to_target" + ("-quick" if args.quick else "") + ".json")).write_text(
        json.dumps(
            {"title": title, "table": lines, "records": {n: [_summary(r) for r in rs] for n, rs in records.items()}}
        )
    )
    plot(records, target, args.out / ("time_to_target" + ("-quick" if args.quick else "") + ".png"), title)


if __name__ == "__main__":
    main()

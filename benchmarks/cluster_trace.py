"""Many jobs on one shared cluster: a discrete-event simulation of a trace of LargeBatchJobs under three
ways of giving out GPUs, side by side on the same trace (benchmarks/README.md, "Sharing a cluster").

The simulation and its three schemes (static, first-come, the allocator) are `largebatch.simulation`'s.
Each simulated job follows this project's real schedule and takes, per step, the time of a step-time
model calibrated on measured runs: Pollux's published placements of ResNet-50 on ImageNet and BERT
fine-tuning on T4 GPUs (16 nodes of 4, as here; the measurements are `MEASURED` below, taken from the
AdaptDL repository's simulator traces, and the fit is printed). Every change of a job's worker count
pauses it for `--restart-seconds`.

The trace: `--jobs` arrivals (Poisson, `--hours` long), half ResNet-like and half BERT-like, batch
policies Seesaw 35%, critical batch 25%, linear ramp 20%, constant 20%, sizes drawn log-normal in GPU
hours; everything from `--seed`. The allocator's rules were settled on seed 0; the README reports
seeds 1-3.

    .venv/bin/python benchmarks/cluster_trace.py --seeds 1 2 3
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import random
import statistics
from dataclasses import dataclass

import numpy as np

from largebatch import simulation
from largebatch.api import LargeBatchJobSpec

GPUS_PER_NODE = 4

# (placement: GPUs on each node, local batch per GPU, seconds per step), from Pollux's measurements
# (github.com/petuum/adaptdl, simulator/traces/{imagenet,bert}/placements.csv), rounded to the ms.
MEASURED = {
    "resnet": [
        ("1", 20, 0.147), ("1", 40, 0.253), ("1", 81, 0.421), ("1", 115, 0.560), ("1", 163, 0.762), ("1", 200, 0.924),
        ("11", 20, 0.257), ("11", 81, 0.430), ("11", 200, 0.960),
        ("111", 20, 0.237), ("111", 81, 0.434), ("111", 200, 0.969),
        ("1111", 20, 0.334), ("1111", 81, 0.436), ("1111", 200, 0.984),
        ("122", 20, 0.321), ("122", 81, 0.464), ("122", 200, 1.034),
        ("1234", 20, 0.299), ("1234", 81, 0.477), ("1234", 200, 1.044),
        ("1244", 20, 0.350), ("1244", 81, 0.525), ("1244", 200, 0.999),
        ("2", 20, 0.153), ("2", 81, 0.427), ("2", 200, 0.945), ("4", 20, 0.161), ("4", 81, 0.449), ("4", 200, 1.005),
        ("2222", 20, 0.406), ("2222", 81, 0.476), ("2222", 200, 0.979),
        ("3333", 20, 0.350), ("3333", 81, 0.532), ("3333", 200, 1.060),
        ("44", 20, 0.561), ("44", 81, 0.574), ("44", 200, 1.015),
    ],
    "bert": [
        ("1", 4, 0.455), ("1", 6, 0.569), ("1", 8, 0.703), ("1", 11, 0.855), ("1", 12, 0.922),
        ("2", 4, 0.474), ("2", 8, 0.712), ("2", 12, 0.919),
        ("11", 4, 1.225), ("11", 8, 1.399), ("11", 12, 1.481),
        ("111", 4, 1.112), ("111", 8, 1.212), ("111", 12, 1.290),
        ("1111", 4, 1.187), ("1111", 8, 1.308), ("1111", 12, 1.471),
        ("222", 4, 1.401), ("222", 8, 1.488), ("222", 12, 1.544),
        ("2222", 4, 1.415), ("2222", 8, 1.538), ("2222", 12, 1.654),
        ("1234", 4, 1.421), ("1234", 8, 1.555), ("1234", 12, 1.722),
    ],
}  # fmt: skip
MICRO_BATCH = {"resnet": 128, "bert": 12}
"""Largest local batch per GPU (within what was measured)."""


@dataclass(frozen=True)
class StepModel:
    """Pollux's step time: a micro-step's compute alpha + beta·b on local batch b, a synchronisation that
    depends on how many nodes take part, and the two overlapping as (c^gamma + s^gamma)^(1/gamma)."""

    alpha: float
    beta: float
    sync_node: float
    """Synchronising two or more GPUs of one node."""
    sync_net: float
    """Synchronising over two nodes; `sync_per_node` more for each node after the second."""
    sync_per_node: float
    gamma: float

    def sync(self, gpus: int) -> float:
        nodes = -(-gpus // GPUS_PER_NODE)
        if gpus == 1:
            return 0.0
        return self.sync_node if nodes == 1 else self.sync_net + self.sync_per_node * (nodes - 2)

    def step(self, gpus: int, batch: int, micro: int) -> float:
        micro_steps = -(-batch // (gpus * micro))
        compute = self.alpha + self.beta * batch / (gpus * micro_steps)
        last = (compute**self.gamma + self.sync(gpus) ** self.gamma) ** (1 / self.gamma)
        return (micro_steps - 1) * compute + last

    @classmethod
    def fit(cls, rows: list[tuple[str, int, float]]) -> StepModel:
        """alpha and beta from one GPU by least squares, the rest by a grid search of the squared error."""
        single = np.array([(b, t) for p, b, t in rows if p == "1"], dtype=float)
        beta, alpha = np.polyfit(single[:, 0], single[:, 1], 1)
        multi = [(sum(map(int, p)), len(p), b, t) for p, b, t in rows if p != "1"]
        gpus, nodes, local, seconds = (np.array(column, dtype=float) for column in zip(*multi, strict=True))
        compute = alpha + beta * local
        net, per_node = np.meshgrid(np.arange(0.0, 1.501, 0.01), np.arange(0.0, 0.201, 0.01), indexing="ij")
        best = (math.inf, None)
        for gamma in np.arange(1.0, 6.01, 0.25):
            for node in np.arange(0.0, 0.301, 0.005):
                sync = np.where(nodes == 1, node, net[..., None] + per_node[..., None] * (nodes - 2))
                error = (((compute**gamma + sync**gamma) ** (1 / gamma) - seconds) ** 2).sum(axis=-1)
                i, j = np.unravel_index(np.argmin(error), error.shape)
                if error[i, j] < best[0]:
                    best = (error[i, j], cls(alpha, beta, node, net[i, j], per_node[i, j], gamma))
        return best[1]


# --- the trace ------------------------------------------------------------------------------------------------


def trace(seed: int, jobs: int, hours: float, models: dict[str, StepModel]) -> list[simulation.Job]:
    rng = random.Random(seed)
    out, clock = [], 0.0
    for i in range(jobs):
        clock += rng.expovariate(jobs / (hours * 3600))
        kind = "resnet" if rng.random() < 0.5 else "bert"
        micro = MICRO_BATCH[kind]
        initial = micro * rng.choice([1, 2, 4])
        policy = rng.choices(["seesaw", "criticalBatch", "linearRamp", "constant"], [35, 25, 20, 20])[0]
        grow = rng.choice([8, 16, 32])
        if policy == "constant":
            initial *= rng.choice([1, 4, 8])
        maximum = initial if policy == "constant" else initial * grow
        gpu_hours = min(20.0, max(0.05, rng.lognormvariate(math.log(1.5), 1.0)))
        model = models[kind]
        per_sample = model.step(1, micro, micro) / micro  # one GPU at its largest local batch
        total = int(gpu_hours * 3600 / per_sample)
        noise = initial * rng.choice([2, 8, 32]) if policy in ("criticalBatch", "seesaw") else None
        document = {
            "image": "sim",
            "task": {"entrypoint": "sim:task"},
            "workers": {"min": 1, "max": min(32, -(-maximum // micro)), "accelerator": "nvidia.com/gpu"},
            "batch": {"initial": initial, "max": maximum, "microBatchPerDevice": micro,
                      "policy": {"type": policy} | ({"linearRamp": {"increment": initial,
                                                                    "rampSamples": total // 2}}
                                                   if policy == "linearRamp" else {})},
            "optimizer": {"name": "adamw", "lr": 0.001, "baseBatch": initial, "scaling": "sqrt"},
            "schedule": {"totalSamples": total, "warmupSamples": total // 20, "decay": "cosine", "minLrRatio": 0.1},
        }  # fmt: skip
        spec = LargeBatchJobSpec.model_validate(document)
        step_time = functools.partial(model.step, micro=micro)
        out.append(simulation.Job(f"t/{i:03d}-{kind}-{policy}", clock, spec, step_time, noise))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--period", type=float, default=60.0, help="seconds between allocations")
    parser.add_argument("--restart-seconds", type=float, default=30.0)
    args = parser.parse_args()
    models = {kind: StepModel.fit(rows) for kind, rows in MEASURED.items()}
    for kind, model in models.items():
        print(f"{kind}: " + ", ".join(f"{k} {v:.4g}" for k, v in dataclasses.asdict(model).items()))
    print(f"\n{args.jobs} jobs over {args.hours} h on {args.gpus} GPUs, allocation every {args.period:.0f} s, "
          f"restart {args.restart_seconds:.0f} s\n")  # fmt: skip
    print("| seed | scheme | mean JCT, h | p90 JCT, h | makespan, h | GPU utilisation | rescales per job |"
          " mean JCT vs static | vs first-come |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        jobs = trace(seed, args.jobs, args.hours, models)
        results = {s: simulation.simulate(jobs, s, args.gpus, args.period, args.restart_seconds, seed)
                   for s in simulation.SCHEMES}  # fmt: skip
        base, fc = statistics.mean(results["static"].jct), statistics.mean(results["first-come"].jct)
        for scheme, r in results.items():
            mean = statistics.mean(r.jct)
            p90 = statistics.quantiles(r.jct, n=10)[-1]
            hours = [f"{x / 3600:.2f}" for x in (mean, p90, r.makespan)]
            vs = [f"{mean / base - 1:+.0%}", f"{mean / fc - 1:+.0%}"]
            cells = [seed, scheme, *hours, f"{r.utilisation:.0%}", f"{r.rescales:.1f}", *vs]
            print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()

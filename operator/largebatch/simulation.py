"""A shared cluster, simulated: jobs that follow their real schedule (`schedule.phases`: the batch at
every sample) and step at the time a step-time model gives, under one of three ways of giving out GPUs.
Pure: no I/O, a clock that is a number. benchmarks/cluster_trace.py runs traces of a hundred jobs through
it; the e2e test of the operator's allocations (tests/e2e/test_sharing.py) runs a small one, against the
same jobs trained (simulated trainers) by the real operator.

- static: each job gets, when it starts, the workers its largest batch wants and keeps them to the end,
  first come first served with backfilling (what a Kubeflow PyTorchJob with fixed replicas gets);
- first-come: the operator without sharing: each job's own `controller.decide` with the free GPUs as its
  capacity, growing when its batch grows and a GPU is free, never giving one back;
- allocator: `allocate.allocate` over all jobs every period, each job's `controller.decide` taking its
  allocation as the capacity.

Every change of a job's worker count (a start too) pauses it for the restart. The allocator sees no more
than the operator would: the throughput each job showed at the worker counts it ran at, fitted by
`allocate.Speed`, not the model the simulation runs.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from largebatch import allocate, controller, schedule
from largebatch.api import LargeBatchJobSpec

StepTime = Callable[[int, int], float]
"""Seconds a step takes on `workers` workers at global batch `batch`."""

SCHEMES = ("static", "first-come", "allocator")


@dataclass
class Job:
    name: str
    arrival: float
    spec: LargeBatchJobSpec
    step_time: StepTime
    noise_scale: float | None = None
    """The gradient noise scale the critical-batch and Seesaw policies see (constant here)."""
    # simulation state
    samples: float = 0.0
    workers: int = 0
    paused_until: float = 0.0
    last_rescale: float | None = None
    rescales: int = 0
    finish: float | None = None
    measured: dict[int, allocate.Measured] = field(default_factory=dict)
    allocations: list[tuple[float, int]] = field(default_factory=list)
    """(time, workers) at every change of the job's worker count."""

    def __post_init__(self) -> None:
        self.phases = schedule.phases(self.spec, self.noise_scale)

    @property
    def total(self) -> int:
        return self.spec.schedule.total_samples

    @property
    def static_workers(self) -> int:
        return schedule.desired_workers(self.spec, max(p.global_batch for p in self.phases))

    @property
    def per_worker(self) -> int:
        return self.spec.workers.devices_per_worker * self.spec.batch.micro_batch

    def phase(self) -> tuple[int, schedule.Phase, int]:
        """(index, phase, steps before it) at the job's progress."""
        steps = 0
        for i, p in enumerate(self.phases):
            if self.samples < p.end:
                return i, p, steps
            steps += p.steps
        return len(self.phases) - 1, self.phases[-1], steps - self.phases[-1].steps

    def progress(self) -> schedule.Progress:
        i, p, before = self.phase()
        step = before + int((self.samples - p.start) // p.global_batch)
        changed = before if i and self.phases[i - 1].global_batch != p.global_batch else 0
        return schedule.Progress(samples=int(self.samples), step=step, batch=p.global_batch,
                                 last_change_step=changed, noise_scale=self.noise_scale)  # fmt: skip


@dataclass
class Result:
    jobs: list[Job]
    """The jobs as they ended (finish times, rescales, allocations)."""
    makespan: float
    utilisation: float

    @property
    def jct(self) -> list[float]:
        return [j.finish - j.arrival for j in self.jobs]

    @property
    def rescales(self) -> float:
        return statistics.mean(j.rescales for j in self.jobs)


def simulate(jobs: list[Job], scheme: str, gpus: int, period: float, restart: float, seed: int) -> Result:
    """Run `jobs` (left as they are) to their ends on `gpus` GPUs, deciding every `period` seconds."""
    jobs = [dataclasses.replace(j, measured={}, allocations=[]) for j in jobs]
    noise = random.Random(seed)
    clock, busy = 0.0, 0.0
    while any(j.finish is None for j in jobs):
        present = [j for j in jobs if j.arrival <= clock and j.finish is None]
        targets = _targets(present, scheme, gpus, clock, restart)
        for j in present:
            target = targets.get(j.name, j.workers)
            if target != j.workers:
                if j.workers and target:
                    j.rescales += 1
                if target:
                    j.paused_until = clock + restart
                j.workers, j.last_rescale = target, clock
                j.allocations.append((clock, target))
        busy += period * sum(j.workers for j in present)
        for j in present:
            _run(j, clock, clock + period, noise)
        clock += period
    first = min(j.arrival for j in jobs)
    makespan = max(j.finish for j in jobs) - first
    return Result(jobs, makespan, busy / (gpus * makespan))


def _run(job: Job, start: float, end: float, noise: random.Random) -> None:
    """Train from `start` to `end` on the job's workers, phase by phase; record the throughput seen."""
    t = max(start, job.paused_until)
    while job.workers and t < end and job.samples < job.total:
        _, phase, _ = job.phase()
        rate = phase.global_batch / job.step_time(job.workers, phase.global_batch)
        samples = min(phase.end - job.samples, rate * (end - t))
        job.samples += samples
        t += samples / rate
        # What the trainer reports: the throughput of its last steps, within a few percent.
        job.measured[job.workers] = allocate.Measured(job.workers, phase.global_batch,
                                                      rate * noise.uniform(0.97, 1.03))  # fmt: skip
        if job.samples >= job.total - 1e-6:
            job.finish = t


def _observation(job: Job, clock: float, capacity: int, restart: float) -> controller.Observation:
    seen = job.measured.get(job.workers)
    return controller.Observation(
        progress=job.progress(),
        workers=job.workers,
        capacity=capacity,
        samples_per_second=seen.samples_per_second if seen and clock >= job.paused_until else None,
        seconds_since_rescale=None if job.last_rescale is None else clock - job.last_rescale,
        restart_seconds=restart,
    )


def _targets(present: list[Job], scheme: str, gpus: int, clock: float, restart: float) -> dict[str, int]:
    if scheme == "static":
        free = gpus - sum(j.workers for j in present)
        out = {}
        for j in sorted(present, key=lambda j: j.arrival):  # first come first served, with backfilling
            if not j.workers and j.static_workers <= free:
                out[j.name], free = j.static_workers, free - j.static_workers
        return out
    if scheme == "first-come":
        free = gpus - sum(j.workers for j in present)
        out = {}
        for j in sorted(present, key=lambda j: j.arrival):
            decision = controller.decide(j.spec, _observation(j, clock, j.workers + free, restart))
            if decision.workers >= j.spec.workers.min or j.workers:
                out[j.name] = max(decision.workers, j.workers) if decision.workers <= j.workers + free else j.workers
                free -= out[j.name] - j.workers
        return out
    demands = []
    for j in present:
        batch = schedule.plan(j.spec, j.progress()).policy_batch
        demands.append(allocate.Demand(
            name=j.name, batch=batch, per_worker=j.per_worker, minimum=j.spec.workers.min,
            maximum=j.spec.workers.max, remaining_samples=int(j.total - j.samples), current=j.workers,
            devices_per_worker=j.spec.workers.devices_per_worker, priority=j.spec.priority, arrival=j.arrival,
            speed=allocate.Speed.fit(j.measured.values()), restart_seconds=restart))  # fmt: skip
    given = allocate.allocate(demands, gpus).workers
    out = {}
    for j in present:
        cap = given[j.name]
        if cap < j.workers or not cap:
            out[j.name] = cap  # taken away: shrink (or stop) now
        else:
            out[j.name] = controller.decide(j.spec, _observation(j, clock, cap, restart)).workers
    return out

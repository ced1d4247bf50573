"""The controller: how many workers a job should run now. Pure: the operator (Kubernetes) and the local
runner observe the world, call `decide()`, and act on the answer.

Every membership change restarts every worker (torchrun stops the group, the trainer checkpoints and
resumes), so a rescale costs `restart_seconds` of the whole job. The rule:

- Fewer workers than `workers.min` (a start, or a job waiting for capacity): start the desired count.
- More workers than the capacity: shrink to the capacity (forced: the nodes are gone anyway); more
  than `workers.max` (the spec was edited): shrink to it.
- Otherwise grow to `desired_workers()` only when the expected gain outweighs the restart: with
  throughput proportional to workers, the remaining R samples take R/s seconds now and R/s × n/m with
  m workers, so grow when R/s × (1 − n/m) > restart_seconds, and not within `cooldown_seconds` of the
  last rescale (so a flapping capacity cannot make the job thrash).
- Never shrink voluntarily: the batch never shrinks, so extra workers stay useful.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from largebatch import schedule
from largebatch.api import LargeBatchJobSpec, Rescale


@dataclass(frozen=True)
class Observation:
    """What a shell knows about a running job."""

    progress: schedule.Progress
    """Progress as rank 0 last reported it (the empty progress before the first report)."""
    workers: int
    """Workers (nodes) running now."""
    capacity: int | None = None
    """Most workers that can be placed now; None when unknown (no limit seen)."""
    samples_per_second: float | None = None
    """Current training throughput, when measured."""
    seconds_since_rescale: float | None = None
    """Time since the last membership change; None if there was none."""
    restart_seconds: float = 15.0
    """Expected cost of a rescale (measured by the shell when it can)."""


class Kind(str, enum.Enum):
    """What a decision is, for machines: condition reasons, Event reasons and metric labels."""

    START = "Start"
    """Fewer workers than workers.min: start the ones the batch wants."""
    WAITING_FOR_CAPACITY = "WaitingForCapacity"
    """The cluster cannot place workers.min workers: wait."""
    CAPACITY_LIMITED = "CapacityLimited"
    """Fewer workers than the batch wants fit (or the capacity fell): accumulation carries the batch."""
    ABOVE_MAX = "AboveMax"
    """More workers than workers.max (the spec was edited): shrink to it."""
    STEADY = "Steady"
    """The workers serve the batch."""
    COOLING_DOWN = "CoolingDown"
    """A rescale happened too recently to grow again."""
    NOT_WORTH_RESTART = "NotWorthRestart"
    """Growing would save less time than the restart costs."""
    GROW = "Grow"
    """Add workers for a larger batch."""
    COMPLETE = "Complete"
    """Training is complete."""


@dataclass(frozen=True)
class Decision:
    workers: int
    kind: Kind
    reason: str
    """One sentence with the numbers, for people."""

    def changes(self, current: int) -> bool:
        return self.workers != current

    def rescale(self, current: int, samples: int, time: str | None = None) -> Rescale:
        """The record of this decision taken on `current` workers after `samples` samples: the job's
        `status.rescales` (the operator, with the time) and a local run's run.json (the runner)."""
        return Rescale(time=time, from_workers=current, to_workers=self.workers, samples=samples,
                       kind=self.kind.value, reason=self.reason)  # fmt: skip


def decide(spec: LargeBatchJobSpec, seen: Observation) -> Decision:
    total = spec.schedule.total_samples
    n = seen.workers
    if seen.progress.samples >= total:
        return Decision(n, Kind.COMPLETE, "training complete")
    batch = schedule.plan(spec, seen.progress).policy_batch
    wanted = schedule.desired_workers(spec, batch, seen.capacity)
    if seen.capacity is not None and n > seen.capacity:
        limit = min(seen.capacity, spec.workers.max)
        return Decision(limit, Kind.CAPACITY_LIMITED, f"capacity fell to {seen.capacity} workers")
    if n > spec.workers.max:
        return Decision(spec.workers.max, Kind.ABOVE_MAX, f"workers.max is {spec.workers.max}")
    if n < spec.workers.min:
        if seen.capacity is not None and seen.capacity < spec.workers.min:
            return Decision(
                n,
                Kind.WAITING_FOR_CAPACITY,
                f"waiting for capacity: {seen.capacity} < workers.min {spec.workers.min}",
            )
        return Decision(wanted, Kind.START, f"start {wanted} workers for batch {batch}")
    if wanted <= n:
        unlimited = schedule.desired_workers(spec, batch)
        if unlimited > n:
            return Decision(n, Kind.CAPACITY_LIMITED, _short_of(spec, batch, unlimited, n))
        return Decision(n, Kind.STEADY, f"{n} workers serve batch {batch}")
    cooldown = seen.restart_seconds * 2
    if seen.seconds_since_rescale is not None and seen.seconds_since_rescale < cooldown:
        return Decision(
            n,
            Kind.COOLING_DOWN,
            f"cooling down: {seen.seconds_since_rescale:.0f} s since the last rescale < {cooldown:.0f} s",
        )
    if seen.samples_per_second:
        remaining = (total - seen.progress.samples) / seen.samples_per_second
        gain = remaining * (1 - n / wanted)
        if gain <= seen.restart_seconds:
            return Decision(
                n,
                Kind.NOT_WORTH_RESTART,
                f"{n}→{wanted} workers would save {gain:.0f} s, less than a {seen.restart_seconds:.0f} s restart",
            )
        return Decision(wanted, Kind.GROW, f"batch {batch}: {n}→{wanted} workers saves ~{gain:.0f} s")
    return Decision(wanted, Kind.GROW, f"batch {batch} wants {wanted} workers")


def _short_of(spec: LargeBatchJobSpec, batch: int, wanted: int, placed: int) -> str:
    devices = placed * spec.workers.devices_per_worker
    accumulation, _ = schedule.split_size(batch, devices, spec.batch.micro_batch_per_device, spec.batch.bn_batch)
    return f"batch {batch} needs {wanted} workers, {placed} fit: accumulation {accumulation}"


# --- capacity schedules (`lbctl run --capacity 0:1,30%:3,70%:2`) ---------------------------------------

_STEP = re.compile(r"^\s*(\d+(?:\.\d+)?)(%?)\s*:\s*(\d+)\s*$")


def parse_capacity(text: str) -> list[tuple[float, int]]:
    """`0:1,30%:3,70%:2` → [(0.0, 1), (0.3, 3), (0.7, 2)]: from each fraction of totalSamples on, at most
    that many workers can be placed. A bare number is a fraction (0.3), a number with % a percentage."""
    steps = []
    for part in text.split(","):
        match = _STEP.match(part)
        if not match:
            raise ValueError(f"--capacity: step {part.strip()!r} is not FRACTION:WORKERS (for example 30%:3)")
        value, percent, workers = match.groups()
        at = float(value) / (100 if percent else 1)
        if not 0 <= at <= 1:
            raise ValueError(f"--capacity: step {part.strip()!r}: the point must be within 0..100% of the run")
        steps.append((at, int(workers)))
    if [s[0] for s in steps] != sorted(s[0] for s in steps):
        raise ValueError(f"--capacity: steps must be in increasing order, got {text!r}")
    if steps[0][0] != 0:
        raise ValueError(f"--capacity: the schedule must start at 0 (for example 0:1), got {text!r}")
    return steps


def check_capacity(steps: list[tuple[float, int]], slots: int, workers_min: int) -> None:
    """Refuse a capacity that would hold a job below workers.min: progress could never reach the next
    step of the schedule, so the run would wait there forever."""
    if slots < workers_min:
        raise ValueError(f"--slots: this machine holds {slots} node(s) but workers.min is {workers_min}: "
                         "raise --slots or lower workers.min")  # fmt: skip
    for at, workers in steps:
        if workers < workers_min:
            raise ValueError(f"--capacity: from {at:.0%} on it places {workers} worker(s), fewer than workers.min "
                             f"{workers_min}: the job would wait there forever; give each step at least "
                             f"{workers_min}")  # fmt: skip


def capacity_at(steps: list[tuple[float, int]], fraction: float) -> int:
    return [workers for at, workers in steps if at <= fraction][-1]

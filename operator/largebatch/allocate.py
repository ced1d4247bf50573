"""Sharing scarce accelerators among jobs: how many workers each job may run. Pure: the operator (and the
cluster simulation in benchmarks/cluster_trace.py) describes every job's demand and the GPUs free for
these jobs, and `allocate()` answers a worker count per job, with a sentence for each job it moves.
Each job's own controller (`controller.decide`) then takes that count as its capacity, so accumulation
keeps the batch exact whatever a job is given.

The rules, in the order they are applied (docs/architecture.md, "Sharing the cluster"):

1. Minimums first: every job gets `workers.min` or nothing, the highest priority first and, within a
   priority, running jobs first (a running job is never stopped for a waiting one of its own
   priority), then waiting jobs by arrival. So a running job loses its minimum only to a higher
   priority's minimum.
2. Priority tiers are strict beyond the minimums: a tier gets everything its jobs can use (rules 3-5)
   before the next lower one gets a GPU more than its minimums, so a higher-priority job takes GPUs
   from a lower one, never the other way round.
3. Fair share: each admitted job is guaranteed its max-min fair share of the tier's GPUs, capped at
   what its batch can use, so a small job is never starved by a large one. What a job holds within its
   share it keeps; a job below its share grows to it (taking GPUs held beyond a share, if need be).
4. Beyond the shares, GPUs a job already holds stay with it while it can use them (no thrash), and
   free ones go one worker at a time to the job whose remaining time that worker shortens most.
5. A job grows only when the time its new workers save exceeds the restart the change costs (the same
   rule as `controller.decide`); never above the workers its batch can use (accumulation already 1:
   another worker would gain nothing).

A job's speed at a worker count it never ran at comes from `Speed`, a two-term model of a step (the
compute, divided among the workers, plus a synchronisation paid once more than one worker runs),
fitted to the throughput measured at the counts it did run at (Pollux's model, without the overlap).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Measured:
    """Throughput seen at one worker count."""

    workers: int
    batch: int
    samples_per_second: float


@dataclass(frozen=True)
class Speed:
    """A job's step time at `n` workers for global batch `B`: t = compute·B/n + sync·[n > 1], fitted to
    what was measured (least squares over the points; a single point, or points all at one worker count,
    give no sync term: perfect scaling assumed, as `controller.decide` assumes)."""

    compute: float
    """Seconds per sample on one worker."""
    sync: float = 0.0
    """Seconds per step spent synchronising gradients, once there are two workers or more."""

    @classmethod
    def fit(cls, points: Iterable[Measured]) -> Speed | None:
        """The model of the points; None without any."""
        rows = [(p.batch / p.workers, 1.0 if p.workers > 1 else 0.0, p.batch / p.samples_per_second)
                for p in points if p.samples_per_second > 0]  # fmt: skip
        if not rows:
            return None
        scaling_perfectly = cls(compute=sum(t for _, _, t in rows) / sum(x for x, _, _ in rows))
        if len({(x, y) for x, y, _ in rows}) < 2 or len({y for _, y, _ in rows}) < 2:
            return scaling_perfectly
        # Normal equations of t = compute·x + sync·y, solved in closed form (two unknowns).
        sxx, sxy, syy = (sum(a * b for a, b in pairs) for pairs in (
            ((x, x) for x, _, _ in rows), ((x, y) for x, y, _ in rows), ((y, y) for _, y, _ in rows)))  # fmt: skip
        sxt, syt = sum(x * t for x, _, t in rows), sum(y * t for _, y, t in rows)
        det = sxx * syy - sxy * sxy
        compute, sync = (sxt * syy - syt * sxy) / det, (syt * sxx - sxt * sxy) / det
        if sync < 0 or compute <= 0:  # noise: a faster step with more workers than compute allows
            return scaling_perfectly
        return cls(compute=compute, sync=sync)

    def samples_per_second(self, workers: int, batch: int) -> float:
        return batch / (self.compute * batch / workers + (self.sync if workers > 1 else 0.0))


def wanted(batch: int, per_worker: int, minimum: int, maximum: int) -> int:
    """Workers that bring accumulation to 1 at `batch`, within workers.min..max: more would gain nothing."""
    return max(minimum, min(maximum, -(-batch // per_worker)))


@dataclass(frozen=True)
class Demand:
    """One job, as the allocator sees it."""

    name: str
    """namespace/name, for the sentences."""
    batch: int
    """The global batch the job's policy asks for now."""
    per_worker: int
    """Samples one worker takes per micro-step (devices per worker × micro-batch per device)."""
    minimum: int
    maximum: int
    """workers.min and workers.max."""
    remaining_samples: int
    current: int = 0
    """Workers the job runs now (0: waiting)."""
    devices_per_worker: int = 1
    priority: int = 0
    arrival: float = 0.0
    """Order among waiting jobs of one priority (the creation time, in any unit)."""
    speed: Speed | None = None
    """None until the job has run: it then gets its share and nothing beyond (no gain to weigh)."""
    restart_seconds: float = 15.0

    @property
    def wanted(self) -> int:
        return wanted(self.batch, self.per_worker, self.minimum, self.maximum)

    def accumulation(self, workers: int) -> int:
        return -(-self.batch // (workers * self.per_worker))

    def seconds_left(self, workers: int) -> float:
        assert self.speed is not None
        return self.remaining_samples / self.speed.samples_per_second(workers, self.batch)

    def saves(self, workers: int) -> float:
        """Seconds that running `workers` instead of `current` saves (negative: loses)."""
        if self.speed is None or not self.current or not workers:
            return 0.0
        return self.seconds_left(self.current) - self.seconds_left(workers)


@dataclass(frozen=True)
class Allocation:
    workers: dict[str, int]
    """Job name → workers it may run."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Job name → why its count differs from what it runs now (only jobs that move or wait)."""


def allocate(demands: Iterable[Demand], gpus: int) -> Allocation:
    """Worker counts for `demands` sharing `gpus` accelerators (rules in the module docstring)."""
    jobs = sorted(demands, key=lambda d: (-d.priority, d.arrival, d.name))
    give = {d.name: 0 for d in jobs}
    why: dict[str, str] = {}
    tiers = [[d for d in jobs if d.priority == p] for p in sorted({d.priority for d in jobs}, reverse=True)]
    free, admitted = gpus, set()
    for tier in tiers:  # rule 1: every tier's minimums before any tier's more
        for d in sorted(tier, key=lambda d: (d.current < d.minimum, d.arrival, d.name)):
            need = d.minimum * d.devices_per_worker
            if need <= free:
                give[d.name], free = d.minimum, free - need
                admitted.add(d.name)
            else:
                why[d.name] = f"workers.min {d.minimum} needs {need} GPUs, {free} left at priority {d.priority}"
    for tier in tiers:
        free = _serve([d for d in tier if d.name in admitted], free, give)
    return Allocation(give, _reasons(jobs, give, why, free))


def _serve(admitted: list[Demand], free: int, give: dict[str, int]) -> int:
    """Rules 3-5 for the admitted jobs of one priority tier; returns the GPUs left for the lower tiers."""
    share = _fair_shares(admitted, free + sum(d.minimum * d.devices_per_worker for d in admitted))

    def raise_to(d: Demand, workers: int) -> None:
        nonlocal free
        more = min(workers - give[d.name], free // d.devices_per_worker)
        if more > 0:
            give[d.name] += more
            free -= more * d.devices_per_worker

    for d in admitted:  # rule 3: what a job holds within its share
        raise_to(d, min(d.current, share[d.name]))
    for d in admitted:  # rule 3: up to the share, if it is worth a restart (a start always is)
        if _worth(d, share[d.name]):
            raise_to(d, share[d.name])
    for d in sorted(admitted, key=lambda d: -_held_value(d)):  # rule 4: what a job holds beyond its share
        raise_to(d, min(d.current, d.wanted))
    return _grow(admitted, free, give)


def _fair_shares(jobs: list[Demand], gpus: int) -> dict[str, int]:
    """Max-min fair shares of `gpus` in workers: one worker at a time to the job holding the fewest GPUs
    that can still use one, each at least its minimum and at most what its batch can use."""
    share = {d.name: d.minimum for d in jobs}
    left = gpus - sum(d.minimum * d.devices_per_worker for d in jobs)
    while True:
        open_ = [d for d in jobs if share[d.name] < d.wanted and d.devices_per_worker <= left]
        if not open_:
            return share
        # Among equals, the job that holds more than its share so far: a tie never moves a GPU.
        d = min(open_, key=lambda d: (share[d.name] * d.devices_per_worker, share[d.name] >= d.current, d.arrival,
                                      d.name))  # fmt: skip
        share[d.name] += 1
        left -= d.devices_per_worker


def _grow(jobs: list[Demand], free: int, give: dict[str, int]) -> int:
    """Rule 4's free GPUs, a worker at a time by seconds saved per GPU; then rule 5: a job whose growth
    does not pay for its restart keeps what it had, and its GPUs go round again."""
    held = dict(give)
    refused: set[str] = set()
    while True:
        trial, left = dict(held), free
        while True:
            best, gain = None, 0.0
            for d in jobs:
                n = trial[d.name]
                if d.name in refused or d.speed is None or n >= d.wanted or d.devices_per_worker > left or not n:
                    continue
                per_gpu = (d.seconds_left(n) - d.seconds_left(n + 1)) / d.devices_per_worker
                if per_gpu > gain:
                    best, gain = d, per_gpu
            if best is None:
                break
            trial[best.name] += 1
            left -= best.devices_per_worker
        unpaid = {d.name for d in jobs if trial[d.name] > max(held[d.name], d.current)
                  and d.current and not _worth(d, trial[d.name])}  # fmt: skip
        if not unpaid:
            give.update(trial)
            return left
        refused |= unpaid


def _worth(d: Demand, workers: int) -> bool:
    """Whether going from `current` to `workers` pays for the restart (rule 5)."""
    if workers <= d.current or not d.current or d.speed is None:
        return True
    return d.saves(workers) > d.restart_seconds


def _held_value(d: Demand) -> float:
    """Seconds the job's last held worker saves it: the held GPUs worth most are kept first."""
    n = min(d.current, d.wanted)
    if d.speed is None or n < 2:
        return 0.0
    return d.seconds_left(n - 1) - d.seconds_left(n)


def _reasons(jobs: list[Demand], give: Mapping[str, int], why: Mapping[str, str], free: int) -> dict[str, str]:
    """A sentence for each job that moves or waits, naming the jobs on the other side of the move, and for
    each job kept below what its batch wants beside `free` GPUs because a worker more would not pay."""
    gainers = [d for d in jobs if give[d.name] > d.current]
    losers = [d for d in jobs if give[d.name] < d.current]
    out = {}
    for d in gainers:
        n, m = d.current, give[d.name]
        gpus = (m - n) * d.devices_per_worker
        what = (f"batch {d.batch:,} runs {d.accumulation(max(n, 1))} micro-batches per worker on {n}"
                if n else f"starts for batch {d.batch:,}")  # fmt: skip
        saved = d.saves(m)
        took = [f"{o.name} at batch {o.batch:,}" for o in losers if o.priority <= d.priority]
        out[d.name] = (f"{n} → {m} workers (+{gpus} GPUs): {what}" + (f", saves ~{saved:,.0f} s" if saved else "")
                       + (f"; from {', '.join(took)}" if took else ""))  # fmt: skip
    for d in losers:
        n, m = d.current, give[d.name]
        gpus = (n - m) * d.devices_per_worker
        to = [o for o in gainers if o.priority >= d.priority]
        if any(o.priority > d.priority for o in to):
            cause = "higher priority"
        elif m < d.wanted and to:
            cause = "their fair share of the GPUs"
        else:
            cause = "the cluster has fewer GPUs for these jobs"
        names = ", ".join(f"{o.name} (batch {o.batch:,})" for o in to) or "no job"
        stopped = f"; {why[d.name]}" if m == 0 and d.name in why else ""
        out[d.name] = f"{n} → {m} workers (−{gpus} GPUs) to {names}: {cause}{stopped}"
    for d in jobs:
        if d.name not in out and not give[d.name] and d.name in why:
            out[d.name] = f"waits: {why[d.name]}"
        n = give[d.name]
        if d.name not in out and d.speed and n and n == d.current < d.wanted and free >= d.devices_per_worker:
            # No seconds in it: they shrink as the run goes on, and the sentence lands in a condition.
            out[d.name] = f"stays at {n} workers: " + (
                f"{n + 1} would not save the {d.restart_seconds:,.0f} s a restart costs" if d.saves(n + 1) > 0
                else f"{n + 1} were measured slower than {n}")  # fmt: skip
    return out

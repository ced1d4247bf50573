"""The schedule core: the global batch and learning rate of every optimizer step. Pure: no I/O, no torch.

- `plan(spec, progress)`: batch, LR and Adam coefficients of the next step, from the samples consumed so
  far (and, where the policy reads them, the smoothed gradient noise scale and the previous batch in
  `progress`).
- `moments(spec, batch)`: Adam's (beta1, beta2) and eps at a global batch.
- `advance(progress, plan)`: the progress after that step.
- `split(global_batch, world_size, max_micro_batch, bn_batch)` (`largebatch.split`, re-exported here):
  per-rank micro-batches and accumulation steps (with `bn_batch`, micro-batches of exactly that many
  samples, the same at every world size).
- `split_size(...)`: the same split's accumulation steps and largest micro-batch, without building it.
- `desired_workers(spec, global_batch, capacity)`: the worker count that brings accumulation to 1.
- `phases(spec)`: the whole run as phases of constant batch, with exact optimizer step counts.

The trainer, the controller and `lbctl plan` all call these functions, so they cannot disagree.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from functools import lru_cache

from largebatch.api import LargeBatchJobSpec, PolicySpec, ScheduleSpec
from largebatch.split import Split, desired_workers, split, split_size  # noqa: F401  (the schedule core's too)


@dataclass(frozen=True)
class Progress:
    """How far training got, plus the state the batch policy carries from step to step."""

    samples: int = 0
    """Samples consumed by the optimizer steps taken so far."""
    step: int = 0
    """Optimizer steps taken so far."""
    batch: int | None = None
    """Global batch the policy chose for the last step (None before the first step)."""
    last_change_step: int = 0
    """Step at which the policy last changed the batch."""
    noise_scale: float | None = None
    """Smoothed gradient noise scale B_simple, when measured."""


@dataclass(frozen=True)
class Plan:
    """The plan of one optimizer step."""

    global_batch: int
    """Samples this step takes: the policy's batch, cut short only by the end of the data budget."""
    lr: float
    """Learning rate of this step."""
    phase: str
    """Phase of the batch policy, for people (warmup, cut 2/6, ramp 3/8, ...)."""
    policy_batch: int
    """The batch the policy asks for; the LR rule, the moments and the policy state use this one."""
    betas: tuple[float, float]
    """Adam's moment coefficients for this step (`moments`)."""
    eps: float
    """Adam's denominator epsilon for this step (`moments`)."""


def plan(spec: LargeBatchJobSpec, progress: Progress) -> Plan:
    """Global batch and LR of the step after `progress`."""
    total = spec.schedule.total_samples
    if progress.samples >= total:
        raise ValueError(f"training is complete: {progress.samples} of {total} samples consumed")
    policy = spec.batch.policy
    if policy.type == "seesaw":
        cuts = seesaw_cuts(spec)
        k = bisect.bisect_right(cuts, progress.samples)
        batch = _seesaw_batch(spec, progress, cuts, k)
        # Each cut multiplies the LR by sqrt(growth)/factor, so after k cuts the product telescopes.
        lr_multiplier = math.sqrt(batch / spec.batch.initial) / policy.seesaw.factor**k
        lr = spec.optimizer.lr * _lr_rule(spec, spec.batch.initial) * lr_multiplier
        phase = f"cut {k}/{len(cuts)}"
    else:
        if policy.type == "linearRamp":
            level, levels = _ramp_level(spec, progress.samples)
            batch = spec.batch.initial + level * policy.linear_ramp.increment
            phase = f"ramp {level}/{levels}"
        elif policy.type == "criticalBatch":
            batch = _critical_batch(spec, progress)
            phase = "critical"
        else:
            batch = spec.batch.initial
            phase = "constant"
        lr = spec.optimizer.lr * _lr_rule(spec, batch) * decay_multiplier(spec.schedule, progress.samples)
    warmup = spec.schedule.warmup_samples
    if progress.samples < warmup:
        # Gradual warmup (Goyal et al.): the LR reaches its peak with the step that ends the warmup.
        lr *= min(1.0, (progress.samples + batch) / warmup)
        phase = "warmup"
    betas, eps = moments(spec, batch)
    return Plan(
        global_batch=min(batch, total - progress.samples),
        lr=lr,
        phase=phase,
        policy_batch=batch,
        betas=betas,
        eps=eps,
    )


def advance(progress: Progress, step_plan: Plan) -> Progress:
    """The progress after taking the step `step_plan` describes."""
    changed = progress.batch is not None and step_plan.policy_batch != progress.batch
    return replace(
        progress,
        samples=progress.samples + step_plan.global_batch,
        step=progress.step + 1,
        batch=step_plan.policy_batch,
        last_change_step=progress.step if changed else progress.last_change_step,
    )


# --- learning rate --------------------------------------------------------------------------------


def _lr_rule(spec: LargeBatchJobSpec, batch: int) -> float:
    ratio = batch / spec.base_batch
    return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[spec.optimizer.scaling]


def decay_multiplier(schedule: ScheduleSpec, samples: int) -> float:
    """The base schedule's LR multiplier after `samples`: 1 until warmup ends, then down to minLrRatio."""
    span = schedule.total_samples - schedule.warmup_samples
    t = min(1.0, max(0.0, (samples - schedule.warmup_samples) / span))
    r = schedule.min_lr_ratio
    if schedule.decay == "cosine":
        return r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * t))
    if schedule.decay == "linear":
        return 1.0 - (1.0 - r) * t
    return 1.0


def moments(spec: LargeBatchJobSpec, batch: int) -> tuple[tuple[float, float], float]:
    """Adam's (beta1, beta2) and eps at global batch `batch`. Per sample, k = batch/baseBatch steps take the
    samples of k base steps, so each beta is raised to the k-th power (its moment forgets at the same
    rate per sample) and eps divided by sqrt(k): the averaged gradient's noise, which sqrt(v) measures,
    shrinks by sqrt(k) too. Per step, both stay as given."""
    beta1, beta2 = spec.optimizer.betas
    if spec.optimizer.moments == "perStep":
        return (beta1, beta2), spec.optimizer.eps
    k = batch / spec.base_batch
    return (beta1**k, beta2**k), spec.optimizer.eps / math.sqrt(k)


# --- seesaw ---------------------------------------------------------------------------------------

# Cuts far beyond any real run (factor 2: the 64th cut divides the LR by 2**64).
_MAX_CUTS = 64
# The critical-batch grid from batch.initial to batch.max has at most log2(65536 x 1e15) < 70 steps.
MAX_GRID_STEPS = 128


def seesaw_cuts(spec: LargeBatchJobSpec) -> tuple[int, ...]:
    """Sample counts at which the Seesaw cuts happen: cut k at the first sample after warmup where the
    base decay has fallen to factor**-k or below, for the cuts at or above minLrRatio within the run."""
    s = spec.schedule
    return _cuts(s.total_samples, s.warmup_samples, s.decay, s.min_lr_ratio, spec.batch.policy.seesaw.factor)


@lru_cache(maxsize=256)
def _cuts(total: int, warmup: int, decay: str, min_lr_ratio: float, factor: float) -> tuple[int, ...]:
    schedule = ScheduleSpec(total_samples=total, warmup_samples=warmup, decay=decay, min_lr_ratio=min_lr_ratio)
    cuts: list[int] = []
    for k in range(1, _MAX_CUTS + 1):
        target = factor**-k
        t = _decay_inverse(schedule, target)
        if t is None:
            break
        # The closed form lands within a sample of the answer; step to the exact first sample so that
        # the cut agrees with decay_multiplier() bit for bit.
        c = warmup + math.ceil(t * (total - warmup))
        while c > warmup and decay_multiplier(schedule, c - 1) <= target:
            c -= 1
        while c < total and decay_multiplier(schedule, c) > target:
            c += 1
        if c >= total:
            break
        cuts.append(c)
    return tuple(cuts)


def _decay_inverse(schedule: ScheduleSpec, multiplier: float) -> float | None:
    """Fraction of the post-warmup samples at which the base decay reaches `multiplier`, if it does."""
    r = schedule.min_lr_ratio
    if multiplier < r or schedule.decay == "constant":
        return None
    if schedule.decay == "cosine":
        x = 2.0 * (multiplier - r) / (1.0 - r) - 1.0
        return math.acos(max(-1.0, min(1.0, x))) / math.pi
    return (1.0 - multiplier) / (1.0 - r)


def _seesaw_batch(spec: LargeBatchJobSpec, progress: Progress, cuts: tuple[int, ...], k: int) -> int:
    """The batch after `k` cuts. Without the cap it is the k-th level. With `capAtCriticalBatch`, each cut
    the run has just passed climbs one level only if that level stays at or below the critical batch
    measured then; otherwise the batch stays and the cut takes the LR down by the full factor."""
    levels = _seesaw_levels(spec, len(cuts))
    if not spec.batch.policy.seesaw.cap_at_critical_batch:
        return levels[k]
    if progress.batch is None:
        return levels[0]
    # The cuts passed since the previous step (which started `progress.batch` samples ago).
    passed = k - bisect.bisect_right(cuts, progress.samples - progress.batch)
    batch = progress.batch
    cap = critical_batch(spec, progress.noise_scale)
    for _ in range(passed):
        higher = next((level for level in levels if level > batch), batch)
        if cap is None or higher <= cap:
            batch = higher
    return batch


def critical_batch(spec: LargeBatchJobSpec, noise_scale: float | None) -> float | None:
    """`criticalBatch.multiplier` (by default, the LR rule's) x the measured noise scale, or None before it is
    measured."""
    if noise_scale is None:
        return None
    return spec.critical_multiplier * noise_scale


def _seesaw_levels(spec: LargeBatchJobSpec, cuts: int) -> list[int]:
    """The batch after 0..cuts cuts, each cut growing it by `batchFactor` up to batch.max. A cut that grows
    the batch by g multiplies the LR by sqrt(g)/factor: by factor**-0.5 for a full batch step, by 1/factor
    once the batch is at its max. Stability (LR divisor factor/sqrt(g) >= sqrt(g)) needs g <= factor, so
    a batch rounded to whole samples is rounded down where rounding to nearest would grow it by more."""
    seesaw = spec.batch.policy.seesaw
    levels = [spec.batch.initial]
    for k in range(1, cuts + 1):
        ideal = min(spec.batch.max, round(spec.batch.initial * seesaw.growth**k))
        levels.append(max(levels[-1], _bn_floor(spec, min(ideal, math.floor(levels[-1] * seesaw.factor)))))
    return levels


def _bn_floor(spec: LargeBatchJobSpec, batch: int) -> int:
    """`batch` rounded down to a multiple of batch.bnBatch (never below one bnBatch): down, so that a
    Seesaw step stays within its stability limit and a critical-batch step at or below its target."""
    bn = spec.batch.bn_batch
    return batch if bn is None else max(bn, batch // bn * bn)


# --- linear ramp and critical batch ---------------------------------------------------------------


def _ramp_level(spec: LargeBatchJobSpec, samples: int) -> tuple[int, int]:
    """(level, levels) of the Megatron-style ramp: level i starts after i/levels of rampSamples."""
    ramp = spec.batch.policy.linear_ramp
    levels = (spec.batch.max - spec.batch.initial) // ramp.increment
    if levels == 0:
        return 0, 0
    return min(levels, samples * levels // ramp.ramp_samples), levels


def _ramp_level_start(spec: LargeBatchJobSpec, level: int, levels: int) -> int:
    return -(-level * spec.batch.policy.linear_ramp.ramp_samples // levels)


def _critical_grid(spec: LargeBatchJobSpec, k: int) -> int:
    """The k-th batch of the critical-batch policy: floor(batch.initial x growthFactor**k), at most batch.max,
    rounded down to a multiple of batch.bnBatch (two k may then share a batch)."""
    growth = spec.batch.policy.critical_batch.growth_factor
    return _bn_floor(spec, min(spec.batch.max, math.floor(spec.batch.initial * growth**k + 1e-9)))


def _critical_target(spec: LargeBatchJobSpec, noise_scale: float) -> int:
    """multiplier x noise scale, rounded down to the grid, capped at batch.max: never above the target."""
    b0, target = spec.batch.initial, critical_batch(spec, noise_scale)
    if target < b0:
        return b0
    growth = spec.batch.policy.critical_batch.growth_factor
    k_max = math.ceil(math.log(spec.batch.max / b0, growth)) if spec.batch.max > b0 else 0
    return _critical_grid(spec, min(k_max, math.floor(math.log(target / b0, growth) + 1e-9)))


def _critical_batch(spec: LargeBatchJobSpec, progress: Progress) -> int:
    """The batch grows one grid step at a time (at most growthFactor per change, at most one change per
    minStepsBetweenChanges), while the target is above it: the critical batch grows as the loss falls
    (McCandlish et al.), and a single early estimate should not take the batch to its maximum at once."""
    current = progress.batch or spec.batch.initial
    min_steps = spec.batch.policy.critical_batch.min_steps_between_changes
    if (
        progress.noise_scale is None
        or progress.samples < spec.schedule.warmup_samples  # early estimates are noise
        or progress.step - progress.last_change_step < min_steps
    ):
        return current
    target = _critical_target(spec, progress.noise_scale)
    if target <= current:
        return current
    return next(b for k in range(1, MAX_GRID_STEPS + 1) if (b := _critical_grid(spec, k)) > current)


# --- the whole run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """A stretch of the run with one global batch and one policy phase."""

    label: str
    start: int
    """First sample of the phase."""
    end: int
    """Sample count when the phase ends."""
    global_batch: int
    steps: int
    lr_start: float
    lr_end: float


def phases(spec: LargeBatchJobSpec, noise_scale: float | None = None) -> list[Phase]:
    """The run as phases of constant batch and policy phase, with exact optimizer step counts (equal to
    stepping plan() and advance() one step at a time). Where the policy reads the noise scale
    (`criticalBatch`, `seesaw.capAtCriticalBatch`), `noise_scale` is the one assumed throughout; without
    it a critical-batch job stays at batch.initial and a capped Seesaw grows as plain Seesaw does."""
    out: list[Phase] = []
    for piece in _walk(spec, noise_scale):
        if out and out[-1].label == piece.label and out[-1].global_batch == piece.global_batch:
            prev = out.pop()
            piece = replace(prev, end=piece.end, steps=prev.steps + piece.steps, lr_end=piece.lr_end)
        out.append(piece)
    return out


def trace(spec: LargeBatchJobSpec, noise_scale: float | None = None, points: int = 400) -> list[Phase]:
    """Like phases(), but cut into pieces of at most about 1/points of the run's steps, so that the LR
    inside a phase (warmup, cosine decay) can be drawn."""
    steps = sum(p.steps for p in phases(spec, noise_scale))
    return list(_walk(spec, noise_scale, max_steps=max(1, steps // points)))


def _walk(spec: LargeBatchJobSpec, noise_scale: float | None, max_steps: int | None = None):
    total = spec.schedule.total_samples
    progress = Progress(noise_scale=noise_scale)
    events = sorted(_sample_events(spec))  # once: a walk visits every one of them
    while progress.samples < total:
        first = plan(spec, progress)
        batch = first.policy_batch
        n = min(_steps_holding(spec, progress, batch, events), -(-(total - progress.samples) // batch))
        if max_steps is not None:
            n = min(n, max_steps)
        # Within a piece only samples and step move, so the state before its last step is exact.
        before_last = progress
        if n > 1:
            before_last = replace(
                advance(progress, first),
                samples=progress.samples + (n - 1) * batch,
                step=progress.step + n - 1,
            )
        last = plan(spec, before_last)
        end = before_last.samples + last.global_batch
        yield Phase(first.phase, progress.samples, end, batch, n, first.lr, last.lr)
        progress = advance(before_last, last)


def _steps_holding(spec: LargeBatchJobSpec, progress: Progress, batch: int, events: list[int]) -> int:
    """Steps from `progress` for which the policy batch and phase stay as they are (at least 1); `events`
    are the sorted `_sample_events`."""
    s = progress.samples
    following = bisect.bisect_right(events, s)
    n = -(-(events[following] - s) // batch) if following < len(events) else 1 << 62
    policy = spec.batch.policy
    if (
        policy.type == "criticalBatch"
        and progress.noise_scale is not None
        and s >= spec.schedule.warmup_samples
        and _critical_target(spec, progress.noise_scale) > batch
    ):
        eligible = progress.last_change_step + policy.critical_batch.min_steps_between_changes
        n = min(n, max(1, eligible - progress.step))
    return n


def _sample_events(spec: LargeBatchJobSpec) -> list[int]:
    """Sample counts at which the batch or the policy phase may change."""
    events = [spec.schedule.warmup_samples]
    policy = spec.batch.policy
    if policy.type == "seesaw":
        events += seesaw_cuts(spec)
    elif policy.type == "linearRamp":
        _, levels = _ramp_level(spec, 0)
        events += [_ramp_level_start(spec, i, levels) for i in range(1, levels + 1)]
    return events


def constant_baseline(spec: LargeBatchJobSpec) -> LargeBatchJobSpec:
    """The same job at constant batch.initial: the baseline a batch policy is measured against."""
    batch = spec.batch.model_copy(update={"policy": PolicySpec(type="constant")})
    return spec.model_copy(update={"batch": batch})

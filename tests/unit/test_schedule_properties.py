"""Properties of the schedule core that must hold for every job, checked with hypothesis."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from largebatch import schedule
from largebatch.schedule import Progress
from tests.helpers import make_spec


@given(
    global_batch=st.integers(1, 100_000),
    world_size=st.integers(1, 512),
    cap=st.integers(1, 4_096),
)
def test_split_is_exact_balanced_minimal_and_capped(global_batch, world_size, cap):
    result = schedule.split(global_batch, world_size, cap)
    totals = [result.rank_total(r) for r in range(world_size)]
    assert sum(totals) == global_batch
    assert max(totals) - min(totals) <= 1
    assert result.max_micro_batch <= cap
    assert all(len(m) == result.accumulation_steps for m in result.micro_batches)
    # One accumulation step fewer could not hold the batch.
    assert (result.accumulation_steps - 1) * world_size * cap < global_batch
    # Ranks take consecutive slices of the step's batch.
    assert [result.rank_offset(r) for r in range(world_size)] == [sum(totals[:r]) for r in range(world_size)]


@given(
    global_batch=st.integers(1, 20_000),
    world_size=st.integers(1, 64),
    cap=st.integers(1, 256),
    bn_batch=st.none() | st.integers(1, 64),
)
def test_split_size_is_the_splits_accumulation_and_largest_micro_batch(global_batch, world_size, cap, bn_batch):
    cap = max(cap, bn_batch or 1)
    built = schedule.split(global_batch, world_size, cap, bn_batch)
    assert schedule.split_size(global_batch, world_size, cap, bn_batch) == (
        built.accumulation_steps,
        built.max_micro_batch,
    )


@given(
    global_batch=st.integers(1, 20_000),
    world_size=st.integers(1, 64),
    bn_batch=st.integers(1, 64),
    extra=st.integers(0, 64),
    other_world=st.integers(1, 64),
)
def test_split_with_bn_batch_puts_the_same_samples_in_each_bn_batch_at_every_world_size(
    global_batch, world_size, bn_batch, extra, other_world
):
    result = schedule.split(global_batch, world_size, bn_batch + extra, bn_batch)
    assert sum(result.rank_total(r) for r in range(world_size)) == global_batch
    assert all(len(m) == result.accumulation_steps for m in result.micro_batches)

    def bn_batches(split: schedule.Split, world: int) -> list[tuple[int, int]]:
        """(first sample within the step, size) of every non-empty micro-batch, over all ranks."""
        found = []
        for rank in range(world):
            position = split.rank_offset(rank)
            for size in split.micro_batches[rank]:
                if size:
                    found.append((position, size))
                position += size
        return sorted(found)

    chunks = bn_batches(result, world_size)
    # Exactly bn_batch samples each, from the step's first sample on; only the last may hold a remainder.
    assert chunks == [(start, min(bn_batch, global_batch - start)) for start in range(0, global_batch, bn_batch)]
    assert chunks == bn_batches(schedule.split(global_batch, other_world, bn_batch, bn_batch), other_world)
    # Contiguous runs of chunks, as even as possible; empty micro-batches only after a rank's last chunk.
    counts = [sum(1 for size in m if size) for m in result.micro_batches]
    assert max(counts) - min(counts) <= 1 and result.accumulation_steps == max(counts)
    assert all(all(m[:c]) and not any(m[c:]) for m, c in zip(result.micro_batches, counts, strict=True))
    assert [result.rank_offset(r) for r in range(world_size)] == sorted(
        result.rank_offset(r) for r in range(world_size)
    )


@given(
    minimum=st.integers(1, 8),
    extra=st.integers(0, 8),
    devices=st.integers(1, 8),
    micro=st.integers(1, 64),
    global_batch=st.integers(1, 10_000),
    capacity=st.none() | st.integers(0, 32),
    bn=st.none() | st.integers(1, 8),
)
def test_desired_workers_stays_in_bounds_and_removes_accumulation_when_it_can(
    minimum, extra, devices, micro, global_batch, capacity, bn
):
    if bn is not None:
        micro, global_batch = max(micro, bn), -(-global_batch // bn) * bn
    spec = make_spec(
        workers={"min": minimum, "max": minimum + extra, "devicesPerWorker": devices},
        batch={"initial": bn or 1, "max": 10_000 // (bn or 1) * (bn or 1), "microBatchPerDevice": micro, "bnBatch": bn},
        schedule={"totalSamples": 100_000 // (bn or 1) * (bn or 1)},
    )
    n = schedule.desired_workers(spec, global_batch, capacity)
    assert minimum <= n <= minimum + extra
    if capacity is not None and capacity >= minimum:
        assert n <= capacity
    limit = minimum + extra if capacity is None else min(minimum + extra, capacity)

    def accumulation(workers: int) -> int:
        return schedule.split(global_batch, workers * devices, micro, bn).accumulation_steps

    if math.ceil(global_batch / (devices * (bn or micro))) <= limit:
        assert accumulation(n) == 1
        # ... and with no idle worker beyond the minimum.
        assert n == minimum or accumulation(n - 1) > 1


def policies(kind: str | None = None):
    ramp = st.builds(
        lambda inc, levels, ramp: {
            "type": "linearRamp",
            "linearRamp": {"increment": inc, "rampSamples": ramp},
            "_max_over": inc * levels,
        },
        st.integers(1, 64),
        st.integers(0, 8),
        st.integers(1, 20_000),
    )
    seesaw = st.builds(
        lambda factor, growth, cap: {
            "type": "seesaw",
            "seesaw": {"factor": factor, "batchFactor": growth, "capAtCriticalBatch": cap},
        },
        st.sampled_from([1.5, 2.0, 3.0, 4.0]),
        st.sampled_from([None, 1.5, 2.0]),
        st.booleans(),
    ).filter(lambda p: p["seesaw"]["batchFactor"] is None or p["seesaw"]["batchFactor"] <= p["seesaw"]["factor"])
    critical = st.builds(
        lambda growth, steps: {
            "type": "criticalBatch",
            "criticalBatch": {"growthFactor": growth, "minStepsBetweenChanges": steps},
        },
        st.sampled_from([1.5, 2.0, 4.0]),
        st.integers(1, 30),
    )
    choices = {
        "constant": st.just({"type": "constant"}),
        "linearRamp": ramp,
        "seesaw": seesaw,
        "criticalBatch": critical,
    }
    return choices[kind] if kind else st.one_of(*choices.values())


@st.composite
def jobs(draw, kind: str | None = None, bn_batch: bool | None = None):
    """A job of the policy `kind` (any when None); with bnBatch set when `bn_batch` (drawn when None), its
    batches and the ramp's increment are multiples of it."""
    policy = dict(draw(policies(kind)))
    measures = policy["type"] == "criticalBatch" or policy.get("seesaw", {}).get("capAtCriticalBatch", False)
    bn = draw(st.integers(1, 16)) if (draw(st.booleans()) if bn_batch is None else bn_batch) else None
    unit = bn or 1
    if policy["type"] == "linearRamp":
        policy["linearRamp"]["increment"] *= unit
    initial = unit * draw(st.integers(2 if policy["type"] == "criticalBatch" else 1, 64 // unit + 2))
    over = policy.pop("_max_over", None)
    maximum = initial + (draw(st.integers(0, 512)) // unit * unit if over is None else over * unit)
    total = unit * draw(st.integers(1, 30_000 // unit))  # the API: a multiple of bnBatch
    warmup = draw(st.integers(0, total - 1))
    spec = make_spec(
        batch={
            "initial": initial,
            "max": maximum,
            "microBatchPerDevice": max(16, unit),
            "bnBatch": bn,
            "policy": policy,
        },
        optimizer={"lr": 0.1, "scaling": draw(st.sampled_from(["linear", "sqrt", "none"]))},
        schedule={
            "totalSamples": total,
            "warmupSamples": warmup,
            "decay": draw(st.sampled_from(["cosine", "linear"])),
            "minLrRatio": draw(st.sampled_from([0.0, 0.01, 0.1, 0.5])),
        },
    )
    noise = draw(st.none() | st.floats(0.5, 5_000)) if measures else None
    return spec, noise


def step_by_step(spec, noise):
    progress, plans = Progress(noise_scale=noise), []
    while progress.samples < spec.schedule.total_samples:
        step_plan = schedule.plan(spec, progress)
        plans.append((progress, step_plan))
        progress = schedule.advance(progress, step_plan)
    return progress, plans


@settings(max_examples=150, deadline=None)
@given(jobs())
def test_phases_agree_with_stepping_the_plan_one_step_at_a_time(job):
    spec, noise = job
    final, plans = step_by_step(spec, noise)
    phases = schedule.phases(spec, noise)
    assert final.samples == spec.schedule.total_samples
    assert sum(p.steps for p in phases) == len(plans) == final.step
    assert phases[0].start == 0 and phases[-1].end == spec.schedule.total_samples
    assert all(a.end == b.start for a, b in pairwise(phases))
    # The same batch, step by step.
    expanded = [p.global_batch for p in phases for _ in range(p.steps)]
    assert expanded == [step_plan.policy_batch for _, step_plan in plans]


@settings(max_examples=150, deadline=None)
@given(jobs())
def test_the_batch_never_shrinks_never_passes_max_and_the_lr_is_positive(job):
    spec, noise = job
    _, plans = step_by_step(spec, noise)
    batches = [p.policy_batch for _, p in plans]
    assert batches == sorted(batches)
    assert all(spec.batch.initial <= b <= spec.batch.max for b in batches)
    assert all(0 < p.lr <= spec.optimizer.lr * max(1.0, spec.batch.max / spec.base_batch) for _, p in plans)


@settings(max_examples=100, deadline=None)
@given(jobs("criticalBatch"))
def test_critical_batch_changes_are_on_the_grid_and_spaced(job):
    spec, noise = job
    _, plans = step_by_step(spec, noise)
    cb = spec.batch.policy.critical_batch
    changes = [(s.step, p.policy_batch) for s, p in plans if s.batch is not None and p.policy_batch != s.batch]
    unit = spec.batch.bn_batch or 1  # the grid rounded down to whole BN batches
    grid = sorted(
        {
            min(spec.batch.max, math.floor(spec.batch.initial * cb.growth_factor**k + 1e-9)) // unit * unit
            for k in range(40)
        }
    )
    # One grid step per change.
    batches = [spec.batch.initial] + [b for _, b in changes]
    assert all(b in grid and grid.index(b) == grid.index(a) + 1 for a, b in pairwise(batches))
    steps = [0] + [s for s, _ in changes]
    assert all(b - a >= cb.min_steps_between_changes for a, b in pairwise(steps))
    if noise is not None:
        assert all(b <= max(spec.batch.initial, spec.critical_multiplier * noise) for _, b in changes)


@settings(max_examples=100, deadline=None)
@given(jobs("seesaw"))
def test_seesaw_cuts_trade_lr_for_batch_at_the_stability_edge(job):
    spec, noise = job
    seesaw = spec.batch.policy.seesaw
    cuts = schedule.seesaw_cuts(spec)
    assert all(seesaw.factor**-k >= spec.schedule.min_lr_ratio for k in range(1, len(cuts) + 1))
    _, plans = step_by_step(spec, noise)
    after_warmup = [(s, p) for s, p in plans if s.samples >= spec.schedule.warmup_samples]
    cap = None if noise is None or not seesaw.cap_at_critical_batch else spec.critical_multiplier * noise
    for (s0, p0), (s1, p1) in pairwise(after_warmup):
        passed = sum(1 for c in cuts if s0.samples < c <= s1.samples)
        growth = p1.policy_batch / p0.policy_batch
        assert p1.lr / p0.lr == pytest.approx(math.sqrt(growth) / seesaw.factor**passed)
        if passed == 0:
            assert growth == 1
        else:
            # Stability (Seesaw paper): the LR divisor is at least sqrt of the batch growth.
            assert p0.lr / p1.lr >= math.sqrt(growth) - 1e-9
            # Held to the critical batch: a cut never takes the batch above it.
            assert cap is None or growth == 1 or p1.policy_batch <= cap
    # Each cut sits where the base decay first reaches factor**-k.
    for k, c in enumerate(cuts, start=1):
        assert schedule.decay_multiplier(spec.schedule, c) <= seesaw.factor**-k
        assert c == spec.schedule.warmup_samples or schedule.decay_multiplier(spec.schedule, c - 1) > seesaw.factor**-k


@settings(max_examples=150, deadline=None)
@given(jobs(bn_batch=True))
def test_every_planned_batch_is_a_whole_number_of_bn_batches(job):
    spec, noise = job
    bn = spec.batch.bn_batch
    _, plans = step_by_step(spec, noise)
    assert all(p.policy_batch % bn == 0 and p.policy_batch >= bn for _, p in plans)
    # The run's last step too, cut short by a data budget that is a multiple of bnBatch.
    assert all(p.global_batch % bn == 0 for _, p in plans)


@settings(max_examples=100, deadline=None)
@given(jobs(), st.sampled_from([0.0, 0.5, 0.9]), st.sampled_from([0.99, 0.999]))
def test_per_sample_moments_keep_each_horizon_in_samples_and_eps_beside_the_gradient(job, beta1, beta2):
    """perSample: at every step a moment forgets the same fraction per sample as at baseBatch (log β over
    the batch is constant) and eps x sqrt(batch) is constant, as the averaged gradient's noise scales with
    1/sqrt(batch). perStep leaves the coefficients as given."""
    spec, noise = job
    optimizer = spec.optimizer.model_copy(update={"betas": [beta1, beta2], "eps": 1e-6})
    spec = spec.model_copy(update={"optimizer": optimizer})
    _, plans = step_by_step(spec, noise)
    base = spec.base_batch
    for _, p in plans:
        assert p.betas[0] ** (base / p.policy_batch) == pytest.approx(beta1, rel=1e-9, abs=1e-300)
        assert math.log(p.betas[1]) / p.policy_batch == pytest.approx(math.log(beta2) / base, rel=1e-9)
        assert p.eps * math.sqrt(p.policy_batch) == pytest.approx(1e-6 * math.sqrt(base), rel=1e-12)
    per_step = spec.model_copy(update={"optimizer": optimizer.model_copy(update={"moments": "perStep"})})
    assert {(p.betas, p.eps) for _, p in step_by_step(per_step, noise)[1]} == {((beta1, beta2), 1e-6)}

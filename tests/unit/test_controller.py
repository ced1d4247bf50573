"""The controller's decisions, by hand and by property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from largebatch import controller, schedule
from largebatch.controller import Kind, Observation, decide
from tests.helpers import make_spec

SPEC = make_spec(
    workers={"min": 1, "max": 8},
    batch={"initial": 64, "max": 512, "microBatchPerDevice": 16},
    schedule={"totalSamples": 1_000_000, "warmupSamples": 0},
)


def seen(samples=0, workers=1, **kw) -> Observation:
    return Observation(progress=schedule.Progress(samples=samples), workers=workers, **kw)


def test_a_start_launches_the_desired_workers_within_capacity():
    assert decide(SPEC, seen(workers=0)).workers == 4  # 64 / 16
    assert decide(SPEC, seen(workers=0, capacity=3)).workers == 3
    assert decide(SPEC, seen(workers=0)).kind is Kind.START


def test_capacity_below_the_running_workers_forces_a_shrink():
    decision = decide(SPEC, seen(workers=4, capacity=2))
    assert decision.workers == 2 and "capacity fell to 2" in decision.reason
    assert decision.kind is Kind.CAPACITY_LIMITED


def test_too_few_places_for_the_batch_is_capacity_limited_with_the_accumulation():
    decision = decide(SPEC, seen(workers=2, capacity=2))  # batch 64 at micro-batch 16 wants 4 workers
    assert decision.workers == 2 and decision.kind is Kind.CAPACITY_LIMITED
    assert decision.reason == "batch 64 needs 4 workers, 2 fit: accumulation 2"
    assert decide(SPEC, seen(workers=4, capacity=8)).kind is Kind.STEADY


def test_growing_happens_only_when_the_gain_beats_the_restart():
    # 1,000,000 samples left at 1,000 samples/s = 1,000 s; 2→4 workers saves 500 s.
    grow = decide(SPEC, seen(workers=2, samples_per_second=1_000, restart_seconds=15))
    assert grow.workers == 4 and grow.kind is Kind.GROW
    # Near the end: 10,000 samples left = 10 s, 2→4 saves 5 s < 15 s.
    late = decide(SPEC, seen(samples=990_000, workers=2, samples_per_second=1_000, restart_seconds=15))
    assert late.workers == 2 and "less than a 15 s restart" in late.reason and late.kind is Kind.NOT_WORTH_RESTART


def test_no_growth_during_the_cooldown_after_a_rescale():
    decision = decide(SPEC, seen(workers=2, samples_per_second=1_000, seconds_since_rescale=10, restart_seconds=15))
    assert decision.workers == 2 and "cooling down" in decision.reason and decision.kind is Kind.COOLING_DOWN


def test_waiting_below_min_capacity():
    spec = make_spec(workers={"min": 2, "max": 4}, batch={"initial": 64, "max": 64, "microBatchPerDevice": 16})
    decision = decide(spec, seen(workers=0, capacity=1))
    assert decision.workers == 0 and "waiting for capacity" in decision.reason
    assert decision.kind is Kind.WAITING_FOR_CAPACITY


@given(
    workers=st.integers(0, 10),
    capacity=st.none() | st.integers(0, 10),
    samples=st.integers(0, 1_000_000),
    rate=st.none() | st.floats(1, 1e5),
    since=st.none() | st.floats(0, 1e4),
    restart=st.floats(0, 100),
)
def test_decisions_respect_capacity_bounds_and_never_shrink_voluntarily(
    workers, capacity, samples, rate, since, restart
):
    observation = Observation(
        progress=schedule.Progress(samples=samples),
        workers=workers,
        capacity=capacity,
        samples_per_second=rate,
        seconds_since_rescale=since,
        restart_seconds=restart,
    )
    decision = decide(SPEC, observation)
    # The kind says whether anything changes: only these kinds ever change the worker count.
    changing = {Kind.START, Kind.GROW, Kind.CAPACITY_LIMITED, Kind.ABOVE_MAX}
    assert not decision.changes(workers) or decision.kind in changing
    if samples >= SPEC.schedule.total_samples:  # the job is done: nothing to change
        assert decision.workers == workers and decision.kind is Kind.COMPLETE
        return
    if capacity is not None:
        assert decision.workers <= max(capacity, 0) or decision.workers == workers <= capacity
    if (capacity is None or capacity >= workers) and workers <= SPEC.workers.max:
        assert decision.workers >= workers  # never shrinks unless the capacity or workers.max forces it
    if decision.workers > workers and workers >= SPEC.workers.min:
        # A voluntary growth pays for its restart and respects the cooldown.
        assert since is None or since >= 2 * restart
        if rate:
            remaining = (1_000_000 - samples) / rate
            assert remaining * (1 - workers / decision.workers) > restart
    assert decision.workers <= SPEC.workers.max


def test_capacity_schedules_parse_fractions_and_percentages():
    steps = controller.parse_capacity("0:1,30%:3,0.7:2")
    assert steps == [(0.0, 1), (0.3, 3), (0.7, 2)]
    assert [controller.capacity_at(steps, f) for f in (0, 0.29, 0.3, 0.69, 0.7, 1.0)] == [1, 1, 3, 3, 2, 2]


@pytest.mark.parametrize(
    ("text", "message"),
    [("30%:3", "must start at 0"), ("0:1,70%:2,30%:3", "increasing order"), ("0:1,x:2", "not FRACTION:WORKERS"),
     ("0:1,150%:2", "within 0..100%")],
)  # fmt: skip
def test_bad_capacity_schedules_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        controller.parse_capacity(text)

"""The schedule core with hand-computed numbers: LR rules, warmup, decay, each batch policy."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from largebatch import schedule
from largebatch.schedule import Progress
from tests.helpers import make_spec


def test_the_seesaw_example_doubles_four_times_at_the_cosine_halvings(seesaw_example):
    spec = seesaw_example.spec
    phases = schedule.phases(spec)
    warmup, total = spec.schedule.warmup_samples, spec.schedule.total_samples
    increases = [b for a, b in pairwise(phases) if b.global_batch > a.global_batch]
    # cos(pi t) = 2 (2**-k - 0.01) / 0.99 - 1, solved by hand for k = 1..4
    expected = [0.5032, 0.6724, 0.7787, 0.8520]
    assert [p.global_batch for p in increases] == [512, 1024, 2048, 4096]
    for phase, t in zip(increases, expected, strict=True):
        assert (phase.start - warmup) / (total - warmup) == pytest.approx(t, abs=5e-4)
    # Two further cuts (2**-5 and 2**-6 are above minLrRatio 0.01, 2**-7 is not) only halve the LR.
    after_max = [p for p in phases if p.global_batch == 4096]
    assert len(after_max) == 3
    assert after_max[1].lr_start == pytest.approx(after_max[0].lr_start / 2)
    assert after_max[2].lr_start == pytest.approx(after_max[1].lr_start / 2)
    # Each doubling cut the LR by sqrt(2): 1e-3, 7.07e-4, 5e-4, 3.54e-4, 2.5e-4.
    assert [p.lr_start for p in increases] == pytest.approx([1e-3 / math.sqrt(2) ** k for k in range(1, 5)])
    serial = sum(p.steps for p in phases)
    baseline = sum(p.steps for p in schedule.phases(schedule.constant_baseline(spec)))
    assert baseline == total // 256
    assert 1 - serial / baseline == pytest.approx(0.364, abs=0.005)


def test_warmup_is_linear_in_samples_and_reaches_the_peak_at_its_end():
    spec = make_spec(schedule={"totalSamples": 10_000, "warmupSamples": 1_000, "decay": "constant"})
    first = schedule.plan(spec, Progress())
    assert first.lr == pytest.approx(0.1 * 16 / 1_000)
    assert first.phase == "warmup"
    last_warmup = schedule.plan(spec, Progress(samples=1_000 - 16, step=61))
    assert last_warmup.lr == pytest.approx(0.1)
    after = schedule.plan(spec, Progress(samples=1_008, step=63))
    assert after.lr == pytest.approx(0.1)
    assert after.phase == "constant"


@pytest.mark.parametrize(("scaling", "expected"), [("linear", 0.1 * 4), ("sqrt", 0.1 * 2), ("none", 0.1)])
def test_the_lr_rule_scales_from_the_base_batch(scaling, expected):
    spec = make_spec(
        batch={"initial": 64, "max": 64},
        optimizer={"lr": 0.1, "baseBatch": 16, "scaling": scaling},
        schedule={"warmupSamples": 0, "decay": "constant"},
    )
    assert schedule.plan(spec, Progress()).lr == pytest.approx(expected)


def test_cosine_and_linear_decay_hit_their_midpoints_and_floor():
    cosine = make_spec(schedule={"totalSamples": 11_000, "warmupSamples": 1_000, "minLrRatio": 0.2})
    assert schedule.decay_multiplier(cosine.schedule, 1_000) == pytest.approx(1.0)
    assert schedule.decay_multiplier(cosine.schedule, 6_000) == pytest.approx(0.6)
    assert schedule.decay_multiplier(cosine.schedule, 11_000) == pytest.approx(0.2)
    linear = make_spec(schedule={"totalSamples": 11_000, "warmupSamples": 1_000, "decay": "linear"})
    assert schedule.decay_multiplier(linear.schedule, 8_500) == pytest.approx(0.25)


def test_the_last_step_is_cut_short_so_exactly_total_samples_are_consumed():
    spec = make_spec(schedule={"totalSamples": 1_000, "warmupSamples": 0})
    phases = schedule.phases(spec)
    assert phases[-1].end == 1_000
    assert sum(p.steps for p in phases) == math.ceil(1_000 / 16)
    final = schedule.plan(spec, Progress(samples=992, step=62))
    assert final.global_batch == 8
    assert final.policy_batch == 16
    with pytest.raises(ValueError, match="1000 of 1000 samples"):
        schedule.plan(spec, Progress(samples=1_000, step=63))


def test_linear_ramp_follows_megatron_levels():
    spec = make_spec(
        batch={
            "initial": 128,
            "max": 1024,
            "policy": {"type": "linearRamp", "linearRamp": {"increment": 128, "rampSamples": 2_100_000}},
        },
        schedule={"totalSamples": 10_000_000, "warmupSamples": 0},
    )
    # 7 increments over 2.1M samples: one every 300k samples.
    assert schedule.plan(spec, Progress(samples=299_999)).global_batch == 128
    assert schedule.plan(spec, Progress(samples=300_000)).global_batch == 256
    assert schedule.plan(spec, Progress(samples=300_000)).phase == "ramp 1/7"
    assert schedule.plan(spec, Progress(samples=2_099_999)).global_batch == 896
    assert schedule.plan(spec, Progress(samples=2_100_000)).global_batch == 1024


def critical_spec(**policy):
    settings = {"multiplier": 1.0, "growthFactor": 2, "minStepsBetweenChanges": 10} | policy
    return make_spec(
        batch={"initial": 16, "max": 1000, "policy": {"type": "criticalBatch", "criticalBatch": settings}},
        schedule={"warmupSamples": 160},
    )


def climb(spec, noise_scale: float, batch: int = 16) -> list[int]:
    """The batches the policy takes, change after change, with the noise scale held at `noise_scale`."""
    batches = [batch]
    for change in range(1, 20):
        state = Progress(
            samples=1_600, step=100 * change, batch=batches[-1], last_change_step=0, noise_scale=noise_scale
        )
        batches.append(schedule.plan(spec, state).global_batch)
        if batches[-1] == batches[-2]:
            return batches[:-1]
    raise AssertionError(f"still climbing: {batches}")


@pytest.mark.parametrize(("scaling", "top"), [("linear", 256), ("sqrt", 128), ("none", 128)])
def test_the_default_multiplier_follows_the_lr_rule(scaling, top):
    """Unset, the multiplier is 1 under the linear rule and 0.5 where the LR grows less than the batch
    (benchmarks/README.md, "The critical-batch policy under the square-root rule"): noise scale 300
    then allows 256 or 150 -> 128. Set, it is what it says under every rule."""

    def spec(**policy):
        settings = {"growthFactor": 2, "minStepsBetweenChanges": 10} | policy
        return make_spec(
            batch={"initial": 16, "max": 1000, "policy": {"type": "criticalBatch", "criticalBatch": settings}},
            optimizer={"lr": 0.1, "scaling": scaling},
            schedule={"warmupSamples": 160},
        )

    assert climb(spec(), 300.0)[-1] == top
    assert climb(spec(multiplier=1.0), 300.0)[-1] == 256


def test_critical_batch_climbs_the_growth_grid_one_step_per_change_up_to_the_noise_scale():
    spec = critical_spec()
    assert climb(spec, 300.0) == [16, 32, 64, 128, 256]  # 16 * 2**4 <= 300 < 16 * 2**5
    assert climb(spec, 5000.0) == [16, 32, 64, 128, 256, 512, 1000]  # batch.max ends the grid
    # The multiplier scales the target: 0.5 * 300 = 150 -> 128.
    assert climb(critical_spec(multiplier=0.5), 300.0)[-1] == 128
    # Never down, even when the noise scale falls.
    assert schedule.plan(spec, Progress(samples=1_600, step=100, batch=256, noise_scale=20.0)).global_batch == 256
    # At most once per minStepsBetweenChanges, and not during warmup.
    state = Progress(samples=1_600, step=100, batch=32, last_change_step=95, noise_scale=300.0)
    assert schedule.plan(spec, state).global_batch == 32
    assert schedule.plan(spec, Progress(samples=80, step=5, batch=16, noise_scale=300.0)).global_batch == 16


def test_critical_batch_records_when_it_changed():
    spec = critical_spec()
    before = Progress(samples=1_600, step=100, batch=16, last_change_step=0, noise_scale=300.0)
    after = schedule.advance(before, schedule.plan(spec, before))
    assert (after.samples, after.step, after.batch, after.last_change_step) == (1_632, 101, 32, 100)


def seesaw_spec(**seesaw):
    return make_spec(
        batch={"initial": 16, "max": 256, "policy": {"type": "seesaw", "seesaw": {"factor": 2} | seesaw}},
        schedule={"totalSamples": 100_000, "warmupSamples": 1_000, "decay": "cosine", "minLrRatio": 0.01},
    )


def test_seesaw_held_to_the_critical_batch_cuts_the_lr_in_full_where_growing_would_pass_it():
    spec = seesaw_spec(capAtCriticalBatch=True)
    cuts = schedule.seesaw_cuts(spec)
    assert len(cuts) == 6  # 2**-6 >= 0.01 > 2**-7

    def across(k: int, batch: int, noise: float | None) -> schedule.Plan:
        before = Progress(samples=cuts[k] - 1, step=500, batch=batch, noise_scale=noise)
        return schedule.plan(spec, schedule.advance(before, schedule.plan(spec, before)))

    before = schedule.plan(spec, Progress(samples=cuts[1] - 1, step=500, batch=32, noise_scale=100.0))
    # Critical batch 100: the second cut may grow 32 -> 64 (LR / sqrt 2) ...
    grown = across(1, 32, 100.0)
    assert grown.policy_batch == 64 and grown.lr == pytest.approx(before.lr / math.sqrt(2))
    # ... but at critical batch 60 it keeps 32 and cuts the LR by the full factor, as the decay would.
    held = across(1, 32, 60.0)
    assert held.policy_batch == 32 and held.lr == pytest.approx(before.lr / 2)
    # A later cut grows again once the measured critical batch allows it: one level, from where it is.
    assert across(2, 32, 100.0).policy_batch == 64
    # Until the noise scale is measured, cuts grow the batch as plain Seesaw does.
    assert across(1, 32, None).policy_batch == 64
    # Without the cap the same cut grows whatever the noise scale.
    plain = seesaw_spec(capAtCriticalBatch=False)
    assert schedule.plan(plain, Progress(samples=cuts[1], noise_scale=60.0)).policy_batch == 64


@pytest.mark.parametrize("scaling", ["linear", "sqrt", "none"])
def test_seesaw_is_held_to_the_noise_scale_itself_under_every_lr_rule(scaling):
    """Seesaw's cuts set its LR whatever the rule, so its cap does not take the critical-batch policy's 0.5
    under sqrt and none (at half the noise scale it saved 13% of the steps, at 1 30%: benchmarks/README.md);
    `criticalBatch.multiplier`, set, still moves it. Noise scale 100: the second cut may grow 32 -> 64, at
    multiplier 0.5 it may not."""

    def spec(**critical) -> schedule.LargeBatchJobSpec:
        policy = {"type": "seesaw", "seesaw": {"factor": 2}, "criticalBatch": critical}
        return make_spec(batch={"initial": 16, "max": 256, "policy": policy}, optimizer={"lr": 0.1, "scaling": scaling},
                         schedule={"totalSamples": 100_000, "warmupSamples": 1_000, "decay": "cosine"})  # fmt: skip

    def across_the_second_cut(spec) -> int:
        before = Progress(samples=schedule.seesaw_cuts(spec)[1] - 1, step=500, batch=32, noise_scale=100.0)
        return schedule.plan(spec, schedule.advance(before, schedule.plan(spec, before))).policy_batch

    assert across_the_second_cut(spec()) == 64
    assert across_the_second_cut(spec(multiplier=0.5)) == 32


def test_split_hand_example():
    result = schedule.split(10, 3, 2)
    assert result.accumulation_steps == 2
    assert result.micro_batches == ((2, 2), (2, 1), (2, 1))
    assert [result.rank_offset(r) for r in range(3)] == [0, 4, 7]


def test_split_with_more_ranks_than_samples_gives_empty_ranks():
    result = schedule.split(3, 4, 8)
    assert result.accumulation_steps == 1
    assert result.micro_batches == ((1,), (1,), (1,), (0,))


def test_split_with_bn_batch_gives_ranks_contiguous_runs_of_whole_bn_batches():
    # 40 samples in BN batches of 8: five chunks; two ranks take 3 and 2, three ranks 2, 2 and 1.
    two = schedule.split(40, 2, 32, bn_batch=8)
    assert two.micro_batches == ((8, 8, 8), (8, 8, 0))
    assert [two.rank_offset(r) for r in range(2)] == [0, 24]
    three = schedule.split(40, 3, 32, bn_batch=8)
    assert three.accumulation_steps == 2
    assert three.micro_batches == ((8, 8), (8, 8), (8, 0))
    # One rank: one BN batch per micro-step, although 32 would fit in a micro-batch.
    assert schedule.split(40, 1, 32, bn_batch=8).micro_batches == ((8, 8, 8, 8, 8),)
    # The run's last step, cut short by the data budget: the remainder is the last chunk.
    assert schedule.split(20, 2, 32, bn_batch=8).micro_batches == ((8, 8), (4, 0))
    with pytest.raises(ValueError, match="bn_batch=8 samples exceeds max_micro_batch=4"):
        schedule.split(40, 2, 4, bn_batch=8)


def test_growth_policies_round_down_to_whole_bn_batches():
    seesaw = make_spec(
        batch={"initial": 32, "max": 256, "microBatchPerDevice": 32, "bnBatch": 32,
               "policy": {"type": "seesaw", "seesaw": {"factor": 3, "batchFactor": 1.5, "capAtCriticalBatch": False}}},
        schedule={"totalSamples": 100_000, "warmupSamples": 1_000, "minLrRatio": 0.01},
    )  # fmt: skip
    # Four cuts (3**-4 >= 0.01): 32 x 1.5**k = 48, 72, 108, 162 rounded down to multiples of 32. The first
    # cannot grow: it keeps the batch and cuts the LR in full, as a capped cut does.
    phases = schedule.phases(seesaw)
    assert [p.global_batch for p in phases] == [32, 32, 32, 64, 96, 160]
    assert phases[2].lr_start == pytest.approx(phases[1].lr_end / 3)
    settings = {"growthFactor": 1.5, "minStepsBetweenChanges": 10}
    critical = make_spec(
        batch={"initial": 32, "max": 992, "microBatchPerDevice": 32, "bnBatch": 16,
               "policy": {"type": "criticalBatch", "criticalBatch": settings}},
        schedule={"warmupSamples": 160},
    )  # fmt: skip
    # The grid 32 x 1.5**k = 48, 72, 108, 162, 243, 364.5, 546.75, 820.1, then batch.max, rounded down.
    assert climb(critical, 5000.0, batch=32) == [32, 48, 64, 96, 160, 240, 352, 544, 816, 992]
    assert climb(critical, 200.0, batch=32)[-1] == 160  # never above the target


def test_desired_workers_counts_bn_batches_per_device():
    spec = make_spec(workers={"min": 1, "max": 8}, batch={"microBatchPerDevice": 64, "bnBatch": 16})
    assert schedule.desired_workers(spec, 64) == 4  # four BN batches: one per device brings accumulation to 1


def test_split_rejects_nonsense_with_the_numbers():
    with pytest.raises(ValueError, match="world_size=0"):
        schedule.split(8, 0, 4)


def test_desired_workers_brings_accumulation_to_one_within_bounds():
    spec = make_spec(workers={"min": 2, "max": 8, "devicesPerWorker": 2}, batch={"microBatchPerDevice": 16})
    assert schedule.desired_workers(spec, 64) == 2  # 64 / (2 devices * 16) = 2
    assert schedule.desired_workers(spec, 96) == 3
    assert schedule.desired_workers(spec, 16) == 2  # never below min
    assert schedule.desired_workers(spec, 10_000) == 8  # never above max
    assert schedule.desired_workers(spec, 10_000, capacity=5) == 5
    assert schedule.desired_workers(spec, 10_000, capacity=1) == 2  # below min the job waits at min

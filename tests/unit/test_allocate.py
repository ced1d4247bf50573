"""The cross-job allocator: the promises of largebatch.allocate as properties over random sets of jobs,
and the cases an operator meets by name (a job that cannot use a GPU beside one that accumulates, a
higher priority arriving, a newcomer's fair share, a growth not worth its restart)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from largebatch.allocate import Demand, Measured, Speed, allocate


def job(name: str, batch: int, current: int = 0, **fields) -> Demand:
    values = dict(per_worker=64, minimum=1, maximum=16, remaining_samples=10_000_000, speed=Speed(compute=0.01))
    return Demand(name=name, batch=batch, current=current, **values | fields)


@st.composite
def jobs(draw) -> list[Demand]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        minimum = draw(st.integers(1, 3))
        maximum = draw(st.integers(minimum, 12))
        sync = draw(st.sampled_from([0.0, 0.05, 2.0]))
        out.append(Demand(
            name=f"ns/job{i}",
            batch=draw(st.sampled_from([32, 64, 256, 1024, 4096])),
            per_worker=64,
            minimum=minimum,
            maximum=maximum,
            remaining_samples=draw(st.integers(1_000, 50_000_000)),
            current=draw(st.sampled_from([0, 0, minimum, maximum, minimum + 1])),
            devices_per_worker=draw(st.sampled_from([1, 1, 2, 4])),
            priority=draw(st.integers(0, 2)),
            arrival=float(i),
            speed=draw(st.sampled_from([None, Speed(compute=0.01, sync=sync), Speed(compute=0.001, sync=sync)])),
            restart_seconds=draw(st.sampled_from([0.0, 30.0, 1e9])),
        ))  # fmt: skip
    return out


gpus = st.integers(0, 48)


@settings(max_examples=300, deadline=None)
@given(jobs(), gpus)
def test_never_over_capacity_and_never_above_what_the_batch_can_use(demands, capacity):
    given_ = allocate(demands, capacity).workers
    assert sum(given_[d.name] * d.devices_per_worker for d in demands) <= capacity
    for d in demands:
        assert given_[d.name] == 0 or d.minimum <= given_[d.name] <= d.wanted, (d, given_[d.name])


@settings(max_examples=300, deadline=None)
@given(jobs(), gpus)
def test_stable_when_nothing_changes(demands, capacity):
    first = allocate(demands, capacity)
    ran = [dataclasses.replace(d, current=first.workers[d.name]) for d in demands]
    again = allocate(ran, capacity)
    assert again.workers == first.workers
    assert not any(again.reasons.get(d.name, "").count("→") for d in ran), again.reasons


@settings(max_examples=300, deadline=None)
@given(jobs(), gpus, st.data())
def test_monotone_in_priority(demands, capacity, data):
    chosen = data.draw(st.sampled_from(demands))
    raised = [dataclasses.replace(d, priority=d.priority + 1) if d is chosen else d for d in demands]
    assert allocate(raised, capacity).workers[chosen.name] >= allocate(demands, capacity).workers[chosen.name]


@settings(max_examples=300, deadline=None)
@given(jobs(), gpus)
def test_a_running_job_keeps_its_minimum_unless_higher_priorities_need_the_gpus(demands, capacity):
    given_ = allocate(demands, capacity).workers
    for d in demands:
        if d.current >= d.minimum and given_[d.name] == 0:
            above = sum(o.minimum * o.devices_per_worker for o in demands if o.priority > d.priority and given_[o.name])
            running_peers = sum(o.minimum * o.devices_per_worker for o in demands if o.priority == d.priority
                                and o.current >= o.minimum and given_[o.name])  # fmt: skip
            assert above + running_peers + d.minimum * d.devices_per_worker > capacity, (d, given_)


def test_the_gpu_goes_to_the_job_that_accumulates_not_to_the_one_that_cannot_use_it():
    small = job("team-a/bert", batch=64, current=1)  # one worker holds the whole batch
    large = job("team-b/gpt", batch=4096, current=1)  # 64 micro-batches on one worker
    result = allocate([small, large], gpus=8)
    assert result.workers == {"team-a/bert": 1, "team-b/gpt": 7}
    assert "team-b/gpt" in result.reasons and "64 micro-batches per worker" in result.reasons["team-b/gpt"]
    assert "team-a/bert" not in result.reasons


def test_the_next_gpu_goes_where_it_shortens_the_time_to_finish_most():
    # Two equal jobs, but the second has twice the samples left: its workers save twice the seconds.
    near = job("a/near", batch=4096, current=2, remaining_samples=1_000_000)
    far = job("a/far", batch=4096, current=2, remaining_samples=2_000_000)
    given_ = allocate([near, far], gpus=6).workers  # shares 3 + 3: the fair share caps the greed
    assert given_ == {"a/near": 3, "a/far": 3}
    given_ = allocate([dataclasses.replace(near, maximum=2, minimum=2), far], gpus=7).workers
    assert given_ == {"a/near": 2, "a/far": 5}
    # Beyond the shares, a worker on a badly scaling job saves less than one on a well scaling job.
    slow = job("a/slow", batch=4096, current=2, speed=Speed(compute=0.01, sync=100.0))
    fast = job("a/fast", batch=4096, current=2)
    given_ = allocate([slow, fast], gpus=9).workers
    assert given_["a/fast"] > given_["a/slow"]


def test_a_higher_priority_takes_gpus_from_a_lower_one_and_says_so():
    low = job("team-a/train", batch=4096, current=8)
    high = job("team-b/urgent", batch=4096, priority=1)
    result = allocate([low, high], gpus=8)
    assert result.workers == {"team-a/train": 1, "team-b/urgent": 7}  # the lower job keeps its minimum
    assert "higher priority" in result.reasons["team-a/train"]
    assert "team-b/urgent" in result.reasons["team-a/train"]
    # A higher priority's minimum takes a lower job's: it is stopped, and says why.
    result = allocate([low, dataclasses.replace(high, minimum=8)], gpus=8)
    assert result.workers == {"team-a/train": 0, "team-b/urgent": 8}
    assert "workers.min 1 needs 1 GPUs, 0 left at priority 0" in result.reasons["team-a/train"]


def test_a_newcomer_gets_its_fair_share_from_a_job_holding_more():
    big = job("a/big", batch=4096, current=8)
    new = job("a/new", batch=4096, arrival=1.0)
    result = allocate([big, new], gpus=8)
    assert result.workers == {"a/big": 4, "a/new": 4}
    assert "fair share" in result.reasons["a/big"]
    # A newcomer of the same priority does not stop a running job for its minimum.
    result = allocate([dataclasses.replace(big, minimum=8), dataclasses.replace(new, minimum=2)], gpus=8)
    assert result.workers == {"a/big": 8, "a/new": 0}
    assert result.reasons["a/new"].startswith("waits: workers.min 2 needs 2 GPUs, 0 left")


def test_a_tie_for_the_last_gpu_leaves_it_where_it_is():
    first = job("a/first", batch=4096, current=4, arrival=0.0)
    later = job("a/later", batch=4096, current=5, arrival=1.0)
    assert allocate([first, later], gpus=9).workers == {"a/first": 4, "a/later": 5}
    assert allocate([first, later], gpus=9).reasons == {}


def test_no_growth_that_does_not_pay_for_its_restart():
    # 1,000 samples left at ~6,400 samples/s on one worker: a second worker saves ~0.08 s, less than 30 s.
    nearly_done = job("a/done-soon", batch=4096, current=1, remaining_samples=1_000, restart_seconds=30.0)
    assert allocate([nearly_done], gpus=8).workers == {"a/done-soon": 1}
    assert allocate([dataclasses.replace(nearly_done, restart_seconds=0.0)], gpus=8).workers == {"a/done-soon": 8}


def test_a_job_not_measured_yet_gets_its_share_and_no_more():
    measured = job("a/measured", batch=4096, current=2)
    new = job("a/new", batch=4096, current=0, speed=None, arrival=1.0)
    assert allocate([measured, new], gpus=12).workers == {"a/measured": 6, "a/new": 6}
    assert allocate([dataclasses.replace(new, maximum=2), measured], gpus=12).workers == {"a/new": 2,
                                                                                          "a/measured": 10}  # fmt: skip


def test_speed_is_fitted_from_what_was_measured():
    truth = Speed(compute=0.002, sync=0.3)
    points = [Measured(n, b, truth.samples_per_second(n, b)) for n, b in ((1, 256), (2, 256), (4, 1024))]
    fitted = Speed.fit(points)
    assert abs(fitted.compute - 0.002) < 1e-9 and abs(fitted.sync - 0.3) < 1e-9
    one = Speed.fit([Measured(2, 512, 1000.0)])  # one point: perfect scaling from it
    assert one.sync == 0 and one.samples_per_second(4, 512) == 2000.0
    assert Speed.fit([]) is None


def test_a_job_kept_below_its_batch_beside_free_gpus_says_a_worker_more_does_not_pay():
    # What two workers of a small model measured on two busy cores (e2e, 2026-12-04): slower than one.
    measured = Speed.fit([Measured(1, 32, 3_749.7), Measured(2, 32, 1_017.6)])
    slower = job("a/small", batch=32, current=1, per_worker=16, maximum=2, remaining_samples=190_000, speed=measured)
    result = allocate([slower], gpus=8)
    assert result.workers == {"a/small": 1}
    assert result.reasons["a/small"] == "stays at 1 workers: 2 were measured slower than 1"
    nearly_done = job("a/done-soon", batch=4096, current=1, remaining_samples=1_000, restart_seconds=30.0)
    assert allocate([nearly_done], gpus=8).reasons["a/done-soon"] == (
        "stays at 1 workers: 2 would not save the 30 s a restart costs"
    )
    # Beside no free GPU, the scheduler's limit is the reason, as before: nothing is said.
    assert "a/small" not in allocate([slower, job("a/other", batch=4096, current=7)], gpus=8).reasons

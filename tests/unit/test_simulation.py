"""The cluster simulation (largebatch.simulation) that the cluster-trace benchmark and the operator's
trace test compare against: a job alone takes the time its step model says, no scheme ever gives out
more GPUs than there are, and the small trace of the e2e test moves GPUs the same way whatever the
restart costs within the range a busy machine shows."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from largebatch import simulation
from largebatch.api import LargeBatchJobSpec

SECONDS = 0.0125  # per sample


def spec(batch: dict, total: int, maximum: int = 4, priority: int = 0) -> LargeBatchJobSpec:
    return LargeBatchJobSpec.model_validate({
        "image": "sim",
        "task": {"entrypoint": "largebatch_trainer.tasks:simulated"},
        "workers": {"min": 1, "max": maximum, "accelerator": "nvidia.com/gpu"},
        "batch": {"microBatchPerDevice": 16, "policy": {"type": "constant"}} | batch,
        "optimizer": {"name": "sgd", "lr": 0.05},
        "schedule": {"totalSamples": total, "warmupSamples": total // 10},
        "priority": priority,
    })  # fmt: skip


def step_time(workers: int, batch: int) -> float:
    return -(-batch // workers) * SECONDS


def chain(job: simulation.Job) -> list[int]:
    workers = [n for _, n in job.allocations]
    return [n for i, n in enumerate(workers) if n and (i == 0 or workers[i - 1] != n)]


@pytest.mark.parametrize("scheme", simulation.SCHEMES)
def test_a_job_alone_takes_its_restart_and_its_steps(scheme):
    job = simulation.Job("a", 0.0, spec({"initial": 64, "max": 64}, 64 * 300), step_time)
    result = simulation.simulate([job], scheme, gpus=8, period=1.0, restart=7.0, seed=0)
    assert chain(result.jobs[0]) == [4]  # batch 64 in micro-batches of 16: four workers, no more
    assert result.jct[0] == pytest.approx(7.0 + 300 * step_time(4, 64))
    assert job.finish is None and not job.allocations  # the jobs given are left as they were


@st.composite
def traces(draw) -> list[simulation.Job]:
    out = []
    for i in range(draw(st.integers(1, 5))):
        initial = draw(st.sampled_from([16, 32, 64]))
        grows = draw(st.booleans())
        batch = {"initial": initial, "max": initial * 4 if grows else initial}
        if grows:
            batch["policy"] = {"type": "linearRamp", "linearRamp": {"increment": initial, "rampSamples": initial * 50}}
        total = initial * draw(st.integers(20, 200)) * (4 if grows else 1)
        maximum = draw(st.integers(1, 8))
        arrival = draw(st.floats(0, 60))
        out.append(simulation.Job(f"j{i}", arrival, spec(batch, total, maximum, draw(st.integers(0, 1))), step_time))
    return out


@settings(max_examples=40, deadline=None)
@given(traces(), st.sampled_from(simulation.SCHEMES), st.integers(2, 8))
def test_no_scheme_gives_out_more_gpus_than_the_cluster_has_and_every_job_ends(jobs, scheme, gpus):
    jobs = [j for j in jobs if j.static_workers <= gpus or scheme != "static"]  # static waits for a fit forever
    if not jobs:
        return
    result = simulation.simulate(jobs, scheme, gpus=gpus, period=1.0, restart=5.0, seed=0)
    changes = sorted({t for j in result.jobs for t, _ in j.allocations})
    for t in changes:
        held = sum(next((n for at, n in reversed(j.allocations) if at <= t), 0) for j in result.jobs if j.finish > t)
        assert held <= gpus, (t, [(j.name, j.allocations) for j in result.jobs])
    assert all(math.isfinite(j.finish) and j.finish >= j.arrival for j in result.jobs)
    assert all(j.samples >= j.total - 1e-6 for j in result.jobs)


@pytest.mark.parametrize("restart", [5.0, 10.0, 20.0, 30.0])
@pytest.mark.parametrize("arrivals", [(30, 100), (25, 100), (35, 120)])
def test_the_e2e_trace_moves_gpus_the_same_way_at_any_restart_a_busy_machine_shows(restart, arrivals):
    """tests/e2e/test_sharing.py runs this trace through the real operator and compares with the
    simulation given the restart it measured: the comparison means something only if the trace's moves
    do not hang on the restart's exact length."""
    ramp = {"type": "linearRamp", "linearRamp": {"increment": 16, "rampSamples": 16 * 100}}
    jobs = [
        simulation.Job("big", 0, spec({"initial": 64, "max": 64}, 64 * 400), step_time),
        simulation.Job("grower", arrivals[0], spec({"initial": 16, "max": 32, "policy": ramp}, 16 * 100 + 32 * 700),
                       step_time),
        simulation.Job("urgent", arrivals[1], spec({"initial": 16, "max": 16}, 16 * 100, priority=1), step_time),
    ]  # fmt: skip
    result = simulation.simulate(jobs, "allocator", gpus=4, period=1.0, restart=restart, seed=0)
    assert {j.name: chain(j) for j in result.jobs} == {"big": [4, 3, 2], "grower": [1, 2, 1, 2], "urgent": [1]}

"""The operator's metrics follow the jobs' statuses: phases counted, each job's phase, workers and worker
restarts, capped jobs, shares against demands, decisions by job and reason, and a deleted job's series gone."""

from __future__ import annotations

from largebatch.kube.metrics import OperatorMetrics


def value(metrics: OperatorMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_jobs_by_phase_workers_and_capped_jobs():
    metrics = OperatorMetrics()
    limited = {"type": "CapacityLimited", "status": "True"}
    a = {"namespace": "ns", "job_name": "a"}
    metrics.record("ns", "a", {"phase": "Running", "workers": {"desired": 4, "ready": 2, "pending": 2, "restarts": 3},
                               "conditions": [limited]})  # fmt: skip
    metrics.record("ns", "b", {"phase": "Running", "workers": {"desired": 1, "ready": 1, "pending": 0},
                               "allocation": {"workers": 1, "demand": 4}})  # fmt: skip
    metrics.record("other", "c", {"phase": "Succeeded", "conditions": [limited]})  # over: not capped any more
    assert value(metrics, "largebatch_operator_jobs", phase="Running") == 2
    assert value(metrics, "largebatch_operator_jobs", phase="Succeeded") == 1
    assert value(metrics, "largebatch_operator_jobs", phase="Failed") == 0
    assert value(metrics, "largebatch_operator_job_phase", **a, phase="Running") == 1
    assert value(metrics, "largebatch_operator_job_phase", **a, phase="Pending") == 0
    assert value(metrics, "largebatch_operator_workers", **a, state="pending") == 2
    assert value(metrics, "largebatch_operator_worker_restarts", **a) == 3
    assert value(metrics, "largebatch_operator_job_capacity_limited", **a) == 1
    assert value(metrics, "largebatch_operator_job_capacity_limited", namespace="other", job_name="c") == 0
    assert value(metrics, "largebatch_operator_capacity_limited_jobs") == 1
    b = {"namespace": "ns", "job_name": "b"}
    assert value(metrics, "largebatch_operator_job_allocation_workers", **b, kind="allocated") == 1
    assert value(metrics, "largebatch_operator_job_allocation_workers", **b, kind="demand") == 4
    assert value(metrics, "largebatch_operator_job_allocation_workers", **a, kind="demand") is None  # no share

    metrics.decided("ns", "a", "Grow")
    metrics.decided("ns", "b", "Grow")
    assert value(metrics, "largebatch_operator_scale_decisions_total", **a, reason="Grow") == 1
    metrics.record("ns", "a", {"phase": "Scaling", "workers": {"desired": 4, "ready": 4, "pending": 0}})
    assert value(metrics, "largebatch_operator_jobs", phase="Running") == 1
    assert value(metrics, "largebatch_operator_job_phase", **a, phase="Running") == 0
    assert value(metrics, "largebatch_operator_job_phase", **a, phase="Scaling") == 1
    assert value(metrics, "largebatch_operator_capacity_limited_jobs") == 0

    metrics.forget("ns", "a")
    for name, labels in [
        ("largebatch_operator_workers", {"state": "desired"}),
        ("largebatch_operator_job_phase", {"phase": "Scaling"}),
        ("largebatch_operator_worker_restarts", {}),
        ("largebatch_operator_job_capacity_limited", {}),
        ("largebatch_operator_scale_decisions_total", {"reason": "Grow"}),
    ]:
        assert value(metrics, name, **a, **labels) is None, name
    assert value(metrics, "largebatch_operator_scale_decisions_total", namespace="ns", job_name="b", reason="Grow") == 1
    assert value(metrics, "largebatch_operator_jobs", phase="Scaling") == 0
    metrics.record("ns", "b", {"phase": "Succeeded"})  # out of the allocation: its share goes
    assert value(metrics, "largebatch_operator_job_allocation_workers", **b, kind="allocated") is None

"""The operator's metrics follow the jobs' statuses: phases counted, workers per job, capped jobs, and
a deleted job's series gone."""

from __future__ import annotations

from largebatch.kube.metrics import OperatorMetrics


def value(metrics: OperatorMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_jobs_by_phase_workers_and_capped_jobs():
    metrics = OperatorMetrics()
    limited = {"type": "CapacityLimited", "status": "True"}
    metrics.record("ns", "a", {"phase": "Running", "workers": {"desired": 4, "ready": 2, "pending": 2},
                               "conditions": [limited]})  # fmt: skip
    metrics.record("ns", "b", {"phase": "Running", "workers": {"desired": 1, "ready": 1, "pending": 0}})
    metrics.record("other", "c", {"phase": "Succeeded", "conditions": [limited]})  # over: not capped any more
    assert value(metrics, "largebatch_operator_jobs", phase="Running") == 2
    assert value(metrics, "largebatch_operator_jobs", phase="Succeeded") == 1
    assert value(metrics, "largebatch_operator_jobs", phase="Failed") == 0
    assert value(metrics, "largebatch_operator_workers", namespace="ns", job="a", state="pending") == 2
    assert value(metrics, "largebatch_operator_capacity_limited_jobs") == 1

    metrics.record("ns", "a", {"phase": "Scaling", "workers": {"desired": 4, "ready": 4, "pending": 0}})
    assert value(metrics, "largebatch_operator_jobs", phase="Running") == 1
    assert value(metrics, "largebatch_operator_capacity_limited_jobs") == 0
    metrics.forget("ns", "a")
    assert value(metrics, "largebatch_operator_workers", namespace="ns", job="a", state="desired") is None
    assert value(metrics, "largebatch_operator_jobs", phase="Scaling") == 0

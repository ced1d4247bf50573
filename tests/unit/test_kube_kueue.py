"""kube/kueue.py: a job's Workload slices settled against what Kueue says of them, on Workload objects
shaped as Kueue v0.17.0 writes them (the e2e tests, tests/e2e/test_kueue.py, run the real Kueue)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from largebatch.api import LargeBatchJob
from largebatch.kube import kueue
from tests.unit.test_kube_manifests import job as manifest_job

UID = "uid-1"
STAMP = "2026-12-04T06:00:00Z"
TEMPLATE = {"spec": {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def job(labels: dict[str, str] | None = None) -> LargeBatchJob:
    base = manifest_job(workers={"accelerator": "nvidia.com/gpu"})
    labels = {kueue.QUEUE_LABEL: "team-a"} if labels is None else labels
    return base.model_copy(update={"metadata": base.metadata.model_copy(update={"labels": labels})})


def workload(index: int, count: int, *, admitted: int | None = None, evicted: str | None = None,
             finished: str | None = None, waiting: str | None = None) -> kueue.Slice:  # fmt: skip
    """A Workload of job `job()` as Kueue leaves it."""
    conditions, status = [], {}
    if admitted is not None:
        conditions += [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "reserved"},
                       {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "admitted"}]  # fmt: skip
        status["admission"] = {"clusterQueue": "gpus", "podSetAssignments": [
            {"name": "workers", "count": admitted, "flavors": {"nvidia.com/gpu": "a100", "cpu": "a100"}}]}  # fmt: skip
    if waiting is not None:
        conditions.append({"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": waiting})
    if evicted is not None:
        conditions.append({"type": "Evicted", "status": "True", "reason": evicted, "message": "to make room"})
    if finished is not None:
        conditions.append({"type": "Finished", "status": "True", "reason": finished, "message": "done"})
    obj = {
        "metadata": {"name": f"{job().metadata.name}-{index}", "namespace": "team-a", "resourceVersion": "7"},
        "spec": {"queueName": "team-a", "podSets": [{"name": "workers", "count": count, "template": TEMPLATE}]},
        "status": status | {"conditions": conditions},
    }
    return kueue.Slice.of(obj)


def settle(slices, wanted: int, live: int = 0, **kw) -> kueue.Settled:
    return kueue.settle(job(), UID, TEMPLATE, slices, wanted, live, **kw)


def test_a_job_with_no_workload_asks_for_what_its_batch_wants():
    settled = settle([], wanted=4)
    created = settled.writes.create
    assert settled.workers == 0 and settled.queued[0] is True
    assert settled.queued[2] == "waiting in team-a for 4 nvidia.com/gpu"
    assert created["metadata"]["name"] == f"{job().metadata.name}-0"
    assert created["metadata"]["ownerReferences"][0]["controller"] is True
    assert created["spec"]["queueName"] == "team-a" and created["spec"]["priority"] == 0
    assert created["spec"]["podSets"] == [{"name": "workers", "count": 4, "template": TEMPLATE}]
    assert kueue.REPLACES not in created["metadata"].get("annotations", {})
    assert (settled.status.workload, settled.status.requested, settled.status.admitted) == (
        created["metadata"]["name"],
        4,
        0,
    )


def test_a_waiting_slice_follows_the_batch_and_says_why_kueue_waits():
    waiting = workload(0, 2, waiting="insufficient unused quota for nvidia.com/gpu in flavor a100, 2 more needed")
    assert settle([waiting], wanted=2).writes.create is None
    settled = settle([waiting], wanted=3)
    assert settled.writes.count == (waiting.name, 3) and settled.writes.create is None
    assert settled.queued[2].endswith(": insufficient unused quota for nvidia.com/gpu in flavor a100, 2 more needed")


def test_a_grown_batch_asks_for_a_slice_that_replaces_the_admitted_one_and_runs_what_is_admitted():
    held = workload(0, 1, admitted=1)
    settled = settle([held], wanted=2, live=1)
    assert settled.workers == 1 and settled.flavors == ("a100",)
    replacement = settled.writes.create
    assert replacement["metadata"]["name"] == f"{job().metadata.name}-1"
    assert replacement["metadata"]["annotations"][kueue.REPLACES] == f"team-a/{held.name}"
    assert replacement["spec"]["podSets"][0]["count"] == 2
    assert settled.queued[0] is True and "waiting for 1 more nvidia.com/gpu" in settled.queued[2]
    # Once Kueue admitted the replacement, it has finished the old slice itself.
    admitted = settle([workload(0, 1, admitted=1, finished="WorkloadSliceReplaced"), workload(1, 2, admitted=2)], 2, 1)
    assert admitted.workers == 2 and admitted.writes == kueue.Writes()
    assert admitted.queued[:2] == (False, "Admitted")


def test_a_slice_not_wanted_any_more_goes_and_a_smaller_batch_gives_quota_back():
    held, asking = workload(0, 2, admitted=2), workload(1, 4)
    assert settle([held, asking], wanted=2, live=2).writes.delete == (asking.name,)
    # Fewer wanted: the count comes down once the surplus workers are gone, not before.
    assert settle([held], wanted=1, live=2).writes.count is None
    shrunk = settle([held], wanted=1, live=1)
    assert shrunk.writes.count == (held.name, 1) and shrunk.workers == 1


def test_an_evicted_job_stops_its_workers_then_gives_its_reservation_back():
    evicted = workload(0, 2, admitted=2, evicted="Preempted")
    stopping = settle([evicted], wanted=2, live=2)
    assert stopping.workers == 0 and stopping.writes.release is None
    assert stopping.queued[1] == "Evicted" and "2 workers checkpoint and stop" in stopping.queued[2]
    stopped = settle([evicted], wanted=2, live=0)
    assert stopped.writes.release == evicted
    released = kueue.released_status(evicted, STAMP)
    by_type = {c["type"]: c for c in released["status"]["conditions"]}
    assert released["status"]["admission"] is None and released["metadata"]["resourceVersion"] == "7"
    assert (by_type["QuotaReserved"]["status"], by_type["Admitted"]["status"]) == ("False", "False")
    assert (by_type["Requeued"]["status"], by_type["Requeued"]["reason"]) == ("True", "Preempted")
    assert by_type["Evicted"]["status"] == "True"  # Kueue's to clear, when it admits the slice again


def test_an_ended_job_finishes_its_slice_and_a_suspended_one_lets_go_of_its_quota():
    held, asking = workload(0, 2, admitted=2), workload(1, 4)
    ended = settle([held, asking], wanted=0, ended="Succeeded")
    assert [(f.slice.name, f.reason) for f in ended.writes.finish] == [(held.name, "Succeeded")]
    assert ended.writes.delete == (asking.name,) and ended.workers == 0
    finished = kueue.finished_status(held, "Succeeded", "the job succeeded", STAMP)
    assert {c["type"]: c["status"] for c in finished["status"]["conditions"]}["Finished"] == "True"
    suspended = settle([held], wanted=2, suspended=True)
    assert suspended.writes.delete == (held.name,) and suspended.workers == 0


def test_a_priority_class_goes_with_its_value():
    labelled = job({kueue.QUEUE_LABEL: "team-a", kueue.PRIORITY_LABEL: "urgent"})
    created = kueue.settle(labelled, UID, TEMPLATE, [], 1, 0, priority=1000).writes.create
    assert created["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                                   "name": "urgent"}  # fmt: skip
    assert created["spec"]["priority"] == 1000


def test_workers_go_where_the_flavor_says_and_a_contradiction_names_both_sides():
    pod = {"metadata": {"labels": {}}, "spec": {"nodeSelector": {"zone": "a"}, "tolerations": [{"key": "x"}]}}
    flavor = {"nodeLabels": {"gpu": "a100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}
    placed = kueue.place(pod, {"a100": flavor})
    assert placed["spec"]["nodeSelector"] == {"zone": "a", "gpu": "a100"}
    assert placed["spec"]["tolerations"] == [{"key": "x"}, {"key": "gpu", "operator": "Exists"}]
    assert placed["metadata"]["labels"][kueue.PODSET_LABEL] == "workers" and pod["spec"]["nodeSelector"] == {
        "zone": "a"
    }
    with pytest.raises(ValueError, match="zone=b.*zone=a"):
        kueue.place(pod, {"b": {"nodeLabels": {"zone": "b"}}})


def test_the_template_keeps_what_kueue_counts_and_places_by():
    trainer = {"name": "trainer", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    pod = {"spec": {"hostname": "w-3", "nodeSelector": {"a": "b"}, "containers": [trainer | {"command": ["torchrun"]}]}}
    assert kueue.template(pod) == {"spec": {"nodeSelector": {"a": "b"}, "containers": [trainer]}}


@st.composite
def slices(draw):
    """Any history of slices Kueue could leave: some finished, at most the newest two live."""
    out = []
    for index in range(draw(st.integers(0, 4))):
        count = draw(st.integers(1, 8))
        state = draw(st.sampled_from(["waiting", "admitted", "evicted", "finished"]))
        out.append(workload(index, count, admitted=count if state in ("admitted", "evicted") else None,
                            evicted="Preempted" if state == "evicted" else None,
                            finished="WorkloadSliceReplaced" if state == "finished" else None,
                            waiting="no quota" if state == "waiting" else None))  # fmt: skip
    return out


@given(slices(), st.integers(1, 8), st.integers(0, 8))
def test_a_job_never_runs_more_than_admitted_nor_gives_back_quota_its_workers_hold(history, wanted, live):
    settled = settle(history, wanted, live)
    live_admissions = [s.admitted for s in history if s.admitted and not s.finished and s.evicted is None]
    assert settled.workers <= max(live_admissions, default=0)
    held = {s.name: s.admitted for s in history if s.admitted and not s.finished}
    if settled.writes.count and settled.writes.count[0] in held:  # quota given back: never below what runs
        assert live <= settled.writes.count[1] < held[settled.writes.count[0]]
    names = {s.name for s in history}
    if settled.writes.create:
        assert settled.writes.create["metadata"]["name"] not in names  # a name is never reused

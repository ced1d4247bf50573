"""The operator's reconcile without a cluster: `plan` (what to create and delete, the status that does not
depend on the calls) and `account` (the status that does), for the cases the e2e tests drive through a
real control plane, and a property: the plan's pod changes give the decision's worker count."""

from __future__ import annotations

import dataclasses
import datetime

from hypothesis import given
from hypothesis import strategies as st

from largebatch import launch, schedule
from largebatch.api import LargeBatchJob, LargeBatchJobStatus
from largebatch.kube.manifests import INDEX_LABEL, ROLE_LABEL, ROUND_LABEL
from largebatch.kube.plan import Outcome, Seen, Settings, account, plan

NOW = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.timezone.utc)
STAMP = "2026-12-03T12:00:00Z"
SETTINGS = Settings(unschedulable_grace=20, capacity_retry=120, restart_seconds=15)
TOTAL = 128_000


def job(claim: str | None = None, suspend: bool = False, **workers) -> LargeBatchJob:
    return LargeBatchJob.model_validate({
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": "job", "namespace": "ns"},
        "spec": {
            "image": "largebatch-trainer:test",
            "task": {"entrypoint": "largebatch_trainer.tasks:linreg"},
            "workers": {"min": 1, "max": 2, "accelerator": "none"} | workers,
            "batch": {"initial": 16, "max": 32, "microBatchPerDevice": 16, "policy": {"type": "seesaw"}},
            "optimizer": {"name": "sgd", "lr": 0.05},
            "schedule": {"totalSamples": TOTAL, "warmupSamples": 320, "decay": "cosine", "minLrRatio": 0.1},
            "checkpoint": {"path": "/ckpt"} | ({"claimName": claim} if claim else {}),
            "suspend": suspend,
        },
    })  # fmt: skip


def worker(index: int, phase: str = "Running", round_: int = 1, refused_ago: float | None = None, **status):
    conditions = []
    if refused_ago is not None:
        when = (NOW - datetime.timedelta(seconds=refused_ago)).isoformat().replace("+00:00", "Z")
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "lastTransitionTime": when})  # fmt: skip
    labels = {ROLE_LABEL: "worker", INDEX_LABEL: str(index), ROUND_LABEL: str(round_)}
    return {
        "metadata": {"name": f"job-worker-{index}", "labels": labels},
        "spec": {} if refused_ago is not None or phase == "Pending" else {"nodeName": "node"},
        "status": {"phase": phase, "conditions": conditions, **status},
    }


RENDEZVOUS = {"metadata": {"name": "job-rdzv", "labels": {ROLE_LABEL: "rendezvous"}}, "status": {"phase": "Running"}}


def failed(index: int, message: str = "") -> dict:
    terminated = {"state": {"terminated": {"exitCode": 1, "message": message}}}
    return worker(index, "Failed", containerStatuses=[terminated])


def seen(spec: LargeBatchJob, pods=(), claim_found: bool | None = None, **status) -> Seen:
    return Seen(spec, "uid-1", 2, LargeBatchJobStatus.model_validate(status), list(pods), NOW, None, claim_found)


def reconcile(observed: Seen, outcome: Outcome | None = None):
    """Plan (looking the claim up as `observed` says), then account as if every call took."""
    actions = plan(observed, SETTINGS)
    assert actions.check_claim is None, "plan again with the claim looked up"
    if outcome is None:
        outcome = Outcome(deleted=frozenset(actions.delete), created_workers=len(actions.workers))
    return actions, account(actions, outcome)


def first_sample_at_batch(spec: LargeBatchJob, batch: int) -> int:
    """Where the schedule first trains at `batch` (a Seesaw cut)."""
    return next(phase.start for phase in schedule.phases(spec.spec) if phase.global_batch >= batch)


def test_a_new_job_gets_its_objects_and_the_workers_of_its_first_batch_in_round_one():
    actions, done = reconcile(seen(job()))
    kinds = [o["kind"] for o in actions.objects]
    assert kinds == ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Service", "Service"]
    assert [p["metadata"]["name"] for p in actions.rendezvous] == ["job-rdzv"]
    assert [p["metadata"]["name"] for p in actions.workers] == ["job-worker-0"]
    assert actions.workers[0]["metadata"]["labels"][ROUND_LABEL] == "1"
    assert done.news.kind.value == "Start" and done.status.phase == "Pending"
    assert done.status.workers.model_dump() == {"desired": 1, "ready": 0, "pending": 1, "restarts": 0, "round": 1}
    assert done.status.start_time == STAMP and done.status.observed_generation == 2
    assert done.status.rescales is None  # a start from nothing is not a rescale
    warned = [e.reason for e in done.events if e.type == "Warning"]
    assert "NoDurableCheckpoint" in warned


def test_a_start_that_creates_nothing_opens_no_round():
    refused = (("PodRejected", "quota"),)
    actions, done = reconcile(seen(job()), Outcome(refused_workers=refused))
    assert actions.workers and done.status.workers.round == 0 and done.status.start_time is None
    assert done.news is None
    blocked = next(c for c in done.status.conditions if c.type == "WorkersBlocked")
    assert (blocked.status, blocked.reason, blocked.message) == ("True", "PodRejected", "quota")


def test_a_cut_that_doubles_the_batch_grows_the_job_into_the_live_round():
    spec = job()
    at = first_sample_at_batch(spec, 32)
    progress = {"step": 500, "samples": at, "policyBatch": 16}
    actions, done = reconcile(seen(spec, [RENDEZVOUS, worker(0, round_=3)], progress=progress))
    assert not actions.objects and not actions.rendezvous
    assert [p["metadata"]["name"] for p in actions.workers] == ["job-worker-1"]
    assert actions.workers[0]["metadata"]["labels"][ROUND_LABEL] == "3"
    assert done.news.kind.value == "Grow" and done.status.phase == "Scaling"
    [entry] = done.status.rescales.recent
    assert (entry.from_workers, entry.to_workers, entry.kind, entry.samples, entry.time) == (1, 2, "Grow", at, STAMP)
    assert done.status.rescales.count == 1


def test_a_worker_the_scheduler_cannot_place_limits_the_job_to_what_was_placed():
    spec = job()
    progress = {"step": 900, "samples": first_sample_at_batch(spec, 32), "policyBatch": 32}
    pods = [RENDEZVOUS, worker(0), worker(1, "Pending", refused_ago=45)]
    actions, done = reconcile(seen(spec, pods, progress=progress))
    assert actions.delete == ("job-worker-1",) and not actions.workers
    assert done.status.capacity == 1 and done.status.capacity_time == STAMP
    limited = next(c for c in done.status.conditions if c.type == "CapacityLimited")
    assert limited.status == "True" and done.news.kind.value == "CapacityLimited"


def test_a_lost_worker_is_deleted_and_counted_once_then_replaced():
    pods = [RENDEZVOUS, worker(0), failed(1, "node lost")]
    status = {"workers": {"restarts": 1, "round": 1}}
    actions, done = reconcile(seen(job(min=2), pods, **status))
    assert actions.delete == ("job-worker-1",) and not actions.workers
    assert done.status.workers.restarts == 2 and done.status.phase is None
    [event] = [e for e in done.events if e.reason == "WorkerFailed"]
    assert "job-worker-1 failed; replacing it (2 of 3 restarts): node lost" == event.message
    # A watch that still shows the pod after it is gone: its 404 does not count again.
    _, again = reconcile(seen(job(min=2), pods, **status), Outcome())
    assert again.status.workers.restarts == 1 and not [e for e in again.events if e.reason == "WorkerFailed"]
    # Once it is gone, the next reconcile replaces it under its own name, in the live round.
    actions, _ = reconcile(seen(job(min=2), [RENDEZVOUS, worker(0)], workers={"restarts": 2, "round": 1}))
    assert [p["metadata"]["name"] for p in actions.workers] == ["job-worker-1"]


def test_one_failure_past_max_restarts_fails_the_job_and_the_next_reconcile_removes_its_pods():
    pods = [RENDEZVOUS, worker(0), failed(1, "Traceback\nRuntimeError: boom")]
    _, done = reconcile(seen(job(), pods, workers={"restarts": 3}))
    condition = next(c for c in done.status.conditions if c.type == "Failed")
    assert condition.reason == "TooManyRestarts" and done.status.phase == "Failed"
    assert condition.message.startswith("4 worker failures, more than workers.maxRestarts 3; last failed: job-worker-1")
    assert "RuntimeError: boom" in condition.message and done.status.completion_time == STAMP
    assert done.status.workers.desired == 0
    actions, _ = reconcile(seen(job(), pods, **done.status.model_dump(by_alias=True, exclude_none=True)))
    assert actions.delete == ("job-rdzv", "job-worker-0", "job-worker-1") and not actions.workers


def test_a_diverged_worker_fails_the_job_at_once():
    _, done = reconcile(seen(job(), [RENDEZVOUS, failed(0, f"DivergenceError: {launch.DIVERGED} at step 12")]))
    condition = next(c for c in done.status.conditions if c.type == "Failed")
    assert condition.reason == "Diverged" and done.status.workers.restarts == 1
    assert "not restarted (it would diverge again)" in condition.message


def test_suspend_deletes_the_live_workers_once_and_says_so_once():
    pods = [RENDEZVOUS, worker(0), worker(1, "Pending")]
    actions, done = reconcile(seen(job(suspend=True), pods, phase="Running"))
    assert actions.delete == ("job-worker-0", "job-worker-1") and not actions.workers
    assert done.status.phase == "Suspended" and done.status.workers.desired == 0
    assert [e.reason for e in done.events if e.type == "Normal"] == ["Suspended"]
    _, again = reconcile(seen(job(suspend=True), pods, phase="Suspended"))
    assert not [e for e in again.events if e.reason == "Suspended"]


def test_the_done_report_completes_the_job_and_removes_every_pod():
    progress = {"step": 4000, "samples": TOTAL, "done": True}
    actions, done = reconcile(seen(job(), [RENDEZVOUS, worker(0, "Succeeded")], progress=progress))
    assert actions.delete == ("job-rdzv", "job-worker-0")
    assert done.status.phase == "Succeeded" and done.status.completion_time == STAMP
    complete = next(c for c in done.status.conditions if c.type == "Complete")
    assert complete.message == f"trained {TOTAL:,} samples in 4,000 steps"


def test_a_missing_claim_blocks_the_workers_with_its_name_and_a_found_one_lets_them_start():
    asked = plan(seen(job(claim="ckpt")), SETTINGS)
    assert asked.check_claim == "ckpt" and not asked.workers
    actions, done = reconcile(seen(job(claim="ckpt"), claim_found=False))
    assert not actions.workers and actions.rendezvous and done.status.workers.round == 0
    blocked = next(c for c in done.status.conditions if c.type == "WorkersBlocked")
    assert blocked.reason == "VolumeClaimNotFound" and "'ckpt'" in blocked.message and "namespace ns" in blocked.message
    blocked_status = done.status.model_dump(by_alias=True, exclude_none=True)
    actions, done = reconcile(seen(job(claim="ckpt"), claim_found=True, **blocked_status))
    assert [p["metadata"]["name"] for p in actions.workers] == ["job-worker-0"]
    unblocked = next(c for c in done.status.conditions if c.type == "WorkersBlocked")
    assert (unblocked.status, unblocked.reason) == ("False", "Unblocked")


def test_an_unchanged_condition_keeps_its_transition_time_and_sends_no_second_event():
    _, first = reconcile(seen(job()))
    status = first.status.model_dump(by_alias=True, exclude_none=True)
    later = dataclasses.replace(seen(job(), **status), now=NOW + datetime.timedelta(minutes=5))
    _, second = reconcile(later)
    assert not [e for e in second.events if e.reason == "NoDurableCheckpoint"]
    assert second.status.conditions == first.status.conditions


STATES = st.sampled_from(["Running", "Starting", "Waiting", "Unschedulable"])


@given(
    states=st.dictionaries(st.integers(0, 7), STATES, max_size=6),
    bounds=st.tuples(st.integers(1, 4), st.integers(0, 4)),
    fraction=st.floats(0, 0.99),
)
def test_the_pods_a_plan_creates_and_deletes_leave_the_decisions_worker_count(states, bounds, fraction):
    low, extra = bounds
    spec = job(min=low, max=low + extra)
    pods = [RENDEZVOUS]
    for index, state in states.items():
        if state == "Unschedulable":
            pods.append(worker(index, "Pending", refused_ago=60))
        else:
            pods.append(worker(index, "Running" if state == "Running" else "Pending"))
            if state == "Waiting":
                pods[-1]["spec"] = {}
    progress = {"step": 10, "samples": int(fraction * TOTAL)}
    actions = plan(seen(spec, pods, progress=progress), SETTINGS)
    live = {p["metadata"]["name"] for p in pods[1:]}
    after = (live - set(actions.delete)) | {p["metadata"]["name"] for p in actions.workers}
    assert len(after) == actions.scaling.decision.workers
    assert set(actions.delete) <= live and not live & {p["metadata"]["name"] for p in actions.workers}


def test_a_job_under_kueue_runs_only_what_kueue_admitted_on_the_flavors_nodes():
    from largebatch.kube import kueue
    from tests.unit.test_kube_kueue import workload

    queued = job(accelerator="nvidia.com/gpu", min=1, max=4)
    queued = queued.model_copy(update={"metadata": queued.metadata.model_copy(update={"labels": {
        kueue.QUEUE_LABEL: "team-a"}})})  # fmt: skip
    waiting = plan(dataclasses.replace(seen(queued), queue=kueue.Observed()), SETTINGS)
    assert waiting.status.phase == "Queued" and waiting.workers == () and waiting.queue.create is not None
    assert "QueuedByKueue" in [c.type for c in waiting.status.conditions if c.status == "True"]

    admitted = kueue.Observed((workload(0, 1, admitted=1),), {"a100": {"nodeLabels": {"gpu": "a100"}}})
    running = plan(dataclasses.replace(seen(queued), queue=admitted), SETTINGS)
    assert [p["metadata"]["name"] for p in running.workers] == ["job-worker-0"]
    assert running.workers[0]["spec"]["nodeSelector"] == {"gpu": "a100"}
    assert running.status.queue.admitted == 1

    evicted = kueue.Observed((workload(0, 1, admitted=1, evicted="Preempted"),))
    stopping = plan(
        dataclasses.replace(seen(queued, [RENDEZVOUS, worker(0)], phase="Running"), queue=evicted), SETTINGS
    )
    assert stopping.delete == ("job-worker-0",) and stopping.status.phase == "Queued"

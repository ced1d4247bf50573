"""One reconcile of one LargeBatchJob: observe (its status and its pods), decide (the pure controller),
apply (create and delete objects), remember (status, conditions, Events).

Level-based and idempotent: fixed names, 409 on create and 404 on delete count as done, and whatever
the next reconcile needs is in the job's status, so an operator restarted at any moment carries on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from largebatch import controller, report, timestamps
from largebatch.api import LargeBatchJob
from largebatch.kube import manifests, world
from largebatch.kube.manifests import JOB_LABEL, ROLE_LABEL, Names

Emit = Callable[[str, str, str], None]
"""(type Normal|Warning, reason, message) → an Event on the job."""


@dataclass(frozen=True)
class Settings:
    unschedulable_grace: float = 20.0
    """Seconds a worker may stay unschedulable before the cluster's capacity counts as reached."""
    capacity_retry: float = 120.0
    """Seconds after which a capacity-limited job tries to grow again."""
    restart_seconds: float = 15.0
    """Assumed cost of a rescale."""


@dataclass
class Apis:
    core: client.CoreV1Api
    rbac: client.RbacAuthorizationV1Api

    @classmethod
    def of(cls, api_client: client.ApiClient | None = None) -> Apis:
        return cls(client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client))

    def create(self, obj: dict[str, Any]) -> None:
        namespace, kind = obj["metadata"]["namespace"], obj["kind"]
        call = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
            "ServiceAccount": self.core.create_namespaced_service_account,
            "Role": self.rbac.create_namespaced_role,
            "RoleBinding": self.rbac.create_namespaced_role_binding,
        }[kind]
        try:
            call(namespace, obj)
        except ApiException as exc:
            if exc.status != 409:  # it exists: a restarted operator, or the last reconcile made it
                raise

    def delete_pod(self, namespace: str, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        found = self.core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={job}")
        return [self.core.api_client.sanitize_for_serialization(p) for p in found.items]


def reconcile(body: dict[str, Any], apis: Apis, settings: Settings, emit: Emit) -> dict[str, Any]:
    """Bring the job's objects one step closer to what it needs; returns the status fields to patch
    (only those that changed)."""
    now = timestamps.now()
    stamp = timestamps.stamp(now)
    job, status = LargeBatchJob.from_object(body), dict(body.get("status") or {})
    meta, spec = body["metadata"], job.spec
    uid, namespace, names = meta["uid"], meta["namespace"], Names(meta["name"])
    changes: dict[str, Any] = {}
    conditions = {c["type"]: c for c in status.get("conditions", [])}

    def condition(kind: str, true: bool, reason: str, message: str) -> None:
        old = conditions.get(kind)
        value = "True" if true else "False"
        if old and (old["status"], old.get("reason"), old.get("message")) == (value, reason, message):
            return
        moved = not old or old["status"] != value
        conditions[kind] = {
            "type": kind,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": stamp if moved else old.get("lastTransitionTime"),
            "observedGeneration": meta.get("generation"),
        }
        changes["conditions"] = list(conditions.values())

    def set_status(key: str, value: Any) -> None:
        if status.get(key) != value:
            changes[key] = value

    set_status("observedGeneration", meta.get("generation"))
    if status.get("phase") in ("Succeeded", "Failed"):
        _remove_pods(apis, namespace, apis.pods(namespace, names.job))
        return changes

    progress_status, _ = report.read(status)
    progress = report.progress_from_status(progress_status)
    workers = dict(status.get("workers") or {})
    all_pods = apis.pods(namespace, names.job)
    worker_pods = [p for p in all_pods if p["metadata"]["labels"].get(ROLE_LABEL) == "worker"]
    pods = world.classify(worker_pods, now)

    if progress_status.done and progress.samples >= spec.schedule.total_samples:
        _remove_pods(apis, namespace, all_pods)
        set_status("phase", "Succeeded")
        set_status("completionTime", stamp)
        set_status("workers", workers | {"desired": 0, "ready": 0, "pending": 0})
        message = f"trained {progress.samples:,} samples in {progress.step:,} steps"
        condition("Complete", True, "Complete", message)
        emit("Normal", "Complete", message)
        return changes

    if not spec.checkpoint.claim_name and "NoDurableCheckpoint" not in conditions:
        message = (
            f"checkpoint.claimName is not set: checkpoints at {spec.checkpoint.path} live in each pod and an "
            "elastic restart loses the progress; set a ReadWriteMany PersistentVolumeClaim"
        )
        condition("NoDurableCheckpoint", True, "NoDurableCheckpoint", message)
        emit("Warning", "NoDurableCheckpoint", message)

    # Ended pods: a failed or lost worker is replaced (under its own name) until maxRestarts runs out.
    restarts = workers.get("restarts", 0) + len(pods.failed)
    if restarts > spec.workers.max_restarts:
        message = (
            f"{restarts} worker failures, more than workers.maxRestarts {spec.workers.max_restarts}; "
            f"last failed: {', '.join(names.worker(i) for i in pods.failed)}"
        )
        _remove_pods(apis, namespace, all_pods)
        condition("Failed", True, "TooManyRestarts", message)
        emit("Warning", "Failed", message)
        set_status("phase", "Failed")
        set_status("completionTime", stamp)
        set_status("workers", workers | {"restarts": restarts, "desired": 0, "ready": 0, "pending": 0})
        return changes
    for i in pods.failed:
        emit(
            "Warning",
            "WorkerFailed",
            f"{names.worker(i)} failed; replacing it ({restarts} of {spec.workers.max_restarts} restarts)",
        )

    if spec.suspend:
        for i in pods.live:
            apis.delete_pod(namespace, names.worker(i))  # SIGTERM: the workers checkpoint and stop
        if pods.live and status.get("phase") != "Suspended":
            emit("Normal", "Suspended", f"suspending: {len(pods.live)} workers checkpoint and stop")
        set_status("phase", "Suspended")
        set_status("workers", workers | {"desired": 0, "ready": 0, "pending": pods.pending, "restarts": restarts})
        return changes

    if not any(p["metadata"]["labels"].get(ROLE_LABEL) == "rendezvous" for p in all_pods):
        for obj in (
            manifests.job_config(job, uid),
            *manifests.trainer_rbac(job, uid),
            manifests.rendezvous_service(job, uid),
            manifests.workers_service(job, uid),
            manifests.rendezvous_pod(job, uid),
        ):
            apis.create(obj)

    # Capacity: what the scheduler has shown, remembered in the status and retried after a while.
    capacity = world.capacity(pods, settings.unschedulable_grace)
    limited = conditions.get("CapacityLimited")
    if capacity is not None:
        set_status("capacityTime", stamp)
    elif status.get("capacity") is not None:
        since = timestamps.seconds_since(status.get("capacityTime"), now)
        keep = since is not None and since < settings.capacity_retry
        capacity = status["capacity"] if keep else None
    set_status("capacity", capacity)

    rescales = dict(status.get("rescales") or {"count": 0, "recent": []})
    last_rescale = rescales["recent"][-1]["time"] if rescales.get("recent") else None
    seen = controller.Observation(
        progress=progress,
        workers=len(pods.live),
        capacity=capacity,
        samples_per_second=progress_status.samples_per_second if pods.running else None,
        seconds_since_rescale=timestamps.seconds_since(last_rescale, now),
        restart_seconds=settings.restart_seconds,
    )
    decision = controller.decide(spec, seen)
    if decision.kind is controller.Kind.CAPACITY_LIMITED:
        condition("CapacityLimited", True, decision.kind.value, decision.reason)
    elif limited and limited["status"] == "True" and capacity is None:
        condition("CapacityLimited", False, "CapacityAvailable", "the cluster placed every worker asked for")

    round_ = workers.get("round", 0)
    if not pods.live and decision.workers:
        round_ += 1  # agents that gave up close their rendezvous for good: a fresh start needs a fresh one
    create, delete = world.pod_changes(decision.workers, pods)
    if decision.changes(len(pods.live)):
        message = f"{len(pods.live)} → {decision.workers} workers: {decision.reason}"
        emit("Normal", decision.kind.value, message)
        if pods.live:
            recent = rescales.get("recent", [])
            entry = {"time": stamp, "from": len(pods.live), "to": decision.workers,
                     "samples": progress.samples, "kind": decision.kind.value, "reason": decision.reason}  # fmt: skip
            rescales = {"count": rescales.get("count", 0) + 1, "recent": [*recent, entry][-5:]}
            set_status("rescales", rescales)
    for i in delete:
        apis.delete_pod(namespace, names.worker(i))
    run_id = f"{names.job}-{uid[:8]}-{round_}"
    for i in create:
        apis.create(manifests.worker_pod(job, uid, i, run_id))
    if create and not status.get("startTime"):
        set_status("startTime", stamp)

    pending = pods.pending + len(create)
    ready = len([i for i in pods.running if i < decision.workers])
    if ready == 0 and not progress.step:
        phase = "Pending"
    elif ready < decision.workers or pending or delete:
        phase = "Scaling"
    else:
        phase = "Running"
    set_status("phase", phase)
    set_status(
        "workers",
        workers
        | {"desired": decision.workers, "ready": ready, "pending": pending, "restarts": restarts, "round": round_},
    )
    return changes


def _remove_pods(apis: Apis, namespace: str, pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        if not pod["metadata"].get("deletionTimestamp"):
            apis.delete_pod(namespace, pod["metadata"]["name"])

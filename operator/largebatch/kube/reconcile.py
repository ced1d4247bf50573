"""One reconcile of one LargeBatchJob: observe (its status and its pods), decide (the pure controller),
apply (create and delete objects), remember (status, conditions, Events).

Level-based and idempotent: fixed names, 409 on create and 404 on delete count as done, and whatever
the next reconcile needs is in the job's status, so an operator restarted at any moment carries on.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from largebatch import caveats, controller, launch, report, timestamps
from largebatch.api import LargeBatchJob
from largebatch.kube import api_errors, manifests, world
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

    def create(self, obj: dict[str, Any]) -> bool:
        """Create an object; False when it exists already."""
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
            if exc.status != 409:  # it exists: a restarted operator, or a reconcile that saw an old list
                raise
            return False
        return True

    def claim_exists(self, namespace: str, name: str) -> bool:
        try:
            self.core.read_namespaced_persistent_volume_claim(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod; False when it was gone already (a watch may show a pod for a moment longer)."""
        try:
            self.core.delete_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False
        return True

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        # The JSON as it came: the client's models cost more to build and turn back into dicts than the call.
        found = self.core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={job}", _preload_content=False)
        return json.loads(found.data)["items"]


@dataclass
class Reconciled:
    changes: dict[str, Any] = field(default_factory=dict)
    """The status fields to patch (only those that changed)."""
    status: dict[str, Any] = field(default_factory=dict)
    """The whole status once they are patched."""
    decision: controller.Decision | None = None
    """The controller's decision, when it changed the number of workers."""


REJECTED = (403, 422)
"""What the API server answers to a pod it refuses (a quota, an admission policy, an invalid field):
reported on the job and retried, never raised, so a bad job cannot make the operator crash-loop."""


def reconcile(
    body: dict[str, Any],
    apis: Apis,
    settings: Settings,
    emit: Emit,
    nodes_changed: datetime.datetime | None = None,
    pods: list[dict[str, Any]] | None = None,
) -> Reconciled:
    """Bring the job's objects one step closer to what it needs. `nodes_changed` is when a node last
    offered more (a capacity-limited job then tries to grow at once instead of after the retry delay);
    `pods` the job's pods as a watch has them (listed from the API when not given)."""
    result = Reconciled()
    _reconcile(body, apis, settings, emit, nodes_changed, pods, result)
    result.status = dict(body.get("status") or {}) | result.changes
    return result


def _reconcile(
    body: dict[str, Any],
    apis: Apis,
    settings: Settings,
    emit: Emit,
    nodes_changed: datetime.datetime | None,
    all_pods: list[dict[str, Any]] | None,
    result: Reconciled,
) -> None:
    now = timestamps.now()
    stamp = timestamps.stamp(now)
    job, status = LargeBatchJob.from_object(body), dict(body.get("status") or {})
    meta, spec = body["metadata"], job.spec
    uid, namespace, names = meta["uid"], meta["namespace"], Names(meta["name"])
    changes = result.changes
    conditions = {c["type"]: c for c in status.get("conditions", [])}

    def condition(kind: str, true: bool, reason: str, message: str) -> bool:
        """Set a condition; whether it changed (so an Event goes out once, not every reconcile)."""
        old = conditions.get(kind)
        value = "True" if true else "False"
        if old and (old["status"], old.get("reason"), old.get("message")) == (value, reason, message):
            return False
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
        return True

    def set_status(key: str, value: Any) -> None:
        if status.get(key) != value:
            changes[key] = value

    set_status("observedGeneration", meta.get("generation"))
    watched = all_pods is not None
    if all_pods is None:
        all_pods = apis.pods(namespace, names.job)
    if status.get("phase") in ("Succeeded", "Failed"):
        _remove_pods(apis, namespace, all_pods)
        return

    progress_status, _ = report.read(status)
    progress = report.progress_from_status(progress_status)
    workers = dict(status.get("workers") or {})
    worker_pods = [p for p in all_pods if p["metadata"]["labels"].get(ROLE_LABEL) == "worker"]
    pods = world.classify(worker_pods, now)
    if not pods.live and watched:
        # A watch can lag behind the pods this operator created a moment ago; before starting workers
        # (a new rendezvous round), ask the API server itself.
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
        return

    if not spec.checkpoint.claim_name and "NoDurableCheckpoint" not in conditions:
        message = (
            f"checkpoint.claimName is not set: checkpoints at {spec.checkpoint.path} live in each pod and an "
            "elastic restart loses the progress; set a ReadWriteMany PersistentVolumeClaim"
        )
        condition("NoDurableCheckpoint", True, "NoDurableCheckpoint", message)
        emit("Warning", "NoDurableCheckpoint", message)
    for caveat in caveats.caveats(spec):
        if condition(caveat.reason, True, caveat.reason, caveat.message):
            emit("Warning", caveat.reason, caveat.message)

    # Ended pods: a failed or lost worker is deleted, to be replaced under its own name, until maxRestarts
    # runs out. A failure counts when its pod is deleted, so a pod the watch still shows counts once.
    failed = [i for i in pods.failed if apis.delete_pod(namespace, names.worker(i))]
    restarts = workers.get("restarts", 0) + len(failed)
    last_error = "".join(f"\n{names.worker(i)}: {world.last_lines(pods.errors[i])}" for i in failed if i in pods.errors)
    # A diverged run would diverge again from the same checkpoint: replacing its workers only repeats it.
    diverged = any(launch.DIVERGED in pods.errors.get(i, "") for i in failed)
    if diverged or restarts > spec.workers.max_restarts:
        if diverged:
            reason, why = "Diverged", f"{launch.DIVERGED}; not restarted (it would diverge again)"
        else:
            limit = spec.workers.max_restarts
            reason, why = "TooManyRestarts", f"{restarts} worker failures, more than workers.maxRestarts {limit}"
        message = f"{why}; last failed: {', '.join(names.worker(i) for i in failed)}{last_error}"
        _remove_pods(apis, namespace, all_pods)
        condition("Failed", True, reason, message)
        emit("Warning", "Failed", message)
        set_status("phase", "Failed")
        set_status("completionTime", stamp)
        set_status("workers", workers | {"restarts": restarts, "desired": 0, "ready": 0, "pending": 0})
        return
    for i in failed:
        emit(
            "Warning",
            "WorkerFailed",
            f"{names.worker(i)} failed; replacing it ({restarts} of {spec.workers.max_restarts} restarts)"
            + (f": {world.last_lines(pods.errors[i])}" if i in pods.errors else ""),
        )
    if pods.succeeded:
        # A worker that ended cleanly has trained to the end and rank 0's `done` report is on its way:
        # replacing the worker would only start a new round.
        return

    if spec.suspend:
        for i in pods.live:
            apis.delete_pod(namespace, names.worker(i))  # SIGTERM: the workers checkpoint and stop
        if pods.live and status.get("phase") != "Suspended":
            emit("Normal", "Suspended", f"suspending: {len(pods.live)} workers checkpoint and stop")
        set_status("phase", "Suspended")
        set_status("workers", workers | {"desired": 0, "ready": 0, "pending": pods.pending, "restarts": restarts})
        return

    blocked: list[tuple[str, str]] = []  # (reason, message): bad input the CRD cannot judge
    if not any(p["metadata"]["labels"].get(ROLE_LABEL) == "rendezvous" for p in all_pods):
        for obj in (
            manifests.job_config(job, uid),
            *manifests.trainer_rbac(job, uid),
            manifests.rendezvous_service(job, uid),
            manifests.workers_service(job, uid),
        ):
            apis.create(obj)
        blocked += _create_pods(apis, [manifests.rendezvous_pod(job, uid)])[1]

    # Capacity: what the scheduler has shown, remembered in the status and retried after a while.
    capacity = world.capacity(pods, settings.unschedulable_grace)
    limited = conditions.get("CapacityLimited")
    if capacity is not None:
        set_status("capacityTime", stamp)
    elif status.get("capacity") is not None:
        since = timestamps.seconds_since(status.get("capacityTime"), now)
        keep = since is not None and since < settings.capacity_retry
        measured = timestamps.parse(status["capacityTime"]) if status.get("capacityTime") else None
        node_added = nodes_changed is not None and measured is not None and nodes_changed > measured
        capacity = status["capacity"] if keep and not node_added else None
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

    create, delete = world.pod_changes(decision.workers, pods)
    deleted = sum(apis.delete_pod(namespace, names.worker(i)) for i in delete)
    claim = spec.checkpoint.claim_name
    if create and claim and not apis.claim_exists(namespace, claim):
        message = (
            f"checkpoint.claimName {claim!r}: no PersistentVolumeClaim of that name in namespace {namespace}; "
            "create it (ReadWriteMany) or correct the name"
        )
        blocked.append(("VolumeClaimNotFound", message))
        create = []
    # New workers join the live ones' rendezvous round; a start from no workers opens a new round (agents
    # that gave up close theirs for good).
    round_ = world.live_round(worker_pods, pods)
    fresh = round_ is None
    if fresh:
        round_ = workers.get("round", 0) + (1 if create else 0)
    created, refused = _create_pods(apis, [manifests.worker_pod(job, uid, i, round_) for i in create])
    if fresh and create and not created:
        round_ = workers.get("round", 0)  # nothing started in the new round: it was not opened
    blocked += refused
    blocked += [
        (reason, f"{names.worker(i)} cannot start: {message or reason}; check spec.image and "
                 "workers.pod.imagePullSecrets")
        for i, (reason, message) in pods.stuck.items()
    ]  # fmt: skip
    if blocked:
        if condition("WorkersBlocked", True, *blocked[0]):
            emit("Warning", blocked[0][0], blocked[0][1])
    elif conditions.get("WorkersBlocked", {}).get("status") == "True":
        condition("WorkersBlocked", False, "Unblocked", "every worker pod was created and could start")
    if created and not status.get("startTime"):
        set_status("startTime", stamp)

    # A decision is news (an Event, a rescale entry, a metric) when it changed pods, not while blocked.
    if decision.changes(len(pods.live)) and (created or deleted):
        result.decision = decision
        emit("Normal", decision.kind.value, f"{len(pods.live)} → {decision.workers} workers: {decision.reason}")
        if pods.live:
            recent = rescales.get("recent", [])
            entry = {"time": stamp, "from": len(pods.live), "to": decision.workers,
                     "samples": progress.samples, "kind": decision.kind.value, "reason": decision.reason}  # fmt: skip
            rescales = {"count": rescales.get("count", 0) + 1, "recent": [*recent, entry][-5:]}
            set_status("rescales", rescales)

    pending = pods.pending + created
    ready = min(len(pods.running), decision.workers)
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


def _remove_pods(apis: Apis, namespace: str, pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        if not pod["metadata"].get("deletionTimestamp"):
            apis.delete_pod(namespace, pod["metadata"]["name"])


def _create_pods(apis: Apis, pods: list[dict[str, Any]]) -> tuple[int, list[tuple[str, str]]]:
    """Create pods in order until the API server refuses one: (how many were created, the refusal as
    [(reason, message)] or [])."""
    created = 0
    for pod in pods:
        try:
            created += apis.create(pod)
        except ApiException as exc:
            if exc.status not in REJECTED:
                raise
            return created, [("PodRejected", f"the API server refused pod {pod['metadata']['name']}: "
                                             f"{api_errors.message(exc)}")]  # fmt: skip
    return created, []

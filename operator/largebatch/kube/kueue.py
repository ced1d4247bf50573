"""A LargeBatchJob under Kueue, purely: the job labelled `kueue.x-k8s.io/queue-name` asks Kueue for its
workers through `Workload`s it owns (as the Spark operator does), and runs only what Kueue admitted.

One Workload, a "slice", holds the job's quota at a time; its pod set `workers` counts the workers the
job's batch wants. When the batch wants more, the job asks with a second slice that names the first as
the one it replaces (`kueue.x-k8s.io/workload-slice-replacement-for`, Kueue's ElasticJobsViaWorkloadSlices):
Kueue's scheduler charges only the difference against the quota and, on admitting it, finishes the old
slice itself. Until then the job trains on what it holds, with accumulation. When it wants fewer, the
held slice's count is lowered once the surplus workers are gone, which gives the quota back. A job that
ends marks its slice Finished (the quota returns at once); a job Kueue evicts (preemption) stops its
workers, which checkpoint, and then gives the reservation back with `Requeued`, as Kueue's own job
integrations do, so that Kueue admits it again later.

`settle` is the whole decision; `reconcile` observes the Workloads and carries out `Writes`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from largebatch.api import LargeBatchJob, QueueStatus
from largebatch.kube.manifests import JOB_LABEL, owner_reference

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = f"{GROUP}/queue-name"
"""The LocalQueue a job waits in (Kueue's label for every job kind)."""
PRIORITY_LABEL = f"{GROUP}/priority-class"
"""A WorkloadPriorityClass for the job's Workloads (Kueue's label); without it, `spec.priority`."""
REPLACES = f"{GROUP}/workload-slice-replacement-for"
PODSET_LABEL = f"{GROUP}/podset"
"""On the workers Kueue admitted (as Kueue's own integrations label pods): their accelerators are the
queue's, not the operator's to share."""
PODSET = "workers"


def queue_name(job: LargeBatchJob) -> str | None:
    return job.metadata.labels.get(QUEUE_LABEL) or None


@dataclass(frozen=True)
class Observed:
    """What a reconcile read of Kueue for a job under it."""

    slices: tuple[Slice, ...] = ()
    flavors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The ResourceFlavors the slices were admitted to, by name: their specs."""
    priority: int | None = None
    """The value of the WorkloadPriorityClass the job's label names."""
    error: tuple[str, str] | None = None
    """(reason, message) when Kueue could not be asked: the job waits and says why."""


def _condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _true(obj: Mapping[str, Any], kind: str) -> bool:
    found = _condition(obj, kind)
    return found is not None and found.get("status") == "True"


@dataclass(frozen=True)
class Slice:
    """One of the job's Workloads, as Kueue left it."""

    name: str
    index: int
    """Its place among the job's slices (from its name): the newest is the highest."""
    count: int
    """Workers it asks for."""
    reserved: bool
    """Quota is reserved for it (QuotaReserved)."""
    admitted: int | None
    """Workers Kueue admitted (Admitted, with the assignment's count), None before."""
    cluster_queue: str | None
    flavors: tuple[str, ...]
    """ResourceFlavors of the workers' assignment: their node labels and tolerations go to the pods."""
    finished: str | None
    """The Finished condition's reason, once it has one."""
    evicted: str | None
    """The Evicted condition's message while Kueue evicts it (preemption, a stopped queue)."""
    evicted_reason: str | None
    waiting: str | None
    """Why Kueue has not reserved quota (QuotaReserved False), in Kueue's words."""
    obj: dict[str, Any] = field(repr=False, compare=False)
    """The object as read: a status write sends it back with its resourceVersion."""

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Slice:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        podset = next((p for p in spec.get("podSets") or [] if p.get("name") == PODSET), {})
        assignment = next(
            (a for a in (status.get("admission") or {}).get("podSetAssignments") or [] if a.get("name") == PODSET), {}
        )
        finished, evicted = _condition(obj, "Finished"), _condition(obj, "Evicted")
        reserved = _condition(obj, "QuotaReserved")
        admitted = _true(obj, "Admitted") and bool(assignment)
        name = obj["metadata"]["name"]
        return cls(
            name=name,
            index=int(name.rsplit("-", 1)[-1]) if name.rsplit("-", 1)[-1].isdigit() else 0,
            count=int(podset.get("count", 0)),
            reserved=_true(obj, "QuotaReserved"),
            admitted=int(assignment.get("count", podset.get("count", 0))) if admitted else None,
            cluster_queue=(status.get("admission") or {}).get("clusterQueue"),
            flavors=tuple(sorted(set((assignment.get("flavors") or {}).values()))),
            finished=finished.get("reason") or "Finished" if finished and finished.get("status") == "True" else None,
            evicted=evicted.get("message") or "" if evicted and evicted.get("status") == "True" else None,
            evicted_reason=evicted.get("reason") if evicted and evicted.get("status") == "True" else None,
            waiting=reserved.get("message") if reserved and reserved.get("status") == "False" else None,
            obj=obj,
        )


def workload_name(job: str, index: int) -> str:
    return f"{job}-{index}"


@dataclass(frozen=True)
class Finish:
    slice: Slice
    reason: str
    message: str


@dataclass(frozen=True)
class Writes:
    """What `settle` asks of the API: each is idempotent or checked by resourceVersion."""

    create: dict[str, Any] | None = None
    """A Workload to create."""
    count: tuple[str, int] | None = None
    """(Workload, workers): a new count for a slice's pod set."""
    delete: tuple[str, ...] = ()
    """Slices no longer wanted that never held quota."""
    finish: tuple[Finish, ...] = ()
    release: Slice | None = None
    """An evicted slice whose workers are gone: its reservation is given back and it is queued again."""


@dataclass(frozen=True)
class Settled:
    workers: int
    """Most workers the job may run: what Kueue admitted (0 while it waits or is evicted)."""
    flavors: tuple[str, ...]
    """The admitted slice's ResourceFlavors."""
    status: QueueStatus
    queued: tuple[bool, str, str]
    """The QueuedByKueue condition: (true, reason, message)."""
    writes: Writes


def settle(
    job: LargeBatchJob,
    uid: str,
    template: dict[str, Any],
    slices: Sequence[Slice],
    wanted: int,
    live: int,
    ended: str | None = None,
    suspended: bool = False,
    priority: int | None = None,
) -> Settled:
    """The job's Workloads one step closer to what it needs: `wanted` workers (what its batch wants, within
    workers.min..max), `live` workers running or starting, `template` the worker pod's spec, `ended` the
    job's final phase (Succeeded, Failed) once it has one, `priority` the value of the
    WorkloadPriorityClass its label names."""
    queue = queue_name(job) or ""
    spec = job.spec
    resource, per_worker = spec.workers.accelerator, spec.workers.devices_per_worker
    name = job.metadata.name
    active = sorted((s for s in slices if not s.finished), key=lambda s: s.index)
    next_index = max((s.index for s in slices), default=-1) + 1
    held = [s for s in active if s.reserved]
    asking = [s for s in active if not s.reserved]
    current = held[-1] if held else None
    stale = tuple(Finish(s, "OutOfSync", "replaced by a newer slice of the job") for s in held[:-1])

    def status(admitted: int = 0, requested: int | None = None, writes: Writes | None = None) -> QueueStatus:
        asks = writes.create["metadata"]["name"] if writes and writes.create else asking[-1].name if asking else None
        return QueueStatus(
            name=queue,
            cluster_queue=current.cluster_queue if current else None,
            workload=asks or (current.name if current else None),
            admitted=admitted,
            requested=requested,
        )

    def devices(workers: int, more: str = "") -> str:
        return f"{workers * per_worker} {more}{resource}" if resource != "none" else f"{workers} {more}workers"

    if ended or suspended:
        reason = ended or "Suspended"
        message = f"the job {ended.lower()}" if ended else "the job is suspended (spec.suspend)"
        finish = tuple(Finish(s, "Succeeded" if ended == "Succeeded" else "Failed", message) for s in held)
        return Settled(
            0, (), QueueStatus(name=queue, admitted=0), (False, reason, f"{message}: its quota went back to {queue}"),
            Writes(finish=finish if ended else (), delete=tuple(s.name for s in (asking if ended else active))),
        )  # fmt: skip

    if current is not None and current.evicted is not None:
        # Kueue keeps the quota until the workers are gone: they checkpoint on SIGTERM first.
        why = f"evicted by Kueue ({current.evicted_reason}): {current.evicted}"
        if live:
            dropped = tuple(Finish(s, "OutOfSync", "the slice it replaces was evicted") for s in asking)
            message = f"{why}; {live} workers checkpoint and stop"
            return Settled(0, (), status(), (True, "Evicted", message), Writes(finish=stale + dropped))
        message = f"{why}; waiting in {queue} for {devices(current.count)}"
        return Settled(0, (), status(), (True, "Evicted", message), Writes(finish=stale, release=current))

    def ask(count: int, replaces: Slice | None) -> Writes:
        if asking and asking[-1].count == count:
            return Writes(finish=stale)
        if asking:
            return Writes(finish=stale, count=(asking[-1].name, count))
        workload = _workload(job, uid, workload_name(name, next_index), queue, template, count, replaces, priority)
        return Writes(finish=stale, create=workload)

    waiting = next((s.waiting for s in reversed(asking) if s.waiting), None)
    kueue_says = f": {waiting}" if waiting else ""  # why Kueue has not admitted the slice, in its words
    if current is None or current.admitted is None:
        message = f"waiting in {queue} for {devices(wanted)}{kueue_says}"
        writes = ask(wanted, None)
        return Settled(0, (), status(0, wanted, writes), (True, "QueuedByKueue", message), writes)

    admitted = current.admitted
    where = f"admitted by Kueue in {queue} (ClusterQueue {current.cluster_queue})"
    if wanted > admitted:
        message = f"runs the {admitted} workers {where}; waiting for {devices(wanted - admitted, 'more ')}{kueue_says}"
        writes = ask(wanted, current)
        return Settled(admitted, current.flavors, status(admitted, wanted, writes), (True, "QueuedByKueue", message),
                       writes)  # fmt: skip
    writes = Writes(finish=stale, delete=tuple(s.name for s in asking))
    if wanted < admitted and live <= wanted:
        writes = Writes(finish=stale, delete=writes.delete, count=(current.name, wanted))  # give the rest back
        admitted = wanted
    return Settled(
        admitted, current.flavors, status(admitted, wanted), (False, "Admitted", f"{admitted} workers {where}"), writes
    )


def _workload(
    job: LargeBatchJob,
    uid: str,
    name: str,
    queue: str,
    template: dict[str, Any],
    count: int,
    replaces: Slice | None,
    priority: int | None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": job.metadata.namespace,
        "labels": {JOB_LABEL: job.metadata.name},
        "ownerReferences": [owner_reference(job, uid)],
    }
    if replaces is not None:
        metadata["annotations"] = {REPLACES: f"{job.metadata.namespace}/{replaces.name}"}
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [{"name": PODSET, "count": count, "template": template}],
    }
    priority_class = job.metadata.labels.get(PRIORITY_LABEL)
    if priority_class:  # Kueue fills in no priority for a Workload it did not build: the class's value goes along
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority_class}
    spec["priority"] = priority if priority_class and priority is not None else job.spec.priority
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload", "metadata": metadata, "spec": spec}


def template(pod: dict[str, Any]) -> dict[str, Any]:
    """A worker pod as a Workload's pod template: what Kueue counts (the containers' resources) and what
    picks a flavor (node selector, affinity, tolerations), without what differs between workers."""
    spec = pod["spec"]
    kept = {key: spec[key] for key in ("nodeSelector", "affinity", "tolerations", "priorityClassName") if key in spec}
    containers = [
        {key: c[key] for key in ("name", "image", "resources") if key in c} for c in spec.get("containers") or []
    ]
    return {"spec": {"containers": containers, **kept}}


def place(pod: dict[str, Any], flavors: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A worker pod on the admitted flavors' nodes: their node labels join its node selector and their
    tolerations its own, as Kueue's integrations do. A flavor that asks for a node label the pod already
    selects with another value is refused: the job could never be placed there."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    pod["metadata"].setdefault("labels", {})[PODSET_LABEL] = PODSET
    for flavor_name, flavor in sorted(flavors.items()):
        for key, value in (flavor.get("nodeLabels") or {}).items():
            selected = spec.setdefault("nodeSelector", {})
            if selected.get(key, value) != value:
                raise ValueError(
                    f"ResourceFlavor {flavor_name} places pods on {key}={value}, but workers.pod.nodeSelector "
                    f"asks for {key}={selected[key]}; drop it from the job or from the flavor"
                )
            selected[key] = value
        for toleration in flavor.get("tolerations") or []:
            if toleration not in spec.setdefault("tolerations", []):
                spec["tolerations"].append(toleration)
    return pod


def finished_status(slice_: Slice, reason: str, message: str, stamp: str) -> dict[str, Any]:
    """The slice's object with Finished True: written back whole, with its resourceVersion."""
    return _with_conditions(slice_, stamp, {"type": "Finished", "status": "True", "reason": reason, "message": message})


def released_status(slice_: Slice, stamp: str) -> dict[str, Any]:
    """An evicted slice given back to its queue, as Kueue's job integrations do once the job stopped: no
    admission, QuotaReserved and Admitted False, and Requeued (True after a preemption, so that Kueue
    tries it again at once; other evictions wait out Kueue's own backoff)."""
    message = slice_.evicted or "evicted"
    requeue = slice_.evicted_reason in ("Preempted", "NodeFailures")
    obj = _with_conditions(
        slice_,
        stamp,
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message},
        {"type": "Admitted", "status": "False", "reason": "NoReservation",
         "message": "The workload has no reservation"},
        {"type": "Requeued", "status": "True" if requeue else "False", "reason": slice_.evicted_reason or "Evicted",
         "message": message},
    )  # fmt: skip
    obj["status"]["admission"] = None
    return obj


def _with_conditions(slice_: Slice, stamp: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(slice_.obj)
    status = obj.setdefault("status", {})
    kept = {c["type"]: c for c in status.get("conditions") or []}
    for condition in conditions:
        old = kept.get(condition["type"])
        moved = old is None or old.get("status") != condition["status"]
        kept[condition["type"]] = {
            **condition,
            "lastTransitionTime": stamp if moved else old["lastTransitionTime"],
            "observedGeneration": obj["metadata"].get("generation", 1),
        }
    status["conditions"] = list(kept.values())
    return obj

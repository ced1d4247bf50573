"""The cluster-wide step above the per-job reconcile, purely: from every LargeBatchJob the operator
watches, their worker pods, the nodes and the other pods that hold accelerators, each job's share
(`allocate.allocate`) and how far it may grow now.

The accelerators the jobs share are, per resource name (`workers.accelerator`), the allocatable ones of
the nodes that take pods, ready or not (those with the labels of LARGEBATCH_SHARED_NODES, when set),
less what pods other than the jobs' workers hold there (bound and not ended). A job may grow into its
share only as far as accelerators are free now: a job that gives GPUs up for another deletes its
workers first (they checkpoint on SIGTERM) and the other grows when the pods are gone, so a move is one
ordered step, never two jobs' pods waiting on each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from largebatch import allocate, report, schedule, timestamps
from largebatch.api import LargeBatchJob, LargeBatchJobStatus, ProgressStatus
from largebatch.kube import kueue, world
from largebatch.kube.manifests import JOB_LABEL, ROLE_LABEL

ENDED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Share:
    """One job's part of the allocation."""

    workers: int
    """Most workers the allocator gives the job."""
    demand: int
    """Workers the job's batch can use now."""
    grow_to: int
    """Most workers the job may run now: its share, as far as accelerators are free at this moment."""
    reason: str | None
    """Why the share differs from what the job runs (None when it does not)."""


def demand(job: dict[str, Any], live: int, restart_seconds: float) -> allocate.Demand | None:
    """The allocator's view of a job (a dict as the API returns it) running `live` workers; None for a
    job that takes no part: ended, suspended, trained to the end, or without an accelerator."""
    model, status = LargeBatchJob.from_object(job), LargeBatchJobStatus.of(job)
    spec = model.spec
    progress = status.progress or ProgressStatus()
    samples = progress.samples or 0
    if status.phase in ENDED or spec.suspend or spec.workers.accelerator == "none":
        return None
    if kueue.queue_name(model):
        return None  # Kueue's quota decides its workers
    if samples >= spec.schedule.total_samples:
        return None
    created = job["metadata"].get("creationTimestamp")
    return allocate.Demand(
        name=key(job),
        batch=schedule.plan(spec, report.progress_from_status(progress)).policy_batch,
        per_worker=spec.workers.devices_per_worker * spec.batch.micro_batch,
        minimum=spec.workers.min,
        maximum=spec.workers.max,
        remaining_samples=spec.schedule.total_samples - samples,
        current=live,
        devices_per_worker=spec.workers.devices_per_worker,
        priority=spec.priority,
        arrival=timestamps.parse(created).timestamp() if created else 0.0,
        speed=allocate.Speed.fit(
            allocate.Measured(t.workers, t.batch, t.samples_per_second) for t in status.throughput
        ),
        restart_seconds=restart_seconds,
    )


def key(job: dict[str, Any]) -> str:
    """`namespace/name`: how shares, reasons and Events name a job."""
    return f"{job['metadata'].get('namespace')}/{job['metadata']['name']}"


def _resources(spec: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The `resources` of each of a pod spec's `containers` or `initContainers`."""
    return [c.get("resources") or {} for c in spec.get(kind) or []]


def asks_for_accelerators(spec: dict[str, Any]) -> bool:
    """Whether a pod spec asks for any accelerator (extended resource), in any container."""
    return any(
        world.is_accelerator(name)
        for resources in (*_resources(spec, "containers"), *_resources(spec, "initContainers"))
        for part in ("requests", "limits")
        for name in resources.get(part) or {}
    )


def held(pod: dict[str, Any], resource: str) -> int:
    """How many of `resource` a pod holds: bound to a node and not ended (its containers' requests, or
    their limits, which extended resources may give alone; an init container's while it is larger)."""
    if not held_any(pod):
        return 0
    spec = pod["spec"]

    def of(kind: str) -> list[int]:
        out = []
        for resources in _resources(spec, kind):
            value = (resources.get("requests") or {}).get(resource, (resources.get("limits") or {}).get(resource))
            out.append(int(value) if value is not None else 0)
        return out

    return max(sum(of("containers")), max(of("initContainers"), default=0))


def held_any(pod: dict[str, Any]) -> bool:
    """Whether a pod is bound and not ended: it holds whatever it asks."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in ENDED


def is_worker(pod: dict[str, Any]) -> bool:
    """A worker of a job that takes part in the sharing: one Kueue admitted holds its queue's quota,
    as any other pod does."""
    labels = pod.get("metadata", {}).get("labels") or {}
    return JOB_LABEL in labels and labels.get(ROLE_LABEL) == "worker" and kueue.PODSET_LABEL not in labels


@dataclass(frozen=True)
class Pool:
    shared: int
    """Accelerators the jobs share: the offered ones less what other pods hold."""
    free: int
    """Accelerators no pod holds now."""


def pool(offered: int, pods: Iterable[dict[str, Any]], resource: str, nodes: frozenset[str] | None = None) -> Pool:
    """The jobs' pool of `resource`, from what the nodes offer and what the pods bound to those `nodes`
    (None: any) hold."""
    others = workers = 0
    for pod in pods:
        if nodes is not None and (pod.get("spec") or {}).get("nodeName") not in nodes:
            continue
        n = held(pod, resource)
        if is_worker(pod):
            workers += n
        else:
            others += n
    return Pool(shared=max(0, offered - others), free=max(0, offered - others - workers))


def shares(
    jobs: Iterable[dict[str, Any]],
    job_pods: Mapping[tuple[str, str], Iterable[dict[str, Any]]],
    offered: world.Offered,
    pods: list[dict[str, Any]],
    restart_seconds: float,
) -> dict[str, Share]:
    """Each taking-part job's share, by `namespace/name`: one allocation per accelerator resource that
    the nodes offer. `job_pods` are the jobs' pods by (namespace, name); `pods` every pod that may hold
    an accelerator. None while a pod is bound to a node the watch has not shown yet (an operator that
    has just started): shares from half a listing would stop jobs that hold GPUs of nodes not yet seen."""
    if any((p.get("spec") or {}).get("nodeName") not in offered.known for p in pods if held_any(p)):
        return {}
    now = timestamps.now()
    by_resource: dict[str, list[tuple[allocate.Demand, int]]] = {}
    for job in jobs:
        meta = job["metadata"]
        mine = [p for p in job_pods.get((meta.get("namespace"), meta["name"]), []) if is_worker(p)]
        placed = world.classify(mine, now)
        try:  # the workers it runs: those placed (a pod the scheduler has not bound holds no GPU)
            d = demand(job, len(placed.running) + len(placed.starting), restart_seconds)
        except ValueError:  # a job the models refuse (pydantic's errors are ValueErrors): its own reconcile says so
            continue
        if d is not None:
            resource = job["spec"].get("workers", {}).get("accelerator", "nvidia.com/gpu")
            by_resource.setdefault(resource, []).append((d, d.devices_per_worker))
    out = {}
    for resource, demands in by_resource.items():
        if not offered.accelerators.get(resource):
            continue  # the nodes offer none: nothing to share (the scheduler's refusals cap the jobs)
        available = pool(offered.accelerators[resource], pods, resource, offered.nodes)
        result = allocate.allocate((d for d, _ in demands), available.shared)
        for d, devices in demands:
            given = result.workers[d.name]
            out[d.name] = Share(
                workers=given,
                demand=d.wanted,
                grow_to=min(given, d.current + available.free // devices),
                reason=result.reasons.get(d.name),
            )
    return out

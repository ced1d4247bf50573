"""Reading the world, purely: a job's worker pods (as the API returns them) sorted by what they are
doing, the capacity the cluster has shown, and the pods to create and delete for a decision.

Capacity is learnt from the real scheduler: a worker pod whose `PodScheduled` condition is False
with reason `Unschedulable` for longer than a grace period means that the cluster cannot place more
workers than it already has placed; the controller then caps the job at that number.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from largebatch import timestamps
from largebatch.kube.manifests import INDEX_LABEL, ROUND_LABEL

CANNOT_START = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError",
})  # fmt: skip
"""The kubelet's waiting reasons that do not go away by waiting: the spec or the cluster needs a fix."""


@dataclass(frozen=True)
class WorkerPods:
    """A job's worker pods by index, sorted by what they are doing."""

    running: tuple[int, ...] = ()
    """Bound and running."""
    starting: tuple[int, ...] = ()
    """Bound to a node, not running yet."""
    unschedulable: dict[int, float] = field(default_factory=dict)
    """Not bound, refused by the scheduler: index → seconds since the scheduler said so."""
    waiting: tuple[int, ...] = ()
    """Not bound, not refused yet (just created)."""
    failed: tuple[int, ...] = ()
    """Ended with an error, or lost with its node."""
    succeeded: tuple[int, ...] = ()
    """Ended cleanly (the job is done)."""
    deleting: tuple[int, ...] = ()
    """Being deleted (a scale-down or a suspend in progress)."""
    errors: dict[int, str] = field(default_factory=dict)
    """Index → the last lines a failed worker left (its termination message, which the kubelet fills
    from the log tail: the pods have `terminationMessagePolicy: FallbackToLogsOnError`)."""
    stuck: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Index → (reason, message) of a bound worker whose container cannot start (`ErrImagePull`,
    `CreateContainerConfigError`, ...), as the kubelet reports it."""

    @property
    def live(self) -> tuple[int, ...]:
        """Pods that count as the job's workers now: all but the ended and the deleted."""
        return tuple(sorted((*self.running, *self.starting, *self.unschedulable, *self.waiting)))

    @property
    def pending(self) -> int:
        return len(self.starting) + len(self.unschedulable) + len(self.waiting)


def classify(pods: list[dict[str, Any]], now: datetime.datetime) -> WorkerPods:
    """Sort worker pods (dicts as the API returns them) by what they are doing."""
    groups: dict[str, list[int]] = {
        k: [] for k in ("running", "starting", "waiting", "failed", "succeeded", "deleting")
    }
    unschedulable: dict[int, float] = {}
    errors: dict[int, str] = {}
    stuck: dict[int, tuple[str, str]] = {}
    for pod in pods:
        meta, status = pod.get("metadata", {}), pod.get("status") or {}
        index = int(meta.get("labels", {}).get(INDEX_LABEL, -1))
        if index < 0:
            continue
        phase = status.get("phase", "Pending")
        if meta.get("deletionTimestamp"):
            groups["deleting"].append(index)
        elif phase == "Running":
            groups["running"].append(index)
        elif phase == "Failed" or status.get("reason") == "NodeLost":
            groups["failed"].append(index)
            for container in status.get("containerStatuses") or []:
                message = ((container.get("state") or {}).get("terminated") or {}).get("message")
                if message:
                    errors[index] = message
        elif phase == "Succeeded":
            groups["succeeded"].append(index)
        elif pod.get("spec", {}).get("nodeName"):
            groups["starting"].append(index)
            for container in status.get("containerStatuses") or []:
                waiting = (container.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in CANNOT_START:
                    stuck[index] = (waiting["reason"], waiting.get("message", ""))
        else:
            refused = _unschedulable_since(status)
            if refused is None:
                groups["waiting"].append(index)
            else:
                unschedulable[index] = max(0.0, (now - refused).total_seconds())
    return WorkerPods(
        running=tuple(sorted(groups["running"])),
        starting=tuple(sorted(groups["starting"])),
        unschedulable=dict(sorted(unschedulable.items())),
        waiting=tuple(sorted(groups["waiting"])),
        failed=tuple(sorted(groups["failed"])),
        succeeded=tuple(sorted(groups["succeeded"])),
        deleting=tuple(sorted(groups["deleting"])),
        errors=errors,
        stuck=stuck,
    )


def _unschedulable_since(status: dict[str, Any]) -> datetime.datetime | None:
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            stamp = condition.get("lastTransitionTime")
            return timestamps.parse(stamp) if stamp else datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    return None


def live_round(pods: list[dict[str, Any]], sorted_pods: WorkerPods) -> int | None:
    """The rendezvous round the live workers are in (the latest, should they differ), None without any."""
    live = set(sorted_pods.live)
    rounds = [
        int(labels[ROUND_LABEL])
        for labels in (pod.get("metadata", {}).get("labels", {}) for pod in pods)
        if int(labels.get(INDEX_LABEL, -1)) in live and labels.get(ROUND_LABEL, "").isdigit()
    ]
    return max(rounds, default=None)


def capacity(pods: WorkerPods, grace_seconds: float) -> int | None:
    """Most workers the cluster can place, when the scheduler has shown it: the placed ones, once some
    worker has stayed unschedulable longer than `grace_seconds` (the scheduler retries in between, and
    a cluster autoscaler may be adding a node). None while nothing says there is a limit."""
    if any(seconds >= grace_seconds for seconds in pods.unschedulable.values()):
        return len(pods.running) + len(pods.starting)
    return None


def pod_changes(desired: int, pods: WorkerPods) -> tuple[list[int], list[int]]:
    """(indices to create, indices to delete) to run `desired` live workers named `<job>-worker-<i>`.
    A shrink removes the workers that do least first: unplaced (refused by the scheduler, then not yet
    seen by it), then starting, then running, the highest index first among equals, so that a running
    worker is never given up for one the cluster cannot place (a preempted worker's replacement). A grow
    takes free names below the larger of `desired` and the highest live index + 1; ended pods are
    deleted so that their names can be reused (a replacement takes the same index)."""
    live = set(pods.live)
    busy = live | set(pods.deleting) | set(pods.failed) | set(pods.succeeded)  # names still taken
    doing = {i: 0 for i in pods.unschedulable} | {i: 1 for i in pods.waiting} | {i: 2 for i in pods.starting}
    least_useful_first = sorted(live, key=lambda i: (doing.get(i, 3), -i))
    delete = least_useful_first[: max(0, len(live) - desired)]
    names = max(desired, max(live, default=-1) + 1)
    create = [i for i in range(names) if i not in busy][: max(0, desired - len(live))]
    delete += [i for i in (*pods.failed, *pods.succeeded) if i not in pods.deleting]
    return create, delete


def last_lines(text: str, lines: int = 8, limit: int = 1500) -> str:
    """The end of a worker's error output, short enough for a condition message and an Event; rules
    (torchrun frames its failure summary in lines of `=` and `-`) say nothing and are left out."""
    said = [line for line in text.strip().splitlines() if line.strip(" =-")]
    tail = "\n".join(said[-lines:])
    return tail if len(tail) <= limit else "…" + tail[-limit:]


def node_capacity(node: dict[str, Any]) -> tuple:
    """What about a node decides whether more workers fit: what it offers and whether it takes pods.
    Heartbeats change none of it, so a change here is worth retrying a capacity-limited job."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    taints = sorted((t.get("key", ""), t.get("value", ""), t.get("effect", "")) for t in spec.get("taints") or [])
    return (tuple(sorted((status.get("allocatable") or {}).items())), bool(spec.get("unschedulable")), ready,
            tuple(taints))  # fmt: skip


@dataclass(frozen=True)
class Offered:
    """The accelerators the nodes offer the jobs' shares."""

    accelerators: dict[str, int]
    """Extended resources (the names with a `/`) allocatable on the selected nodes that take pods (not
    cordoned; readiness is not asked: see `NodeOffers.offered`), by resource name."""
    nodes: frozenset[str]
    """The selected nodes: what pods hold counts against the offer only on these."""
    known: frozenset[str]
    """Every node the watch has shown: a pod bound to another one means the listing is not complete."""


class NodeOffers:
    """What the nodes offer, from the node watch: when a node last offered more (added, or changed in
    what it offers, `node_capacity`: a capacity-limited job measured before then tries again at once),
    and the accelerators they offer the jobs' shares (`offered`)."""

    def __init__(self) -> None:
        self._offers: dict[str, tuple] = {}
        self._labels: dict[str, dict[str, str]] = {}
        self.changed_at: datetime.datetime | None = None

    def seen(self, event_type: str | None, node: dict[str, Any], when: datetime.datetime) -> None:
        """A watch event: type ADDED, MODIFIED, DELETED, or None for the nodes the first listing found
        (there before the operator, so no news)."""
        meta = node.get("metadata", {})
        name = meta.get("name", "")
        if event_type == "DELETED":
            self._offers.pop(name, None)
            self._labels.pop(name, None)
            return
        self._labels[name] = dict(meta.get("labels") or {})
        offer = node_capacity(node)
        if self._offers.get(name) != offer:
            self._offers[name] = offer
            if event_type is not None:
                self.changed_at = when

    def offered(self, selector: dict[str, str] | None = None) -> Offered:
        """The accelerators of the nodes whose labels include `selector` (every node without one)."""
        offers, labels = dict(self._offers), dict(self._labels)  # copies: the watch adds nodes meanwhile
        chosen = {n for n in offers if all(labels.get(n, {}).get(k) == v for k, v in (selector or {}).items())}
        out: dict[str, int] = {}
        for name in chosen:
            allocatable, unschedulable, _, _ = offers[name]
            # A node that stops reporting (NotReady, as every node is for a while after a control-plane
            # outage) still has the GPUs its pods hold: left out, the pool would shrink under running jobs.
            if not unschedulable:
                for resource, value in allocatable:
                    if is_accelerator(resource) and str(value).isdigit():
                        out[resource] = out.get(resource, 0) + int(value)
        return Offered(out, frozenset(chosen), frozenset(offers))


def is_accelerator(resource: str) -> bool:
    """An extended resource (`nvidia.com/gpu`, `google.com/tpu`, ...): the names with a `/`, where cpu,
    memory and pods have none."""
    return "/" in resource


def parse_selector(text: str) -> dict[str, str]:
    """`pool=gpu,zone=a` → {"pool": "gpu", "zone": "a"}: node labels that must all match."""
    selector = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(f"node selector {text!r}: {part!r} is not label=value")
        selector[key.strip()] = value.strip()
    return selector

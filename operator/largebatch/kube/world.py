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
from largebatch.kube.manifests import INDEX_LABEL


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
        elif phase == "Succeeded":
            groups["succeeded"].append(index)
        elif pod.get("spec", {}).get("nodeName"):
            groups["starting"].append(index)
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


def capacity(pods: WorkerPods, grace_seconds: float) -> int | None:
    """Most workers the cluster can place, when the scheduler has shown it: the placed ones, once some
    worker has stayed unschedulable longer than `grace_seconds` (the scheduler retries in between, and
    a cluster autoscaler may be adding a node). None while nothing says there is a limit."""
    if any(seconds >= grace_seconds for seconds in pods.unschedulable.values()):
        return len(pods.running) + len(pods.starting)
    return None


def pod_changes(desired: int, pods: WorkerPods) -> tuple[list[int], list[int]]:
    """(indices to create, indices to delete) to run `desired` workers named `<job>-worker-<i>` with
    i < desired. The highest indices go first; ended pods are deleted so that their names can be
    reused (a replacement takes the same index)."""
    live = set(pods.live)
    busy = live | set(pods.deleting) | set(pods.failed) | set(pods.succeeded)  # names still taken
    create = [i for i in range(desired) if i not in busy]
    delete = sorted((i for i in live if i >= desired), reverse=True)
    delete += [i for i in (*pods.failed, *pods.succeeded) if i not in pods.deleting]
    return create, delete

"""The reconcile's two pure steps, around `reconcile.apply` (the only one that calls the API):

- `plan(seen, settings) -> Actions`: from the job, its status and its pods, what to create and delete,
  and every status field, condition and Event that does not depend on how those calls go;
- `account(actions, outcome) -> Accounted`: what does depend on it. A failure counts when its pod's
  deletion takes (a watch can show a pod a moment after it is gone: its 404 must not count twice), a
  new rendezvous round is opened only by a worker actually created, a refused pod blocks the job,
  and the phase and the pending count follow the pods created.

A reconcile that finds failed workers only deletes them and counts them: whether the job has failed
depends on how many deletions took, so the job's next reconcile, a second later, replaces them or
removes the rest.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field
from typing import Any, Literal

from largebatch import allocate, caveats, controller, launch, report, schedule, timestamps
from largebatch.api import (
    AllocationStatus,
    Condition,
    LargeBatchJob,
    LargeBatchJobSpec,
    LargeBatchJobStatus,
    ProgressStatus,
    QueueStatus,
    RescalesStatus,
    Throughput,
    WorkersStatus,
)
from largebatch.kube import kueue, manifests, world
from largebatch.kube.manifests import ROLE_LABEL, Names
from largebatch.kube.sharing import Share

Blocked = tuple[str, str]
"""(reason, message): why workers cannot start, which the CRD cannot judge."""


@dataclass(frozen=True)
class Settings:
    unschedulable_grace: float = 20.0
    """Seconds a worker may stay unschedulable before the cluster's capacity counts as reached."""
    capacity_retry: float = 120.0
    """Seconds after which a capacity-limited job tries to grow again."""
    restart_seconds: float = 15.0
    """Assumed cost of a rescale."""


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Seen:
    """What one reconcile observed."""

    job: LargeBatchJob
    uid: str
    generation: int | None
    status: LargeBatchJobStatus
    pods: list[dict[str, Any]]
    """All the job's pods (workers and the rendezvous), as the API returns them."""
    now: datetime.datetime
    nodes_changed: datetime.datetime | None = None
    """When a node last offered more: a capacity-limited job measured before then tries to grow at once."""
    claim_found: bool | None = None
    """Whether `checkpoint.claimName` exists; None until a plan that creates workers asks."""
    share: Share | None = None
    """The job's share of the accelerators the jobs share (`kube.sharing`); None when it takes no part."""
    queue: kueue.Observed | None = None
    """What Kueue says of the job's Workloads, for a job under Kueue (`kueue.QUEUE_LABEL`)."""


@dataclass(frozen=True)
class Scaling:
    """What `account` needs of a plan that reached the controller's decision."""

    decision: controller.Decision
    live: int
    running: int
    pending: int
    step: int
    samples: int
    round: int
    """The rendezvous round of the workers to create."""
    fresh: bool
    """No live worker: creating one opens `round`."""
    scaled_down: tuple[str, ...]
    claim_blocked: tuple[Blocked, ...]
    stuck: tuple[Blocked, ...]


@dataclass(frozen=True)
class Actions:
    status: LargeBatchJobStatus
    """The status as far as it does not depend on the outcome of the calls."""
    events: tuple[Event, ...] = ()
    delete: tuple[str, ...] = ()
    """Pods to delete, in order."""
    failures: dict[str, str | None] = field(default_factory=dict)
    """Failed workers among `delete` → the output they left (None: nothing); each counts as a restart
    if its deletion takes."""
    objects: tuple[dict[str, Any], ...] = ()
    """Objects other than pods to create (one that exists counts as created)."""
    rendezvous: tuple[dict[str, Any], ...] = ()
    workers: tuple[dict[str, Any], ...] = ()
    """Pods to create in order, each list until the API server refuses one."""
    check_claim: str | None = None
    """The claim to look up before workers can be created: plan again with `Seen.claim_found`."""
    scaling: Scaling | None = None
    queue: kueue.Writes | None = None
    """The Workload writes of a job under Kueue."""
    namespace: str = ""
    stamp: str = ""
    max_restarts: int = 0


@dataclass(frozen=True)
class Outcome:
    """What the API server did with the actions."""

    deleted: frozenset[str] = frozenset()
    """Pods whose deletion took (a 404 is not one)."""
    created_workers: int = 0
    refused_rendezvous: tuple[Blocked, ...] = ()
    refused_workers: tuple[Blocked, ...] = ()


@dataclass(frozen=True)
class Accounted:
    status: LargeBatchJobStatus
    events: tuple[Event, ...]
    news: controller.Decision | None
    """The decision, when it changed pods (an Event, a rescale entry, a metric)."""


class _Status:
    """The status being planned: fields set, conditions set (whether each changed, so that an Event goes
    out once, not every reconcile), Events."""

    def __init__(self, status: LargeBatchJobStatus, stamp: str, generation: int | None, namespace: str = ""):
        self.status, self.stamp, self.generation, self.namespace = status, stamp, generation, namespace
        self.conditions = {c.type: c for c in status.conditions}
        self.events: list[Event] = []

    def set(self, **fields: Any) -> None:
        self.status = self.status.model_copy(update=fields)

    def workers(self, **fields: Any) -> None:
        self.set(workers=(self.status.workers or WorkersStatus()).model_copy(update=fields))

    def condition(self, kind: str, true: bool, reason: str, message: str) -> bool:
        old = self.conditions.get(kind)
        value = "True" if true else "False"
        if old and (old.status, old.reason, old.message) == (value, reason, message):
            return False
        moved = not old or old.status != value
        self.conditions[kind] = Condition(
            type=kind,
            status=value,
            reason=reason,
            message=message,
            last_transition_time=self.stamp if moved else old.last_transition_time,
            observed_generation=self.generation,
        )
        self.set(conditions=list(self.conditions.values()))
        return True

    def is_true(self, kind: str) -> bool:
        return kind in self.conditions and self.conditions[kind].status == "True"

    def emit(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def actions(self, **fields: Any) -> Actions:
        return Actions(self.status, tuple(self.events), namespace=self.namespace, stamp=self.stamp, **fields)


def plan(seen: Seen, settings: Settings) -> Actions:
    """One step closer to what the job needs."""
    job, spec = seen.job, seen.job.spec
    out = _Status(seen.status, timestamps.stamp(seen.now), seen.generation, job.metadata.namespace or "")
    out.set(observed_generation=seen.generation)
    _allocation(seen, out)
    names = Names(job.metadata.name)
    pods = world.classify(workers_of(seen.pods), seen.now)
    progress = seen.status.progress or ProgressStatus()
    trained = progress.done and (progress.samples or 0) >= spec.schedule.total_samples
    ended = seen.status.phase if seen.status.phase in ("Succeeded", "Failed") else "Succeeded" if trained else None
    queued = _queue(seen, out, pods, ended)
    writes = queued.writes if queued else None
    if seen.status.phase in ("Succeeded", "Failed"):
        return out.actions(delete=_not_deleting(seen.pods), queue=writes)
    if trained:
        out.set(phase="Succeeded", completion_time=out.stamp)
        out.workers(desired=0, ready=0, pending=0)
        message = f"trained {progress.samples:,} samples in {progress.step or 0:,} steps"
        out.condition("Complete", True, "Complete", message)
        out.emit("Normal", "Complete", message)
        return out.actions(delete=_not_deleting(seen.pods), queue=writes)
    _warn(spec, out)

    if pods.failed:
        # A failed or lost worker is deleted, to be replaced under its own name until maxRestarts runs out.
        failures = {names.worker(i): pods.errors.get(i) for i in pods.failed}
        return out.actions(delete=tuple(failures), failures=failures, max_restarts=spec.workers.max_restarts)
    if pods.succeeded:
        # A worker that ended cleanly has trained to the end and rank 0's `done` report is on its way:
        # replacing the worker would only start a new round.
        return out.actions()
    if spec.suspend:
        if pods.live and seen.status.phase != "Suspended":
            out.emit("Normal", "Suspended", f"suspending: {len(pods.live)} workers checkpoint and stop")
        out.set(phase="Suspended")
        out.workers(desired=0, ready=0, pending=pods.pending, restarts=_restarts(seen.status))
        # SIGTERM: they checkpoint and stop
        return out.actions(delete=tuple(names.worker(i) for i in pods.live), queue=writes)
    if queued is not None and not queued.workers:
        if pods.live and seen.status.phase != "Queued":
            out.emit("Normal", "Queued", f"{len(pods.live)} workers checkpoint and stop: Kueue admits none now")
        out.set(phase="Queued")
        out.workers(desired=0, ready=0, pending=pods.pending, restarts=_restarts(seen.status))
        return out.actions(delete=tuple(names.worker(i) for i in pods.live), queue=writes)
    return _scale(seen, settings, out, pods, queued)


def _queue(seen: Seen, out: _Status, pods: world.WorkerPods, ended: str | None) -> kueue.Settled | None:
    """For a job under Kueue: its Workloads settled (`kueue.settle`), its queue status and condition."""
    job, observed = seen.job, seen.queue
    if observed is None:
        out.set(queue=None)
        return None
    if observed.error:
        reason, message = observed.error
        if out.condition("QueuedByKueue", True, reason, message):
            out.emit("Warning", reason, message)
        out.set(queue=QueueStatus(name=kueue.queue_name(job) or ""))
        return kueue.Settled(0, (), out.status.queue, (True, reason, message), kueue.Writes())
    spec, wanted = job.spec, 0
    if not ended:  # a job trained to the end has no next batch
        progress = report.progress_from_status(seen.status.progress or ProgressStatus())
        per_worker = spec.workers.devices_per_worker * spec.batch.micro_batch
        batch = schedule.plan(spec, progress).policy_batch
        wanted = allocate.wanted(batch, per_worker, spec.workers.min, spec.workers.max)
    settled = kueue.settle(
        job,
        seen.uid,
        kueue.template(manifests.worker_pod(job, seen.uid, 0, 0)),
        observed.slices,
        wanted,
        len(pods.live),
        ended=ended,
        suspended=spec.suspend,
        priority=observed.priority,
    )
    out.set(queue=settled.status)
    true, reason, message = settled.queued
    if out.condition("QueuedByKueue", true, reason, message):
        out.emit("Warning" if reason == "Evicted" else "Normal", reason, message)
    return settled


def _warn(spec: LargeBatchJobSpec, out: _Status) -> None:
    """Conditions (and an Event the first time) for what works but is not what the user wants."""
    if not spec.checkpoint.claim_name and "NoDurableCheckpoint" not in out.conditions:
        message = (
            f"checkpoint.claimName is not set: checkpoints at {spec.checkpoint.path} live in each pod and an "
            "elastic restart loses the progress; set a ReadWriteMany PersistentVolumeClaim"
        )
        out.condition("NoDurableCheckpoint", True, "NoDurableCheckpoint", message)
        out.emit("Warning", "NoDurableCheckpoint", message)
    for caveat in caveats.caveats(spec):
        if out.condition(caveat.reason, True, caveat.reason, caveat.message):
            out.emit("Warning", caveat.reason, caveat.message)


def _scale(
    seen: Seen, settings: Settings, out: _Status, pods: world.WorkerPods, queued: kueue.Settled | None
) -> Actions:
    """The job's objects, and the worker pods for the controller's decision (within what Kueue admitted,
    on its flavors' nodes, for a job under Kueue)."""
    job, uid, names = seen.job, seen.uid, Names(seen.job.metadata.name)
    objects, rendezvous = (), ()
    if not any(p["metadata"]["labels"].get(ROLE_LABEL) == "rendezvous" for p in seen.pods):
        config = (manifests.job_config(job, uid), *manifests.trainer_rbac(job, uid))
        objects = (*config, manifests.rendezvous_service(job, uid), manifests.workers_service(job, uid))
        rendezvous = (manifests.rendezvous_pod(job, uid),)
    _throughput(seen, pods, out)
    decision = _decide(seen, settings, out, pods, queued)
    create, delete = world.pod_changes(decision.workers, pods)
    claim, claim_blocked = job.spec.checkpoint.claim_name, ()
    flavors = {}
    if queued is not None and seen.queue is not None:
        flavors = {name: seen.queue.flavors.get(name) or {} for name in queued.flavors}
    if create and claim and seen.claim_found is None:
        return out.actions(check_claim=claim)
    if create and claim and not seen.claim_found:
        message = (
            f"checkpoint.claimName {claim!r}: no PersistentVolumeClaim of that name in namespace "
            f"{job.metadata.namespace}; create it (ReadWriteMany) or correct the name"
        )
        claim_blocked, create = ((("VolumeClaimNotFound", message),), [])
    # New workers join the live ones' rendezvous round; a start from no workers opens a new round (agents
    # that gave up close theirs for good).
    live_round = world.live_round(workers_of(seen.pods), pods)
    round_ = live_round if live_round is not None else _round(seen.status) + (1 if create else 0)
    workers: tuple[dict[str, Any], ...] = ()
    try:
        workers = tuple(_placed(manifests.worker_pod(job, uid, i, round_), queued, flavors) for i in create)
    except ValueError as exc:  # a flavor's node labels contradict the job's node selector
        claim_blocked = (("FlavorConflict", str(exc)),)
    progress = seen.status.progress or ProgressStatus()
    scaling = Scaling(
        decision=decision,
        live=len(pods.live),
        running=len(pods.running),
        pending=pods.pending,
        step=progress.step or 0,
        samples=progress.samples or 0,
        round=round_,
        fresh=live_round is None,
        scaled_down=tuple(names.worker(i) for i in delete),
        claim_blocked=claim_blocked,
        stuck=tuple(
            (reason, f"{names.worker(i)} cannot start: {message or reason}; check spec.image and "
                     "workers.pod.imagePullSecrets")
            for i, (reason, message) in pods.stuck.items()
        ),
    )  # fmt: skip
    return out.actions(
        delete=scaling.scaled_down,
        objects=objects,
        rendezvous=rendezvous,
        workers=workers,
        scaling=scaling,
        queue=queued.writes if queued else None,
    )


def _placed(pod: dict[str, Any], queued: kueue.Settled | None, flavors: dict[str, Any]) -> dict[str, Any]:
    return kueue.place(pod, flavors) if queued is not None else pod


def _decide(
    seen: Seen, settings: Settings, out: _Status, pods: world.WorkerPods, queued: kueue.Settled | None
) -> controller.Decision:
    """The controller's decision on what the pods and the last report show, within the job's share and
    what Kueue admitted."""
    capacity = _capacity(seen, pods, out, settings)
    share = seen.share
    shared = share is not None and (capacity is None or share.grow_to < capacity)
    if shared:
        capacity = share.grow_to
    admitted = queued is not None and (capacity is None or queued.workers < capacity)
    if admitted:
        capacity = queued.workers
    progress = seen.status.progress or ProgressStatus()
    recent = seen.status.rescales.recent if seen.status.rescales else []
    decision = controller.decide(
        seen.job.spec,
        controller.Observation(
            progress=report.progress_from_status(progress),
            workers=len(pods.live),
            capacity=capacity,
            samples_per_second=progress.samples_per_second if pods.running else None,
            seconds_since_rescale=timestamps.seconds_since(recent[-1].time if recent else None, seen.now),
            restart_seconds=settings.restart_seconds,
        ),
    )
    # A job held below its batch's workers by its share, not by the scheduler, says why (a worker more does
    # not pay): "needs 2 workers, 1 fit" alone reads as a full cluster.
    limited = decision.kind is controller.Kind.CAPACITY_LIMITED
    if shared and share.reason and (decision.changes(len(pods.live)) or limited):
        decision = dataclasses.replace(decision, reason=f"{decision.reason}; allocation {share.reason}")
    if admitted and decision.changes(len(pods.live)):
        decision = dataclasses.replace(decision, reason=f"{decision.reason}; Kueue admitted {queued.workers} workers")
    if decision.kind is controller.Kind.CAPACITY_LIMITED:
        out.condition("CapacityLimited", True, decision.kind.value, decision.reason)
    elif out.is_true("CapacityLimited") and capacity is None:
        out.condition("CapacityLimited", False, "CapacityAvailable", "the cluster placed every worker asked for")
    return decision


def _allocation(seen: Seen, out: _Status) -> None:
    """The job's share in its status, and an Event when it moves."""
    share, old = seen.share, seen.status.allocation
    if share is None:
        out.set(allocation=None)
        return
    moved = old is None or old.workers != share.workers
    out.set(allocation=AllocationStatus(
        workers=share.workers,
        demand=share.demand,
        reason=share.reason if moved else old.reason,
        time=out.stamp if moved else old.time,
    ))  # fmt: skip
    if moved and share.reason:
        out.emit("Normal", "Allocation", share.reason)


def _throughput(seen: Seen, pods: world.WorkerPods, out: _Status) -> None:
    """Rank 0's throughput at the worker count it trained on, once every worker runs: the allocator's
    measure of what a worker gives the job (the latest per count)."""
    progress, plan_ = seen.status.progress, seen.status.plan
    if not (progress and progress.samples_per_second and plan_ and plan_.world_size and plan_.global_batch):
        return
    workers = plan_.world_size // seen.job.spec.workers.devices_per_worker
    if pods.pending or workers != len(pods.running):
        return
    batch = progress.policy_batch or plan_.global_batch
    last = next((t for t in seen.status.throughput if t.workers == workers), None)
    if last and last.batch == batch and abs(progress.samples_per_second / last.samples_per_second - 1) < 0.05:
        return  # no news: a status patch a second for every wobble of the measure would be noise
    seen_now = Throughput(workers=workers, batch=batch, samples_per_second=progress.samples_per_second)
    kept = [t for t in seen.status.throughput if t.workers != workers]
    out.set(throughput=sorted([*kept, seen_now], key=lambda t: t.workers)[-16:])


def _capacity(seen: Seen, pods: world.WorkerPods, out: _Status, settings: Settings) -> int | None:
    """What the scheduler has shown, remembered in the status and retried after a while (at once when a
    node has offered more since it was measured)."""
    capacity = world.capacity(pods, settings.unschedulable_grace)
    old = seen.status
    if capacity is not None:
        out.set(capacity_time=out.stamp)
    elif old.capacity is not None:
        since = timestamps.seconds_since(old.capacity_time, seen.now)
        keep = since is not None and since < settings.capacity_retry
        measured = timestamps.parse(old.capacity_time) if old.capacity_time else None
        node_added = seen.nodes_changed is not None and measured is not None and seen.nodes_changed > measured
        capacity = old.capacity if keep and not node_added else None
    out.set(capacity=capacity)
    return capacity


def _restarts(status: LargeBatchJobStatus) -> int:
    return (status.workers.restarts if status.workers else None) or 0


def _round(status: LargeBatchJobStatus) -> int:
    return (status.workers.round if status.workers else None) or 0


def workers_of(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The worker pods among a job's pods."""
    return [p for p in pods if p["metadata"]["labels"].get(ROLE_LABEL) == "worker"]


def _not_deleting(pods: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))


def account(actions: Actions, outcome: Outcome) -> Accounted:
    """The status once the calls are made: restarts, the round, the phase, a blocked job."""
    out = _Status(actions.status, actions.stamp, actions.status.observed_generation)
    if actions.failures:
        _count_failures(actions, outcome, out)
        return Accounted(out.status, actions.events + tuple(out.events), None)
    scaling = actions.scaling
    if scaling is None:
        return Accounted(out.status, actions.events, None)
    decision, created = scaling.decision, outcome.created_workers
    blocked = [*outcome.refused_rendezvous, *scaling.claim_blocked, *outcome.refused_workers, *scaling.stuck]
    if blocked:
        if out.condition("WorkersBlocked", True, *blocked[0]):
            out.emit("Warning", *blocked[0])
    elif out.is_true("WorkersBlocked"):
        out.condition("WorkersBlocked", False, "Unblocked", "every worker pod was created and could start")
    if created and not actions.status.start_time:
        out.set(start_time=actions.stamp)

    news = None
    deleted = any(name in outcome.deleted for name in scaling.scaled_down)
    if decision.changes(scaling.live) and (created or deleted):
        news = decision
        out.emit("Normal", decision.kind.value, f"{scaling.live} → {decision.workers} workers: {decision.reason}")
        if scaling.live:
            rescales = actions.status.rescales or RescalesStatus()
            entry = decision.rescale(scaling.live, scaling.samples, actions.stamp)
            out.set(rescales=RescalesStatus(count=rescales.count + 1, recent=[*rescales.recent, entry][-5:]))

    pending = scaling.pending + created
    ready = min(scaling.running, decision.workers)
    if ready == 0 and not scaling.step:
        phase = "Pending"
    elif ready < decision.workers or pending or scaling.scaled_down:
        phase = "Scaling"
    else:
        phase = "Running"
    round_ = scaling.round if created or not scaling.fresh else _round(actions.status)  # nothing started: not opened
    out.set(phase=phase)
    restarts = _restarts(actions.status)
    out.workers(desired=decision.workers, ready=ready, pending=pending, restarts=restarts, round=round_)
    return Accounted(out.status, actions.events + tuple(out.events), news)


def _count_failures(actions: Actions, outcome: Outcome, out: _Status) -> None:
    """A failure counts when its pod is deleted, so a pod the watch still shows counts once. A diverged
    run would diverge again from the same checkpoint: replacing its workers only repeats it."""
    failed = [name for name in actions.failures if name in outcome.deleted]
    errors = {name: actions.failures[name] for name in failed if actions.failures[name]}
    restarts = _restarts(actions.status) + len(failed)
    out.workers(restarts=restarts)
    diverged = any(launch.DIVERGED in error for error in errors.values())
    limit = actions.max_restarts
    if diverged or restarts > limit:
        if diverged:
            reason, why = "Diverged", f"{launch.DIVERGED}; not restarted (it would diverge again)"
        else:
            reason, why = "TooManyRestarts", f"{restarts} worker failures, more than workers.maxRestarts {limit}"
        last = "".join(f"\n{name}: {world.last_lines(error)}" for name, error in errors.items())
        message = f"{why}; last failed: {', '.join(failed)}{last}"
        out.condition("Failed", True, reason, message)
        out.emit("Warning", "Failed", message)
        out.set(phase="Failed", completion_time=actions.stamp)
        out.workers(desired=0, ready=0, pending=0)
        return
    for name in failed:
        error = f": {world.last_lines(errors[name])}" if name in errors else ""
        out.emit("Warning", "WorkerFailed", f"{name} failed; replacing it ({restarts} of {limit} restarts){error}")

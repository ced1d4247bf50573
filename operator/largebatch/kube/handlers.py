"""The kopf handlers: each calls `reconcile` and hands the status changes to kopf. A timer runs
the reconcile of every job once a second, which also notices what the job's pods and the trainer's
reports did in between; a change of the job itself triggers one at once. The jobs, their pods and the
pods that hold accelerators are watched into kopf indices that reconciles read; nodes are watched for
what they offer. From those, one allocation across all jobs (`kube.sharing`), recomputed at most once
per reconcile interval and at once when a node changes, gives each job's reconcile its share."""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time

import kopf

from largebatch import api, timestamps
from largebatch.kube import metrics, sharing, watchdog, world
from largebatch.kube.manifests import JOB_LABEL
from largebatch.kube.reconcile import Apis, Settings, reconcile

SETTINGS = Settings(
    unschedulable_grace=float(os.environ.get("LARGEBATCH_UNSCHEDULABLE_GRACE_SECONDS", "20")),
    capacity_retry=float(os.environ.get("LARGEBATCH_CAPACITY_RETRY_SECONDS", "120")),
    restart_seconds=float(os.environ.get("LARGEBATCH_RESTART_SECONDS", "15")),
)
INTERVAL = float(os.environ.get("LARGEBATCH_RECONCILE_SECONDS", "1"))
METRICS_PORT = int(os.environ.get("LARGEBATCH_OPERATOR_METRICS_PORT", "9300"))
SHARED_NODES = world.parse_selector(os.environ.get("LARGEBATCH_SHARED_NODES", ""))
"""Labels of the nodes whose accelerators the jobs share (docs/operations.md); every node's without."""

METRICS = metrics.OperatorMetrics()
NODES = world.NodeOffers()
WATCHDOG = watchdog.Watchdog()


def tune(settings: kopf.OperatorSettings) -> None:
    """kopf's settings for this operator (no I/O: `configure` applies them at startup)."""
    # The CRD's structural status schema prunes what it does not declare: kopf keeps its own state in
    # annotations, and handlers return nothing.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=api.GROUP)
    settings.posting.level = logging.INFO
    settings.networking.error_backoffs = watchdog.backoffs(watchdog.RETRY_SECONDS, watchdog.BACKOFF_SCALE)
    # A job deleted while its timer's reconcile runs keeps its finalizer until kopf looks at the timer
    # again: 60 s later by default, so `kubectl delete` hung for a minute whenever it met a reconcile (often
    # on a busy operator). A reconcile takes well under an interval; kopf looks again after one.
    settings.background.cancellation_polling = INTERVAL


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_) -> None:
    tune(settings)
    WATCHDOG.start()
    if METRICS_PORT:
        metrics.serve(METRICS, METRICS_PORT)


@kopf.on.cleanup()
async def close(**_) -> None:
    WATCHDOG.close()  # kopf waits 5 s for tasks still running at its exit, then cancels them


@functools.cache
def _apis() -> Apis:
    """One client for every reconcile (its connection pool kept): kopf's login has configured it."""
    return Apis.of()


_LOCKS: collections.defaultdict[str, threading.Lock] = collections.defaultdict(threading.Lock)
_WRITTEN: dict[str, tuple[float, dict]] = {}
"""Per job (uid): when (perf_counter) and what the last reconcile left of the status fields the operator
owns; kopf patches them right after it."""
BODY_LAG_SECONDS = 5.0
"""How long a body may not show the last reconcile's status yet (kopf's patch, then the watch event);
after that the body is the truth again, should a patch have failed."""
TRAINER_FIELDS = ("progress", "plan")
"""Status fields rank 0 writes; every other one is the operator's."""


class _Sharing:
    """The last allocation across jobs, and when it was made: every job's reconcile reads it, and the
    first one after it is older than the reconcile interval (or than a node's change), or that of a job
    it did not see (a new one: it must not start uncapped), makes a new one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.made_at = -float("inf")
        self.made_wall = None
        self.considered: set[str] = set()
        self.shares: dict[str, sharing.Share] = {}

    def share(self, name: str, jobs: kopf.Index, job_pods: kopf.Index, accelerator_pods: kopf.Index):
        with self.lock:
            stale = NODES.changed_at is not None and (self.made_wall is None or NODES.changed_at > self.made_wall)
            if time.perf_counter() - self.made_at >= INTERVAL or stale or name not in self.considered:
                every = list(jobs.get(JOBS_KEY, []))
                self.made_at, self.made_wall = time.perf_counter(), timestamps.now()
                self.considered = {sharing.key(j) for j in every}
                self.shares = sharing.shares(
                    every,
                    job_pods,
                    NODES.offered(SHARED_NODES),
                    list(accelerator_pods.get(JOBS_KEY, [])),
                    SETTINGS.restart_seconds,
                )
            return self.shares.get(name)


SHARING = _Sharing()
JOBS_KEY = "all"


def _run(body, patch, job_pods: kopf.Index, jobs: kopf.Index, accelerator_pods: kopf.Index) -> None:
    def emit(kind: str, reason: str, message: str) -> None:
        (kopf.warn if kind == "Warning" else kopf.info)(body, reason=reason, message=message)

    namespace, name, uid = body.metadata.namespace, body.metadata.name, body.metadata.uid
    # kopf runs the timer and the change handlers of one job concurrently, each with the body of its own
    # moment, and patches the status after the handler: a body can predate the last reconcile's status.
    # So one reconcile at a time, each on the status fields the operator owns (it alone writes them) as
    # the last reconcile left them, for as long as a body may lag behind. Otherwise two would both start
    # worker 0, and one working from an older status would write back a conditions list without the
    # newest condition.
    with _LOCKS[uid]:
        started = time.perf_counter()
        try:
            status = dict(body.get("status") or {})
            written_at, written = _WRITTEN.get(uid, (0.0, {}))
            if started - written_at < BODY_LAG_SECONDS:
                status |= written
            pods = list(job_pods.get((namespace, name), []))
            share = SHARING.share(sharing.key(body), jobs, job_pods, accelerator_pods)
            done = reconcile(dict(body) | {"status": status}, _apis(), SETTINGS, emit, NODES.changed_at, pods, share)
            _WRITTEN[uid] = (time.perf_counter(), {k: v for k, v in done.status.items() if k not in TRAINER_FIELDS})
        except Exception as exc:  # an API hiccup: kopf retries; the job's state is all in its status
            METRICS.reconcile_errors.inc()
            raise kopf.TemporaryError(f"reconcile failed: {exc}", delay=2) from exc
        finally:
            METRICS.reconcile_seconds.observe(time.perf_counter() - started)
    if done.decision:
        METRICS.decided(namespace, name, done.decision.kind.value)
    METRICS.record(namespace, name, done.status)
    for key, value in done.changes.items():
        patch.status[key] = value


@kopf.index("", "v1", "pods", labels={JOB_LABEL: kopf.PRESENT})
async def job_pods(namespace, labels, body, **_):
    """The jobs' pods as the watch has them, by (namespace, job): a reconcile reads them here instead of
    listing them from the API server every second. Async: it only copies, so it runs on kopf's event
    loop instead of taking a thread from the pool the reconciles need."""
    return {(namespace, labels[JOB_LABEL]): dict(body)}


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
async def jobs(body, **_):
    """Every job, for the allocation across jobs."""
    return {JOBS_KEY: dict(body)}


def _asks_for_accelerators(spec, **_) -> bool:
    return sharing.asks_for_accelerators(spec)


@kopf.index("", "v1", "pods", when=_asks_for_accelerators)
async def accelerator_pods(body, **_):
    """Pods that ask for an extended resource (an accelerator), the jobs' workers among them: what they
    hold is not free for the jobs' shares."""
    return {JOBS_KEY: dict(body)}


@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=INTERVAL)
def tick(body, patch, job_pods: kopf.Index, jobs: kopf.Index, accelerator_pods: kopf.Index, **_) -> None:
    _run(body, patch, job_pods, jobs, accelerator_pods)


@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, field="spec")
def changed(body, patch, job_pods: kopf.Index, jobs: kopf.Index, accelerator_pods: kopf.Index, **_) -> None:
    _run(body, patch, job_pods, jobs, accelerator_pods)


# optional: no finalizer of its own (the timer has one: kopf stops it before the job goes)
@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL, optional=True)
def deleted(body, **_) -> None:
    METRICS.forget(body.metadata.namespace, body.metadata.name)
    _LOCKS.pop(body.metadata.uid, None)
    _WRITTEN.pop(body.metadata.uid, None)


@kopf.on.event("", "v1", "nodes")
def node(event, body, **_) -> None:
    NODES.seen(event.get("type"), dict(body), timestamps.now())

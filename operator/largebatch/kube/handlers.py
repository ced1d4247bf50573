"""The kopf handlers: each only calls `reconcile` and hands its status changes to kopf. A timer runs
the reconcile of every job once a second, which also notices what the job's pods and the trainer's
reports did in between; a change of the job itself triggers one at once."""

from __future__ import annotations

import logging
import os

import kopf

from largebatch import api
from largebatch.kube.reconcile import Apis, Settings, reconcile

SETTINGS = Settings(
    unschedulable_grace=float(os.environ.get("LARGEBATCH_UNSCHEDULABLE_GRACE_SECONDS", "20")),
    capacity_retry=float(os.environ.get("LARGEBATCH_CAPACITY_RETRY_SECONDS", "120")),
    restart_seconds=float(os.environ.get("LARGEBATCH_RESTART_SECONDS", "15")),
)
INTERVAL = float(os.environ.get("LARGEBATCH_RECONCILE_SECONDS", "1"))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    # The CRD's structural status schema prunes what it does not declare: kopf keeps its own state in
    # annotations, and handlers return nothing.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=api.GROUP)
    settings.posting.level = logging.INFO


def _run(body, patch) -> None:
    def emit(kind: str, reason: str, message: str) -> None:
        (kopf.warn if kind == "Warning" else kopf.info)(body, reason=reason, message=message)

    try:
        changes = reconcile(dict(body), Apis.of(), SETTINGS, emit)
    except Exception as exc:  # an API hiccup: kopf retries; the job's state is all in its status
        raise kopf.TemporaryError(f"reconcile failed: {exc}", delay=2) from exc
    for key, value in changes.items():
        patch.status[key] = value


@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=INTERVAL)
def tick(body, patch, **_) -> None:
    _run(body, patch)


@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, field="spec")
def changed(body, patch, **_) -> None:
    _run(body, patch)

"""kopf's settings for the operator: where kopf keeps its state, and how soon a deleted job's finalizer
goes when the deletion meets a reconcile in its timer."""

from __future__ import annotations

import kopf

from largebatch import api
from largebatch.kube import handlers


def test_a_deletion_that_meets_a_reconcile_waits_one_interval_not_kopfs_minute():
    settings = kopf.OperatorSettings()
    assert settings.background.cancellation_polling == 60  # kopf's default, which `kubectl delete` waited out
    handlers.tune(settings)
    assert settings.background.cancellation_polling == handlers.INTERVAL


def test_kopfs_state_goes_to_annotations_the_status_schema_keeps_nothing_undeclared():
    settings = kopf.OperatorSettings()
    handlers.tune(settings)
    progress, diffbase = settings.persistence.progress_storage, settings.persistence.diffbase_storage
    assert isinstance(progress, kopf.AnnotationsProgressStorage) and progress.prefix == api.GROUP
    assert isinstance(diffbase, kopf.AnnotationsDiffBaseStorage) and diffbase.prefix == api.GROUP

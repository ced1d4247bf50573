"""The trainer's held-out gauges: absent until the first evaluation, accuracy only for a classifier."""

from __future__ import annotations

from largebatch_trainer.metrics import Metrics

LABELS = {"namespace": "ml", "job_name": "digits", "rank": "0"}


def value(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name, LABELS)


def test_held_out_loss_and_accuracy_appear_with_the_first_evaluation():
    metrics = Metrics("ml", "digits", 0, port=None)
    assert value(metrics, "largebatch_eval_loss") is None
    assert value(metrics, "largebatch_eval_accuracy_ratio") is None
    metrics.evaluation(0.25, None)  # a task without accuracy
    assert value(metrics, "largebatch_eval_loss") == 0.25
    assert value(metrics, "largebatch_eval_accuracy_ratio") is None
    metrics.evaluation(0.125, 0.975)
    assert value(metrics, "largebatch_eval_loss") == 0.125
    assert value(metrics, "largebatch_eval_accuracy_ratio") == 0.975

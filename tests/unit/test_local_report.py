"""The local runner's view of rank 0's reports: a report that lacks a value keeps the previous one; the
checkpoint's evaluations as run.json lists them."""

from __future__ import annotations

from largebatch.local.runner import _evaluation, _merge


def test_a_report_without_loss_or_plan_keeps_the_last_known_values():
    before = {"progress": {"step": 40, "samples": 640, "loss": 1.5, "done": False}, "plan": {"globalBatch": 16}}
    restarted = {"progress": {"step": 40, "samples": 640, "done": False, "elasticRestarts": 1}, "plan": {}}
    merged = _merge(before, restarted)
    assert merged["progress"] == {"step": 40, "samples": 640, "loss": 1.5, "done": False, "elasticRestarts": 1}
    assert merged["plan"] == {"globalBatch": 16}


def test_newer_values_win_and_a_missing_report_changes_nothing():
    before = {"progress": {"step": 40, "loss": 1.5}, "plan": {"globalBatch": 16}}
    after = {"progress": {"step": 41, "loss": 1.4, "done": True}, "plan": {"globalBatch": 32}}
    assert _merge(before, after) == after
    assert _merge(before, None) is before
    assert _merge({}, after) == after


def test_evaluations_carry_their_accuracy_or_none():
    assert _evaluation([7, 224, 0.5, 0.875]) == {"step": 7, "samples": 224, "evalLoss": 0.5, "evalAccuracy": 0.875}
    assert _evaluation([7, 224, 0.5, None])["evalAccuracy"] is None  # a task that does not classify

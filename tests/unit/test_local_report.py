"""The local runner's view of rank 0's reports: a report that lacks a value keeps the previous one; the
checkpoint's evaluations as run.json lists them."""

from __future__ import annotations

from largebatch import report
from largebatch.local.runner import _merge
from largebatch_trainer import stateful


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


def test_the_training_record_carries_the_history_and_the_evaluations_as_run_json_shows_them(tmp_path):
    """What rank 0 writes next to its checkpoint and the local runner reads back, without a checkpoint."""
    assert report.read_record(tmp_path) == report.TrainingRecord()  # nothing checkpointed yet
    history, evaluations = stateful.History(), stateful.Evaluations()
    for step, samples, batch in [(0, 0, 16), (1, 16, 16), (2, 32, 32)]:
        history.record(step, samples, batch, world=2)
    evaluations.add(7, 224, 0.5, 0.875)
    evaluations.add(9, 288, float("nan"), None)  # a task that does not classify, a loss gone bad
    written = report.TrainingRecord(step=3, samples=64, loss=report.finite(float("inf")), history=history.spans(),
                                    evaluations=evaluations.typed())  # fmt: skip
    report.write_record(tmp_path, written)
    read = report.read_record(tmp_path)
    assert read == written and read.loss is None
    assert [s.model_dump(by_alias=True) for s in read.history] == [
        {"firstStep": 0, "firstSample": 0, "globalBatch": 16, "worldSize": 2, "steps": 2},
        {"firstStep": 2, "firstSample": 32, "globalBatch": 32, "worldSize": 2, "steps": 1},
    ]
    assert [e.model_dump(by_alias=True) for e in read.evaluations] == [
        {"step": 7, "samples": 224, "evalLoss": 0.5, "evalAccuracy": 0.875},
        {"step": 9, "samples": 288, "evalLoss": None, "evalAccuracy": None},
    ]

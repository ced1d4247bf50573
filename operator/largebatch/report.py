"""What rank 0 reports, typed: `progress` and `plan`, the same `ProgressStatus` and `PlanStatus` that a
LargeBatchJob's status holds. The trainer builds them; a shell reads them back into the schedule's
`Progress` with `progress_from_status`, policy state included, so that the controller plans exactly the
batch the trainer will take next.

And the training record (`TrainingRecord`): the exact step history and the held-out evaluations as of
the newest checkpoint, which rank 0 writes next to it (`record.json` in the checkpoint directory) and
the local runner reads into run.json without decoding a checkpoint (or importing the trainer)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import Field

from largebatch import files, schedule
from largebatch.api import PlanStatus, ProgressStatus
from largebatch.api.base import _Model

RECORD_FILE = "record.json"


class HistorySpan(_Model):
    """A run of optimizer steps at one policy batch and world size."""

    first_step: int = Field(ge=0)
    first_sample: int = Field(ge=0)
    global_batch: int = Field(ge=1)
    world_size: int = Field(ge=1)
    steps: int = Field(ge=1)


class Evaluation(_Model):
    """One held-out evaluation."""

    step: int = Field(ge=0)
    samples: int = Field(ge=0)
    eval_loss: float | None
    """None when it was not finite."""
    eval_accuracy: float | None = None


class TrainingRecord(_Model):
    """What the trainer has done as of its newest checkpoint."""

    step: int = 0
    samples: int = 0
    loss: float | None = None
    """The last step's training loss."""
    history: list[HistorySpan] = Field(default_factory=list)
    evaluations: list[Evaluation] = Field(default_factory=list)


def write_record(directory: Path, record: TrainingRecord) -> None:
    """Replace the record atomically: a reader sees the previous one or this one, whole."""
    text = record.model_dump_json(by_alias=True, indent=1)
    files.replace(directory / RECORD_FILE, lambda path: path.write_text(text))


def read_record(directory: Path) -> TrainingRecord:
    """The record in a checkpoint directory; empty when training has not checkpointed yet."""
    try:
        return TrainingRecord.model_validate(json.loads((directory / RECORD_FILE).read_text()))
    except FileNotFoundError:
        return TrainingRecord()


def finite(value: float | None) -> float | None:
    """A loss as the record keeps it: NaN and infinities (a diverged step) as None."""
    return value if value is not None and math.isfinite(value) else None


def report(progress: ProgressStatus, plan: PlanStatus) -> dict[str, Any]:
    """The JSON of one report: a progress file's content, or the merge patch of a job's status."""
    return {
        "progress": progress.model_dump(mode="json", by_alias=True, exclude_none=True),
        "plan": plan.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def read(document: dict[str, Any] | None) -> tuple[ProgressStatus, PlanStatus]:
    """A report (or a job's status) back into its models; missing parts are empty."""
    document = document or {}
    return (
        ProgressStatus.model_validate(document.get("progress") or {}),
        PlanStatus.model_validate(document.get("plan") or {}),
    )


def progress_from_status(status: ProgressStatus) -> schedule.Progress:
    """The schedule's `Progress` after the steps `status` reports, with the batch policy's state."""
    return schedule.Progress(
        samples=status.samples or 0,
        step=status.step or 0,
        batch=status.policy_batch,
        last_change_step=status.last_change_step or 0,
        noise_scale=status.noise_scale,
    )

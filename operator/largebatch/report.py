"""What rank 0 reports, typed: `progress` and `plan`, the same `ProgressStatus` and `PlanStatus` that a
LargeBatchJob's status holds. The trainer builds them; a shell reads them back into the schedule's
`Progress` with `progress_from_status`, policy state included, so that the controller plans exactly the
batch the trainer will take next."""

from __future__ import annotations

from typing import Any

from largebatch import schedule
from largebatch.api import PlanStatus, ProgressStatus


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

"""What `lbctl status` and `lbctl describe` show of a LargeBatchJob object (a dict as the API returns it):
table cells and the plan from the job's current progress on. Pure; the CLI renders it."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from largebatch import plan_report, timestamps
from largebatch.api import LargeBatchJob, LargeBatchJobStatus, PlanStatus, ProgressStatus, WorkersStatus

COLUMNS = ["NAME", "PHASE", "WORKERS", "BATCH", "MICRO×ACC", "LR", "STEP", "SAMPLES/S", "LOSS", "NOISE", "AGE"]
WIDE_COLUMNS = [
    "NAMESPACE", *COLUMNS, "POLICY", "SAMPLES", "CAPACITY", "PRIORITY", "ALLOCATED", "QUEUE", "ADMITTED", "RESCALES"
]  # fmt: skip
MISSING = "-"


def _number(value: float | int | None, spec: str) -> str:
    return MISSING if value is None else format(value, spec)


def age(created: str | None, now: datetime.datetime) -> str:
    """kubectl's short age: 42s, 7m, 5h, 3d."""
    if not created:
        return MISSING
    seconds = timestamps.seconds_since(created, now)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def row(job: dict[str, Any], now: datetime.datetime, wide: bool = False) -> list[str]:
    meta, status = job["metadata"], LargeBatchJobStatus.of(job)
    progress, plan = status.progress or ProgressStatus(), status.plan or PlanStatus()
    workers = status.workers or WorkersStatus()
    cells = {
        "NAMESPACE": meta.get("namespace", ""),
        "NAME": meta["name"],
        "PHASE": status.phase or "Pending",
        "WORKERS": f"{_number(workers.ready, 'd')}/{_number(workers.desired, 'd')}",
        "BATCH": _number(plan.global_batch, ","),
        "MICRO×ACC": f"{_number(plan.micro_batch, 'd')}×{_number(plan.accumulation_steps, 'd')}",
        "LR": _number(plan.lr, ".3g"),
        "STEP": _number(progress.step, ","),
        "SAMPLES/S": _number(progress.samples_per_second, ",.0f"),
        "LOSS": _number(progress.loss, ".4f"),
        "NOISE": _number(progress.noise_scale, ",.0f"),
        "AGE": age(meta.get("creationTimestamp"), now),
        "POLICY": plan.policy_phase or MISSING,
        "SAMPLES": _number(progress.samples, ","),
        "CAPACITY": _number(status.capacity, "d"),
        "PRIORITY": str(job.get("spec", {}).get("priority", 0)),
        "ALLOCATED": _allocated(status),
        "QUEUE": status.queue.name if status.queue else MISSING,
        "ADMITTED": _admitted(status),
        "RESCALES": _number(status.rescales.count if status.rescales else None, "d"),
    }
    return [cells[c] for c in (WIDE_COLUMNS if wide else COLUMNS)]


def _allocated(status: LargeBatchJobStatus) -> str:
    """The job's share of the shared accelerators against what its batch can use: `2/8` workers."""
    share = status.allocation
    if share is None:
        return MISSING
    return f"{_number(share.workers, 'd')}/{_number(share.demand, 'd')}"


def _admitted(status: LargeBatchJobStatus) -> str:
    """Workers Kueue admitted against those the job asks for: `2/4`."""
    queue = status.queue
    if queue is None:
        return MISSING
    return f"{queue.admitted}/{_number(queue.requested, 'd')}"


def plan_ahead(job: dict[str, Any]) -> plan_report.PlanReport:
    """The phases from the job's current progress on, as `lbctl plan` shows them (criticalBatch
    assumes the last measured noise scale), capped by the capacity the cluster has shown."""
    parsed, status = LargeBatchJob.from_object(job), LargeBatchJobStatus.of(job)
    progress = status.progress or ProgressStatus()
    whole = plan_report.report(parsed.spec, capacity=status.capacity, noise_scale=progress.noise_scale)
    done = progress.samples or 0
    rows = []
    for r in whole.rows:
        if r.phase.end <= done:
            continue
        if r.phase.start < done:  # the phase under way: what is left of it
            left = dataclasses.replace(r.phase, start=done, steps=-(-(r.phase.end - done) // r.phase.global_batch))
            r = dataclasses.replace(r, phase=left)
        rows.append(r)
    return plan_report.PlanReport(rows, sum(r.phase.steps for r in rows), whole.baseline_serial_steps)

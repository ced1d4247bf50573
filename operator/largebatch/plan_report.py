"""What `lbctl plan` shows: the phases of a job with workers, micro-batches and step counts, and the
serial-step saving against the constant-batch baseline. Pure data; the CLI renders it."""

from __future__ import annotations

from dataclasses import dataclass

from largebatch import schedule
from largebatch.api import LargeBatchJobSpec


@dataclass(frozen=True)
class PhaseRow:
    phase: schedule.Phase
    workers: int
    world_size: int
    micro_batch: int
    accumulation_steps: int

    def to_json(self) -> dict:
        p = self.phase
        return {
            "phase": p.label,
            "startSample": p.start,
            "endSample": p.end,
            "globalBatch": p.global_batch,
            "lrStart": p.lr_start,
            "lrEnd": p.lr_end,
            "workers": self.workers,
            "worldSize": self.world_size,
            "microBatch": self.micro_batch,
            "accumulationSteps": self.accumulation_steps,
            "steps": p.steps,
        }


@dataclass(frozen=True)
class PlanReport:
    rows: list[PhaseRow]
    serial_steps: int
    baseline_serial_steps: int

    @property
    def saving(self) -> float:
        """Fraction of serial optimizer steps saved against constant batch.initial."""
        return 1.0 - self.serial_steps / self.baseline_serial_steps

    def to_json(self) -> dict:
        return {
            "phases": [row.to_json() for row in self.rows],
            "serialSteps": self.serial_steps,
            "baselineSerialSteps": self.baseline_serial_steps,
            "saving": self.saving,
        }


def report(spec: LargeBatchJobSpec, capacity: int | None = None, noise_scale: float | None = None) -> PlanReport:
    """The plan of `spec` when at most `capacity` workers can be placed (None: workers.max)."""
    rows = []
    for phase in schedule.phases(spec, noise_scale):
        workers = schedule.desired_workers(spec, phase.global_batch, capacity)
        world = workers * spec.workers.devices_per_worker
        split = schedule.split(phase.global_batch, world, spec.batch.micro_batch_per_device)
        rows.append(PhaseRow(phase, workers, world, split.max_micro_batch, split.accumulation_steps))
    baseline = schedule.phases(schedule.constant_baseline(spec))
    return PlanReport(
        rows=rows,
        serial_steps=sum(row.phase.steps for row in rows),
        baseline_serial_steps=sum(p.steps for p in baseline),
    )

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
        accumulation, micro_batch = schedule.split_size(
            phase.global_batch, world, spec.batch.micro_batch_per_device, spec.batch.bn_batch
        )
        rows.append(PhaseRow(phase, workers, world, micro_batch, accumulation))
    baseline = schedule.phases(schedule.constant_baseline(spec))
    return PlanReport(
        rows=rows,
        serial_steps=sum(row.phase.steps for row in rows),
        baseline_serial_steps=sum(p.steps for p in baseline),
    )


@dataclass(frozen=True)
class Assumption:
    """The plan of a criticalBatch job if its measured noise scale were `noise_scale` throughout."""

    noise_scale: float
    largest_batch: int
    serial_steps: int
    saving: float

    def to_json(self) -> dict:
        return {"noiseScale": self.noise_scale, "largestBatch": self.largest_batch,
                "serialSteps": self.serial_steps, "saving": self.saving}  # fmt: skip


def assumed_noise_scales(spec: LargeBatchJobSpec, points: int = 4) -> list[Assumption]:
    """A criticalBatch job's plan depends on the noise scale it will measure: the plan for a few values,
    spread geometrically so that the batch they call for (multiplier x noise scale) runs from
    batch.initial to batch.max."""
    b0, b_max = spec.batch.initial, spec.batch.max
    multiplier = spec.critical_multiplier
    out = []
    for k in range(points):
        noise_scale = b0 * (b_max / b0) ** (k / (points - 1)) / multiplier
        plan = report(spec, noise_scale=noise_scale)
        out.append(Assumption(round(noise_scale, 1), max(r.phase.global_batch for r in plan.rows),
                              plan.serial_steps, plan.saving))  # fmt: skip
    return out

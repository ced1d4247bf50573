"""The status: what the operator (phase, workers, capacity, rescales, conditions) and rank 0 (progress,
plan) write, and what `lbctl status` and `describe` read."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from largebatch.api.base import (
    _Model,
)

# --- status ---------------------------------------------------------------------------------------


class WorkersStatus(_Model):
    """Worker counts as the operator sees them."""

    desired: int | None = Field(default=None, ge=0)
    """Workers the controller wants for the current batch."""
    ready: int | None = Field(default=None, ge=0)
    """Worker pods running and ready."""
    pending: int | None = Field(default=None, ge=0)
    """Worker pods waiting to be scheduled."""
    restarts: int | None = Field(default=None, ge=0)
    """Worker pods replaced after they failed or were lost (`workers.maxRestarts` bounds it)."""
    round: int | None = Field(default=None, ge=0)
    """Rendezvous round set: a new one whenever the job starts again from no workers."""


class PlanStatus(_Model):
    """The plan of the current optimizer step."""

    global_batch: int | None = None
    """Global batch in samples."""
    micro_batch: int | None = None
    """Largest micro-batch per device."""
    accumulation_steps: int | None = None
    """Micro-steps per optimizer step."""
    world_size: int | None = None
    """Training processes (devices) in total."""
    lr: float | None = None
    """Learning rate."""
    policy_phase: str | None = Field(default=None, max_length=64)
    """Phase of the batch policy (warmup, cut 2, ramp 3/8, ...)."""


class ProgressStatus(_Model):
    """Training progress as rank 0 last reported it."""

    step: int | None = None
    """Optimizer steps taken."""
    samples: int | None = None
    """Samples consumed."""
    tokens: int | None = None
    """Tokens consumed (sequence tasks)."""
    loss: float | None = None
    """Training loss of the last step (mean per sample)."""
    eval_loss: float | None = None
    """Held-out loss (mean per sample) of the latest evaluation (`spec.evaluation`)."""
    eval_accuracy: float | None = Field(default=None, ge=0.0, le=1.0)
    """Held-out accuracy of the latest evaluation, as a fraction from 0 to 1 (tasks that classify)."""
    eval_step: int | None = Field(default=None, ge=0)
    """Step after which `evalLoss` (and `evalAccuracy`) was measured."""
    noise_scale: float | None = None
    """Smoothed gradient noise scale B_simple."""
    samples_per_second: float | None = None
    """Training throughput."""
    policy_batch: int | None = Field(default=None, ge=1)
    """Global batch the batch policy chose for the last step (the last step itself may be cut short by
    the end of the data budget); the LR rule and the policy's next decision start from it."""
    last_change_step: int | None = Field(default=None, ge=0)
    """Step at which the batch policy last changed the batch (criticalBatch's minStepsBetweenChanges
    counts from it)."""
    done: bool | None = None
    """The data budget is spent and every rank has left the process group."""
    elastic_restarts: int | None = Field(default=None, ge=0)
    """The most worker-group restarts any torchrun agent of the job has made."""
    time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    """When rank 0 reported this."""


class Condition(_Model):
    """A standard Kubernetes condition."""

    type: str = Field(max_length=316)
    """Condition type (Ready, Scaling, CapacityLimited, NoDurableCheckpoint, InvalidSpec, ...)."""
    status: Literal["True", "False", "Unknown"]
    """Condition status."""
    reason: str | None = Field(default=None, max_length=1024)
    """One-word CamelCase reason."""
    message: str | None = Field(default=None, max_length=32768)
    """Human-readable details."""
    last_transition_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    """When the status last changed."""
    observed_generation: int | None = None
    """The spec generation this condition is about."""


class Rescale(_Model):
    """One change of the worker count."""

    time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    """When the operator made it."""
    from_workers: int | None = Field(default=None, ge=0, alias="from")
    """Workers before."""
    to_workers: int | None = Field(default=None, ge=0, alias="to")
    """Workers after."""
    samples: int | None = Field(default=None, ge=0)
    """Samples consumed at the time."""
    kind: str | None = Field(default=None, max_length=64)
    """The controller's decision (Grow, CapacityLimited, AboveMax, ...)."""
    reason: str | None = Field(default=None, max_length=1024)
    """The decision, with its numbers."""


class RescalesStatus(_Model):
    """Changes of the worker count over the job's life."""

    count: int = Field(default=0, ge=0)
    """Rescales so far."""
    recent: list[Rescale] = Field(default_factory=list, max_length=10)
    """The last few, oldest first."""


class AllocationStatus(_Model):
    """The operator's share of the cluster's accelerators for this job (its allocator)."""

    workers: int | None = Field(default=None, ge=0)
    """Most workers the allocator gives the job now; the job's own decision stays within it."""
    demand: int | None = Field(default=None, ge=0)
    """Workers the job's batch can use now (accumulation 1), within workers.min..max."""
    reason: str | None = Field(default=None, max_length=1024)
    """Why the allocation last moved, with the jobs on the other side of the move."""
    time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    """When the allocation last moved."""


class QueueStatus(_Model):
    """The job's place in Kueue, for a job labelled `kueue.x-k8s.io/queue-name`."""

    name: str = Field(max_length=253)
    """The LocalQueue it waits in."""
    cluster_queue: str | None = Field(default=None, max_length=253)
    """The ClusterQueue whose quota admitted it."""
    workload: str | None = Field(default=None, max_length=253)
    """The Workload that asks for the job's workers (or holds them, when it asks for no more)."""
    admitted: int = Field(default=0, ge=0)
    """Workers Kueue admitted: the most the job runs."""
    requested: int | None = Field(default=None, ge=0)
    """Workers the job asks Kueue for: what its batch wants."""


class Throughput(_Model):
    """Training throughput seen at one worker count."""

    workers: int = Field(ge=1)
    """Workers that trained."""
    batch: int = Field(ge=1)
    """Global batch they trained at."""
    samples_per_second: float = Field(ge=0.0)
    """Samples per second rank 0 reported."""


class LargeBatchJobStatus(_Model):
    """Observed state of a LargeBatchJob; the operator's memory across restarts."""

    phase: Literal["Pending", "Queued", "Running", "Scaling", "Suspended", "Succeeded", "Failed"] | None = None
    """Lifecycle phase."""
    observed_generation: int | None = None
    """The spec generation the operator last acted on."""
    workers: WorkersStatus | None = None
    """Worker counts."""
    capacity: int | None = Field(default=None, ge=0)
    """Most workers the cluster could place, when known (workers left unschedulable lower it)."""
    capacity_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    """When the capacity was measured; the job tries to grow past it again a while later."""
    plan: PlanStatus | None = None
    """Plan of the current step."""
    progress: ProgressStatus | None = None
    """Progress reported by rank 0."""
    rescales: RescalesStatus | None = None
    """Changes of the worker count."""
    allocation: AllocationStatus | None = None
    """The job's share of the accelerators the operator allocates across jobs."""
    queue: QueueStatus | None = None
    """The job's place in Kueue (kueue.x-k8s.io/queue-name), when it has one."""
    throughput: list[Throughput] = Field(default_factory=list, max_length=16)
    """The latest throughput at each worker count the job ran at: the allocator's model of what
    another worker would give it."""
    conditions: list[Condition] = Field(default_factory=list, max_length=32)
    """Conditions."""
    start_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    """When the first workers were created."""
    completion_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    """When the job succeeded or failed."""

    @classmethod
    def of(cls, obj: dict[str, Any]) -> LargeBatchJobStatus:
        """The status of a job as the API server returns it (empty before the operator's first reconcile)."""
        return cls.model_validate(obj.get("status") or {})

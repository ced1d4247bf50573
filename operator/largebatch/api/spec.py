"""The optimizer, the schedule, evaluation, checkpoints, metrics, and the whole `LargeBatchJobSpec`."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from largebatch.api.base import (
    MAX_TOTAL_SAMPLES,
    Rule,
    _Model,
    _sub,
)
from largebatch.api.batch import (
    CRITICAL_MULTIPLIER_DEFAULT,
    PRECONDITIONED_OPTIMIZERS,
    SEESAW_CAP_MULTIPLIER_DEFAULT,
    BatchSpec,
)
from largebatch.api.workers import (
    BF16_BY_DEFAULT,
    JOB_DIR,
    SHM_DIR,
    TaskSpec,
    WorkersSpec,
)

# --- optimizer and schedule -----------------------------------------------------------------------


class OptimizerSpec(_Model):
    """The optimizer and how its LR follows the batch."""

    name: Literal["sgd", "adamw", "lamb", "lars"] = "adamw"
    """`sgd` (with momentum) and `adamw` from torch; `lamb` and `lars` from pytorch-optimizer."""
    lr: float = Field(gt=0.0, le=100.0)
    """Peak learning rate, tuned at global batch `baseBatch`."""
    base_batch: int | None = Field(default=None, ge=1)
    """Global batch at which `lr` was tuned; defaults to `batch.initial`."""
    scaling: Literal["linear", "sqrt", "none"] = "linear"
    """How the LR follows the batch: lr x (B/baseBatch) (Goyal et al.), lr x sqrt(B/baseBatch), or lr."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight decay, as each optimizer's paper has it: decoupled for adamw, inside the trust-ratio update
    for lamb, an L2 term for sgd and lars. Not rescaled with the batch; bias and norm parameters are
    exempt."""
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    """Momentum of `sgd` and `lars`."""
    trust_coefficient: float = Field(default=0.001, gt=0.0, le=1.0)
    """Trust coefficient of `lars` (the paper's eta): a weight matrix steps lr x trustCoefficient x its norm
    over its gradient's norm, while bias and norm parameters, which get no trust ratio, step lr x their
    gradient. With the same lr x trustCoefficient, a larger coefficient gives the weights the same step
    and bias and norm parameters a smaller one."""
    betas: list[Annotated[float, Field(ge=0.0, lt=1.0)]] = Field(
        default_factory=lambda: [0.9, 0.999],
        min_length=2,
        max_length=2,
        json_schema_extra={"default": [0.9, 0.999]},
    )
    """Moment coefficients (beta1, beta2) of `adamw` and `lamb`."""
    eps: float = Field(default=1e-8, gt=0.0, le=1.0)
    """Denominator epsilon of `adamw` and `lamb`."""
    max_grad_norm: float | None = Field(default=None, gt=0.0, le=1e6)
    """Clip the gradient to this global norm before each step (the whole model's gradient over the global
    batch, after its reduction: the same norm in every `parallelism.dataParallel` mode and at every world
    size). Unset: no clipping."""
    moments: Literal["perSample", "perStep"] = "perSample"
    """How `betas` and `eps` of `adamw` and `lamb` follow the batch. `perSample`: they were tuned at
    `baseBatch`, and at k = B/baseBatch times that batch each beta becomes beta**k and eps becomes eps/sqrt(k),
    so that the moments average over the same number of samples and eps keeps its size beside the
    averaged gradient (the square-root rule's stochastic-differential-equation form, Malladi et al. 2022).
    `perStep`: they stay as given, each moment averaging over a fixed number of steps."""


class ScheduleSpec(_Model):
    """The training budget and the LR schedule of the base (constant-batch) run."""

    total_samples: int = Field(ge=1, le=MAX_TOTAL_SAMPLES)
    """Samples to train on in total (the data budget)."""
    warmup_samples: int = Field(default=0, ge=0)
    """Samples over which the LR rises linearly to its peak (gradual warmup, Goyal et al.)."""
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay of the LR multiplier from 1 to `minLrRatio` over the samples after warmup."""
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """Final LR as a fraction of the peak."""

    rules = (
        Rule(
            "self.warmupSamples < self.totalSamples",
            "schedule.warmupSamples must be < schedule.totalSamples: shorten the warmup",
            lambda s: s.warmup_samples < s.total_samples,
            lambda s: f"warmupSamples={s.warmup_samples}, totalSamples={s.total_samples}",
            ".warmupSamples",
        ),
    )


class EvaluationSpec(_Model):
    """Held-out evaluation, when the task has held-out samples: always when training ends, and every
    `everySamples` samples of the data budget when set."""

    every_samples: int | None = Field(default=None, ge=1)
    """Samples of training between two evaluations (for example totalSamples / 20 for every 5%)."""
    samples: int = Field(default=2048, ge=1, le=10_000_000)
    """Held-out samples each evaluation takes (the first ones of the task's held-out set)."""


CHECKPOINT_PATH_DEFAULT = "/var/lib/largebatch/checkpoints"


class CheckpointSpec(_Model):
    """Where and how often the trainer checkpoints; every restart resumes from the newest one."""

    path: str = Field(default=CHECKPOINT_PATH_DEFAULT, min_length=1, max_length=1024)
    """Directory of the checkpoints (shared by all workers)."""
    claim_name: str | None = Field(default=None, max_length=253)
    """PersistentVolumeClaim mounted at `path` in every worker pod (Kubernetes only)."""
    every_steps: int = Field(default=200, ge=1)
    """Optimizer steps between checkpoints (one is also taken on SIGTERM)."""
    keep: int = Field(default=2, ge=1, le=100)
    """Newest checkpoints kept; older ones are deleted."""


class ParallelismSpec(_Model):
    """How the ranks divide the model's state (docs/trainer.md, "Sharded data parallel")."""

    data_parallel: Literal["replicate", "shard", "hybrid"] = "replicate"
    """`replicate`: every rank holds the whole model, its gradients and optimizer state (DDP), and rank 0
    writes each checkpoint whole. `shard`: FSDP2 over every rank, each holding 1/world of the parameters,
    gradients and optimizer state (a block is gathered only while it computes), every rank writing its own
    shard of each checkpoint. `hybrid`: HSDP, sharded within a worker pod (its `devicesPerWorker` ranks)
    and replicated across pods, so a rescale changes only the replicated dimension. The gradient is the same
    sum over the global batch in every mode; checkpoints of any mode load at any world size."""


class MetricsSpec(_Model):
    """Prometheus metrics served by every worker."""

    port: int = Field(default=9404, ge=1024, le=65535)
    """Port of the `/metrics` endpoint in each worker."""


class LargeBatchJobSpec(_Model):
    """Desired state of a LargeBatchJob."""

    image: str = Field(min_length=1, max_length=1024)
    """Trainer container image (built from `trainer_image/Dockerfile`)."""
    task: TaskSpec
    """The training task."""
    workers: WorkersSpec = _sub(WorkersSpec)
    """The elastic worker group."""
    batch: BatchSpec
    """Global batch and its policy."""
    optimizer: OptimizerSpec
    """Optimizer and LR scaling rule."""
    schedule: ScheduleSpec
    """Data budget and LR schedule."""
    evaluation: EvaluationSpec = _sub(EvaluationSpec)
    """Held-out evaluation."""
    checkpoint: CheckpointSpec = _sub(CheckpointSpec)
    """Checkpointing."""
    metrics: MetricsSpec = _sub(MetricsSpec)
    """Metrics endpoint."""
    parallelism: ParallelismSpec = _sub(ParallelismSpec)
    """How the ranks hold the model: replicated (the default) or sharded."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    """Where the job stands when jobs share too few accelerators (the operator's allocator, higher first):
    a job of higher priority gets every accelerator it can use before a lower one gets more than its
    `workers.min`, and its `workers.min` before a lower one keeps its own. Jobs of one priority each get
    a fair share (docs/operations.md, "Priorities and fair shares"). It orders LargeBatchJobs among
    themselves only; `workers.pod.priorityClassName` is what the scheduler sees."""
    suspend: bool = False
    """Stop training for now: the workers checkpoint (SIGTERM) and are removed. Set back to false to
    resume at the exact sample."""
    precision: Literal["fp32", "bf16"] | None = None
    """`bf16`: the forward pass under bf16 autocast, with fp32 master weights, gradients and optimizer
    state (and TF32 for the fp32 matmuls that remain). `fp32`: IEEE fp32 throughout, the mode in which
    any world size and accumulation give the same parameters to float tolerance. Default: bf16 with
    `workers.accelerator: nvidia.com/gpu`, fp32 otherwise, and fp32 when a GPU job trains on a CPU."""
    gradient_all_reduce: Literal["fp32", "bf16"] = "fp32"
    """Dtype in which ranks all-reduce their gradients. `bf16` halves the traffic, but each rank's
    gradient is rounded to 8 significant bits before the sum and the sum once more, so the parameters
    then depend on the world size (docs/trainer.md). Needs bf16 precision."""

    immutable: ClassVar[tuple[str, ...]] = ("task", "batch", "optimizer", "schedule")
    """Blocks that define the training math: the API server refuses to change them on an existing job."""
    read_at_start: ClassVar[tuple[str, ...]] = (
        "precision", "gradient_all_reduce", "evaluation", "checkpoint", "metrics", "workers.accelerator",
        "parallelism",
    )  # fmt: skip
    """What else the workers read from the job file the operator writes when the job starts (its
    ConfigMap, written once: a rewritten file would reach a running round's ranks at different moments,
    so ranks of one round could train under different settings). The API server refuses to change
    these on an existing job rather than accept an edit that never reaches the workers."""

    rules = (
        Rule(
            "!has(self.workers) || !has(self.workers.pod) || !has(self.workers.pod.volumes) || "
            "self.workers.pod.volumes.all(v, !(v.mountPath in "
            f"['{JOB_DIR}', '{SHM_DIR}', has(self.checkpoint) && has(self.checkpoint.path) ? self.checkpoint.path"
            f" : '{CHECKPOINT_PATH_DEFAULT}']))",
            f"workers.pod.volumes: a mountPath is taken by the checkpoints (checkpoint.path), the job file "
            f"({JOB_DIR}) or {SHM_DIR}: mount the volume elsewhere",
            lambda s: not {v.mount_path for v in s.workers.pod.volumes} & {JOB_DIR, SHM_DIR, s.checkpoint.path},
            lambda s: (
                f"mountPaths={[v.mount_path for v in s.workers.pod.volumes]}, checkpoint.path={s.checkpoint.path}"
            ),
            ".workers.pod.volumes",
        ),
        Rule(
            "self.batch.policy.type != 'seesaw' || self.schedule.decay != 'constant'",
            "batch.policy.type seesaw needs a decaying schedule: set schedule.decay to cosine or linear",
            lambda s: s.batch.policy.type != "seesaw" or s.schedule.decay != "constant",
            lambda s: f"decay={s.schedule.decay}",
            ".schedule.decay",
        ),
        Rule(
            "self.batch.policy.type != 'criticalBatch' || self.batch.initial >= 2",
            "batch.policy.type criticalBatch needs batch.initial >= 2: the gradient noise scale it follows is "
            "measured from two small batches a step, and one sample cannot be split",
            lambda s: s.batch.policy.type != "criticalBatch" or s.batch.initial >= 2,
            lambda s: f"policy={s.batch.policy.type}, initial={s.batch.initial}",
            ".batch.initial",
        ),
        Rule(
            "self.batch.policy.criticalBatch.estimator != 'preconditioned' || "
            f"self.optimizer.name in {list(PRECONDITIONED_OPTIMIZERS)}",
            "batch.policy.criticalBatch.estimator preconditioned needs an optimizer with a second-moment "
            f"preconditioner ({', '.join(PRECONDITIONED_OPTIMIZERS)}): set estimator to simple",
            lambda s: (
                s.batch.policy.critical_batch.estimator != "preconditioned"
                or s.optimizer.name in PRECONDITIONED_OPTIMIZERS
            ),
            lambda s: f"optimizer={s.optimizer.name}",
            ".batch.policy.criticalBatch.estimator",
        ),
        Rule(
            "!has(self.batch.bnBatch) || self.schedule.totalSamples % self.batch.bnBatch == 0",
            "schedule.totalSamples must be a multiple of batch.bnBatch: the data budget's last step would "
            "otherwise end in a BN batch of fewer samples, normalised over those few and counted in BatchNorm's "
            "running statistics: round totalSamples to a multiple",
            lambda s: s.batch.bn_batch is None or s.schedule.total_samples % s.batch.bn_batch == 0,
            lambda s: f"totalSamples={s.schedule.total_samples:,}, bnBatch={s.batch.bn_batch}",
            ".schedule.totalSamples",
        ),
        Rule(
            "!has(self.metrics) || !has(self.workers) || self.metrics.port + self.workers.devicesPerWorker <= 65536",
            "metrics.port + workers.devicesPerWorker - 1 must be <= 65535 (local rank r serves metrics on "
            "metrics.port + r): lower metrics.port",
            lambda s: s.metrics.port + s.workers.devices_per_worker <= 65536,
            lambda s: f"port={s.metrics.port}, devicesPerWorker={s.workers.devices_per_worker}",
            ".metrics.port",
        ),
        Rule(
            "!has(self.gradientAllReduce) || self.gradientAllReduce != 'bf16' || (has(self.precision) ? "
            "self.precision == 'bf16' : (!has(self.workers) || !has(self.workers.accelerator) || "
            f"self.workers.accelerator == '{BF16_BY_DEFAULT}'))",
            "gradientAllReduce bf16 needs precision bf16 (fp32 precision promises parameters that do not depend "
            "on the world size, which a bf16 all-reduce breaks): set precision to bf16 or gradientAllReduce "
            "to fp32",
            lambda s: s.gradient_all_reduce != "bf16" or s.resolved_precision == "bf16",
            lambda s: (
                f"precision={s.precision or f'unset, so {s.resolved_precision}'}, accelerator={s.workers.accelerator}"
            ),
            ".gradientAllReduce",
        ),
        Rule(
            "!has(self.parallelism) || !has(self.parallelism.dataParallel) || "
            "self.parallelism.dataParallel != 'hybrid' || (has(self.workers) && has(self.workers.devicesPerWorker) "
            "&& self.workers.devicesPerWorker >= 2)",
            "parallelism.dataParallel hybrid shards within a worker pod's devicesPerWorker ranks and needs 2 or "
            "more: set workers.devicesPerWorker >= 2, or use shard to shard over every rank",
            lambda s: s.parallelism.data_parallel != "hybrid" or s.workers.devices_per_worker >= 2,
            lambda s: f"devicesPerWorker={s.workers.devices_per_worker}",
            ".parallelism.dataParallel",
        ),
    )

    @property
    def resolved_precision(self) -> Literal["fp32", "bf16"]:
        """`precision`, or its default for `workers.accelerator` (the trainer still uses fp32 when a job
        without a precision of its own trains on a CPU)."""
        if self.precision is not None:
            return self.precision
        return "bf16" if self.workers.accelerator == BF16_BY_DEFAULT else "fp32"

    @property
    def base_batch(self) -> int:
        return self.optimizer.base_batch or self.batch.initial

    @property
    def critical_multiplier(self) -> float:
        """`criticalBatch.multiplier`, or its default: Seesaw's cap's, or the critical-batch policy's for this
        job's LR rule."""
        multiplier = self.batch.policy.critical_batch.multiplier
        if multiplier is not None:
            return multiplier
        if self.batch.policy.type == "seesaw":
            return SEESAW_CAP_MULTIPLIER_DEFAULT
        return CRITICAL_MULTIPLIER_DEFAULT[self.optimizer.scaling]

    @property
    def measures_noise_scale(self) -> bool:
        """The batch policy reads the gradient noise scale (the trainer then makes sure it is measured)."""
        policy = self.batch.policy
        return policy.type == "criticalBatch" or (policy.type == "seesaw" and policy.seesaw.cap_at_critical_batch)

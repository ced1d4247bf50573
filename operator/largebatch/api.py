"""The LargeBatchJob API (`largebatch.io/v1alpha1`): the single source of truth for the CRD.

Every field's docstring becomes its `description` in the CRD, so `kubectl explain` shows it. Cross-field
rules are declared once as `Rule`s: the CRD carries them as CEL (`x-kubernetes-validations`, checked by
the API server at `kubectl apply`) and pydantic checks the same rule in Python (the CLI and the local
runner), so a job file is judged the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

GROUP = "largebatch.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LargeBatchJob"
PLURAL = "largebatchjobs"
SHORT_NAME = "lbj"
# Worker pods are named `<job>-worker-<n>`; their names must stay valid DNS labels (63 characters).
MAX_NAME_LENGTH = 50
# Bounds on the numbers that make planning or a step's work grow with them: nothing a user writes may
# turn `lbctl plan` or a step into a hang.
MAX_RAMP_LEVELS = 10_000
MAX_ACCUMULATION = 65_536
MAX_TOTAL_SAMPLES = 10**15


class Rule(NamedTuple):
    """A cross-field rule: `cel` for the API server, `check` for Python, one `message` for both."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    got: Callable[[Any], str]
    field_path: str | None = None


class _Model(BaseModel):
    """Base for API objects: camelCase on the wire, unknown fields rejected, docstrings as descriptions.
    Types are checked as the API server checks them: no bool or numeric string for an integer, no float
    where an integer belongs, no NaN or infinity."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        strict=True,
        allow_inf_nan=False,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self, info: ValidationInfo) -> _Model:
        if info.context and info.context.get("skip_rules"):  # to compare the rules with their CEL
            return self
        for rule in type(self).rules:
            if not rule.check(self):
                raise ValueError(f"{rule.message} (got {rule.got(self)})")
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):  # noqa: ANN001 - pydantic hook
        schema = handler(core_schema)
        if cls.rules:
            target = handler.resolve_ref_schema(schema)
            target["x-kubernetes-validations"] = [
                {"rule": r.cel, "message": r.message} | ({"fieldPath": r.field_path} if r.field_path else {})
                for r in cls.rules
            ]
        return schema


def _sub(model: type[_Model]) -> Any:
    """A nested block that may be omitted: it then takes its own defaults. The CRD spells the defaults
    out in full: the API server checks the block's CEL rules against the default as written."""
    return Field(
        default_factory=model,
        json_schema_extra=lambda schema: schema.update(
            default=model().model_dump(mode="json", by_alias=True, exclude_none=True)
        ),
    )


# A Kubernetes resource quantity ("500m", "4Gi", 2).
Quantity = Annotated[int | str, WithJsonSchema({"x-kubernetes-int-or-string": True})]
# Free-form objects kept as written (task arguments, node affinity).
FreeForm = Annotated[dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})]


# --- task -----------------------------------------------------------------------------------------


class TaskSpec(_Model):
    """What to train: user code that returns the model, the dataset and the loss."""

    entrypoint: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", max_length=253)
    """Python callable as `module:callable`, for example `largebatch_trainer.tasks:pylm`."""
    args: FreeForm = Field(default_factory=dict)
    """Free-form keyword arguments passed to the entrypoint (model width, depth, data options)."""
    seed: int = Field(default=0, ge=0)
    """Seed of the model initialisation (the same on every rank) and of the sample order."""
    compile: bool = False
    """Compile the model with `torch.compile` (TorchInductor) before training: the first steps take the
    compilation, later ones run fused kernels. docs/trainer.md ("Accelerators and precision") lists
    where it does not combine with the rest."""


# --- workers --------------------------------------------------------------------------------------

# The accelerator whose jobs train in bf16 unless `spec.precision` says otherwise.
BF16_BY_DEFAULT = "nvidia.com/gpu"


class Toleration(_Model):
    """A pod toleration, as in `core/v1`."""

    key: str | None = None
    """Taint key the toleration applies to; empty with operator Exists matches every key."""
    operator: Literal["Exists", "Equal"] | None = None
    """`Equal` (default) compares `value`; `Exists` matches any value."""
    value: str | None = None
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """For NoExecute: how long the pod stays bound after the taint appears."""


class SecretName(_Model):
    """A Secret in the job's namespace, by name (a `core/v1` LocalObjectReference)."""

    name: str = Field(min_length=1, max_length=253)
    """The Secret's name."""


class PodOverrides(_Model):
    """Scheduling settings merged into every worker pod."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels a worker pod requires."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    """Tolerations added to every worker pod."""
    affinity: FreeForm | None = None
    """A `core/v1` Affinity for every worker pod (node, pod and anti-affinity)."""
    priority_class_name: str | None = Field(default=None, max_length=253)
    """PriorityClass of the worker pods."""
    image_pull_secrets: list[SecretName] = Field(default_factory=list, max_length=16)
    """Secrets for pulling `spec.image` from a private registry (worker and rendezvous pods)."""
    termination_grace_period_seconds: int = Field(default=60, ge=1, le=3600)
    """Seconds a worker has, once told to stop (a preemption, a suspend, a scale-down), to finish its step
    and write a checkpoint before it is killed: more than one step and one checkpoint of the model take
    (docs/operations.md, "Preemption")."""


class Resources(_Model):
    """Container resources of a worker, as in `core/v1` ResourceRequirements."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Resources the scheduler reserves, for example `cpu: 8`, `memory: 64Gi`."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Upper limits; the accelerator count is set from `devicesPerWorker` and needs no entry here."""


class WorkersSpec(_Model):
    """The elastic worker group: one pod (torchrun agent) per worker."""

    min: int = Field(default=1, ge=1, le=4096)
    """Fewest workers the job runs with; below this it waits."""
    max: int = Field(default=1, ge=1, le=4096)
    """Most workers the job may use; more workers lower the gradient accumulation."""
    devices_per_worker: int = Field(default=1, ge=1, le=64)
    """Processes (devices) per worker, `torchrun --nproc-per-node`."""
    accelerator: Literal["nvidia.com/gpu", "google.com/tpu", "none"] = "nvidia.com/gpu"
    """Extended resource requested per device, or `none` to train on CPU."""
    resources: Resources | None = None
    """Container resources of each worker besides the accelerator."""
    pod: PodOverrides = _sub(PodOverrides)
    """Scheduling overrides for the worker pods."""
    max_restarts: int = Field(default=3, ge=0, le=1000)
    """Worker pods replaced after they failed or were lost (torchrun's own restarts inside a pod do not
    count); one more failure and the job is Failed."""

    rules = (
        Rule(
            "self.min <= self.max",
            "workers.min must be <= workers.max: raise workers.max or lower workers.min",
            lambda s: s.min <= s.max,
            lambda s: f"min={s.min}, max={s.max}",
            ".min",
        ),
    )


# --- batch ----------------------------------------------------------------------------------------

# Defaults chosen with benchmarks/time_to_target.py (benchmarks/README.md).
# criticalBatch.multiplier by optimizer.scaling: under the square-root rule a batch grown to the noise scale
# lost held-out loss, and half of it held (`none` grows the LR even less, so it gets sqrt's, unmeasured).
CRITICAL_MULTIPLIER_DEFAULT = {"linear": 1.0, "sqrt": 0.5, "none": 0.5}
# Seesaw's cap, under every rule: its cuts set the LR whatever the rule, and at half the noise scale it saved
# 13% of the steps where at 1 it saved 30%, both holding constant batch's loss (benchmarks/README.md).
SEESAW_CAP_MULTIPLIER_DEFAULT = 1.0
CRITICAL_SMOOTHING_DEFAULT = 0.95
CRITICAL_MIN_STEPS_DEFAULT = 300
CAP_AT_CRITICAL_BATCH_DEFAULT = True
PRECONDITIONED_OPTIMIZERS = ("adamw", "lamb")


class SeesawSpec(_Model):
    """Seesaw (arXiv 2510.14717): where the decay would cut the LR by `factor`, cut it by sqrt(factor)
    and multiply the batch by `batchFactor` instead."""

    factor: float = Field(default=2.0, gt=1.0, le=16.0)
    """LR decay step that triggers a cut (alpha): a cut happens each time the base decay falls by it."""
    batch_factor: float | None = Field(default=None, gt=1.0, le=16.0)
    """Batch growth per cut (beta); defaults to `factor`. Must not exceed `factor` (stability needs
    LR factor sqrt(alpha) >= sqrt(beta))."""
    cap_at_critical_batch: bool = CAP_AT_CRITICAL_BATCH_DEFAULT
    """Grow the batch at a cut only while it stays at or below the critical batch (`criticalBatch.multiplier`,
    default 1 under every LR rule, x the measured gradient noise scale, with `criticalBatch.estimator`); a
    cut that would pass it cuts the LR by the full `factor`, as the base schedule would. Seesaw's
    equivalence with the decay holds only below the critical batch. Until the noise scale is measured
    (and at batch 1, where it cannot be), cuts grow the batch."""

    rules = (
        Rule(
            "!has(self.batchFactor) || self.batchFactor <= self.factor",
            "seesaw.batchFactor must be <= seesaw.factor: a faster batch ramp is past the Seesaw stability "
            "limit (LR factor sqrt(factor) must be >= sqrt(batchFactor)); lower batchFactor",
            lambda s: s.batch_factor is None or s.batch_factor <= s.factor,
            lambda s: f"batchFactor={s.batch_factor}, factor={s.factor}",
            ".batchFactor",
        ),
    )

    @property
    def growth(self) -> float:
        return self.batch_factor if self.batch_factor is not None else self.factor


class LinearRampSpec(_Model):
    """Megatron-style ramp: the batch grows from `batch.initial` by `increment` up to `batch.max`,
    evenly over the first `rampSamples` samples."""

    increment: int = Field(ge=1)
    """Samples added to the global batch at each ramp step."""
    ramp_samples: int = Field(ge=1)
    """Samples over which the batch ramps from initial to max."""


class CriticalBatchSpec(_Model):
    """Follow the critical batch size: the batch grows by `growthFactor` whenever `multiplier` x the
    measured gradient noise scale (McCandlish et al. 2018) allows it, never down. Also the critical
    batch that `seesaw.capAtCriticalBatch` holds Seesaw to."""

    multiplier: float | None = Field(default=None, gt=0.0, le=100.0)
    """Target batch as a multiple of the smoothed gradient noise scale. Default: 1 under the linear LR rule,
    0.5 under `sqrt` and `none`, where the LR grows less than the batch and a batch grown to the noise
    scale itself lost held-out loss (benchmarks/README.md). Seesaw's cap defaults to 1 under every rule: after
    `batch.initial` its cuts, not the rule, set the LR."""
    growth_factor: float = Field(default=2.0, gt=1.0, le=16.0)
    """The batch is `batch.initial` times a power of this factor and grows one power at a time."""
    smoothing: float = Field(default=CRITICAL_SMOOTHING_DEFAULT, ge=0.0, lt=1.0)
    """EMA coefficient for the noise-scale estimates (higher is smoother)."""
    min_steps_between_changes: int = Field(default=CRITICAL_MIN_STEPS_DEFAULT, ge=1)
    """Optimizer steps that must pass between two batch changes."""
    estimator: Literal["simple", "preconditioned"] = "simple"
    """`simple`: B_simple = tr(Σ)/|G|² on the raw gradients. `preconditioned` (`adamw`, `lamb`): the same
    on gradients scaled by the optimizer's preconditioner 1/(sqrt(v̂) + eps), the noise an Adam-family
    step sees (Pollux). `simple` is the default for every optimizer: on a language model the
    preconditioned estimate is ruled by rarely updated coordinates (embedding rows of rare tokens, v̂
    near 0) and sent the batch to its maximum within a few hundred steps (benchmarks/README.md)."""
    measure_every_steps: int = Field(default=1, ge=1, le=10_000)
    """When a job runs on one worker whose whole batch is one micro-batch (no two small batches to
    compare), every this many steps that micro-batch runs as two halves to measure the noise scale, for
    the policies that read it. With several micro-batches or ranks every step measures at no cost."""


class PolicySpec(_Model):
    """How the global batch changes during training."""

    type: Literal["constant", "linearRamp", "seesaw", "criticalBatch"] = "constant"
    """The batch policy; its settings block of the same name applies."""
    seesaw: SeesawSpec = _sub(SeesawSpec)
    """Settings of the `seesaw` policy."""
    linear_ramp: LinearRampSpec | None = None
    """Settings of the `linearRamp` policy (required for it)."""
    critical_batch: CriticalBatchSpec = _sub(CriticalBatchSpec)
    """Settings of the `criticalBatch` policy."""

    rules = (
        Rule(
            "self.type != 'linearRamp' || has(self.linearRamp)",
            "batch.policy.linearRamp is required when batch.policy.type is linearRamp: "
            "add linearRamp.increment and linearRamp.rampSamples",
            lambda s: s.type != "linearRamp" or s.linear_ramp is not None,
            lambda s: f"type={s.type}, linearRamp missing",
        ),
    )


class BatchSpec(_Model):
    """Global batch, in samples, and how it changes."""

    initial: int = Field(ge=1)
    """Global batch at the start of training."""
    max: int = Field(ge=1)
    """Largest global batch the policy may reach."""
    micro_batch_per_device: int = Field(ge=1)
    """Largest micro-batch one device holds; gradient accumulation covers the rest."""
    bn_batch: int | None = Field(default=None, ge=1)
    """Samples per BatchNorm batch (Goyal et al.'s n): every micro-batch holds exactly this many samples,
    whatever the world size and accumulation, so the BN statistics of a step do not depend on how many
    workers run it. The batch policy keeps every batch a multiple of it (rounding down). Unset: the
    micro-batch follows microBatchPerDevice and the split."""
    policy: PolicySpec = _sub(PolicySpec)
    """The batch policy."""

    rules = (
        Rule(
            "self.initial <= self.max",
            "batch.initial must be <= batch.max: raise batch.max or lower batch.initial",
            lambda s: s.initial <= s.max,
            lambda s: f"initial={s.initial}, max={s.max}",
            ".initial",
        ),
        Rule(
            "self.policy.type != 'linearRamp' || !has(self.policy.linearRamp) || "
            "(self.max - self.initial) % self.policy.linearRamp.increment == 0",
            "batch.max - batch.initial must be a multiple of batch.policy.linearRamp.increment: "
            "pick an increment that divides the difference",
            lambda s: (
                s.policy.type != "linearRamp"
                or s.policy.linear_ramp is None
                or (s.max - s.initial) % s.policy.linear_ramp.increment == 0
            ),
            lambda s: (
                f"max-initial={s.max - s.initial}, "
                f"increment={s.policy.linear_ramp.increment if s.policy.linear_ramp else None}"
            ),
            ".policy.linearRamp.increment",
        ),
        Rule(
            "self.policy.type != 'linearRamp' || !has(self.policy.linearRamp) || "
            f"(self.max - self.initial) / self.policy.linearRamp.increment <= {MAX_RAMP_LEVELS}",
            f"batch.policy.linearRamp makes at most {MAX_RAMP_LEVELS:,} batch increases: raise linearRamp.increment",
            lambda s: (
                s.policy.type != "linearRamp"
                or s.policy.linear_ramp is None
                or (s.max - s.initial) // s.policy.linear_ramp.increment <= MAX_RAMP_LEVELS
            ),
            lambda s: (
                f"levels={(s.max - s.initial) // s.policy.linear_ramp.increment if s.policy.linear_ramp else 0:,}"
            ),
            ".policy.linearRamp.increment",
        ),
        Rule(
            f"self.max <= self.microBatchPerDevice * {MAX_ACCUMULATION}",
            f"batch.max must be <= batch.microBatchPerDevice x {MAX_ACCUMULATION:,} (the most gradient "
            "accumulation steps one device may take): raise microBatchPerDevice",
            lambda s: s.max <= s.micro_batch_per_device * MAX_ACCUMULATION,
            lambda s: f"max={s.max:,}, microBatchPerDevice={s.micro_batch_per_device:,}",
            ".max",
        ),
        Rule(
            "!has(self.bnBatch) || (self.initial % self.bnBatch == 0 && self.max % self.bnBatch == 0)",
            "batch.initial and batch.max must be multiples of batch.bnBatch (every micro-batch holds exactly "
            "bnBatch samples): round them to a multiple or pick a bnBatch that divides both",
            lambda s: s.bn_batch is None or (s.initial % s.bn_batch == 0 and s.max % s.bn_batch == 0),
            lambda s: f"initial={s.initial}, max={s.max}, bnBatch={s.bn_batch}",
            ".bnBatch",
        ),
        Rule(
            "!has(self.bnBatch) || self.microBatchPerDevice >= self.bnBatch",
            "batch.microBatchPerDevice must be >= batch.bnBatch (one BN batch is one micro-batch on one "
            "device): raise microBatchPerDevice or lower bnBatch",
            lambda s: s.bn_batch is None or s.micro_batch_per_device >= s.bn_batch,
            lambda s: f"microBatchPerDevice={s.micro_batch_per_device}, bnBatch={s.bn_batch}",
            ".microBatchPerDevice",
        ),
        Rule(
            f"!has(self.bnBatch) || self.max <= self.bnBatch * {MAX_ACCUMULATION}",
            f"batch.max must be <= batch.bnBatch x {MAX_ACCUMULATION:,} (with bnBatch every micro-batch holds "
            "bnBatch samples, and one device takes at most that many accumulation steps): raise bnBatch",
            lambda s: s.bn_batch is None or s.max <= s.bn_batch * MAX_ACCUMULATION,
            lambda s: f"max={s.max:,}, bnBatch={s.bn_batch}",
            ".max",
        ),
        Rule(
            "!has(self.bnBatch) || self.policy.type != 'linearRamp' || !has(self.policy.linearRamp) || "
            "self.policy.linearRamp.increment % self.bnBatch == 0",
            "batch.policy.linearRamp.increment must be a multiple of batch.bnBatch (every batch of the ramp "
            "is then one): pick an increment that bnBatch divides",
            lambda s: (
                s.bn_batch is None
                or s.policy.type != "linearRamp"
                or s.policy.linear_ramp is None
                or s.policy.linear_ramp.increment % s.bn_batch == 0
            ),
            lambda s: (
                f"increment={s.policy.linear_ramp.increment if s.policy.linear_ramp else None}, bnBatch={s.bn_batch}"
            ),
            ".policy.linearRamp.increment",
        ),
        Rule(
            "!has(self.bnBatch) || self.policy.type != 'criticalBatch' || self.initial >= 2 * self.bnBatch",
            "batch.policy.type criticalBatch with batch.bnBatch needs batch.initial >= 2 x bnBatch: the "
            "gradient noise scale is measured from two BN batches a step, and a BN batch is never split",
            lambda s: s.bn_batch is None or s.policy.type != "criticalBatch" or s.initial >= 2 * s.bn_batch,
            lambda s: f"initial={s.initial}, bnBatch={s.bn_batch}",
            ".initial",
        ),
    )

    @property
    def micro_batch(self) -> int:
        """The most samples one micro-batch holds: bnBatch when set, else microBatchPerDevice."""
        return self.bn_batch or self.micro_batch_per_device


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


class CheckpointSpec(_Model):
    """Where and how often the trainer checkpoints; every restart resumes from the newest one."""

    path: str = Field(default="/var/lib/largebatch/checkpoints", min_length=1, max_length=1024)
    """Directory of the checkpoints (shared by all workers)."""
    claim_name: str | None = Field(default=None, max_length=253)
    """PersistentVolumeClaim mounted at `path` in every worker pod (Kubernetes only)."""
    every_steps: int = Field(default=200, ge=1)
    """Optimizer steps between checkpoints (one is also taken on SIGTERM)."""
    keep: int = Field(default=2, ge=1, le=100)
    """Newest checkpoints kept; older ones are deleted."""


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
    )  # fmt: skip
    """What else the workers read from the job file the operator writes when the job starts (its
    ConfigMap, written once: a rewritten file would reach a running round's ranks at different moments,
    so ranks of one round could train under different settings). The API server refuses to change
    these on an existing job rather than accept an edit that never reaches the workers."""

    rules = (
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


class LargeBatchJobStatus(_Model):
    """Observed state of a LargeBatchJob; the operator's memory across restarts."""

    phase: Literal["Pending", "Running", "Scaling", "Suspended", "Succeeded", "Failed"] | None = None
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


class ObjectMeta(BaseModel):
    """The metadata a job file needs; everything else in it is kept as written."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str | None = None


class LargeBatchJob(_Model):
    """A LargeBatchJob manifest as written in a job file."""

    api_version: Literal["largebatch.io/v1alpha1"]
    kind: Literal["LargeBatchJob"]
    metadata: ObjectMeta
    spec: LargeBatchJobSpec
    status: LargeBatchJobStatus | None = None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> LargeBatchJob:
        """A job as the API server returns it: its spec, name and namespace (the status and the
        server-side metadata are the operator's and the API server's, not the user's)."""
        meta = {"name": obj["metadata"]["name"], "namespace": obj["metadata"].get("namespace")}
        return cls.model_validate({k: v for k, v in obj.items() if k != "status"} | {"metadata": meta})

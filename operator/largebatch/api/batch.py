"""The batch block: the global batch, its bounds and the policy that grows it (Seesaw, linear ramp,
critical batch)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from largebatch.api.base import (
    MAX_ACCUMULATION,
    MAX_RAMP_LEVELS,
    Rule,
    _Model,
    _sub,
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

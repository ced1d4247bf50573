"""Optimizers: SGD with momentum and AdamW from torch, LAMB and LARS from pytorch-optimizer.

Bias and normalisation parameters (every parameter with fewer than two dimensions) get no weight decay
and, for LAMB and LARS, no trust ratio, as the LAMB and LARS papers do.

Momentum and the LR (Goyal et al. 2017): when the LR changes from η_t to η_{t+1}, a momentum buffer kept
in LR-scaled form (u ← m u + η g) needs the correction u ← u η_{t+1}/η_t. All four optimizers here keep
their buffers in gradient form (v ← m v + g, step η v; Adam moments are gradient statistics) and apply
the LR afterwards, which is exactly the corrected update, so no correction is applied;
`MOMENTUM_FORM` records this and `tests/unit/test_optim.py` measures it.

LAMB (You et al. 2020) as in the paper's algorithm: Adam moments with bias correction of both moments,
weight decay inside the update r = m̂/(√v̂ + ε) + λw, trust ratio φ(‖w‖)/‖r‖ with φ(z) = min(z, 10).
pytorch-optimizer's `Lamb` corrects neither moment inside r; since the trust ratio makes the update
invariant to the scale of r, giving it ε√(1−β₂ᵗ) and λ(1−β₁ᵗ)/√(1−β₂ᵗ) each step yields the paper's
update (and the plain-Adam groups get the bias-corrected step size). `set_lr` does this. Two
differences remain, both the library's: its trust ratio divides by ‖r‖ + ε(1−β₂ᵗ)/(1−β₁ᵗ) in the
paper's units (negligible beside ‖r‖), and a weight with zero norm gets a trust ratio of 1, as the
reference implementations do, where the paper's φ(0) = 0 would never move it (that one step is then
the paper's r times (1−β₁ᵗ)/√(1−β₂ᵗ); docs/trainer.md).

Moments that follow the batch (`optimizer.moments: perSample`): the betas change from step to step, and a
moment's weights then sum to 1 − Πβ over the steps taken, not 1 − βᵗ. `set_lr` keeps that product per
group and corrects both optimizers' steps to it, through the LR, ε and weight decay it hands them.

μP (a model whose parameters carry mup's `infshape`, from `mup.set_base_shapes`): each group gets μP's
learning-rate multiplier, kept as `lr_scale` because `set_lr` sets every group's LR each step. The rule
is mup's own: `MuAdam`'s for the entrywise-normalised optimizers (AdamW, and LAMB, whose direction is
Adam's), `MuSGD`'s for the SGD-like ones (SGD, and LARS, whose direction is SGD's), as mup documents for
optimizers of either kind; weight decay is scaled the other way, as mup does, so a decoupled decay's
lr × λ is what it was at the base width.

`fused`: torch's fused kernels for SGD and AdamW (one kernel launch for all parameters), which the
trainer asks for on CUDA; pytorch-optimizer's LAMB and LARS have none and run as they are.

Sharded parameters (DTensors, `largebatch_trainer.sharding`): torch's SGD and AdamW step each rank's shard
as they are, being elementwise. LAMB's and LARS's trust ratios need each weight's whole norm: the
library takes it with `torch.linalg.norm`, which on a shard gives a partial norm that its in-place clamp
refuses. `_whole_norms` answers those calls, during their step only, with the whole tensor's norm (the
shards' squared norms summed across the shard group in one all-reduce per tensor), replicated on every
rank; the library's batched (`foreach`) path, which DTensor does not support, is turned off for them.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from mup.optim import MuAdam, MuSGD
from torch.distributed.tensor import DTensor, Replicate

from largebatch.api import OptimizerSpec

MOMENTUM_FORM = {"sgd": "gradient", "adamw": "gradient", "lamb": "gradient", "lars": "gradient"}
# Which of mup's per-layer rules each optimizer follows under μP (docs/trainer.md says why).
MUP_RULE = {"sgd": MuSGD, "adamw": MuAdam, "lamb": MuAdam, "lars": MuSGD}


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, exempt = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else exempt).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "adam": False},
        {"params": exempt, "weight_decay": 0.0, "adam": True},
    ]


def build(spec: OptimizerSpec, model: torch.nn.Module, fused: bool = False) -> torch.optim.Optimizer:
    groups = parameter_groups(model, spec.weight_decay)
    if is_mup(model):
        groups = mup_groups(spec.name, groups)
    betas = tuple(spec.betas)
    kernels = {"fused": True} if fused else {}  # unset: torch's own default (foreach on CUDA)
    if spec.name == "sgd":
        optimizer = torch.optim.SGD(_plain(groups), lr=spec.lr, momentum=spec.momentum, **kernels)
    elif spec.name == "adamw":
        optimizer = torch.optim.AdamW(_plain(groups), lr=spec.lr, betas=betas, eps=spec.eps, **kernels)
    elif spec.name == "lamb":
        # Imported only here: pytorch-optimizer imports transformers, a second of CPU at every agent's start.
        from pytorch_optimizer import Lamb

        # weight_decouple=False puts λw inside r (the paper); adam_debias=True leaves the step size alone.
        optimizer = Lamb(groups, lr=spec.lr, betas=betas, eps=spec.eps, weight_decouple=False, adam_debias=True)
    else:  # lars: the library itself skips 1-D parameters for decay and trust ratio
        from pytorch_optimizer import LARS  # only here, as Lamb

        optimizer = LARS(_plain(groups), lr=spec.lr, momentum=spec.momentum, trust_coefficient=spec.trust_coefficient)
    for group in optimizer.param_groups:
        group["base_weight_decay"], group["base_eps"] = group["weight_decay"], group.get("eps")
    if spec.name in ("lamb", "lars") and any(isinstance(p, DTensor) for p in model.parameters()):
        _with_whole_norms(optimizer)
    return optimizer


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> None:
    """Scale the step's gradient down to `max_norm` when its global norm is larger. A sharded model's
    gradients are DTensors: their norm is taken over every shard (the ranks' squares summed)."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)


def _with_whole_norms(optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's layer-wise norms of sharded tensors taken over the whole tensor (module docstring)."""
    for group in optimizer.param_groups:
        group["foreach"] = False
    step = optimizer.step

    def step_with_whole_norms(*args, **kwargs):
        with _whole_norms():
            return step(*args, **kwargs)

    optimizer.step = step_with_whole_norms


@contextlib.contextmanager
def _whole_norms():
    norm = torch.linalg.norm

    def whole(tensor, *args, **kwargs):
        if not isinstance(tensor, DTensor) or args or kwargs:
            return norm(tensor, *args, **kwargs)
        squared = norm(tensor.to_local()).square()
        mesh = tensor.device_mesh
        for dim, placement in enumerate(tensor.placements):
            if placement.is_shard():
                dist.all_reduce(squared, group=mesh.get_group(dim))
        return DTensor.from_local(squared.sqrt(), mesh, [Replicate()] * mesh.ndim, run_check=False)

    torch.linalg.norm = whole
    try:
        yield
    finally:
        torch.linalg.norm = norm


def is_mup(model: torch.nn.Module) -> bool:
    return any(hasattr(p, "infshape") for p in model.parameters())


def mup_groups(name: str, groups: list[dict]) -> list[dict]:
    """`groups` split by μP's per-layer rule for optimizer `name`, each with its `lr_scale`. mup's
    optimizers hand their groups to the optimizer class they are given: here to one that returns them."""
    split = MUP_RULE[name](groups, impl=lambda new_groups, **_: new_groups, lr=1.0)
    for group in split:
        group["lr_scale"] = group.pop("lr")
    return [group for group in split if group["params"]]


def layout(param_groups: list[dict]) -> list[tuple[int, float]]:
    """Each group's parameter count and μP LR scale: what an optimizer state must match to be loaded.
    torch checks only the counts, and would take a checkpoint's LR scales for this model's groups."""
    return [(len(g["params"]), g.get("lr_scale", 1.0)) for g in param_groups]


def _plain(groups: list[dict]) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "adam"} for g in groups]


def set_lr(
    optimizer: torch.optim.Optimizer,
    lr: float,
    betas: tuple[float, float] | None = None,
    eps: float | None = None,
) -> None:
    """Set the coefficients of the step `optimizer` takes next: the LR, and for AdamW and LAMB the moments'
    betas and eps (unchanged where None) with the bias corrections they imply. Call it once per step,
    right before the step: it counts the steps."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
        if "betas" not in group:  # SGD, LARS
            continue
        right1, right2 = _advance_moments(optimizer, group, betas)
        if eps is not None:
            group["base_eps"] = eps
        if isinstance(optimizer, torch.optim.AdamW):  # corrects by 1 - beta**t, right while the betas hold
            t, (beta1, beta2) = group["moment_steps"], group["betas"]
            applied1, applied2 = 1 - beta1**t, 1 - beta2**t
        else:  # pytorch-optimizer's Lamb, the other optimizer with moments, corrects neither
            applied1 = applied2 = 1.0
        # The step torch takes, lr m/applied1 / (sqrt(v/applied2) + eps), becomes the one the moments call
        # for, lr m/right1 / (sqrt(v/right2) + eps), with lr x s and eps x sqrt(right2/applied2); weight
        # decay over s keeps lr x weight decay (AdamW's decay) or weight decay/s (LAMB's, inside r).
        s = applied1 / right1 * math.sqrt(right2 / applied2)
        group["eps"] = group["base_eps"] * math.sqrt(right2 / applied2)
        group["weight_decay"] = group["base_weight_decay"] / s
        if group.get("adam", True):  # LAMB's trust-ratio groups are invariant to the scale of r
            group["lr"] *= s


def _advance_moments(optimizer: torch.optim.Optimizer, group: dict, betas: tuple[float, float] | None):
    """Count the coming step into the group's moment state and return the bias corrections of both moments
    after it: 1 - the product of every step's beta, as the moments' weights sum to that when the betas
    change. `moment_steps` and `moment_products` travel in the optimizer's checkpoint; a checkpoint
    without them took all its steps at the betas it holds. They are counted per group: a parameter that
    had no gradient at some step (torch then skips it) is corrected as if it had taken every step."""
    if "moment_products" not in group:
        taken = _steps_taken(optimizer, group)
        group["moment_steps"] = taken
        group["moment_products"] = [beta**taken for beta in group["betas"]]
    if betas is not None:
        group["betas"] = tuple(betas)
    group["moment_steps"] += 1
    group["moment_products"] = [p * beta for p, beta in zip(group["moment_products"], group["betas"], strict=True)]
    return 1 - group["moment_products"][0], 1 - group["moment_products"][1]


def _steps_taken(optimizer: torch.optim.Optimizer, group: dict) -> int:
    """Steps the group has taken: LAMB counts them per group, torch's AdamW per parameter (read once)."""
    if "step" in group:
        return int(group["step"])
    state = next((optimizer.state[p] for p in group["params"] if "step" in optimizer.state.get(p, {})), None)
    return 0 if state is None else int(state["step"])

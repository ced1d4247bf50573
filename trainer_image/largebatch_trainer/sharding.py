"""Sharded data parallel (`parallelism.dataParallel: shard | hybrid`): the model under FSDP2's
`fully_shard`, each of the task's blocks one unit (gathered only while it computes), over a device mesh
of every rank (`shard`) or of the ranks of one worker pod, replicated across pods (`hybrid`, HSDP).

Three settings make it train what `replicate` trains. The gradient is summed, not averaged (divide factor
1, and plain SUM collectives: the loss is already divided by the global batch). The reduce-scatter is
`_MeasuringReduceScatter`, which takes the squared norm of what each rank hands to it, the rank's own
gradient before any reduction: the small-batch norm the gradient noise scale needs, as DDP's
communication hook takes it in `largebatch_trainer.reduction`. And the gradient is reduce-scattered after
every micro-batch (not held unsharded until the last one, which would cost a whole model's gradient on
each rank, the memory sharding exists to save): the noise scale's small batches are then each rank's
micro-batches, as on a single worker with accumulation.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
from torch.distributed.tensor import DTensor

from largebatch.errors import SetupError
from largebatch_trainer import noise
from largebatch_trainer.distributed import DistEnv
from largebatch_trainer.tasks import Task


class Norms:
    """The step's small-batch norms, measured inside every unit's reduce-scatter (`_MeasuringReduceScatter`)
    and read after each micro-batch's backward pass (`take`), kept on the training device: reading them on
    the host would synchronise inside the backward pass.

    `local_sq`: |g|² of this rank's own unreduced gradient, times `scale`, the micro-batch's (batch/samples)²
    (0 for a rank's empty micro-batch). With the preconditioned estimator (`weights`,
    Adam's P = 1/(√v̂ + ε) of each parameter's shard, by `id` of the sharded parameter), a rank holds P for
    its shard only, so it cannot weight its whole gradient: each unit's squared gradient, times this
    micro-batch's (batch/samples)², is reduce-scattered too, and each rank weights the sum it receives
    with its P². Summed over the ranks (the step's all-reduce), that is Σ over the ranks' micro-batches of
    |P ⊙ g|² at the global batch's scale, what the replicated path measures: one more reduce-scatter of
    the gradient's size, on measuring steps only."""

    def __init__(self, device: torch.device):
        self.local_sq = torch.zeros((), dtype=torch.float64, device=device)
        self.weighted_sq = torch.zeros((), dtype=torch.float64, device=device)
        self.weights: dict[int, torch.Tensor] | None = None
        self.scale = 1.0

    def reset(self, weights: dict[int, torch.Tensor] | None) -> None:
        self.weights = weights

    def take(self) -> torch.Tensor:
        """Since the last `take`: this rank's |g|² (batch/n)², or (preconditioned) its part of the ranks'
        Σ |P ⊙ g|² (batch/n)²."""
        measured = self.weighted_sq if self.weights is not None else self.local_sq
        taken = measured.clone()
        self.local_sq.zero_()
        self.weighted_sq.zero_()
        return taken


class _MeasuringReduceScatter(DefaultReduceScatter):
    """FSDP2's own reduce-scatter of one unit, after measuring its input (this rank's unreduced gradient
    of the unit, each parameter's rows padded and cut into one piece a rank) into `norms`. `layout`: the
    unit's parameters in the order of the pieces, with the padded and the real size of their shards."""

    def __init__(self, norms: Norms, layout: list[tuple[torch.Tensor, int, int]]):
        self.norms, self.layout = norms, layout

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        norms = self.norms
        norms.local_sq += torch.linalg.vector_norm(input_tensor.float()).double().square() * norms.scale
        if norms.weights is not None:
            squares = torch.empty(output_tensor.numel(), dtype=torch.float32, device=output_tensor.device)
            dist.reduce_scatter_tensor(squares, input_tensor.float().square().mul_(norms.scale), group=group)
            offset = 0
            for param, padded, real in self.layout:
                shard = squares[offset : offset + real]
                weight = norms.weights.get(id(param))
                norms.weighted_sq += (shard if weight is None else shard * weight.reshape(-1).square()).sum().double()
                offset += padded
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


def device_mesh(mode: str, env: DistEnv, device: torch.device) -> DeviceMesh:
    """The mesh `fully_shard` shards over: every rank, or (hybrid) pods × each pod's ranks. torchrun numbers
    the ranks of one agent consecutively, so a pod's ranks are one row of the mesh."""
    if mode == "shard":
        return init_device_mesh(device.type, (env.world_size,), mesh_dim_names=("shard",))
    local = env.local_world_size
    if local < 2 or env.world_size % local:
        raise SetupError(
            f"parallelism.dataParallel hybrid shards within a pod's ranks, and this one has {local} of a world of "
            f"{env.world_size}: set workers.devicesPerWorker >= 2, or use shard"
        )
    return init_device_mesh(device.type, (env.world_size // local, local), mesh_dim_names=("replicate", "shard"))


def replicas(mesh: DeviceMesh) -> int:
    """How many ranks hold each shard: the size of the replicated dimension (1 without one)."""
    return mesh["replicate"].size() if "replicate" in (mesh.mesh_dim_names or ()) else 1


def shard(
    module: torch.nn.Module, task: Task, mesh: DeviceMesh, precision: str, all_reduce: str, compile: bool = False
) -> Norms:
    """Shard `module` in place: each of the task's units, then the rest as the root unit (with `compile`,
    each unit compiled on its own, so that its all-gather and reduce-scatter stay outside the graphs).
    Returns the reduce-scatter that measures the step's local squared norms."""
    shapes = _freeze_mup(module)
    policy = MixedPrecisionPolicy()
    if precision == "bf16" and mesh.device_type == "cuda":
        # bf16 parameters while computing, fp32 gradients into the reduction (or bf16 where the job asks).
        reduce = torch.bfloat16 if all_reduce == "bf16" else torch.float32
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
    units = task.shard_units(module) if task.shard_units else []
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
        if compile:
            unit.compile()
    fully_shard(module, mesh=mesh, mp_policy=policy)
    for name, p in module.named_parameters():
        if name in shapes:
            p.infshape = shapes[name]
    norms = Norms(next(module.parameters()).device)
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)  # FSDP2 averages by default; the loss is already /batch
            unit.set_force_sum_reduction_for_comms(True)  # SUM, not PREMUL_SUM (which gloo lacks)
            unit.set_custom_reduce_scatter(_MeasuringReduceScatter(norms, _layout(unit)))
    return norms


def _layout(unit: FSDPModule) -> list[tuple[torch.Tensor, int, int]]:
    """How FSDP2 lays a unit's parameters out in its reduce-scatter (torch's `foreach_reduce`, read from
    its private state: no public API says it): one after another, each its padded shard's size, its own
    shard first in it."""
    group = unit._get_fsdp_state()._fsdp_param_group  # noqa: SLF001
    if group is None:
        return []
    return [
        (param.sharded_param, param.padded_sharded_param_size.numel(), param.sharded_size.numel())
        for param in group.fsdp_params
    ]


def local_squared_norm(params: list[torch.Tensor], weights: dict[int, torch.Tensor] | None) -> torch.Tensor:
    """Σ of this rank's shards' squared gradient norms (float64), each weighted by its P when `weights` are
    given; summed over the ranks and divided by `replicas`, it is |G|² (|P ⊙ G|²) of the whole gradient."""
    shards = [p.grad.to_local() for p in params if p.grad is not None]
    if weights is not None:
        shards = [g * weights[id(p)] if id(p) in weights else g for g, p in zip(shards, params, strict=True)]
    if not shards:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(torch._foreach_norm(shards)).double().square().sum()


def local_preconditioners(optimizer: torch.optim.Optimizer) -> dict[int, torch.Tensor] | None:
    """`noise.preconditioners` of the sharded parameters: each one's P on this rank's shard, by `id`."""
    weights = noise.preconditioners(optimizer, key=id)
    if weights is None:
        return None
    return {key: value.to_local() if isinstance(value, DTensor) else value for key, value in weights.items()}


def _freeze_mup(module: torch.nn.Module) -> dict[str, object]:
    """μP survives sharding: `fully_shard` replaces every parameter by a new (DTensor) one, so the
    `infshape` mup's `set_base_shapes` put on each (the optimizer's per-layer LR reads it) is returned by
    name for `shard` to put back, and a readout's width multiplier, which mup reads from its weight in
    every forward pass (where FSDP hands it the gathered weight, without one), is fixed to its value now."""
    shapes = {name: p.infshape for name, p in module.named_parameters() if hasattr(p, "infshape")}
    for unit in module.modules():
        if hasattr(unit, "width_mult") and hasattr(getattr(unit, "weight", None), "infshape"):
            unit.width_mult = functools.partial(float, unit.width_mult())
    return shapes


def checkpoint_group() -> dist.ProcessGroup | None:
    """A gloo group of every rank for the asynchronous checkpoint's collectives, which run on a thread of
    their own: on the training group they could interleave with the step's."""
    return dist.new_group(backend="gloo") if dist.is_initialized() else None

"""The step's collectives: the model under DDP with a communication hook that sums each gradient bucket
and measures its squared norm before and after (what the gradient noise scale needs, without another
pass over the gradients), and `StepStats`, everything else a step sums over the ranks, packed into one
all-reduce."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from largebatch_trainer import accelerator, noise


@dataclass
class StepStats:
    """What each rank adds to the step's one all-reduce, which sums it over the ranks: the loss, the
    small-batch statistics of the noise scale, the stop flag and the samples run. `pack` lays the fields
    out in one float64 tensor, so that they all travel in one collective, and `unpack` reads the sums."""

    loss_sum: torch.Tensor | float = 0.0  # Σ per-sample loss, not yet divided by the global batch
    small_sq: torch.Tensor | float = 0.0  # Σ |G_small|², each small batch's gradient at the global batch's scale
    inverse_sizes: float = 0.0  # Σ 1/B_small: B_small is their harmonic mean, unbiased for uneven ranks
    smalls: float = 0.0  # the number of small batches
    stop: float = 0.0  # ranks that SIGTERM/SIGINT asked to stop
    samples: float = 0.0  # samples run
    shard_sq: torch.Tensor | float = 0.0  # sharded: Σ |this rank's shard of G|², for |G|² (`sharding`)

    def pack(self, device: torch.device) -> torch.Tensor:
        fields = dataclasses.fields(self)
        packed = torch.zeros(len(fields), dtype=torch.float64, device=device)
        for i, field in enumerate(fields):
            value = getattr(self, field.name)
            if isinstance(value, torch.Tensor) or value:  # a zero is there already: no copy to the device
                packed[i] = value
        return packed

    @classmethod
    def unpack(cls, packed: torch.Tensor) -> StepStats:
        return cls(*packed.tolist())  # the step's one host synchronisation


class _Norms:
    """Squared norms of this step's local (pre-all-reduce) and global gradients, filled by the hook, with
    the preconditioner `weights` applied when the estimator is the preconditioned one."""

    def __init__(self, device: torch.device):
        # On the training device: reading them on the host would synchronise inside the backward pass.
        self.local_sq = torch.zeros((), dtype=torch.float64, device=device)
        self.global_sq = torch.zeros((), dtype=torch.float64, device=device)
        self.weights: dict[int, torch.Tensor] | None = None

    def reset(self, weights: dict[int, torch.Tensor] | None) -> None:
        self.local_sq.zero_()
        self.global_sq.zero_()
        self.weights = weights

    def squared(self, buffer: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        # A bf16 all-reduce hands over bf16 buckets: their norms are still taken in fp32, since the noise
        # scale is a small difference of two of them.
        buffer = buffer.float()
        if self.weights is None:
            return torch.linalg.vector_norm(buffer).double().square()
        # A bucket's buffer is its parameters' gradients flattened one after another.
        views = [v.view_as(p) for v, p in zip(buffer.split([p.numel() for p in params]), params, strict=True)]
        return noise.squared_norm(views, params, self.weights)


def _sum_hook(norms, bucket):  # unannotated: DDP checks real annotations, and this module's are strings
    """DDP communication hook: all-reduce each gradient bucket with SUM (the loss is already divided by
    the global batch) and record its squared norm before and after."""
    buffer, params = bucket.buffer(), bucket.parameters()
    norms.local_sq += norms.squared(buffer, params)

    def record(future):
        reduced = future.value()[0]
        norms.global_sq += norms.squared(reduced, params)
        return reduced

    return dist.all_reduce(buffer, async_op=True).get_future().then(record)


def data_parallel(
    module: torch.nn.Module, device: torch.device, all_reduce: str
) -> tuple[torch.nn.parallel.DistributedDataParallel, _Norms]:
    """`module` under DDP, its gradients summed by `_sum_hook` in the `all_reduce` dtype, and the norms
    the hook measures."""
    model = torch.nn.parallel.DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None
    )
    norms = _Norms(device)
    model.register_comm_hook(norms, accelerator.all_reduce_hook(_sum_hook, all_reduce))
    return model, norms

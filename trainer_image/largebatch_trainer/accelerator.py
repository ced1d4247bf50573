"""What the trainer does differently on an accelerator: the precision it computes in (bf16 autocast over
fp32 master weights, TF32 for the fp32 matmuls left), the dtype of the gradient all-reduce, and
counting the host synchronisations a piece of work makes (the communication hook must add none inside
the backward pass). docs/trainer.md, "Accelerators and precision", says what each choice costs.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_wrapper

from largebatch.api import LargeBatchJobSpec

# What torch's sync debug mode warns with (c10/cuda/CUDAFunctions.cpp, `warn_or_error_on_sync`).
SYNC_WARNING = "called a synchronizing CUDA operation"


def precision_on(spec: LargeBatchJobSpec, device: torch.device) -> str:
    """The precision this process computes in: the job's, or its default for the accelerator; a job
    without a precision of its own keeps fp32 on a CPU (a GPU job trained with `--device cpu`, or by
    `lbctl run --local` on a machine without CUDA), where bf16 autocast is slower and less exact."""
    if spec.precision is None and device.type == "cpu":
        return "fp32"
    return spec.resolved_precision


def configure(device: torch.device, precision: str) -> None:
    """TF32 matmuls (Ampere and newer) where bf16 was chosen: autocast leaves some matmuls in fp32, and
    a user who accepted bf16 has accepted their 10-bit mantissa too. fp32 stays IEEE fp32, whatever
    the process was set to before: the exactness tolerance (1e-5) is far below TF32's rounding."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high" if precision == "bf16" else "highest")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The forward pass's context: bf16 autocast, or nothing. The parameters stay fp32 either way, so
    gradients and optimizer state are fp32 too."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def all_reduce_hook(hook: Callable, dtype: str) -> Callable:
    """`hook` (a DDP communication hook), all-reducing in `dtype`: torch's own bf16 wrapper casts each
    bucket to bf16 before the hook and the result back into the fp32 gradients after it."""
    return hook if dtype == "fp32" else bf16_compress_wrapper(hook)


def count_host_syncs(work: Callable[[], object]) -> int:
    """How often `work` made the host wait for the CUDA device, as torch's sync debug mode counts it.
    The mode is process-wide and, as torch's docs warn, does not see every synchronising operation
    (not torch.distributed's); warnings raised in the autograd engine's device threads are replayed
    on the thread that called backward, so a backward pass is counted whole. CUDA only."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum(SYNC_WARNING in str(w.message) for w in caught)

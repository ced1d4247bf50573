"""The process's place in the elastic job, as torchrun describes it in the environment."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from largebatch.errors import SetupError


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # ranks of this process's agent (worker pod)
    restart_count: int = 0

    @classmethod
    def from_environ(cls) -> DistEnv:
        env = os.environ
        return cls(
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        )


def choose_device(accelerator: str, requested: str, local_rank: int) -> torch.device:
    """`requested` is auto (follow the job's accelerator), cpu or cuda."""
    if requested == "cpu" or (requested == "auto" and accelerator == "none"):
        return torch.device("cpu")
    if accelerator == "google.com/tpu" and requested == "auto":
        return _xla_device()
    if not torch.cuda.is_available():
        raise SetupError(
            f"workers.accelerator is {accelerator} but this process sees no CUDA device; "
            "pass --device cpu to train on the CPU"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _xla_device() -> torch.device:
    """The TPU core of this process, through torch_xla (untested here: no TPU). Without torch_xla the
    job is refused: training a TPU job on the host's CPU instead would look like a run and crawl."""
    try:
        import torch_xla.core.xla_model as xm
    except ImportError as exc:
        raise SetupError(
            f"workers.accelerator is google.com/tpu but torch_xla cannot be imported ({exc}): build the trainer "
            f"image with torch_xla[tpu] of the same version as torch ({torch.__version__.split('+')[0]}) and "
            'PJRT_DEVICE=TPU set (docs/trainer.md, "Accelerators and precision"), or pass --device cpu to '
            "train on the CPU"
        ) from None
    return xm.xla_device()


def init_process_group(env: DistEnv, device: torch.device, timeout_seconds: float) -> None:
    """`timeout_seconds`: the job's workers.collectiveTimeoutSeconds."""
    if env.world_size > 1:
        timeout = datetime.timedelta(seconds=timeout_seconds)
        if device.type == "xla":  # torch_xla's backend and its PJRT rendezvous (untested: no TPU)
            import torch_xla.distributed.xla_backend  # noqa: F401 - registers the backend

            dist.init_process_group("xla", init_method="xla://", timeout=timeout)
        else:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout)


def restarts_of_any_agent(own: int, device: torch.device) -> int:
    """The most worker-group restarts any agent of the job has made. Each agent counts its own: when
    one node's worker dies, its agent counts a restart, while a peer may see only a membership change
    and count none; rank 0 alone would then report no restart at all."""
    if not dist.is_initialized():
        return own
    count = torch.tensor([own], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())

"""The process's place in the elastic job, as torchrun describes it in the environment."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    restart_count: int = 0

    @classmethod
    def from_environ(cls) -> DistEnv:
        env = os.environ
        return cls(
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        )


def choose_device(accelerator: str, requested: str, local_rank: int) -> torch.device:
    """`requested` is auto (follow the job's accelerator), cpu or cuda."""
    if requested == "cpu" or (requested == "auto" and accelerator == "none"):
        return torch.device("cpu")
    if accelerator == "google.com/tpu" and requested == "auto":
        import torch_xla.core.xla_model as xm  # untested here: no TPU

        return xm.xla_device()
    if not torch.cuda.is_available():
        raise SystemExit(
            f"workers.accelerator is {accelerator} but this process sees no CUDA device; "
            "pass --device cpu to train on the CPU"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_process_group(env: DistEnv, device: torch.device) -> None:
    if env.world_size > 1:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))

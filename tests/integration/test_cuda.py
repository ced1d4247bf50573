"""On a CUDA device: the trainer's communication hook measures gradient norms without making the host
wait inside the backward pass (torch's sync debug mode counts the waits), in either all-reduce dtype and
with either noise-scale estimator, under NCCL, bf16 autocast and fused AdamW as the trainer runs on a GPU.

They need the device itself, so they are skipped where torch sees no CUDA device (the CI machine has
none); `benchmarks/gpu_throughput.py` reports the same counts on every GPU run."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from largebatch.api import OptimizerSpec
from largebatch_trainer import accelerator, noise, optim
from largebatch_trainer.data import to_device
from largebatch_trainer.reduction import data_parallel
from largebatch_trainer.tasks import load_task

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device: counts host synchronisations on the GPU (gpu_throughput.py does on a GPU run)",
    ),
]


@pytest.fixture
def device():
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    yield device
    dist.destroy_process_group()


def test_the_counter_sees_a_host_sync(device):
    assert accelerator.count_host_syncs(lambda: torch.ones(1, device=device).item()) == 1
    assert accelerator.count_host_syncs(lambda: torch.ones(1, device=device).add_(1)) == 0


@pytest.mark.parametrize("estimator", ["simple", "preconditioned"])
@pytest.mark.parametrize("all_reduce", ["fp32", "bf16"])
def test_the_comm_hook_adds_no_host_sync_to_the_backward_pass(device, all_reduce, estimator):
    task = load_task("largebatch_trainer.tasks:pylm", {"width": 128, "depth": 2, "heads": 4, "context": 64}, seed=0)
    module = task.model.to(device)
    optimizer = optim.build(OptimizerSpec(name="adamw", lr=1e-3), module, fused=True)
    model, norms = data_parallel(module, device, all_reduce)
    data = to_device(task.collate([task.dataset[i] for i in range(8)]), device)
    counts = []
    for _ in range(3):  # DDP rebuilds its buckets after the first pass
        norms.reset(noise.preconditioners(optimizer) if estimator == "preconditioned" else None)
        with accelerator.autocast(device, "bf16"):
            loss_sum, _ = task.loss(model, data)
        counts.append(accelerator.count_host_syncs(loss_sum.float().backward))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert counts[1:] == [0, 0]
    # One rank: the sum is the rank's own gradient, so the two norms agree.
    assert float(norms.local_sq) > 0
    torch.testing.assert_close(norms.global_sq, norms.local_sq)

"""The accelerator choices that a CPU can check: the precision each job gets, bf16 autocast over fp32
parameters, the all-reduce hook, fused optimizer kernels, and the refusal of a TPU job without
torch_xla. (What needs a GPU is in tests/integration/test_cuda.py.)"""

from __future__ import annotations

import pytest
import torch

from largebatch.errors import SetupError
from largebatch_trainer import accelerator
from largebatch_trainer.data import to_device
from largebatch_trainer.distributed import choose_device
from largebatch_trainer.reduction import _sum_hook
from tests.helpers import make_spec

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("workers", "precision", "on_gpu", "on_cpu"),
    [
        ({"accelerator": "nvidia.com/gpu"}, None, "bf16", "fp32"),  # a GPU job trained on a CPU stays fp32
        ({"accelerator": "none"}, None, "fp32", "fp32"),
        ({"accelerator": "google.com/tpu"}, None, "fp32", "fp32"),
        ({"accelerator": "nvidia.com/gpu"}, "fp32", "fp32", "fp32"),
        ({"accelerator": "none"}, "bf16", "bf16", "bf16"),  # asked for: CPU autocast
    ],
)
def test_the_precision_follows_the_job_then_the_accelerator(workers, precision, on_gpu, on_cpu):
    spec = make_spec(workers=workers, **({"precision": precision} if precision else {}))
    assert spec.resolved_precision == on_gpu
    assert accelerator.precision_on(spec, torch.device("cuda", 0)) == on_gpu
    assert accelerator.precision_on(spec, CPU) == on_cpu


def test_bf16_autocast_computes_in_bf16_and_keeps_fp32_parameters_and_gradients():
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with accelerator.autocast(CPU, "bf16"):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert layer.weight.dtype == layer.weight.grad.dtype == torch.float32
    with accelerator.autocast(CPU, "fp32"):
        assert layer(x).dtype == torch.float32


def test_the_all_reduce_hook_is_ours_in_fp32_and_torchs_bf16_wrapper_around_it_in_bf16():
    assert accelerator.all_reduce_hook(_sum_hook, "fp32") is _sum_hook
    wrapped = accelerator.all_reduce_hook(_sum_hook, "bf16")
    assert wrapped is not _sum_hook and wrapped.__name__ == "bf16_compress_wrapper_hook"


def test_batches_stay_as_they_are_on_the_cpu():
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), 3)}
    moved = to_device(batch, CPU)
    assert moved["x"] is batch["x"] and moved["pair"][1] == 3 and not moved["x"].is_pinned()


def test_a_tpu_job_without_torch_xla_is_refused_naming_what_is_missing():
    with pytest.raises(SetupError) as info:
        choose_device("google.com/tpu", "auto", 0)
    message = str(info.value)
    assert "torch_xla cannot be imported" in message
    assert "torch_xla[tpu]" in message and "PJRT_DEVICE=TPU" in message and "--device cpu" in message

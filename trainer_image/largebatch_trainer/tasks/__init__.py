"""The task API: what user code gives the trainer.

`task.entrypoint` names a callable `module:callable`; the trainer calls it with `task.args` as keyword
arguments, after seeding torch with `task.seed` (so every rank builds the same initial model), and it
returns a `Task`:

- `model`: a `torch.nn.Module`;
- `dataset`: a map-style dataset (`__len__`, `__getitem__`) of samples; the trainer batches them with
  `collate` (default: `torch.utils.data.default_collate`);
- `loss(model, batch) -> (loss_sum, count)`: the *sum* of per-sample losses over the batch, and the
  number of samples. The trainer divides by the global batch, so the update is the full-batch update
  whatever the world size and accumulation;
- optionally `eval_dataset` (held-out samples), `tokens_per_sample` (for tokens/s),
  `accuracy(model, batch) -> (correct, count)` for a classifier (reported as `evalAccuracy`) and
  `save_model(model, directory)`, which writes the model in its own format (rank 0 calls it into
  `<checkpoint.path>/model` at the end of training; `lbctl export` from any checkpoint), and
  `shard_units(model) -> [module, ...]`, the blocks that `parallelism.dataParallel: shard | hybrid` shards
  each as a unit of its own (gathered only while it computes; `blocks_of_classes` picks them by class).

The built-in tasks are `largebatch_trainer.tasks:pylm`, `largebatch_trainer.tasks:linreg` and
`largebatch_trainer.tasks:digits` (a small ResNet with BatchNorm; needs `largebatch[digits]`),
`largebatch_trainer.tasks:causal_lm` (a Hugging Face causal LM on a token file; needs `largebatch[hf]`) and
`largebatch_trainer.tasks:simulated` (no learning: each sample takes `secondsPerSample` of wall time, for
trying out allocations, quotas and dashboards without accelerators).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from largebatch.errors import JobError, TaskError

LossFn = Callable[[torch.nn.Module, Any], tuple[torch.Tensor, int]]
AccuracyFn = Callable[[torch.nn.Module, Any], tuple[torch.Tensor | int, int]]


class Pairs(torch.utils.data.Dataset):
    """Inputs and targets held as two tensors: sample i is (x[i], y[i])."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


@dataclass
class Task:
    model: torch.nn.Module
    dataset: Sequence
    loss: LossFn
    eval_dataset: Sequence | None = None
    tokens_per_sample: int = 0
    collate: Callable[[list], Any] = torch.utils.data.default_collate
    accuracy: AccuracyFn | None = None
    """(samples classified right, samples) over a held-out batch, the model in eval mode."""
    save_model: Callable[[torch.nn.Module, Path], None] | None = None
    """Write the trained model in its own format (e.g. `save_pretrained`) into a new directory."""
    shard_units: Callable[[torch.nn.Module], list[torch.nn.Module]] | None = None
    """The modules a sharded job wraps each as one FSDP unit: the model's repeated blocks, so that one
    block's parameters are gathered at a time. None: the whole model is one unit."""


def blocks_of_classes(*names: str) -> Callable[[torch.nn.Module], list[torch.nn.Module]]:
    """`shard_units` for a model whose blocks are the modules of the classes `names` (the way Hugging
    Face models list theirs, in `_no_split_modules`)."""
    return lambda model: [m for m in model.modules() if type(m).__name__ in names]


def load_task(entrypoint: str, args: dict[str, Any], seed: int) -> Task:
    """Import `module:callable` and build the task with every rank's RNG in the same state. A task that
    cannot be built raises `largebatch.errors.TaskError` (a `JobError` the task raised itself, such as the
    built-in tasks' refusals of their args, passes through as it is)."""
    module_name, _, attribute = entrypoint.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except JobError:
        raise
    except Exception as exc:  # ImportError, AttributeError, or whatever the module raises as it loads
        raise TaskError(f"task.entrypoint {entrypoint!r} cannot be loaded: {type(exc).__name__}: {exc}") from None
    torch.manual_seed(seed)
    try:
        task = factory(**args)
    except JobError:  # already the sentence a user reads
        raise
    except Exception as exc:  # the task's own words, whatever it raises: they are what the user needs
        raise TaskError(
            f"task.entrypoint {entrypoint!r} refused task.args {args!r}: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(task, Task):
        raise TaskError(f"task.entrypoint {entrypoint!r} returned {type(task).__name__}, not a Task")
    if not hasattr(task.dataset, "__len__"):
        raise TaskError(f"task.entrypoint {entrypoint!r} returned a dataset without a length: the trainer needs a "
                        "map-style dataset (__len__ and __getitem__)")  # fmt: skip
    if len(task.dataset) == 0:
        raise TaskError(f"task.entrypoint {entrypoint!r} built an empty dataset from task.args {args!r}")
    return task


def pylm(**args: Any) -> Task:
    from largebatch_trainer.tasks.stdlib_gpt import build

    return build(**args)


def linreg(**args: Any) -> Task:
    from largebatch_trainer.tasks.linear_regression import build

    return build(**args)


def simulated(**args: Any) -> Task:
    from largebatch_trainer.tasks.simulated import build

    return build(**args)


def digits(**args: Any) -> Task:
    from largebatch_trainer.tasks.digits_resnet import build

    return build(**args)


def causal_lm(**args: Any) -> Task:
    from largebatch_trainer.tasks.hf_causal_lm import build

    return build(**args)

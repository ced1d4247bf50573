"""Held-out evaluation: the mean loss per sample (and the accuracy, for a task that classifies) over the
first held-out samples, in eval mode (BatchNorm on its running statistics)."""

from __future__ import annotations

import torch

from largebatch_trainer import accelerator
from largebatch_trainer.data import to_device
from largebatch_trainer.tasks import Task


@torch.no_grad()
def held_out(
    task: Task, module: torch.nn.Module, device: torch.device, precision: str, samples: int, micro: int
) -> tuple[float, float | None]:
    """Mean loss per sample over the first `samples` held-out samples, in micro-batches of `micro`, and the
    fraction classified right when the task reports accuracy (None otherwise)."""
    data = task.eval_dataset
    count = min(len(data), samples)
    total, correct = 0.0, 0.0
    module.eval()
    for start in range(0, count, micro):
        batch = to_device(task.collate([data[i] for i in range(start, min(count, start + micro))]), device)
        with accelerator.autocast(device, precision):
            loss_sum, _ = task.loss(module, batch)
            if task.accuracy is not None:
                correct += float(task.accuracy(module, batch)[0])
        total += float(loss_sum)
    module.train()
    return total / count, (correct / count if task.accuracy is not None else None)

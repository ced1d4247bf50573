"""Simulated training: a model of one weight whose every micro-batch takes `secondsPerSample` of wall
time per sample (a sleep, not compute). For trying out what surrounds training without a GPU or a real
model: the operator's allocations and rescales, a queue's quotas, dashboards. The trainer around it is
the real one (rendezvous, the exact sample stream, checkpoints, reports); only the arithmetic is not.
"""

from __future__ import annotations

import time

import torch

from largebatch.errors import TaskError
from largebatch_trainer.tasks import Task


def build(secondsPerSample: float = 0.001, samples: int = 65_536) -> Task:  # noqa: N803 - task.args key
    seconds_per_sample = secondsPerSample
    if seconds_per_sample < 0 or samples < 1:
        raise TaskError(
            f"task.args secondsPerSample={seconds_per_sample} and samples={samples}: "
            "secondsPerSample must be 0 or more and samples 1 or more"
        )
    model = torch.nn.Linear(1, 1, bias=False)

    def loss(model: torch.nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        time.sleep(seconds_per_sample * len(batch))
        return (model(batch[:, None]) - 1).pow(2).sum() / 2, len(batch)

    return Task(model=model, dataset=torch.zeros(samples), loss=loss)

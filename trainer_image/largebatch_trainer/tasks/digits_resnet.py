"""Handwritten digits with a small ResNet and BatchNorm: the convnet recipe (Goyal et al. 2017) on a
problem that trains in a minute on a CPU.

The data are scikit-learn's bundled 8×8 digits (`sklearn.datasets.load_digits`: 1,797 images, no
download; `pip install 'largebatch[digits]'`), read from the file scikit-learn ships without importing
scikit-learn, which would cost every worker two seconds at each start. Every 5th image is held out for
evaluation (360), the rest (1,437) are the training set; pixels are scaled from 0..16 to [0, 1] as 1×8×8
tensors.

The model: a 3×3 convolution stem, `blocks` residual BasicBlocks (two 3×3 convolutions, each followed by
BatchNorm) at `width` channels and full 8×8 resolution, global average pooling and a linear head. With
`zeroInitResidual` (on by default) the last BatchNorm of every block starts with γ = 0, so each block
starts as the identity (Goyal et al. §5.1). γ and β are one-dimensional, so the optimizer gives them no
weight decay (`largebatch_trainer.optim.parameter_groups`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy
import torch
import torch.nn.functional as F
from torch import nn

from largebatch.errors import TaskError
from largebatch_trainer.tasks import Pairs, Task, blocks_of_classes

HELD_OUT_EVERY = 5
CLASSES = 10


def load(held_out: bool) -> Pairs:
    """The training images (held_out False) or every 5th image (held_out True), in the bundled order."""
    table = torch.from_numpy(numpy.loadtxt(bundled_file(), delimiter=",", dtype=numpy.float32))
    x = table[:, :-1].reshape(-1, 1, 8, 8) / 16.0
    y = table[:, -1].to(torch.int64)
    chosen = (torch.arange(len(y)) % HELD_OUT_EVERY == 0) == held_out
    return Pairs(x[chosen], y[chosen])


def bundled_file() -> Path:
    """scikit-learn's digits.csv.gz (64 pixels and the label per row: what load_digits reads), found
    without running scikit-learn's imports."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise TaskError("the digits task needs scikit-learn, which is not installed: pip install 'largebatch[digits]'")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise TaskError(f"scikit-learn has no {path}, which the digits task reads: pip install 'largebatch[digits]'")
    return path


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the identity, then ReLU (He et al. 2016)."""

    def __init__(self, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(out)))


class ResNet(nn.Module):
    def __init__(self, width: int, blocks: int, zero_init_residual: bool):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.blocks = nn.Sequential(*(BasicBlock(width) for _ in range(blocks)))
        self.head = nn.Linear(width, CLASSES)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:
            for block in self.blocks:
                nn.init.zeros_(block.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.bn(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def build(width: int = 16, blocks: int = 2, zeroInitResidual: bool = True) -> Task:  # noqa: N803 - task.args key
    if width < 1 or blocks < 0:
        raise ValueError(f"width must be >= 1 and blocks >= 0, got width={width}, blocks={blocks}")

    def loss(model: nn.Module, batch) -> tuple[torch.Tensor, int]:
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="sum"), len(y)

    def accuracy(model: nn.Module, batch) -> tuple[torch.Tensor, int]:
        x, y = batch
        return (model(x).argmax(dim=1) == y).sum(), len(y)

    return Task(
        model=ResNet(width, blocks, zeroInitResidual),
        dataset=load(held_out=False),
        loss=loss,
        eval_dataset=load(held_out=True),
        accuracy=accuracy,
        shard_units=blocks_of_classes(BasicBlock.__name__),
    )

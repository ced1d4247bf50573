"""The global sample stream: a seeded permutation of the dataset, epoch after epoch.

Position p of the stream is sample `perm(p // N)[p % N]`, where `perm(e)` is epoch e's permutation
(`largebatch_trainer.shuffle`: computed index by index, so a dataset of any size costs only the indices
a step asks for). Step s takes the next B_s positions and each
rank a consecutive slice of them, so progress is one number (samples consumed) and a restart at any
world size continues exactly where the last checkpoint stopped. `to_device` moves a batch to the
training device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from largebatch.errors import DataError
from largebatch_trainer import shuffle


class SampleStream:
    def __init__(self, size: int, seed: int):
        if size < 1:
            raise DataError("the task's dataset is empty")
        self.size, self.seed = size, seed

    def indices(self, start: int, count: int) -> list[int]:
        """Dataset indices at stream positions start .. start+count-1."""
        out: list[int] = []
        position = start
        while len(out) < count:
            epoch, offset = divmod(position, self.size)
            take = min(count - len(out), self.size - offset)
            offsets = np.arange(offset, offset + take, dtype=np.uint64)
            out += shuffle.permute(offsets, self.size, self.seed, epoch).tolist()
            position += take
        return out

    def batch(self, dataset: Sequence, collate: Callable[[list], Any], start: int, count: int) -> Any:
        return collate([dataset[i] for i in self.indices(start, count)])


def to_device(data: Any, device: torch.device) -> Any:
    """`data` (a tensor, or lists, tuples and dicts of them) on `device`. To a GPU through pinned memory,
    so that the copy is asynchronous: from pageable memory `non_blocking` would still stall the host
    until the copy is done, and the host could not queue the step's kernels meanwhile."""
    if isinstance(data, torch.Tensor):
        if device.type == "cuda" and not data.is_pinned():
            data = data.pin_memory()
        return data.to(device, non_blocking=True)
    if isinstance(data, list | tuple):
        return type(data)(to_device(item, device) for item in data)
    if isinstance(data, dict):
        return {key: to_device(value, device) for key, value in data.items()}
    return data

"""The global sample stream: a seeded permutation of the dataset, epoch after epoch.

Position p of the stream is sample `perm(p // N)[p % N]`. Step s takes the next B_s positions and each
rank a consecutive slice of them, so progress is one number (samples consumed) and a restart at any
world size continues exactly where the last checkpoint stopped. `to_device` moves a batch to the
training device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from largebatch.errors import DataError


class SampleStream:
    def __init__(self, size: int, seed: int):
        if size < 1:
            raise DataError("the task's dataset is empty")
        self.size, self.seed = size, seed
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a step spans at most two epochs
                self._perms.pop(min(self._perms))
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms[epoch] = torch.randperm(self.size, generator=generator)
        return self._perms[epoch]

    def indices(self, start: int, count: int) -> list[int]:
        """Dataset indices at stream positions start .. start+count-1."""
        out: list[int] = []
        position = start
        while len(out) < count:
            epoch, offset = divmod(position, self.size)
            take = min(count - len(out), self.size - offset)
            out += self._perm(epoch)[offset : offset + take].tolist()
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

"""What a checkpoint holds, gathered from the parts of the trainer that own it (torchtitan's `Stateful`):
each part has `state_dict()` and `load_state_dict(state)`, and a checkpoint's payload is a dict of
their states under their keys. The model and the optimizer are such parts as torch builds them; this
module has the others: the runs of steps (`History`), the held-out evaluations (`Evaluations`), torch's
RNG (`TorchRNG`), and `Attribute` for a value the trainer replaces rather than changes (the progress,
what the last step reported).

The keys and their formats are those of the checkpoints written when the trainer assembled the dict
itself (`model`, `optimizer`, `progress`, `noise`, `history`, `evaluations`, `rng`, `loss`, `plan`), so
those load unchanged; a key that older checkpoints lack belongs to a part marked `optional`, which then
keeps the state it started with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from largebatch import report


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


def gather(parts: Mapping[str, Stateful]) -> dict[str, Any]:
    """The checkpoint payload: every part's state under its key."""
    return {key: part.state_dict() for key, part in parts.items()}


def scatter(parts: Mapping[str, Stateful], payload: Mapping[str, Any]) -> None:
    """Every part loads its own state from `payload`, in the order of `parts`; an optional part missing
    from it (a checkpoint written before the part existed) keeps what it has."""
    for key, part in parts.items():
        if key in payload or not getattr(part, "optional", False):
            part.load_state_dict(payload[key])


class Attribute:
    """`owner.name` as a part: for a value the trainer replaces at every step (an immutable
    `schedule.Progress`, the last loss), saved through `dump` and restored through `restore`."""

    def __init__(
        self,
        owner: object,
        name: str,
        dump: Callable[[Any], Any] = lambda value: value,
        restore: Callable[[Any], Any] = lambda state: state,
        optional: bool = False,
    ):
        self.owner, self.name, self.dump, self.restore, self.optional = owner, name, dump, restore, optional

    def state_dict(self) -> Any:
        return self.dump(getattr(self.owner, self.name))

    def load_state_dict(self, state: Any) -> None:
        setattr(self.owner, self.name, self.restore(state))


class History:
    """Which samples each run of steps consumed at which world size: rows of [first step, first sample,
    policy batch, world size, steps], a row extended while the batch and the world size stay the same."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []

    def record(self, step: int, samples: int, batch: int, world: int) -> None:
        """The step after `step` steps and `samples` samples ran the policy's `batch` on `world` ranks."""
        last = self.rows[-1] if self.rows else None
        if last and last[2] == batch and last[3] == world and last[0] + last[4] == step:
            last[4] += 1
        else:
            self.rows.append([step, samples, batch, world, 1])

    def spans(self) -> list[report.HistorySpan]:
        """The rows as the training record's spans."""
        keys = ("first_step", "first_sample", "global_batch", "world_size", "steps")
        return [report.HistorySpan(**dict(zip(keys, row, strict=True))) for row in self.rows]

    def state_dict(self) -> list[list[int]]:
        return self.rows

    def load_state_dict(self, state: list[list[int]]) -> None:
        self.rows = state


class Evaluations:
    """The held-out evaluations so far: rows of [step, samples, loss, accuracy or None]."""

    optional = True  # checkpoints written before held-out evaluation have none

    def __init__(self) -> None:
        self.rows: list[list] = []

    @property
    def latest(self) -> list | None:
        return self.rows[-1] if self.rows else None

    def add(self, step: int, samples: int, loss: float, accuracy: float | None) -> None:
        self.rows.append([step, samples, loss, accuracy])

    def typed(self) -> list[report.Evaluation]:
        """The rows as the training record's evaluations."""
        return [
            report.Evaluation(step=step, samples=samples, eval_loss=report.finite(loss), eval_accuracy=accuracy)
            for step, samples, loss, accuracy in self.rows
        ]

    def state_dict(self) -> list[list]:
        return self.rows

    def load_state_dict(self, state: list[list]) -> None:
        self.rows = state


class TorchRNG:
    """torch's default (CPU) generator: what a task draws from while training continues where it was."""

    def state_dict(self) -> torch.Tensor:
        return torch.get_rng_state()

    def load_state_dict(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)

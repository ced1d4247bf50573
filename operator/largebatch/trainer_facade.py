"""The one door from `largebatch` into `largebatch_trainer`. The operator side otherwise only starts the
trainer as a process (`python -m largebatch_trainer`); these things of lbctl need it in lbctl's own
process, and one needs a function of it:

- the local shell's and the sweep's preflight load the task here, so that a task that cannot be built is
  refused in seconds, not in a node's log after its launches fail (or as many failed proxy runs);
- `lbctl coord-check` runs the model at each width to measure its layers' outputs;
- `lbctl prepare-data` writes the token files the trainer reads, `lbctl export` the model of a checkpoint
  in the task's own format (`largebatch.model_data`);
- a sweep's proxy runs die with the sweep, by the trainer's own lifeline;
- lbctl's zygote names itself in top and ps as the trainer's processes name themselves.

Every import of `largebatch_trainer` is inside a function, so that `lbctl --help` and the operator do
not load torch. Keep it that way, and add nothing here that another module could do without the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from largebatch.api import LargeBatchJobSpec
    from largebatch_trainer.prepare_data import Summary


def preflight_task(entrypoint: str, args: dict, seed: int) -> None:
    """Build the task as a worker would, and drop it: a `JobError` (TaskError) says why it cannot be."""
    from largebatch_trainer.tasks import load_task

    load_task(entrypoint, args, seed)


def measure_coordinates(spec: LargeBatchJobSpec, widths: list[int], steps: int) -> dict:
    """μP's coordinate check: the mean |output| of every layer over `steps` training steps, per width. A
    `JobError` when the task refuses a width."""
    from largebatch_trainer import coord_check

    return coord_check.measure(spec, widths, steps)


def plot_coordinates(table: dict, path: Path, title: str) -> None:
    """Draw what `measure_coordinates` returned to a PNG."""
    from largebatch_trainer import coord_check

    coord_check.plot(table, path, title=title)


def prepare_tokens(
    inputs: list[Path],
    tokenizer: str,
    out: Path,
    workers: int,
    separator: int | None,
    text_column: str,
    split: str | None,
    progress: Callable[[int, int], None],
) -> Summary:
    """Tokenize `inputs` into the token file `out` (largebatch_trainer.prepare_data); a `JobError` says why not."""
    from largebatch_trainer import prepare_data

    return prepare_data.prepare(inputs, tokenizer, out, workers, separator, text_column, split, progress)


def export_model(spec: LargeBatchJobSpec, checkpoint_dir: Path, step: int | None, out: Path) -> tuple[int, Path]:
    """Write the model of a checkpoint (the newest when `step` is None) in its task's format to `out`."""
    from largebatch_trainer import export

    return export.from_checkpoint(spec, checkpoint_dir, step, out)


def lifeline(signum: int, parent: int) -> Callable[[], None]:
    """A `preexec_fn` for a child that is to get `signum` when `parent` exits. The trainer's module is
    imported here, in the parent: the child runs the function between fork and exec, no place to import."""
    from largebatch_trainer.lifeline import die_with_parent

    return lambda: die_with_parent(signum, parent)


def name_process(name: str) -> None:
    """Name this process in top and `ps -o comm` (the trainer's lifeline sets the kernel's name)."""
    from largebatch_trainer.lifeline import name_process

    name_process(name)

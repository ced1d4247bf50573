"""The trained model in its own format: what a task's `save_model` writes (a Hugging Face model's
`save_pretrained` directory), at the end of training into `<checkpoint.path>/model` and, on request,
from any checkpoint (`lbctl export`).

A directory is written whole or not at all: into a temporary sibling, then renamed over the old one, so
that a reader never finds half a model, and a model written before is replaced only once the new one is
complete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from largebatch import launch
from largebatch.api import LargeBatchJobSpec
from largebatch.errors import SetupError, TaskError
from largebatch_trainer import checkpoint
from largebatch_trainer.tasks import Task, load_task

MODEL_DIR = launch.MODEL_DIR


def write(task: Task, module: torch.nn.Module, out: Path) -> Path:
    assert task.save_model is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary, old = (out.with_name(f".{out.name}.{what}-{os.getpid()}") for what in ("new", "old"))
    shutil.rmtree(temporary, ignore_errors=True)
    task.save_model(module, temporary)
    if out.exists():
        out.rename(old)
    temporary.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def from_checkpoint(spec: LargeBatchJobSpec, checkpoint_dir: Path, step: int | None, out: Path) -> tuple[int, Path]:
    """Build the job's task, load the checkpoint of `step` (default: the newest intact one) into its model
    and write the model to `out`. Returns the step written and the directory."""
    task = load_task(spec.task.entrypoint, spec.task.args, spec.task.seed)
    if task.save_model is None:
        raise TaskError(f"task {spec.task.entrypoint} has no model format of its own (its Task sets no save_model): "
                        f"its weights are the checkpoints' 'model' entry, a torch state dict")  # fmt: skip
    if step is None:
        found = checkpoint.newest_intact(checkpoint_dir)
        if found is None:
            raise SetupError(f"no intact checkpoint in {checkpoint_dir}")
        path, payload = found
    else:
        held = {checkpoint.step_of(p): p for p in checkpoint.all_checkpoints(checkpoint_dir)}
        path = held.get(step)
        if path is None:
            steps = sorted(held)
            raise SetupError(f"no checkpoint of step {step} in {checkpoint_dir}; it holds steps {steps or 'none'}")
        try:
            payload = checkpoint.load(path)
        except checkpoint.CheckpointError as exc:
            raise SetupError(str(exc)) from None
    return payload["progress"]["step"], write_state(task, payload["model"], out)


def write_state(task: Task, state: dict[str, torch.Tensor], out: Path) -> Path:
    """Load the whole model `state` into the freshly built `task`'s model and write that to `out` (how a
    sharded model is written: gathered whole, into an unsharded copy)."""
    task.model.load_state_dict(state)
    return write(task, task.model, out)

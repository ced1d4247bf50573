"""Sharded checkpoints, for `parallelism.dataParallel: shard | hybrid`: torch.distributed.checkpoint (DCP),
every rank writing its own shard, in the background while training goes on.

Layout: `<checkpoint.path>/ckpt-<step>.dcp/` holds DCP's `.metadata` (which tensor piece lies where) and
one `__<rank>_0.distcp` per rank, each with `<file>.sha256` beside it (its size and SHA-256, written by
the rank that wrote the file, as soon as it has). The ranks write into `.ckpt-<step>.dcp.partial/`; DCP's
coordinator writes `.metadata` once every rank has reported its shard written, then renames the directory
to its name. So a directory of that name is complete, as a `.pt` file with its manifest is
(`largebatch_trainer.checkpoint`), and `verify` finds one damaged since.

What is not a tensor (the progress, the noise scale, the history, the RNG: `largebatch_trainer.stateful`)
travels as one `torch.save` blob under `TRAINER`, written once. A checkpoint loads at any world size and
in any mode: DCP reads, on each rank, the pieces of its new shard (or the whole tensors of an unsharded
model) from whichever files hold them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from largebatch import files

SUFFIX = ".dcp"
TRAINER = "trainer"
"""The key of the blob of everything else a checkpoint holds besides the model and the optimizer."""
PARTIAL = ".partial"
_DIGEST = ".sha256"


class _Writer(FileSystemWriter):
    """DCP's file writer, which also records each file's digest and, on the coordinator, puts the finished
    directory under its name (and prunes the old ones: `after_rename`)."""

    def __init__(self, staging: Path, final: Path, after_rename):
        super().__init__(staging, sync_files=True, overwrite=True)
        self.final, self.after_rename = final, after_rename

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        for name in sorted({result.storage_data.relative_path for result in written.value()}):
            path = Path(self.path) / name
            files.replace(path.with_name(name + _DIGEST), lambda temporary, path=path: _write_digest(path, temporary))
        return written

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        if self.final.exists():  # a checkpoint of this step from a history this run abandoned
            shutil.rmtree(self.final)
        os.rename(self.path, self.final)
        self.after_rename()


def _digest(path: Path) -> dict[str, Any]:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            sha.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": sha.hexdigest()}


def _write_digest(path: Path, temporary: Path) -> None:
    with open(temporary, "w") as handle:
        json.dump(_digest(path), handle)
        handle.flush()
        os.fsync(handle.fileno())


def save_async(
    final: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer: dict[str, Any] | None, group,
    after_rename,
) -> Future:  # fmt: skip
    """Start writing the checkpoint `final` (a `ckpt-<step>.dcp` path): every rank calls it, rank 0 with
    the `trainer` payload. It returns once the state is copied off the training tensors; the future is
    done when this rank's part is written (and, on the coordinator, the directory renamed and
    `after_rename` run)."""
    staging = final.with_name(f".{final.name}{PARTIAL}")
    final.parent.mkdir(parents=True, exist_ok=True)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    if trainer is not None:
        blob = io.BytesIO()
        torch.save(trainer, blob)
        state[TRAINER] = blob.getvalue()
    return dcp.async_save(
        state,
        storage_writer=_Writer(staging, final, after_rename),
        process_group=group,
        no_dist=not dist.is_initialized(),
    )


def read_trainer(path: Path) -> dict[str, Any]:
    """The checkpoint's payload besides the model and the optimizer (each rank reads it)."""
    state = {TRAINER: b""}
    dcp.load(state, checkpoint_id=path, no_dist=True)
    return torch.load(io.BytesIO(state[TRAINER]), map_location="cpu", weights_only=True)


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load the checkpoint at `path` into `model` and `optimizer` (sharded or not: each rank reads what it
    holds), on every rank together."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_whole(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optimizer_state: dict
) -> None:
    """Load a replicated job's checkpoint (whole tensors, on every rank) into a sharded `model` and its
    `optimizer`, each rank keeping its shard. torch's optimizer state numbers the parameters in the order
    of its groups; `set_optimizer_state_dict` takes them by name."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    by_name = {
        "state": {order[index]: value for index, value in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [order[index] for index in group["params"]]}
            for group in optimizer_state["param_groups"]
        ],
    }
    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=whole)
    set_optimizer_state_dict(model, optimizer, by_name, options=whole)


def whole_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The sharded `model`'s whole state dict, in CPU memory on rank 0 (empty on the others): every rank
    calls it."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def read_whole(path: Path) -> dict[str, Any]:
    """The checkpoint as one process's payload, as a `.pt` checkpoint's: the whole model's state dict under
    `model`, the optimizer's (keyed by parameter name) under `optimizer`, the rest as they were saved. For
    `lbctl export` and the tests: it holds the whole model in this process's memory."""
    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    rest = torch.load(io.BytesIO(state.pop(TRAINER)), map_location="cpu", weights_only=True)
    return {"model": state["model"], "optimizer": state["optimizer"], **rest}


def shard_files(path: Path) -> list[str]:
    """The files the checkpoint's metadata says its pieces lie in."""
    metadata = FileSystemReader(path).read_metadata()
    return sorted({info.relative_path for info in metadata.storage_data.values()})


def verify(path: Path, rank: int = 0, world: int = 1) -> str | None:
    """What is wrong with the checkpoint at `path` (None: nothing), judging its metadata and every
    `world`-th of its files from the `rank`-th: each rank of a job checks its share, so a resume reads
    the checkpoint once in all, not once per rank."""
    try:
        names = shard_files(path)
    except Exception as exc:  # a missing or unreadable .metadata: DCP raises what its reader met
        return f"{path}: its metadata cannot be read ({type(exc).__name__}: {exc})"
    for name in names[rank::world]:
        shard, digest = path / name, path / (name + _DIGEST)
        try:
            expected, got = json.loads(digest.read_text()), _digest(shard)
        except FileNotFoundError as exc:
            return f"{path}: incomplete, {Path(exc.filename).name} is missing"
        except (OSError, ValueError) as exc:
            return f"{path}: {name} cannot be read: {exc}"
        if got["size"] != expected.get("size"):
            return f"{path}: {name} holds {got['size']:,} bytes where {expected.get('size'):,} were written (truncated)"
        if got["sha256"] != expected.get("sha256"):
            return f"{path}: {name}'s SHA-256 differs from the one written with it (corrupted)"
    return None


def remove_partials(directory: Path) -> None:
    """Remove what saves cut short left (a job restarts before it saves again)."""
    if directory.is_dir():
        for partial in directory.glob(f".ckpt-*{SUFFIX}{PARTIAL}"):
            shutil.rmtree(partial, ignore_errors=True)

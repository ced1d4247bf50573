"""Atomic, verified checkpoints. A checkpoint is written to a temporary name, flushed and renamed, with
a manifest beside it (its size and SHA-256) written the same way after it, so a checkpoint whose
manifest exists is complete. Loading verifies it; a damaged one (a disk that lied, a copy cut short)
is passed over for the newest intact one, with a warning that names it.

This module writes a replicated job's checkpoints, `ckpt-<step>.pt`, rank 0's whole state; a sharded
job's, `ckpt-<step>.dcp/` directories of every rank's shard, are `largebatch_trainer.sharded_checkpoint`'s.
Listing, pruning and reading in one process (`load`, `newest_intact`: `lbctl export`, the tests) take
both."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from largebatch import files
from largebatch_trainer import sharded_checkpoint

_NAME = re.compile(rf"^ckpt-(\d{{10}})(\.pt|{re.escape(sharded_checkpoint.SUFFIX)})$")


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and what is wrong with it."""


def path_for(directory: Path, step: int, sharded: bool = False) -> Path:
    return directory / f"ckpt-{step:010d}{sharded_checkpoint.SUFFIX if sharded else '.pt'}"


def is_sharded(path: Path) -> bool:
    return path.suffix == sharded_checkpoint.SUFFIX


def step_of(path: Path) -> int:
    """The step a checkpoint file (one `all_checkpoints` lists) was taken at."""
    return int(_NAME.match(path.name).group(1))


def manifest_for(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def save(directory: Path, step: int, payload: dict[str, Any], keep: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    final = path_for(directory, step)
    digest = _write_atomically(final, lambda handle: torch.save(payload, handle))
    _write_atomically(manifest_for(final), lambda handle: handle.write(json.dumps(digest).encode()))
    prune(directory, final, keep)
    return final


def prune(directory: Path, final: Path, keep: int) -> None:
    """Keep `final` and the `keep` - 1 checkpoints before it. Checkpoints of later steps belong to a history
    this run abandoned (it resumed before them because they were damaged): they go, or they would count
    among the `keep` newest and push out this one."""
    step = step_of(final)
    current = [p for p in all_checkpoints(directory) if step_of(p) <= step]
    for old in [p for p in all_checkpoints(directory) if step_of(p) > step] + current[:-keep]:
        if is_sharded(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            manifest_for(old).unlink(missing_ok=True)
            old.unlink(missing_ok=True)


class _Hashing(io.RawIOBase):
    """A write-only file that hashes what passes through it: the checkpoint is hashed as it is written,
    not read back or held twice in memory."""

    def __init__(self, handle):
        self.handle, self.sha, self.size = handle, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.handle.write(data)


def _write_atomically(final: Path, write) -> dict[str, Any]:
    """`write(file)` into `final`, replaced whole (fsynced before the rename); its size and SHA-256."""

    def hashed(temporary: Path) -> dict[str, Any]:
        with open(temporary, "wb") as handle:
            hashing = _Hashing(handle)
            write(hashing)
            handle.flush()
            os.fsync(handle.fileno())
        return {"size": hashing.size, "sha256": hashing.sha.hexdigest()}

    return files.replace(final, hashed)


def all_checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if _NAME.match(p.name)), key=lambda p: (step_of(p), p.name))


def load(path: Path) -> dict[str, Any]:
    """The checkpoint at `path`, verified against its manifest (a sharded one: read whole)."""
    if is_sharded(path):
        problem = sharded_checkpoint.verify(path)
        if problem:
            raise CheckpointError(problem)
        return sharded_checkpoint.read_whole(path)
    try:
        data = path.read_bytes()
        manifest = json.loads(manifest_for(path).read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: incomplete, {Path(exc.filename).name} is missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot be read: {exc}") from None
    if len(data) != manifest.get("size"):
        raise CheckpointError(f"{path}: {len(data):,} bytes where {manifest.get('size'):,} were written (truncated)")
    if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        raise CheckpointError(f"{path}: its SHA-256 differs from the one written with it (corrupted)")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def newest_intact(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that verifies, and its payload; each damaged newer one is named on stderr."""
    for path in reversed(all_checkpoints(directory)):
        try:
            return path, load(path)
        except CheckpointError as exc:
            print(f"warning: skipping a damaged checkpoint: {exc}", file=sys.stderr, flush=True)
    return None

"""Atomic checkpoints: written to a temporary name, flushed, then renamed, so a checkpoint that exists
under its final name is complete. The newest one wins on every start."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^ckpt-(\d{10})\.pt$")


def path_for(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:010d}.pt"


def save(directory: Path, step: int, payload: dict[str, Any], keep: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    final = path_for(directory, step)
    temporary = directory / f".{final.name}.{os.getpid()}.tmp"
    with open(temporary, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)
    for old in all_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def all_checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def latest(directory: Path) -> Path | None:
    found = all_checkpoints(directory)
    return found[-1] if found else None


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)

"""Files replaced whole or not at all: written under a temporary name beside the final one, then
renamed over it. A failed write (a full disk, a read-only folder) leaves the previous file as it was
and no temporary behind. Used for checkpoints, rank 0's progress reports and the local run's record."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def replace(final: Path, write: Callable[[Path], T]) -> T:
    """`write(temporary)`, then rename the temporary file to `final`; what `write` returned."""
    temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        result = write(temporary)
        os.replace(temporary, final)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return result

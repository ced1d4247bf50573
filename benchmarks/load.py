"""Busy processes beside a benchmark: the loaded machine the tests run on."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` processes that spin on a core each while the block runs."""
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(count)]
    for process in hogs:
        process.start()
    try:
        yield
    finally:
        for process in hogs:
            process.terminate()


def _spin() -> None:
    while True:
        pass

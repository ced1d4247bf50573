"""Busy processes beside a benchmark (the loaded machine the tests run on), and two modes of one thing
measured side by side."""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


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


def side_by_side(
    modes: tuple[str, str],
    cases: list[int],
    heading: str,
    runs: int,
    job_for: Callable[[Path, int], Path],
    measure: Callable[[str, Path, int], dict[str, float]],
) -> None:
    """For each case (a count of ranks, of nodes), `runs` runs of each mode, alternating, on the same job:
    a markdown table of each measure's medians and the second mode's share of the first's."""
    first, second = modes
    print(f"| {heading} | measure | {first} | {second} | {second} / {first} |\n|---|---|---|---|---|")
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            job = job_for(Path(tmp), case)
            results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
            for _ in range(runs):
                for mode in modes:
                    results[mode].append(measure(mode, job, case))
        for name in results[first][0]:
            a, b = (statistics.median(r[name] for r in results[mode]) for mode in modes)
            print(f"| {case} | {name} | {a:.1f} | {b:.1f} | {b / a:.2f} |", flush=True)

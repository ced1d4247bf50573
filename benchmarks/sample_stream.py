"""The sample stream's cost per step: the index-by-index permutation (largebatch_trainer.shuffle) against
the table it replaced (`torch.randperm` of the whole epoch), at dataset sizes from 10^5 to 10^8 samples,
in one process, alternating. Reports, per size, the time to the first step's indices (a start or a
restart: the table is built first), the time per step after it (a batch of 512 indices) and the table's
memory. Run: `.venv/bin/python benchmarks/sample_stream.py` (about a minute; 10^8 needs 0.8 GB)."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from largebatch_trainer.data import SampleStream

BATCH, STEPS, ROUNDS = 512, 200, 3


def table_stream(size: int, seed: int):
    """The old stream: a permutation table per epoch."""
    table = torch.randperm(size, generator=torch.Generator().manual_seed(seed))
    return lambda start, count: table[start : start + count].tolist()


def timed(build, size: int) -> tuple[float, float]:
    started = time.perf_counter()
    read = build(size)
    read(0, BATCH)
    first = time.perf_counter() - started
    started = time.perf_counter()
    for step in range(1, STEPS + 1):
        read((step * BATCH) % (size - BATCH), BATCH)
    return first, (time.perf_counter() - started) / STEPS


def main() -> None:
    torch.set_num_threads(1)
    print("| samples | table: first step | Feistel: first step | table: per step | Feistel: per step | "
          "Feistel/table per step | table memory |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for size in (10**5, 10**6, 10**7, 10**8):
        rows: dict[str, list[tuple[float, float]]] = {"table": [], "feistel": []}
        for _ in range(ROUNDS):
            rows["table"].append(timed(lambda n: table_stream(n, 0), size))
            rows["feistel"].append(timed(lambda n: SampleStream(n, 0).indices, size))
        med = {k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v)) for k, v in rows.items()}
        ratio = med["feistel"][1] / med["table"][1]
        print(f"| {size:.0e} | {med['table'][0] * 1e3:.1f} ms | {med['feistel'][0] * 1e3:.2f} ms | "
              f"{med['table'][1] * 1e6:.0f} µs | {med['feistel'][1] * 1e6:.0f} µs | {ratio:.2f} | "
              f"{size * np.dtype(np.int64).itemsize / 1e6:,.0f} MB |")  # fmt: skip


if __name__ == "__main__":
    main()

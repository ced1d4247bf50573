"""Splitting a global batch over ranks (pure): per-rank micro-batches and accumulation steps, and the
worker count that brings accumulation to 1. `largebatch.schedule` re-exports these; the trainer, the
controller and `lbctl plan` call them through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from largebatch.api import LargeBatchJobSpec


@dataclass(frozen=True)
class Split:
    """How one global batch is spread over ranks and micro-steps."""

    accumulation_steps: int
    micro_batches: tuple[tuple[int, ...], ...]
    """micro_batches[rank][micro_step]: samples of that micro-batch (0 when a rank has nothing left)."""

    def rank_total(self, rank: int) -> int:
        return sum(self.micro_batches[rank])

    def rank_offset(self, rank: int) -> int:
        """Position of this rank's first sample within the step's global batch."""
        return sum(sum(m) for m in self.micro_batches[:rank])

    @property
    def max_micro_batch(self) -> int:
        return max((max(m) for m in self.micro_batches), default=0)


def split(global_batch: int, world_size: int, max_micro_batch: int, bn_batch: int | None = None) -> Split:
    """Spread `global_batch` samples over `world_size` ranks with the fewest accumulation steps such
    that no micro-batch exceeds `max_micro_batch`. Per-rank totals differ by at most one sample and sum
    exactly to the global batch.

    With `bn_batch` (BatchNorm statistics over a fixed number of samples), the step's batch is cut into
    chunks of exactly `bn_batch` samples from its first sample on (a batch that is not a multiple would end
    in a shorter chunk; the API keeps every planned batch a multiple, the data budget's last one
    included); ranks take contiguous runs of chunks, as even as possible, one chunk per micro-batch.
    Chunk j is then samples [j·bn_batch, (j+1)·bn_batch) of the step at every world size, so BN sees the
    same samples together however many ranks run the step."""
    _check_split(global_batch, world_size, max_micro_batch, bn_batch)
    if bn_batch is not None:
        return _split_bn(global_batch, world_size, max_micro_batch, bn_batch)
    accumulation = -(-global_batch // (world_size * max_micro_batch))
    return Split(
        accumulation_steps=accumulation,
        micro_batches=tuple(_even(total, accumulation) for total in _even(global_batch, world_size)),
    )


def split_size(
    global_batch: int, world_size: int, max_micro_batch: int, bn_batch: int | None = None
) -> tuple[int, int]:
    """(accumulation steps, largest micro-batch) of `split` with the same arguments, in constant time: a
    plan of thousands of phases at accumulation in the thousands asks it at every phase."""
    _check_split(global_batch, world_size, max_micro_batch, bn_batch)
    if bn_batch is not None:
        chunks = -(-global_batch // bn_batch)
        return -(-chunks // world_size), min(bn_batch, global_batch)
    accumulation = -(-global_batch // (world_size * max_micro_batch))
    largest_rank = -(-global_batch // world_size)
    return accumulation, -(-largest_rank // accumulation)


def _check_split(global_batch: int, world_size: int, max_micro_batch: int, bn_batch: int | None) -> None:
    if global_batch < 1 or world_size < 1 or max_micro_batch < 1 or (bn_batch is not None and bn_batch < 1):
        raise ValueError(
            f"split needs positive numbers, got global_batch={global_batch}, world_size={world_size}, "
            f"max_micro_batch={max_micro_batch}, bn_batch={bn_batch}"
        )
    if bn_batch is not None and bn_batch > max_micro_batch:
        raise ValueError(
            f"a micro-batch of bn_batch={bn_batch} samples exceeds max_micro_batch={max_micro_batch}: "
            "raise batch.microBatchPerDevice to at least batch.bnBatch"
        )


def _split_bn(global_batch: int, world_size: int, max_micro_batch: int, bn_batch: int) -> Split:
    full, rest = divmod(global_batch, bn_batch)
    chunks = [bn_batch] * full + ([rest] if rest else [])
    counts = _even(len(chunks), world_size)
    accumulation = counts[0]
    micro_batches, first = [], 0
    for count in counts:
        mine = chunks[first : first + count]
        micro_batches.append(tuple(mine) + (0,) * (accumulation - count))
        first += count
    return Split(accumulation_steps=accumulation, micro_batches=tuple(micro_batches))


def _even(total: int, parts: int) -> tuple[int, ...]:
    """`total` in `parts` integers that differ by at most one, larger ones first."""
    q, r = divmod(total, parts)
    return tuple(q + 1 if i < r else q for i in range(parts))


def desired_workers(spec: LargeBatchJobSpec, global_batch: int, capacity: int | None = None) -> int:
    """Workers that bring accumulation to 1 for `global_batch`, within workers.min..max and, when known,
    the cluster's capacity. Never below workers.min: with less capacity than that the job waits."""
    w = spec.workers
    per_worker = w.devices_per_worker * spec.batch.micro_batch
    wanted = min(-(-global_batch // per_worker), w.max)
    if capacity is not None:
        wanted = min(wanted, capacity)
    return max(w.min, wanted)

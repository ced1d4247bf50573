"""The sample stream's permutation (largebatch_trainer.shuffle): a bijection of [0, n) for every n, seed and
epoch, whose state is the seed and the position, so that it needs no table and any split of the stream
(resumes, world sizes, micro-batches) reads the same sequence."""

from __future__ import annotations

import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from largebatch import schedule
from largebatch_trainer import shuffle
from largebatch_trainer.data import SampleStream

seeds = st.integers(min_value=0, max_value=2**63)


@given(n=st.integers(min_value=1, max_value=3000), seed=seeds, epoch=st.integers(min_value=0, max_value=10**6))
@settings(max_examples=200, deadline=None)
def test_every_epoch_visits_every_index_exactly_once(n, seed, epoch):
    visited = shuffle.permute(np.arange(n, dtype=np.uint64), n, seed, epoch)
    assert np.array_equal(np.sort(visited), np.arange(n))


@given(n=st.integers(min_value=1, max_value=500), seed=seeds, cuts=st.lists(st.integers(0, 2000), max_size=6))
@settings(max_examples=100, deadline=None)
def test_any_split_of_the_stream_reads_the_whole_stream(n, seed, cuts):
    """A resume, another world size or another micro-batch split all read the stream in pieces: the pieces
    joined are the stream read at once, across epoch boundaries too."""
    whole = SampleStream(n, seed).indices(0, 2000)
    bounds = [0, *sorted(cuts), 2000]
    stream = SampleStream(n, seed)  # a fresh process: nothing carried but the seed and the position
    pieces = [i for a, b in zip(bounds, bounds[1:], strict=False) for i in stream.indices(a, b - a)]
    assert pieces == whole


@given(batch=st.integers(1, 64), before=st.integers(1, 8), after=st.integers(1, 8), steps=st.integers(1, 6))
@settings(max_examples=50, deadline=None)
def test_a_resume_at_another_world_size_continues_the_same_sequence(batch, before, after, steps):
    """Ranks read consecutive slices of each step's positions (schedule.split): the samples of a run at one
    world size, resumed at another after `steps` steps, are the samples of one process's run."""
    stream = SampleStream(97, seed=5)
    single = stream.indices(0, 2 * steps * batch)
    trained: list[int] = []
    position = 0
    for step in range(2 * steps):
        world = before if step < steps else after
        split = schedule.split(batch, world, 3)
        for rank in range(world):
            start = position + split.rank_offset(rank)
            for size in split.micro_batches[rank]:
                trained += stream.indices(start, size)
                start += size
        position += batch
    assert trained == single


def test_a_billion_windows_cost_only_the_indices_asked_for():
    started = time.perf_counter()
    for n in (10**9, 2**62):
        stream = SampleStream(n, seed=11)
        indices = stream.indices(n - 1000, 3000)  # the end of epoch 0 and the start of epoch 1
        assert len(set(indices[:1000])) == 1000 and len(set(indices[1000:])) == 2000
        assert all(0 <= i < n for i in indices)
    assert time.perf_counter() - started < 5  # a table of 10**9 entries would take minutes and 8 GB


def test_epochs_and_seeds_give_different_orders():
    orders = {tuple(shuffle.permute(np.arange(50, dtype=np.uint64), 50, seed, epoch)) for seed in range(5)
              for epoch in range(5)}  # fmt: skip
    assert len(orders) == 25


def test_positions_are_spread_evenly():
    """Where index i lands is close to uniform over the epoch: across 2,000 epochs of 64 indices each index
    spends about half its epochs in the first half (binomial sd 1.1 %; 5 % is 4.5 sd)."""
    n, epochs = 64, 2000
    landed = np.stack([shuffle.permute(np.arange(n, dtype=np.uint64), n, 7, e) for e in range(epochs)])
    in_first_half = (landed[:, : n // 2, None] == np.arange(n)).any(axis=1).mean(axis=0)
    assert np.all(np.abs(in_first_half - 0.5) < 0.05), in_first_half
    # And neighbours in the stream are not neighbours in the dataset more than by chance (2/n).
    adjacent = np.abs(np.diff(landed, axis=1)) == 1
    assert adjacent.mean() < 3 / n

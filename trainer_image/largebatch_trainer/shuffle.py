"""A seeded permutation of [0, n), computed index by index: the order in which an epoch visits a dataset.

`permute(offsets, n, seed, epoch)` maps stream offsets to dataset indices without materialising the
permutation, so its state is the seed and the position alone and its cost is the indices asked for, not
the dataset's size (a billion windows of a token file need no billion-entry table). It is a balanced
Feistel network over the 2h-bit integers (the smallest even width holding n - 1) with a keyed
splitmix64 round function, restricted to [0, n) by cycle walking: a value that lands at n or above is
permuted again until it lands below n. A Feistel network is a bijection whatever its round function, and
cycle walking a bijection of a superset yields a bijection of the subset, so every epoch visits every
index exactly once. The domain is less than 4n, so a walk takes fewer than four rounds of the network on
average. Six rounds: four make a pseudorandom permutation (Luby and Rackoff), two more for margin.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
_MASK64 = (1 << 64) - 1


def _splitmix(z: int) -> int:
    """splitmix64's finaliser on a Python integer (the round keys)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _mix(values: np.ndarray, key: int) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (numpy's uint64 arithmetic wraps, as the hash wants)."""
    z = values ^ np.uint64(key)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def round_keys(seed: int, epoch: int) -> list[int]:
    base = _splitmix((seed & _MASK64) ^ _splitmix(epoch & _MASK64))
    return [_splitmix(base + r) for r in range(ROUNDS)]


def half_bits(n: int) -> int:
    """h: the network permutes 2h-bit integers, the fewest that hold 0 .. n-1 (at least one bit a side)."""
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _network(x: np.ndarray, h: int, keys: list[int]) -> np.ndarray:
    mask, shift = np.uint64((1 << h) - 1), np.uint64(h)
    left, right = x >> shift, x & mask
    for key in keys:
        left, right = right, left ^ (_mix(right, key) & mask)
    return (left << shift) | right


def permute(offsets: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """The dataset indices that epoch `epoch` visits at `offsets` (each in [0, n)), as int64."""
    if n < 1 or n > 1 << 62:
        raise ValueError(f"a permutation of {n} elements: 1 to 2**62 are supported")
    h, keys = half_bits(n), round_keys(seed, epoch)
    out = _network(np.asarray(offsets, dtype=np.uint64), h, keys)
    outside = out >= np.uint64(n)
    while outside.any():  # cycle walking: fewer than four passes on average, each on fewer values
        out[outside] = _network(out[outside], h, keys)
        outside = out >= np.uint64(n)
    return out.astype(np.int64)

"""Array helpers shared by the stages.

:func:`pair_index` finds node pairs among a fabric's links by one sort and a binary search, where a dict of
pairs would be built and probed in Python (the 16.8 M tree edges of a 64×64 torus).

:func:`unique_values` stands in for ``np.unique(values)`` on large integer arrays. Asked for the values alone,
numpy 2.x finds them with a hash table, which on this project's machines takes about 1 µs an element on
millions of distinct int64 keys (3 M: 3.6 s) where sorting takes about 0.01 µs (`benchmarks/bench_scale.py`:
the lowering of a 1024-rank torus allreduce made five such calls, 12 s in all).
"""

from __future__ import annotations

import numpy as np


def unique_values(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values``, sorted (``np.unique(values)``), by a sort."""
    ordered = np.sort(np.asarray(values).ravel())
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def pair_index(link_tails, link_heads, tails, heads) -> np.ndarray:
    """Per pair (``tails[i]``, ``heads[i]``): the index of the link with that tail and head (of parallel links,
    the last, as a dict of pairs would keep), or -1 where there is none."""
    link_tails = np.asarray(link_tails, dtype=np.int64)
    link_heads = np.asarray(link_heads, dtype=np.int64)
    tails, heads = np.asarray(tails, dtype=np.int64), np.asarray(heads, dtype=np.int64)
    if len(link_tails) == 0:
        return np.full(len(tails), -1, dtype=np.int64)
    width = int(max(link_tails.max(), link_heads.max(), 0)) + 1
    keys = link_tails * width + link_heads
    by_key = np.argsort(keys, kind="stable")
    sorted_keys = keys[by_key]
    wanted = tails * width + heads
    at = np.searchsorted(sorted_keys, wanted, side="right") - 1
    ok = (at >= 0) & (tails >= 0) & (tails < width) & (heads >= 0) & (heads < width)
    ok &= sorted_keys[np.maximum(at, 0)] == wanted
    return np.where(ok, by_key[np.maximum(at, 0)], -1)

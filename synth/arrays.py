"""Array helpers shared by the stages.

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

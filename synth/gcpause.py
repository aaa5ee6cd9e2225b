"""One helper: pause Python's cyclic garbage collector around a bulk build.

Lowering, verifying, simulating and the ring's schedule build allocate hundreds of thousands of small
tuples and records that stay alive and form no cycles; with the collector on, each young-generation
pass rescans the growing heap (a 64-rank ring: ~40 % of the run).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic GC inside the block; restore its previous state after (exceptions too)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

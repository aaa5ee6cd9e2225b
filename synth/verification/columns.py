"""Compact step columns: every step of a list of threadblocks as numpy arrays, one per field (issue 31, "Memory
and I/O"), so that the structure checks of a program of millions of steps run as array operations.

Only exact values become columns: a step type or buffer name that is a known one gets its code, any other
hashable value the code for "none of them" (the per-step checks then say what is wrong with it), and the
integer fields must be integers (``operator.index``: ``int``, ``bool``, numpy integers) within int64. A
program with any other value (a float offset, an unhashable type) gets no columns, and the verifier runs its
per-step code on it as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, index

import numpy as np

from synth.verification.common import KIND

#: Buffer codes of :attr:`StepColumns.srcbuf` / ``dstbuf``; :data:`NO_BUFFER` for any other name.
BUFFER_CODE = {"i": 0, "o": 1, "s": 2}
NO_BUFFER = 3
#: Kind code of a step whose type is not one of :data:`synth.verification.common.KIND`.
NO_KIND = -1


@dataclass(frozen=True)
class StepColumns:
    """The steps of threadblocks ``0 .. len(start) - 2`` back to back: threadblock ``g`` has steps
    ``start[g]:start[g + 1]``. ``kind`` is the step type's :data:`~synth.verification.common.KIND` code
    (:data:`NO_KIND` otherwise), ``srcbuf``/``dstbuf`` the :data:`BUFFER_CODE` (:data:`NO_BUFFER` otherwise),
    ``hasdep`` its truth value; the other fields as they are."""

    start: np.ndarray     # int64, one more than there are threadblocks
    kind: np.ndarray      # int8
    srcbuf: np.ndarray    # int8
    srcoff: np.ndarray    # int64
    dstbuf: np.ndarray    # int8
    dstoff: np.ndarray    # int64
    cnt: np.ndarray       # int64
    depid: np.ndarray     # int64
    deps: np.ndarray      # int64
    hasdep: np.ndarray    # bool

    @property
    def tb_of(self) -> np.ndarray:
        """The threadblock of every step."""
        return np.repeat(np.arange(len(self.start) - 1), np.diff(self.start))


def step_columns(threadblocks: Iterable) -> StepColumns | None:
    """The columns of the steps of ``threadblocks`` (objects with ``steps``), or None when a field holds a value
    that is not exact (see the module docstring). Costs a few C-level passes over the steps, no Python loop."""
    lengths = []
    parts = []
    for tb in threadblocks:
        lengths.append(len(tb.steps))
        parts.append(tb.steps)
    steps = list(chain.from_iterable(parts))
    n = len(steps)
    start = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=start[1:])

    def codes(field: str, table: dict, missing: int) -> np.ndarray:
        return np.fromiter(map(table.get, map(attrgetter(field), steps), repeat(missing)), np.int8, n)

    def integers(field: str) -> np.ndarray:
        return np.fromiter(map(index, map(attrgetter(field), steps)), np.int64, n)

    try:
        return StepColumns(
            start=start, kind=codes("type", KIND, NO_KIND), srcbuf=codes("srcbuf", BUFFER_CODE, NO_BUFFER),
            srcoff=integers("srcoff"), dstbuf=codes("dstbuf", BUFFER_CODE, NO_BUFFER), dstoff=integers("dstoff"),
            cnt=integers("cnt"), depid=integers("depid"), deps=integers("deps"),
            hasdep=np.fromiter(map(bool, map(attrgetter("hasdep"), steps)), np.bool_, n))
    except (TypeError, ValueError, OverflowError):   # unhashable, not an integer, beyond int64
        return None

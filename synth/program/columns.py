"""Compact step columns: every step of a program as numpy arrays, one per field (issue 31, "Memory and I/O"), so
that the verifier's structure checks and the simulator's flattening of millions of steps run as array operations.

Two sources give the same columns. :func:`step_columns` reads them from the Step objects. The lowering builds
them from the integer rows it makes the Steps from, and the Program carries them (``Program.columns``);
:func:`program_columns` takes those only while they describe the program's own ``gpus`` (the same tuple object:
a Program whose steps were replaced gets its columns read afresh).

Only exact values become columns: a step type or buffer name that is a known one gets its code, any other
hashable value the code for "none of them" (the per-step checks then say what is wrong with it), and the
integer fields must be integers (``operator.index``: ``int``, ``bool``, numpy integers) within int64. A
program with any other value (a float offset, an unhashable type) gets no columns.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain, repeat
from operator import attrgetter, index

import numpy as np

from synth.program.ir import READS_SRC, RECEIVES, SENDS, WRITES_DST, Program, StepColumns

#: Step kind codes (what the verifier compiles step types to); :data:`NO_KIND` for any other type.
NOP, S, R, RCS, RRS, RRC, RRCS, CPY, RE = range(9)
KIND = {"nop": NOP, "s": S, "r": R, "rcs": RCS, "rrs": RRS, "rrc": RRC, "rrcs": RRCS, "cpy": CPY, "re": RE}
NO_KIND = -1
#: Per step type: (kind, sends, receives, reads its local src, writes its dst).
TYPE_INFO = {t: (k, t in SENDS, t in RECEIVES, t in READS_SRC, t in WRITES_DST) for t, k in KIND.items()}

#: Buffer codes of :attr:`StepColumns.srcbuf` / ``dstbuf``; :data:`NO_BUFFER` for any other name.
BUFFER_CODE = {"i": 0, "o": 1, "s": 2}
NO_BUFFER = 3


#: (type, srcbuf, dstbuf) -> one code: kind * 16 + srcbuf code * 4 + dstbuf code (one lookup a step, not three).
_TRIPLE = {(t, a, b): k * 16 + ca * 4 + cb for t, k in KIND.items()
           for a, ca in BUFFER_CODE.items() for b, cb in BUFFER_CODE.items()}


#: Per kind code, then one more entry (False) for :data:`NO_KIND`: whether the step sends, receives, reads its
#: local src, writes its dst.
_KIND_TABLES = tuple(np.array([TYPE_INFO[t][j] for t in sorted(KIND, key=KIND.get)] + [False]) for j in (1, 2, 3, 4))


def kind_flags(kind: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per step of a ``kind`` column: whether it sends, receives, reads its local src, writes its dst (all False
    for :data:`NO_KIND`)."""
    at = np.where(kind != NO_KIND, kind, len(KIND))
    return tuple(table[at] for table in _KIND_TABLES)


def peerless_steps(columns: StepColumns, threadblocks: list) -> np.ndarray:
    """Per step, whether it sends in a threadblock without a send peer or receives in one without a recv peer
    (``threadblocks``: the columns' threadblocks in order)."""
    sends, receives, _, _ = kind_flags(columns.kind)
    no_send = np.fromiter((tb.send < 0 for tb in threadblocks), np.bool_, len(threadblocks))
    no_recv = np.fromiter((tb.recv < 0 for tb in threadblocks), np.bool_, len(threadblocks))
    tb_of = columns.tb_of
    return (sends & no_send[tb_of]) | (receives & no_recv[tb_of])


def step_columns(threadblocks: Iterable) -> StepColumns | None:
    """The columns of the steps of ``threadblocks`` (objects with ``steps``), or None when a field holds a value
    that is not exact (see the module docstring). Costs a few C-level passes over the steps, no Python loop:
    about 0.7 s a million steps, nearly all of it reading the attributes of the Step objects."""
    lengths = []
    parts = []
    for tb in threadblocks:
        lengths.append(len(tb.steps))
        parts.append(tb.steps)
    steps = list(chain.from_iterable(parts))
    n = len(steps)
    start = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=start[1:])

    def integers(field: str, which: list = steps) -> np.ndarray:
        return np.fromiter(map(index, map(attrgetter(field), which)), np.int64, len(which))

    try:
        triple = np.fromiter(map(_TRIPLE.get, map(attrgetter("type", "srcbuf", "dstbuf"), steps), repeat(-1)),
                             np.int16, n)
        depid = integers("depid")
        with_dep = np.flatnonzero(depid != -1)
        deps = np.full(n, -1, dtype=np.int64)
        deps[with_dep] = integers("deps", list(map(steps.__getitem__, with_dep.tolist())))
        srcoff, dstoff, cnt = integers("srcoff"), integers("dstoff"), integers("cnt")
        exact = triple >= 0
        if not exact.all():      # a rare step: its type and buffers one at a time
            odd = np.flatnonzero(~exact).tolist()
            triple[odd] = [KIND.get(st.type, NO_KIND) * 16 + BUFFER_CODE.get(st.srcbuf, NO_BUFFER) * 4
                           + BUFFER_CODE.get(st.dstbuf, NO_BUFFER) for st in map(steps.__getitem__, odd)]
    except (TypeError, ValueError, OverflowError):   # unhashable, not an integer, beyond int64
        return None
    kind = np.where(triple >= 0, triple // 16, NO_KIND).astype(np.int8)
    low = np.where(triple >= 0, triple, triple + 16 * 16) % 16     # NO_KIND * 16 + ... is negative
    return StepColumns(start=start, kind=kind, srcbuf=(low // 4).astype(np.int8), srcoff=srcoff,
                       dstbuf=(low % 4).astype(np.int8), dstoff=dstoff, cnt=cnt, depid=depid, deps=deps, steps=steps)


def program_columns(program: Program) -> StepColumns | None:
    """The columns of every step of ``program`` (gpus in order, their threadblocks in order): the ones it
    carries where they describe its ``gpus``, else :func:`step_columns` of its Step objects."""
    carried = program.columns
    if carried is not None and carried.of is program.gpus:
        return carried
    return step_columns(tb for gpu in program.gpus for tb in gpu.threadblocks)

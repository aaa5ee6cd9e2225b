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

from synth.program.ir import Program
from synth.runtime_limits import RuntimeProfile
from synth.verification.common import KIND, NOP, TYPE_INFO

#: Buffer codes of :attr:`StepColumns.srcbuf` / ``dstbuf``; :data:`NO_BUFFER` for any other name.
BUFFER_CODE = {"i": 0, "o": 1, "s": 2}
NO_BUFFER = 3
#: Kind code of a step whose type is not one of :data:`synth.verification.common.KIND`.
NO_KIND = -1


#: (type, srcbuf, dstbuf) -> one code: kind * 16 + srcbuf code * 4 + dstbuf code (one lookup a step, not three).
_TRIPLE = {(t, a, b): k * 16 + ca * 4 + cb for t, k in KIND.items()
           for a, ca in BUFFER_CODE.items() for b, cb in BUFFER_CODE.items()}


def kind_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per kind code, then one more entry (False) for :data:`NO_KIND` mapped to the end: whether the step sends,
    receives, reads its local src, writes its dst."""
    ordered = sorted(KIND, key=KIND.get)
    return tuple(np.array([TYPE_INFO[t][j] for t in ordered] + [False]) for j in (1, 2, 3, 4))


@dataclass(frozen=True)
class StepColumns:
    """The steps of threadblocks ``0 .. len(start) - 2`` back to back: threadblock ``g`` has steps
    ``start[g]:start[g + 1]``. ``kind`` is the step type's :data:`~synth.verification.common.KIND` code
    (:data:`NO_KIND` otherwise), ``srcbuf``/``dstbuf`` the :data:`BUFFER_CODE` (:data:`NO_BUFFER` otherwise);
    ``deps`` is read only where ``depid`` is not -1 (-1 elsewhere); ``steps`` are the Step objects in the same
    order (for the few fields read at some steps only, such as ``hasdep``)."""

    start: np.ndarray     # int64, one more than there are threadblocks
    kind: np.ndarray      # int8
    srcbuf: np.ndarray    # int8
    srcoff: np.ndarray    # int64
    dstbuf: np.ndarray    # int8
    dstoff: np.ndarray    # int64
    cnt: np.ndarray       # int64
    depid: np.ndarray     # int64
    deps: np.ndarray      # int64
    steps: list

    @property
    def tb_of(self) -> np.ndarray:
        """The threadblock of every step."""
        return np.repeat(np.arange(len(self.start) - 1), np.diff(self.start))


def step_columns(threadblocks: Iterable) -> StepColumns | None:
    """The columns of the steps of ``threadblocks`` (objects with ``steps``), or None when a field holds a value
    that is not exact (see the module docstring). Costs a few C-level passes over the steps, no Python loop:
    about 0.3 s a million steps, nearly all of it reading the attributes of the Step objects."""
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


def suspect_threadblocks(columns: StepColumns, program: Program, msccl: bool, limits: RuntimeProfile) -> np.ndarray:
    """Per threadblock (program order), whether the runtime-limit step checks
    (:func:`synth.program.msccl_xml.runtime_limit_errors`) may find anything in it: a step that sends
    or receives without the peer, a type that is no step type, a ``nop`` with a dependency (the chain rule is
    left to the per-step code), and with ``msccl`` too many steps, a depended-on tb id, cnt or an offset over
    the runtime's limits. A numpy bool array."""
    tbs = [tb for gpu in program.gpus for tb in gpu.threadblocks]
    if len(columns.start) != len(tbs) + 1:
        raise ValueError("columns do not match the program's threadblocks")
    tb_of = columns.tb_of
    kind = columns.kind
    known = kind != NO_KIND
    sends, receives, reads, writes = (table[np.where(known, kind, len(table) - 1)] for table in kind_table())
    no_send = np.array([tb.send < 0 for tb in tbs], dtype=bool)[tb_of]
    no_recv = np.array([tb.recv < 0 for tb in tbs], dtype=bool)[tb_of]
    nop = kind == NOP
    bad = ~known | (sends & no_send) | (receives & no_recv) | (nop & (columns.depid >= 0))
    if msccl:
        real = known & ~nop
        bad |= columns.depid > limits.max_depended_tb
        bad |= real & ((columns.cnt < 1) | (columns.cnt > limits.max_step_chunks)
                       | (reads & (columns.srcoff > limits.max_offset))
                       | (writes & (columns.dstoff > limits.max_offset)))
    suspect = np.zeros(len(tbs), dtype=bool)
    suspect[tb_of[bad]] = True
    if msccl:
        suspect |= np.diff(columns.start) > limits.max_steps_per_tb
    return suspect

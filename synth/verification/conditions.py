"""Verification passes on what a collective requires: its precondition (the inputs), an intact input buffer
for out-of-place programs, and its postcondition (every output slot's final value)."""

from __future__ import annotations

from collections.abc import Iterator

from synth.collectives import ALL_ORIGINS, Collective
from synth.program.columns import BUFFER_CODE, StepColumns, kind_flags
from synth.program.ir import WRITES_DST, Program
from synth.verification.common import Errors, describe, fmt_ranks, ranks_of, step_name
from synth.verification.layout import Layout


def iter_expected_values(coll: Collective, block: int = 1 << 16) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
    """``coll.postcondition`` in the verifier's encoding, by rank then slot: ((rank, output slot), (input slot,
    origin bitset)). From :meth:`Collective.postcondition_arrays`, turned into Python ``block`` entries at a time
    (the postcondition has N²·C slots for allgather and alltoall)."""
    every = (1 << coll.num_ranks) - 1
    post = coll.postcondition_arrays()
    for at in range(0, len(post.rank), block):
        part = (a[at:at + block].tolist() for a in post)
        for r, slot, input_slot, origin in zip(*part, strict=True):
            yield (r, slot), (input_slot, every if origin == ALL_ORIGINS else 1 << origin)


def expected_values(coll: Collective) -> dict[tuple[int, int], tuple[int, int]]:
    """``coll.postcondition`` in the verifier's encoding: (rank, output slot) -> (input slot, origin bitset)."""
    return dict(iter_expected_values(coll))


def fill_inputs(coll: Collective, lay: Layout) -> None:
    """Fill the inputs, rank by rank (Collective.source_ranks: input slot s of rank r holds (r, s))."""
    c = coll
    for r in c.source_ranks:
        arr, _, base, limit = lay.views[r]["i"]
        held = min(c.input_chunks, limit)
        arr[base:base + held] = [(s, 1 << r) for s in range(held)]


def input_writes(program: Program, coll: Collective, keep_input: bool, max_errors: int,
                 columns: StepColumns | None = None) -> Errors:
    """An out-of-place program must leave ``i`` intact: NCCL declares ``sendbuff`` const and callers
    reuse it (issue 32; docs/programs.md, "Input buffer"). One error names the first offending step.
    ``columns`` (the program's :func:`~synth.program.columns.program_columns`) answer the common case, no
    such step, by array operations."""
    err = Errors(max_errors)
    if coll.inplace or not keep_input:
        return err
    if columns is not None:
        writes = kind_flags(columns.kind)[3]
        if not (writes & (columns.dstbuf == BUFFER_CODE["i"])).any():
            return err
    bad = [(gpu.id, tb.id, s, st) for gpu in program.gpus for tb in gpu.threadblocks
           for s, st in enumerate(tb.steps) if st.dstbuf == "i" and st.type in WRITES_DST]
    if not bad:
        return err
    r, tb, s, st = bad[0]
    more = f" ({len(bad) - 1} more steps write it too)" if len(bad) > 1 else ""
    err.add(f"rank {r} tb {tb} step {s} ({st.type}): writes input buffer i[{st.dstoff}:{st.dstoff + st.cnt}] "
            f"of an out-of-place program, whose input must stay intact (NCCL's sendbuff is const){more}")
    return err


def postcondition(coll: Collective, lay: Layout, tbs: tuple, max_errors: int) -> Errors:
    """Every output slot the collective names must hold exactly its postcondition value."""
    c, err = coll, Errors(max_errors)
    for (r, slot), expected in iter_expected_values(c):
        arr, wr, base, limit = lay.views[r]["o"]
        if slot >= limit:
            err.add(f"rank {r}: output buffer has {limit} chunks but {c.name} needs output slot {slot}")
            continue
        actual = arr[base + slot]
        if actual == expected:
            continue
        writer = wr[base + slot]
        by = f"last written by {step_name(tbs, *writer)}" if writer else "never written by any step"
        want = describe(expected)
        detail = ""
        if actual is not None and actual[0] == expected[0]:
            missing = ranks_of(expected[1] & ~actual[1])
            extra = ranks_of(actual[1] & ~expected[1])
            detail = f" (missing ranks {fmt_ranks(missing)}, extra ranks {fmt_ranks(extra)})"
        err.add(f"rank {r} output slot {slot}: holds {describe(actual)}, expected {want}{detail}; {by}")
    return err

"""Verification pass 3 on arrays: the symbolic execution of a well-formed program as a dataflow, level by level.

Without switch steps the order a program's steps may run in is static. A threadblock runs its steps in order, a
step waits for its dependency, and the k-th receive on a connection takes the k-th send on it, since one
threadblock sends on a connection and one receives, each in program order, through an unbounded FIFO. Those three
relations make a graph over the steps. The worklist execution (:mod:`synth.verification.execution`) runs to the
end exactly when every connection has as many receives as sends, of equal ``cnt``, and the graph has no cycle.
The steps' symbolic values then follow any topological order of the graph. :func:`dataflow_verified` runs them
level by level (Kahn's algorithm, every step of a level at once as numpy gathers and scatters), with a value
encoded as in the worklist run: (input slot, set of origin ranks), the set as bits in ``uint64`` words, or as one
origin rank when the program has no reduction step.

It answers only the common case, a program that verifies: it returns False on the first sign of anything else,
and the caller then runs the worklist execution, whose messages name the fault. The signs are:

- a connection whose sends and receives differ in number or ``cnt``, a receive with no sending threadblock;
- a cycle (the worklist run would block);
- a read of a slot holding no data, a reduction of different input slots or of overlapping rank sets;
- two steps of one level that touch one slot, one of them writing (they are unordered: a data race, whose
  outcome the worklist run's interleaving decides);
- an output slot that does not hold its postcondition value.

Both runs follow one legal interleaving of the steps, which is the only one when there is no race (the race
check itself runs on small programs only, in the worklist run: ``synth.verification.common.RACE_CHECK_BUDGET``).
"""

from __future__ import annotations

import numpy as np

from synth.collectives import ALL_ORIGINS, Collective
from synth.program.columns import NOP, RE, RRC, RRCS, RRS, kind_flags
from synth.program.ir import Program
from synth.verification.layout import Layout
from synth.verification.structure import ColumnRecords, Structure

__all__ = ["dataflow_verified", "VALUE_WORDS_BUDGET"]

#: Most ``uint64`` words the symbolic values may take (1 GiB): a program needing more is left to the worklist run.
VALUE_WORDS_BUDGET = 1 << 27
#: Postcondition entries compared at a time (bounds the expected bitsets' memory).
_BLOCK = 1 << 16
_REDUCTIONS = (RRS, RRC, RRCS, RE)


def dataflow_verified(program: Program, coll: Collective, lay: Layout, st: Structure) -> bool:
    """Does ``program`` run to the end and leave every output slot holding its postcondition value, by the
    dataflow run (module docstring)? False means "not shown": the worklist execution must decide. ``lay``: the
    layout with the inputs filled (its slot lists are read for their sizes only); ``st``: the compiled structure."""
    recs = st.steps
    if program.switches or not isinstance(recs, ColumnRecords) or recs.compiled:
        return False
    start = np.asarray(recs.start, dtype=np.int64)
    kind = recs.kind
    cnt = np.where(kind == NOP, 0, recs.cnt).astype(np.int64)   # a nop moves no data
    tb_of = np.repeat(np.arange(len(start) - 1), np.diff(start))
    base_of, total_slots = _slot_bases(lay)
    matched = _matched_sends(st, recs, tb_of, cnt)
    if matched is None:
        return False
    send_of_recv, msg_base, msg_slots = matched
    level = _levels(start, tb_of, recs.dep_flat, send_of_recv)
    if level is None:
        return False
    reductions = np.isin(kind, _REDUCTIONS)
    words = (coll.num_ranks + 63) // 64 if reductions.any() else 0
    if (total_slots + msg_slots + 1) * max(words, 1) > VALUE_WORDS_BUDGET:
        return False
    key_base = np.array([base_of[id(slots)] if slots is not None else -1 for slots in recs.slots], dtype=np.int64)
    plan = _element_plan(recs, kind, cnt, reductions, level, key_base, total_slots, msg_slots, send_of_recv, msg_base)
    values = _Values(total_slots + msg_slots + 1, words)
    _fill_inputs(values, coll, lay, base_of)
    if not _run(values, plan):
        return False
    return _postcondition_holds(values, coll, lay, base_of)


def _slot_bases(lay: Layout) -> tuple[dict[int, int], int]:
    """Each physical slot list's first position in one numbering of every rank's slots, and the total."""
    base_of: dict[int, int] = {}
    total = 0
    for views in lay.views:
        for slots, _, _, _ in views.values():
            if id(slots) not in base_of:
                base_of[id(slots)] = total
                total += len(slots)
    return base_of, total


def _matched_sends(st: Structure, recs: ColumnRecords, tb_of: np.ndarray, cnt: np.ndarray):
    """(the send each receive step takes: k-th with k-th per connection, -1 elsewhere; each send step's first
    message slot; message slots in all), or None where a connection's sends and receives differ in number or
    ``cnt``, or a receive has no sending threadblock."""
    ntb = len(st.tbs)
    conn_id = {key: c for c, key in enumerate(st.conns.sender)}
    send_conn = np.full(ntb, -1, dtype=np.int64)
    for key, g in st.conns.sender.items():
        send_conn[g] = conn_id[key]
    recv_conn = np.full(ntb, -1, dtype=np.int64)
    for key, g in st.conns.receiver.items():
        recv_conn[g] = conn_id.get(key, -1)
    sends = np.flatnonzero(recs.sends)
    receives = np.flatnonzero(recs.receives)
    on_send, on_recv = send_conn[tb_of[sends]], recv_conn[tb_of[receives]]
    if (on_send < 0).any() or (on_recv < 0).any():
        return None
    num_conns = len(conn_id)
    if not np.array_equal(np.bincount(on_send, minlength=num_conns), np.bincount(on_recv, minlength=num_conns)):
        return None
    # stable sorts keep each connection's steps in program order: k-th send meets k-th receive
    paired_sends = sends[np.argsort(on_send, kind="stable")]
    paired_recvs = receives[np.argsort(on_recv, kind="stable")]
    if not np.array_equal(cnt[paired_sends], cnt[paired_recvs]):
        return None
    send_of_recv = np.full(len(cnt), -1, dtype=np.int64)
    send_of_recv[paired_recvs] = paired_sends
    msg_base = np.full(len(cnt), -1, dtype=np.int64)
    sizes = cnt[sends]
    msg_base[sends] = np.cumsum(sizes) - sizes
    return send_of_recv, msg_base, int(sizes.sum())


def _levels(start: np.ndarray, tb_of: np.ndarray, dep_flat: np.ndarray, send_of_recv: np.ndarray):
    """Every step's level in the step graph (program order, dependencies, messages) by Kahn's algorithm, or None
    where the graph has a cycle."""
    n = len(tb_of)
    later = np.ones(n, dtype=bool)
    later[start[:-1][start[:-1] < n]] = False     # first steps of threadblocks follow no step of their own
    after = np.flatnonzero(later)
    with_dep = np.flatnonzero(dep_flat >= 0)
    received = np.flatnonzero(send_of_recv >= 0)
    src = np.concatenate([after - 1, dep_flat[with_dep], send_of_recv[received]])
    dst = np.concatenate([after, with_dep, received])
    waiting = np.bincount(dst, minlength=n)
    by_src = np.argsort(src, kind="stable")
    successors = dst[by_src]
    first = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=first[1:])
    level = np.empty(n, dtype=np.int64)
    frontier = np.flatnonzero(waiting == 0)
    depth = done = 0
    while len(frontier):
        level[frontier] = depth
        done += len(frontier)
        lo, hi = first[frontier], first[frontier + 1]
        counts = hi - lo
        total = int(counts.sum())
        if not total:
            break
        offsets = np.cumsum(counts) - counts
        nxt = successors[np.arange(total) + np.repeat(lo - offsets, counts)]
        touched, times = np.unique(nxt, return_counts=True)
        waiting[touched] -= times
        frontier = touched[waiting[touched] == 0]
        depth += 1
    if done < n:
        return None
    return level


class _Plan:
    """The data moves of every step, one entry per chunk, by level, copies before reductions within one
    (``levels``: (first, first reduction, end)): each reads ``first_operand`` (a slot or message position), a
    reduction also ``second_operand`` (-1 for copies), and writes the result to ``written`` and ``sent`` (the
    spare last position where the step writes or sends nothing)."""

    def __init__(self, levels: list, first_operand: np.ndarray, second_operand: np.ndarray, written: np.ndarray,
                 sent: np.ndarray) -> None:
        self.levels, self.first_operand, self.second_operand = levels, first_operand, second_operand
        self.written, self.sent = written, sent


def _element_plan(recs: ColumnRecords, kind: np.ndarray, cnt: np.ndarray, reductions: np.ndarray,
                  level: np.ndarray, key_base: np.ndarray, total_slots: int, msg_slots: int,
                  send_of_recv: np.ndarray, msg_base: np.ndarray) -> _Plan:
    """The :class:`_Plan` of the steps in level order."""
    _, _, reads, writes = kind_flags(kind)
    spare = total_slots + msg_slots
    src = np.where(reads, key_base[recs.src_key] + recs.src_offset, -1)
    dst = np.where(writes, key_base[recs.dst_key] + recs.dst_offset, -1)
    incoming = np.where(recs.receives, total_slots + msg_base[np.maximum(send_of_recv, 0)], -1)
    outgoing = np.where(recs.sends, total_slots + msg_base, -1)
    first = np.where(recs.receives, incoming, np.where(kind == RE, dst, src))
    group_key = level * 2 + reductions
    order = np.argsort(group_key, kind="stable")
    order = order[cnt[order] > 0]
    sizes = cnt[order]
    step = np.repeat(order, sizes)
    chunk = np.arange(len(step), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    # per level: where its chunks start, where its reductions start, where it ends
    ends = np.concatenate([[0], np.cumsum(sizes)])
    levels_here = level[order]
    num_levels = int(levels_here[-1]) + 1 if len(order) else 0
    level_start = ends[np.searchsorted(levels_here, np.arange(num_levels + 1))]
    reduction_start = ends[np.searchsorted(group_key[order], np.arange(num_levels) * 2 + 1)]
    levels = list(zip(level_start[:-1].tolist(), reduction_start.tolist(), level_start[1:].tolist(), strict=True))
    written = np.where(dst[step] >= 0, dst[step] + chunk, spare)
    sent = np.where(outgoing[step] >= 0, outgoing[step] + chunk, spare)
    second = np.where(reductions[step], src[step] + chunk, -1)
    return _Plan(levels, first[step] + chunk, second, written, sent)


class _Values:
    """The symbolic values of every slot and message position: input slot (-1: no data) and origin ranks, as bit
    words (``words`` > 0) or as one rank."""

    def __init__(self, size: int, words: int) -> None:
        self.slot = np.full(size, -1, dtype=np.int64)
        self.words = words
        self.ranks = np.zeros((size, words), dtype=np.uint64) if words else np.full(size, -1, dtype=np.int64)


def _fill_inputs(values: _Values, coll: Collective, lay: Layout, base_of: dict[int, int]) -> None:
    """:func:`synth.verification.conditions.fill_inputs` on the arrays: input slot s of rank r holds (s, {r})."""
    for r in coll.source_ranks:
        slots, _, base, limit = lay.views[r]["i"]
        held = min(coll.input_chunks, limit)
        at = base_of[id(slots)] + base
        values.slot[at:at + held] = np.arange(held)
        if values.words:
            values.ranks[at:at + held, r // 64] = np.uint64(1 << (r % 64))
        else:
            values.ranks[at:at + held] = r


def _run(values: _Values, plan: _Plan) -> bool:
    """Run the plan level by level; False at the first read of no data, bad reduction or data race."""
    slot, ranks = values.slot, values.ranks
    written, sent, first_operand, second_operand = plan.written, plan.sent, plan.first_operand, plan.second_operand
    spare = len(slot) - 1
    for a, m, b in plan.levels:
        if _races(written[a:b], first_operand[a:b], second_operand[m:b], m - a, spare):
            return False
        for lo, hi in ((a, m), (m, b)):     # copies, then reductions (no slot is both written and read here)
            if lo == hi:
                continue
            first = first_operand[lo:hi]
            held = slot[first]
            if (held < 0).any():
                return False
            result = ranks[first]
            if lo == m:
                second = second_operand[lo:hi]
                other_ranks = ranks[second]
                if (slot[second] != held).any() or (result & other_ranks).any():
                    return False
                result |= other_ranks
            here, out = written[lo:hi], sent[lo:hi]
            slot[here] = held
            ranks[here] = result
            slot[out] = held
            ranks[out] = result
    return True


def _races(written: np.ndarray, first: np.ndarray, second: np.ndarray, second_from: int, spare: int) -> bool:
    """Do chunks of one level write a slot twice, or write a slot another chunk of the level reads? ``second``:
    the second operands of the chunks from ``second_from`` on. (A chunk may read the slot it writes: a reduction
    into its own dst.)"""
    writing = np.flatnonzero(written != spare)
    if not len(writing):
        return False
    real = written[writing]
    order = np.argsort(real)
    sorted_written = real[order]
    if (sorted_written[1:] == sorted_written[:-1]).any():
        return True
    for operand, offset in ((first, 0), (second, second_from)):
        at = np.searchsorted(sorted_written, operand)
        hit = sorted_written[np.minimum(at, len(real) - 1)] == operand
        if hit.any() and (writing[order[at[hit]]] != np.flatnonzero(hit) + offset).any():
            return True
    return False


def _postcondition_holds(values: _Values, coll: Collective, lay: Layout, base_of: dict[int, int]) -> bool:
    """Does every output slot the collective names hold its postcondition value (and exist)?"""
    post = coll.postcondition_arrays()
    first = np.empty(coll.num_ranks, dtype=np.int64)
    limit = np.empty(coll.num_ranks, dtype=np.int64)
    for r, views in enumerate(lay.views):
        slots, _, base, size = views["o"]
        first[r], limit[r] = base_of[id(slots)] + base, size
    if (post.slot >= limit[post.rank]).any():
        return False
    where = first[post.rank] + post.slot
    if not np.array_equal(values.slot[where], post.input_slot):
        return False
    if not values.words:
        return bool((post.origin != ALL_ORIGINS).all() and np.array_equal(values.ranks[where], post.origin))
    every = np.zeros(values.words, dtype=np.uint64)
    for r in range(coll.num_ranks):
        every[r // 64] |= np.uint64(1 << (r % 64))
    for at in range(0, len(where), _BLOCK):
        origin = post.origin[at:at + _BLOCK]
        expected = np.zeros((len(origin), values.words), dtype=np.uint64)
        whole = origin == ALL_ORIGINS
        expected[whole] = every
        single = np.flatnonzero(~whole)
        expected[single, origin[single] // 64] = np.left_shift(np.uint64(1), (origin[single] % 64).astype(np.uint64))
        if not np.array_equal(values.ranks[where[at:at + _BLOCK]], expected):
            return False
    return True

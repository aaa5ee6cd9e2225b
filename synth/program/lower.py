"""Lowering: a chunk-level :class:`~synth.schedule.Schedule` becomes a rank-level MSCCL
:class:`~synth.program.ir.Program` (threadblocks, ordered steps, buffers, dependencies).

Buffer placement (collective semantics in :mod:`synth.collectives`):

- copy collectives: a chunk lives at its output slot on ranks whose postcondition wants it, at its
  input slot on its origin (which also copies it to its own output slot with ``cpy`` when the two
  differ), and in a scratch slot (``s``) on ranks that only relay it;
- reductions in place: the partial sum of chunk ``j`` accumulates in input slot ``j`` (``rrc`` with the
  local operand = input ``j``), which is the output; a copy of the final value received from a peer
  lands directly in the output slot (or a scratch slot on a pure relay);
- reductions out of place never write the input (NCCL's sendbuff is const, docs/programs.md): the
  partial sum accumulates in the output slot where ``j`` ends up, else in scratch
  (:func:`_accumulator_placement`), and reaches the output slot by ``cpy`` only from scratch; where a
  scheduled group would mix input-reading and accumulator-reading chunks, those accumulators start as
  a ``cpy`` of input ``j`` (:func:`_seeded`), so the group stays one step;
- copy collectives out of place: a chunk a relay route hands back to its origin lands in scratch.

Threadblocks: one per (channel, peer, direction) (MSCCL's rule, docs/programs.md), plus local threadblocks for
``cpy``. Where a rank would have more than 32 send (or receive) peers on one channel, more than MSCCL
takes, connections move to further channels (:func:`spread_peers`; an alltoall on 64 ranks).
Steps on a connection are ordered by transfer start time, identically on both ends.
Dependencies come from the buffer accesses at each rank, in schedule time order:
a read waits for the last write of that slot (RAW), a write waits for the last write and for every
read since (WAW, WAR: e.g. an ``rrc`` must not race a send of the same partial sum). The first
cross-threadblock dependency goes in ``depid/deps``; extra ones become ``nop`` steps placed just
before the step. A rank's sends that share the first physical link of their route (the uplink
``(src, route[0])`` to a switch, or the direct link) but sit in different threadblocks also wait
for the previous such send in schedule order (:func:`uplink_dependencies`), so the link serves them
as planned rather than first come first served; dropped on ranks where it would need more than 128
depended-on threadblocks (MSCCL limit). A rank's sends through a switch also wait for the receives
through switches that the schedule completes at that rank before they start (:func:`switch_pacing`), so
that no rank takes a shared switch link out of turn; dropped first on such ranks. Transfers of one
``group`` (>= 0) that are consecutive on a connection and contiguous in the buffers at both ends become
one step with ``cnt`` > 1 (one α, docs/cost-model.md).
A connection that needs more than ``max_steps_per_tb`` steps is cut into consecutive blocks on extra
channels (``chan + k * nchannels``); each block's first send waits for the previous block's last. Blocks are of
equal length; where those overflow on every channel a connection may take (its nops crowd in one stretch: a
reduction's receives that wait on many threadblocks), every split connection is cut into blocks of equal steps.

Implementation: schedules reach millions of transfers (trees on 1024 ranks), so every per-transfer
stage works on numpy arrays (one entry per transfer, op or buffer access; groups found by
``lexsort``); only the final :class:`Step` objects and the few local copies are built in Python.
Ops are numbered: transfer ``i`` (in (start, end, channel, group, chunk) order) is send op ``2i``
and receive op ``2i + 1``; local copies follow. Buffers are coded ``i``=0, ``o``=1, ``s``=2.

Reference for the step/threadblock semantics: msccl-tools (microsoft/msccl-tools, ``ir.py``) and
the MSCCL runtime's XML loader (Azure/msccl-executor-nccl).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from synth.arrays import unique_values
from synth.collectives import Collective
from synth.errors import SynthError
from synth.gcpause import gc_paused
from synth.program.columns import BUFFER_CODE, KIND, StepColumns
from synth.program.ir import Gpu, Program, Step, Threadblock
from synth.runtime_limits import MAX_CHANNELS, MAX_DEPENDED_TB, MAX_STEP_CHUNKS, MAX_STEPS_PER_TB, MAX_TB_PER_CHANNEL
from synth.schedule import Schedule, Transfer, TransferTable

_EPS = 1e-9

BUFFERS = ("i", "o", "s")
I_BUF, O_BUF, S_BUF = 0, 1, 2
SEND, RECV, LOCAL = 0, 1, 2          # op kinds; also the threadblock order within a channel
KIND_NAMES = ("send", "recv", "local")
OP_TYPES = ("s", "r", "rrc", "cpy")
T_SEND, T_RECV, T_RRC, T_CPY = 0, 1, 2, 3


def _tol(t: np.ndarray) -> np.ndarray:
    return _EPS * np.maximum(1.0, np.abs(t))


# ---------------------------------------------------------------------------------------------
# buffer layout (the collective's semantics, vectorised, are :class:`Collective`'s queries)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Where buffers ``i`` and ``o`` of every rank live after in-place aliasing: (code, base[rank])."""

    i_code: int
    i_base: np.ndarray
    o_code: int
    o_base: np.ndarray

    @staticmethod
    def of(coll: Collective) -> Layout:
        def one(buffer: str, own: int) -> tuple[int, np.ndarray]:
            aliases = [coll.alias(r, buffer) for r in range(coll.num_ranks)]
            if aliases[0] is None:
                return own, np.zeros(coll.num_ranks, dtype=np.int64)
            return BUFFERS.index(aliases[0][0]), np.array([a[1] for a in aliases], dtype=np.int64)

        return Layout(*one("i", I_BUF), *one("o", O_BUF))

    def input(self, rank: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.full(len(rank), self.i_code, dtype=np.int64), offset + self.i_base[rank]

    def output(self, rank: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.full(len(rank), self.o_code, dtype=np.int64), offset + self.o_base[rank]


def initial_holds(coll: Collective, layout: Layout, rank: np.ndarray, code: np.ndarray,
                  off: np.ndarray) -> np.ndarray:
    """Chunk each slot holds before any step (:meth:`Collective.initial_chunk`), -1 for none."""
    held = coll.initial_chunk(rank, off - layout.i_base[rank])
    return np.where(code == layout.i_code, held, -1)


# ---------------------------------------------------------------------------------------------
# small array helpers
# ---------------------------------------------------------------------------------------------
def _group_starts(keys: np.ndarray) -> np.ndarray:
    """For sorted ``keys``: boolean mask of the first element of every run of equal keys."""
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    return first


def _rank_in_group(first: np.ndarray) -> np.ndarray:
    """Position of each element within its run (runs given by ``_group_starts``)."""
    idx = np.arange(len(first))
    return idx - np.maximum.accumulate(np.where(first, idx, 0))


def _first_come_slots(rank: np.ndarray, chunk: np.ndarray, nchunks: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Scratch slot per request (requests in order): each rank numbers its distinct chunks 0, 1, ...
    in order of first request. Returns (slot per request, slots used per rank)."""
    if len(rank) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(n, dtype=np.int64)
    key = rank * nchunks + chunk
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    owner = uniq[by_first] // nchunks
    by_rank = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=n)
    starts = np.cumsum(counts) - counts
    slot_by_first = np.empty(len(uniq), dtype=np.int64)
    slot_by_first[by_rank] = np.arange(len(uniq)) - starts[owner[by_rank]]
    slot_of_uniq = np.empty(len(uniq), dtype=np.int64)
    slot_of_uniq[by_first] = slot_by_first
    return slot_of_uniq[inverse.ravel()], counts


# ---------------------------------------------------------------------------------------------
# the transfers as arrays
# ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Transfers(TransferTable):
    """Schedule transfers sorted by (start, end, channel, group, chunk), one array per field, and the first hop
    of each (the lowering reassigns ``channel``)."""

    hop: np.ndarray          # first node after src: route[0] (a switch) or dst (direct link)

    @staticmethod
    def of(schedule: Schedule) -> _Transfers:
        ts = schedule.transfers
        if isinstance(ts, TransferTable):   # columns already (direct links: the first hop is the receiver)
            start, end, chunk, src, dst, reduce, channel, group = ts.columns()
            order = np.lexsort((chunk, group, channel, end, start))
            return _Transfers(*(a[order] for a in (start, end, chunk, src, dst, reduce, channel, group, dst)))

        fields = list(zip(*ts, strict=True)) if ts else [()] * len(Transfer._fields)

        def column(name: str, dtype) -> np.ndarray:
            return np.array(fields[Transfer._fields.index(name)], dtype=dtype)

        start, end = column("start", float), column("end", float)
        chunk, src, dst = column("chunk", np.int64), column("src", np.int64), column("dst", np.int64)
        reduce = column("reduce", bool)
        channel, group = column("channel", np.int64), column("group", np.int64)
        hop = np.fromiter((t.route[0] if t.route else t.dst for t in ts), dtype=np.int64, count=len(ts))
        order = np.lexsort((chunk, group, channel, end, start))   # stable, like the sorted() it replaces
        return _Transfers(*(a[order] for a in (start, end, chunk, src, dst, reduce, channel, group, hop)))

    def check(self, coll: Collective) -> None:
        """Reject transfers that name bad ranks/chunks; reports the first bad one, in order."""
        n = coll.num_ranks
        checks = [
            (~((self.src >= 0) & (self.src < n) & (self.dst >= 0) & (self.dst < n)),
             lambda i: f"schedule transfer {self.src[i]}->{self.dst[i]} names a rank outside 0..{n - 1}"),
            (self.src == self.dst,
             lambda i: f"schedule transfer of chunk {self.chunk[i]} from rank {self.src[i]} to itself"),
            (~coll.is_schedule_chunk(self.chunk),
             lambda i: f"schedule moves chunk {self.chunk[i]}, which {coll.name} does not have"),
            (self.reduce & (not coll.is_reduction),
             lambda i: f"schedule reduces chunk {self.chunk[i]} but {coll.name} is not a reduction"),
            (self.channel < 0, lambda i: f"schedule transfer uses negative channel {self.channel[i]}"),
            (self.end < self.start - _tol(self.start),
             lambda i: f"schedule transfer of chunk {self.chunk[i]} ends before it starts"),
        ]
        bad = np.zeros(len(self), dtype=bool)
        for mask, _ in checks:
            bad |= mask
        if not bad.any():
            return
        i = int(np.argmax(bad))
        for mask, message in checks:
            if mask[i]:
                raise SynthError(message(i))


# ---------------------------------------------------------------------------------------------
# ops: placement of every send, receive and local copy
# ---------------------------------------------------------------------------------------------
@dataclass
class _Ops:
    """One entry per op (before merging): rank, kind, type, src/dst (buffer code, offset), time."""

    rank: np.ndarray
    kind: np.ndarray
    type: np.ndarray
    src_buf: np.ndarray
    src_off: np.ndarray
    dst_buf: np.ndarray
    dst_off: np.ndarray
    time: np.ndarray
    local_chunk: np.ndarray      # chunk of each local copy (ops 2T..)

    def __len__(self) -> int:
        return len(self.rank)


def _interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty(2 * len(a), dtype=np.result_type(a, b))
    out[0::2], out[1::2] = a, b
    return out


def _arrival_order(tr: _Transfers) -> np.ndarray:
    """Receives in (end, start, index) order: scratch slots of one stream come out contiguous."""
    return np.lexsort((np.arange(len(tr)), tr.start, tr.end))


def _copy_placement(coll: Collective, layout: Layout, tr: _Transfers, arrival: np.ndarray):
    """(send loc, receive loc, scratch per rank) for copy collectives: origin's input slot,
    destination's output slot, else a scratch slot numbered in arrival order. Out of place, a copy
    that comes back to its origin lands in scratch (the input buffer is never written)."""
    def home(rank: np.ndarray, chunk: np.ndarray):
        origin = coll.chunk_origin(chunk)
        dest = coll.destination_slot(rank, chunk)
        ib, io = layout.input(rank, coll.chunk_input_slot(chunk))
        ob, oo = layout.output(rank, np.maximum(dest, 0))
        mine = origin == rank
        code = np.where(mine, ib, np.where(dest >= 0, ob, S_BUF))
        off = np.where(mine, io, np.where(dest >= 0, oo, -1))
        return code, off, (mine & (dest >= 0), ob, oo)

    s_code, s_off, (own_out, s_ob, s_oo) = home(tr.src, tr.chunk)
    r_code, r_off, _ = home(tr.dst, tr.chunk)
    if not coll.inplace:
        # a message that carries the origin's own chunk with relayed ones (recursive doubling) reads the own
        # chunk from its output slot, where the local cpy at the start put it: the message stays one step
        # (one α) instead of an input step and an output step
        grouped = tr.group >= 0
        message = tr.src * (int(tr.group.max(initial=0)) + 1) + tr.group
        mixed = np.isin(message, message[grouped & (s_code == O_BUF)]) & grouped & own_out
        s_code = np.where(mixed, s_ob, s_code)
        s_off = np.where(mixed, s_oo, s_off)
        # a relay route through the chunk's origin (rdh where the butterfly does not embed) hands the
        # origin its own chunk back: it lands in scratch, the input stays intact (and still serves sends)
        back = tr.dst == coll.chunk_origin(tr.chunk)
        r_code = np.where(back, S_BUF, r_code)
        r_off = np.where(back, -1, r_off)
    # scratch requests: receives in arrival order, then (inconsistent schedules only) sends
    need_r = arrival[r_code[arrival] == S_BUF]
    need_s = np.flatnonzero(s_code == S_BUF)
    req_rank = np.concatenate([tr.dst[need_r], tr.src[need_s]])
    req_chunk = np.concatenate([tr.chunk[need_r], tr.chunk[need_s]])
    slots, used = _first_come_slots(req_rank, req_chunk, coll.chunk_space, coll.num_ranks)
    r_off[need_r] = slots[:len(need_r)]
    s_off[need_s] = slots[len(need_r):]
    return (s_code, s_off), (r_code, r_off), used


def _latest_copy(c_key, c_end, c_pos, q_key, q_limit) -> np.ndarray:
    """For each query (key, limit): index into the copies of the copy with that key, end <= limit
    and the latest arrival position (-1 if none)."""
    nc, nq = len(c_key), len(q_key)
    key = np.concatenate([c_key, q_key])
    value = np.concatenate([c_end, q_limit])
    is_query = np.concatenate([np.zeros(nc, dtype=bool), np.ones(nq, dtype=bool)])
    pos = np.concatenate([c_pos, np.zeros(nq, dtype=np.int64)])
    order = np.lexsort((pos, is_query, value, key))
    item = np.where(is_query[order], -1, order)           # copy index, or -1 for queries
    last = np.maximum.accumulate(np.where(item >= 0, np.arange(len(order)), -1)) if len(order) else item
    found = np.where(last >= 0, item[np.maximum(last, 0)], -1)
    found = np.where((found >= 0) & (key[order][np.maximum(last, 0)] == key[order]), found, -1)
    result = np.full(nq, -1, dtype=np.int64)
    queries = is_query[order]
    result[order[queries] - nc] = found[queries]
    return result


def _reduction_placement(coll: Collective, layout: Layout, tr: _Transfers, arrival: np.ndarray):
    """(send loc, receive loc, scratch per rank) for reductions: partial sums in input slot ``j``;
    a copy of the final value goes to the output slot (scratch on a relay) and later non-reducing
    sends of that chunk read the latest such copy that has arrived."""
    r_code, r_off = layout.input(tr.dst, tr.chunk)
    s_code, s_off = layout.input(tr.src, tr.chunk)
    copy = ~tr.reduce
    dest = coll.destination_slot(tr.dst, tr.chunk)
    ob, oo = layout.output(tr.dst, np.maximum(dest, 0))
    r_code = np.where(copy, np.where(dest >= 0, ob, S_BUF), r_code)
    r_off = np.where(copy, np.where(dest >= 0, oo, -1), r_off)
    need = arrival[r_code[arrival] == S_BUF]
    slots, used = _first_come_slots(tr.dst[need], tr.chunk[need], coll.chunk_space, coll.num_ranks)
    r_off[need] = slots
    # non-reducing sends read the latest copy received by then (else the partial sum in i[j])
    _send_latest_copies(tr, arrival, coll.chunk_space, (r_code, r_off), (s_code, s_off))
    return (s_code, s_off), (r_code, r_off), used


def _send_latest_copies(tr: _Transfers, arrival: np.ndarray, nchunks: int, received, sent) -> None:
    """Reductions: point each non-reducing send at the latest non-reducing receive of its (rank, chunk)
    that has arrived by the send's start (:func:`_latest_copy`); ``sent`` (code, offset) is updated in
    place from ``received`` (code, offset), and sends with no such copy keep their location."""
    copy = ~tr.reduce
    copies = arrival[copy[arrival]]
    queries = np.flatnonzero(copy)
    hit = _latest_copy(tr.dst[copies] * nchunks + tr.chunk[copies], tr.end[copies], np.arange(len(copies)),
                       tr.src[queries] * nchunks + tr.chunk[queries], tr.start[queries] + _tol(tr.start[queries]))
    got = queries[hit >= 0]
    src_of = copies[hit[hit >= 0]]
    for out, into in zip(sent, received, strict=True):
        out[got] = into[src_of]


def _first_by_end(tr: _Transfers, idx: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For transfers ``idx`` with keys ``key``: mask of the first per key in (end, index) order (the order
    :func:`dependencies` gives their writes), and that order."""
    order = np.lexsort((idx, tr.end[idx], key))
    first = np.zeros(len(idx), dtype=bool)
    first[order] = _group_starts(key[order])
    return first, order


def _accumulator_placement(coll: Collective, layout: Layout, tr: _Transfers, arrival: np.ndarray):
    """Out-of-place reductions: like :func:`_reduction_placement`, but the input buffer is never written
    (NCCL's ``sendbuff`` is const; docs/programs.md, "Input buffer"). The partial sum of chunk ``j`` on a
    rank that reduces into it lives in an *accumulator*: the output slot where ``j`` ends up on that rank,
    or a scratch slot where it ends up nowhere (or where a copy of ``j`` lands there while the partial sum
    is still in use). The first reducing receive takes input ``j`` as its local operand and writes the
    accumulator (``rrc i -> o/s``), later ones reduce into the accumulator; a send of the partial sum reads
    input ``j`` until the first reducing receive has arrived, the accumulator after. Seeded pairs
    (:func:`_seeded`) have an accumulator holding a copy of input ``j`` from the start: their sends and
    every ``rrc`` read it. A rank's scratch accumulators come first, in chunk order, then its copies.

    Returns (send loc, receive loc, rrc local operand, scratch per rank, accumulator code and offset per
    ``rank * chunks + chunk``, -1 where the rank accumulates nothing, and the seeded mask)."""
    n, nch = coll.num_ranks, coll.chunk_space
    copy = ~tr.reduce
    red = np.flatnonzero(tr.reduce)
    pair = tr.dst * nch + tr.chunk                                   # receiving (rank, chunk)
    spair = tr.src * nch + tr.chunk                                  # sending (rank, chunk)
    tol = _tol(tr.end)
    # the partial sum is in use until the last reducing receive or reducing send of the pair
    busy = np.full(n * nch, -np.inf)
    np.maximum.at(busy, pair[red], tr.end[red] + tol[red])
    np.maximum.at(busy, spair[red], tr.start[red] + _tol(tr.start[red]))
    early_copy = np.zeros(n * nch, dtype=bool)
    cp = np.flatnonzero(copy)
    early_copy[pair[cp][tr.end[cp] <= busy[pair[cp]]]] = True
    has_acc = np.zeros(n * nch, dtype=bool)
    has_acc[pair[red]] = True
    first, _ = _first_by_end(tr, red, pair[red])
    first_end = np.full(n * nch, np.inf)
    np.minimum.at(first_end, pair[red], tr.end[red])
    ready = first_end[spair] <= tr.start + _tol(tr.start)
    seeded = _seeded(tr, red, first, ready, pair, spair, n * nch)
    has_acc |= seeded
    ranks, chunks = np.divmod(np.arange(n * nch), nch)
    dest = coll.destination_slot(ranks, chunks)
    ob, oo = layout.output(ranks, np.maximum(dest, 0))
    in_out = has_acc & (dest >= 0) & ~early_copy
    in_out &= ~_split_accumulators(tr, red, pair, in_out)
    acc_code = np.where(in_out, ob, np.where(has_acc, S_BUF, -1))
    acc_off = np.where(in_out, oo, -1)
    # receives: reducing ones write the accumulator, copies the output slot (scratch on a relay)
    dest_r = coll.destination_slot(tr.dst, tr.chunk)
    rob, roo = layout.output(tr.dst, np.maximum(dest_r, 0))
    r_code = np.where(tr.reduce, acc_code[pair], np.where(dest_r >= 0, rob, S_BUF))
    r_off = np.where(tr.reduce, acc_off[pair], np.where(dest_r >= 0, roo, -1))
    # scratch: a rank's accumulators first, in chunk order (consecutive chunks stay contiguous, as in
    # i[j] in place, so grouped transfers still merge into one step), then copies in arrival order
    in_s = np.flatnonzero(acc_code == S_BUF)                         # sorted: by rank, then chunk
    acc_used = np.bincount(in_s // nch, minlength=n)
    acc_off[in_s] = np.arange(len(in_s)) - (np.cumsum(acc_used) - acc_used)[in_s // nch]
    r_off[red] = acc_off[pair[red]]
    need = arrival[copy[arrival] & (r_code[arrival] == S_BUF)]
    slots, used = _first_come_slots(tr.dst[need], tr.chunk[need], nch, n)
    r_off[need] = slots + acc_used[tr.dst[need]]
    used = used + acc_used
    # local operand of each rrc: input j for the pair's first reducing receive (unless seeded), the
    # accumulator after
    i_code, i_off = layout.input(tr.dst, tr.chunk)
    l_code, l_off = r_code.copy(), r_off.copy()
    lead = red[first & ~seeded[pair[red]]]
    l_code[lead], l_off[lead] = i_code[lead], i_off[lead]
    # sends of the partial sum: the accumulator once the first reducing receive has arrived (from the
    # start where seeded), else input j
    s_code, s_off = layout.input(tr.src, tr.chunk)
    ready = ready | seeded[spair]
    s_code = np.where(ready, acc_code[spair], s_code)
    s_off = np.where(ready, acc_off[spair], s_off)
    # non-reducing sends read the latest copy received by then (else the partial sum, as above)
    _send_latest_copies(tr, arrival, nch, (r_code, r_off), (s_code, s_off))
    return (s_code, s_off), (r_code, r_off), (l_code, l_off), used, (acc_code, acc_off, seeded)


def _reducing_groups(tr: _Transfers, red: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The grouped reducing transfers (``group`` >= 0) ordered by connection and group, and each one's group
    number: a group is what the schedule times as one step on one connection (channel)."""
    grouped = red[tr.group[red] >= 0]
    if len(grouped) == 0:
        return grouped, grouped
    grouped = grouped[np.lexsort((tr.group[grouped], tr.channel[grouped], tr.dst[grouped], tr.src[grouped]))]
    starts = (_group_starts(tr.src[grouped]) | _group_starts(tr.dst[grouped])
              | _group_starts(tr.channel[grouped]) | _group_starts(tr.group[grouped]))
    return grouped, np.cumsum(starts) - 1


def _mixed(gid: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """Per grouped transfer: whether its group holds members with ``flag`` and members without."""
    ng = int(gid[-1]) + 1
    some = np.bincount(gid, weights=flag, minlength=ng) > 0
    every = np.bincount(gid, weights=~flag, minlength=ng) == 0
    return (some & ~every)[gid]


def _seeded(tr: _Transfers, red: np.ndarray, first: np.ndarray, ready: np.ndarray, pair: np.ndarray,
            spair: np.ndarray, npairs: int) -> np.ndarray:
    """(rank, chunk) pairs whose accumulator starts as a local copy of input ``j`` (``cpy i -> acc``
    before any step; local steps cost nothing in the model). A group of reducing transfers on one
    connection, which the schedule times as one step (one α), may mix sends of input ``j`` (no partial
    sum there yet) with sends of an accumulator, or first ``rrc`` (operand input ``j``) with later ones
    (operand the accumulator): two buffers, so several steps where in place (everything in ``i[j]``)
    there was one. Seeding the input-reading members' pairs makes the group uniform; repeated until
    no group mixes (a seeded pair's other transfers change kind too)."""
    seeded = np.zeros(npairs, dtype=bool)
    grouped, gid = _reducing_groups(tr, red)
    if len(grouped) == 0:
        return seeded
    is_first = np.zeros(len(tr), dtype=bool)
    is_first[red[first]] = True
    while True:
        send_acc = ready[grouped] | seeded[spair[grouped]]
        recv_acc = ~is_first[grouped] | seeded[pair[grouped]]
        add = np.zeros(npairs, dtype=bool)
        for acc, key in ((send_acc, spair), (recv_acc, pair)):
            add[key[grouped[_mixed(gid, acc) & ~acc]]] = True
        add &= ~seeded
        if not add.any():
            return seeded
        seeded |= add


def _split_accumulators(tr: _Transfers, red: np.ndarray, pair: np.ndarray, in_out: np.ndarray) -> np.ndarray:
    """(rank, chunk) pairs to accumulate in scratch rather than in their output slot: the receiving rank's own
    chunks where a group of reducing receives (one step in the schedule, one α) also carries chunks it only
    relays, whose accumulators are in scratch; one buffer keeps the group one step (a rail that carries partial
    sums of its holder's own piece beside others' pieces). The own chunks' final value reaches the output slot
    by ``cpy`` from scratch, as a relay's does. Repeated until no group mixes."""
    moved = np.zeros(len(in_out), dtype=bool)
    grouped, gid = _reducing_groups(tr, red)
    if len(grouped) == 0:
        return moved
    while True:
        out = in_out[pair[grouped]] & ~moved[pair[grouped]]
        add = np.zeros(len(in_out), dtype=bool)
        add[pair[grouped[_mixed(gid, out) & out]]] = True
        add &= ~moved
        if not add.any():
            return moved
        moved |= add


def _local_copies(coll: Collective, layout: Layout, tr: _Transfers, acc=None):
    """Local ``cpy`` ops: (rank, chunk, src loc, dst loc, time), ordered by chunk then rank. ``acc``: the
    accumulators of an out-of-place reduction (:func:`_accumulator_placement`), the copies' sources."""
    if coll.is_reduction:
        chunks, ranks, slots = coll.destinations()
        nch = coll.chunk_space
        copy = ~tr.reduce
        got_copy = np.zeros(coll.num_ranks * nch, dtype=bool)
        got_copy[tr.dst[copy] * nch + tr.chunk[copy]] = True
        last_reduce = np.zeros(coll.num_ranks * nch)
        np.maximum.at(last_reduce, tr.dst[tr.reduce] * nch + tr.chunk[tr.reduce], tr.end[tr.reduce])
        keep = ~got_copy[ranks * nch + chunks]
        chunks, ranks, slots = chunks[keep], ranks[keep], slots[keep]
        src, dst = layout.input(ranks, chunks), layout.output(ranks, slots)
        time = last_reduce[ranks * nch + chunks]
        if acc is not None:
            code, off = acc[0][ranks * nch + chunks], acc[1][ranks * nch + chunks]
            src = (np.where(code >= 0, code, src[0]), np.where(code >= 0, off, src[1]))
            # seeded accumulators (:func:`_seeded`): cpy input j -> accumulator before any step
            seed_rank, seed_chunk = np.divmod(np.flatnonzero(acc[2]), nch)
            s_src = layout.input(seed_rank, seed_chunk)
            s_dst = (acc[0][acc[2]], acc[1][acc[2]])
            chunks, ranks = np.concatenate([seed_chunk, chunks]), np.concatenate([seed_rank, ranks])
            src = (np.concatenate([s_src[0], src[0]]), np.concatenate([s_src[1], src[1]]))
            dst = (np.concatenate([s_dst[0], dst[0]]), np.concatenate([s_dst[1], dst[1]]))
            time = np.concatenate([np.full(len(seed_rank), -1.0), time])
    else:
        chunks = np.asarray(coll.schedule_chunks, dtype=np.int64)
        ranks, in_slot = coll.chunk_origin(chunks), coll.chunk_input_slot(chunks)
        slots = coll.destination_slot(ranks, chunks)
        keep = slots >= 0
        chunks, ranks, slots, in_slot = chunks[keep], ranks[keep], slots[keep], in_slot[keep]
        src, dst = layout.input(ranks, in_slot), layout.output(ranks, slots)
        time = np.full(len(chunks), -1.0)
    differ = (src[0] != dst[0]) | (src[1] != dst[1])
    return (ranks[differ], chunks[differ], src[0][differ], src[1][differ], dst[0][differ], dst[1][differ],
            time[differ])


def build_ops(coll: Collective, layout: Layout, tr: _Transfers) -> tuple[_Ops, np.ndarray]:
    """All ops (send 2i, receive 2i+1, then local copies) and the scratch slots used per rank."""
    arrival = _arrival_order(tr)
    if coll.is_reduction and not coll.inplace:
        (s_code, s_off), (r_code, r_off), (a_code, a_off), scratch, acc = \
            _accumulator_placement(coll, layout, tr, arrival)
    else:
        place = _reduction_placement if coll.is_reduction else _copy_placement
        (s_code, s_off), (r_code, r_off), scratch = place(coll, layout, tr, arrival)
        a_code, a_off, acc = r_code, r_off, None     # in place, rrc reduces into its own operand
    l_rank, l_chunk, l_sb, l_so, l_db, l_do, l_time = _local_copies(coll, layout, tr, acc)
    # a receive's "src" is the sender's location, as msccl-tools writes it; an rrc's is its local operand
    rs_code = np.where(tr.reduce, a_code, s_code)
    rs_off = np.where(tr.reduce, a_off, s_off)
    nl = len(l_rank)
    ops = _Ops(
        rank=np.concatenate([_interleave(tr.src, tr.dst), l_rank]),
        kind=np.concatenate([np.tile([SEND, RECV], len(tr)), np.full(nl, LOCAL)]).astype(np.int64),
        type=np.concatenate([_interleave(np.full(len(tr), T_SEND), np.where(tr.reduce, T_RRC, T_RECV)),
                             np.full(nl, T_CPY)]).astype(np.int64),
        src_buf=np.concatenate([_interleave(s_code, rs_code), l_sb]),
        src_off=np.concatenate([_interleave(s_off, rs_off), l_so]),
        dst_buf=np.concatenate([_interleave(r_code, r_code), l_db]),
        dst_off=np.concatenate([_interleave(r_off, r_off), l_do]),
        time=np.concatenate([_interleave(tr.start, tr.end), l_time]),
        local_chunk=l_chunk,
    )
    return ops, scratch


# ---------------------------------------------------------------------------------------------
# dependencies from buffer accesses
# ---------------------------------------------------------------------------------------------
def _accesses(ops: _Ops, tr: _Transfers):
    """Every buffer access: (op, rank, buffer, offset, time, reads, writes, chunk), in op order
    (a local copy reads its source, then writes its destination)."""
    t = len(tr)
    nl = len(ops) - 2 * t
    local = np.arange(2 * t, len(ops))
    op = np.concatenate([np.arange(2 * t), _interleave(local, local)])
    # send reads its src; receive writes its dst (rrc reads it too); a copy reads src then writes dst
    use_dst = np.concatenate([np.tile([False, True], t), np.tile([False, True], nl)])
    buf = np.where(use_dst, ops.dst_buf[op], ops.src_buf[op])
    off = np.where(use_dst, ops.dst_off[op], ops.src_off[op])
    writes = use_dst
    own = (ops.src_buf[op] == ops.dst_buf[op]) & (ops.src_off[op] == ops.dst_off[op])
    reads = ~use_dst | ((ops.type[op] == T_RRC) & own)
    chunk = np.concatenate([np.repeat(tr.chunk, 2), np.repeat(ops.local_chunk, 2)])
    # an out-of-place rrc may take its local operand from another slot (input j): a read of that slot
    rrc = np.flatnonzero(ops.type[:2 * t] == T_RRC)
    apart = rrc[(ops.src_buf[rrc] != ops.dst_buf[rrc]) | (ops.src_off[rrc] != ops.dst_off[rrc])]
    if len(apart):
        op = np.concatenate([op, apart])
        buf = np.concatenate([buf, ops.src_buf[apart]])
        off = np.concatenate([off, ops.src_off[apart]])
        writes = np.concatenate([writes, np.zeros(len(apart), dtype=bool)])
        reads = np.concatenate([reads, np.ones(len(apart), dtype=bool)])
        chunk = np.concatenate([chunk, tr.chunk[apart // 2]])
    return op, ops.rank[op], buf, off, ops.time[op], reads, writes, chunk


def dependencies(coll: Collective, layout: Layout, ops: _Ops, tr: _Transfers) -> tuple[np.ndarray, np.ndarray]:
    """RAW / WAW / WAR dependency edges (op, op it waits for) from the access order of every slot:
    by time, writes before reads at equal times, then in op order. Raises on reads of a slot that
    does not hold the chunk (not arrived yet, or overwritten in place)."""
    op, rank, buf, off, time, reads, writes, chunk = _accesses(ops, tr)
    if len(op) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    width = int(off.max()) + 1
    slot = (rank * 3 + buf) * width + off
    order = np.lexsort((np.arange(len(op)), ~writes, time, slot))
    slot, op, rank, buf, off = slot[order], op[order], rank[order], buf[order], off[order]
    reads, writes, chunk = reads[order], writes[order], chunk[order]
    first = _group_starts(slot)
    idx = np.arange(len(op))
    start = np.maximum.accumulate(np.where(first, idx, 0))
    end = np.empty(len(op), dtype=np.int64)                 # one past the group's last access
    starts = np.flatnonzero(first)
    end[:] = np.repeat(np.append(starts[1:], len(op)), np.diff(np.append(starts, len(op))))
    last_write = np.maximum.accumulate(np.where(writes, idx, -1))
    prev_write = np.concatenate([[-1], last_write[:-1]])
    prev_write[prev_write < start] = -1
    holds = np.where(prev_write >= 0, chunk[np.maximum(prev_write, 0)],
                     initial_holds(coll, layout, rank, buf, off))
    _check_reads(reads, holds, chunk, first, order, rank, buf, off)
    raw = prev_write >= 0
    next_write = np.minimum.accumulate(np.where(writes, idx, len(op))[::-1])[::-1]
    next_write = np.concatenate([next_write[1:], [len(op)]])
    war = reads & ~writes & (next_write < end)
    waiter = np.concatenate([op[raw], op[next_write[war]]])
    waited = np.concatenate([op[prev_write[raw]], op[war]])
    return waiter, waited


def _check_reads(reads, holds, chunk, first, order, rank, buf, off) -> None:
    """Raise for the first bad read (slots in order of first access, then access order)."""
    bad = reads & (holds != chunk)
    if not bad.any():
        return
    group = np.cumsum(first) - 1
    first_touch = np.minimum.reduceat(order, np.flatnonzero(first))[group]
    p = np.flatnonzero(bad)[np.lexsort((np.flatnonzero(bad), first_touch[bad]))[0]]
    if holds[p] < 0:
        raise SynthError(f"schedule sends chunk {chunk[p]} from rank {rank[p]} before it arrives there")
    raise SynthError(f"lowering: rank {rank[p]} slot {BUFFERS[buf[p]]}[{off[p]}] holds chunk {holds[p]} when chunk "
                     f"{chunk[p]} is read from it (in-place buffer conflict)")


def spread_peers(src: np.ndarray, dst: np.ndarray, channel: np.ndarray) -> np.ndarray:
    """Channels per transfer such that no rank has more than ``MAX_TB_PER_CHANNEL`` send peers, or
    receive peers, on one channel (MSCCL's threadblocks per channel: an alltoall on 64 ranks has 63 of
    each on channel 0). Unchanged where that holds already; otherwise every connection (src, dst,
    channel), in order of its first transfer, takes the first of ``channel + k * base`` (``base``
    the schedule's channel count, so connections of other channels never merge) where both its
    ends still have room; kept as is where none below ``MAX_CHANNELS`` has."""
    if not len(src):
        return channel
    ranks, base = int(max(src.max(), dst.max())) + 1, int(channel.max()) + 1
    keys, first, inverse = np.unique((src * ranks + dst) * base + channel, return_index=True, return_inverse=True)
    conns = np.stack([keys // base // ranks, keys // base % ranks, keys % base])

    def crowded(ends: np.ndarray) -> bool:
        return bool(np.unique(ends * base + conns[2], return_counts=True)[1].max() > MAX_TB_PER_CHANNEL)

    if not (crowded(conns[0]) or crowded(conns[1])):
        return channel
    sends: dict[tuple[int, int], int] = defaultdict(int)
    recvs: dict[tuple[int, int], int] = defaultdict(int)
    new_chan = conns[2].copy()
    for c in np.argsort(first, kind="stable").tolist():
        a, b, chan = (int(v) for v in conns[:, c])
        for candidate in range(chan, MAX_CHANNELS, base):
            if sends[(a, candidate)] < MAX_TB_PER_CHANNEL and recvs[(b, candidate)] < MAX_TB_PER_CHANNEL:
                chan = candidate
                break
        sends[(a, chan)] += 1
        recvs[(b, chan)] += 1
        new_chan[c] = chan
    return new_chan[inverse]


# ---------------------------------------------------------------------------------------------
# merging
# ---------------------------------------------------------------------------------------------
@dataclass
class _Merged:
    """After merging: ``rep[op]`` = the op it was merged into (itself if it survives), ``cnt`` of
    survivors, the connection chains (sends in connection order) and the local copies per rank."""

    rep: np.ndarray
    cnt: np.ndarray
    conn_src: np.ndarray       # per surviving send, in (connection, order) order
    conn_dst: np.ndarray
    conn_chan: np.ndarray
    conn_id: np.ndarray        # dense connection id per surviving send
    conn_index: np.ndarray     # k: index of the send within its connection
    sends: np.ndarray          # surviving send ops in that order
    locals_by_rank: dict[int, list[int]]


def _merge_sends(ops: _Ops, tr: _Transfers, rep: np.ndarray, cnt: np.ndarray, by_kind: bool = False):
    """Chain grouped sends that are consecutive on a connection and contiguous at both ends.
    ``by_kind`` (out-of-place reductions): within a group, order by (send's source buffer, receive's
    local operand buffer) before offset. A group can mix sends of input ``j`` with sends of a partial
    sum, and first ``rrc`` (operand ``i``) with later ones (operand the accumulator); each kind then
    forms one contiguous run (as a group did with everything in ``i[j]``) rather than interleaving."""
    t = len(tr)
    send = 2 * np.arange(t)
    kind = ops.src_buf[send] * len(BUFFERS) + ops.src_buf[send + 1] if by_kind else np.zeros(t, dtype=np.int64)
    order = np.lexsort((send, ops.src_off[send], kind, tr.group, tr.start, tr.channel, tr.dst, tr.src))
    s, r = send[order], send[order] + 1
    conn = (tr.src[order], tr.dst[order], tr.channel[order])
    new_conn = _group_starts(conn[0]) | _group_starts(conn[1]) | _group_starts(conn[2])
    grp, red = tr.group[order], tr.reduce[order]

    def follows(buf: np.ndarray, off: np.ndarray) -> np.ndarray:
        b, o = buf[:-1], off[:-1]
        return (buf[1:] == b) & (off[1:] == o + 1)

    joins = np.zeros(len(s), dtype=bool)
    if len(s) > 1:
        joins[1:] = (~new_conn[1:] & (grp[1:] >= 0) & (grp[1:] == grp[:-1]) & (red[1:] == red[:-1])
                     & follows(ops.src_buf[s], ops.src_off[s]) & follows(ops.dst_buf[r], ops.dst_off[r])
                     & follows(ops.src_buf[r], ops.src_off[r]))
    run_pos = _rank_in_group(~joins)
    head = ~joins | (run_pos % MAX_STEP_CHUNKS == 0)            # cnt < 72: long runs restart every 71
    head_idx = np.maximum.accumulate(np.where(head, np.arange(len(s)), 0))
    rep[s], rep[r] = s[head_idx], r[head_idx]
    counts = np.bincount(head_idx, minlength=len(s))
    cnt[s[head]], cnt[r[head]] = counts[head], counts[head]
    kept = np.flatnonzero(head)
    conn_id = np.cumsum(new_conn) - 1
    k = _rank_in_group(new_conn[kept])                  # a connection's first send always survives
    return s[kept], conn[0][kept], conn[1][kept], conn[2][kept], conn_id[kept], k


def _merge_locals(ops: _Ops, t: int, raw_deps: dict[int, frozenset[int]], rep: np.ndarray,
                  cnt: np.ndarray) -> dict[int, list[int]]:
    """Merge contiguous local copies of a rank (by time, source) that wait on the same ops."""
    local = np.arange(2 * t, len(ops))
    order = local[np.lexsort((local, ops.src_off[local], ops.src_buf[local], ops.time[local], ops.rank[local]))]
    by_rank: dict[int, list[int]] = {}
    empty: frozenset[int] = frozenset()
    rank, sb, so, db, do = (a.tolist() for a in (ops.rank, ops.src_buf, ops.src_off, ops.dst_buf, ops.dst_off))
    for i in order.tolist():
        kept = by_rank.setdefault(rank[i], [])
        if kept:
            a = kept[-1]
            n = int(cnt[a])
            if (raw_deps.get(a, empty) == raw_deps.get(i, empty) and n + 1 <= MAX_STEP_CHUNKS
                    and sb[i] == sb[a] and so[i] == so[a] + n and db[i] == db[a] and do[i] == do[a] + n):
                cnt[a] += 1
                rep[i] = a
                continue
        kept.append(i)
    return by_rank


def merge(ops: _Ops, tr: _Transfers, waiter: np.ndarray, waited: np.ndarray,
          by_kind: bool = False) -> tuple[_Merged, np.ndarray, np.ndarray]:
    """Merge ops and carry the dependency edges over to the survivors (deduplicated, no self-edges);
    ``by_kind``: see :func:`_merge_sends`."""
    t = len(tr)
    rep = np.arange(len(ops))
    cnt = np.ones(len(ops), dtype=np.int64)
    sends, src, dst, chan, conn_id, k = _merge_sends(ops, tr, rep, cnt, by_kind)
    is_local = waiter >= 2 * t
    raw: dict[int, set[int]] = {}
    for a, b in zip(waiter[is_local].tolist(), waited[is_local].tolist(), strict=True):
        raw.setdefault(a, set()).add(b)
    locals_by_rank = _merge_locals(ops, t, {a: frozenset(b) for a, b in raw.items()}, rep, cnt)
    a, b = rep[waiter], rep[waited]
    keep = a != b
    # unique (a, b) rows in row order, as one int64 key each (np.unique(axis=0) sorts a structured view, ~5x slower)
    span = max(len(ops), 1)
    keys = unique_values(a[keep].astype(np.int64) * span + b[keep])
    merged = _Merged(rep, cnt, src, dst, chan, conn_id, k, sends, locals_by_rank)
    return merged, keys // span, keys % span


def uplink_dependencies(ops: _Ops, tr: _Transfers, m: _Merged) -> tuple[np.ndarray, np.ndarray]:
    """Edges (send, earlier send) that keep a rank's sends through one physical first link (its
    uplink to a switch, ``(src, route[0])``, or the direct link ``(src, dst)``) in the schedule's
    order when they sit in different threadblocks (other peer or channel).

    Sends to different peers live in different threadblocks, so nothing else orders them: all
    would be ready at once and the α-β simulator (one transfer at a time per link direction,
    docs/cost-model.md) would serve them first come first served instead of in the planned order. Each
    surviving send waits for the previous one on its first link, in (start, group, source
    offset, op) order -- the connections' own order, so a connection's sends stay in step and a
    valid schedule's time order cannot form a cycle. Sends of the same connection get no edge here:
    their threadblock orders them, and :func:`block_dependencies` orders the blocks of a split one."""
    s = m.sends
    if len(s) < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    i = s // 2
    src, hop = tr.src[i], tr.hop[i]
    order = np.lexsort((s, ops.src_off[s], tr.group[i], tr.start[i], hop, src))
    s, src, hop, conn = s[order], src[order], hop[order], m.conn_id[order]
    pair = (src[1:] == src[:-1]) & (hop[1:] == hop[:-1]) & (conn[1:] != conn[:-1])
    return s[1:][pair], s[:-1][pair]


def switch_pacing(ops: _Ops, tr: _Transfers, m: _Merged) -> tuple[np.ndarray, np.ndarray]:
    """Edges (send, receive) that hold a rank's sends through a switch until the rank has received what the
    schedule delivers to it through switches before those sends start.

    A switch's link into a rank carries the messages of several senders, and the runtime serves it first come
    first served (docs/cost-model.md); nothing in one rank's program can order another rank's sends. A rank
    whose sends run ahead of the schedule takes such a link out of turn, and the message planned before it
    then waits the whole of that message, which delays its own forwards: in a reduction, whose sends are ready
    only when their children's sums are, the lost turns compound (mi250x4-ib16 composed reducescatter: planned
    3399.8 µs, simulated 4550.1 without these edges, 3403.1 with them). Pacing each rank's sends through switches
    by its receives through switches keeps every rank's network traffic in step with the schedule. Each edge
    points back in schedule time (the receive ends before the send starts), so a valid schedule gives no
    cycle, and a program that runs as planned is not delayed by them. Only the first send after each such
    receive, per first link (:func:`uplink_dependencies` orders the rest after it), gets an edge."""
    s = m.sends
    i = s // 2
    routed = tr.hop[i] != tr.dst[i]
    s, i = s[routed], i[routed]
    j = np.flatnonzero(tr.hop != tr.dst)
    if len(s) == 0 or len(j) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # each surviving receive op, with the end of the last transfer merged into it
    recv = m.rep[2 * j + 1]
    ops_end = np.full(len(ops), -np.inf)
    np.maximum.at(ops_end, recv, tr.end[j])
    recv = unique_values(recv)
    recv_rank, recv_end = ops.rank[recv], ops_end[recv]
    order = np.lexsort((recv, recv_end, recv_rank))
    recv, recv_rank, recv_end = recv[order], recv_rank[order], recv_end[order]
    # per send (in its first link's order), the last receive of its rank that ends by its start
    order = np.lexsort((s, ops.src_off[s], tr.group[i], tr.start[i], tr.hop[i], tr.src[i]))
    s, i = s[order], i[order]
    src, hop, start = tr.src[i], tr.hop[i], tr.start[i]
    span = 2.0 * (float(max(tr.end.max(), 0.0)) + 1.0)   # (rank, time) as one sorted key
    at = np.searchsorted(recv_rank * span + recv_end, src * span + start + _tol(start), side="right") - 1
    has = at >= 0
    has[has] = recv_rank[at[has]] == src[has]
    target = np.where(has, recv[np.maximum(at, 0)], -1)
    same_link = np.concatenate([[False], (src[1:] == src[:-1]) & (hop[1:] == hop[:-1])])
    new = has & ~(same_link & (target == np.concatenate([[-1], target[:-1]])))
    return s[new], target[new]


def _depended_tbs_per_rank(a: _Assignment, d: np.ndarray, n: int) -> np.ndarray:
    """Number of depended-on threadblocks of every rank (MSCCL: their ids must stay <= 127)."""
    tbs = unique_values(a.tb[d]) if len(d) else np.zeros(0, dtype=np.int64)
    ranks = np.array([a.keys[t][0] for t in tbs.tolist()], dtype=np.int64)
    return np.bincount(ranks, minlength=n)


# ---------------------------------------------------------------------------------------------
# threadblocks
# ---------------------------------------------------------------------------------------------
@dataclass
class _Assignment:
    """Threadblock of every surviving op: ``tb[op]`` indexes ``keys`` (-1 for merged-away ops);
    ``position[op]`` is its index in the threadblock; ``keys`` are (rank, kind, chan, peer/part)."""

    tb: np.ndarray
    position: np.ndarray
    keys: list[tuple[int, int, int, int]]
    conn_of_tb: np.ndarray      # connection id of each tb (-1 for local tbs)


def _place(ops: _Ops, m: _Merged, split: np.ndarray, base: int, deps_count: np.ndarray, max_steps: int,
           weight: np.ndarray | None = None) -> _Assignment:
    """Threadblocks for a given per-connection split: consecutive blocks of a connection's sends on
    channels ``chan + j * base`` (see :func:`block_dependencies`, :func:`_blocks`)."""
    nsend = len(m.sends)
    block, pos = _blocks(m, split, weight)
    ch = m.conn_chan + block * base
    # local copies: a rank's copies fill local threadblocks of at most max_steps steps (nops included)
    l_ops, l_rank, l_part, l_pos = [], [], [], []
    for rank, idxs in m.locals_by_rank.items():
        count, part, p = 0, 0, 0
        for i in idxs:
            need = 1 + max(0, int(deps_count[i]) - 1)
            if count and count + need > max_steps:
                part, count, p = part + 1, 0, 0
            l_ops.append(i), l_rank.append(rank), l_part.append(part), l_pos.append(p)
            count += need
            p += 1
    op = np.concatenate([m.sends, m.sends + 1, np.array(l_ops, dtype=np.int64)])
    rank = np.concatenate([m.conn_src, m.conn_dst, np.array(l_rank, dtype=np.int64)])
    kind = np.concatenate([np.full(nsend, SEND), np.full(nsend, RECV), np.full(len(l_ops), LOCAL)])
    chan = np.concatenate([ch, ch, np.zeros(len(l_ops), dtype=np.int64)])
    peer = np.concatenate([m.conn_dst, m.conn_src, np.array(l_part, dtype=np.int64)])
    position = np.concatenate([pos, pos, np.array(l_pos, dtype=np.int64)])
    conn = np.concatenate([m.conn_id, m.conn_id, np.full(len(l_ops), -1)])
    wide = int(max(chan.max(initial=0), 0)) + 1
    far = int(max(peer.max(initial=0), rank.max(initial=0))) + 1
    code = ((rank * 3 + kind) * wide + chan) * far + peer
    uniq, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    tb = np.full(len(ops), -1, dtype=np.int64)
    tb[op] = inverse.ravel()
    at = np.full(len(ops), -1, dtype=np.int64)
    at[op] = position
    keys = list(zip(*(a[first].tolist() for a in (rank, kind, chan, peer)), strict=True))
    return _Assignment(tb, at, keys, conn[first])


def _blocks(m: _Merged, split: np.ndarray, weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per surviving send, (its block, its position in the block) where each connection is cut into ``split``
    consecutive blocks: of equal length, or with ``weight`` (steps per send, its nops included) of about equal
    weight, block ``⌊W_before · split / W⌋`` (``W_before``: the connection's weight before the send)."""
    if weight is None:
        count = np.bincount(m.conn_id, minlength=len(split))
        size = np.maximum(-(-count // split), 1)[m.conn_id]
        return m.conn_index // size, m.conn_index % size
    total = np.bincount(m.conn_id, weights=weight, minlength=len(split))
    before = np.cumsum(weight) - weight
    start = np.zeros(len(split))
    first = np.flatnonzero(m.conn_index == 0)          # sends are listed in (connection, order) order
    start[m.conn_id[first]] = before[first]
    ways = split[m.conn_id]
    block = np.minimum(((before - start[m.conn_id]) * ways // total[m.conn_id]).astype(np.int64), ways - 1)
    head = np.concatenate([[True], (m.conn_id[1:] != m.conn_id[:-1]) | (block[1:] != block[:-1])])
    opened = np.maximum.accumulate(np.where(head, np.arange(len(head)), 0))
    return block, np.arange(len(head)) - opened


def block_dependencies(m: _Merged, split: np.ndarray, weight: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Edges (first send of a block, last send of the block before) of split connections.

    A block's sends sit in their own threadblock; without the edge the block's first send, often
    ready early, would take the link before the previous block has drained (the runtime and the
    α-β simulator serve a link's ready sends first come first served), out of the schedule's
    order. One edge per block boundary keeps a connection's sends in order."""
    block, pos = _blocks(m, split, weight)
    idx = np.flatnonzero((pos == 0) & (m.conn_index > 0))
    return m.sends[idx], m.sends[idx - 1]   # sends are listed in (connection, order) order


def _cross_tb(a: _Assignment, waiter: np.ndarray, waited: np.ndarray) -> np.ndarray:
    """Which dependencies cross threadblocks (raising where a threadblock would wait on its own later step)."""
    ta, tb = a.tb[waiter], a.tb[waited]
    same = ta == tb
    late = same & (a.position[waited] > a.position[waiter])
    if late.any():
        rank = a.keys[ta[np.flatnonzero(late)[0]]][0]
        raise SynthError(f"lowering: rank {rank} has a threadblock that waits on its own "
                         "later step (the schedule's order is inconsistent)")
    return ~same


def _effective_waiters(a: _Assignment, waiter: np.ndarray, waited: np.ndarray) -> np.ndarray:
    """The waiter of every dependency :func:`effective_deps` keeps, unordered (one per waiter and threadblock
    waited on): what the step count needs, without the ordering."""
    cross = _cross_tb(a, waiter, waited)
    w = waiter[cross]
    return unique_values(w * max(len(a.keys), 1) + a.tb[waited[cross]]) // max(len(a.keys), 1)


def effective_deps(a: _Assignment, waiter: np.ndarray, waited: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cross-threadblock dependencies, keeping only the latest op per threadblock waited on, ordered
    per waiter by the threadblock key's text (as the reference implementation sorted them).
    Returns (waiter, waited) sorted by waiter, then that order."""
    cross = _cross_tb(a, waiter, waited)
    w, d, t = waiter[cross], waited[cross], a.tb[waited[cross]]
    text = np.argsort(np.argsort([str((k[0], KIND_NAMES[k[1]], k[2], k[3])) for k in a.keys], kind="stable"))
    order = np.lexsort((a.position[d], t, w))
    w, d, t = w[order], d[order], t[order]
    last = np.ones(len(w), dtype=bool)
    last[:-1] = (w[1:] != w[:-1]) | (t[1:] != t[:-1])      # latest op per (waiter, tb)
    w, d, t = w[last], d[last], t[last]
    order = np.lexsort((text[t] if len(t) else t, w))
    return w[order], d[order]


def assign(ops: _Ops, m: _Merged, waiter: np.ndarray, waited: np.ndarray,
           max_steps: int, advice: str = "use a smaller --chunks") -> tuple[_Assignment, np.ndarray, np.ndarray]:
    """Split connections over channels until every send/receive threadblock fits ``max_steps``.
    Returns the assignment and its effective dependencies (see :func:`effective_deps`); ``advice``
    ends the error where they cannot fit."""
    nconn = int(m.conn_id.max(initial=-1)) + 1
    base = int(m.conn_chan.max(initial=0)) + 1
    split = np.ones(nconn, dtype=np.int64)
    deps_count = np.bincount(waiter, minlength=len(ops))
    chan_of_conn = np.zeros(nconn, dtype=np.int64)
    chan_of_conn[m.conn_id] = m.conn_chan
    first_send = np.full(nconn, np.iinfo(np.int64).max)
    np.minimum.at(first_send, m.conn_id, m.sends)
    most = (MAX_CHANNELS - 1 - chan_of_conn) // base + 1   # the ways each connection can be split
    weight = None   # equal blocks; where they cannot fit, blocks of equal steps (nops counted)
    for _ in range(64):
        a = _place(ops, m, split, base, deps_count, max_steps, weight)
        block_w, block_d = block_dependencies(m, split, weight)
        all_w, all_d = np.concatenate([waiter, block_w]), np.concatenate([waited, block_d])
        nops = np.maximum(np.bincount(_effective_waiters(a, all_w, all_d), minlength=len(ops)) - 1, 0)
        alive = a.tb >= 0
        steps = np.bincount(a.tb[alive], weights=1 + nops[alive], minlength=len(a.keys))
        over = (steps > max_steps) & (a.conn_of_tb >= 0)
        if not over.any():
            return (a, *effective_deps(a, all_w, all_d))
        need = np.zeros(nconn)
        np.maximum.at(need, a.conn_of_tb[over], steps[over])
        # a send weighs the steps of its heavier end (the nops of its send or of its receive)
        steps_of_send = 1.0 + np.maximum(nops[m.sends], nops[m.sends + 1])
        weighed = weight is not None
        if weighed:
            weight = steps_of_send   # the blocks' nops moved with them
        # connections in order of their first transfer (which one an error names)
        for conn in sorted(np.flatnonzero(need).tolist(), key=lambda c: first_send[c]):
            ways = int(split[conn])
            split[conn] = max(ways + 1, math.ceil(ways * need[conn] / max_steps))
            if split[conn] > most[conn] and (ways < most[conn] or not weighed):
                # every channel it may take; then, where equal blocks still overflow (nops crowd where a
                # reduction's receives wait on many threadblocks), every split connection cut by steps instead
                if ways == most[conn]:
                    weight = steps_of_send
                split[conn] = most[conn]
                continue
            if split[conn] > most[conn]:
                i = int(np.flatnonzero(m.conn_id == conn)[0])
                total = int((m.conn_id == conn).sum())
                # a split connection takes its channel plus multiples of the schedule's channel count
                ways = (MAX_CHANNELS - 1 - int(chan_of_conn[conn])) // base + 1
                raise SynthError(
                    f"lowering: connection {m.conn_src[i]}->{m.conn_dst[i]} carries {total} transfers (and the "
                    f"nop steps of their dependencies), more than the {ways} channel(s) of {max_steps} steps it "
                    f"can spread over hold (channel {int(chan_of_conn[conn])} plus multiples of the schedule's "
                    f"{base}, below {MAX_CHANNELS}); {advice}")
    raise SynthError(f"lowering: could not fit the threadblocks within the MSCCL step limit; {advice}")


# ---------------------------------------------------------------------------------------------
# emit
# ---------------------------------------------------------------------------------------------
def emit(coll: Collective, schedule: Schedule, ops: _Ops, m: _Merged, a: _Assignment, w: np.ndarray,
         d: np.ndarray, scratch: np.ndarray, name: str) -> Program:
    """Number threadblocks per rank (depended-on ones first), place nops, build the Program.
    ``w``/``d``: the effective dependencies (waiter, waited) of the assignment."""
    ntb = len(a.keys)
    keys = np.array(a.keys, dtype=np.int64).reshape(-1, 4)
    depended = np.zeros(len(ops), dtype=bool)
    depended[d] = True
    alive = np.flatnonzero(a.tb >= 0)
    tb_depended = np.zeros(ntb, dtype=bool)
    tb_depended[a.tb[alive[depended[alive]]]] = True
    # threadblock ids per rank: depended-on first (MSCCL's id limit), then channel, kind, peer
    tb_order = np.lexsort((keys[:, 3], keys[:, 1], keys[:, 2], ~tb_depended, keys[:, 0])) if ntb else np.zeros(0, int)
    tb_id = np.empty(ntb, dtype=np.int64)
    tb_id[tb_order] = _rank_in_group(_group_starts(keys[tb_order, 0])) if ntb else tb_order
    # step index of every op after nop insertion
    n_deps = np.bincount(w, minlength=len(ops))
    nops = np.maximum(n_deps - 1, 0)
    members = alive[np.lexsort((a.position[alive], a.tb[alive]))]
    width = 1 + nops[members]
    tb_first = _group_starts(a.tb[members])
    csum = np.cumsum(width)
    before = csum - width
    run_base = np.maximum.accumulate(np.where(tb_first, before, 0))
    step_index = np.full(len(ops), -1, dtype=np.int64)
    step_index[members] = before - run_base + nops[members]
    too_far = depended[members] & (tb_id[a.tb[members]] > MAX_DEPENDED_TB)
    if too_far.any():
        rank = int(ops.rank[members[np.flatnonzero(too_far)[0]]])
        raise SynthError(f"lowering: rank {rank} needs more than {MAX_DEPENDED_TB + 1} depended-on "
                         "threadblocks (MSCCL limit); use a smaller --chunks or fewer channels")
    steps_of_tb, rows, bounds = _build_steps(ops, m, a, members, w, d, tb_id, step_index, depended, nops)
    per_rank: list[list[Threadblock]] = [[] for _ in range(coll.num_ranks)]
    for t in tb_order.tolist():
        rank, kind, chan, peer = a.keys[t]
        send = peer if kind == SEND else -1
        recv = peer if kind == RECV else -1
        per_rank[rank].append(Threadblock(int(tb_id[t]), send, recv, chan, steps_of_tb[t]))
    nchannels = max(1, int(keys[:, 2].max(initial=0)) + 1) if ntb else 1
    gpus = []
    for rank in range(coll.num_ranks):
        i_chunks = 0 if coll.alias(rank, "i") else coll.input_chunks
        o_chunks = 0 if coll.alias(rank, "o") else coll.output_chunks
        gpus.append(Gpu(rank, i_chunks, o_chunks, int(scratch[rank]), tuple(per_rank[rank])))
    gpus = tuple(gpus)
    size = float(schedule.size_bytes) if schedule.size_bytes else None
    return Program(
        name=name,
        collective=coll.name,
        num_ranks=coll.num_ranks,
        gpus=gpus,
        inplace=coll.inplace,
        nchannels=nchannels,
        nchunksperloop=max(1, max((max(g.i_chunks, g.o_chunks) for g in gpus), default=1)),
        root=coll.root,
        topology=schedule.topology or None,
        chunk_factor=coll.chunk_factor,
        size_bytes=size,
        chunk_bytes=coll.chunk_bytes(size) if size else None,
        predicted_time_us=float(schedule.predicted_time_us or schedule.makespan),
        extra={"method": schedule.method} if schedule.method else {},
        columns=_program_order_columns(rows, bounds, tb_order, gpus),
    )


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)``, fast: rows packed into one int64 key by
    mixed radix when the columns' ranges allow (they do for any MSCCL-sized program)."""
    if len(rows) == 0:
        return rows, np.zeros(0, dtype=np.int64)
    low = rows.min(axis=0)
    radix = (rows.max(axis=0) - low + 1).tolist()
    if math.prod(radix) >= 2**62:
        uniq, inverse = np.unique(rows, axis=0, return_inverse=True)
        return uniq, inverse.ravel()
    key = np.zeros(len(rows), dtype=np.int64)
    for col, r in enumerate(radix):
        key = key * r + (rows[:, col] - low[col])
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return rows[first], inverse.ravel()


def _build_steps(ops: _Ops, m: _Merged, a: _Assignment, members: np.ndarray, w: np.ndarray, d: np.ndarray,
                 tb_id: np.ndarray, step_index: np.ndarray, depended: np.ndarray,
                 nops: np.ndarray) -> tuple[list[tuple[Step, ...]], np.ndarray, np.ndarray]:
    """The Step tuples of every threadblock (index = tb), nops before the step they guard; and the integer rows
    they were made from, with the bounds of each threadblock's rows (tb t: ``bounds[t]:bounds[t + 1]``).

    Every step is first one integer row (type, src, dst, cnt, depid, deps, hasdep), laid out in
    threadblock order; identical rows (common: same offsets and dependency shape on every rank)
    share one frozen :class:`Step`, so Python builds only the distinct ones."""
    width = 1 + nops[members]
    # int32 rows where every value fits (any MSCCL-sized program): half the memory of the largest array here
    largest = max(int(np.abs(ops.src_off).max(initial=0)), int(np.abs(ops.dst_off).max(initial=0)),
                  int(m.cnt.max(initial=0)), int(tb_id.max(initial=0)), int(step_index.max(initial=0)))
    rows = np.zeros((int(width.sum()), 9), dtype=np.int32 if largest < 2**30 else np.int64)
    rows[:, 0], rows[:, 3] = len(OP_TYPES), O_BUF      # default: nop "i"[0] -> "o"[0], cnt 0
    rows[:, 6:8] = -1
    own = np.cumsum(width) - 1                           # row of each member's own step
    rows[own, 0] = ops.type[members]
    rows[own, 1], rows[own, 2] = ops.src_buf[members], ops.src_off[members]
    rows[own, 3], rows[own, 4] = ops.dst_buf[members], ops.dst_off[members]
    rows[own, 5], rows[own, 8] = m.cnt[members], depended[members]
    # effective deps of each waiter (w sorted): the first goes in the step, the others in nops before it
    own_of = np.zeros(len(ops), dtype=np.int64)
    own_of[members] = own
    k = _rank_in_group(_group_starts(w))
    row = np.where(k == 0, own_of[w], own_of[w] - nops[w] + k - 1)
    rows[row, 6], rows[row, 7] = tb_id[a.tb[d]], step_index[d]
    uniq, inverse = _unique_rows(rows)
    names = (*OP_TYPES, "nop")
    shared = [Step(names[t], BUFFERS[sb], so, BUFFERS[db], do, cnt, depid, deps, bool(hasdep))
              for t, sb, so, db, do, cnt, depid, deps, hasdep in uniq.tolist()]
    table = np.empty(len(shared), dtype=object)
    table[:] = shared
    flat = table[inverse]
    del inverse
    bounds = np.concatenate([[0], np.cumsum(np.bincount(a.tb[members], weights=width, minlength=len(a.keys)))])
    bounds = bounds.astype(np.int64)
    at = bounds.tolist()
    return [tuple(flat[at[t]:at[t + 1]].tolist()) for t in range(len(a.keys))], rows, bounds


#: Row codes (:data:`OP_TYPES`, then nop; :data:`BUFFERS`) -> :mod:`synth.program.columns` codes.
_KIND_OF_ROW = np.array([KIND[t] for t in (*OP_TYPES, "nop")], dtype=np.int8)
_BUFFER_OF_ROW = np.array([BUFFER_CODE[b] for b in BUFFERS], dtype=np.int8)


def _program_order_columns(rows: np.ndarray, bounds: np.ndarray, tb_order: np.ndarray, gpus: tuple) -> StepColumns:
    """The columns of the program's steps (:mod:`synth.program.columns`), from the rows its Steps were made of:
    threadblocks in program order are ``tb_order`` (rank first, as :func:`emit` numbers them)."""
    lengths = np.diff(bounds)[tb_order]
    start = np.zeros(len(tb_order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=start[1:])
    at = np.repeat(bounds[:-1][tb_order] - start[:-1], lengths) + np.arange(start[-1])
    # one column at a time (no copy of all the rows); integers as int32 where they fit (any MSCCL-sized program)
    fits = len(rows) == 0 or (rows[:, 2:8].min() >= np.iinfo(np.int32).min and rows[:, 2:8].max() <= np.iinfo(
        np.int32).max)
    integers = np.int32 if fits else np.int64

    def column(k: int) -> np.ndarray:
        return rows[at, k].astype(integers)

    return StepColumns(start=start, kind=_KIND_OF_ROW[rows[at, 0]], srcbuf=_BUFFER_OF_ROW[rows[at, 1]],
                       srcoff=column(2), dstbuf=_BUFFER_OF_ROW[rows[at, 3]], dstoff=column(4), cnt=column(5),
                       depid=column(6), deps=column(7), hasdep_column=rows[at, 8].astype(bool), of=gpus)


def lower(schedule: Schedule, *, name: str | None = None, max_steps_per_tb: int = MAX_STEPS_PER_TB) -> Program:
    """Lower a chunk-level schedule to an MSCCL program (see the module docstring for the rules; without
    :func:`switch_pacing`, which :func:`lower_variants` adds).

    Raises :class:`SynthError` when the schedule is inconsistent (a chunk sent before it arrives,
    an in-place buffer conflict) or cannot fit MSCCL's limits (≤ 32 channels, ≤ 64 steps per
    threadblock, depended-on threadblock ids ≤ 127).
    """
    return lower_variants(schedule, name=name, max_steps_per_tb=max_steps_per_tb, paced=False)[0]


def lower_variants(schedule: Schedule, *, name: str | None = None, max_steps_per_tb: int = MAX_STEPS_PER_TB,
                   paced: bool = True) -> list[Program]:
    """The program :func:`lower` makes without :func:`switch_pacing`, and with ``paced`` also the one it makes
    with it where pacing adds an edge: the runtime may run either faster (pacing keeps switch links in the
    schedule's order, which a reduction needs; without it a send may use an idle gap the schedule left), so
    the pipeline simulates both. One lowering up to the threadblocks, shared by the two."""
    if max_steps_per_tb < 2:
        raise SynthError("max_steps_per_tb must be at least 2")
    with gc_paused():   # millions of small arrays and Steps: the cyclic GC would rescan them over and over
        return _lower(schedule, name, max_steps_per_tb, paced)


def _lower(schedule: Schedule, name: str | None, max_steps_per_tb: int, paced: bool) -> list[Program]:
    coll = schedule.collective
    tr = _Transfers.of(schedule)
    tr.check(coll)
    tr.channel = spread_peers(tr.src, tr.dst, tr.channel)
    layout = Layout.of(coll)
    ops, scratch = build_ops(coll, layout, tr)
    waiter, waited = dependencies(coll, layout, ops, tr)
    merged, waiter, waited = merge(ops, tr, waiter, waited, by_kind=coll.is_reduction and not coll.inplace)
    up_w, up_d = uplink_dependencies(ops, tr, merged)
    pacing = switch_pacing(ops, tr, merged) if paced else (np.zeros(0, dtype=np.int64),) * 2
    # at one chunk per piece a smaller --chunks cannot help: the method's pattern itself does not fit
    advice = ("use a smaller --chunks" if coll.chunk_factor > 1 else
              "that is the method's pattern at one chunk per piece; another method may fit (-m auto keeps those)")
    default = f"{coll.name}-{schedule.method or 'schedule'}-{schedule.topology or 'topology'}"
    del tr   # not needed to emit: freed before its peak

    def assigned(optional: list[tuple[np.ndarray, np.ndarray]]) -> Program:
        # the optional edges (uplink order, then pacing) are optimisations: dropped, the last kind first, on ranks
        # where they would break MSCCL's limit on depended-on threadblocks
        def edges() -> tuple[np.ndarray, np.ndarray]:
            return (np.concatenate([waiter, *(w for w, _ in optional)]),
                    np.concatenate([waited, *(d for _, d in optional)]))
        assignment, w, d = assign(ops, merged, *edges(), max_steps_per_tb, advice)
        for kind in reversed(range(len(optional))):
            crowded = _depended_tbs_per_rank(assignment, d, coll.num_ranks) > MAX_DEPENDED_TB + 1
            if not crowded.any():
                break
            for k in range(kind, len(optional)):
                keep = ~crowded[ops.rank[optional[k][1]]]
                optional[k] = (optional[k][0][keep], optional[k][1][keep])
            assignment, w, d = assign(ops, merged, *edges(), max_steps_per_tb, advice)
        return emit(coll, schedule, ops, merged, assignment, w, d, scratch, name or default)

    programs = [assigned([(up_w, up_d)])]
    if len(pacing[0]):
        try:
            programs.append(assigned([(up_w, up_d), pacing]))
        except SynthError:
            pass   # its nop steps can pass a limit the program without them kept within
    return programs

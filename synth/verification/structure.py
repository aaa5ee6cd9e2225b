"""Verification pass 2, the structure: threadblocks indexed globally, connections and their endpoints, and
every step checked and compiled into a record the symbolic execution runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat

import numpy as np

from synth.arrays import unique_values
from synth.program.columns import (
    BUFFER_CODE,
    KIND,
    NO_BUFFER,
    NO_KIND,
    TYPE_INFO,
    StepColumns,
    kind_flags,
    step_columns,
)
from synth.program.ir import READS_SRC, RECEIVES, SENDS, WRITES_DST, Program
from synth.verification.common import NOP, STEP_FIELDS, UNKNOWN_TYPE, Errors
from synth.verification.layout import Layout


@dataclass(frozen=True)
class Connections:
    """The sending and receiving threadblock of every connection (src, dst, channel), and per threadblock
    whether its send and recv peers are usable."""

    sender: dict[tuple, int]
    receiver: dict[tuple, int]
    send_ok: tuple[bool, ...]
    recv_ok: tuple[bool, ...]


class StepRecords:
    """Every threadblock's compiled steps as the execution reads them: step s of global threadblock g compiled to
    (kind, receives, sends, cnt, src slots, src offset, dst slots, dst writers, dst offset, dependency (g, s) or
    None). This class holds them as tuples (:func:`compile_steps`); :class:`ColumnRecords` as arrays."""

    def __init__(self, deps: tuple, records: tuple) -> None:
        self.deps, self.records = deps, records

    def window(self, g: int, p: int) -> tuple[int, tuple]:
        """Records of threadblock ``g`` from step ``p`` on (at least one where there is one): (first step, tuple)."""
        return 0, self.records[g]

    def dep(self, g: int, p: int) -> tuple[int, int] | None:
        """Step ``p`` of threadblock ``g``'s dependency (g, s), or None."""
        return self.deps[g][p]


@dataclass(frozen=True)
class Structure:
    """What execution needs: the threadblocks, their connections and their compiled steps (``steps``;
    ``records[g][s]`` and ``deps[g][s]`` give them all at once, see :class:`StepRecords`)."""

    errors: Errors
    complete: bool                    # False: gpu ids are not 0..N-1, nothing else was indexed
    tbs: tuple = ()                   # global index -> (rank, Threadblock)
    gindex: dict = field(default_factory=dict)    # (rank, tb id) -> global index
    conns: Connections = field(default_factory=lambda: Connections({}, {}, (), ()))
    steps: StepRecords = field(default_factory=lambda: StepRecords((), ()))

    @property
    def deps(self) -> tuple:
        """Per threadblock, per step: its dependency (g, s) or None."""
        return self.steps.deps

    @property
    def records(self) -> tuple:
        """Per threadblock, per step: its record (:class:`StepRecords`)."""
        return self.steps.records


def structure(program: Program, lay: Layout, max_errors: int, columns: StepColumns | None = None) -> Structure:
    """Index threadblocks and connections and compile every step; incomplete where the gpu ids are not 0..N-1.
    ``columns``: the :func:`step_columns` of the program's threadblocks, if already built (used when no
    threadblock was dropped as a duplicate)."""
    err = Errors(max_errors)
    n = program.num_ranks
    if [g.id for g in program.gpus] != list(range(n)):
        err.add(f"program has num_ranks={n} but gpu ids {[g.id for g in program.gpus]}")
        return Structure(err, False)
    tbs, gindex = index_threadblocks(program, err)
    conns = connections(n, tbs, err, len(program.switches))
    cols = columns if columns is not None and len(columns.start) == len(tbs) + 1 else \
        step_columns(tb for _, tb in tbs)
    if cols is None:    # a field that is not an exact value: the per-step code says what is wrong
        deps, records, depended = compile_steps(program, lay, tbs, gindex, conns, err)
        check_hasdep(tbs, depended, err)
        steps = StepRecords(deps, records)
    else:
        steps = compile_columns(lay, tbs, gindex, conns, err, cols)
    return Structure(err, True, tbs, gindex, conns, steps)


def index_threadblocks(program: Program, err: Errors) -> tuple[tuple, dict[tuple[int, int], int]]:
    """Number threadblocks globally (``tbs``, ``gindex``); a duplicate id on a rank is dropped."""
    tbs = []          # global index -> (rank, Threadblock)
    gindex = {}       # (rank, tb id) -> global index
    for gpu in program.gpus:
        for tb in gpu.threadblocks:
            if (gpu.id, tb.id) in gindex:
                err.add(f"rank {gpu.id} tb {tb.id}: duplicate threadblock id")
                continue
            gindex[(gpu.id, tb.id)] = len(tbs)
            tbs.append((gpu.id, tb))
    return tuple(tbs), gindex


def connections(n: int, tbs: tuple, err: Errors, switches: int = 0) -> Connections:
    """The sending and receiving threadblock of every connection (src, dst, channel); bad peers flagged. Peers
    ``n .. n + switches - 1`` are the program's switches (docs/programs.md, "Switch steps")."""
    sender: dict[tuple, int] = {}
    receiver: dict[tuple, int] = {}
    send_ok, recv_ok = [], []
    for g, (r, tb) in enumerate(tbs):
        where = f"rank {r} tb {tb.id}"
        ok_peer = {}
        for peer, role, table, key in ((tb.send, "send", sender, (r, tb.send, tb.chan)),
                                       (tb.recv, "recv", receiver, (tb.recv, r, tb.chan))):
            good = 0 <= peer < n + switches and peer != r and tb.chan >= 0
            if peer != -1 and not good:
                also = f" nor a switch ({n}..{n + switches - 1})" if switches else ""
                err.add(f"{where}: {role} peer {peer} is not another rank (0..{n - 1}, not {r}){also} "
                        f"or channel {tb.chan} is negative")
            if good:
                if key in table:
                    other = tbs[table[key]][1].id
                    err.add(f"{where}: connection {key[0]}->{key[1]} channel {tb.chan} is already used for "
                            f"{role} by tb {other} (one threadblock per channel, peer and direction)")
                else:
                    table[key] = g
            ok_peer[role] = good
        send_ok.append(ok_peer["send"])
        recv_ok.append(ok_peer["recv"])
    return Connections(sender, receiver, tuple(send_ok), tuple(recv_ok))


def compile_steps(program: Program, lay: Layout, tbs: tuple, gindex: dict[tuple[int, int], int],
                  conns: Connections, err: Errors) -> tuple[tuple, tuple, dict[tuple[int, int], tuple[int, int]]]:
    """Check every step's operands and dependency and compile it into a record for the execution pass, one
    threadblock at a time (:func:`compile_threadblock`). Returns the dependencies, the records and the depended-on
    steps: (tb, step) -> first dependent. :func:`compile_columns` does the same on step columns."""
    deps: list[tuple] = []
    records: list[tuple] = []
    depended: dict[tuple[int, int], tuple[int, int]] = {}
    lengths = [len(tb.steps) for _, tb in tbs]
    tb_index = _tb_index(program.num_ranks, gindex)
    for g in range(len(tbs)):
        dl, recs = compile_threadblock(lay, tbs, g, tb_index, lengths, conns, err, depended)
        deps.append(dl)
        records.append(recs)
    return tuple(deps), tuple(records), depended


def _tb_index(num_ranks: int, gindex: dict[tuple[int, int], int]) -> list[dict[int, int]]:
    """Per rank: tb id -> global index."""
    tb_index: list[dict[int, int]] = [{} for _ in range(num_ranks)]
    for (rank, tb_id), g in gindex.items():
        tb_index[rank][tb_id] = g
    return tb_index


def compile_threadblock(lay: Layout, tbs: tuple, g: int, tb_index: list[dict[int, int]], lengths: list[int],
                        conns: Connections, err: Errors, depended: dict) -> tuple[tuple, tuple]:
    """The per-step checks and records of threadblock ``g``; its errors go to ``err`` and its dependencies'
    first dependents into ``depended``.

    One pass per step with everything hoisted: the step's fields come out in one C-level attrgetter
    call, the type's properties in one dict lookup, and the full check runs in :func:`step_problems`
    only when the fast range test fails."""
    r, tb = tbs[g]
    get_view = lay.views[r].get
    local = tb_index[r]
    dl, recs = [], []
    can_send, can_recv = conns.send_ok[g], conns.recv_ok[g]
    for s, (t, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, dep_s) in enumerate(map(STEP_FIELDS, tb.steps)):
        info = TYPE_INFO.get(t)
        if info is None:
            err.add(f"rank {r} tb {tb.id} step {s}: unknown step type {t!r} (expected one of "
                    f"{', '.join(KIND)})")
            info = UNKNOWN_TYPE
        kind, is_send, is_recv, reads, writes = info
        sv = get_view(srcbuf)
        dv = get_view(dstbuf)
        ok = kind != NOP
        problems = None
        if ok and (cnt < 1 or (is_send and not can_send) or (is_recv and not can_recv)
                   or (reads and (sv is None or srcoff < 0 or srcoff + cnt > sv[3]))
                   or (writes and (dv is None or dstoff < 0 or dstoff + cnt > dv[3]))):
            ok, problems = step_problems(lay, r, tb, tb.steps[s])
        dep = None
        if depid != -1:  # the runtimes ignore deps when depid is -1
            target = local.get(depid)
            if target is None or not 0 <= dep_s < lengths[target]:
                problems = (problems or []) + [f"depends on tb {depid} step {dep_s}, which does not "
                                               f"exist on rank {r}"]
            else:
                dep = (target, dep_s)
                if dep not in depended:
                    depended[dep] = (tb.id, s)
        if problems:
            for problem in problems:
                err.add(f"rank {r} tb {tb.id} step {s} ({t}): {problem}")
        recs.append((kind if ok else NOP, can_recv and is_recv, can_send and is_send,
                     cnt if cnt > 0 else 0,
                     sv[0] if sv else None, sv[2] + srcoff if sv else 0,
                     dv[0] if dv else None, dv[1] if dv else None, dv[2] + dstoff if dv else 0, dep))
        dl.append(dep)
    return tuple(dl), tuple(recs)


_HUGE = 2**62


def compile_columns(lay: Layout, tbs: tuple, gindex: dict[tuple[int, int], int], conns: Connections, err: Errors,
                    cols: StepColumns) -> ColumnRecords:
    """:func:`compile_steps` and :func:`check_hasdep` on step columns, without a Python loop per step.

    The fast range test of :func:`compile_threadblock` runs as array operations on every step at once, and the
    records become arrays (:class:`ColumnRecords`, about 50 bytes a step where a tuple record takes about 190).
    A threadblock with a step that fails the test, names an unknown type or a missing dependency is compiled by
    :func:`compile_threadblock` instead, so its error messages are the per-step code's. The depended-on steps
    without ``hasdep`` are found by arrays too and reported in :func:`check_hasdep`'s order and words."""
    ntb = len(tbs)
    start = cols.start
    lengths = np.diff(start)
    tb_of = np.repeat(np.arange(ntb), lengths)
    ranks = np.fromiter((r for r, _ in tbs), np.int64, ntb)
    rank = ranks[tb_of]
    known = cols.kind != NO_KIND
    is_send, is_recv, reads, writes = kind_flags(cols.kind)
    can_send = np.array(conns.send_ok, dtype=bool)[tb_of]
    can_recv = np.array(conns.recv_ok, dtype=bool)[tb_of]
    # per rank and buffer code (NO_BUFFER last): the view's physical slots, writers, base and size
    num_views = len(lay.views)
    size = np.zeros((num_views, NO_BUFFER + 1), dtype=np.int64)
    base = np.zeros((num_views, NO_BUFFER + 1), dtype=np.int64)
    slots: list = []
    writers: list = []
    for r, views in enumerate(lay.views):
        for buf, code in BUFFER_CODE.items():
            view = views[buf]
            base[r, code], size[r, code] = view[2], view[3]
        slots += [views[b][0] for b in BUFFER_CODE] + [None]
        writers += [views[b][1] for b in BUFFER_CODE] + [None]
    size, base = size.ravel(), base.ravel()
    cnt = cols.cnt
    at_least_one = np.maximum(cnt, 1)   # cnt < 1 fails on its own; no overflow in size - cnt
    src_key = rank * (NO_BUFFER + 1) + cols.srcbuf
    dst_key = rank * (NO_BUFFER + 1) + cols.dstbuf
    src_bad = reads & ((cols.srcbuf == NO_BUFFER) | (cols.srcoff < 0) | (cols.srcoff > size[src_key] - at_least_one))
    dst_bad = writes & ((cols.dstbuf == NO_BUFFER) | (cols.dstoff < 0) | (cols.dstoff > size[dst_key] - at_least_one))
    slow = (known & (cols.kind != NOP)
            & ((cnt < 1) | (is_send & ~can_send) | (is_recv & ~can_recv) | src_bad | dst_bad)) | ~known
    del src_bad, dst_bad, at_least_one, reads, writes
    # dependencies: depid names a threadblock of the same rank, deps one of its steps
    with_dep = np.flatnonzero(cols.depid != -1)
    keys = zip(rank[with_dep].tolist(), cols.depid[with_dep].tolist())
    target = np.fromiter(map(gindex.get, keys, repeat(-1)), np.int64, len(with_dep))
    dep_s = cols.deps[with_dep]
    found = target >= 0
    dep_ok = found & (dep_s >= 0) & (dep_s < lengths[np.where(found, target, 0)])
    slow[with_dep[~dep_ok]] = True
    for offsets in (cols.srcoff, cols.dstoff):      # base + offset must not wrap around in int64
        slow |= (offsets >= _HUGE) | (offsets <= -_HUGE)
    dirty = unique_values(tb_of[slow]).tolist()
    valid = with_dep[dep_ok]
    depended_on = start[target[dep_ok]] + dep_s[dep_ok]
    dep_flat = np.full(len(cnt), -1, dtype=np.int64)
    dep_flat[valid] = depended_on
    src_known, dst_known = cols.srcbuf != NO_BUFFER, cols.dstbuf != NO_BUFFER
    records = ColumnRecords(
        start=start.tolist(), kind=np.where(known, cols.kind, NOP).astype(np.int8), receives=can_recv & is_recv,
        sends=can_send & is_send, cnt=np.maximum(cnt, 0), src_key=src_key.astype(np.int32),
        src_offset=np.where(src_known, base[src_key] + cols.srcoff, 0), dst_key=dst_key.astype(np.int32),
        dst_offset=np.where(dst_known, base[dst_key] + cols.dstoff, 0), dep_flat=dep_flat, slots=slots,
        writers=writers)
    if dirty:
        tb_index = _tb_index(num_views, gindex)
        tb_lengths = lengths.tolist()
        for g in dirty:
            records.compiled[g] = compile_threadblock(lay, tbs, g, tb_index, tb_lengths, conns, err, {})
    _hasdep_errors(tbs, cols, tb_of, valid, depended_on, err)
    return records


class ColumnRecords(StepRecords):
    """The compiled steps as arrays over all steps (threadblock g's are ``start[g]:start[g + 1]``), turned into
    :class:`StepRecords`' tuples :data:`WINDOW` steps at a time as the execution reaches them, so that only the
    windows of threadblocks under way exist as tuples. ``src_key``/``dst_key`` index ``slots``/``writers`` (rank ×
    4 + buffer code); ``dep_flat`` holds the flat position of the step each step depends on (-1: none), and
    ``dep_column`` the same as None or (g, s), built on first use (the dataflow run never needs it). Threadblocks in
    ``compiled`` (g -> (deps, records)) were compiled step by step (they had errors) and are served from there."""

    #: Steps turned into tuples at a time.
    WINDOW = 64

    def __init__(self, start: list[int], kind: np.ndarray, receives: np.ndarray, sends: np.ndarray, cnt: np.ndarray,
                 src_key: np.ndarray, src_offset: np.ndarray, dst_key: np.ndarray, dst_offset: np.ndarray,
                 dep_flat: np.ndarray, slots: list, writers: list) -> None:
        self.start, self.kind, self.receives, self.sends, self.cnt = start, kind, receives, sends, cnt
        self.src_key, self.src_offset, self.dst_key, self.dst_offset = src_key, src_offset, dst_key, dst_offset
        self.dep_flat, self.slots, self.writers = dep_flat, slots, writers
        self.compiled: dict[int, tuple[tuple, tuple]] = {}

    @cached_property
    def dep_column(self) -> np.ndarray:
        """Per step: None or the (g, s) it depends on (from ``dep_flat``)."""
        column = np.full(len(self.dep_flat), None, dtype=object)
        with_dep = np.flatnonzero(self.dep_flat >= 0)
        flat = self.dep_flat[with_dep]
        starts = np.asarray(self.start, dtype=np.int64)
        g = np.searchsorted(starts, flat, side="right") - 1
        column[with_dep] = np.fromiter(zip(g.tolist(), (flat - starts[g]).tolist()), object, len(with_dep))
        return column

    def window(self, g: int, p: int) -> tuple[int, tuple]:
        compiled = self.compiled.get(g)
        if compiled is not None:
            return 0, compiled[1]
        a = self.start[g] + p
        b = min(self.start[g + 1], a + self.WINDOW)
        return p, self._tuples(a, b)

    def _tuples(self, a: int, b: int) -> tuple:
        """The records of flat steps ``a`` to ``b`` - 1."""
        dst = self.dst_key[a:b].tolist()
        return tuple(zip(self.kind[a:b].tolist(), self.receives[a:b].tolist(), self.sends[a:b].tolist(),
                         self.cnt[a:b].tolist(), map(self.slots.__getitem__, self.src_key[a:b].tolist()),
                         self.src_offset[a:b].tolist(), map(self.slots.__getitem__, dst),
                         map(self.writers.__getitem__, dst), self.dst_offset[a:b].tolist(),
                         self.dep_column[a:b].tolist()))

    def dep(self, g: int, p: int) -> tuple[int, int] | None:
        compiled = self.compiled.get(g)
        return compiled[0][p] if compiled is not None else self.dep_column[self.start[g] + p]

    @cached_property
    def deps(self) -> tuple:    # type: ignore[override]
        return tuple(self.compiled[g][0] if g in self.compiled else
                     tuple(self.dep_column[self.start[g]:self.start[g + 1]].tolist())
                     for g in range(len(self.start) - 1))

    @cached_property
    def records(self) -> tuple:    # type: ignore[override]
        return tuple(self.compiled[g][1] if g in self.compiled else self._tuples(self.start[g], self.start[g + 1])
                     for g in range(len(self.start) - 1))


def _hasdep_errors(tbs: tuple, cols: StepColumns, tb_of: np.ndarray, dependents: np.ndarray, targets: np.ndarray,
                   err: Errors) -> None:
    """:func:`check_hasdep` on columns: ``dependents`` (flat step positions, ascending) depend on ``targets``."""
    if not len(targets):
        return
    depended, first = np.unique(targets, return_index=True)
    unsignalled = ~cols.hasdep(depended)
    if not unsignalled.any():
        return
    for at in np.sort(first[unsignalled]).tolist():     # check_hasdep's order: by first dependent
        dependent, target = int(dependents[at]), int(targets[at])
        g, tg = int(tb_of[dependent]), int(tb_of[target])
        r, ttb = tbs[tg]
        s = target - int(cols.start[tg])
        err.add(f"rank {r} tb {ttb.id} step {s} ({ttb.steps[s].type}): tb {tbs[g][1].id} step "
                f"{dependent - int(cols.start[g])} depends on it but it has hasdep=0, so the runtime never "
                "signals it")


def check_hasdep(tbs: tuple, depended: dict[tuple[int, int], tuple[int, int]], err: Errors) -> None:
    """A depended-on step must set ``hasdep``, else the runtime never signals its dependents."""
    for (target, s), (tb_id, s2) in depended.items():
        r, ttb = tbs[target]
        if not ttb.steps[s].hasdep:
            err.add(f"rank {r} tb {ttb.id} step {s} ({ttb.steps[s].type}): tb {tb_id} step {s2} depends on "
                    f"it but it has hasdep=0, so the runtime never signals it")


def step_problems(lay: Layout, r: int, tb, st) -> tuple[bool, list[str]]:
    """Why a step is malformed (slow path of compile_steps); ok=False means its data effect is skipped."""
    t, views = st.type, lay.views[r]
    ok, problems = True, []
    if st.cnt < 1:
        problems.append(f"cnt={st.cnt} must be at least 1")
        ok = False
    if t in SENDS and tb.send == -1:
        problems.append("sends but the threadblock has no send peer")
    if t in RECEIVES and tb.recv == -1:
        problems.append("receives but the threadblock has no recv peer")
    for used, buf, off, name in ((t in READS_SRC, st.srcbuf, st.srcoff, "src"),
                                 (t in WRITES_DST, st.dstbuf, st.dstoff, "dst")):
        if not used:
            continue
        if buf not in views:
            problems.append(f"{name} buffer {buf!r} is not i, o or s")
            ok = False
        elif off < 0 or off + max(st.cnt, 1) > views[buf][3]:
            note = " after in-place aliasing" if (r, buf) in lay.aliased else ""
            problems.append(f"{name} {buf}[{off}:{off + st.cnt}] is out of range (buffer "
                            f"{buf} has {views[buf][3]} chunks on rank {r}{note})")
            ok = False
    return ok, problems

"""Lowering: a chunk-level :class:`~synth.schedule.Schedule` becomes a rank-level MSCCL
:class:`~synth.program.ir.Program` (threadblocks, ordered steps, buffers, dependencies).

Buffer placement (collective semantics in :mod:`synth.collectives`):

- copy collectives: a chunk lives at its output slot on ranks whose postcondition wants it, at its
  input slot on its origin (which also copies it to its own output slot with ``cpy`` when the two
  differ), and in a scratch slot (``s``) on ranks that only relay it;
- reductions: the partial sum of chunk ``j`` accumulates in input slot ``j`` (``rrc`` with the
  local operand = input ``j``); the final value reaches the output slot by ``cpy`` (out of place)
  or is already there (in place); a copy of the final value received from a peer lands directly in
  the output slot (or a scratch slot on a pure relay).

Threadblocks: one per (channel, peer, direction) (MSCCL's rule, SPEC), plus local threadblocks for
``cpy``. Steps on a connection are ordered by transfer start time, identically on both ends.
Dependencies come from the buffer accesses at each rank, in schedule time order:
a read waits for the last write of that slot (RAW), a write waits for the last write and for every
read since (WAW, WAR: e.g. an ``rrc`` must not race a send of the same partial sum). The first
cross-threadblock dependency goes in ``depid/deps``; extra ones become ``nop`` steps placed just
before the step. Transfers of one ``group`` (>= 0) that are consecutive on a connection and
contiguous in the buffers at both ends become one step with ``cnt`` > 1 (one α, SPEC cost model).
A connection that needs more than ``max_steps_per_tb`` steps is spread round-robin over extra
channels (``chan + k * nchannels``).

Reference for the step/threadblock semantics: msccl-tools (microsoft/msccl-tools, ``ir.py``) and
the MSCCL runtime's XML loader (Azure/msccl-executor-nccl).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from synth.collectives import Collective
from synth.errors import SynthError
from synth.program.ir import Gpu, Program, Step, Threadblock
from synth.schedule import Schedule

MAX_CNT = 71            # MSCCL: cnt < 72
MAX_CHANNELS = 32       # MSCCL: at most 32 channels
MAX_DEP_TB = 127        # MSCCL: depended-on threadblock ids <= 127
_EPS = 1e-9

Loc = tuple[str, int]   # (buffer, offset) on one rank, after in-place aliasing


@dataclass
class _Op:
    """One step before threadblock assignment."""

    rank: int
    kind: str                     # "send" | "recv" | "local"
    type: str                     # s | r | rrc | cpy
    src: Loc
    dst: Loc
    time: float
    conn: tuple[int, int, int] | None = None   # (src rank, dst rank, schedule channel)
    group: int = -1
    reduce: bool = False
    cnt: int = 1
    deps: set[int] = field(default_factory=set)
    alive: bool = True


def _tol(t: float) -> float:
    return _EPS * max(1.0, abs(t))


class _Lowering:
    def __init__(self, schedule: Schedule, max_steps_per_tb: int) -> None:
        self.schedule = schedule
        self.coll: Collective = schedule.collective
        self.max_steps = max_steps_per_tb
        self.ops: list[_Op] = []
        self.scratch_next: dict[int, int] = defaultdict(int)
        self.scratch: dict[tuple[int, int], Loc] = {}
        self.transfers = sorted(schedule.transfers, key=lambda t: (t.start, t.end, t.channel, t.group, t.chunk))
        self._check_transfers()

    # ---- input checks -----------------------------------------------------------------------
    def _check_transfers(self) -> None:
        coll = self.coll
        valid = set(coll.schedule_chunks)
        for t in self.transfers:
            if not (0 <= t.src < coll.num_ranks and 0 <= t.dst < coll.num_ranks):
                raise SynthError(f"schedule transfer {t.src}->{t.dst} names a rank outside 0..{coll.num_ranks - 1}")
            if t.src == t.dst:
                raise SynthError(f"schedule transfer of chunk {t.chunk} from rank {t.src} to itself")
            if t.chunk not in valid:
                raise SynthError(f"schedule moves chunk {t.chunk}, which {coll.name} does not have")
            if t.reduce and not coll.is_reduction:
                raise SynthError(f"schedule reduces chunk {t.chunk} but {coll.name} is not a reduction")
            if t.channel < 0:
                raise SynthError(f"schedule transfer uses negative channel {t.channel}")
            if t.end < t.start - _tol(t.start):
                raise SynthError(f"schedule transfer of chunk {t.chunk} ends before it starts")

    # ---- placement --------------------------------------------------------------------------
    def resolve(self, rank: int, buffer: str, offset: int) -> Loc:
        alias = self.coll.alias(rank, buffer)
        return (alias[0], alias[1] + offset) if alias else (buffer, offset)

    def scratch_slot(self, rank: int, chunk: int) -> Loc:
        key = (rank, chunk)
        if key not in self.scratch:
            self.scratch[key] = ("s", self.scratch_next[rank])
            self.scratch_next[rank] += 1
        return self.scratch[key]

    def copy_home(self, rank: int, chunk: int) -> Loc:
        """Where a copy-collective chunk lives on ``rank``."""
        origin, slot = self.coll.split_contribution(chunk)
        if rank == origin:
            return self.resolve(rank, "i", slot)
        dests = self.dests[chunk]
        if rank in dests:
            return self.resolve(rank, "o", dests[rank])
        return self.scratch_slot(rank, chunk)

    # ---- build ops --------------------------------------------------------------------------
    def build(self) -> None:
        coll = self.coll
        # chunk -> {rank: output slot} in one pass (Collective.chunk_destinations scans per chunk)
        self.dests: dict[int, dict[int, int]] = {c: {} for c in coll.schedule_chunks}
        for (rank, slot), contribs in coll.postcondition.items():
            if coll.is_reduction:
                self.dests[coll.split_contribution(next(iter(contribs)))[1]][rank] = slot
            else:
                for c in contribs:
                    self.dests.setdefault(c, {})[rank] = slot
        # per (rank, loc): access events (time, write-first rank, seq, op index, mode, chunk)
        self.access: dict[tuple[int, Loc], list[tuple[float, int, int, int, str, int]]] = defaultdict(list)
        seq = 0

        def touch(rank: int, loc: Loc, time: float, op: int, mode: str, chunk: int) -> None:
            nonlocal seq
            self.access[(rank, loc)].append((time, 0 if "w" in mode else 1, seq, op, mode, chunk))
            seq += 1

        # Receives are placed in arrival order so scratch slots of one stream are contiguous.
        recv_loc: dict[int, Loc] = {}
        copies_received: dict[tuple[int, int], list[tuple[float, Loc]]] = defaultdict(list)
        for idx, t in sorted(enumerate(self.transfers), key=lambda it: (it[1].end, it[1].start, it[0])):
            if coll.is_reduction:
                if t.reduce:
                    loc = self.resolve(t.dst, "i", t.chunk)
                else:
                    dest = self.dests[t.chunk].get(t.dst)
                    loc = self.resolve(t.dst, "o", dest) if dest is not None else self.scratch_slot(t.dst, t.chunk)
                    copies_received[(t.dst, t.chunk)].append((t.end, loc))
            else:
                loc = self.copy_home(t.dst, t.chunk)
            recv_loc[idx] = loc

        for idx, t in enumerate(self.transfers):
            if coll.is_reduction:
                if t.reduce:
                    src_loc = self.resolve(t.src, "i", t.chunk)
                else:
                    src_loc = self.resolve(t.src, "i", t.chunk)
                    for end, loc in copies_received.get((t.src, t.chunk), []):
                        if end <= t.start + _tol(t.start):
                            src_loc = loc
            else:
                src_loc = self.copy_home(t.src, t.chunk)
            dst_loc = recv_loc[idx]
            conn = (t.src, t.dst, t.channel)
            send = _Op(t.src, "send", "s", src_loc, dst_loc, t.start, conn, t.group, t.reduce)
            rtype = "rrc" if t.reduce else "r"
            recv = _Op(t.dst, "recv", rtype, dst_loc if t.reduce else src_loc, dst_loc, t.end, conn, t.group, t.reduce)
            self.ops.append(send)
            touch(t.src, src_loc, t.start, len(self.ops) - 1, "r", t.chunk)
            self.ops.append(recv)
            touch(t.dst, dst_loc, t.end, len(self.ops) - 1, "rw" if t.reduce else "w", t.chunk)

        # Local copies.
        if coll.is_reduction:
            last_reduce: dict[tuple[int, int], float] = {}
            for t in self.transfers:
                if t.reduce:
                    key = (t.dst, t.chunk)
                    last_reduce[key] = max(last_reduce.get(key, 0.0), t.end)
            for chunk in coll.schedule_chunks:
                for rank, slot in self.dests[chunk].items():
                    if copies_received.get((rank, chunk)):
                        continue
                    acc, fin = self.resolve(rank, "i", chunk), self.resolve(rank, "o", slot)
                    if acc == fin:
                        continue
                    time = last_reduce.get((rank, chunk), 0.0)
                    self.ops.append(_Op(rank, "local", "cpy", acc, fin, time))
                    touch(rank, acc, time, len(self.ops) - 1, "r", chunk)
                    touch(rank, fin, time, len(self.ops) - 1, "w", chunk)
        else:
            for chunk in coll.schedule_chunks:
                origin, slot = coll.split_contribution(chunk)
                dest = self.dests[chunk].get(origin)
                if dest is None:
                    continue
                src, dst = self.resolve(origin, "i", slot), self.resolve(origin, "o", dest)
                if src == dst:
                    continue
                self.ops.append(_Op(origin, "local", "cpy", src, dst, -1.0))
                touch(origin, src, -1.0, len(self.ops) - 1, "r", chunk)
                touch(origin, dst, -1.0, len(self.ops) - 1, "w", chunk)

    def dependencies(self) -> None:
        """RAW / WAW / WAR dependencies from the access order of every slot."""
        coll = self.coll
        # What each slot holds before any step runs: contributions (copy) or partial sums (reduce).
        initial: dict[tuple[int, Loc], int] = {}
        for (rank, slot), contribution in coll.precondition.items():
            chunk = slot if coll.is_reduction else contribution
            initial[(rank, self.resolve(rank, "i", slot))] = chunk
        for (rank, loc), events in self.access.items():
            events.sort(key=lambda e: (e[0], e[1], e[2]))
            holds = initial.get((rank, loc))
            last_write: int | None = None
            reads: list[int] = []
            for _time, _w, _seq, op, mode, chunk in events:
                if "r" in mode:
                    if holds is None:
                        raise SynthError(f"schedule sends chunk {chunk} from rank {rank} before it arrives there")
                    if holds != chunk:
                        raise SynthError(
                            f"lowering: rank {rank} slot {loc[0]}[{loc[1]}] holds chunk {holds} when chunk {chunk} "
                            "is read from it (in-place buffer conflict)")
                if last_write is not None:
                    self.ops[op].deps.add(last_write)
                if "w" in mode:
                    self.ops[op].deps.update(reads)
                    last_write, reads, holds = op, [], chunk
                else:
                    reads.append(op)

    # ---- merging ------------------------------------------------------------------------------
    def merge(self) -> None:
        """Merge grouped, consecutive, contiguous transfers of a connection into one step."""
        by_conn: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for i, op in enumerate(self.ops):
            if op.kind == "send":
                by_conn[op.conn].append(i)
        replaced: dict[int, int] = {}
        self.conn_ops: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        for conn, sends in by_conn.items():
            # send op i is followed by its recv op i + 1 (built in pairs)
            sends.sort(key=lambda i: (self.ops[i].time, self.ops[i].group, self.ops[i].src[1], i))
            pairs: list[tuple[int, int]] = []
            for s in sends:
                r = s + 1
                if pairs:
                    ps, pr = pairs[-1]
                    a, b = self.ops[ps], self.ops[s]
                    ra, rb = self.ops[pr], self.ops[r]
                    if (a.group >= 0 and a.group == b.group and a.reduce == b.reduce
                            and a.cnt + b.cnt <= MAX_CNT
                            and b.src == (a.src[0], a.src[1] + a.cnt)
                            and rb.dst == (ra.dst[0], ra.dst[1] + ra.cnt)
                            and rb.src == (ra.src[0], ra.src[1] + ra.cnt)):
                        a.cnt += b.cnt
                        ra.cnt += rb.cnt
                        a.deps |= b.deps
                        ra.deps |= rb.deps
                        a.time = max(a.time, b.time)
                        ra.time = max(ra.time, rb.time)
                        b.alive = rb.alive = False
                        replaced[s], replaced[r] = ps, pr
                        continue
                pairs.append((s, r))
            self.conn_ops[conn] = pairs
        # Local copies: merge contiguous ones with the same dependencies.
        self.local_ops: dict[int, list[int]] = defaultdict(list)
        for i, op in enumerate(self.ops):
            if op.kind == "local":
                self.local_ops[op.rank].append(i)
        for rank, idxs in self.local_ops.items():
            idxs.sort(key=lambda i: (self.ops[i].time, self.ops[i].src, i))
            kept: list[int] = []
            for i in idxs:
                if kept:
                    a, b = self.ops[kept[-1]], self.ops[i]
                    if (a.deps == b.deps and a.cnt + b.cnt <= MAX_CNT
                            and b.src == (a.src[0], a.src[1] + a.cnt) and b.dst == (a.dst[0], a.dst[1] + a.cnt)):
                        a.cnt += b.cnt
                        b.alive = False
                        replaced[i] = kept[-1]
                        continue
                kept.append(i)
            self.local_ops[rank] = kept

        def find(i: int) -> int:
            while i in replaced:
                i = replaced[i]
            return i

        for i, op in enumerate(self.ops):
            if op.alive:
                op.deps = {find(d) for d in op.deps} - {i}

    # ---- threadblocks -----------------------------------------------------------------------
    def assign(self) -> dict[int, tuple]:
        """Op -> threadblock key, splitting connections over channels until every tb fits."""
        base = max((conn[2] for conn in self.conn_ops), default=0) + 1
        split = {conn: 1 for conn in self.conn_ops}
        for _ in range(64):
            tb_of: dict[int, tuple] = {}
            position: dict[int, int] = {}
            members: dict[tuple, list[int]] = defaultdict(list)
            for conn, pairs in self.conn_ops.items():
                src, dst, chan = conn
                m = split[conn]
                for k, (s, r) in enumerate(pairs):
                    ch = chan + (k % m) * base
                    for op, key in ((s, (src, "send", ch, dst)), (r, (dst, "recv", ch, src))):
                        tb_of[op] = key
                        position[op] = len(members[key])
                        members[key].append(op)
            for rank, idxs in self.local_ops.items():
                count, part = 0, 0
                for i in idxs:
                    need = 1 + max(0, len(self.ops[i].deps) - 1)
                    if count and count + need > self.max_steps:
                        part, count = part + 1, 0
                    key = (rank, "local", 0, part)
                    tb_of[i] = key
                    position[i] = len(members[key])
                    members[key].append(i)
                    count += need
            # Count steps (with nops) per tb.
            over: dict[tuple[int, int, int], int] = {}
            for key, ops in members.items():
                steps = sum(1 + max(0, len(self._effective_deps(op, tb_of, position)) - 1) for op in ops)
                if steps > self.max_steps and key[1] != "local":
                    op = self.ops[ops[0]]
                    over[op.conn] = max(over.get(op.conn, 0), steps)
            if not over:
                self.tb_of, self.position, self.members = tb_of, position, members
                return tb_of
            for conn, steps in over.items():
                m = split[conn]
                split[conn] = max(m + 1, math.ceil(m * steps / self.max_steps))
                if conn[2] + (split[conn] - 1) * base >= MAX_CHANNELS:
                    raise SynthError(
                        f"lowering: connection {conn[0]}->{conn[1]} needs {len(self.conn_ops[conn])} steps, more than "
                        f"{MAX_CHANNELS} channels of {self.max_steps} steps hold; use a smaller --chunks")
        raise SynthError("lowering: could not fit the threadblocks within the MSCCL step limit; use a smaller --chunks")

    def _effective_deps(self, op: int, tb_of: dict[int, tuple], position: dict[int, int]) -> list[int]:
        """Cross-tb dependencies, keeping only the latest one per threadblock."""
        mine = tb_of[op]
        latest: dict[tuple, int] = {}
        for d in self.ops[op].deps:
            key = tb_of[d]
            if key == mine:
                if position[d] > position[op]:
                    raise SynthError(f"lowering: rank {self.ops[op].rank} has a threadblock that waits on its own "
                                     "later step (the schedule's order is inconsistent)")
                continue
            if key not in latest or position[d] > position[latest[key]]:
                latest[key] = d
        return sorted(latest.values(), key=lambda d: (str(tb_of[d]), position[d]))

    # ---- emit ---------------------------------------------------------------------------------
    def emit(self, name: str) -> Program:
        coll = self.coll
        eff = {op: self._effective_deps(op, self.tb_of, self.position) for op in self.tb_of}
        depended = {d for deps in eff.values() for d in deps}
        kind_order = {"send": 0, "recv": 1, "local": 2}
        gpus: list[Gpu] = []
        nchannels = 1
        per_rank: dict[int, list[tuple]] = defaultdict(list)
        for key in self.members:
            per_rank[key[0]].append(key)
        for rank in range(coll.num_ranks):
            keys = per_rank.get(rank, [])
            # Depended-on threadblocks first so their ids stay within MSCCL's limit.
            keys.sort(key=lambda k: (0 if any(op in depended for op in self.members[k]) else 1,
                                     k[2], kind_order[k[1]], k[3]))
            tb_id = {k: i for i, k in enumerate(keys)}
            # Step index of every op after nop insertion.
            step_index: dict[int, int] = {}
            for k in keys:
                s = 0
                for op in self.members[k]:
                    s += max(0, len(eff[op]) - 1)
                    step_index[op] = s
                    s += 1
            tbs: list[Threadblock] = []
            for k in keys:
                steps: list[Step] = []
                for op in self.members[k]:
                    deps = eff[op]
                    for d in deps[1:]:
                        steps.append(Step("nop", "i", 0, "o", 0, 0, tb_id[self.tb_of[d]], step_index[d], False))
                    o = self.ops[op]
                    first = deps[0] if deps else None
                    steps.append(Step(o.type, o.src[0], o.src[1], o.dst[0], o.dst[1], o.cnt,
                                      tb_id[self.tb_of[first]] if first is not None else -1,
                                      step_index[first] if first is not None else -1,
                                      op in depended))
                    if op in depended and tb_id[k] > MAX_DEP_TB:
                        raise SynthError(f"lowering: rank {rank} needs more than {MAX_DEP_TB + 1} depended-on "
                                         "threadblocks (MSCCL limit); use a smaller --chunks or fewer channels")
                send = k[3] if k[1] == "send" else -1
                recv = k[3] if k[1] == "recv" else -1
                tbs.append(Threadblock(tb_id[k], send, recv, k[2], tuple(steps)))
                nchannels = max(nchannels, k[2] + 1)
            i_chunks = 0 if coll.alias(rank, "i") else coll.input_chunks
            o_chunks = 0 if coll.alias(rank, "o") else coll.output_chunks
            gpus.append(Gpu(rank, i_chunks, o_chunks, self.scratch_next.get(rank, 0), tuple(tbs)))
        sched = self.schedule
        size = float(sched.size_bytes) if sched.size_bytes else None
        return Program(
            name=name,
            collective=coll.name,
            num_ranks=coll.num_ranks,
            gpus=tuple(gpus),
            inplace=coll.inplace,
            nchannels=nchannels,
            nchunksperloop=max(1, max((max(g.i_chunks, g.o_chunks) for g in gpus), default=1)),
            root=coll.root,
            topology=sched.topology or None,
            chunk_factor=coll.chunk_factor,
            size_bytes=size,
            chunk_bytes=coll.chunk_bytes(size) if size else None,
            predicted_time_us=float(sched.predicted_time_us or sched.makespan),
            extra={"method": sched.method} if sched.method else {},
        )


def lower(schedule: Schedule, *, name: str | None = None, max_steps_per_tb: int = 64) -> Program:
    """Lower a chunk-level schedule to an MSCCL program (see the module docstring for the rules).

    Raises :class:`SynthError` when the schedule is inconsistent (a chunk sent before it arrives,
    an in-place buffer conflict) or cannot fit MSCCL's limits (≤ 32 channels, ≤ 64 steps per
    threadblock, depended-on threadblock ids ≤ 127).
    """
    if max_steps_per_tb < 2:
        raise SynthError("max_steps_per_tb must be at least 2")
    state = _Lowering(schedule, max_steps_per_tb)
    state.build()
    state.dependencies()
    state.merge()
    state.assign()
    coll = schedule.collective
    default = f"{coll.name}-{schedule.method or 'schedule'}-{schedule.topology or 'topology'}"
    return state.emit(name or default)


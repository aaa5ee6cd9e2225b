"""Compile a Program into per-rank execution plans (pure Python, no torch).

The plan comes from one deterministic, dependency-driven simulation of the whole program in
*waves*. In each wave every threadblock first runs what it can locally (``cpy``, ``re``, ``nop``
and the *logical* sends: a send completes at once, as in MSCCL whose connection FIFO buffers it),
then each threadblock blocked on a receive is matched with the k-th send on its connection
(src, dst, chan), k = receives done so far on that connection (MSCCL: a connection is FIFO).
A matched message is *posted* on both ends in the wave it is matched, so every wave of every rank
is one batch of isend/irecv whose partners are all in the same wave on the peer: by induction on
the wave number no rank can wait for a message that is posted later, and the run cannot deadlock
unless the program itself does (then the simulation gets stuck and says where).

Within a wave, per rank: ``pre`` local ops (in simulation order), one comm batch (ops sorted by
message id, so both ends of every (src, dst) pair post in the same order: NCCL matches by order),
then ``post`` ops (the reductions of ``rrc``/``rrs``/``rrcs``). A send's data is read when it is
posted, not when it logically happens; if the program overwrites the source in between, the plan
snapshots it into a temporary at the logical send (exact MSCCL semantics, no extra copy otherwise).
Temporaries (receive-reduce operands, snapshots) are pooled by lifetime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from synth.collectives import Collective
from synth.program.ir import Program, Step

# A region is (space, start_chunk, cnt); space is a physical buffer name ("i", "o", "s") or an
# int temporary id (then start is 0).
Region = tuple
COPY, ADD, BATCH = "copy", "add", "batch"


@dataclass(frozen=True)
class RankPlan:
    rank: int
    buffers: dict[str, int]  # physical buffer -> chunks
    aliases: dict[str, tuple[str, int]]  # aliased buffer -> (physical buffer, base chunk)
    temps: tuple[int, ...]  # temp id -> chunks
    # ops: ("copy", dst, src) | ("add", dst, a, b) meaning dst = a + b |
    #      ("batch", ((kind, peer, region, chan), ...)) with kind "send" | "recv" | "self" (local copy dst<-src)
    ops: tuple
    num_messages: int


@dataclass(frozen=True)
class Plan:
    program_name: str
    collective: Collective
    ranks: tuple[RankPlan, ...]
    waves: int
    messages: int
    stuck: tuple[str, ...] = ()  # why the simulation could not finish (empty when it did)
    unmatched_sends: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def deadlocks(self) -> bool:
        return bool(self.stuck)


@dataclass
class _Msg:
    id: int
    src: int
    dst: int
    chan: int
    cnt: int
    source: Region
    send_wave: int
    where: str
    snap_temp: int | None = None
    match_wave: int = -1
    target: Region | None = None


@dataclass
class _Temp:
    cnt: int
    start: int
    end: int = 1 << 60


def _overlap(a: Region, b: Region) -> bool:
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


def compile_plan(program: Program, collective: Collective, *, allow_hang: bool = False) -> Plan:
    """Simulate ``program`` in waves and return one op list per rank (see module docstring).

    With ``allow_hang`` a program that deadlocks still gets a plan: its blocked receives are posted
    in a last wave and never complete (the runner's timeout then ends the run), which is what the
    program would do on a real runtime. Without it the plan only records ``stuck``.
    """
    n = program.num_ranks
    gpus = {g.id: g for g in program.gpus}
    tbs = {g: {tb.id: tb for tb in gpus[g].threadblocks} for g in gpus}

    # ---- buffers and aliasing ----------------------------------------------------------------
    used: dict[int, dict[str, int]] = {g: {"i": 0, "o": 0, "s": 0} for g in range(n)}
    for g, gpu in gpus.items():
        for b in "ios":
            used[g][b] = gpu.chunks(b)
        for tb in gpu.threadblocks:
            for st in tb.steps:
                if st.type != "nop":
                    for buf, off in ((st.srcbuf, st.srcoff), (st.dstbuf, st.dstoff)):
                        if buf in used[g]:
                            used[g][buf] = max(used[g][buf], off + st.cnt)
    buffers: dict[int, dict[str, int]] = {}
    aliases: dict[int, dict[str, tuple[str, int]]] = {}
    for g in range(n):
        need = dict(used[g])
        need["i"] = max(need["i"], collective.input_chunks)
        need["o"] = max(need["o"], collective.output_chunks)
        al = {b: collective.alias(g, b) for b in "io"}
        al = {b: t for b, t in al.items() if t is not None}
        phys = {b: c for b, c in need.items() if b not in al}
        for b, (tgt, base) in al.items():
            phys[tgt] = max(phys[tgt], base + need[b])
        buffers[g] = {b: c for b, c in phys.items() if c > 0}
        aliases[g] = al

    def region(g: int, buf: str, off: int, cnt: int) -> Region:
        if buf not in ("i", "o", "s"):
            raise ValueError(f"unknown buffer {buf!r}")
        if buf in aliases[g]:
            tgt, base = aliases[g][buf]
            return (tgt, base + off, cnt)
        return (buf, off, cnt)

    # ---- simulation state --------------------------------------------------------------------
    pc = {(g, t): 0 for g in tbs for t in tbs[g]}
    phase = dict.fromkeys(pc, 0)  # 1: receive part done, send part pending
    pending_src: dict[tuple[int, int], Region] = {}  # (g, t) -> data to forward
    done: set[tuple[int, int, int]] = set()
    sendq: dict[tuple[int, int, int], list[_Msg]] = {}
    recvd: dict[tuple[int, int, int], int] = {}
    msgs: list[_Msg] = []
    temps: dict[int, list[_Temp]] = {g: [] for g in range(n)}
    # per rank, per wave: pre ops, comm (msg ids), post ops
    pre: dict[int, dict[int, list]] = {g: {} for g in range(n)}
    comm: dict[int, dict[int, list]] = {g: {} for g in range(n)}
    post: dict[int, dict[int, list]] = {g: {} for g in range(n)}
    inflight: dict[int, list[_Msg]] = {g: [] for g in range(n)}  # sent, not yet waited

    def new_temp(g: int, cnt: int, start: int) -> int:
        temps[g].append(_Temp(cnt, start))
        return len(temps[g]) - 1

    def write(g: int, reg: Region, wave: int) -> None:
        """A write to ``reg`` on rank g before this wave's wait: protect in-flight send sources."""
        if not isinstance(reg[0], str):
            return
        for m in inflight[g]:
            if m.snap_temp is None and _overlap(m.source, reg):
                m.snap_temp = new_temp(g, m.cnt, m.send_wave)

    def dep_ok(g: int, st: Step) -> bool:
        return st.depid < 0 or (g, st.depid, st.deps) in done

    def where(g: int, t: int, s: int) -> str:
        return f"rank {g} tb {t} step {s}"

    def logical_send(g: int, t: int, s: int, source: Region, cnt: int, wave: int) -> None:
        tb = tbs[g][t]
        conn = (g, tb.send, tb.chan)
        m = _Msg(len(msgs), g, tb.send, tb.chan, cnt, source, wave, where(g, t, s))
        msgs.append(m)
        sendq.setdefault(conn, []).append(m)
        inflight[g].append(m)
        # placeholder: becomes a snapshot copy if the source is overwritten before the post
        pre[g].setdefault(wave, []).append(("snap", m))

    total = sum(len(tb.steps) for g in tbs for tb in tbs[g].values())
    wave = 0
    stuck: list[str] = []
    hang_wave: list[tuple[int, int, int]] = []
    while len(done) < total:
        progressed = False
        # 1. local ops and logical sends, to a fixpoint
        changed = True
        while changed:
            changed = False
            for (g, t), i in list(pc.items()):
                steps = tbs[g][t].steps
                while i < len(steps):
                    st = steps[i]
                    if not dep_ok(g, st):
                        break
                    ty = st.type
                    if ty in ("cpy", "re", "nop"):
                        if ty != "nop":
                            src = region(g, st.srcbuf, st.srcoff, st.cnt)
                            dst = region(g, st.dstbuf, st.dstoff, st.cnt)
                            write(g, dst, wave)
                            op = (COPY, dst, src) if ty == "cpy" else (ADD, dst, dst, src)
                            pre[g].setdefault(wave, []).append(op)
                    elif ty == "s":
                        logical_send(g, t, i, region(g, st.srcbuf, st.srcoff, st.cnt), st.cnt, wave)
                    elif st.sends and phase[(g, t)] == 1:
                        logical_send(g, t, i, pending_src.pop((g, t)), st.cnt, wave)
                        phase[(g, t)] = 0
                    else:
                        break  # a receive (or receive part) is next
                    done.add((g, t, i))
                    i += 1
                    changed = progressed = True
                pc[(g, t)] = i
        # 2. match receives with sends already posted on their connection
        matched: list[tuple[int, int, int, _Msg]] = []
        for (g, t), i in pc.items():
            steps = tbs[g][t].steps
            if i >= len(steps) or phase[(g, t)] != 0 or not steps[i].receives or not dep_ok(g, steps[i]):
                continue
            tb = tbs[g][t]
            conn = (tb.recv, g, tb.chan)
            k = recvd.get(conn, 0)
            queue = sendq.get(conn, [])
            if k < len(queue):
                recvd[conn] = k + 1
                matched.append((g, t, i, queue[k]))
        for g, t, i, m in matched:
            st = tbs[g][t].steps[i]
            if m.cnt != st.cnt:
                raise ValueError(f"{m.where} sends {m.cnt} chunks but {where(g, t, i)} receives {st.cnt}")
            if st.type in ("r", "rcs"):
                m.target = region(g, st.dstbuf, st.dstoff, st.cnt)
            else:
                m.target = (new_temp(g, st.cnt, wave), 0, st.cnt)
            m.match_wave = wave
            write(g, m.target, wave)
            comm[m.src].setdefault(wave, []).append(m)
            if m.dst != m.src:
                comm[m.dst].setdefault(wave, []).append(m)
            progressed = True
        # the wave's wait completes these sends: their sources are free again
        for g in range(n):
            inflight[g] = [m for m in inflight[g] if m.match_wave < 0]
        # 3. post-phase: reductions and receive bookkeeping
        for g, t, i, m in matched:
            st = tbs[g][t].steps[i]
            ty = st.type
            tmp = m.target
            if ty in ("rrc", "rrcs"):
                src = region(g, st.srcbuf, st.srcoff, st.cnt)
                dst = region(g, st.dstbuf, st.dstoff, st.cnt)
                write(g, dst, wave + 1)
                post[g].setdefault(wave, []).append((ADD, dst, src, tmp))
                temps[g][tmp[0]].end = wave
                fwd = dst
            elif ty == "rrs":
                src = region(g, st.srcbuf, st.srcoff, st.cnt)
                post[g].setdefault(wave, []).append((ADD, tmp, tmp, src))
                fwd = tmp
            else:
                fwd = tmp
            if st.sends:
                phase[(g, t)] = 1
                pending_src[(g, t)] = fwd
            else:
                done.add((g, t, i))
                pc[(g, t)] = i + 1
        if not progressed:
            for (g, t), i in sorted(pc.items()):
                steps = tbs[g][t].steps
                if i >= len(steps):
                    continue
                st = steps[i]
                tb = tbs[g][t]
                if not dep_ok(g, st):
                    stuck.append(f"{where(g, t, i)} ({st.type}) waits for tb {st.depid} step {st.deps}")
                elif st.receives and phase[(g, t)] == 0:
                    stuck.append(f"{where(g, t, i)} ({st.type}) waits for a message from rank {tb.recv} "
                                 f"on channel {tb.chan} that is never sent")
                    hang_wave.append((g, t, i))
            break
        wave += 1

    # temporaries of rrs forwards end when their message is posted; snapshots likewise
    for m in msgs:
        end = m.match_wave if m.match_wave >= 0 else 1 << 60
        if isinstance(m.source[0], int):
            temps[m.src][m.source[0]].end = end
        if m.snap_temp is not None:
            temps[m.src][m.snap_temp].end = end
    unmatched = tuple(f"{m.where} sends to rank {m.dst} on channel {m.chan} but no receive takes it"
                      for m in msgs if m.match_wave < 0)

    # ---- pool temporaries by lifetime, then emit op lists --------------------------------------
    rank_plans = []
    for g in range(n):
        slot_of: dict[int, int] = {}
        pool: list[tuple[int, int]] = []  # (cnt, busy until wave)
        for tid in sorted(range(len(temps[g])), key=lambda x: (temps[g][x].start, x)):
            tmp = temps[g][tid]
            for j, (cnt, busy) in enumerate(pool):
                if cnt == tmp.cnt and busy < tmp.start:
                    pool[j] = (cnt, tmp.end)
                    slot_of[tid] = j
                    break
            else:
                pool.append((tmp.cnt, tmp.end))
                slot_of[tid] = len(pool) - 1

        def fix(reg: Region, slot_of: dict[int, int] = slot_of) -> Region:
            return (slot_of[reg[0]], 0, reg[2]) if isinstance(reg[0], int) else reg

        def data_of(m: _Msg, slot_of: dict[int, int] = slot_of) -> Region:
            return (slot_of[m.snap_temp], 0, m.cnt) if m.snap_temp is not None else fix(m.source)

        ops: list = []
        for w in range(wave + 1):
            for op in pre[g].get(w, ()):
                if op[0] == "snap":
                    m = op[1]
                    if m.snap_temp is not None:
                        ops.append((COPY, (slot_of[m.snap_temp], 0, m.cnt), fix(m.source)))
                else:
                    ops.append((op[0],) + tuple(fix(r) for r in op[1:]))
            batch = []
            for m in sorted(comm[g].get(w, ()), key=lambda x: x.id):
                if m.src == m.dst:
                    batch.append(("self", g, (fix(m.target), data_of(m)), m.chan))
                elif m.src == g:
                    batch.append(("send", m.dst, data_of(m), m.chan))
                else:
                    batch.append(("recv", m.src, fix(m.target), m.chan))
            if batch:
                ops.append((BATCH, tuple(batch)))
            for op in post[g].get(w, ()):
                ops.append((op[0],) + tuple(fix(r) for r in op[1:]))
        if allow_hang:
            hang = []
            for hg, t, i in hang_wave:
                if hg == g:
                    st = tbs[g][t].steps[i]
                    hang.append(("recv", tbs[g][t].recv, (len(pool), 0, st.cnt), tbs[g][t].chan))
            if hang:
                pool.append((max(r[2][2] for r in hang), 1 << 60))
                ops.append((BATCH, tuple(hang)))
        rank_plans.append(RankPlan(g, buffers[g], aliases[g], tuple(c for c, _ in pool), tuple(ops),
                                   sum(1 for m in msgs if g in (m.src, m.dst))))
    return Plan(program.name, collective, tuple(rank_plans), wave + 1, len(msgs), tuple(stuck), unmatched)

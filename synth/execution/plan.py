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

Switches (``Program.switches``, NVLS/SHARP) run on ONE extra process, index ``num_ranks``, that emulates
every switch of the program. A rank's send to a switch peer (``num_ranks + k``) is a message to that
process; the process receives each message as soon as it is sent (it always expects the next message on
every connection an op names). On connection (rank, switch, chan) the k-th message belongs to the k-th op
(in list order) of that switch naming the rank among its ``srcs`` with that ``chan``; symmetrically the
k-th message the switch sends on (switch, rank, chan) comes from the k-th op naming the rank among its
``dsts``. An op runs after the wait of the wave in which its last input arrived: ``reduce`` sums its
inputs into a temporary, ``multicast`` forwards its one input; then it sends the result to every ``dsts``
rank (logical sends, matched with the ranks' receives like any other message).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from synth.collectives import Collective
from synth.program.ir import Gpu, Program, Step, SwitchOp, Threadblock

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
    # the extra process that emulates the program's switches (index = number of ranks), if it has any
    switch_process: RankPlan | None = None

    @property
    def deadlocks(self) -> bool:
        return bool(self.stuck)

    @property
    def processes(self) -> tuple[RankPlan, ...]:
        """One plan per process: the ranks, then the switch process where there is one."""
        return self.ranks + ((self.switch_process,) if self.switch_process is not None else ())


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
    buffers, aliases = _layout(_used_chunks(gpus, n), collective, n)
    ws = _Waves({g: {tb.id: tb for tb in gpus[g].threadblocks} for g in gpus}, aliases, n,
                tuple(sw.ops for sw in program.switches))
    wave, stuck, hang_wave = _run_waves(ws)
    _end_send_temps(ws)
    unmatched = tuple(f"{m.where} sends to {_node(ws, m.dst)} on channel {m.chan} but no "
                      f"{'switch op' if m.dst >= n else 'receive'} takes it" for m in ws.msgs if m.match_wave < 0)
    rank_plans = tuple(_rank_plan(ws, g, buffers[g], wave, hang_wave if allow_hang else []) for g in range(n))
    switch_plan = _rank_plan(ws, n, {}, wave, []) if program.switches else None
    return Plan(program.name, collective, rank_plans, wave + 1, len(ws.msgs), tuple(stuck), unmatched,
                switch_process=switch_plan)


def _node(ws: _Waves, node: int) -> str:
    return f"rank {node}" if node < ws.n else f"switch {node - ws.n}"


# ---- buffers and aliasing --------------------------------------------------------------------------
def _used_chunks(gpus: dict[int, Gpu], n: int) -> dict[int, dict[str, int]]:
    """Per rank, the chunks of each buffer: declared, or as far as some step reaches."""
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
    return used


def _layout(used: dict[int, dict[str, int]], collective: Collective,
            n: int) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, tuple[str, int]]]]:
    """(physical buffer -> chunks, aliased buffer -> (physical buffer, base chunk)) per rank."""
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
    return buffers, aliases


def _region(aliases: dict[str, tuple[str, int]], buf: str, off: int, cnt: int) -> Region:
    """The physical region of ``cnt`` chunks at ``off`` in buffer ``buf`` of a rank with these aliases."""
    if buf not in ("i", "o", "s"):
        raise ValueError(f"unknown buffer {buf!r}")
    if buf in aliases:
        tgt, base = aliases[buf]
        return (tgt, base + off, cnt)
    return (buf, off, cnt)


# ---- the wave simulation ---------------------------------------------------------------------------
class _Waves:
    """The state of the wave simulation, advanced by :func:`_run_waves`'s steps."""

    def __init__(self, tbs: dict[int, dict[int, Threadblock]], aliases: dict[int, dict[str, tuple[str, int]]],
                 n: int, switches: tuple[tuple[SwitchOp, ...], ...] = ()) -> None:
        self.tbs = tbs
        self.aliases = aliases
        self.n = n
        self.switches = _Switches(n, switches)
        self.pc = {(g, t): 0 for g in tbs for t in tbs[g]}  # next step of each threadblock
        self.phase = dict.fromkeys(self.pc, 0)  # 1: receive part done, send part pending
        self.pending_src: dict[tuple[int, int], Region] = {}  # (g, t) -> data to forward
        self.done: set[tuple[int, int, int]] = set()
        self.sendq: dict[tuple[int, int, int], list[_Msg]] = {}  # connection -> messages sent on it
        self.recvd: dict[tuple[int, int, int], int] = {}  # connection -> messages received on it
        self.msgs: list[_Msg] = []
        # per process (the ranks, then the switch process n), per wave: pre ops, comm (msgs), post ops
        procs = range(n + 1)
        self.temps: dict[int, list[_Temp]] = {g: [] for g in procs}
        self.pre: dict[int, dict[int, list]] = {g: {} for g in procs}
        self.comm: dict[int, dict[int, list]] = {g: {} for g in procs}
        self.post: dict[int, dict[int, list]] = {g: {} for g in procs}
        self.inflight: dict[int, list[_Msg]] = {g: [] for g in range(n)}  # sent, not yet waited
        for conn, slots in self.switches.out_slots.items():   # the switches' sends: one slot per op, in order
            self.sendq[conn] = [None] * slots

    def proc(self, node: int) -> int:
        """The process of a node: a rank's own, or the switch process for every switch."""
        return min(node, self.n)


class _Switches:
    """Which op of which switch each message to or from a switch belongs to (module docstring)."""

    def __init__(self, n: int, switches: tuple[tuple[SwitchOp, ...], ...]) -> None:
        self.n = n
        self.ops = switches
        # (rank, switch node, chan) -> [(switch k, op j), ...] in list order: the k-th message's op
        self.in_ops: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        # (switch k, op j, rank) -> slot of the op's message on connection (switch node, rank, chan)
        self.out_slot: dict[tuple[int, int, int], int] = {}
        self.out_slots: dict[tuple[int, int, int], int] = {}
        for k, ops in enumerate(switches):
            node = n + k
            for j, op in enumerate(ops):
                _check_op(n, k, j, op)
                for r in op.srcs:
                    self.in_ops.setdefault((r, node, op.chan), []).append((k, j))
                for r in op.dsts:
                    conn = (node, r, op.chan)
                    self.out_slot[(k, j, r)] = self.out_slots.get(conn, 0)
                    self.out_slots[conn] = self.out_slots.get(conn, 0) + 1
        self.taken: dict[tuple[int, int, int], int] = {}   # connection -> messages the switch took
        self.inputs: dict[tuple[int, int], dict[int, Region]] = {}   # (k, j) -> src rank -> temp region
        self.done: set[tuple[int, int]] = set()


def _check_op(n: int, k: int, j: int, op: SwitchOp) -> None:
    """Raise ValueError for a switch op the executor cannot run (the verifier names these too)."""
    where = f"switch {k} op {j} ({op.type})"
    if op.type not in ("reduce", "multicast"):
        raise ValueError(f"{where}: unknown switch op type (reduce or multicast)")
    if op.type == "multicast" and len(op.srcs) != 1:
        raise ValueError(f"{where}: a multicast takes one source, got {len(op.srcs)}")
    if not op.srcs or not op.dsts or op.cnt < 1:
        raise ValueError(f"{where}: needs srcs, dsts and cnt >= 1")
    for what, ranks in (("srcs", op.srcs), ("dsts", op.dsts)):
        if len(set(ranks)) != len(ranks) or not all(0 <= r < n for r in ranks):
            raise ValueError(f"{where}: {what} must be distinct ranks 0..{n - 1}, got {list(ranks)}")


def _where(g: int, t: int, s: int) -> str:
    """How messages name a step."""
    return f"rank {g} tb {t} step {s}"


def _dep_ok(ws: _Waves, g: int, st: Step) -> bool:
    """Whether the step ``st`` of rank ``g`` has no dependency left."""
    return st.depid < 0 or (g, st.depid, st.deps) in ws.done


def _new_temp(ws: _Waves, g: int, cnt: int, start: int) -> int:
    """A new temporary of ``cnt`` chunks on rank ``g``, live from wave ``start``; returns its id."""
    ws.temps[g].append(_Temp(cnt, start))
    return len(ws.temps[g]) - 1


def _write(ws: _Waves, g: int, reg: Region) -> None:
    """A write to ``reg`` on rank g before this wave's wait: protect in-flight send sources."""
    if not isinstance(reg[0], str):
        return
    for m in ws.inflight[g]:
        if m.snap_temp is None and _overlap(m.source, reg):
            m.snap_temp = _new_temp(ws, g, m.cnt, m.send_wave)


def _logical_send(ws: _Waves, g: int, t: int, s: int, source: Region, cnt: int, wave: int) -> None:
    """Queue a message from step ``s`` of tb ``t`` of rank ``g`` on its connection."""
    tb = ws.tbs[g][t]
    conn = (g, tb.send, tb.chan)
    m = _Msg(len(ws.msgs), g, tb.send, tb.chan, cnt, source, wave, _where(g, t, s))
    ws.msgs.append(m)
    ws.sendq.setdefault(conn, []).append(m)
    ws.inflight[g].append(m)
    # placeholder: becomes a snapshot copy if the source is overwritten before the post
    ws.pre[g].setdefault(wave, []).append(("snap", m))


def _run_waves(ws: _Waves) -> tuple[int, list[str], list[tuple[int, int, int]]]:
    """Run waves until every step is done or none progresses: (last wave, why stuck, blocked receives)."""
    total = sum(len(tb.steps) for g in ws.tbs for tb in ws.tbs[g].values())
    wave = 0
    stuck: list[str] = []
    hang_wave: list[tuple[int, int, int]] = []
    while len(ws.done) < total:
        progressed = _run_local(ws, wave)
        matched = _match_receives(ws)
        _post_messages(ws, matched, wave)
        taken = _switch_receives(ws, wave)
        # the wave's wait completes these sends: their sources are free again
        for g in range(ws.n):
            ws.inflight[g] = [m for m in ws.inflight[g] if m.match_wave < 0]
        _finish_receives(ws, matched, wave)
        ran = _run_switch_ops(ws, wave)
        if not (progressed or matched or taken or ran):
            stuck, hang_wave = _diagnose(ws)
            break
        wave += 1
    return wave, stuck, hang_wave


def _run_local(ws: _Waves, wave: int) -> bool:
    """Step 1 of a wave: local ops and logical sends, to a fixpoint; whether any step ran."""
    progressed = False
    changed = True
    while changed:
        changed = False
        for (g, t), i in list(ws.pc.items()):
            steps = ws.tbs[g][t].steps
            while i < len(steps):
                st = steps[i]
                if not _dep_ok(ws, g, st):
                    break
                ty = st.type
                if ty in ("cpy", "re", "nop"):
                    if ty != "nop":
                        src = _region(ws.aliases[g], st.srcbuf, st.srcoff, st.cnt)
                        dst = _region(ws.aliases[g], st.dstbuf, st.dstoff, st.cnt)
                        _write(ws, g, dst)
                        op = (COPY, dst, src) if ty == "cpy" else (ADD, dst, dst, src)
                        ws.pre[g].setdefault(wave, []).append(op)
                elif ty == "s":
                    _logical_send(ws, g, t, i, _region(ws.aliases[g], st.srcbuf, st.srcoff, st.cnt), st.cnt, wave)
                elif st.sends and ws.phase[(g, t)] == 1:
                    _logical_send(ws, g, t, i, ws.pending_src.pop((g, t)), st.cnt, wave)
                    ws.phase[(g, t)] = 0
                else:
                    break  # a receive (or receive part) is next
                ws.done.add((g, t, i))
                i += 1
                changed = progressed = True
            ws.pc[(g, t)] = i
    return progressed


def _match_receives(ws: _Waves) -> list[tuple[int, int, int, _Msg]]:
    """Step 2 of a wave: pair each blocked receive with the next message already sent on its connection."""
    matched: list[tuple[int, int, int, _Msg]] = []
    for (g, t), i in ws.pc.items():
        steps = ws.tbs[g][t].steps
        if i >= len(steps) or ws.phase[(g, t)] != 0 or not steps[i].receives or not _dep_ok(ws, g, steps[i]):
            continue
        tb = ws.tbs[g][t]
        conn = (tb.recv, g, tb.chan)
        k = ws.recvd.get(conn, 0)
        queue = ws.sendq.get(conn, [])
        if k < len(queue) and queue[k] is not None:   # a switch's k-th message may not be sent yet
            ws.recvd[conn] = k + 1
            matched.append((g, t, i, queue[k]))
    return matched


def _post_messages(ws: _Waves, matched: list[tuple[int, int, int, _Msg]], wave: int) -> None:
    """Give each matched message its target and post it on both ends in this wave's batch."""
    for g, t, i, m in matched:
        st = ws.tbs[g][t].steps[i]
        if m.cnt != st.cnt:
            raise ValueError(f"{m.where} sends {m.cnt} chunks but {_where(g, t, i)} receives {st.cnt}")
        if st.type in ("r", "rcs"):
            m.target = _region(ws.aliases[g], st.dstbuf, st.dstoff, st.cnt)
        else:
            m.target = (_new_temp(ws, g, st.cnt, wave), 0, st.cnt)
        m.match_wave = wave
        _write(ws, g, m.target)
        ws.comm[ws.proc(m.src)].setdefault(wave, []).append(m)
        if m.dst != m.src:
            ws.comm[ws.proc(m.dst)].setdefault(wave, []).append(m)


def _switch_receives(ws: _Waves, wave: int) -> bool:
    """The switch process takes every message sent to a switch that an op of it expects, into a temporary
    of that op's; whether it took any."""
    sw = ws.switches
    n = ws.n
    took = False
    for conn, ops in sw.in_ops.items():
        queue = ws.sendq.get(conn, [])
        k = sw.taken.get(conn, 0)
        while k < min(len(queue), len(ops)):
            m = queue[k]
            s_k, j = ops[k]
            op = sw.ops[s_k][j]
            if m.cnt != op.cnt:
                raise ValueError(f"{m.where} sends {m.cnt} chunks but op {j} of switch {s_k} ({op.type}) takes "
                                 f"{op.cnt}")
            m.target = (_new_temp(ws, n, op.cnt, wave), 0, op.cnt)
            m.match_wave = wave
            sw.inputs.setdefault((s_k, j), {})[m.src] = m.target
            ws.comm[m.src].setdefault(wave, []).append(m)
            ws.comm[n].setdefault(wave, []).append(m)
            k += 1
            took = True
        sw.taken[conn] = k
    return took


def _run_switch_ops(ws: _Waves, wave: int) -> bool:
    """After the wave's wait: every switch op whose inputs have all arrived runs (reduce: sum into a
    temporary; multicast: its one input) and sends the result to each of its ``dsts``; whether any ran."""
    sw = ws.switches
    n = ws.n
    ran = False
    for (k, j), got in sorted(sw.inputs.items()):
        op = sw.ops[k][j]
        if (k, j) in sw.done or len(got) < len(op.srcs):
            continue
        parts = [got[r] for r in op.srcs]
        for part in parts:
            ws.temps[n][part[0]].end = wave
        if len(parts) == 1:
            result = parts[0]
        else:
            result = (_new_temp(ws, n, op.cnt, wave), 0, op.cnt)
            ws.post[n].setdefault(wave, []).append((ADD, result, parts[0], parts[1]))
            for part in parts[2:]:
                ws.post[n].setdefault(wave, []).append((ADD, result, result, part))
        node = n + k
        for r in op.dsts:
            m = _Msg(len(ws.msgs), node, r, op.chan, op.cnt, result, wave, f"switch {k} op {j} ({op.type})")
            ws.msgs.append(m)
            ws.sendq[(node, r, op.chan)][sw.out_slot[(k, j, r)]] = m
        sw.done.add((k, j))
        ran = True
    return ran


def _finish_receives(ws: _Waves, matched: list[tuple[int, int, int, _Msg]], wave: int) -> None:
    """Step 3 of a wave: the reductions after the wait, and the receive steps' bookkeeping."""
    for g, t, i, m in matched:
        st = ws.tbs[g][t].steps[i]
        ty = st.type
        tmp = m.target
        if ty in ("rrc", "rrcs"):
            src = _region(ws.aliases[g], st.srcbuf, st.srcoff, st.cnt)
            dst = _region(ws.aliases[g], st.dstbuf, st.dstoff, st.cnt)
            _write(ws, g, dst)
            ws.post[g].setdefault(wave, []).append((ADD, dst, src, tmp))
            ws.temps[g][tmp[0]].end = wave
            fwd = dst
        elif ty == "rrs":
            src = _region(ws.aliases[g], st.srcbuf, st.srcoff, st.cnt)
            ws.post[g].setdefault(wave, []).append((ADD, tmp, tmp, src))
            fwd = tmp
        else:
            fwd = tmp
        if st.sends:
            ws.phase[(g, t)] = 1
            ws.pending_src[(g, t)] = fwd
        else:
            ws.done.add((g, t, i))
            ws.pc[(g, t)] = i + 1


def _diagnose(ws: _Waves) -> tuple[list[str], list[tuple[int, int, int]]]:
    """Why no step can run: one line per blocked step, and the receives that wait forever."""
    stuck: list[str] = []
    hang_wave: list[tuple[int, int, int]] = []
    for (g, t), i in sorted(ws.pc.items()):
        steps = ws.tbs[g][t].steps
        if i >= len(steps):
            continue
        st = steps[i]
        tb = ws.tbs[g][t]
        if not _dep_ok(ws, g, st):
            stuck.append(f"{_where(g, t, i)} ({st.type}) waits for tb {st.depid} step {st.deps}")
        elif st.receives and ws.phase[(g, t)] == 0:
            stuck.append(f"{_where(g, t, i)} ({st.type}) waits for a message from {_node(ws, tb.recv)} "
                         f"on channel {tb.chan} that is never sent")
            hang_wave.append((g, t, i))
    sw = ws.switches
    for k, ops in enumerate(sw.ops):
        for j, op in enumerate(ops):
            missing = [r for r in op.srcs if r not in sw.inputs.get((k, j), {})]
            if (k, j) not in sw.done and missing:
                stuck.append(f"switch {k} op {j} ({op.type}) waits for a message from rank "
                             f"{', '.join(map(str, missing[:4]))} on channel {op.chan} that is never sent")
    return stuck, hang_wave


def _end_send_temps(ws: _Waves) -> None:
    """Temporaries of rrs forwards end when their message is posted; snapshots likewise."""
    ended: set[tuple[int, int]] = set()
    for m in ws.msgs:
        end = m.match_wave if m.match_wave >= 0 else 1 << 60
        if isinstance(m.source[0], int):
            temp = ws.temps[ws.proc(m.src)][m.source[0]]
            if m.src >= ws.n and (m.src, m.source[0]) in ended:   # a switch sends one result to many ranks
                temp.end = max(temp.end, end)
            else:
                temp.end = end
                ended.add((m.src, m.source[0]))
        if m.snap_temp is not None:
            ws.temps[m.src][m.snap_temp].end = end


# ---- per-rank op lists -----------------------------------------------------------------------------
def _pool_temps(temps: list[_Temp]) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """Share temporaries of one size whose lifetimes do not overlap: (temp id -> slot, (cnt, busy until) per slot)."""
    slot_of: dict[int, int] = {}
    pool: list[tuple[int, int]] = []  # (cnt, busy until wave)
    for tid in sorted(range(len(temps)), key=lambda x: (temps[x].start, x)):
        tmp = temps[tid]
        for j, (cnt, busy) in enumerate(pool):
            if cnt == tmp.cnt and busy < tmp.start:
                pool[j] = (cnt, tmp.end)
                slot_of[tid] = j
                break
        else:
            pool.append((tmp.cnt, tmp.end))
            slot_of[tid] = len(pool) - 1
    return slot_of, pool


def _fix(reg: Region, slot_of: dict[int, int]) -> Region:
    """``reg`` with a temporary id replaced by its pool slot."""
    return (slot_of[reg[0]], 0, reg[2]) if isinstance(reg[0], int) else reg


def _data_of(m: _Msg, slot_of: dict[int, int]) -> Region:
    """Where message ``m``'s data is read when it is posted: its snapshot if it has one, else its source."""
    return (slot_of[m.snap_temp], 0, m.cnt) if m.snap_temp is not None else _fix(m.source, slot_of)


def _emit_ops(ws: _Waves, g: int, slot_of: dict[int, int], last_wave: int) -> list:
    """Rank ``g``'s ops, wave by wave: pre ops, one comm batch, post ops."""
    ops: list = []
    for w in range(last_wave + 1):
        for op in ws.pre[g].get(w, ()):
            if op[0] == "snap":
                m = op[1]
                if m.snap_temp is not None:
                    ops.append((COPY, (slot_of[m.snap_temp], 0, m.cnt), _fix(m.source, slot_of)))
            else:
                ops.append((op[0],) + tuple(_fix(r, slot_of) for r in op[1:]))
        batch = []
        for m in sorted(ws.comm[g].get(w, ()), key=lambda x: x.id):
            if m.src == m.dst:
                batch.append(("self", g, (_fix(m.target, slot_of), _data_of(m, slot_of)), m.chan))
            elif ws.proc(m.src) == g:
                batch.append(("send", ws.proc(m.dst), _data_of(m, slot_of), m.chan))
            else:
                batch.append(("recv", ws.proc(m.src), _fix(m.target, slot_of), m.chan))
        if batch:
            ops.append((BATCH, tuple(batch)))
        for op in ws.post[g].get(w, ()):
            ops.append((op[0],) + tuple(_fix(r, slot_of) for r in op[1:]))
    return ops


def _rank_plan(ws: _Waves, g: int, buffers: dict[str, int], last_wave: int,
               hang_wave: list[tuple[int, int, int]]) -> RankPlan:
    """Rank ``g``'s plan: pooled temporaries, its ops, and a last batch of the receives in ``hang_wave``."""
    slot_of, pool = _pool_temps(ws.temps[g])
    ops = _emit_ops(ws, g, slot_of, last_wave)
    hang = []
    for hg, t, i in hang_wave:
        if hg == g:
            st = ws.tbs[g][t].steps[i]
            hang.append(("recv", ws.proc(ws.tbs[g][t].recv), (len(pool), 0, st.cnt), ws.tbs[g][t].chan))
    if hang:
        pool.append((max(r[2][2] for r in hang), 1 << 60))
        ops.append((BATCH, tuple(hang)))
    return RankPlan(g, buffers, ws.aliases.get(g, {}), tuple(c for c, _ in pool), tuple(ops),
                    sum(1 for m in ws.msgs if g in (ws.proc(m.src), ws.proc(m.dst))))

"""Verification pass 3, the symbolic execution: every threadblock runs its compiled steps on the symbolic
memory until it ends or blocks; then why blocked threadblocks wait (deadlock) and which messages were never
received."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from synth.program.ir import Program
from synth.verification.common import (
    CPY,
    NOP,
    RACE_CHECK_BUDGET,
    RCS,
    RE,
    READ_KINDS,
    RRC,
    RRS,
    Errors,
    R,
    S,
    describe,
    fmt_ranks,
    operand,
    ranks_of,
    step_name,
)
from synth.verification.structure import Structure


@dataclass(frozen=True)
class Execution:
    """Where the run stopped: each threadblock's next step, the messages left on each connection, and the
    executed trace (g, step, sending g or -1, its step or -1) for the race check (None: not recorded)."""

    errors: Errors
    pc: tuple[int, ...]
    fifos: dict[tuple, deque]
    trace: list[tuple[int, int, int, int]] | None


def execute(program: Program, st: Structure, races: bool, max_errors: int) -> Execution:
    """Execute on a worklist: each threadblock runs until it blocks, and is woken by what it waits for."""
    ntb = len(st.tbs)
    small = ntb * program.num_steps() <= RACE_CHECK_BUDGET
    run = _Machine(st, races and small, max_errors)
    work = deque(range(ntb))
    while work:
        run.advance(work.popleft(), work)
    return Execution(run.err, tuple(run.pc), run.fifos, run.trace)


class _Machine:
    """The execution pass's mutable state: program counters, connection FIFOs and who waits on what."""

    def __init__(self, st: Structure, trace: bool, max_errors: int) -> None:
        self.err = Errors(max_errors)
        self.tbs, self.records = st.tbs, st.records
        self.pc = [0] * len(st.tbs)
        self.fifos: dict[tuple, deque] = {key: deque() for key in st.conns.sender}
        self.dep_wait: dict[tuple, list] = {}
        self.conn_wait: dict[tuple, int] = {}
        self.trace: list | None = [] if trace else None

    def advance(self, g: int, work: deque) -> None:
        """Run threadblock ``g`` from its pc until it blocks or ends; queue the threadblocks it wakes."""
        err, pc, fifos, trace = self.err, self.pc, self.fifos, self.trace
        dep_wait, conn_wait = self.dep_wait, self.conn_wait
        r, tb = self.tbs[g]
        recs = self.records[g]
        p = pc[g]
        nsteps = len(recs)
        rkey = (tb.recv, r, tb.chan)
        skey = (r, tb.send, tb.chan)
        rq = fifos.get(rkey)
        sq = fifos.get(skey)
        while p < nsteps:
            kind, rcv, snd, cnt, sarr, soff, darr, dwr, doff, dep = recs[p]
            if dep is not None and pc[dep[0]] <= dep[1]:
                dep_wait.setdefault(dep, []).append(g)
                break
            inc = None
            sg = -1
            if rcv:
                if not rq:
                    conn_wait[rkey] = g
                    break
                inc, mcnt, sg, sp = rq.popleft()
                if mcnt != cnt:
                    inc = self.count_mismatch(inc, cnt, mcnt, g, p, sg, sp)
            out = None
            if kind == NOP:
                if snd:
                    out = (None,) * cnt  # keep the connection's message count right
            else:
                if kind in READ_KINDS:
                    src = sarr[soff:soff + cnt]
                    if None in src:
                        err.add(f"{step_name(self.tbs, g, p)}: reads {operand(self.tbs, g, p, 'src')}, "
                                "which holds no data")
                if kind == S:
                    out = tuple(src)
                elif kind == R or kind == RCS:
                    if inc is None:
                        inc = (None,) * cnt
                    darr[doff:doff + cnt] = inc
                    dwr[doff:doff + cnt] = ((g, p),) * cnt
                    out = inc
                elif kind == CPY:
                    darr[doff:doff + cnt] = src
                    dwr[doff:doff + cnt] = ((g, p),) * cnt
                else:  # reductions: rrs, rrc, rrcs (incoming + local src) and re (dst + src)
                    res = self.combine(kind, inc, src, darr, doff, cnt, g, p)
                    if kind != RRS:
                        darr[doff:doff + cnt] = res
                        dwr[doff:doff + cnt] = ((g, p),) * cnt
                    if kind != RRC and kind != RE:
                        out = tuple(res)
            if snd:
                sq.append((out, cnt, g, p))
                if skey in conn_wait:
                    work.append(conn_wait.pop(skey))
            if trace is not None:
                trace.append((g, p, sg, sp if sg >= 0 else -1))
            p += 1
            pc[g] = p
            if (g, p - 1) in dep_wait:
                work.extend(dep_wait.pop((g, p - 1)))
        pc[g] = p

    def count_mismatch(self, inc: tuple, cnt: int, mcnt: int, g: int, p: int, sg: int, sp: int) -> tuple:
        """A receive whose cnt differs from its send's: reported; the message padded or cut to ``cnt``."""
        sr, stb = self.tbs[sg]
        self.err.add(f"{step_name(self.tbs, g, p)}: receives cnt={cnt} but the matching send, rank {sr} tb "
                     f"{stb.id} step {sp}, has cnt={mcnt}")
        return (inc + (None,) * cnt)[:cnt]

    def combine(self, kind: int, inc, src: list, darr: list, doff: int, cnt: int, g: int, p: int) -> list:
        """The values a reduction step computes: incoming (``re``: its dst) plus its local src, chunk by chunk."""
        if kind == RE:
            other = darr[doff:doff + cnt]
            if None in other:
                self.err.add(f"{step_name(self.tbs, g, p)}: reduces into {operand(self.tbs, g, p, 'dst')}, "
                             "which holds no data")
        else:
            other = inc if inc is not None else (None,) * cnt
        res = []
        for k in range(cnt):
            x, y = other[k], src[k]
            if x is not None and y is not None and x[0] == y[0] and not x[1] & y[1]:
                res.append((x[0], x[1] | y[1]))
            else:
                res.append(self.reduce(x, y, g, p, k))
        return res

    def reduce(self, a, b, g: int, p: int, k: int):
        """Slow path of a reduction: one operand missing, different input slots, or double counting."""
        if a is None or b is None:
            return a if b is None else b
        where = step_name(self.tbs, g, p)
        if a[0] != b[0]:
            self.err.add(f"{where}: chunk {k} reduces {describe(a)} with {describe(b)} (different input slots)")
            return a
        self.err.add(f"{where}: chunk {k} double counts ranks {fmt_ranks(ranks_of(a[1] & b[1]))} of input "
                     f"slot {a[0]} ({describe(a)} + {describe(b)})")
        return (a[0], a[1] | b[1])


def blocked(st: Structure, ex: Execution, max_errors: int) -> Errors:
    """Threadblocks that never finished: why each waits, and the wait-for cycles among them (deadlock)."""
    err, pc, tbs = Errors(max_errors), ex.pc, st.tbs
    stuck = [g for g, (_, tb) in enumerate(tbs) if pc[g] < len(tb.steps)]
    if not stuck:
        return err
    waits_on: dict[int, int] = {}
    reasons: dict[int, str] = {}
    for g in stuck:
        reasons[g], on = wait_reason(st, ex, g)
        if on is not None:
            waits_on[g] = on
    for cyc in wait_cycles(stuck, waits_on)[:5]:
        chain = " -> ".join(step_name(tbs, g, pc[g]) for g in cyc + [cyc[0]])
        err.add(f"deadlock: wait cycle {chain}")
    for g in stuck:
        err.add(f"{step_name(tbs, g, pc[g])}: never runs ({len(stuck)} threadblocks blocked): {reasons[g]}")
    return err


def wait_reason(st: Structure, ex: Execution, g: int) -> tuple[str, int | None]:
    """Why blocked threadblock ``g`` waits, and the threadblock it waits on (None: nothing will come)."""
    pc, tbs = ex.pc, st.tbs
    r, tb = tbs[g]
    d = st.deps[g][pc[g]]
    if d is not None and pc[d[0]] <= d[1]:
        return f"waits for {step_name(tbs, *d)}", d[0]
    sender = st.conns.sender.get((tb.recv, r, tb.chan))
    if sender is None:
        return (f"waits for a message from rank {tb.recv} on channel {tb.chan}, but no threadblock there sends "
                "on that connection"), None
    if pc[sender] >= len(tbs[sender][1].steps):
        return (f"waits for a message from rank {tb.recv} tb {tbs[sender][1].id} on channel {tb.chan}, "
                "which has finished: receives outnumber sends on this connection"), None
    return f"waits for a message from {step_name(tbs, sender, pc[sender])} (blocked)", sender


def wait_cycles(blocked: list[int], waits_on: dict[int, int]) -> list[list[int]]:
    """The cycles of a wait-for graph in which each node waits on at most one other."""
    state: dict[int, int] = {}
    cycles = []
    for start in blocked:
        path, g = [], start
        while g in waits_on and g not in state:
            state[g] = start
            path.append(g)
            g = waits_on[g]
        if g in state and state[g] == start and g in path:
            cycles.append(path[path.index(g):])
        for h in path:
            state[h] = -1
    return cycles


def leftovers(st: Structure, ex: Execution, max_errors: int) -> Errors:
    """Messages sent and never received."""
    err = Errors(max_errors)
    for (src, dst, chan), q in ex.fifos.items():
        if q:
            _, _, g, s = q[0]
            err_where = step_name(st.tbs, g, s)
            err.add(f"{err_where}: message to rank {dst} on channel {chan} is never received "
                    f"({len(q)} message(s) left on connection {src}->{dst})")
    return err

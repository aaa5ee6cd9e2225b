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
    RCS,
    RE,
    READ_KINDS,
    RRC,
    RRS,
    Errors,
    R,
    S,
    describe,
    fit_count,
    fmt_ranks,
    operand,
    ranks_of,
    step_name,
)
from synth.verification.structure import Structure
from synth.verification.switches import EMPTY_PLAN, SwitchPlan, SwitchRun


@dataclass(frozen=True)
class Execution:
    """Where the run stopped: each threadblock's next step, the messages left on each connection, and the
    executed trace (g, step, sending g or -1, its step or -1) for the race check (None: not recorded). A message
    a switch op sent is traced with sending g ``-2 - op id``; ``switches`` is the switches' run (None without)."""

    errors: Errors
    pc: tuple[int, ...]
    fifos: dict[tuple, deque]
    trace: list[tuple[int, int, int, int]] | None
    switches: SwitchRun | None = None


def execute(program: Program, st: Structure, trace: bool, max_errors: int,
            plan: SwitchPlan = EMPTY_PLAN) -> Execution:
    """Execute on a worklist: each threadblock runs until it blocks, and is woken by what it waits for. ``trace``:
    record the executed steps for the race check (the caller decides, within ``RACE_CHECK_BUDGET``)."""
    ntb = len(st.tbs)
    run = _Machine(st, trace, max_errors)
    if program.switches:
        run.switches = SwitchRun(program, plan, run.fifos, run.err)
        run.num_ranks = program.num_ranks
    work = deque(range(ntb))
    while work:
        run.advance(work.popleft(), work)
    return Execution(run.err, tuple(run.pc), run.fifos, run.trace, run.switches)


class _Machine:
    """The execution pass's mutable state: program counters, connection FIFOs and who waits on what."""

    def __init__(self, st: Structure, trace: bool, max_errors: int) -> None:
        self.err = Errors(max_errors)
        self.tbs, self.steps = st.tbs, st.steps
        self.lengths = [len(tb.steps) for _, tb in st.tbs]
        self.windows: list = [None] * len(st.tbs)   # per threadblock: (first step, its records from there)
        self.pc = [0] * len(st.tbs)
        self.fifos: dict[tuple, deque] = {key: deque() for key in st.conns.sender}
        self.dep_wait: dict[int, dict[int, list]] = {}   # g -> step -> threadblocks waiting for it
        self.conn_wait: dict[tuple, int] = {}
        self.trace: list | None = [] if trace else None
        self.switches: SwitchRun | None = None
        self.num_ranks = 1 << 62   # peers from here on are switches (set by execute when there are any)

    def advance(self, g: int, work: deque) -> None:
        """Run threadblock ``g`` from its pc until it blocks or ends; queue the threadblocks it wakes."""
        err, pc, fifos, trace = self.err, self.pc, self.fifos, self.trace
        dep_wait, conn_wait = self.dep_wait, self.conn_wait
        r, tb = self.tbs[g]
        p = pc[g]
        nsteps = self.lengths[g]
        lo, recs = self.windows[g] or self.steps.window(g, p)
        hi = lo + len(recs)
        rkey = (tb.recv, r, tb.chan)
        skey = (r, tb.send, tb.chan)
        rq = fifos.get(rkey)
        sq = fifos.get(skey)
        to_switch = tb.send >= self.num_ranks
        waiters = dep_wait.get(g)   # step of g -> threadblocks waiting for it (only g's own steps add to it)
        while p < nsteps:
            if p >= hi:     # the next steps' records (ColumnRecords makes them a window at a time)
                lo, recs = self.steps.window(g, p)
                hi = lo + len(recs)
            kind, rcv, snd, cnt, sarr, soff, darr, dwr, doff, dep = recs[p - lo]
            if dep is not None and pc[dep[0]] <= dep[1]:
                dep_wait.setdefault(dep[0], {}).setdefault(dep[1], []).append(g)
                break
            inc = None
            sg = -1
            if rcv:
                if not rq:
                    conn_wait[rkey] = g
                    break
                inc, mcnt, sg, sp = rq.popleft()
                if mcnt != cnt:
                    inc = self.count_mismatch(inc if kind != NOP else None, cnt, mcnt, g, p, sg, sp)
            out = None
            if kind == NOP:
                # a nop, or a step whose errors were reported (its cnt may be far past any buffer): the message
                # keeps the connection's count right (its cnt goes with it) and carries no data
                out = None
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
                if to_switch:
                    self.to_switch(skey, work)
                elif skey in conn_wait:
                    work.append(conn_wait.pop(skey))
            if trace is not None:
                trace.append((g, p, sg, sp if sg >= 0 else -1))
            if waiters and p in waiters:
                work.extend(waiters.pop(p))
            p += 1
            pc[g] = p
        pc[g] = p
        self.windows[g] = (lo, recs) if p < nsteps else None

    def to_switch(self, key: tuple, work: deque) -> None:
        """A message to a switch: the switch takes it; receivers of results it sends are woken."""
        woken: list = []
        self.switches.deliver(key, woken)
        for out in woken:
            if out in self.conn_wait:
                work.append(self.conn_wait.pop(out))

    def count_mismatch(self, inc: tuple, cnt: int, mcnt: int, g: int, p: int, sg: int, sp: int) -> tuple:
        """A receive whose cnt differs from its send's: reported; the message padded or cut to ``cnt``."""
        if sg < 0:   # from a switch op
            sender = self.switches.plan.name(self.switches.program, -2 - sg)
        else:
            sr, stb = self.tbs[sg]
            sender = f"rank {sr} tb {stb.id} step {sp}"
        self.err.add(f"{step_name(self.tbs, g, p)}: receives cnt={cnt} but the matching send, {sender}, "
                     f"has cnt={mcnt}")
        return None if inc is None else fit_count(inc, cnt)   # no data: the receiver pads its own cnt

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
    d = st.steps.dep(g, pc[g])
    if d is not None and pc[d[0]] <= d[1]:
        return f"waits for {step_name(tbs, *d)}", d[0]
    if ex.switches is not None and tb.recv >= ex.switches.program.num_ranks:
        return _switch_wait(st, ex, g)
    sender = st.conns.sender.get((tb.recv, r, tb.chan))
    if sender is None:
        return (f"waits for a message from rank {tb.recv} on channel {tb.chan}, but no threadblock there sends "
                "on that connection"), None
    if pc[sender] >= len(tbs[sender][1].steps):
        return (f"waits for a message from rank {tb.recv} tb {tbs[sender][1].id} on channel {tb.chan}, "
                "which has finished: receives outnumber sends on this connection"), None
    return f"waits for a message from {step_name(tbs, sender, pc[sender])} (blocked)", sender


def _switch_wait(st: Structure, ex: Execution, g: int) -> tuple[str, int | None]:
    """Why threadblock ``g`` waits for a switch: the op it waits for lacks messages (from whom), or none comes."""
    run = ex.switches
    r, tb = st.tbs[g]
    key = (tb.recv, r, tb.chan)
    name = run.program.switches[tb.recv - run.program.num_ranks].name
    ops = run.plan.out_of.get(key, ())
    at = run.emitted.get(key, 0)
    if at >= len(ops):
        return (f"waits for a message from switch {name} on channel {tb.chan}, but no further op of it sends to "
                f"rank {r} there: receives outnumber ops"), None
    op_id = ops[at]
    _, _, op = run.plan.ops[op_id]
    missing = [s for s in op.srcs if s not in run.inputs[op_id]]
    on = next((st.conns.sender[k] for s in missing
               if (k := (s, tb.recv, op.chan)) in st.conns.sender), None)
    return (f"waits for {run.plan.name(run.program, op_id)}, which lacks messages from ranks "
            f"{fmt_ranks(missing)}"), on


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
    run = ex.switches
    for (src, dst, chan), q in ex.fifos.items():
        if q:
            _, _, g, s = q[0]
            if g < 0:   # a switch op's result
                err.add(f"{run.plan.name(run.program, -2 - g)}: its result to rank {dst} on channel {chan} is never "
                        f"received ({len(q)} message(s) left)")
                continue
            err_where = step_name(st.tbs, g, s)
            if run is not None and dst >= run.program.num_ranks:
                err.add(f"{err_where}: message to switch {run.program.switches[dst - run.program.num_ranks].name} "
                        f"on channel {chan} is taken by no op ({len(q)} message(s) more than the ops naming rank "
                        f"{src} as a src there)")
                continue
            err.add(f"{err_where}: message to rank {dst} on channel {chan} is never received "
                    f"({len(q)} message(s) left on connection {src}->{dst})")
    if run is not None:
        err.extend(run.unfired(max_errors))
    return err

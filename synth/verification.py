"""Symbolic verification of a Program: does it compute its collective, and can it deadlock?

Model (MSCCL semantics, see :mod:`synth.program.ir`): each threadblock runs its steps in order; a
step may start once its dependency (``depid``/``deps``, same GPU) has completed. A send never waits
(asynchronous): it appends a snapshot of the data to the FIFO of connection (src rank, send peer,
channel), modelled as unbounded. A receive takes the head of the FIFO of connection (recv peer, this
rank, channel) and must match its ``cnt``. Execution is a worklist over threadblocks (a blocked
threadblock is woken only by the event it waits for), so the cost is linear in the number of steps.

Buffer slots hold the *set of contributions* they combine (SCCL/msccl-tools style symbolic values).
Every postcondition of :mod:`synth.collectives` combines contributions of one input slot, so a value
is encoded as ``(input slot, bitset of origin ranks)``; a reduction of overlapping sets (double
counting) or of different input slots is reported where it happens. At the end every output slot
must hold exactly its postcondition set.

Detected: bad structure (peers, channels, duplicate connections, dependency references, missing
``hasdep``), offsets out of range (after in-place aliasing), reads of slots holding no data, cnt
mismatches, messages never received, receives never matched, deadlock (with a wait-for cycle),
wrong results, and data races: two threadblocks of a rank touching one slot (one writing) with no
chain of program order, dependencies and messages between them (vector clocks over the executed
trace; skipped for programs above ``RACE_CHECK_BUDGET``). The symbolic values follow one legal
interleaving, which is the only one when there is no race.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter

import numpy as np

from synth.collectives import ALL_ORIGINS, Collective, canonical_name
from synth.errors import SynthError
from synth.gcpause import gc_paused
from synth.program.ir import READS_SRC as _READS_SRC
from synth.program.ir import RECEIVES, SENDS, Program, collective_of
from synth.program.ir import WRITES_DST as _WRITES_DST

MAX_ERRORS = 1000

_NOP, _S, _R, _RCS, _RRS, _RRC, _RRCS, _CPY, _RE = range(9)
_KIND = {"nop": _NOP, "s": _S, "r": _R, "rcs": _RCS, "rrs": _RRS, "rrc": _RRC, "rrcs": _RRCS, "cpy": _CPY, "re": _RE}
_READ_KINDS = frozenset({_S, _RRS, _RRC, _RRCS, _CPY, _RE})
_WRITE_KINDS = frozenset({_R, _RCS, _RRC, _RRCS, _CPY, _RE})
# Per step type: (kind, sends, receives, reads its local src, writes its dst).
_TYPE_INFO = {t: (k, t in SENDS, t in RECEIVES, t in _READS_SRC, t in _WRITES_DST) for t, k in _KIND.items()}
_UNKNOWN_TYPE = (_NOP, False, False, False, False)
_STEP_FIELDS = attrgetter("type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps")
# The race check keeps a vector clock per threadblock (cost ~ threadblocks x executed steps, about
# 0.4 s per million on one core): it runs under this budget and is skipped above it.
RACE_CHECK_BUDGET = 6_000_000


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    collective: str
    ranks: int
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "collective": self.collective, "ranks": self.ranks, "errors": list(self.errors)}


def resolve_collective(program: Program, collective: Collective | str | None = None) -> Collective:
    """The collective to check: given explicitly (name or object) or the one the program declares."""
    if collective is None:
        try:
            return collective_of(program)
        except SynthError as exc:
            raise SynthError(f"program {program.name!r}: {exc} (pass the collective explicitly, e.g. -c allreduce)") \
                from None
    if isinstance(collective, Collective):
        if collective.num_ranks != program.num_ranks:
            raise SynthError(f"collective has {collective.num_ranks} ranks but the program has {program.num_ranks}")
        return collective
    return collective_of(program.with_(collective=canonical_name(collective)))


def _ranks_of(bits: int) -> list[int]:
    out, q = [], 0
    while bits:
        if bits & 1:
            out.append(q)
        bits >>= 1
        q += 1
    return out


def _fmt_ranks(ranks: list[int], limit: int = 8) -> str:
    text = ",".join(map(str, ranks[:limit]))
    return f"[{text}{',...' if len(ranks) > limit else ''}]"


def _describe(value) -> str:
    if value is None:
        return "no data"
    slot, bits = value
    return f"input slot {slot} of ranks {_fmt_ranks(_ranks_of(bits))}"


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


class _Errors(list):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.dropped = 0

    def add(self, msg: str) -> None:
        if len(self) < self.limit:
            self.append(msg)
        else:
            self.dropped += 1


class _Verifier:
    """One verification of a program: the steps of :meth:`run`, in order, each adding what it finds to ``err``."""

    def __init__(self, program: Program, coll: Collective, max_errors: int, races: bool = True,
                 keep_input: bool = True) -> None:
        self.p = program
        self.c = coll
        self.races = races
        self.keep_input = keep_input
        self.err = _Errors(max_errors)

    def run(self) -> list[str]:
        """Every check, in order; the error list (capped at ``max_errors``, then one line counting the rest)."""
        with gc_paused():   # one symbolic value per chunk slot and step record, none in a cycle
            self._layout()
            self._precondition()
            self._input_writes()
            if self._structure():
                self._run()
                self._blocked()
                self._leftovers()
                self._race_check()
                self._postcondition()
        errors = list(self.err)
        if self.err.dropped:
            errors.append(f"... and {self.err.dropped} more errors")
        return errors

    # ---- layout -------------------------------------------------------------------------------
    def _layout(self) -> None:
        """Physical buffers per rank; in-place aliasing maps one buffer onto a window of the other."""
        self.layout: list[dict] = []
        self.aliased: set[tuple[int, str]] = set()
        self.phys_names: dict[int, str] = {}
        for gpu in self.p.gpus:
            declared = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}
            views, needed = self._views(gpu.id, declared)
            phys = {b: [None] * needed[b] for b in ("i", "o", "s")}
            for b, arr in phys.items():
                self.phys_names[id(arr)] = b
            writers = {b: [None] * needed[b] for b in phys}
            self.layout.append({buf: (phys[t], writers[t], base, limit) for buf, (t, base, limit) in views.items()})

    def _views(self, r: int, declared: dict[str, int]) -> tuple[dict, dict[str, int]]:
        """Rank ``r``'s buffer views (physical buffer, base, chunks) and the physical buffers' sizes."""
        c = self.c
        needed = {"i": max(declared["i"], c.input_chunks), "o": max(declared["o"], c.output_chunks),
                  "s": declared["s"]}
        views = {}
        for buf in ("i", "o", "s"):
            alias = c.alias(r, buf) if buf != "s" else None
            if alias is None:
                views[buf] = (buf, 0, declared[buf])
            else:
                target, base = alias
                self.aliased.add((r, buf))
                window = c.input_chunks if buf == "i" else c.output_chunks
                views[buf] = (target, base, window)
                needed[target] = max(needed[target], base + window)
        return views, needed

    def _precondition(self) -> None:
        """Fill the inputs, rank by rank (Collective.source_ranks: input slot s of rank r holds (r, s))."""
        c = self.c
        for r in c.source_ranks:
            arr, _, base, limit = self.layout[r]["i"]
            held = min(c.input_chunks, limit)
            arr[base:base + held] = [(s, 1 << r) for s in range(held)]

    # ---- input buffer -------------------------------------------------------------------------
    def _input_writes(self) -> None:
        """An out-of-place program must leave ``i`` intact: NCCL declares ``sendbuff`` const and callers
        reuse it (issue 32; docs/programs.md, "Input buffer"). One error names the first offending step."""
        if self.c.inplace or not self.keep_input:
            return
        bad = [(gpu.id, tb.id, s, st) for gpu in self.p.gpus for tb in gpu.threadblocks
               for s, st in enumerate(tb.steps) if st.dstbuf == "i" and st.type in _WRITES_DST]
        if not bad:
            return
        r, tb, s, st = bad[0]
        more = f" ({len(bad) - 1} more steps write it too)" if len(bad) > 1 else ""
        self.err.add(f"rank {r} tb {tb} step {s} ({st.type}): writes input buffer i[{st.dstoff}:{st.dstoff + st.cnt}] "
                     f"of an out-of-place program, whose input must stay intact (NCCL's sendbuff is const){more}")

    # ---- structure ----------------------------------------------------------------------------
    def _structure(self) -> bool:
        """Index threadblocks and connections and compile every step; False where the gpu ids are not 0..N-1."""
        n = self.p.num_ranks
        if [g.id for g in self.p.gpus] != list(range(n)):
            self.err.add(f"program has num_ranks={n} but gpu ids {[g.id for g in self.p.gpus]}")
            return False
        self._index_threadblocks()
        self._connections()
        depended = self._compile_steps()
        self._check_hasdep(depended)
        return True

    def _index_threadblocks(self) -> None:
        """Number threadblocks globally (``tbs``, ``gindex``); a duplicate id on a rank is dropped."""
        self.tbs = []          # global index -> (rank, Threadblock)
        self.gindex = {}       # (rank, tb id) -> global index
        for gpu in self.p.gpus:
            for tb in gpu.threadblocks:
                if (gpu.id, tb.id) in self.gindex:
                    self.err.add(f"rank {gpu.id} tb {tb.id}: duplicate threadblock id")
                    continue
                self.gindex[(gpu.id, tb.id)] = len(self.tbs)
                self.tbs.append((gpu.id, tb))

    def _connections(self) -> None:
        """The sending and receiving threadblock of every connection (src, dst, channel); bad peers flagged."""
        n, err = self.p.num_ranks, self.err
        self.sender: dict[tuple, int] = {}
        self.receiver: dict[tuple, int] = {}
        self.send_ok, self.recv_ok = [], []
        for g, (r, tb) in enumerate(self.tbs):
            where = f"rank {r} tb {tb.id}"
            ok_peer = {}
            for peer, role, table, key in ((tb.send, "send", self.sender, (r, tb.send, tb.chan)),
                                           (tb.recv, "recv", self.receiver, (tb.recv, r, tb.chan))):
                good = 0 <= peer < n and peer != r and tb.chan >= 0
                if peer != -1 and not good:
                    err.add(f"{where}: {role} peer {peer} is not another rank (0..{n - 1}, not {r}) "
                            f"or channel {tb.chan} is negative")
                if good:
                    if key in table:
                        other = self.tbs[table[key]][1].id
                        err.add(f"{where}: connection {key[0]}->{key[1]} channel {tb.chan} is already used for "
                                f"{role} by tb {other} (one threadblock per channel, peer and direction)")
                    else:
                        table[key] = g
                ok_peer[role] = good
            self.send_ok.append(ok_peer["send"])
            self.recv_ok.append(ok_peer["recv"])

    def _compile_steps(self) -> dict[tuple[int, int], tuple[int, int]]:
        """Check every step's operands and dependency and compile it into a record for :meth:`_run`.

        One pass per step with everything hoisted: the step's fields come out in one C-level attrgetter
        call, the type's properties in one dict lookup, and the full check runs in :meth:`_step_problems`
        only when the fast range test fails. Returns the depended-on steps: (tb, step) -> first dependent."""
        err, tbs = self.err, self.tbs
        self.deps: list[list] = []
        self.records: list[list[tuple]] = []
        depended: dict[tuple[int, int], tuple[int, int]] = {}
        lengths = [len(tb.steps) for _, tb in tbs]
        tb_index: list[dict[int, int]] = [{} for _ in range(self.p.num_ranks)]  # per rank: tb id -> global index
        for (rank, tb_id), g in self.gindex.items():
            tb_index[rank][tb_id] = g
        for g, (r, tb) in enumerate(tbs):
            get_view = self.layout[r].get
            local = tb_index[r]
            dl, recs = [], []
            can_send, can_recv = self.send_ok[g], self.recv_ok[g]
            for s, (t, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, deps) in enumerate(map(_STEP_FIELDS, tb.steps)):
                info = _TYPE_INFO.get(t)
                if info is None:
                    err.add(f"rank {r} tb {tb.id} step {s}: unknown step type {t!r} (expected one of "
                            f"{', '.join(_KIND)})")
                    info = _UNKNOWN_TYPE
                kind, is_send, is_recv, reads, writes = info
                sv = get_view(srcbuf)
                dv = get_view(dstbuf)
                ok = kind != _NOP
                problems = None
                if ok and (cnt < 1 or (is_send and not can_send) or (is_recv and not can_recv)
                           or (reads and (sv is None or srcoff < 0 or srcoff + cnt > sv[3]))
                           or (writes and (dv is None or dstoff < 0 or dstoff + cnt > dv[3]))):
                    ok, problems = self._step_problems(r, tb, tb.steps[s])
                dep = None
                if depid != -1:  # the runtimes ignore deps when depid is -1
                    target = local.get(depid)
                    if target is None or not 0 <= deps < lengths[target]:
                        problems = (problems or []) + [f"depends on tb {depid} step {deps}, which does not "
                                                       f"exist on rank {r}"]
                    else:
                        dep = (target, deps)
                        if dep not in depended:
                            depended[dep] = (tb.id, s)
                if problems:
                    for problem in problems:
                        err.add(f"rank {r} tb {tb.id} step {s} ({t}): {problem}")
                recs.append((kind if ok else _NOP, can_recv and is_recv, can_send and is_send,
                             cnt if cnt > 0 else 0,
                             sv[0] if sv else None, sv[2] + srcoff if sv else 0,
                             dv[0] if dv else None, dv[1] if dv else None, dv[2] + dstoff if dv else 0, dep))
                dl.append(dep)
            self.deps.append(dl)
            self.records.append(recs)
        return depended

    def _check_hasdep(self, depended: dict[tuple[int, int], tuple[int, int]]) -> None:
        """A depended-on step must set ``hasdep``, else the runtime never signals its dependents."""
        for (target, s), (tb_id, s2) in depended.items():
            r, ttb = self.tbs[target]
            if not ttb.steps[s].hasdep:
                self.err.add(f"rank {r} tb {ttb.id} step {s} ({ttb.steps[s].type}): tb {tb_id} step {s2} depends on "
                             f"it but it has hasdep=0, so the runtime never signals it")

    def _step_problems(self, r: int, tb, st) -> tuple[bool, list[str]]:
        """Why a step is malformed (slow path of _compile_steps); ok=False means its data effect is skipped."""
        t, views = st.type, self.layout[r]
        ok, problems = True, []
        if st.cnt < 1:
            problems.append(f"cnt={st.cnt} must be at least 1")
            ok = False
        if t in SENDS and tb.send == -1:
            problems.append("sends but the threadblock has no send peer")
        if t in RECEIVES and tb.recv == -1:
            problems.append("receives but the threadblock has no recv peer")
        for used, buf, off, name in ((t in _READS_SRC, st.srcbuf, st.srcoff, "src"),
                                     (t in _WRITES_DST, st.dstbuf, st.dstoff, "dst")):
            if not used:
                continue
            if buf not in views:
                problems.append(f"{name} buffer {buf!r} is not i, o or s")
                ok = False
            elif off < 0 or off + max(st.cnt, 1) > views[buf][3]:
                note = " after in-place aliasing" if (r, buf) in self.aliased else ""
                problems.append(f"{name} {buf}[{off}:{off + st.cnt}] is out of range (buffer "
                                f"{buf} has {views[buf][3]} chunks on rank {r}{note})")
                ok = False
        return ok, problems

    # ---- execution ----------------------------------------------------------------------------
    def _run(self) -> None:
        """Execute on a worklist: each threadblock runs until it blocks, and is woken by what it waits for."""
        ntb = len(self.tbs)
        self.pc = [0] * ntb
        self.fifos: dict[tuple, deque] = {key: deque() for key in self.sender}
        self.dep_wait: dict[tuple, list] = {}
        self.conn_wait: dict[tuple, int] = {}
        small = ntb * self.p.num_steps() <= RACE_CHECK_BUDGET
        self.trace = [] if self.races and small else None
        work = deque(range(ntb))
        while work:
            self._advance(work.popleft(), work)

    def _advance(self, g: int, work: deque) -> None:
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
                    inc = self._count_mismatch(inc, cnt, mcnt, g, p, sg, sp)
            out = None
            if kind == _NOP:
                if snd:
                    out = (None,) * cnt  # keep the connection's message count right
            else:
                if kind in _READ_KINDS:
                    src = sarr[soff:soff + cnt]
                    if None in src:
                        err.add(f"{self._step_name(g, p)}: reads {self._operand(g, p, 'src')}, which holds no data")
                if kind == _S:
                    out = tuple(src)
                elif kind == _R or kind == _RCS:
                    if inc is None:
                        inc = (None,) * cnt
                    darr[doff:doff + cnt] = inc
                    dwr[doff:doff + cnt] = ((g, p),) * cnt
                    out = inc
                elif kind == _CPY:
                    darr[doff:doff + cnt] = src
                    dwr[doff:doff + cnt] = ((g, p),) * cnt
                else:  # reductions: rrs, rrc, rrcs (incoming + local src) and re (dst + src)
                    res = self._combine(kind, inc, src, darr, doff, cnt, g, p)
                    if kind != _RRS:
                        darr[doff:doff + cnt] = res
                        dwr[doff:doff + cnt] = ((g, p),) * cnt
                    if kind != _RRC and kind != _RE:
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

    def _count_mismatch(self, inc: tuple, cnt: int, mcnt: int, g: int, p: int, sg: int, sp: int) -> tuple:
        """A receive whose cnt differs from its send's: reported; the message padded or cut to ``cnt``."""
        sr, stb = self.tbs[sg]
        self.err.add(f"{self._step_name(g, p)}: receives cnt={cnt} but the matching send, rank {sr} tb {stb.id} "
                     f"step {sp}, has cnt={mcnt}")
        return (inc + (None,) * cnt)[:cnt]

    def _combine(self, kind: int, inc, src: list, darr: list, doff: int, cnt: int, g: int, p: int) -> list:
        """The values a reduction step computes: incoming (``re``: its dst) plus its local src, chunk by chunk."""
        if kind == _RE:
            other = darr[doff:doff + cnt]
            if None in other:
                self.err.add(f"{self._step_name(g, p)}: reduces into {self._operand(g, p, 'dst')}, "
                             "which holds no data")
        else:
            other = inc if inc is not None else (None,) * cnt
        res = []
        for k in range(cnt):
            x, y = other[k], src[k]
            if x is not None and y is not None and x[0] == y[0] and not x[1] & y[1]:
                res.append((x[0], x[1] | y[1]))
            else:
                res.append(self._reduce(x, y, g, p, k))
        return res

    def _reduce(self, a, b, g: int, p: int, k: int):
        """Slow path of a reduction: one operand missing, different input slots, or double counting."""
        if a is None or b is None:
            return a if b is None else b
        where = self._step_name(g, p)
        if a[0] != b[0]:
            self.err.add(f"{where}: chunk {k} reduces {_describe(a)} with {_describe(b)} (different input slots)")
            return a
        self.err.add(f"{where}: chunk {k} double counts ranks {_fmt_ranks(_ranks_of(a[1] & b[1]))} of input "
                     f"slot {a[0]} ({_describe(a)} + {_describe(b)})")
        return (a[0], a[1] | b[1])

    def _operand(self, g: int, p: int, which: str) -> str:
        """Step (g, p)'s ``src`` or ``dst`` operand as ``buf[a:b]``."""
        st = self.tbs[g][1].steps[p]
        buf, off = (st.srcbuf, st.srcoff) if which == "src" else (st.dstbuf, st.dstoff)
        return f"{buf}[{off}:{off + st.cnt}]"

    def _step_name(self, g: int, s: int) -> str:
        """How errors name step ``s`` of global threadblock ``g``."""
        r, tb = self.tbs[g]
        return f"rank {r} tb {tb.id} step {s} ({tb.steps[s].type})"

    # ---- after execution ----------------------------------------------------------------------
    def _blocked(self) -> None:
        """Threadblocks that never finished: why each waits, and the wait-for cycles among them (deadlock)."""
        pc = self.pc
        blocked = [g for g, (_, tb) in enumerate(self.tbs) if pc[g] < len(tb.steps)]
        if not blocked:
            return
        waits_on: dict[int, int] = {}
        reasons: dict[int, str] = {}
        for g in blocked:
            reasons[g], on = self._wait_reason(g)
            if on is not None:
                waits_on[g] = on
        for cyc in _wait_cycles(blocked, waits_on)[:5]:
            chain = " -> ".join(self._step_name(g, pc[g]) for g in cyc + [cyc[0]])
            self.err.add(f"deadlock: wait cycle {chain}")
        for g in blocked:
            self.err.add(f"{self._step_name(g, pc[g])}: never runs ({len(blocked)} threadblocks blocked): {reasons[g]}")

    def _wait_reason(self, g: int) -> tuple[str, int | None]:
        """Why blocked threadblock ``g`` waits, and the threadblock it waits on (None: nothing will come)."""
        pc = self.pc
        r, tb = self.tbs[g]
        d = self.deps[g][pc[g]]
        if d is not None and pc[d[0]] <= d[1]:
            return f"waits for {self._step_name(*d)}", d[0]
        sender = self.sender.get((tb.recv, r, tb.chan))
        if sender is None:
            return (f"waits for a message from rank {tb.recv} on channel {tb.chan}, but no threadblock there sends "
                    "on that connection"), None
        if pc[sender] >= len(self.tbs[sender][1].steps):
            return (f"waits for a message from rank {tb.recv} tb {self.tbs[sender][1].id} on channel {tb.chan}, "
                    "which has finished: receives outnumber sends on this connection"), None
        return f"waits for a message from {self._step_name(sender, pc[sender])} (blocked)", sender

    def _leftovers(self) -> None:
        """Messages sent and never received."""
        for (src, dst, chan), q in self.fifos.items():
            if q:
                _, _, g, s = q[0]
                err_where = self._step_name(g, s)
                self.err.add(f"{err_where}: message to rank {dst} on channel {chan} is never received "
                             f"({len(q)} message(s) left on connection {src}->{dst})")

    def _race_check(self) -> None:
        """Data races on the executed trace: two threadblocks of one rank touch a slot (one writes)
        and no chain of program order, dependencies and messages orders them (vector clocks)."""
        ntb = len(self.tbs)
        if not self.trace or ntb * len(self.trace) > RACE_CHECK_BUDGET:
            return
        # numpy clocks: each join is ntb wide (512 threadblocks on an 8x8 torus ring); a Python map is ~20x slower
        vc = [np.zeros(ntb, dtype=np.int32) for _ in range(ntb)]
        need = {d for dl in self.deps for d in dl if d is not None}
        snaps: dict[tuple[int, int], np.ndarray] = {}
        last_write: dict[tuple[int, int], tuple[int, int]] = {}
        reads: dict[tuple[int, int], list] = {}
        reported: set[tuple[int, int]] = set()

        def race(g1: int, p1: int, g2: int, p2: int, what: str, key) -> None:
            pair = (min(g1, g2), max(g1, g2))
            if pair in reported:
                return
            reported.add(pair)
            self.err.add(f"{self._step_name(g2, p2)}: race: {what} {self.phys_names[key[0]]}[{key[1]}] (physical "
                         f"buffer) concurrently with {self._step_name(g1, p1)}; no dependency orders them")

        for g, p, sg, sp in self.trace:
            v = vc[g]
            dep = self.deps[g][p]
            if dep is not None:
                np.maximum(v, snaps[dep], out=v)
            if sg >= 0:
                np.maximum(v, snaps[(sg, sp)], out=v)
            v[g] = p + 1
            kind, _, snd, cnt, sarr, soff, darr, _, doff, _ = self.records[g][p]
            if kind != _NOP:
                if kind in _READ_KINDS or kind == _RE:
                    spans = [(sarr, soff)] if kind in _READ_KINDS else []
                    if kind == _RE:
                        spans.append((darr, doff))
                    for arr, off in spans:
                        for i in range(off, off + cnt):
                            key = (id(arr), i)
                            w = last_write.get(key)
                            if w is not None and w[0] != g and v[w[0]] <= w[1]:
                                race(w[0], w[1], g, p, "reads", key)
                            reads.setdefault(key, []).append((g, p))
                if kind in _WRITE_KINDS:
                    for i in range(doff, doff + cnt):
                        key = (id(darr), i)
                        w = last_write.get(key)
                        if w is not None and w[0] != g and v[w[0]] <= w[1]:
                            race(w[0], w[1], g, p, "writes", key)
                        for rg, rp in reads.pop(key, ()):
                            if rg != g and v[rg] <= rp:
                                race(rg, rp, g, p, "writes", key)
                        last_write[key] = (g, p)
            if snd or (g, p) in need:
                snaps[(g, p)] = v.copy()

    def _postcondition(self) -> None:
        """Every output slot the collective names must hold exactly its postcondition value."""
        c = self.c
        for (r, slot), expected in iter_expected_values(c):
            arr, wr, base, limit = self.layout[r]["o"]
            if slot >= limit:
                self.err.add(f"rank {r}: output buffer has {limit} chunks but {c.name} needs output slot {slot}")
                continue
            actual = arr[base + slot]
            if actual == expected:
                continue
            writer = wr[base + slot]
            by = f"last written by {self._step_name(*writer)}" if writer else "never written by any step"
            want = _describe(expected)
            detail = ""
            if actual is not None and actual[0] == expected[0]:
                missing = _ranks_of(expected[1] & ~actual[1])
                extra = _ranks_of(actual[1] & ~expected[1])
                detail = f" (missing ranks {_fmt_ranks(missing)}, extra ranks {_fmt_ranks(extra)})"
            self.err.add(f"rank {r} output slot {slot}: holds {_describe(actual)}, expected {want}{detail}; {by}")


def _wait_cycles(blocked: list[int], waits_on: dict[int, int]) -> list[list[int]]:
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


def verify(program: Program, collective: Collective | str | None = None, max_errors: int = MAX_ERRORS,
           races: bool = True, msccl_limits: bool = False, keep_input: bool = True,
           runtime: str | None = None) -> VerifyResult:
    """Check that ``program`` implements ``collective`` (default: the one it declares) and cannot deadlock.

    Also checks the structure the MSCCL runtimes' loaders require (dense threadblock ids, channels, ...;
    :func:`synth.program.msccl_xml.runtime_limit_errors`) and, with ``msccl_limits`` (an XML program), their
    capacity limits too. A program that breaks them is reported without being executed, since the runtimes
    would not load it and its sizes may be unusable. An out-of-place program that writes its input buffer is
    an error unless ``keep_input`` is false (docs/programs.md, "Input buffer"). ``runtime`` (``msccl-executor``
    or ``msccl``) holds it to that runtime's limits and collectives (implies ``msccl_limits``). Raises
    SynthError only when the collective itself is unknown or inconsistent with the program.
    """
    from synth.program.msccl_xml import runtime_limit_errors

    coll = resolve_collective(program, collective)
    limits = runtime_limit_errors(program, msccl=msccl_limits or runtime is not None, runtime=runtime)
    errors = [f"runtime limit: {e}" for e in islice(limits, max_errors)]
    if errors:
        return VerifyResult(ok=False, collective=coll.name, ranks=program.num_ranks, errors=errors)
    errors = _Verifier(program, coll, max_errors, races, keep_input).run()
    return VerifyResult(ok=not errors, collective=coll.name, ranks=program.num_ranks, errors=errors)

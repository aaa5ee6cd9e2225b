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
mismatches, messages never received, receives never matched, deadlock (with a wait-for cycle) and
wrong results. Not modelled: data races between threadblocks that lack dependency ordering (the
verifier follows one legal interleaving).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from synth.collectives import Collective, canonical_name
from synth.errors import SynthError
from synth.program.ir import RECEIVES, SENDS, Program, collective_of

MAX_ERRORS = 1000

# Which local operands each step type reads / writes (src is the LOCAL operand of rrs/rrc/rrcs).
_READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
_WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})


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
        return collective_of(program)
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
    def __init__(self, program: Program, coll: Collective, max_errors: int) -> None:
        self.p = program
        self.c = coll
        self.err = _Errors(max_errors)

    # ---- layout -------------------------------------------------------------------------------
    def _layout(self) -> None:
        """Physical buffers per rank; in-place aliasing maps one buffer onto a window of the other."""
        c = self.c
        self.layout: list[dict] = []
        self.aliased: set[tuple[int, str]] = set()
        for gpu in self.p.gpus:
            r = gpu.id
            declared = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}
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
            phys = {b: [None] * needed[b] for b in ("i", "o", "s")}
            writers = {b: [None] * needed[b] for b in phys}
            self.layout.append({buf: (phys[t], writers[t], base, limit) for buf, (t, base, limit) in views.items()})
        for (r, s), contribution in c.precondition.items():
            origin, slot = c.split_contribution(contribution)
            arr, _, base, limit = self.layout[r]["i"]
            if s < limit:
                arr[base + s] = (slot, 1 << origin)

    # ---- structure ----------------------------------------------------------------------------
    def _structure(self) -> bool:
        p, err = self.p, self.err
        n = p.num_ranks
        if [g.id for g in p.gpus] != list(range(n)):
            err.add(f"program has num_ranks={n} but gpu ids {[g.id for g in p.gpus]}")
            return False
        self.tbs = []          # global index -> (rank, Threadblock)
        self.gindex = {}       # (rank, tb id) -> global index
        for gpu in p.gpus:
            for tb in gpu.threadblocks:
                if (gpu.id, tb.id) in self.gindex:
                    err.add(f"rank {gpu.id} tb {tb.id}: duplicate threadblock id")
                    continue
                self.gindex[(gpu.id, tb.id)] = len(self.tbs)
                self.tbs.append((gpu.id, tb))
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
        # per-step operand checks and dependency resolution
        self.deps: list[list] = []
        self.operands_ok: list[list[bool]] = []
        depended = {}
        for r, tb in self.tbs:
            views = self.layout[r]
            dl, okl = [], []
            for s, st in enumerate(tb.steps):
                where = f"rank {r} tb {tb.id} step {s} ({st.type})"
                ok = True
                if st.type != "nop":
                    if st.cnt < 1:
                        err.add(f"{where}: cnt={st.cnt} must be at least 1")
                        ok = False
                    if st.type in SENDS and tb.send == -1:
                        err.add(f"{where}: sends but the threadblock has no send peer")
                    if st.type in RECEIVES and tb.recv == -1:
                        err.add(f"{where}: receives but the threadblock has no recv peer")
                    for used, buf, off, name in ((st.type in _READS_SRC, st.srcbuf, st.srcoff, "src"),
                                                 (st.type in _WRITES_DST, st.dstbuf, st.dstoff, "dst")):
                        if not used:
                            continue
                        limit = views[buf][3] if buf in views else -1
                        if limit < 0:
                            err.add(f"{where}: {name} buffer {buf!r} is not i, o or s")
                            ok = False
                        elif off < 0 or off + max(st.cnt, 1) > limit:
                            note = " after in-place aliasing" if (r, buf) in self.aliased else ""
                            err.add(f"{where}: {name} {buf}[{off}:{off + st.cnt}] is out of range (buffer "
                                    f"{buf} has {limit} chunks on rank {r}{note})")
                            ok = False
                dep = None
                if st.depid != -1 or st.deps != -1:
                    target = self.gindex.get((r, st.depid))
                    if st.depid == -1:
                        pass  # the runtimes ignore deps when depid is -1
                    elif target is None or not 0 <= st.deps < len(self.tbs[target][1].steps):
                        err.add(f"{where}: depends on tb {st.depid} step {st.deps}, which does not exist on rank {r}")
                    else:
                        dep = (target, st.deps)
                        depended.setdefault(dep, (tb.id, s))
                dl.append(dep)
                okl.append(ok)
            self.deps.append(dl)
            self.operands_ok.append(okl)
        for (target, s), (tb_id, s2) in depended.items():
            r, ttb = self.tbs[target]
            if not ttb.steps[s].hasdep:
                err.add(f"rank {r} tb {ttb.id} step {s} ({ttb.steps[s].type}): tb {tb_id} step {s2} depends on it "
                        f"but it has hasdep=0, so the runtime never signals it")
        return True

    # ---- execution ----------------------------------------------------------------------------
    def _reduce(self, a, b, where: str, k: int, reported: list):
        if a is None or b is None:
            return a if b is None else b
        if a[0] != b[0]:
            if not reported:
                reported.append(1)
                self.err.add(f"{where}: chunk {k} reduces {_describe(a)} with {_describe(b)} (different input slots)")
            return a
        if a[1] & b[1]:
            if not reported:
                reported.append(1)
                self.err.add(f"{where}: chunk {k} double counts ranks {_fmt_ranks(_ranks_of(a[1] & b[1]))} of input "
                             f"slot {a[0]} ({_describe(a)} + {_describe(b)})")
        return (a[0], a[1] | b[1])

    def _run(self) -> None:
        err = self.err
        ntb = len(self.tbs)
        pc = [0] * ntb
        self.pc = pc
        fifos: dict[tuple, deque] = {}
        self.fifos = fifos
        dep_wait: dict[tuple, list] = {}
        conn_wait: dict[tuple, int] = {}
        work = deque(range(ntb))
        layout = self.layout
        while work:
            g = work.popleft()
            r, tb = self.tbs[g]
            steps = tb.steps
            p = pc[g]
            nsteps = len(steps)
            deps = self.deps[g]
            views = layout[r]
            can_recv = self.recv_ok[g]
            can_send = self.send_ok[g]
            rkey = (tb.recv, r, tb.chan)
            skey = (r, tb.send, tb.chan)
            while p < nsteps:
                st = steps[p]
                d = deps[p]
                if d is not None and pc[d[0]] <= d[1]:
                    dep_wait.setdefault(d, []).append(g)
                    break
                t = st.type
                cnt = st.cnt if st.cnt > 0 else 0
                where = None
                incoming = None
                if t in RECEIVES and can_recv:
                    q = fifos.get(rkey)
                    if not q:
                        conn_wait[rkey] = g
                        break
                    values, mcnt, src_r, src_tb, src_s = q.popleft()
                    if mcnt != st.cnt:
                        where = f"rank {r} tb {tb.id} step {p} ({t})"
                        err.add(f"{where}: receives cnt={st.cnt} but the matching send, rank {src_r} tb {src_tb} "
                                f"step {src_s}, has cnt={mcnt}")
                    incoming = (list(values) + [None] * cnt)[:cnt]
                out = None
                if t != "nop" and self.operands_ok[g][p]:
                    if where is None:
                        where = f"rank {r} tb {tb.id} step {p} ({t})"
                    src = None
                    if t in _READS_SRC:
                        arr, _, base, _ = views[st.srcbuf]
                        o = base + st.srcoff
                        src = arr[o:o + cnt]
                        if any(v is None for v in src):
                            err.add(f"{where}: reads {st.srcbuf}[{st.srcoff}:{st.srcoff + cnt}], which holds no data")
                    if incoming is None and t in RECEIVES:
                        incoming = [None] * cnt  # no recv peer (already reported)
                    reported: list = []
                    if t == "s":
                        out = src
                    elif t == "r" or t == "rcs":
                        result = incoming
                        out = incoming
                    elif t == "cpy":
                        result = src
                    elif t == "re":
                        arr, _, base, _ = views[st.dstbuf]
                        o = base + st.dstoff
                        cur = arr[o:o + cnt]
                        if any(v is None for v in cur):
                            err.add(f"{where}: reduces into {st.dstbuf}[{st.dstoff}:{st.dstoff + cnt}], which holds "
                                    "no data")
                        result = [self._reduce(cur[k], src[k], where, k, reported) for k in range(cnt)]
                    else:  # rrs, rrc, rrcs
                        result = [self._reduce(incoming[k], src[k], where, k, reported) for k in range(cnt)]
                        if t != "rrc":
                            out = result
                    if t in _WRITES_DST:
                        arr, wr, base, _ = views[st.dstbuf]
                        o = base + st.dstoff
                        arr[o:o + cnt] = result
                        wr[o:o + cnt] = [(g, p)] * cnt
                elif t in SENDS:
                    out = [None] * cnt  # keep the connection's message count right
                if t in SENDS and can_send:
                    fifos.setdefault(skey, deque()).append((tuple(out), st.cnt, r, tb.id, p))
                    w = conn_wait.pop(skey, None)
                    if w is not None:
                        work.append(w)
                p += 1
                pc[g] = p
                w = dep_wait.pop((g, p - 1), None)
                if w:
                    work.extend(w)
            pc[g] = p
        self.dep_wait = dep_wait
        self.conn_wait = conn_wait

    # ---- after execution ----------------------------------------------------------------------
    def _step_name(self, g: int, s: int) -> str:
        r, tb = self.tbs[g]
        return f"rank {r} tb {tb.id} step {s} ({tb.steps[s].type})"

    def _blocked(self) -> None:
        err, pc = self.err, self.pc
        blocked = [g for g, (_, tb) in enumerate(self.tbs) if pc[g] < len(tb.steps)]
        if not blocked:
            return
        waits_on: dict[int, int] = {}
        reasons: dict[int, str] = {}
        for g in blocked:
            r, tb = self.tbs[g]
            s = pc[g]
            d = self.deps[g][s]
            if d is not None and pc[d[0]] <= d[1]:
                waits_on[g] = d[0]
                reasons[g] = f"waits for {self._step_name(*d)}"
                continue
            key = (tb.recv, r, tb.chan)
            sender = self.sender.get(key)
            if sender is None:
                reasons[g] = f"waits for a message from rank {tb.recv} on channel {tb.chan}, but no threadblock " \
                             "there sends on that connection"
            elif pc[sender] >= len(self.tbs[sender][1].steps):
                reasons[g] = (f"waits for a message from rank {tb.recv} tb {self.tbs[sender][1].id} on channel "
                              f"{tb.chan}, which has finished: receives outnumber sends on this connection")
            else:
                waits_on[g] = sender
                reasons[g] = f"waits for a message from {self._step_name(sender, pc[sender])} (blocked)"
        # cycles in the wait-for graph (each blocked threadblock waits on at most one other)
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
        for cyc in cycles[:5]:
            chain = " -> ".join(self._step_name(g, pc[g]) for g in cyc + [cyc[0]])
            err.add(f"deadlock: wait cycle {chain}")
        for g in blocked:
            err.add(f"{self._step_name(g, pc[g])}: never runs ({len(blocked)} threadblocks blocked): {reasons[g]}")

    def _leftovers(self) -> None:
        for (src, dst, chan), q in self.fifos.items():
            if q:
                _, cnt, r, tb_id, s = q[0]
                g = self.gindex[(r, tb_id)]
                err_where = self._step_name(g, s)
                self.err.add(f"{err_where}: message to rank {dst} on channel {chan} is never received "
                             f"({len(q)} message(s) left on connection {src}->{dst})")

    def _postcondition(self) -> None:
        c = self.c
        for (r, slot), contribs in c.postcondition.items():
            splits = {c.split_contribution(x) for x in contribs}
            islots = {s for _, s in splits}
            bits = 0
            for origin, _ in splits:
                bits |= 1 << origin
            expected = (next(iter(islots)), bits) if len(islots) == 1 else None
            arr, wr, base, limit = self.layout[r]["o"]
            if slot >= limit:
                self.err.add(f"rank {r}: output buffer has {limit} chunks but {c.name} needs output slot {slot}")
                continue
            actual = arr[base + slot]
            if actual == expected and expected is not None:
                continue
            writer = wr[base + slot]
            by = f"last written by {self._step_name(*writer)}" if writer else "never written"
            want = _describe(expected) if expected else f"contributions {sorted(contribs)}"
            detail = ""
            if actual is not None and expected is not None and actual[0] == expected[0]:
                missing = _ranks_of(expected[1] & ~actual[1])
                extra = _ranks_of(actual[1] & ~expected[1])
                detail = f" (missing ranks {_fmt_ranks(missing)}, extra ranks {_fmt_ranks(extra)})"
            self.err.add(f"rank {r} output slot {slot}: holds {_describe(actual)}, expected {want}{detail}; {by}")

    def run(self) -> list[str]:
        self._layout()
        if self._structure():
            self._run()
            self._blocked()
            self._leftovers()
            self._postcondition()
        errors = list(self.err)
        if self.err.dropped:
            errors.append(f"... and {self.err.dropped} more errors")
        return errors


def verify(program: Program, collective: Collective | str | None = None, max_errors: int = MAX_ERRORS) -> VerifyResult:
    """Check that ``program`` implements ``collective`` (default: the one it declares) and cannot deadlock.

    Raises SynthError only when the collective itself is unknown or inconsistent with the program.
    """
    coll = resolve_collective(program, collective)
    errors = _Verifier(program, coll, max_errors).run()
    return VerifyResult(ok=not errors, collective=coll.name, ranks=program.num_ranks, errors=errors)

"""Verification of in-network steps (a program's ``switches``, docs/programs.md "Switch steps"): their structure
before the run, and the switches' part of the symbolic run.

Structure: every op well formed (type, member ranks, cnt, chan); where the fabric is known (``-t``, or the
topology a JSON program embeds), each switch is one of its switches, declares the op types it is given
(``reduce``/``multicast``), and has a link from every src and to every dst; the messages a rank sends to a switch
on a channel number the ops naming it as a src there, and its receives the ops naming it as a dst.

Semantics: on connection (rank, switch, chan) the k-th message goes to the k-th op (in list order) with that
rank among its srcs on that channel; an op runs once it has a message from every src: a ``reduce`` sums them
chunk by chunk (the contributions of exactly its srcs: disjoint origin sets of one input slot), a
``multicast`` copies its one message; the result goes to every dst, on connection (switch, dst, chan) in op
order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from synth.program.ir import RECEIVES, SENDS, Program, SwitchOp, switch_op_problem
from synth.topology.model import Topology
from synth.verification.common import Errors, describe, fit_count, fmt_ranks, ranks_of


@dataclass(frozen=True)
class SwitchPlan:
    """The switches' connections: per (rank, peer, chan) into a switch, the global op ids its messages go to,
    in order; per (peer, rank, chan) out of one, the op ids whose results it carries, in order. ``ops[i]`` is
    (switch index, op index in that switch, the op)."""

    ops: tuple[tuple[int, int, SwitchOp], ...]
    into: dict[tuple[int, int, int], tuple[int, ...]]
    out_of: dict[tuple[int, int, int], tuple[int, ...]]

    def name(self, program: Program, op_id: int) -> str:
        k, j, op = self.ops[op_id]
        return f"switch {program.switches[k].name} op {j} ({op.type})"


EMPTY_PLAN = SwitchPlan((), {}, {})


def switch_plan(program: Program) -> SwitchPlan:
    """Number the ops of every switch and list, per connection, the ops its messages go to or come from."""
    if not program.switches:
        return EMPTY_PLAN
    n = program.num_ranks
    ops, into, out_of = [], {}, {}
    for k, sw in enumerate(program.switches):
        for j, op in enumerate(sw.ops):
            op_id = len(ops)
            ops.append((k, j, op))
            for src in op.srcs:
                into.setdefault((src, n + k, op.chan), []).append(op_id)
            for dst in op.dsts:
                out_of.setdefault((n + k, dst, op.chan), []).append(op_id)
    return SwitchPlan(tuple(ops), {key: tuple(v) for key, v in into.items()},
                      {key: tuple(v) for key, v in out_of.items()})


def switch_structure(program: Program, tbs: tuple, topology: Topology | None, max_errors: int) -> Errors:
    """The structural checks of the module docstring, one line each."""
    err = Errors(max_errors)
    if not program.switches:
        return err
    n = program.num_ranks
    names = [sw.name for sw in program.switches]
    for name in sorted({x for x in names if names.count(x) > 1}):
        err.add(f"switch {name}: named twice in the program's switches")
    for k, sw in enumerate(program.switches):
        for j, op in enumerate(sw.ops):
            problem = switch_op_problem(op, n)
            if problem:
                err.add(f"switch {sw.name} op {j}: {problem}")
        if topology is not None:
            _fabric_checks(program, k, topology, err)
    plan = switch_plan(program)
    sends: dict[tuple, int] = {}
    recvs: dict[tuple, int] = {}
    for r, tb in tbs:
        for st in tb.steps:
            if st.type in SENDS and tb.send >= n:
                key = (r, tb.send, tb.chan)
                sends[key] = sends.get(key, 0) + 1
            if st.type in RECEIVES and tb.recv >= n:
                key = (tb.recv, r, tb.chan)
                recvs[key] = recvs.get(key, 0) + 1
    for table, expected, what in ((sends, plan.into, "sends {} messages to switch {} on channel {} but {} ops "
                                   "name it as a src there"),
                                  (recvs, plan.out_of, "receives {} messages from switch {} on channel {} but {} "
                                   "ops name it as a dst there")):
        for key in sorted(table.keys() | expected.keys()):
            src, dst, chan = key
            rank, peer = (src, dst) if table is sends else (dst, src)
            if peer - n >= len(program.switches):
                continue   # a bad peer, reported with the threadblock
            got, want = table.get(key, 0), len(expected.get(key, ()))
            if got != want:
                err.add(f"rank {rank} " + what.format(got, program.switches[peer - n].name, chan, want))
    return err


def _fabric_checks(program: Program, k: int, topology: Topology, err: Errors) -> None:
    """Switch ``k`` exists in the fabric, declares what its ops use, and links every member."""
    sw = program.switches[k]
    if sw.name not in topology.switches:
        err.add(f"switch {sw.name}: not a switch of the fabric {topology.name} "
                f"({', '.join(topology.switches) or 'it has none'})")
        return
    node = topology.node_id(sw.name)
    features = topology.switch_features(node)
    used = {op.type for op in sw.ops}
    for kind, has in (("reduce", features.reduce), ("multicast", features.multicast)):
        if kind in used and not has:
            err.add(f"switch {sw.name}: the program gives it {kind} ops but the fabric {topology.name} does not "
                    f"declare {kind}: true for it")
    for j, op in enumerate(sw.ops):
        for role, members, link in (("src", op.srcs, lambda m: topology.link(m, node)),
                                    ("dst", op.dsts, lambda m: topology.link(node, m))):
            missing = [m for m in members if isinstance(m, int) and 0 <= m < program.num_ranks and link(m) is None]
            if missing:
                way = "to" if role == "src" else "from"   # a src sends to the switch, a dst receives from it
                err.add(f"switch {sw.name} op {j}: {role} rank {missing[0]} has no link {way} the switch in the "
                        f"fabric {topology.name}")
                return


class SwitchRun:
    """The switches' part of the symbolic run (driven by the execution pass): messages delivered to ops in
    connection order, ops fired once complete, results queued on the out connections in op order."""

    def __init__(self, program: Program, plan: SwitchPlan, fifos: dict, err: Errors) -> None:
        self.program, self.plan, self.fifos, self.err = program, plan, fifos, err
        self.taken = {key: 0 for key in plan.into}          # messages taken per in-connection
        self.inputs: list[dict[int, tuple]] = [{} for _ in plan.ops]   # op -> src rank -> message
        self.result: list[tuple | None] = [None] * len(plan.ops)
        self.emitted = {key: 0 for key in plan.out_of}      # results queued per out-connection
        self.senders: list[list[tuple[int, int]]] = [[] for _ in plan.ops]   # op -> (g, p) of its messages
        for key in plan.out_of:
            fifos.setdefault(key, deque())

    def deliver(self, key: tuple, woken: list) -> None:
        """Messages on in-connection ``key`` go to their ops; complete ops fire (receivers waiting are appended
        to ``woken`` as their out-connection keys)."""
        ops = self.plan.into.get(key, ())
        q = self.fifos[key]
        while q and self.taken.get(key, 0) < len(ops):
            op_id = ops[self.taken[key]]
            self.taken[key] += 1
            msg = q.popleft()
            self.inputs[op_id][key[0]] = msg
            self.senders[op_id].append((msg[2], msg[3]))
            _, _, op = self.plan.ops[op_id]
            if len(self.inputs[op_id]) == len(op.srcs):
                self.fire(op_id, woken)

    def fire(self, op_id: int, woken: list) -> None:
        k, j, op = self.plan.ops[op_id]
        where = self.plan.name(self.program, op_id)
        values = []
        for src in op.srcs:
            value, cnt, _, _ = self.inputs[op_id][src]
            if cnt != op.cnt:
                self.err.add(f"{where}: rank {src} sends it cnt={cnt} but the op has cnt={op.cnt}")
            values.append(fit_count(() if value is None else tuple(value), op.cnt))   # None: a step with errors
        if op.type == "multicast":
            out = values[0]
        else:
            out = tuple(self._sum([v[c] for v in values], where, c) for c in range(op.cnt))
        self.result[op_id] = out
        n = self.program.num_ranks
        for dst in op.dsts:
            self.emit((n + k, dst, op.chan), woken)

    def _sum(self, parts: list, where: str, c: int):
        """One chunk of a reduce: the contributions of every src, which must be of one input slot and disjoint."""
        if any(p is None for p in parts):
            self.err.add(f"{where}: chunk {c} of a src's message holds no data")
            return None
        slot, bits = parts[0]
        for p in parts[1:]:
            if p[0] != slot:
                self.err.add(f"{where}: chunk {c} reduces {describe((slot, bits))} with {describe(p)} "
                             "(different input slots)")
                return (slot, bits)
            if bits & p[1]:
                self.err.add(f"{where}: chunk {c} double counts ranks {fmt_ranks(ranks_of(bits & p[1]))} of input "
                             f"slot {slot}")
            bits |= p[1]
        return (slot, bits)

    def emit(self, key: tuple, woken: list) -> None:
        """Queue the results of out-connection ``key`` that are ready, in op order."""
        ops = self.plan.out_of[key]
        q = self.fifos[key]
        at = self.emitted[key]
        while at < len(ops) and self.result[ops[at]] is not None:
            op_id = ops[at]
            q.append((self.result[op_id], self.plan.ops[op_id][2].cnt, -2 - op_id, -1))
            at += 1
        if at != self.emitted[key]:
            self.emitted[key] = at
            woken.append(key)

    def unfired(self, max_errors: int) -> Errors:
        """Ops that never ran, and the srcs whose messages never came."""
        err = Errors(max_errors)
        for op_id, (_, _, op) in enumerate(self.plan.ops):
            if self.result[op_id] is None:
                missing = [s for s in op.srcs if s not in self.inputs[op_id]]
                err.add(f"{self.plan.name(self.program, op_id)} never runs: no message from ranks "
                        f"{fmt_ranks(missing)}")
        return err

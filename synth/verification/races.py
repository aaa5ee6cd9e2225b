"""Verification pass 4, the race check: vector clocks over the executed trace find two threadblocks of a rank
touching one slot (one writing) with no chain of program order, dependencies and messages between them."""

from __future__ import annotations

import numpy as np

from synth.verification.common import NOP, RACE_CHECK_BUDGET, RE, READ_KINDS, WRITE_KINDS, Errors, step_name
from synth.verification.execution import Execution
from synth.verification.layout import Layout
from synth.verification.structure import Structure


def race_check(lay: Layout, st: Structure, ex: Execution, max_errors: int) -> Errors:
    """Data races on the executed trace: two threadblocks of one rank touch a slot (one writes)
    and no chain of program order, dependencies and messages orders them (vector clocks)."""
    err = Errors(max_errors)
    ntb = len(st.tbs)
    if not ex.trace or ntb * len(ex.trace) > RACE_CHECK_BUDGET:
        return err
    # numpy clocks: each join is ntb wide (512 threadblocks on an 8x8 torus ring); a Python map is ~20x slower
    vc = [np.zeros(ntb, dtype=np.int32) for _ in range(ntb)]
    deps, records = st.deps, st.records     # every step's, as tuples: the race check runs on small programs only
    need = {d for dl in deps for d in dl if d is not None}
    snaps: dict[tuple[int, int], np.ndarray] = {}
    last_write: dict[tuple[int, int], tuple[int, int]] = {}
    reads: dict[tuple[int, int], list] = {}
    reported: set[tuple[int, int]] = set()

    def race(g1: int, p1: int, g2: int, p2: int, what: str, key) -> None:
        pair = (min(g1, g2), max(g1, g2))
        if pair in reported:
            return
        reported.add(pair)
        err.add(f"{step_name(st.tbs, g2, p2)}: race: {what} {lay.phys_names[key[0]]}[{key[1]}] (physical "
                f"buffer) concurrently with {step_name(st.tbs, g1, p1)}; no dependency orders them")

    for g, p, sg, sp in ex.trace:
        v = vc[g]
        dep = deps[g][p]
        if dep is not None:
            np.maximum(v, snaps[dep], out=v)
        if sg >= 0:
            np.maximum(v, snaps[(sg, sp)], out=v)
        elif sg <= -2:   # a switch op's result: ordered after every message the op took
            for send in ex.switches.senders[-2 - sg]:
                np.maximum(v, snaps[send], out=v)
        v[g] = p + 1
        kind, _, snd, cnt, sarr, soff, darr, _, doff, _ = records[g][p]
        if kind != NOP:
            if kind in READ_KINDS or kind == RE:
                spans = [(sarr, soff)] if kind in READ_KINDS else []
                if kind == RE:
                    spans.append((darr, doff))
                for arr, off in spans:
                    for i in range(off, off + cnt):
                        key = (id(arr), i)
                        w = last_write.get(key)
                        if w is not None and w[0] != g and v[w[0]] <= w[1]:
                            race(w[0], w[1], g, p, "reads", key)
                        reads.setdefault(key, []).append((g, p))
            if kind in WRITE_KINDS:
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
    return err

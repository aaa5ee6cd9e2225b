"""Issue 32: out-of-place reductions leave the input buffer intact (NCCL's sendbuff is const).

docs/programs.md, "Input buffer": lowering never writes ``i`` of an out-of-place program, ``verify``
rejects a program that does, and the executor checks the input bytes after a run.
"""

from __future__ import annotations

import dataclasses

import pytest

from synth.api import load_topology, synthesize
from synth.collectives import Collective
from synth.program.lower import lower
from synth.synthesis.base import Instance, SynthOptions
from synth.synthesis.registry import get_method
from synth.verification import verify

REDUCING = ("reducescatter", "allreduce", "reduce")
FABRICS = ("ring-8", "dgx1", "fully-connected-8", "leaf-spine-4x4", "torus-3x3x3", "mi250", "hypercube-16")
METHODS = ("ring", "trees", "greedy")


def _writes_input(program) -> list[tuple[int, int, int]]:
    return [(g.id, tb.id, s) for g in program.gpus for tb in g.threadblocks for s, st in enumerate(tb.steps)
            if st.dstbuf == "i" and st.type in ("r", "rcs", "rrc", "rrcs", "cpy", "re")]


def _lowered(fabric: str, name: str, method: str, chunks: int, root: int = 0):
    topo = load_topology(fabric)
    if method == "trees" and name == "allreduce":
        chunks = topo.num_ranks        # the forests split an allreduce into one piece per root
    coll = Collective(name, topo.num_ranks, chunks, root=root)
    spec = get_method(method)
    if name not in spec.collectives:
        pytest.skip(f"{method} does not do {name}")
    sched = spec.run(Instance(topo, coll, float(1 << 20), SynthOptions(chunks=chunks)))
    return lower(sched)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize("name", REDUCING)
def test_out_of_place_reductions_leave_the_input_intact(name, fabric, method):
    chunks = 1 if fabric in ("torus-3x3x3", "hypercube-16") else 2
    prog = _lowered(fabric, name, method, chunks, root=1 if name == "reduce" else 0)
    assert not prog.inplace
    assert _writes_input(prog) == []
    res = verify(prog)          # the input check is on by default
    assert res.ok, res.errors[:3]


@pytest.mark.parametrize("name", REDUCING)
def test_inplace_reductions_still_reduce_in_place(name):
    topo = load_topology("ring-8")
    coll = Collective(name, 8, 1, inplace=True)
    sched = get_method("ring").run(Instance(topo, coll, float(1 << 20), SynthOptions(chunks=1)))
    prog = lower(sched)
    assert prog.inplace and verify(prog).ok
    assert all(g.s_chunks == 0 for g in prog.gpus)      # partial sums live in the (aliased) input, as before


@pytest.mark.parametrize("name", REDUCING)
def test_synthesize_writes_programs_that_keep_the_input(name):
    result = synthesize("ring-8", name, "64KiB", "ring")
    assert _writes_input(result.program) == []
    assert verify(result.program).ok


def _mutated(program):
    """The first rrc of the program made to write its own local operand in the input (the old lowering)."""
    gpus = list(program.gpus)
    for gi, g in enumerate(gpus):
        for ti, tb in enumerate(g.threadblocks):
            for si, st in enumerate(tb.steps):
                if st.type == "rrc":
                    bad = dataclasses.replace(st, srcbuf="i", dstbuf="i", dstoff=st.srcoff if st.srcbuf == "i" else 0)
                    steps = tb.steps[:si] + (bad,) + tb.steps[si + 1:]
                    tbs = list(g.threadblocks)
                    tbs[ti] = dataclasses.replace(tb, steps=steps)
                    gpus[gi] = dataclasses.replace(g, threadblocks=tuple(tbs))
                    return program.with_(gpus=tuple(gpus)), (g.id, tb.id, si)
    raise AssertionError("no rrc")


@pytest.mark.parametrize("fmt", ["xml", "json"])
def test_a_program_that_writes_its_input_is_rejected(tmp_path, fmt):
    from synth.program.load import load_program, save_program

    prog, (rank, tb, step) = _mutated(_lowered("ring-8", "allreduce", "ring", 1))
    path = tmp_path / f"bad.{fmt}"
    save_program(prog, path)
    res = verify(load_program(path))
    assert not res.ok
    assert f"rank {rank} tb {tb} step {step} (rrc): writes input buffer i[" in res.errors[0]
    assert sum("writes input buffer" in e for e in res.errors) == 1     # one message, however many steps
    assert verify(load_program(path), keep_input=False).errors[:1] != res.errors[:1]
    # the same steps in place are fine: there the input is the output
    assert not any("writes input" in e for e in verify(prog.with_(inplace=True)).errors)

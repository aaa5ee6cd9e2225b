"""The step columns a lowered program carries (issue 31, "Memory and I/O"): the same as the columns read from its
Step objects, used only while they describe the program's own steps, and the simulator's flattening on them gives
the same results and errors as on columns read afresh."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from synth.errors import SynthError
from synth.pipeline import synthesize
from synth.program.columns import program_columns, step_columns
from synth.program.ir import Program, Step
from synth.simulation import simulate
from synth.topology import generators as gen
from tests.program_edits import with_step as _edited

FIELDS = ("start", "kind", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps")

# generated fabrics (not only built-ins), several methods, in-place and rooted cases
CASES = [
    (gen.torus([3, 4]), "allreduce", "trees", {}),
    (gen.torus([3, 4]), "allgather", "greedy", {}),
    (gen.random_regular(10, 3, seed=4), "reducescatter", "auto", {}),
    (gen.mesh([2, 3]), "alltoall", "auto", {}),
    (gen.ring(6), "broadcast", "auto", {"root": 2}),
    (gen.ring(6), "allreduce", "ring", {"inplace": True}),
    ("dgx-a100-2node", "allreduce", "trees", {}),
    ("dgx1", "reduce", "auto", {"root": 3}),
]


def _program(case) -> Program:
    topology, collective, method, kwargs = case
    return synthesize(topology, collective, 2**24, method, **kwargs).program


@pytest.fixture(scope="module", params=range(len(CASES)), ids=lambda i: f"{CASES[i][1]}-{CASES[i][2]}-{i}")
def lowered(request) -> Program:
    return _program(CASES[request.param])


def test_carried_columns_are_the_steps_columns(lowered):
    carried = lowered.columns
    assert carried is not None and carried.of is lowered.gpus
    read = step_columns(tb for gpu in lowered.gpus for tb in gpu.threadblocks)
    for name in FIELDS:
        a, b = getattr(carried, name), getattr(read, name)
        assert a.dtype.kind == b.dtype.kind and np.array_equal(a, b), name
    everything = np.arange(len(read.kind))
    assert np.array_equal(carried.hasdep(everything), read.hasdep(everything))
    assert program_columns(lowered) is carried


def test_columns_of_replaced_steps_are_read_afresh(lowered):
    """A program whose gpus were replaced (same values even) does not use the columns it carries."""
    rebuilt = lowered.with_(gpus=tuple(replace(g) for g in lowered.gpus))
    assert rebuilt.columns is lowered.columns and program_columns(rebuilt) is not lowered.columns
    gpu = rebuilt.gpus[0]
    tb = next(t for t in gpu.threadblocks if t.steps)
    changed = replace(tb, steps=(replace(tb.steps[0], cnt=tb.steps[0].cnt + 1),) + tb.steps[1:])
    edited = rebuilt.with_(gpus=(replace(gpu, threadblocks=tuple(changed if t is tb else t
                                                                for t in gpu.threadblocks)),) + rebuilt.gpus[1:])
    assert program_columns(edited).cnt[0] == tb.steps[0].cnt + 1 != lowered.columns.cnt[0]


def test_simulation_same_with_and_without_carried_columns(lowered):
    fabric = lowered.fabric.topology
    a = simulate(lowered, fabric, 2**24)
    b = simulate(lowered.with_(columns=None), fabric, 2**24)
    assert a.time_us == b.time_us and a.events == b.events and a.transfers == b.transfers
    assert a.link_utilization == b.link_utilization


def _with_tb(program: Program, rank: int, old, new) -> Program:
    gpu = program.gpus[rank]
    tbs = tuple(new if t is old else t for t in gpu.threadblocks)
    return program.with_(gpus=program.gpus[:rank] + (replace(gpu, threadblocks=tbs),) + program.gpus[rank + 1:])


def test_simulator_errors_name_the_first_bad_step():
    topology = gen.ring(4)
    program = synthesize(topology, "allgather", 2**20, "ring").program
    tbs = program.gpus[1].threadblocks
    receiver = next(t for t in tbs if any(st.receives for st in t.steps))
    sender = next(t for t in tbs if any(st.sends for st in t.steps))
    receiving = next(i for i, st in enumerate(receiver.steps) if st.receives)
    sending = next(i for i, st in enumerate(sender.steps) if st.sends)
    with pytest.raises(SynthError, match=rf"rank 1 tb {receiver.id} step {receiving} \(\w+\) receives but the "
                                         "threadblock has no recv peer"):
        simulate(_with_tb(program, 1, receiver, replace(receiver, recv=-1)), topology, 2**20)
    with pytest.raises(SynthError, match=rf"rank 1 tb {sender.id} step {sending} \(\w+\) sends but"):
        simulate(_with_tb(program, 1, sender, replace(sender, send=-1)), topology, 2**20)
    first = tbs[0]
    late = _edited(program, 2, 0, 0, depid=first.id + 99, deps=0)
    with pytest.raises(SynthError, match=rf"rank 2 tb \d+ step 0 depends on missing step \(tb {first.id + 99}, "
                                         r"step 0\)"):
        simulate(late, topology, 2**20)
    beyond = _edited(program, 3, 0, 1, depid=program.gpus[3].threadblocks[0].id, deps=10**6)
    with pytest.raises(SynthError, match=r"rank 3 tb \d+ step 1 depends on missing step \(tb \d+, step 1000000\)"):
        simulate(beyond, topology, 2**20)
    floating = _edited(program, 0, 0, 0, cnt=1.5)
    with pytest.raises(SynthError, match="not an integer"):
        simulate(floating, topology, 2**20)


def test_step_errors_before_later_threadblock_errors():
    """A step without its peer in an earlier threadblock is named before a duplicate id further on."""
    topology = gen.ring(3)
    program = synthesize(topology, "allgather", 2**20, "ring").program
    gpu0 = program.gpus[0]
    tb = gpu0.threadblocks[0]
    bad = replace(tb, send=-1) if any(st.sends for st in tb.steps) else replace(tb, recv=-1)
    duplicate = replace(program.gpus[2], threadblocks=program.gpus[2].threadblocks * 2)
    both = program.with_(gpus=(replace(gpu0, threadblocks=(bad,) + gpu0.threadblocks[1:]), program.gpus[1],
                               duplicate))
    with pytest.raises(SynthError, match="but the threadblock has no"):
        simulate(both, topology, 2**20)
    with pytest.raises(SynthError, match="rank 2 has two threadblocks"):
        simulate(program.with_(gpus=program.gpus[:2] + (duplicate,)), topology, 2**20)


def test_nop_only_program_with_dependencies_runs():
    """Dependencies between nops of one rank (no messages) release in program order."""
    from synth.program.ir import Gpu, Threadblock

    gpus = (Gpu(0, 1, 1, 0, (Threadblock(0, steps=(Step("nop", hasdep=True), Step("nop", depid=1, deps=0))),
                             Threadblock(1, steps=(Step("nop", depid=0, deps=0, hasdep=True),)))),
            Gpu(1, 1, 1, 0, ()))
    program = Program("nops", "broadcast", 2, gpus)
    assert simulate(program, gen.ring(2), 2**10).time_us == 0.0


def test_no_threadblock_of_a_good_program_is_suspect():
    """The runtime-limit step checks skip every threadblock of a lowered program within the limits, nops that
    carry dependencies included (the chain rule is tested on arrays, not left to the per-step code)."""
    from synth.program.msccl_xml import runtime_limit_errors, suspect_threadblocks
    from synth.runtime_limits import EXECUTOR

    nops_with_deps = 0
    for case in CASES:
        program = _program(case)
        columns = program_columns(program)
        nops_with_deps += int(((columns.kind == 0) & (columns.depid >= 0)).sum())
        assert not suspect_threadblocks(columns, program, True, EXECUTOR).any()
        assert list(runtime_limit_errors(program)) == []
    assert nops_with_deps > 0

"""The verifier's dataflow run (synth.verification.dataflow, issue 31): it answers "verified" only where the
worklist execution does, and otherwise hands over to it, so every verdict and message stays the worklist's."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.collectives import COLLECTIVES
from synth.execution import samples
from synth.pipeline import synthesize
from synth.program.columns import program_columns, step_columns
from synth.program.ir import Program, Step, collective_of
from synth.topology.io import load_topology
from synth.verification import MAX_ERRORS, merge_errors, run_passes, verify
from synth.verification.conditions import fill_inputs
from synth.verification.dataflow import dataflow_verified
from synth.verification.layout import layout
from synth.verification.structure import structure
from tests.program_edits import with_step as _with_step
from tests.program_edits import with_steps

dataflow_module = sys.modules["synth.verification.dataflow"]
passes_module = sys.modules["synth.verification"]


def _fast_verdict(program: Program) -> bool:
    """What the dataflow run answers for ``program`` as the collective it declares."""
    coll = collective_of(program)
    lay = layout(program, coll)
    fill_inputs(coll, lay)
    columns = program_columns(program) or step_columns(tb for gpu in program.gpus for tb in gpu.threadblocks)
    return dataflow_verified(program, coll, lay, structure(program, lay, MAX_ERRORS, columns))


def _errors(program: Program, races: bool, monkeypatch=None, dataflow: bool = True) -> list[str]:
    """The merged errors of every pass, with the dataflow run allowed or not."""
    coll = collective_of(program)
    if not dataflow:
        monkeypatch.setattr(passes_module, "dataflow_verified", lambda *args: False)
    try:
        return merge_errors(run_passes(program, coll, MAX_ERRORS, races), MAX_ERRORS)
    finally:
        if not dataflow:
            monkeypatch.undo()


def _synthesized() -> dict[str, Program]:
    out = {}
    for topo, coll, method in (("ring-8", "allreduce", "ring"), ("dgx1", "allgather", "trees"),
                               ("torus-4x4", "reducescatter", "trees"), ("torus-4x4", "allreduce", "trees"),
                               ("dgx-a100", "allreduce", "nccl"), ("hypercube-16", "alltoall", "direct"),
                               ("mesh-5x5", "broadcast", "trees"), ("dgx1", "reduce", "trees")):
        out[f"{topo}-{coll}-{method}"] = synthesize(load_topology(topo), coll, 1 << 20, method).program
    return out


SYNTHESIZED = _synthesized()
SAMPLES = {f"{name}-{n}": samples.sample_program(name, n) for name in COLLECTIVES for n in (2, 5)}
SAMPLES.update({"ring-inplace": samples.ring_allgather(6, 2).with_(inplace=True),
                "ring-allreduce": samples.ring_allreduce(4, 2), "direct-allreduce": samples.direct_allreduce(5)})
GOOD = {**SAMPLES, **SYNTHESIZED}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_programs_are_verified_by_the_dataflow_run(name: str) -> None:
    program = GOOD[name]
    assert _fast_verdict(program), name
    assert verify(program, races=False).ok
    assert verify(program).ok


def test_switch_programs_are_left_to_the_worklist() -> None:
    program = samples.nvls_allreduce(4)
    assert not _fast_verdict(program)
    assert verify(program, races=False).ok


def test_a_wrong_result_falls_back_to_the_worklist_messages(monkeypatch) -> None:
    ring = samples.ring_allgather(6, 2)
    # the last receive of rank 3 lands one slot off: the postcondition fails
    steps = ring.gpus[3].threadblocks[0].steps
    last = max(i for i, s in enumerate(steps) if s.type == "r")
    bad = _with_step(ring, 3, 0, last, dstoff=(steps[last].dstoff + 1) % 12)
    assert not _fast_verdict(bad)
    fast = _errors(bad, races=False)
    assert fast and fast == _errors(bad, races=False, monkeypatch=monkeypatch, dataflow=False)


def test_a_cycle_falls_back_to_the_deadlock_report() -> None:
    ring = samples.ring_allgather(4, 1)
    # rank 0's first step waits for its own last step
    tb = ring.gpus[0].threadblocks[0]
    bad = _with_step(_with_step(ring, 0, 0, 0, depid=tb.id, deps=len(tb.steps) - 1), 0, 0, len(tb.steps) - 1,
                     hasdep=True)
    assert not _fast_verdict(bad)
    errors = verify(bad, races=False).errors
    assert any("never runs" in e for e in errors)


def test_unmatched_messages_fall_back() -> None:
    ring = samples.ring_allgather(4, 1)
    steps = ring.gpus[1].threadblocks[0].steps
    first_send = next(i for i, s in enumerate(steps) if s.type in ("s", "rcs"))
    bad = _with_step(ring, 1, 0, first_send, cnt=2)
    assert not _fast_verdict(bad)
    assert not verify(bad, races=False).ok


def test_two_unordered_writes_of_one_slot_are_left_to_the_worklist() -> None:
    """Two threadblocks of a rank copy into one slot with nothing ordering them: a race, which only the
    worklist's interleaving decides (and the race check reports on a small program)."""
    base = samples.ring_allgather(3, 1)
    gpu = base.gpus[0]
    copy = Step("cpy", srcbuf="i", srcoff=0, dstbuf="s", dstoff=0, cnt=1)
    tbs = gpu.threadblocks + tuple(replace(gpu.threadblocks[0], id=len(gpu.threadblocks) + k, send=-1, recv=-1,
                                           chan=0, steps=(copy,)) for k in range(2))
    gpus = (replace(gpu, threadblocks=tbs, s_chunks=1),) + base.gpus[1:]
    racy = base.with_(gpus=gpus)
    assert not _fast_verdict(racy)
    assert verify(racy, races=False).ok
    assert any("race" in e for e in verify(racy).errors)


def test_the_value_budget_hands_large_programs_to_the_worklist(monkeypatch) -> None:
    program = SYNTHESIZED["torus-4x4-allreduce-trees"]
    monkeypatch.setattr(dataflow_module, "VALUE_WORDS_BUDGET", 10)
    assert not _fast_verdict(program)
    assert verify(program, races=False).ok


MUTATIONS = ("srcoff", "dstoff", "cnt", "type", "drop", "swap", "dep")
TYPES = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(GOOD)), mutation=st.sampled_from(MUTATIONS), pick=st.integers(0, 10 ** 6),
       value=st.integers(-1, 6), kind=st.sampled_from(TYPES))
def test_mutated_programs_get_the_worklist_verdict(monkeypatch, name, mutation, pick, value, kind) -> None:
    """On a program with one step changed, removed or moved: where the worklist run with the race check finds no
    race, the errors with the dataflow run allowed are the worklist's; and where the dataflow run vouches for the
    execution, no execution error (blocked, unreceived, wrong output) is reported."""
    program = GOOD[name]
    if program.switches:
        return
    places = [(g, t, s) for g, gpu in enumerate(program.gpus) for t, tb in enumerate(gpu.threadblocks)
              for s in range(len(tb.steps))]
    g, t, s = places[pick % len(places)]
    step = program.gpus[g].threadblocks[t].steps[s]
    if mutation in ("srcoff", "dstoff", "cnt"):
        bad = _with_step(program, g, t, s, **{mutation: max(getattr(step, mutation) + value - 1, 0)})
    elif mutation == "type":
        bad = _with_step(program, g, t, s, type=kind)
    elif mutation == "dep":
        bad = _with_step(program, g, t, s, depid=-1, deps=-1)
    else:
        steps = list(program.gpus[g].threadblocks[t].steps)
        if mutation == "drop":
            del steps[s]
        elif s + 1 < len(steps):
            steps[s], steps[s + 1] = steps[s + 1], steps[s]
        bad = with_steps(program, g, t, tuple(steps))
    if any("race" in e for e in _errors(bad, races=True)):
        return
    fast = _errors(bad, races=False)
    assert fast == _errors(bad, races=False, monkeypatch=monkeypatch, dataflow=False)
    if _fast_verdict(bad):   # its answer covers the execution passes; the structure's errors are their own
        monkeypatch.setattr(passes_module, "dataflow_verified", lambda *args: False)
        worklist = run_passes(bad, collective_of(bad), MAX_ERRORS, False)
        monkeypatch.undo()
        assert len(worklist) == 7 and not any(worklist[2:])   # run, blocked, leftovers, races, postcondition

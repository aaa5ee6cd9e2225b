"""The verifier's structure pass on step columns (issue 31, "Memory and I/O"): the same records, dependencies,
errors (words and order) and verdicts as the per-step code, on good programs and on every kind of bad step."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from synth.collectives import COLLECTIVES
from synth.execution import samples
from synth.program.columns import step_columns
from synth.program.ir import Program, Step, Threadblock, collective_of
from synth.program.msccl_xml import runtime_limit_errors, suspect_threadblocks
from synth.runtime_limits import EXECUTOR, runtime_profile
from synth.verification import verify
from synth.verification.conditions import fill_inputs
from synth.verification.layout import layout
from tests.program_edits import with_step as _with_step

structure_module = sys.modules["synth.verification.structure"]


def _with_tb(program: Program, rank: int, tb: Threadblock) -> Program:
    gpus = list(program.gpus)
    gpus[rank] = replace(gpus[rank], threadblocks=gpus[rank].threadblocks + (tb,))
    return program.with_(gpus=tuple(gpus))


def _programs() -> dict[str, Program]:
    ring = samples.ring_allgather(6, 2)
    reduce_ring = samples.ring_allreduce(4, 2)
    out = {f"{name}-{n}": samples.sample_program(name, n) for name in COLLECTIVES for n in (2, 5)}
    out.update({
        "ring": ring, "ring-inplace": ring.with_(inplace=True), "allreduce": reduce_ring,
        "nvls": samples.nvls_allreduce(4),
        "unknown-type": _with_step(ring, 1, 0, 2, type="xx"),
        "bad-buffer": _with_step(ring, 2, 0, 0, srcbuf="q"),
        "bad-dst-buffer-on-nop": _with_step(ring, 2, 0, 1, type="nop", dstbuf="z"),
        "out-of-range": _with_step(ring, 0, 0, 2, dstoff=40),
        "negative-offset": _with_step(ring, 3, 0, 0, srcoff=-1),
        "zero-cnt": _with_step(ring, 4, 0, 3, cnt=0),
        "negative-cnt-nop": _with_step(ring, 4, 0, 3, type="nop", cnt=-2),
        "missing-dep-tb": _with_step(ring, 1, 0, 4, depid=7, deps=0),
        "missing-dep-step": _with_step(ring, 1, 0, 4, depid=0, deps=99),
        "negative-dep-step": _with_step(ring, 1, 0, 4, depid=0, deps=-3),
        "dep-without-hasdep": _with_step(_with_step(ring, 1, 0, 5, depid=0, deps=2), 1, 0, 6, depid=0, deps=2),
        "dep-with-hasdep": _with_step(_with_step(ring, 1, 0, 5, depid=0, deps=2), 1, 0, 2, hasdep=True),
        "nop-with-dep": _with_step(ring, 2, 0, 3, Step("nop", depid=0, deps=1)),
        "huge-offset": _with_step(ring, 0, 0, 2, type="r", srcoff=2**62 + 5),
        "beyond-int64": _with_step(ring, 0, 0, 2, srcoff=2**70),
        "float-offset": _with_step(ring, 0, 0, 2, dstoff=1.0),
        "bool-hasdep-int": _with_step(_with_step(ring, 1, 0, 5, depid=0, deps=2), 1, 0, 2, hasdep=1),
        "no-send-peer": _with_tb(ring, 0, Threadblock(1, -1, -1, 0, (Step("s", "o", 0, "o", 0),))),
        "empty-threadblocks": _with_tb(_with_tb(ring, 0, Threadblock(1)), 5, Threadblock(1)),
        "duplicate-tb": _with_tb(ring, 0, Threadblock(0, 1, 5, 1, (Step("nop"),))),
        "reduce-bad-offsets": _with_step(_with_step(reduce_ring, 1, 0, 1, srcoff=9), 2, 0, 2, dstoff=-4),
    })
    return out


PROGRAMS = _programs()


def _per_step(monkeypatch) -> None:
    """Make the verifier build no step columns: every pass runs its per-step code."""
    monkeypatch.setattr(structure_module, "step_columns", lambda tbs: None)
    monkeypatch.setattr(sys.modules["synth.verification"], "program_columns", lambda program: None)


def _structure(program: Program, columns: bool, max_errors: int = 1000):
    coll = collective_of(program)
    lay = layout(program, coll)
    fill_inputs(coll, lay)
    if columns:
        return lay, structure_module.structure(program, lay, max_errors)
    real = structure_module.step_columns
    structure_module.step_columns = lambda tbs: None
    try:
        return lay, structure_module.structure(program, lay, max_errors)
    finally:
        structure_module.step_columns = real


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("max_errors", [1000, 1])
def test_columns_compile_what_the_per_step_code_compiles(name, max_errors):
    program = PROGRAMS[name]
    coll = collective_of(program)
    lay = layout(program, coll)
    fill_inputs(coll, lay)
    new = structure_module.structure(program, lay, max_errors)
    err = structure_module.Errors(max_errors)
    tbs, gindex = structure_module.index_threadblocks(program, err)
    conns = structure_module.connections(program.num_ranks, tbs, err, len(program.switches))
    deps, records, depended = structure_module.compile_steps(program, lay, tbs, gindex, conns, err)
    structure_module.check_hasdep(tbs, depended, err)
    assert list(new.errors) == list(err) and new.errors.dropped == err.dropped
    assert new.deps == deps
    assert len(new.records) == len(records)
    for got, want in zip(new.records, records, strict=True):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):   # the slot lists by identity, the rest by value and type
            assert [x if isinstance(x, list) else (type(x), x) for x in a] == \
                [x if isinstance(x, list) else (type(x), x) for x in b]
            assert all(x is y for x, y in zip(a, b, strict=True) if isinstance(x, list))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_verdicts_and_messages_are_the_per_step_code_s(name, monkeypatch):
    program = PROGRAMS[name]
    try:
        new = verify(program)
    except TypeError:       # a float offset the per-step code cannot run either
        with pytest.raises(TypeError):
            _per_step(monkeypatch)
            verify(program)
        return
    with_columns = [verify(program, runtime=runtime) for runtime in ("msccl-executor", "msccl")]
    _per_step(monkeypatch)
    assert verify(program) == new
    assert [verify(program, runtime=runtime) for runtime in ("msccl-executor", "msccl")] == with_columns


def test_bad_programs_are_caught():
    """The mutants above are bad (so the comparisons cover error paths), the plain programs good."""
    for name in ("unknown-type", "bad-buffer", "out-of-range", "negative-offset", "zero-cnt", "missing-dep-tb",
                 "missing-dep-step", "dep-without-hasdep", "huge-offset", "no-send-peer", "duplicate-tb"):
        assert not verify(PROGRAMS[name]).ok, name
    for name in ("ring", "ring-inplace", "allreduce", "nvls", "dep-with-hasdep", "bool-hasdep-int",
                 "empty-threadblocks"):
        assert verify(PROGRAMS[name]).ok, (name, verify(PROGRAMS[name]).errors)
    hasdep = verify(PROGRAMS["dep-without-hasdep"]).errors
    assert hasdep == ["rank 1 tb 0 step 2 (rcs): tb 0 step 5 depends on it but it has hasdep=0, so the runtime "
                      "never signals it"]


def test_columns_refuse_inexact_values():
    ring = samples.ring_allgather(3)
    tbs = [tb for g in ring.gpus for tb in g.threadblocks]
    cols = step_columns(tbs)
    assert cols is not None and cols.start.tolist() == [0, 4, 8, 12] and cols.cnt.tolist() == [1] * 12
    for bad in (dict(srcoff=1.0), dict(cnt="1"), dict(depid=2**64), dict(type=["s"])):
        odd = _with_step(ring, 0, 0, 0, **bad)
        assert step_columns([tb for g in odd.gpus for tb in g.threadblocks]) is None, bad


def test_only_windows_of_running_threadblocks_are_tuples():
    """ColumnRecords makes records a window at a time: a threadblock longer than the window still runs whole."""
    program = samples.ring_allgather(structure_module.ColumnRecords.WINDOW + 6)   # WINDOW + 7 steps a threadblock
    _, st = _structure(program, columns=True)
    assert isinstance(st.steps, structure_module.ColumnRecords)
    lo, window = st.steps.window(0, 5)
    assert lo == 5 and len(window) == structure_module.ColumnRecords.WINDOW
    assert window == st.records[0][5:5 + len(window)]
    assert verify(program).ok


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("runtime", [None, "msccl-executor", "msccl"])
@pytest.mark.parametrize("msccl", [False, True])
def test_runtime_limit_step_checks_on_columns(name, runtime, msccl):
    program = PROGRAMS[name]
    columns = step_columns(tb for gpu in program.gpus for tb in gpu.threadblocks)
    if columns is None:
        return
    plain = list(runtime_limit_errors(program, msccl=msccl, runtime=runtime))
    suspect = suspect_threadblocks(columns, program, msccl, runtime_profile(runtime) if runtime else EXECUTOR)
    assert list(runtime_limit_errors(program, msccl=msccl, runtime=runtime, suspect=suspect)) == plain


def test_limit_checks_on_columns_find_what_the_step_code_finds():
    ring = samples.ring_allgather(6, 2)
    cases = {
        "nop chain": _with_step(_with_step(ring, 1, 0, 2, Step("nop", depid=0, deps=0)), 1, 0, 3, depid=-1),
        "send without peer": PROGRAMS["no-send-peer"],
        "offset": _with_step(ring, 2, 0, 2, dstoff=40000),
        "cnt": _with_step(ring, 2, 0, 2, cnt=100),
        "depid": _with_step(ring, 2, 0, 2, depid=300, deps=0),
    }
    for what, program in cases.items():
        columns = step_columns(tb for gpu in program.gpus for tb in gpu.threadblocks)
        found = list(runtime_limit_errors(program, suspect=suspect_threadblocks(columns, program, True, EXECUTOR)))
        assert found and found == list(runtime_limit_errors(program)), what


def test_out_of_place_input_writes_on_columns(monkeypatch):
    ring = samples.ring_allgather(4)
    writes_input = _with_step(_with_step(ring, 2, 0, 0, dstbuf="i", dstoff=0), 3, 0, 0, dstbuf="i", dstoff=0)
    found = verify(writes_input).errors
    assert any("writes input buffer i[0:1]" in e and "(1 more steps write it too)" in e for e in found), found
    _per_step(monkeypatch)
    assert verify(writes_input).errors == found
    assert verify(ring).ok

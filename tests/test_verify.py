"""Verifier: fixtures pass, hand-built programs for all eight collectives pass, and every kind of
mistake (deadlock, dropped or misplaced receives, bad offsets, double counting...) is caught."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.collectives import COLLECTIVES, Collective
from synth.errors import SynthError
from synth.program.ir import RECEIVES, Gpu, Program, Step, Threadblock
from synth.program.load import load_program
from synth.program.msccl_xml import program_to_xml
from synth.verification import expected_values, verify

FIXTURES = sorted(Path("/work/shared/fixtures/msccl").glob("*.xml"))
if not FIXTURES:  # the fixtures also live next to the repository in CI checkouts
    FIXTURES = sorted((Path(__file__).resolve().parents[2] / "shared/fixtures/msccl").glob("*.xml"))


# ---- tiny builders -------------------------------------------------------------------------------
def direct_program(name: str, n: int = 4, c: int = 2, root: int = 0) -> Program:
    """A correct out-of-place program for any collective: every output slot is filled by a direct
    send from the owner of each contribution (copies) or by a chain of rrc steps (reductions)."""
    coll = Collective(name, n, c, root=root)
    # per rank: key -> list of step dicts; key is the peer (-1 for the local threadblock)
    steps: dict[int, dict[int, list[dict]]] = {r: defaultdict(list) for r in range(n)}

    def add(r: int, peer: int, **kw) -> tuple[int, int]:
        steps[r][peer].append(kw)
        return peer, len(steps[r][peer]) - 1

    for (r, slot), contribs in sorted(coll.postcondition.items()):
        parts = sorted(coll.split_contribution(x) for x in contribs)  # (origin, input slot)
        if not coll.is_reduction:
            (q, s), = parts
            if q == r:
                add(r, -1, type="cpy", srcbuf="i", srcoff=s, dstbuf="o", dstoff=slot)
            else:
                add(q, r, type="s", srcbuf="i", srcoff=s, dstbuf="o", dstoff=slot)
                add(r, q, type="r", srcbuf="i", srcoff=s, dstbuf="o", dstoff=slot)
            continue
        s = parts[0][1]
        prev = None
        for q, _ in parts:
            if q == r:
                continue
            add(q, r, type="s", srcbuf="i", srcoff=s, dstbuf="o", dstoff=slot)
            src = ("i", s) if prev is None else ("o", slot)
            dep = {} if prev is None else {"dep": prev}
            prev = add(r, q, type="rrc", srcbuf=src[0], srcoff=src[1], dstbuf="o", dstoff=slot, **dep)
        if prev is None:  # single rank
            add(r, -1, type="cpy", srcbuf="i", srcoff=s, dstbuf="o", dstoff=slot)
    gpus = []
    for r in range(n):
        peers = sorted(steps[r])
        tb_of = {peer: k for k, peer in enumerate(peers)}
        # sends first in each threadblock: they never block, so no cycle is possible
        ordered = {peer: sorted(steps[r][peer], key=lambda d: d["type"] != "s") for peer in peers}
        index = {(peer, id(d)): k for peer in peers for k, d in enumerate(ordered[peer])}
        raw_index = {(peer, k): index[(peer, id(d))] for peer in peers for k, d in enumerate(steps[r][peer])}
        depended = set()
        for peer in peers:
            for d in ordered[peer]:
                if "dep" in d:
                    depended.add((tb_of[d["dep"][0]], raw_index[d["dep"]]))
        tbs = []
        for peer in peers:
            out = []
            for k, d in enumerate(ordered[peer]):
                depid, deps = -1, -1
                if "dep" in d:
                    depid, deps = tb_of[d["dep"][0]], raw_index[d["dep"]]
                out.append(Step(d["type"], d["srcbuf"], d["srcoff"], d["dstbuf"], d["dstoff"], 1, depid, deps,
                                (tb_of[peer], k) in depended))
            tbs.append(Threadblock(id=tb_of[peer], send=peer, recv=peer, chan=0, steps=tuple(out)))
        gpus.append(Gpu(r, coll.input_chunks, coll.output_chunks, 0, tuple(tbs)))
    return Program(name=f"direct_{name}", collective=name, num_ranks=n, gpus=tuple(gpus), root=root,
                   nchunksperloop=max(coll.input_chunks, coll.output_chunks), chunk_factor=c)


def ring_allgather(n: int) -> Program:
    """In-place ring allgather (the msccl-tools fixture's pattern) on n ranks."""
    gpus = []
    for r in range(n):
        st = [Step("s", "o", r, "o", r)]
        for k in range(1, n - 1):
            off = (r - k) % n
            st.append(Step("rcs", "o", off, "o", off))
        last = (r - n + 1) % n
        st.append(Step("r", "o", last, "o", last))
        gpus.append(Gpu(r, 0, n, 0, (Threadblock(0, (r + 1) % n, (r - 1) % n, 0, tuple(st)),)))
    return Program(name=f"ring{n}", collective="allgather", num_ranks=n, gpus=tuple(gpus), inplace=True,
                   nchunksperloop=n)


def replace_steps(program: Program, rank: int, tb_pos: int, steps) -> Program:
    gpus = list(program.gpus)
    tbs = list(gpus[rank].threadblocks)
    tbs[tb_pos] = tbs[tb_pos].__class__(tbs[tb_pos].id, tbs[tb_pos].send, tbs[tb_pos].recv, tbs[tb_pos].chan,
                                        tuple(steps))
    gpus[rank] = gpus[rank].__class__(gpus[rank].id, gpus[rank].i_chunks, gpus[rank].o_chunks,
                                      gpus[rank].s_chunks, tuple(tbs))
    return program.with_(gpus=tuple(gpus))


def remove_step(program: Program, rank: int, tb_pos: int, index: int) -> Program:
    """Drop one step and renumber dependencies on the steps after it (so only the semantics change)."""
    gpu = program.gpus[rank]
    tb_id = gpu.threadblocks[tb_pos].id
    new_tbs = []
    for pos, tb in enumerate(gpu.threadblocks):
        out = []
        for k, st in enumerate(tb.steps):
            if pos == tb_pos and k == index:
                continue
            if st.depid == tb_id and st.deps >= index:
                deps = st.deps - 1 if st.deps > index else index - 1
                st = dataclasses.replace(st, **{"deps": deps, "depid": tb_id if deps >= 0 else -1})
                if deps < 0:
                    st = dataclasses.replace(st, **{"deps": -1})
            out.append(st)
        new_tbs.append(Threadblock(tb.id, tb.send, tb.recv, tb.chan, tuple(out)))
    # keep hasdep consistent: a step that dependents now point at must signal
    needed = {(st.depid, st.deps) for tb in new_tbs for st in tb.steps if st.depid >= 0}
    fixed = []
    for tb in new_tbs:
        fixed.append(Threadblock(tb.id, tb.send, tb.recv, tb.chan, tuple(
            dataclasses.replace(st, **{"hasdep": st.hasdep or (tb.id, k) in needed})
            for k, st in enumerate(tb.steps))))
    gpus = list(program.gpus)
    gpus[rank] = Gpu(gpu.id, gpu.i_chunks, gpu.o_chunks, gpu.s_chunks, tuple(fixed))
    return program.with_(gpus=tuple(gpus))


def run_cli(*args):
    return CliRunner().invoke(cli, list(args))


# ---- correct programs ----------------------------------------------------------------------------
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixtures_verify(path):
    result = verify(load_program(path))
    assert result.ok, result.errors
    assert result.ranks == 4
    assert result.collective == path.stem.split("_")[0]


@pytest.mark.parametrize("name", COLLECTIVES)
@pytest.mark.parametrize("root", [0, 2])
def test_direct_programs_for_all_collectives_verify(name, root):
    program = direct_program(name, n=4, c=2, root=root)
    result = verify(program)
    assert result.ok, result.errors[:5]
    assert result.collective == name


@pytest.mark.parametrize("name", COLLECTIVES)
def test_direct_program_checked_against_other_collective_fails(name):
    program = direct_program(name, n=4, c=2)
    other = {"allgather": "alltoall", "alltoall": "allgather", "allreduce": "reducescatter",
             "reducescatter": "allreduce", "broadcast": "scatter", "scatter": "broadcast",
             "reduce": "allreduce", "gather": "allgather"}[name]
    result = verify(program, other)
    assert not result.ok and result.collective == other


def test_wrong_root_fails():
    program = direct_program("broadcast", n=4, c=1, root=1)
    assert verify(program).ok
    assert not verify(program.with_(root=2)).ok


# ---- mutations of every fixture ------------------------------------------------------------------
def _receive_sites(program: Program):
    for r, gpu in enumerate(program.gpus):
        for pos, tb in enumerate(gpu.threadblocks):
            for k, st in enumerate(tb.steps):
                if st.type in RECEIVES:
                    yield r, pos, k, st


def _mutants(program: Program):
    for r, pos, k, st in _receive_sites(program):
        yield f"drop r{r} tb{pos} s{k} {st.type}", remove_step(program, r, pos, k)
        # move the slot the receive stores into (rrs stores nothing: move its local operand instead)
        field_buf, field_off = ("srcbuf", "srcoff") if st.type == "rrs" else ("dstbuf", "dstoff")
        gpu = program.gpus[r]
        buf = getattr(st, field_buf)
        limit = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}[buf]
        span = limit - st.cnt + 1
        if span > 1:
            new_off = (getattr(st, field_off) + 1) % span
            moved = dataclasses.replace(st, **{field_off: new_off})
            steps = list(gpu.threadblocks[pos].steps)
            steps[k] = moved
            yield f"move r{r} tb{pos} s{k} {st.type} {field_off}->{new_off}", replace_steps(program, r, pos, steps)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_receive_mutant_of_fixture_fails(path, tmp_path):
    program = load_program(path)
    mutants = list(_mutants(program))
    assert len(mutants) >= 2 * sum(1 for _ in _receive_sites(program)) - 4
    for label, mutant in mutants:
        out = tmp_path / "mutant.xml"
        out.write_text(program_to_xml(mutant))
        res = run_cli("verify", str(out))
        assert res.exit_code == 1, f"{path.name}: mutant '{label}' passed verification"


@pytest.mark.parametrize("name", ["allgather", "allreduce", "reducescatter", "alltoall"])
def test_receive_mutants_of_direct_programs_fail(name):
    program = direct_program(name, n=3, c=1)
    count = 0
    for label, mutant in _mutants(program):
        assert not verify(mutant).ok, label
        count += 1
    assert count > 0


# ---- specific mistakes ---------------------------------------------------------------------------
def _two_rank_allgather(order0, order1) -> Program:
    def tb(r, order):
        other = 1 - r
        send = Step("s", "o", r, "o", r)
        recv = Step("r", "o", other, "o", other)
        return Threadblock(0, other, other, 0, (send, recv) if order == "sr" else (recv, send))
    gpus = tuple(Gpu(r, 0, 2, 0, (tb(r, o),)) for r, o in ((0, order0), (1, order1)))
    return Program(name="ag2", collective="allgather", num_ranks=2, gpus=gpus, inplace=True, nchunksperloop=2)


def test_two_rank_allgather_correct_and_asymmetric_ok():
    assert verify(_two_rank_allgather("sr", "sr")).ok
    assert verify(_two_rank_allgather("rs", "sr")).ok  # sends are asynchronous


def test_deadlock_both_receive_first():
    result = verify(_two_rank_allgather("rs", "rs"))
    assert not result.ok
    cycle = [e for e in result.errors if e.startswith("deadlock")]
    assert cycle and "rank 0 tb 0 step 0 (r)" in cycle[0] and "rank 1 tb 0 step 0 (r)" in cycle[0]
    assert any("never runs" in e for e in result.errors)


def test_dependency_deadlock_cycle_within_rank():
    # tb0 step0 waits on tb1 step0, which waits on tb0 step0
    gpus = []
    for r in range(2):
        other = 1 - r
        tb0 = Threadblock(0, other, -1, 0, (Step("s", "o", r, "o", r, depid=1, deps=0, hasdep=True),))
        tb1 = Threadblock(1, -1, other, 0, (Step("r", "o", other, "o", other, depid=0, deps=0, hasdep=True),))
        gpus.append(Gpu(r, 0, 2, 0, (tb0, tb1)))
    program = Program(name="x", collective="allgather", num_ranks=2, gpus=tuple(gpus), inplace=True)
    result = verify(program)
    assert any(e.startswith("deadlock") and "rank 0 tb 0 step 0" in e for e in result.errors), result.errors


def test_out_of_range_offsets():
    program = ring_allgather(4)
    st = program.gpus[2].threadblocks[0].steps
    bad = replace_steps(program, 2, 0, [dataclasses.replace(st[0], **{"srcoff": 4})] + list(st[1:]))
    result = verify(bad)
    assert any("rank 2 tb 0 step 0 (s)" in e and "out of range" in e for e in result.errors), result.errors
    neg = replace_steps(program, 1, 0, list(st[:1]) + [dataclasses.replace(st[1], **{"dstoff": -1})]
                        + list(st[2:]))
    assert any("rank 1 tb 0 step 1 (rcs)" in e and "out of range" in e for e in verify(neg).errors)


def test_inplace_alias_window_is_checked():
    # in-place allgather: i of rank r is o[r:r+1]; i[1] is outside that window
    program = ring_allgather(4)
    st = list(program.gpus[0].threadblocks[0].steps)
    st[0] = Step("s", "i", 1, "o", 0)
    result = verify(replace_steps(program, 0, 0, st))
    assert any("after in-place aliasing" in e for e in result.errors)
    st[0] = Step("s", "i", 0, "o", 0)  # the same data through the alias: still correct
    assert verify(replace_steps(program, 0, 0, st)).ok


def test_double_counting_reduction_detected():
    program = direct_program("allreduce", n=3, c=1)
    # rank 0 adds its own input twice into its output before the receives
    gpu = program.gpus[0]
    local = Threadblock(len(gpu.threadblocks), -1, -1, 0, (Step("cpy", "i", 0, "o", 0), Step("re", "i", 0, "o", 0)))
    bad = program.with_(gpus=(Gpu(0, gpu.i_chunks, gpu.o_chunks, 0, gpu.threadblocks + (local,)),) + program.gpus[1:])
    result = verify(bad)
    assert any("double counts ranks [0]" in e and "rank 0 tb" in e for e in result.errors), result.errors


def test_unknown_step_type_is_an_error_not_a_crash():
    program = direct_program("allreduce", n=3, c=1)
    gpu = program.gpus[0]
    odd = Threadblock(len(gpu.threadblocks), -1, -1, 0, (Step("copy", "i", 0, "o", 0),))
    bad = program.with_(gpus=(Gpu(0, gpu.i_chunks, gpu.o_chunks, 0, gpu.threadblocks + (odd,)),) + program.gpus[1:])
    result = verify(bad)
    assert not result.ok
    assert any("unknown step type 'copy'" in e and "rank 0 tb" in e for e in result.errors), result.errors


def test_cnt_mismatch_and_leftover_messages():
    program = ring_allgather(3)
    st = list(program.gpus[0].threadblocks[0].steps)
    st[0] = Step("s", "o", 0, "o", 0, cnt=2)
    result = verify(replace_steps(program, 0, 0, st))
    assert any("receives cnt=1 but the matching send, rank 0 tb 0 step 0, has cnt=2" in e for e in result.errors)
    extra = list(program.gpus[1].threadblocks[0].steps) + [Step("s", "o", 1, "o", 1)]
    result = verify(replace_steps(program, 1, 0, extra))
    assert any("rank 1 tb 0 step 3 (s)" in e and "never received" in e for e in result.errors), result.errors


def test_bad_dependency_and_missing_hasdep():
    program = ring_allgather(3)
    st = list(program.gpus[0].threadblocks[0].steps)
    st[1] = Step("rcs", "o", 2, "o", 2, depid=5, deps=0)
    result = verify(replace_steps(program, 0, 0, st))
    assert any("depends on tb 5 step 0, which does not exist" in e for e in result.errors)
    st[1] = Step("rcs", "o", 2, "o", 2, depid=0, deps=0)  # valid reference, but step 0 lacks hasdep
    result = verify(replace_steps(program, 0, 0, st))
    assert any("hasdep=0" in e and "rank 0 tb 0 step 0" in e for e in result.errors)


def test_uninitialized_read_and_structural_peer_errors():
    program = ring_allgather(3)
    st = list(program.gpus[0].threadblocks[0].steps)
    st[0] = Step("s", "o", 1, "o", 1)  # o[1] holds nothing yet on rank 0
    result = verify(replace_steps(program, 0, 0, st))
    assert any("rank 0 tb 0 step 0 (s): reads o[1:2], which holds no data" in e for e in result.errors)
    gpu = program.gpus[0]
    dup = Threadblock(1, 1, -1, 0, ())
    bad = program.with_(gpus=(Gpu(0, 0, 3, 0, gpu.threadblocks + (dup,)),) + program.gpus[1:])
    assert any("already used" in e for e in verify(bad).errors)


def _racy_allgather(with_dep: bool) -> Program:
    """Two-rank allgather where tb 0 receives into o[other] and tb 1 copies that slot to scratch;
    without a dependency the copy races with the receive."""
    gpus = []
    for r in range(2):
        other = 1 - r
        recv_tb = Threadblock(0, -1, other, 0, (Step("r", "o", other, "o", other, hasdep=with_dep),))
        dep = {"depid": 0, "deps": 0} if with_dep else {}
        local = Threadblock(1, other, -1, 0, (Step("s", "o", r, "o", r),
                                              Step("cpy", "o", other, "s", 0, **dep)))
        gpus.append(Gpu(r, 0, 2, 1, (recv_tb, local)))
    return Program(name="racy", collective="allgather", num_ranks=2, gpus=tuple(gpus), inplace=True)


def test_race_between_threadblocks_detected():
    ordered = verify(_racy_allgather(True))
    assert ordered.ok, ordered.errors
    racy = verify(_racy_allgather(False))
    assert any("race" in e and "rank 0 tb" in e and "o[1]" in e for e in racy.errors), racy.errors
    assert not any("race" in e for e in verify(_racy_allgather(False), races=False).errors)


def test_unknown_collective_is_bad_input():
    program = ring_allgather(3).with_(collective="custom")
    with pytest.raises(SynthError, match="-c"):
        verify(program)
    assert verify(program, "allgather").ok


@pytest.mark.parametrize("name", COLLECTIVES)
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_expected_values_match_postcondition(name, inplace, chunks):
    """The formula-based expected values equal Collective.postcondition exactly (keys and sets)."""
    for n, root in ((1, 0), (2, 1), (5, 3), (6, 0)):
        coll = Collective(name, n, chunks, root=root, inplace=inplace)
        expected = expected_values(coll)
        assert set(expected) == set(coll.postcondition)
        for key, contribs in coll.postcondition.items():
            slot, bits = expected[key]
            assert 0 <= slot < coll.input_chunks and 0 < bits < 1 << n
            assert {coll.contribution(q, slot) for q in range(n) if bits >> q & 1} == set(contribs)


def test_large_ring_is_fast():
    program = ring_allgather(256)  # 65k steps
    t0 = time.perf_counter()
    result = verify(program)
    elapsed = time.perf_counter() - t0
    assert result.ok
    assert elapsed < 30, elapsed  # about 1 s on an idle core; generous for loaded CI machines


# ---- CLI -----------------------------------------------------------------------------------------
def test_cli_exit_codes_and_json(tmp_path):
    good = FIXTURES[0]
    res = run_cli("verify", str(good))
    assert res.exit_code == 0 and "ok" in res.output
    res = run_cli("verify", str(good), "--json")
    doc = json.loads(res.output)
    assert doc == {"ok": True, "collective": "allgather", "ranks": 4, "errors": []}
    res = run_cli("verify", str(good), "--json", "-c", "alltoall")
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and doc["ok"] is False and doc["collective"] == "alltoall" and doc["errors"]
    bad = tmp_path / "deadlock.xml"
    bad.write_text(program_to_xml(_two_rank_allgather("rs", "rs")))
    res = run_cli("verify", str(bad))
    assert res.exit_code == 1 and "deadlock" in res.output
    res = run_cli("verify", str(tmp_path / "missing.xml"))
    assert res.exit_code == 2 and "cannot read" in res.output
    garbage = tmp_path / "garbage.xml"
    garbage.write_text("<algo coll='allgather'><gpu")
    res = run_cli("verify", str(garbage))
    assert res.exit_code == 2 and "garbage.xml" in res.output and "Traceback" not in res.output
    res = run_cli("verify", str(good), "-c", "nonsense")
    assert res.exit_code == 2

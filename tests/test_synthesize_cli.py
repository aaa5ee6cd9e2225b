"""`synth synthesize` and the pipeline driver behind it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.errors import SynthError
from synth.pipeline import synthesize
from synth.program.load import load_program
from synth.synthesis.base import MethodSpec, SynthOptions
from synth.synthesis.registry import METHODS, get_method, methods_for
from synth.topology import generators as gen
from synth.verification import verify

SPEC_KEYS = {"method", "solver", "status", "time_us", "algbw_GBps", "busbw_GBps", "bound_us", "gap", "synthesis_s",
             "output"}


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_a_long_output_path_is_printed_whole(tmp_path):
    # the console wraps at its width; the written path must stay on one line (it broke at pytest-101)
    out = tmp_path / ("deep-" * 30) / "ring.xml"
    out.parent.mkdir()
    res = invoke("synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-s", "1M", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert f"verified, wrote {out}" in res.output.splitlines()


def test_dgx1_ring_allgather_writes_a_verified_program(tmp_path):
    out = tmp_path / "ring.xml"
    res = invoke("synthesize", "-t", "dgx1", "-c", "allgather", "-m", "ring", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert "ring" in res.output and "busbw_GBps" in res.output and str(out) in res.output
    program = load_program(out)
    assert program.collective == "allgather" and program.num_ranks == 8
    assert verify(program).ok
    assert 'coll="allgather"' in out.read_text()


def test_json_output_has_the_spec_keys(tmp_path):
    out = tmp_path / "ar.json"
    res = invoke("synthesize", "-t", "ring-8", "-c", "allreduce", "-s", "64MiB", "-o", str(out), "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert SPEC_KEYS <= payload.keys()
    assert payload["method"] in ("ring", "multiring") and payload["status"] == "heuristic"
    assert payload["output"] == str(out)
    assert payload["algbw_GBps"] == pytest.approx(64 * 2**20 / (payload["time_us"] * 1e3))
    assert payload["busbw_GBps"] == pytest.approx(payload["algbw_GBps"] * 2 * 7 / 8)
    if payload["bound_us"] is not None:
        assert 0 <= payload["bound_us"] <= payload["time_us"] * (1 + 1e-9)
        assert payload["gap"] == pytest.approx((payload["time_us"] - payload["bound_us"]) / payload["time_us"])
    assert verify(load_program(out)).ok


def test_default_output_name_and_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("synthesize", "-t", "ring-8", "-c", "reducescatter", "-s", "1M", "--chunks", "3",
                 "--coll-spelling", "reducescatter", "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    written = tmp_path / f"ring-8-reducescatter-{payload['method']}.xml"  # auto's pick names the file
    assert payload["output"] == written.name and written.exists()
    assert 'coll="reducescatter"' in written.read_text() and payload["chunks"] == 3
    res = invoke("synthesize", "-t", "ring-8", "-c", "reducescatter", "-s", "1M", "--coll-spelling", "reduce_scatter",
                 "-o", "rs.xml")
    assert res.exit_code == 0 and 'coll="reduce_scatter"' in (tmp_path / "rs.xml").read_text()


def test_trees_chunks_flag_coalesces_steps_where_one_chunk_each_would_not_fit(tmp_path):
    # ring-8 allgather at 1024 chunks per root: one chunk per step would need 3584 steps on a
    # connection (MSCCL allows 32 channels x 64); --chunks fixes the count, not the message size
    out = tmp_path / "ag.xml"
    res = invoke("synthesize", "-t", "ring-8", "-c", "allgather", "-m", "trees", "-s", "64MiB", "--chunks", "1024",
                 "-o", str(out), "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert payload["chunks"] == 1024 and payload["bound_us"] / payload["time_us"] > 0.9
    program = load_program(out)
    assert verify(program).ok and program.nchunksperloop == 8 * 1024
    steps: dict[tuple[int, int], int] = {}
    chunks: dict[tuple[int, int], int] = {}
    for gpu in program.gpus:
        for tb in gpu.threadblocks:
            sends = [step for step in tb.steps if step.sends]
            steps[(gpu.id, tb.send)] = steps.get((gpu.id, tb.send), 0) + len(sends)
            chunks[(gpu.id, tb.send)] = chunks.get((gpu.id, tb.send), 0) + sum(step.cnt for step in sends)
            assert all(step.cnt < 72 for step in tb.steps)
    assert max(steps.values()) <= 32 * 64 < max(chunks.values())
    # within synth's 2**24 transfers (synth/limits.py), trees itself explains why the count cannot fit
    res = invoke("synthesize", "-t", "ring-8", "-c", "allgather", "-m", "trees", "-s", "64MiB", "--chunks", "200000",
                 "-o", str(tmp_path / "no.xml"))
    assert res.exit_code == 2 and "--chunks 200000" in res.output and "largest steps" in res.output
    assert not (tmp_path / "no.xml").exists()
    res = invoke("synthesize", "-t", "ring-8", "-c", "allgather", "-m", "trees", "-s", "64MiB", "--chunks", "500000",
                 "-o", str(tmp_path / "no.xml"))
    assert res.exit_code == 2 and "--chunks 500000" in res.output and "16,777,216" in res.output
    assert not (tmp_path / "no.xml").exists()


@pytest.mark.parametrize("method", ["trees", "lp"])
def test_allreduce_chunks_count_the_whole_buffer_on_forests(tmp_path, method):
    # an allreduce's chunk factor covers its whole buffer; the forests' roots own C / n chunks each
    out = tmp_path / "ar.xml"
    res = invoke("synthesize", "-t", "dgx1", "-c", "allreduce", "-m", method, "-s", "64MiB", "--chunks", "64",
                 "-o", str(out), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["chunks"] == 64
    program = load_program(out)
    assert verify(program).ok and program.nchunksperloop == 64
    res = invoke("synthesize", "-t", "dgx1", "-c", "allreduce", "-m", method, "-s", "64MiB", "--chunks", "12",
                 "-o", str(tmp_path / "no.xml"))
    assert res.exit_code == 2 and "multiple of its 8 ranks" in res.output and "internal" not in res.output


@pytest.mark.parametrize("method", ["dbt", "nccl", "ring"])
def test_root_of_an_unrooted_collective_is_ignored(tmp_path, method):
    # dbt and nccl planned with root 0 and the driver refused their schedules as an internal error
    out = tmp_path / "ar.json"
    res = invoke("synthesize", "-t", "dgx1", "-c", "allreduce", "-m", method, "--root", "3", "-s", "1MiB",
                 "-o", str(out), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["root"] == 0 and "internal" not in res.output
    assert load_program(out).root == 0 and verify(load_program(out)).ok


def test_rooted_collective_takes_root(tmp_path):
    out = tmp_path / "b.json"
    res = invoke("synthesize", "-t", "dgx1", "-c", "broadcast", "--root", "5", "-s", "8MiB", "-o", str(out))
    assert res.exit_code == 0, res.output
    program = load_program(out)
    assert program.root == 5 and verify(program).ok


@pytest.mark.parametrize("args,message", [
    (["-c", "allgather", "-m", "nosuch"], "unknown method"),
    (["-c", "allgathr"], "unknown collective"),
    (["-c", "allgather", "-s", "12 parsecs"], "invalid size"),
    (["-c", "broadcast", "--root", "9"], "--root 9"),
    (["-c", "allgather", "--chunks", "0"], "--chunks"),
    (["-c", "allgather", "-o", "out.txt"], ".xml"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    res = invoke("synthesize", "-t", "ring-8", *args)
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]
    assert list(tmp_path.iterdir()) == []          # nothing half-written


def test_unknown_topology_exit_2():
    res = invoke("synthesize", "-t", "no-such-topology", "-c", "allgather")
    assert res.exit_code == 2 and "error:" in res.output
    res = invoke("synthesize", "-c", "allgather")
    assert res.exit_code == 2 and "-t/--topology" in res.output


def test_list_methods():
    res = invoke("synthesize", "--list-methods", "--json")
    assert res.exit_code == 0, res.output
    names = [row["name"] for row in json.loads(res.output)["methods"]]
    assert "ring" in names


# ---- pipeline ---------------------------------------------------------------------------------------
def test_pipeline_result_fields():
    result = synthesize(gen.ring(4), "allgather", 2**20, "ring")  # auto's pick: tests/test_auto.py
    assert result.method == "ring" and result.status == "heuristic" and result.solver is None
    assert verify(result.program).ok
    assert result.time_us > 0 and result.synthesis_s >= 0
    assert result.tried and result.tried[0]["method"] == "ring"
    assert result.collective.name == "allgather" and result.schedule.collective == result.collective


def test_registry():
    assert "ring" in METHODS and get_method("ring").name == "ring"
    assert "ring" in methods_for("alltoall")
    with pytest.raises(SynthError, match="unknown method"):
        get_method("bogus")


def _broken(inst):
    """A 'method' whose schedule forgets the last hop of a ring allgather."""
    from synth.synthesis.ring import synthesize as ring

    schedule = ring(inst)
    last = max(t.start for t in schedule.transfers)
    return replace(schedule, transfers=tuple(t for t in schedule.transfers if t.start < last))


def _crashing(inst):
    raise ZeroDivisionError("boom")


@pytest.mark.parametrize("fn,message", [
    (_broken, "internal: method fake produced an invalid program"),
    (_crashing, "internal: method fake failed: ZeroDivisionError: boom"),
])
def test_pipeline_rejects_bad_methods(monkeypatch, fn, message):
    import synth.synthesis.registry as registry

    spec = MethodSpec("fake", fn, frozenset({"allgather"}), "test double")
    monkeypatch.setattr(registry, "get_method", lambda name: spec)
    with pytest.raises(SynthError, match=message):
        synthesize(gen.ring(4), "allgather", 2**20, "fake", SynthOptions())


def test_pipeline_refuses_unsupported_collective(monkeypatch):
    import synth.synthesis.registry as registry

    spec = MethodSpec("fake", _crashing, frozenset({"allreduce"}), "test double")
    monkeypatch.setattr(registry, "get_method", lambda name: spec)
    with pytest.raises(SynthError, match="does not support allgather"):
        synthesize(gen.ring(4), "allgather", 2**20, "fake")


def _one_ring(inst):
    from synth.synthesis.ring import synthesize as ring

    return replace(ring(inst.with_options(replace(inst.options, extra={"max_rings": 1}))), method="onering")


def test_auto_keeps_the_fastest_verified_candidate(monkeypatch):
    import synth.synthesis.auto as auto
    import synth.synthesis.registry as registry

    real = registry.get_method
    fakes = {"onering": MethodSpec("onering", _one_ring, frozenset({"allgather"}), "single ring"),
             "crash": MethodSpec("crash", _crashing, frozenset({"allgather"}), "always fails")}
    monkeypatch.setattr(registry, "get_method", lambda name: fakes.get(name) or real(name))
    monkeypatch.setattr(auto, "candidates", lambda *a: ["onering", "crash", "ring"])
    result = synthesize(gen.ring(8), "allgather", 2**26, "auto")
    assert result.method == "ring"                       # two rings beat one
    rows = {row["method"]: row for row in result.tried}
    assert rows["onering"]["time_us"] > rows["ring"]["time_us"] == result.time_us
    assert "boom" in rows["crash"]["error"]
    monkeypatch.setattr(auto, "candidates", lambda *a: ["crash"])
    with pytest.raises(SynthError, match="every method failed"):
        synthesize(gen.ring(8), "allgather", 2**26, "auto")


def test_trees_picks_a_chunk_count_the_runtime_runs_unless_told_any(tmp_path):
    # dgx1 allgather: 6 trees per root, fastest at 6 chunks per root = 48 per loop, which a 1 GiB
    # buffer does not divide; by default the program's count divides it (and no note is needed)
    def run(*extra):
        out = tmp_path / f"ag{len(extra)}.xml"
        res = invoke("synthesize", "-t", "dgx1", "-c", "allgather", "-m", "trees", "-o", str(out), "--json", *extra)
        assert res.exit_code == 0, res.output
        return json.loads(res.output), load_program(out)

    usable, usable_program = run()
    anything, any_program = run("--any-chunks")
    assert (2**28) % usable_program.nchunksperloop == 0 and not usable["notes"]
    assert (2**28) % any_program.nchunksperloop != 0
    assert any("nchunksperloop divides" in note for note in anything["notes"])
    assert anything["time_us"] <= usable["time_us"] < anything["time_us"] * 1.01


def test_auto_prefers_a_program_the_runtime_runs_at_size(monkeypatch):
    # dgx1 1 GiB allgather: NCCL's rings at their own 48 chunks per loop (the nccl baseline, here made an auto
    # candidate) simulate 0.5 % faster than the trees at 2048 per loop, within 1 % of the bound, but an MSCCL
    # runtime would not run that program on a 2^28-element buffer: it neither stops the plan nor wins
    import synth.synthesis.auto as auto

    monkeypatch.setattr(auto, "candidates", lambda *a: ["nccl", "trees"])
    monkeypatch.setattr(auto, "TREE_METHODS", ())      # keep that order (nccl first)
    result = synthesize("dgx1", "allgather", 2**30, "auto")
    times = {row["method"]: row["time_us"] for row in result.tried if "time_us" in row}
    assert set(times) == {"nccl", "trees"} and times["nccl"] < result.time_us <= 1.01 * result.bound_us
    assert result.method == "trees" and (2**28) % result.program.nchunksperloop == 0 and not result.notes
    anything = synthesize("dgx1", "allgather", 2**30, "auto", SynthOptions(runtime_chunks=False))
    assert anything.method == "nccl" and anything.time_us == times["nccl"] and anything.notes
    assert [row["method"] for row in anything.tried if "skipped" in row] == ["trees"]


def test_size_range_flags_fence_the_program_and_must_admit_size(tmp_path):
    out = tmp_path / "ag.xml"
    res = invoke("synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-s", "64M", "--min-bytes", "32MiB",
                 "--max-bytes", "1G", "-o", str(out))
    assert res.exit_code == 0, res.output
    program = load_program(out)
    assert (program.min_bytes, program.max_bytes) == (2**25, 10**9)
    assert 'minBytes="33554432" maxBytes="1000000000"' in out.read_text()
    for flags in (["--min-bytes", "128M"], ["--max-bytes", "32M"]):
        bad = tmp_path / "bad.xml"
        res = invoke("synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-s", "64M", *flags, "-o", str(bad))
        assert res.exit_code == 2 and "exclude SIZE" in res.output and not bad.exists()


def _refusing_more_than(limit: int, monkeypatch) -> list[int]:
    """Make lowering refuse programs of more than ``limit`` chunks per piece (as MSCCL's step limits
    would); returns the chunk counts it was asked to lower."""
    from synth import pipeline

    real, asked = pipeline._lowered, []

    def lowered(inst, method, schedule, *args):
        asked.append(schedule.collective.chunk_factor)
        if schedule.collective.chunk_factor > limit:
            raise pipeline._DoesNotLower(f"method {method}: lowering: too many steps")
        return real(inst, method, schedule, *args)

    monkeypatch.setattr(pipeline, "_lowered", lowered)
    return asked


def test_a_chunk_count_the_method_chose_is_halved_until_its_program_fits(monkeypatch):
    asked = _refusing_more_than(1, monkeypatch)
    result = synthesize("ring-8", "allgather", 1 << 30, "ring")      # ring picks 2 chunks per piece here
    assert asked == [2, 1] and result.collective.chunk_factor == 1
    assert verify(result.program, result.collective).ok
    assert result.notes[-1] == "ring chose 2 chunks per piece, more than MSCCL's limits hold; 1 fit"


def test_a_chunk_count_the_user_pinned_is_not_changed(monkeypatch):
    _refusing_more_than(1, monkeypatch)
    with pytest.raises(SynthError, match="too many steps"):
        synthesize("ring-8", "allgather", 1 << 30, "ring", SynthOptions(chunks=2))


def test_progress_names_each_method_run_and_the_best_gap_so_far():
    seen = []
    result = synthesize("dgx1", "allgather", 2**10, "auto", progress=lambda m, gap: seen.append((m, gap)))
    ran = [row["method"] for row in result.tried if "skipped" not in row and "not_tried" not in row]
    assert [m for m, _ in seen] == ran and len(ran) >= 2
    assert seen[0][1] is None and all(gap is not None and gap >= 0 for _, gap in seen[1:])


def test_no_progress_line_without_a_terminal(tmp_path):
    res = invoke("synthesize", "-t", "ring-8", "-c", "allgather", "-s", "1MiB", "-o", str(tmp_path / "a.xml"))
    assert res.exit_code == 0 and "running" not in res.output


def test_a_program_over_an_msccl_limit_is_written_as_json_and_refused_as_xml_naming_the_limit(tmp_path):
    """Issue 31's "limits that say so": 8192 chunks per piece put output offsets past the runtimes' int16 range
    (a pinned --chunks is never reduced), so no MSCCL runtime loads the program; the JSON program still verifies
    and simulates, and the XML export exits 2 naming the limit, the rank and the step."""
    args = ("synthesize", "-t", "dgx1", "-c", "allgather", "-m", "ring", "--chunks", "8192", "-s", "1GiB")
    res = invoke(*args, "-o", str(tmp_path / "ring.xml"))
    assert res.exit_code == 2
    assert "int16 offset limit" in res.output and "rank 0" in res.output and ".json" in res.output
    assert not (tmp_path / "ring.xml").exists()
    res = invoke(*args, "-o", str(tmp_path / "ring.json"), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert any("no MSCCL runtime loads this program" in note for note in doc["notes"])
    program = load_program(tmp_path / "ring.json")
    assert program.nchunksperloop == 8 * 8192 and verify(program).ok


def test_a_kept_program_over_a_limit_says_so(monkeypatch):
    """A method's only program over an MSCCL limit is kept (its JSON program runs) and the result says that no
    runtime loads it."""
    import synth.pipeline as pipeline

    topology = gen.ring(8)
    base = synthesize(topology, "allgather", 2**20, "ring")
    over = replace(base.schedule, notes={**base.schedule.notes, "over_limits": "a test limit"})
    monkeypatch.setattr(pipeline, "_fitted", lambda spec, inst: (over, [base.program], None, "a test limit"))
    result = synthesize(topology, "allgather", 2**20, "ring")
    assert result.schedule.notes.get("over_limits") == "a test limit"
    assert any("no MSCCL runtime loads this program" in note for note in result.notes)


def test_an_xml_output_keeps_the_fastest_program_a_runtime_loads(monkeypatch, tmp_path):
    """auto keeps a faster program over an MSCCL limit (its JSON runs) where every loadable one is over 25 % slower,
    which a .xml output cannot write (exit 2). Asked for XML, auto keeps the fastest program that loads instead and
    names the other; asked for JSON, it keeps the faster one. Here the forest methods' programs (235 us) are
    marked over a limit, and greedy's (344 us) is the fastest that loads."""
    import synth.pipeline as pipeline

    real = pipeline._fitted

    def fitted(spec, inst):
        schedule, programs, chosen, over = real(spec, inst)
        if spec.name in ("railblocks", "trees", "mirror"):
            schedule = replace(schedule, notes={**schedule.notes, "over_limits": "a test limit"}, alternatives=())
            over = "a test limit"
        return schedule, programs, chosen, over

    monkeypatch.setattr(pipeline, "_fitted", fitted)
    args = ("synthesize", "-t", "dgx-a100-2node", "-c", "allgather", "-s", "64MiB", "--json")
    as_json = json.loads(invoke(*args, "-o", str(tmp_path / "a.json")).output)
    assert as_json["method"] in ("railblocks", "trees", "mirror")
    res = invoke(*args, "-o", str(tmp_path / "a.xml"))
    assert res.exit_code == 0, res.output
    as_xml = json.loads(res.output)
    assert as_xml["method"] not in ("railblocks", "trees", "mirror") and (tmp_path / "a.xml").exists()
    assert as_xml["time_us"] > 1.25 * as_json["time_us"]
    assert any("exceeds an MSCCL runtime's limits" in note for note in as_xml["notes"])


def _unspreadable_ring(inst):
    """A one-chunk-per-step ring allgather: each connection carries 7 x C steps (no step merges chunks)."""
    from synth.schedule import Schedule, Transfer

    coll, n = inst.collective, inst.collective.num_ranks
    out = [Transfer(float(t), t + 1.0, coll.contribution(q, k), (q + t) % n, (q + t + 1) % n)
           for q in range(n) for t in range(n - 1) for k in range(coll.chunk_factor)]
    return Schedule(coll, inst.topology.name, tuple(out), method="unspreadable", size_bytes=inst.size_bytes,
                    predicted_time_us=n - 1.0)


def test_a_schedule_the_lowering_cannot_spread_over_msccl_channels_is_kept_as_a_json_program(monkeypatch):
    """Where a connection needs more steps than MSCCL's 32 channels x 64 steps hold (here 7 x 300 = 2100) and no
    smaller count is possible (a pinned --chunks), the program is lowered with longer threadblocks: it verifies
    and simulates, and the result says no MSCCL runtime loads it."""
    import synth.synthesis.registry as registry

    spec = MethodSpec("unspreadable", _unspreadable_ring, frozenset({"allgather"}), "test double")
    monkeypatch.setattr(registry, "get_method", lambda name: spec)
    result = synthesize(gen.ring(8), "allgather", 1 << 30, "unspreadable", SynthOptions(chunks=300))
    why = result.schedule.notes["over_limits"]
    assert "channel" in why and "--chunks" in why
    assert verify(result.program, result.collective).ok
    assert max(len(tb.steps) for gpu in result.program.gpus for tb in gpu.threadblocks) > 64
    assert any("no MSCCL runtime loads this program" in note for note in result.notes)


def _unspreadable_or_refusing(inst):
    """Chooses 300 chunks per piece itself, and refuses any other count (as a forest allreduce refuses a count
    that is not a multiple of its ranks)."""
    if inst.options.chunks is not None and inst.options.chunks != 300:
        raise SynthError(f"--chunks {inst.options.chunks}: this method needs 300")
    coll = replace(inst.collective, chunk_factor=300)
    return _unspreadable_ring(replace(inst, collective=coll))


def test_a_method_that_refuses_the_halved_count_keeps_its_first_program(monkeypatch):
    """The halving retry asks for 150 chunks, which the method refuses: the program at its own 300 stands, lowered
    for its JSON form (1024-rank allreduce on 128 A100 boxes: the ring at 0.10 of the bound was all that was left)."""
    import synth.synthesis.registry as registry

    spec = MethodSpec("refusing", _unspreadable_or_refusing, frozenset({"allgather"}), "test double")
    monkeypatch.setattr(registry, "get_method", lambda name: spec)
    result = synthesize(gen.ring(8), "allgather", 1 << 30, "refusing")
    assert result.collective.chunk_factor == 300 and "over_limits" in result.schedule.notes
    assert verify(result.program, result.collective).ok

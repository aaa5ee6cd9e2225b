"""`synth sweep` and synth.sweep: the grid, gaps against the bound, failures as rows, the row cache, tables."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from synth import pipeline
from synth import sweep as sw
from synth.cli import cli
from synth.errors import SynthError
from synth.lower_bounds import compute_bounds
from synth.synthesis.base import MethodSpec, SynthOptions
from synth.synthesis.registry import METHODS
from synth.topology import generators as gen


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def crash_method(monkeypatch):
    """A registered method that raises inside: its rows must record the error, not stop the sweep."""

    def boom(inst):
        raise RuntimeError("kaboom")

    spec = MethodSpec("crash", boom, frozenset({"allgather", "allreduce"}), "always fails")
    monkeypatch.setitem(METHODS._entries, "crash", "tests:crash")
    monkeypatch.setitem(METHODS._loaded, "crash", spec)
    return spec


def test_rows_have_the_columns_bound_and_gap(tmp_path):
    topo = gen.ring(4)
    res = sw.run_sweep([topo], ["allgather", "allreduce"], [1000, 10**6], ["ring", "greedy"], cache_dir=None)
    assert len(res.rows) == 2 * 2 * 2 and res.computed == 8 and res.cached == 0 and res.failed == 0
    for row in res.rows:
        assert set(sw.COLUMNS) <= set(row)
        assert row["status"] == "heuristic" and row["verified"] is True and row["error"] is None
        bound = compute_bounds(topo, row["collective"], row["size_bytes"]).time_bound_us
        assert row["bound_us"] == pytest.approx(bound)
        assert row["time_us"] >= bound * (1 - 1e-9)
        assert row["gap"] == pytest.approx((row["time_us"] - bound) / row["time_us"])
        assert 0 <= row["gap"] < 1
        assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / (row["time_us"] * 1e3))
    # order: topology, collective, size, method
    assert [(r["collective"], r["size_bytes"], r["method"]) for r in res.rows[:4]] == [
        ("allgather", 1000, "ring"), ("allgather", 1000, "greedy"), ("allgather", 10**6, "ring"),
        ("allgather", 10**6, "greedy")]


def test_rows_match_the_pipeline():
    topo = gen.fully_connected(4)
    row = sw.run_sweep([topo], ["allreduce"], [2**20], ["ring"], cache_dir=None).rows[0]
    ref = pipeline.synthesize(topo, "allreduce", 2**20, "ring")
    assert row["time_us"] == pytest.approx(ref.time_us)
    assert row["busbw_GBps"] == pytest.approx(ref.busbw_GBps)
    assert row["chunks"] == ref.collective.chunk_factor


def test_all_expands_to_the_registry_and_failures_are_rows(crash_method):
    topo = gen.ring(4)
    res = sw.run_sweep([topo], ["allgather"], [4096], ["all"], cache_dir=None)
    methods = [r["method"] for r in res.rows]
    assert methods == [m for m in METHODS if "allgather" in METHODS[m].collectives]
    crash = next(r for r in res.rows if r["method"] == "crash")
    assert crash["status"] == "error" and "kaboom" in crash["error"] and crash["time_us"] is None
    assert crash["bound_us"] is not None and crash["verified"] is False
    assert any(r["status"] == "heuristic" for r in res.rows)  # the sweep went on after the crash
    assert res.failed == sum(r["status"] not in sw.OK_STATUSES for r in res.rows) >= 1


def test_explicit_method_that_does_not_support_the_collective(crash_method):
    row = sw.run_sweep([gen.ring(4)], ["broadcast"], [4096], ["crash"], cache_dir=None).rows[0]
    assert row["status"] == "unsupported" and "does not support broadcast" in row["error"]


def test_auto_rows_keep_the_method_name_and_record_the_pick():
    row = sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["auto"], cache_dir=None).rows[0]
    ref = pipeline.synthesize(gen.ring(4), "allgather", 1000, "auto")
    assert row["method"] == "auto" and row["picked"] == ref.method
    assert row["time_us"] == pytest.approx(ref.time_us)


def test_cache_entries_without_newer_context_columns_still_hit(tmp_path):
    cache = tmp_path / "c"
    sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["ring"], cache_dir=cache)
    (entry,) = cache.rglob("*.json")
    doc = json.loads(entry.read_text())
    del doc["row"]["picked"]
    entry.write_text(json.dumps(doc))
    again = sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["ring"], cache_dir=cache)
    assert again.cached == 1 and again.rows[0]["picked"] is None and again.rows[0]["time_us"] > 0
    del doc["row"]["gap"]  # a required column missing: recomputed
    entry.write_text(json.dumps(doc))
    assert sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["ring"], cache_dir=cache).computed == 1


def test_unknown_names_fail_before_any_work():
    with pytest.raises(SynthError, match="unknown method"):
        sw.plan([gen.ring(4)], ["allgather"], [1000], ["nosuch"])
    with pytest.raises(SynthError, match="unknown collective"):
        sw.plan([gen.ring(4)], ["allgatherx"], [1000], ["ring"])


def test_cache_skips_finished_rows(tmp_path, monkeypatch):
    topo = gen.ring(4)
    cache = tmp_path / "cache"
    first = sw.run_sweep([topo], ["allgather"], [1000, 10**6], ["ring"], cache_dir=cache)
    assert first.computed == 2 and first.cached == 0
    assert len(list(cache.rglob("*.json"))) == 2

    def forbidden(*args, **kwargs):
        raise AssertionError("a cached row was recomputed")

    monkeypatch.setattr(pipeline, "synthesize", forbidden)
    second = sw.run_sweep([topo], ["allgather"], [1000, 10**6], ["ring"], cache_dir=cache)
    assert second.computed == 0 and second.cached == 2
    assert second.rows == first.rows
    # a new size is computed (and fails loudly here because synthesize is forbidden -> error row)
    third = sw.run_sweep([topo], ["allgather"], [1000, 10**6, 10**9], ["ring"], cache_dir=cache)
    assert third.cached == 2 and third.computed == 1
    assert third.rows[2]["status"] == "error" and "recomputed" in third.rows[2]["error"]


def test_parallel_rows_equal_sequential_rows(tmp_path):
    grid = ([gen.ring(4), gen.fully_connected(4)], ["allgather", "allreduce"], [1000, 10**6], ["ring", "greedy"])
    seq = sw.run_sweep(*grid, cache_dir=None)
    par = sw.run_sweep(*grid, cache_dir=tmp_path / "c", jobs=2)
    assert par.computed == len(seq.rows) == 16
    strip = [{k: v for k, v in r.items() if k != "synthesis_s"} for r in seq.rows]
    assert [{k: v for k, v in r.items() if k != "synthesis_s"} for r in par.rows] == strip
    again = sw.run_sweep(*grid, cache_dir=tmp_path / "c", jobs=2)
    assert again.cached == 16 and again.computed == 0
    with pytest.raises(SynthError, match="jobs"):
        sw.run_sweep(*grid, cache_dir=None, jobs=0)


def test_cache_key_depends_on_content_options_and_version():
    a, b = gen.ring(4), gen.ring(4, bw=25)
    opts = SynthOptions()
    base = sw.cache_key(a, "allgather", 1000, "ring", opts, "1")
    assert base == sw.cache_key(gen.ring(4), "allgather", 1000, "ring", SynthOptions(), "1")
    others = {
        sw.cache_key(b, "allgather", 1000, "ring", opts, "1"),
        sw.cache_key(a, "allreduce", 1000, "ring", opts, "1"),
        sw.cache_key(a, "allgather", 1001, "ring", opts, "1"),
        sw.cache_key(a, "allgather", 1000, "greedy", opts, "1"),
        sw.cache_key(a, "allgather", 1000, "ring", SynthOptions(time_limit=5), "1"),
        sw.cache_key(a, "allgather", 1000, "ring", opts, "2"),
    }
    assert base not in others and len(others) == 6


def test_retry_failed_recomputes_cached_errors(tmp_path, crash_method):
    cache = tmp_path / "c"
    sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["crash"], cache_dir=cache)
    again = sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["crash"], cache_dir=cache)
    assert again.cached == 1
    retry = sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["crash"], cache_dir=cache, retry_failed=True)
    assert retry.computed == 1 and retry.rows[0]["status"] == "error"


def test_corrupt_cache_entry_is_a_miss(tmp_path):
    cache = tmp_path / "c"
    sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["ring"], cache_dir=cache)
    (entry,) = cache.rglob("*.json")
    entry.write_text("{not json")
    again = sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["ring"], cache_dir=cache)
    assert again.computed == 1 and again.rows[0]["status"] == "heuristic"


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_tables_round_trip(tmp_path, suffix, crash_method):
    rows = sw.run_sweep([gen.ring(4)], ["allgather"], [1000], ["ring", "crash"], cache_dir=None).rows
    path = sw.write_table(rows, tmp_path / f"r{suffix}")
    back = sw.read_table(path)
    assert len(back) == 2
    for a, b in zip(rows, back):
        for k in sw.COLUMNS:
            if isinstance(a[k], float):
                assert b[k] == pytest.approx(a[k])
            else:
                assert b[k] == a[k], k
    assert sw.is_table(path)


def test_bad_table_suffix_writes_nothing(tmp_path):
    with pytest.raises(SynthError, match=r"\.csv or \.json"):
        sw.write_table([], tmp_path / "r.txt")
    assert not list(tmp_path.iterdir())


def test_cli_sweep_json_and_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    topo = tmp_path / "r4.yaml"
    res = invoke("topology", "generate", "ring", "-n", "4", "-o", str(topo))
    assert res.exit_code == 0, res.output
    args = ["sweep", "-t", f"{topo},fully-connected-8", "-c", "allgather", "-s", "1K,1M", "-m", "ring",
            "-o", "out.csv", "--json"]
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert {"output", "rows", "computed", "cached", "failed"} <= set(doc)
    assert doc["computed"] == 4 and doc["cached"] == 0 and doc["failed"] == 0
    assert {r["topology"] for r in doc["rows"]} == {"ring-4", "fully-connected-8"}
    assert (tmp_path / ".synth-cache").is_dir()
    table = sw.read_table(tmp_path / "out.csv")
    assert [r["size_bytes"] for r in table] == [1000, 10**6, 1000, 10**6]
    again = json.loads(invoke(*args).output)
    assert again["computed"] == 0 and again["cached"] == 4
    plain = invoke("sweep", "-t", str(topo), "-c", "allgather", "-s", "1K,2K", "-m", "ring", "-o", "out.json",
                   "-j", "2")
    assert plain.exit_code == 0 and "gap" in plain.output and "out.json" in plain.output
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["format"] == "synth-sweep" and [r["size_bytes"] for r in doc["rows"]] == [1000, 2000]


@pytest.mark.parametrize("args, message", [
    (["-t", "ring-8", "-o", "r.txt"], ".csv or .json"),
    (["-t", "ring-8", "-m", "nosuch", "-o", "r.csv"], "unknown method"),
    (["-t", "nosuch-topology", "-o", "r.csv"], "nosuch-topology"),
    (["-t", "ring-8", "-s", "1Q", "-o", "r.csv"], "invalid size"),
    (["-t", "ring-8", "--time-limit", "0", "-o", "r.csv"], "--time-limit"),
    (["-t", "ring-8", "-j", "0", "-o", "r.csv"], "--jobs"),
])
def test_cli_bad_input_exit_2_and_no_file(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    res = invoke("sweep", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r.csv").exists() and not (tmp_path / "r.txt").exists()


# ---- nccl-tests' size range: -b/--minbytes -e/--maxbytes -f/--stepfactor ------------------------------------
def test_size_range_is_nccl_tests_geometric_progression():
    assert sw.size_range(2**10, 2**30, 2) == [2**k for k in range(10, 31)]  # nccl-tests' -b 1K -e 1G -f 2
    assert sw.size_range(1000, 10**6, 10) == [1000, 10**4, 10**5, 10**6]
    assert sw.size_range(1000, 9999, 10) == [1000]            # MAX only when the progression reaches it
    assert sw.size_range(100, 400, 1.5) == [100, 150, 225, 338]
    assert sw.size_range(7, 7, 2) == [7]


@pytest.mark.parametrize("args, message", [
    ((2**20, 2**10, 2), "larger than --maxbytes"),
    ((1, 2**30, 1.0), "greater than 1"),
    ((1, 2**30, 0.5), "greater than 1"),
    ((1, 10**12, 1.01), "more than 64"),
])
def test_size_range_rejects_bad_ranges(args, message):
    with pytest.raises(SynthError, match=message):
        sw.size_range(*args)


def test_cli_range_rows_and_busbw_column(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("sweep", "-t", "ring-8", "-c", "allgather", "-b", "1KiB", "-e", "16KiB", "-f", "4", "-m", "ring",
                 "-o", "r.csv", "--no-cache")
    assert res.exit_code == 0, res.output
    header = res.output.splitlines()[0].split()
    assert header[header.index("algbw_GBps") + 1] == "busbw_GBps"
    assert [r["size_bytes"] for r in sw.read_table(tmp_path / "r.csv")] == [1024, 4096, 16384]
    first = res.output.splitlines()[1].split()
    row = sw.read_table(tmp_path / "r.csv")[0]
    assert first[2] == "1KiB" and float(first[header.index("busbw_GBps")]) == round(row["busbw_GBps"], 2)


@pytest.mark.parametrize("args, message", [
    (["-s", "1K", "-b", "1K", "-e", "1M"], "not both"),
    (["-b", "1K"], "needs both"),
    (["-f", "2"], "needs both"),
    (["-b", "1M", "-e", "1K"], "larger than --maxbytes"),
    (["-b", "1K", "-e", "1G", "-f", "1"], "--stepfactor"),
    (["-b", "1", "-e", "1T", "-f", "1.1"], "more than 64"),
    (["-b", "1Q", "-e", "1M"], "invalid size"),
])
def test_cli_bad_range_exit_2(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    res = invoke("sweep", "-t", "ring-8", "-o", "r.csv", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r.csv").exists()

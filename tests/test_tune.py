"""Issue 34 item 2: ``synth tune`` (synth/tune.py, synth/cli/cmd_tune.py): size bands that tile the range, one
program each or NCCL's own algorithm, in the files a runtime loads and selects (synth/runtimes.py re-implements
each runtime's selection rule, citing its source lines)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.errors import SynthError
from synth.program.load import load_program
from synth.program.msccl_xml import runtime_limit_errors
from synth.runtime_limits import MSCCL, runtime_profile
from synth.runtimes import Call, algo_attributes, loader_errors, select
from synth.simulation import simulate
from synth.sweep import run_sweep
from synth.synthesis.base import SynthOptions
from synth.topology.io import load_topology
from synth.tune import MANIFEST, band_files, manifest, parse_range, tune, write_set
from synth.verification import verify

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TOPOLOGY = "ring-8"
COLLECTIVES = ["allgather", "reducescatter"]
SIZES = "64KiB..16MiB"      # 64KiB, 256KiB, 1MiB, 4MiB, 16MiB with -f 4
FACTOR = 4.0


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tune-cache")


@pytest.fixture(scope="module", params=["msccl-executor", "msccl"])
def tuned(request, cache, tmp_path_factory):
    """One set per runtime on ring-8 (the rows cached, so the CLI tests below reuse them)."""
    runtime = request.param
    topology = load_topology(TOPOLOGY)
    result = tune(topology, COLLECTIVES, parse_range(SIZES, FACTOR), SynthOptions(runtime=runtime), stride=2,
                  cache_dir=cache)
    out = write_set(result, tmp_path_factory.mktemp(f"set-{runtime}") / "set")
    return result, out


def _files(out: Path) -> list[tuple[dict, Path]]:
    doc = json.loads((out / MANIFEST).read_text())
    return [(band, out / band["file"]) for band in doc["bands"] if band["file"]]


# ---- the grid --------------------------------------------------------------------------------------
def test_parse_range_is_the_nccl_tests_grid_with_its_end():
    sizes = parse_range("1KiB..4GiB")
    assert len(sizes) == 23 and sizes[0] == KiB and sizes[-1] == 4 * GiB
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert parse_range("1000..5000") == [1000, 2000, 4000, 5000]     # MAX is always the last size
    assert parse_range("1MiB") == [MiB]
    for bad in ("..4GiB", "4GiB..1KiB", "1KiB..4GiB..8GiB"):
        with pytest.raises(SynthError):
            parse_range(bad)


# ---- the checks (ring-8 here, the acceptance command below) ----------------------------------------
def check_tiling(result) -> None:
    """The bands of each collective tile the range: no gap, no overlap, every grid size in one band."""
    for coll in result.collectives:
        bands = [b for b in result.bands if b.collective == coll]
        assert bands[0].min_bytes == result.sizes[0] and bands[-1].max_bytes == result.sizes[-1]
        assert all(b.min_bytes == a.max_bytes + 1 for a, b in zip(bands, bands[1:]))
        assert all(b.min_bytes <= b.max_bytes for b in bands)
        for band in bands:
            assert all(band.min_bytes <= p.size_bytes <= band.max_bytes for p in band.points)
        assert [p.size_bytes for b in bands for p in b.points] == result.sizes
        # adjacent bands differ in method or program (else they would be one band)
        assert all((a.method, a.candidate) != (b.method, b.candidate) for a, b in zip(bands, bands[1:]))


def check_files_load(result, out: Path) -> None:
    """Every file passes its runtime's loader (attribute set, coll spelling, limits) and verifies."""
    profile = result.runtime
    files = _files(out)
    assert len(files) <= profile.max_files
    for band, path in files:
        text = path.read_text()
        assert list(loader_errors(profile, text)) == []
        program = load_program(path)
        assert list(runtime_limit_errors(program, runtime=profile.name)) == []
        assert verify(program, band["collective"]).ok
        attrs = algo_attributes(text)
        assert attrs["coll"] == profile.coll(band["collective"])
        assert ("outofplace" in attrs) == (profile.name == "msccl-executor")
        # minBytes/maxBytes in the runtime's own terms: executor inclusive, microsoft/msccl exclusive
        high = band["max_bytes"] + (0 if profile.max_bytes_inclusive else 1)
        assert (int(attrs["minBytes"]), int(attrs["maxBytes"])) == (band["min_bytes"], high)


def check_selection(result, out: Path) -> None:
    """The runtime's own rule (synth.runtimes.select: msccl_lifecycle.cc mscclInternalSchedulerSelectAlgo for the
    executor, tuning.cc ncclTopoGetMSCCLAlgo for microsoft/msccl; min/max bytes, divisibility, ngpus) picks
    exactly the band's file at each grid size of the band, and none of the set's files at NCCL's sizes."""
    profile = result.runtime
    n = result.topology.num_ranks
    files = [(band, algo_attributes(path.read_text())) for band, path in _files(out)]
    for band in result.bands:
        for point in band.points:
            call = Call(band.collective, point.size_bytes, result.inplace, n)
            picked = [(f["collective"], f["band"]) for f, attrs in files if select(profile, attrs, call).selected]
            if band.candidate is None:
                assert picked == [], (band, point)
            else:
                mine = [(f["collective"], f["band"]) for f, _ in files
                        if f["collective"] == band.collective and f["min_bytes"] == band.min_bytes]
                assert len(mine) == 1 and picked == mine, (band, point, picked)
    # the edges of a band: its first and last byte are in it, the bytes beside them are not
    for f, attrs in files:
        loop = int(attrs["nchunksperloop"])
        for size, inside in ((f["min_bytes"], True), (f["max_bytes"], True), (f["max_bytes"] + 1, False),
                             (f["min_bytes"] - 1, False)):
            if size > 0 and size % (4 * loop * n) == 0:   # only where the chunks divide the call
                assert select(profile, attrs, Call(f["collective"], size, result.inplace, n)).selected == inside


def check_fastest(result, out: Path) -> None:
    """At each size of a band, no program of the set the runtime would run there (each a single program for its
    band) is faster than the band's own, and a band with a file beats NCCL's modelled time (bands merged to fit
    the file limit aside)."""
    profile = result.runtime
    topology = result.topology
    programs = [(band, load_program(path), algo_attributes(path.read_text())) for band, path in _files(out)]
    top = "0" if profile.max_bytes_inclusive else str(1 << 62)
    for band in result.bands:
        for point in band.points:
            assert point.time_us is not None
            if band.candidate is not None:
                ours = simulate(band.candidate.program, topology, point.size_bytes).time_us
                assert point.time_us == pytest.approx(ours)
            if band.merged:
                continue
            if band.candidate is not None:
                assert point.nccl_us is None or point.time_us < point.nccl_us     # else NCCL would serve it
            for other, program, attrs in programs:
                if other["collective"] != band.collective:
                    continue
                call = Call(band.collective, point.size_bytes, result.inplace, topology.num_ranks)
                if select(profile, {**attrs, "minBytes": "0", "maxBytes": top}, call).selected:
                    assert point.time_us <= simulate(program, topology, point.size_bytes).time_us * (1 + 1e-9)


def check_manifest_env_plot(result, out: Path) -> None:
    doc = json.loads((out / MANIFEST).read_text())
    assert doc["format"] == "synth-tune" and doc["runtime"] == result.runtime.name
    assert (doc["min_bytes"], doc["max_bytes"]) == (result.sizes[0], result.sizes[-1])
    for band in doc["bands"]:
        assert band["method"] and band["points"]
        for p in band["points"]:
            assert p["time_us"] > 0 and p["ratio_to_bound"] >= 1 - 1e-9
    assert (out / "algbw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the env lines resolve, from anywhere, to exactly the set's files
    shell = f'source "{out}/env.sh"; echo "$MSCCL_ALGO_DIR|$MSCCL_XML_FILES|$NCCL_ALGO"'
    algo_dir, xml_files, algo = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd="/",
                                               check=True).stdout.strip().split("|")
    wanted = sorted(str(path) for _, path in _files(out))
    if not wanted:
        assert algo_dir == xml_files == ""
    elif result.runtime.name == "msccl":
        assert algo_dir == "" and sorted(xml_files.split(":")) == wanted and algo == "MSCCL,RING,TREE"
    else:
        assert xml_files == "" and sorted(str(p) for p in Path(algo_dir).iterdir()) == wanted


def check_all(result, out: Path) -> None:
    check_tiling(result)
    check_files_load(result, out)
    check_selection(result, out)
    check_fastest(result, out)
    check_manifest_env_plot(result, out)


def test_bands_tile_the_range_without_gaps_or_overlaps(tuned):
    result, _ = tuned
    assert result.sizes == [64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB]
    check_tiling(result)


def test_every_file_loads_in_its_runtime_and_verifies(tuned):
    result, out = tuned
    assert _files(out)
    check_files_load(*tuned)


def test_each_runtime_selects_each_file_at_every_size_of_its_band_and_no_other(tuned):
    check_selection(*tuned)


def test_each_band_is_at_least_as_fast_as_every_single_program_at_its_sizes(tuned):
    check_fastest(*tuned)


def test_manifest_env_and_plot(tuned):
    check_manifest_env_plot(*tuned)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SYNTH_TUNE_ACCEPTANCE"),
                    reason="the acceptance command computes 92 rows (555 s of CPU for msccl-executor, 571 s for "
                           "msccl, measured); set SYNTH_TUNE_ACCEPTANCE=1 (and SYNTH_TUNE_CACHE=DIR to reuse rows)")
@pytest.mark.parametrize("runtime", ["msccl-executor", "msccl"])
def test_acceptance_dgx_a100_2node(runtime, tmp_path):
    """Issue 34: `synth tune -t dgx-a100-2node -c allreduce,allgather -o set/` tiles 1 KiB..4 GiB, its files load
    and are selected in both runtimes' rules, each band beats every single program, the manifest and plot exist."""
    cache = os.environ.get("SYNTH_TUNE_CACHE") or str(tmp_path / "cache")
    res = invoke("tune", "-t", "dgx-a100-2node", "-c", "allreduce,allgather", "--runtime", runtime,
                 "--cache-dir", cache, "-o", str(tmp_path / "set"))
    assert res.exit_code == 0, res.output
    result = tune(load_topology("dgx-a100-2node"), ["allreduce", "allgather"], parse_range("1KiB..4GiB"),
                  SynthOptions(runtime=runtime), cache_dir=cache)
    assert result.computed == 0           # the command above computed every row
    out = tmp_path / "set"
    assert json.loads((out / MANIFEST).read_text()) == json.loads(json.dumps(manifest(result)))
    check_all(result, out)


def test_the_set_is_deterministic(tuned, cache, tmp_path):
    result, out = tuned
    again = tune(load_topology(TOPOLOGY), COLLECTIVES, parse_range(SIZES, FACTOR),
                 SynthOptions(runtime=result.runtime.name), stride=2, cache_dir=cache)
    assert again.computed == 0
    copy = write_set(again, tmp_path / "copy")
    for name in ("manifest.json", "env.sh", *(str(p.relative_to(out)) for _, p in _files(out))):
        assert (copy / name).read_bytes() == (out / name).read_bytes(), name


# ---- the runtime's file limit ---------------------------------------------------------------------
def test_a_runtime_file_limit_merges_bands_and_says_so(cache, tmp_path, monkeypatch):
    """microsoft/msccl loads at most RuntimeProfile.max_files files: with the limit lowered to 1, the set is cut
    to one file, each merge named in a note, and the bands still tile the range."""
    import synth.tune as tune_module

    topology = load_topology(TOPOLOGY)
    sizes = parse_range(SIZES, FACTOR)
    options = SynthOptions(runtime="msccl")
    full = tune(topology, COLLECTIVES, sizes, options, stride=2, cache_dir=cache)
    assert len(full.program_bands) >= 2
    one = replace(MSCCL, max_files=1)
    monkeypatch.setattr(tune_module, "runtime_profile", lambda name: one)
    result = tune(topology, COLLECTIVES, sizes, options, stride=2, cache_dir=cache)
    assert result.computed == 0 and len(result.program_bands) == 1
    merges = [n for n in result.notes if "loads at most 1 files" in n]
    assert merges and all("slower at its sizes" in n for n in merges)
    for coll in COLLECTIVES:
        bands = [b for b in result.bands if b.collective == coll]
        assert bands[0].min_bytes == sizes[0] and bands[-1].max_bytes == sizes[-1]
        assert all(b.min_bytes == a.max_bytes + 1 for a, b in zip(bands, bands[1:]))
    # the band kept is served by its program at every size (its times were re-simulated)
    kept = result.program_bands[0]
    for point in kept.points:
        assert point.time_us == pytest.approx(simulate(kept.candidate.program, topology, point.size_bytes).time_us)
    out = write_set(result, tmp_path / "one")
    assert [p.name for p in (out / "msccl").iterdir()] == [Path(band_files(result)[0][1]).name]


# ---- in place, writing, the CLI --------------------------------------------------------------------
def test_inplace_sets_are_selected_by_in_place_calls(cache, tmp_path):
    result = tune(load_topology(TOPOLOGY), ["allreduce"], [4 * MiB], SynthOptions(), inplace=True, cache_dir=cache)
    out = write_set(result, tmp_path / "inplace")
    assert _files(out)
    for _band, path in _files(out):
        attrs = algo_attributes(path.read_text())
        assert (attrs["inplace"], attrs["outofplace"]) == ("1", "0")
        assert select("msccl-executor", attrs, Call("allreduce", 4 * MiB, True, 8)).selected
        assert not select("msccl-executor", attrs, Call("allreduce", 4 * MiB, False, 8)).selected
        assert load_program(path).inplace and verify(load_program(path), "allreduce").ok


def test_write_set_refuses_a_foreign_directory_and_leaves_nothing_on_failure(tuned, tmp_path, monkeypatch):
    result, _ = tuned
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(SynthError, match="not a synth tune set"):
        write_set(result, foreign)
    assert (foreign / "notes.txt").read_text() == "keep"
    import synth.tune as tune_module

    def broken(*args, **kwargs):
        raise SynthError("plot failed")

    monkeypatch.setattr(tune_module, "plot_set", broken)
    with pytest.raises(SynthError, match="plot failed"):
        write_set(result, tmp_path / "set")
    assert sorted(os.listdir(tmp_path)) == ["mine"]       # no half-written set, no temporary directory


def test_cli_tune_table_json_and_errors(cache, tmp_path):
    args = ["tune", "-t", TOPOLOGY, "-c", ",".join(COLLECTIVES), "--sizes", SIZES, "-f", "4", "--stride", "2",
            "--cache-dir", str(cache)]
    res = invoke(*args, "-o", str(tmp_path / "set"))
    assert res.exit_code == 0, res.output
    assert "export MSCCL_ALGO_DIR=" in res.output and "msccl-executor/" in res.output
    assert "(0 computed" in res.output     # every row came from the cache the fixtures filled
    res = invoke(*args, "-o", str(tmp_path / "set"), "--json")      # an earlier set is replaced
    doc = json.loads(res.output)
    assert doc["format"] == "synth-tune" and doc["bands"] and doc["computed"] == 0
    bad_cases = ((["--sizes", "4GiB..1KiB"], "larger than"), (["-c", "gather", "--runtime", "msccl"], "does not load"),
                 (["--exclude-link", "0:5"], "no link"))
    for bad, message in bad_cases:
        res = invoke("tune", "-t", TOPOLOGY, "-c", "allgather", "-o", str(tmp_path / "bad"), "--no-cache", *bad)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert message in res.output and res.output.count("\n") == 1, res.output
        assert not (tmp_path / "bad").exists()


def test_cli_tune_on_a_degraded_fabric(tmp_path):
    res = invoke("tune", "-t", TOPOLOGY, "-c", "allgather", "--sizes", "1MiB", "--exclude-link", "0:1", "--no-cache",
                 "-o", str(tmp_path / "set"), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["degraded"]["excluded_links"] and doc["fabric_sha256"] != load_topology(TOPOLOGY).sha256
    for band in doc["bands"]:
        if band["file"]:
            program = load_program(tmp_path / "set" / band["file"])
            sends = {(g.id, tb.send) for g in program.gpus for tb in g.threadblocks if tb.send >= 0}
            assert (0, 1) not in sends and (1, 0) not in sends


# ---- the sweep keeps programs ---------------------------------------------------------------------
def test_sweep_keeps_programs_and_caches_them(tmp_path):
    topology = load_topology(TOPOLOGY)
    first = run_sweep([topology], ["allgather"], [MiB], ["ring"], cache_dir=tmp_path, programs=True)
    assert first.computed == 1 and first.programs[0] is not None and first.programs[0].collective == "allgather"
    again = run_sweep([topology], ["allgather"], [MiB], ["ring"], cache_dir=tmp_path, programs=True)
    assert again.cached == 1 and again.programs[0] == first.programs[0]
    # a row cached without its program is computed again when programs are asked for
    plain = run_sweep([topology], ["allgather"], [2 * MiB], ["ring"], cache_dir=tmp_path)
    assert plain.programs == []
    kept = run_sweep([topology], ["allgather"], [2 * MiB], ["ring"], cache_dir=tmp_path, programs=True)
    assert kept.computed == 1 and kept.programs[0] is not None
    # in-place rows have keys of their own
    inplace = run_sweep([topology], ["allgather"], [MiB], ["ring"], cache_dir=tmp_path, programs=True, inplace=True)
    assert inplace.computed == 1 and inplace.programs[0].inplace and not first.programs[0].inplace


def test_profiles_file_limits_are_what_tune_enforces():
    assert runtime_profile("msccl").max_files == 4 and runtime_profile("msccl-executor").max_files == 1024

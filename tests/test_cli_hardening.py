"""Behaviour a new user hits at the edges: file modes, output paths, missing extras, runtime spellings."""

import os
import stat

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.fileio import atomic_write_text


def test_atomic_write_honours_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "out.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_generate_rejects_unknown_extension(tmp_path):
    target = tmp_path / "r.txt"
    result = CliRunner().invoke(cli, ["topology", "generate", "ring", "-n", "4", "-o", str(target)])
    assert result.exit_code == 2
    assert "extension" in result.output and "Traceback" not in result.output
    assert not target.exists()


def test_generate_unwritable_path_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = CliRunner().invoke(cli, ["topology", "generate", "ring", "-n", "4", "-o", str(blocker / "r.yaml")])
    assert result.exit_code == 2
    assert "cannot write topology file" in result.output
    assert "internal error" not in result.output


def test_execute_without_torch_names_the_extra(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    fixture = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "fixtures", "msccl", "allgather_ring_4.xml")
    program = tmp_path / "p.xml"
    if os.path.exists(fixture):
        program.write_text(open(fixture).read())
    else:  # a clean clone without shared/: write a program with synth itself
        CliRunner().invoke(cli, ["synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-o", str(program)])
    result = CliRunner().invoke(cli, ["execute", str(program), "-s", "1K"])
    assert result.exit_code == 2
    assert "needs torch" in result.output


def test_reducescatter_default_spelling_is_the_maintained_runtimes(tmp_path):
    out = tmp_path / "rs.xml"
    result = CliRunner().invoke(cli, ["synthesize", "-t", "ring-8", "-c", "reducescatter", "-m", "ring", "-s", "1M",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert 'coll="reducescatter"' in out.read_text()
    out2 = tmp_path / "rs2.xml"
    result = CliRunner().invoke(cli, ["synthesize", "-t", "ring-8", "-c", "reducescatter", "-m", "ring", "-s", "1M",
                                      "--coll-spelling", "reduce_scatter", "-o", str(out2)])
    assert result.exit_code == 0, result.output
    assert 'coll="reduce_scatter"' in out2.read_text()


def test_unknown_solver_is_refused_up_front(tmp_path):
    out = tmp_path / "a.xml"
    result = CliRunner().invoke(cli, ["synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "--solver",
                                      "nosuch", "-o", str(out)])
    assert result.exit_code == 2 and "unknown solver" in result.output
    assert not out.exists()


def test_optimal_needs_a_closed_gap():
    from synth.pipeline import status_of

    assert status_of("exact", 0.0) == "optimal"
    assert status_of("exact", 0.4) == "feasible"
    assert status_of("exact", None) == "feasible"
    assert status_of("heuristic", 0.0) == "heuristic"


def test_indivisible_size_is_noted_and_size_is_an_integer(tmp_path):
    import json

    out = tmp_path / "a.json"
    result = CliRunner().invoke(cli, ["synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-s", "1000",
                                      "--chunks", "3", "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["size_bytes"] == 1000 and isinstance(payload["size_bytes"], int)
    assert any("nchunksperloop divides" in note for note in payload["notes"])


def test_bare_synth_lists_the_commands():
    result = CliRunner().invoke(cli, [])
    assert result.exit_code == 0
    assert "synthesize" in result.output and "verify" in result.output


@pytest.mark.parametrize("method,collective,unfinished", [
    ("greedy", "alltoall", "ran out before its 4 runs finished"),
    # the all-pairs baselines check --time-limit as they route (a 256-rank torus alltoall took 45 s under 10)
    ("direct", "alltoall", "ran out before it had planned every transfer"),
    ("dbt", "allreduce", "ran out before it had planned every transfer"),
])
def test_heuristic_time_out_is_one_line_and_writes_nothing(tmp_path, method, collective, unfinished):
    # a heuristic past --time-limit stops: exit 2, one line naming the method and the time-out
    out = tmp_path / "prog.xml"
    result = CliRunner().invoke(cli, ["synthesize", "-t", "torus-4x4", "-c", collective, "-m", method,
                                      "--time-limit", "1e-9", "-o", str(out)])
    assert result.exit_code == 2
    assert f"{method}: the time limit (1e-09 s)" in result.output and unfinished in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()



# ---- option and output edges found by a second fuzz pass (docs/cli.md: bad input is one error line, exit 2) ----
def _ring_program(tmp_path, name="ag.json"):
    program = tmp_path / name
    result = CliRunner().invoke(cli, ["synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-s", "1M",
                                      "-o", str(program)])
    assert result.exit_code == 0, result.output
    return program


@pytest.mark.parametrize("args", [["--min-bytes", "0"], ["--max-bytes", "0"], ["--min-bytes", "0", "--max-bytes", "0"]])
def test_byte_range_zero_is_a_value(tmp_path, args):
    # 0 is --min-bytes' default and msccl-executor's "no limit" for --max-bytes; both used to be refused as sizes
    out = tmp_path / "p.xml"
    result = CliRunner().invoke(cli, ["synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-s", "1M",
                                      *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert 'minBytes="0" maxBytes="0"' in out.read_text()
    converted = tmp_path / "c.xml"
    result = CliRunner().invoke(cli, ["convert", str(out), *args, "-o", str(converted)])
    assert result.exit_code == 0, result.output


def test_max_bytes_zero_on_msccl_names_the_runtime(tmp_path):
    out = tmp_path / "p.xml"
    result = CliRunner().invoke(cli, ["synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-s", "1M",
                                      "--runtime", "msccl", "--max-bytes", "0", "-o", str(out)])
    assert result.exit_code == 2
    assert "no limit only in msccl-executor" in result.output
    assert not out.exists()


@pytest.mark.parametrize("size", ["0", "-1", "nan", ""])
def test_verify_size_is_checked_for_json_programs(tmp_path, size):
    # -s was parsed only for XML programs: a JSON program verified "ok" (exit 0) with -s 0 or -s nan
    program = _ring_program(tmp_path)
    result = CliRunner().invoke(cli, ["verify", str(program), "--runtime", "msccl", "-s", size])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "size" in result.output


@pytest.mark.parametrize("command", [["plot", "{prog}", "--kind", "links", "-o", "{out}"],
                                     ["simulate", "{prog}", "--gantt", "{out}"]])
def test_image_write_failure_is_one_line(tmp_path, command):
    program = _ring_program(tmp_path)
    args = [a.format(prog=program, out="/dev/full") for a in command]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "cannot write image" in result.output and "internal error" not in result.output


@pytest.mark.parametrize("command", [["plot", "{prog}", "--kind", "links", "-o", ""],
                                     ["simulate", "{prog}", "--gantt", ""],
                                     ["topology", "generate", "ring", "-n", "4", "-o", ""],
                                     ["topology", "degrade", "ring-8", "--degrade", "0:1=0.5", "-o", ""],
                                     ["convert", "{prog}", "-o", ""],
                                     ["synthesize", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-o", ""],
                                     ["sweep", "-t", "ring-8", "-c", "allgather", "-m", "ring", "-s", "1K",
                                      "--no-cache", "-o", ""]])
def test_empty_output_path_is_refused(tmp_path, monkeypatch, command):
    # -o '' was: plot an internal error (renaming the image over '.'), simulate --gantt '' no image and exit 0,
    # topology generate/degrade the YAML on stdout and exit 0
    program = _ring_program(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(cli, [a.format(prog=program) for a in command])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "empty path" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before

"""`synth topology list|show|validate|generate` through click's CliRunner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.cli import cli
from synth.topology.io import load_topology


def run(*args: str):
    # mix_stderr was removed in click 8.2; stderr is captured separately there by default.
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    return runner.invoke(cli, list(args), catch_exceptions=False)


def test_list_json():
    result = run("topology", "list", "--json")
    assert result.exit_code == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)["topologies"]}
    assert {"dgx1", "dgx-a100-2node", "torus-3x3x3", "mi250"} <= set(rows)
    assert rows["dgx1"]["ranks"] == 8 and rows["dgx1"]["switches"] == 0 and rows["dgx1"]["links"] == 32
    assert rows["dgx-a100-2node"]["switches"] == 20


def test_list_table():
    result = run("topology", "list")
    assert result.exit_code == 0 and "dgx1" in result.stdout


def test_show_dgx1_json_diameter_2():
    result = run("topology", "show", "dgx1", "--json")
    assert result.exit_code == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["name"] == "dgx1" and info["ranks"] == 8 and info["switches"] == 0
    assert info["links"] == 32 and info["diameter"] == 2
    assert info["per_rank"][0] == {"rank": 0, "in_bw_GBps": 150.0, "out_bw_GBps": 150.0}


def test_show_table_and_switch_topology():
    result = run("topology", "show", "dgx-a100-2node")
    assert result.exit_code == 0
    assert "diameter 6" in result.stdout and "b0.nvswitch" in result.stdout
    info = json.loads(run("topology", "show", "dgx-a100-2node", "--json").stdout)
    assert info["diameter"] == 6 and info["per_rank"][3]["out_bw_GBps"] == 325.0


def test_show_names_links_circuits_cap():
    # leaf-spine-4x4: 100 GB/s leaf-spine links under 50 GB/s rank links; a transfer holds its route
    info = json.loads(run("topology", "show", "leaf-spine-4x4", "--json").stdout)
    capped = info["circuit_capped_links"]
    assert len(capped) == 16 and {c["circuit_GBps"] for c in capped} == {50.0}
    assert {"src": "leaf0", "dst": "spine0", "bw_GBps": 100.0, "circuit_GBps": 50.0} in capped
    assert "16 link directions move less than their bandwidth" in run("topology", "show", "leaf-spine-4x4").stdout
    assert json.loads(run("topology", "show", "dgx1", "--json").stdout)["circuit_capped_links"] == []


def test_validate_ok_and_json(tmp_path):
    result = run("topology", "generate", "torus", "--dims", "3x3x3", "-o", str(tmp_path / "t.yaml"))
    assert result.exit_code == 0
    ok = run("topology", "validate", str(tmp_path / "t.yaml"))
    assert ok.exit_code == 0 and ok.stdout.startswith("ok: ") and "27 ranks" in ok.stdout
    info = json.loads(run("topology", "validate", str(tmp_path / "t.yaml"), "--json").stdout)
    assert info == {"ok": True, "file": str(tmp_path / "t.yaml"), "name": "torus-3x3x3", "ranks": 27,
                    "switches": 0, "links": 162, "diameter": 3}


BAD = {
    "unknown.yaml": ("name: u\nranks: 2\nlinks:\n  - {src: 0, dst: 7, bw: 1}\n", "links[0].dst: unknown node 7"),
    "loop.yaml": ("name: l\nranks: 2\nlinks:\n  - {src: 0, dst: 1, bw: 1}\n  - {src: 1, dst: 1, bw: 1}\n",
                  "links[1]: self-loop"),
    "negbw.yaml": ("name: n\nranks: 2\nlinks:\n  - {src: 0, dst: 1, bw: -3}\n", "links[0].bw: must be >= 1e-06"),
    "disc.yaml": ("name: d\nranks: 4\nlinks:\n  - {src: 0, dst: 1, bw: 1}\n  - {src: 2, dst: 3, bw: 1}\n",
                  "rank 0 cannot reach rank 2"),
    "iso.json": ('{"name": "i", "ranks": 2, "switches": ["s"], "links": [{"src": 0, "dst": 1, "bw": 1}]}',
                 "switches[0]: switch 's' is isolated"),
    "syntax.yaml": ("name: [x\n", "malformed YAML"),
}


@pytest.mark.parametrize("filename", sorted(BAD))
def test_validate_bad_files_exit_2_with_one_line(tmp_path, filename):
    text, needle = BAD[filename]
    path = tmp_path / filename
    path.write_text(text)
    for extra in ([], ["--json"]):
        result = run("topology", "validate", str(path), *extra)
        assert result.exit_code == 2
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and needle in lines[0], lines
        assert "Traceback" not in result.stderr


def test_show_unknown_topology_exit_2():
    result = run("topology", "show", "no-such-thing")
    assert result.exit_code == 2 and "no built-in topology" in result.stderr


@pytest.mark.parametrize(
    "args, ranks, switches",
    [
        (["ring", "-n", "6"], 6, 0),
        (["ring", "-n", "6", "--unidirectional"], 6, 0),
        (["line", "-n", "4", "--bw", "10", "--alpha", "1"], 4, 0),
        (["fully-connected", "-n", "5"], 5, 0),
        (["mesh", "--dims", "2x3"], 6, 0),
        (["torus", "--dims", "4x4"], 16, 0),
        (["hypercube", "--dim", "3"], 8, 0),
        (["hypercube", "-n", "16"], 16, 0),
        (["star", "-n", "4"], 4, 1),
        (["leaf-spine", "--leaves", "2", "--per-leaf", "3", "--spines", "2"], 6, 4),
        (["fat-tree", "--leaves", "2", "--per-leaf", "2"], 4, 3),
        (["boxes", "--boxes", "2", "--per-box", "4", "--bw", "300", "--ib-switches", "2"], 8, 2 + 8 + 2),
        (["boxes", "--boxes", "2", "--per-box", "4", "--intra", "mesh", "--nics-per-box", "0"], 8, 1),
    ],
)
def test_generate_kinds(tmp_path, args, ranks, switches):
    out = tmp_path / "g.json"
    result = run("topology", "generate", *args, "-o", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["ranks"] == ranks and info["switches"] == switches and info["output"] == str(out)
    t = load_topology(out)
    assert t.num_ranks == ranks and len(t.links) == info["links"]


def test_generate_to_stdout_and_bw_options(tmp_path):
    result = run("topology", "generate", "line", "-n", "3", "--bw", "12.5", "--alpha", "0.25")
    assert result.exit_code == 0
    path = tmp_path / "line.yaml"
    path.write_text(result.stdout)
    t = load_topology(path)
    assert {(link.bw, link.alpha) for link in t.links} == {(12.5, 0.25)}
    js = json.loads(run("topology", "generate", "ring", "-n", "3", "--json").stdout)
    assert js["topology"]["ranks"] == 3 and js["output"] is None


@pytest.mark.parametrize(
    "args, needle",
    [
        (["mesh"], "--dims"),
        (["torus", "--dims", "4xfoo"], "--dims must look like"),
        (["ring"], "-n/--ranks"),
        (["ring", "-n", "0"], "ring size"),
        (["hypercube", "-n", "12"], "power of two"),
        (["leaf-spine", "--leaves", "2"], "--per-leaf"),
        (["boxes"], "--boxes"),
        (["ring", "-n", "4", "--bw", "-1"], "bw must be a positive"),
        (["boxes", "--boxes", "2", "--per-box", "4", "--nics-per-box", "1", "--ib-switches", "2"], "isolated"),
    ],
)
def test_generate_bad_parameters_exit_2(args, needle):
    result = run("topology", "generate", *args)
    assert result.exit_code == 2
    assert needle in result.stderr and "Traceback" not in result.stderr


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=120))
def test_validate_fuzzed_files_exit_0_or_2_with_one_line(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fz") / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    result = run("topology", "validate", str(path), "--json")
    assert result.exit_code in (0, 2)
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ")
        assert "internal error" not in lines[0]


def test_python_dash_m_synth_is_the_same_cli():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "synth", "topology", "show", "dgx1", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["diameter"] == 2
    bad = subprocess.run([sys.executable, "-m", "synth", "topology", "show", "no-such-fabric"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr

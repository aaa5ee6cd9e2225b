"""Program identity (issue 32): a program records its fabric's content hash and embeds the fabric, so
a topology of the same name but other content is never used in its place."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from synth.errors import SynthError
from synth.program.load import load_program
from synth.topology.io import load_topology, save_topology
from synth.topology.model import Link

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "synth", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _slow_dgx1(path: Path) -> Path:
    """dgx1 with every bandwidth / 10, still named dgx1."""
    dgx1 = load_topology("dgx1")
    slow = replace(dgx1, links=tuple(Link(x.src, x.dst, x.bw / 10, x.alpha) for x in dgx1.links))
    save_topology(slow, path)
    return path


def _time(result: subprocess.CompletedProcess) -> float:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["time_us"]


@pytest.fixture(scope="module")
def slow_program(tmp_path_factory) -> tuple[Path, Path]:
    """(the slow dgx1 file, an allgather program synthesized for it as JSON)."""
    where = tmp_path_factory.mktemp("identity")
    topo = _slow_dgx1(where / "slow.yaml")
    prog = where / "prog.json"
    made = cli("synthesize", "-t", str(topo), "-c", "allgather", "-s", "64MiB", "-m", "ring", "-o", str(prog),
               cwd=where)
    assert made.returncode == 0, made.stderr
    return topo, prog


def test_same_name_other_content_never_uses_the_builtin(slow_program):
    topo, prog = slow_program
    where = prog.parent
    slow = _time(cli("simulate", str(prog), "-t", str(topo), "--json", cwd=where))
    embedded = _time(cli("simulate", str(prog), "--json", cwd=where))
    assert embedded == slow        # the fabric in the program, not the built-in dgx1
    doc = json.loads(prog.read_text())
    assert doc["fabric"]["name"] == "dgx1"
    assert doc["fabric"]["sha256"] == load_topology(str(topo)).sha256 != load_topology("dgx1").sha256
    assert doc["fabric"]["source"] == f"file:{topo.resolve()}"


@pytest.mark.parametrize("command", [("simulate",), ("plot", "-o", "g.png")])
def test_other_fabric_of_the_same_name_is_refused(slow_program, command):
    topo, prog = slow_program
    result = cli(*command, str(prog), "-t", "dgx1", cwd=prog.parent)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    mine, builtin = load_topology(str(topo)).sha256[:12], load_topology("dgx1").sha256[:12]
    assert mine in lines[0] and builtin in lines[0]
    assert "builtin:dgx1" in lines[0] and f"file:{topo.resolve()}" in lines[0] and "-t FILE" in lines[0]


def test_builtin_program_keeps_working(tmp_path):
    prog = tmp_path / "ag.json"
    assert cli("synthesize", "-t", "dgx1", "-c", "allgather", "-s", "1MiB", "-m", "ring", "-o", str(prog),
               cwd=tmp_path).returncode == 0
    assert json.loads(prog.read_text())["fabric"]["source"] == "builtin:dgx1"
    with_t = cli("simulate", str(prog), "-t", "dgx1", "--json", cwd=tmp_path)
    assert _time(with_t) == _time(cli("simulate", str(prog), "--json", cwd=tmp_path))
    assert "warning" not in with_t.stderr


def test_hash_ignores_labels_and_order_not_content():
    dgx1 = load_topology("dgx1")
    base = dgx1.sha256
    assert len(base) == 64
    assert replace(dgx1, name="other", description="x", machines=((0, 1, 2, 3, 4, 5, 6, 7),)).sha256 == base
    assert replace(dgx1, links=tuple(reversed(dgx1.links))).sha256 == base
    first = dgx1.links[0]
    for changed in (Link(first.src, first.dst, first.bw * 1.000001, first.alpha),
                    Link(first.src, first.dst, first.bw, first.alpha + 1e-9)):
        assert replace(dgx1, links=(changed, *dgx1.links[1:])).sha256 != base


def test_old_program_without_fabric_loads_with_a_warning(slow_program, tmp_path):
    _, prog = slow_program
    doc = json.loads(prog.read_text())
    del doc["fabric"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert load_program(old).fabric is None
    result = cli("simulate", str(old), cwd=tmp_path)
    assert result.returncode == 0
    assert "warning:" in result.stderr and "unchecked" in result.stderr


def test_edited_embedded_fabric_is_refused(slow_program, tmp_path):
    _, prog = slow_program
    doc = json.loads(prog.read_text())
    doc["fabric"]["topology"]["defaults"]["alpha"] = 0.1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(SynthError, match="fabric.sha256"):
        load_program(bad)
    result = cli("execute", str(bad), cwd=tmp_path)
    assert result.returncode == 2 and "fabric.sha256" in result.stderr


def test_hash_only_program_resolves_its_recorded_source(slow_program, tmp_path):
    topo, prog = slow_program
    doc = json.loads(prog.read_text())
    del doc["fabric"]["topology"]
    lean = tmp_path / "lean.json"
    lean.write_text(json.dumps(doc))
    ok = cli("simulate", str(lean), "--json", cwd=tmp_path)
    assert _time(ok) == _time(cli("simulate", str(prog), "--json", cwd=tmp_path))
    changed = yaml.safe_load(Path(topo).read_text())
    changed["defaults"]["alpha"] = 0.1
    moved = tmp_path / "moved.yaml"
    moved.write_text(yaml.safe_dump(changed))
    doc["fabric"]["source"] = f"file:{moved}"
    lean.write_text(json.dumps(doc))
    refused = cli("simulate", str(lean), cwd=tmp_path)
    assert refused.returncode == 2 and "recorded source" in refused.stderr


def test_generate_refuses_to_shadow_a_builtin(tmp_path):
    out = tmp_path / "ring-8.yaml"
    refused = cli("topology", "generate", "ring", "-n", "8", "--bw", "10", "-o", str(out), cwd=tmp_path)
    assert refused.returncode == 2 and "shadows the built-in" in refused.stderr and not out.exists()
    assert len(refused.stderr.strip().splitlines()) == 1
    same = cli("topology", "generate", "ring", "-n", "8", "-o", str(out), cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    renamed = cli("topology", "generate", "ring", "-n", "8", "--bw", "10", "--name", "slow-ring", cwd=tmp_path)
    assert renamed.returncode == 0 and "slow-ring" in renamed.stdout


def test_api_simulate_refuses_other_content(slow_program):
    import synth

    _, prog = slow_program
    with pytest.raises(SynthError, match="was made for fabric"):
        synth.simulate(str(prog), "dgx1")


# ---- issue 33: schedules and MSCCL XML carry the fabric too ---------------------------------------------
def test_xml_records_the_fabric_in_a_comment_the_runtimes_skip(slow_program, tmp_path):
    from synth.program.load import save_program

    topo, prog = slow_program
    xml = tmp_path / "prog.xml"
    save_program(load_program(prog), xml)
    first, second = xml.read_text().splitlines()[:2]
    mine = load_topology(str(topo)).sha256
    assert first.startswith("<!-- synth fabric ") and first.endswith(" -->") and second.startswith("<algo ")
    assert f'sha256="{mine}"' in first and "--" not in first[4:-3]
    back = load_program(xml).fabric
    assert (back.name, back.sha256, back.source) == ("dgx1", mine, f"file:{topo.resolve()}")
    # simulate reads it: without -t the recorded file, with another dgx1 one line refusing it
    assert _time(cli("simulate", str(xml), "-s", "64MiB", "--json", cwd=tmp_path)) == _time(
        cli("simulate", str(prog), "-t", str(topo), "--json", cwd=tmp_path))
    refused = cli("simulate", str(xml), "-t", "dgx1", cwd=tmp_path)
    assert refused.returncode == 2 and mine[:12] in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert cli("verify", str(xml), "--runtime", "msccl-executor", cwd=tmp_path).returncode == 0
    # without the comment (foreign XML) the fabric is unknown: -t is needed, and unchecked
    foreign = tmp_path / "foreign.xml"
    foreign.write_text(xml.read_text().split("\n", 1)[1])
    assert load_program(foreign).fabric is None
    assert cli("simulate", str(foreign), cwd=tmp_path).returncode == 2


def test_fabric_comment_round_trips_odd_names_and_paths():
    from synth.program.msccl_xml import fabric_comment, fabric_from_comment
    from synth.topology.identity import Fabric

    odd = Fabric(name='a--b"<c>', sha256="0" * 64, source="file:/tmp/x--y/z -- w.yaml")
    line = fabric_comment(odd)
    assert "--" not in line[4:-3] and line.count('"') == 6
    assert fabric_from_comment(line + "\n<algo/>") == odd
    assert fabric_from_comment("<algo/>") is None


def test_the_schedule_and_program_carry_the_fabric_given():
    from synth.pipeline import synthesize
    from synth.topology import generators as gen

    ring = gen.ring(4)
    result = synthesize(ring, "allgather", 2**20, "ring")
    assert result.schedule.fabric.sha256 == result.program.fabric.sha256 == ring.sha256
    assert result.schedule.fabric.source == "generated"


def test_the_instance_holds_what_every_method_relies_on():
    from synth.collectives import Collective
    from synth.pipeline import instance
    from synth.synthesis.base import Instance, SynthOptions
    from synth.topology import generators as gen

    ring = gen.ring(4)
    with pytest.raises(SynthError, match="collective has 5 ranks but topology"):
        Instance(ring, Collective("allgather", 5), 2**20)
    with pytest.raises(SynthError, match="--chunks must be at least 1"):
        Instance(ring, Collective("allgather", 4), 2**20, SynthOptions(chunks=0))
    with pytest.raises(SynthError, match="--max-trees must be at least 1"):
        Instance(ring, Collective("allgather", 4), 2**20, SynthOptions(max_trees=0))
    with pytest.raises(SynthError, match=r"--root 4 is not a rank of ring-4 \(0..3\)"):
        instance(ring, "broadcast", 2**20, root=4)
    inst = instance(ring, "broadcast", 2**20, root=3)
    assert (inst.collective.root, inst.ranks, inst.piece_bytes, inst.fabric.sha256) == (3, 4, 2**20, ring.sha256)

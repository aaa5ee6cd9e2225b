"""What the peers write: msccl-tools' SCCL algorithms (.msccl.json), its topology JSON and its coll="custom" XML.

The fixtures under tests/fixtures/peers/ were written by msccl-tools itself (their README gives each command
and the commit). Each program verifies, simulates, executes and is re-exported; the re-exported file verifies.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.errors import SynthError
from synth.program.load import load_program, load_program_format
from synth.simulation import simulate
from synth.topology.io import load_topology
from synth.verification import verify

PEERS = Path(__file__).parent / "fixtures" / "peers"
ALLGATHER = PEERS / "dgx1_allgather_steps2.msccl.json"
BROADCAST_XML = PEERS / "dgx1_broadcast_root0.msccl.xml"
ALGORITHMS = sorted(p for p in PEERS.glob("dgx1_*.msccl.json"))
#: fixture -> (synth collective, root, chunks per rank piece)
EXPECTED = {"dgx1_allgather_steps2": ("allgather", 0, 1), "dgx1_allgather_steps3_chunks2": ("allgather", 0, 2),
            "dgx1_broadcast_root0": ("broadcast", 0, 1), "dgx1_gather_root0": ("gather", 0, 1),
            "dgx1_scatter_root0": ("scatter", 0, 1), "dgx1_reduce_root0": ("reduce", 0, 1),
            "dgx1_allreduce": ("allreduce", 0, 1), "dgx1_reducescatter": ("reducescatter", 0, 1),
            "dgx1_alltoall": ("alltoall", 0, 1)}


def _cli(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _one_error_line(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    for word in words:
        assert word in lines[0], lines[0]


# ---- SCCL algorithms ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ALGORITHMS, ids=lambda p: p.name.split(".")[0])
def test_sccl_algorithm_loads_and_verifies(path):
    program, fmt = load_program_format(path)
    name, root, chunks = EXPECTED[path.name.split(".")[0]]
    assert fmt == "sccl"
    assert (program.collective, program.root, program.chunk_factor, program.num_ranks) == (name, root, chunks, 8)
    result = verify(program)
    assert result.ok, result.errors[:5]
    # the input buffer is never written, even by the reduce (msccl-tools' own XML of it writes it, below)
    assert not any(st.dstbuf == "i" and st.type != "s" and st.type != "nop"
                   for g in program.gpus for tb in g.threadblocks for st in tb.steps)


def test_sccl_allgather_carries_dgx1_as_its_fabric():
    program = load_program(ALLGATHER)
    assert program.fabric is not None and program.fabric.topology is not None
    assert program.fabric.sha256 == load_topology("dgx1").sha256   # msccl-tools' DGX1 is synth's built-in dgx1
    # the same time with the embedded fabric and with -t dgx1; SCCL's 2 steps: every rank sends its chunk, then
    # forwards; 56 chunk transfers, one per (rank, missing chunk), some merged into one message
    result = _cli("simulate", ALLGATHER, "-s", "64MiB", "--json")
    assert result.exit_code == 0, result.output
    embedded = json.loads(result.output)
    result = _cli("simulate", ALLGATHER, "-t", "dgx1", "-s", "64MiB", "--json")
    assert result.exit_code == 0, result.output
    given = json.loads(result.output)
    assert embedded["time_us"] == given["time_us"] > 0
    assert given["transfers"] <= 56


def test_sccl_allgather_is_as_fast_as_msccl_tools_own_xml_of_it():
    """msccl-tools' ``ncclize`` of the same algorithm is its reference lowering; ours times the same."""
    ours = load_program(ALLGATHER)
    theirs = load_program(PEERS / "dgx1_allgather_steps2.msccl.xml")
    topology = load_topology("dgx1")
    for size in (2**20, 64 * 2**20):
        assert simulate(ours, topology, size).time_us == pytest.approx(simulate(theirs, topology, size).time_us)


# ---- coll="custom" XML --------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [("verify",), ("simulate", "-t", "dgx1"), ("execute", "-s", "1K"),
                                     ("convert", "-o", "OUT.json"), ("plot", "-t", "dgx1", "-o", "OUT.png")])
def test_custom_xml_needs_a_collective(command, tmp_path):
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    result = _cli(args[0], BROADCAST_XML, *args[1:])
    _one_error_line(result, "coll='custom'", "-c/--collective")
    assert not list(tmp_path.iterdir())


def test_custom_broadcast_verifies_and_simulates_with_c():
    result = _cli("verify", BROADCAST_XML, "-c", "broadcast")
    assert result.exit_code == 0 and "implements broadcast on 8 ranks" in result.output, result.output
    result = _cli("simulate", BROADCAST_XML, "-t", "dgx1", "-c", "broadcast", "--root", "0", "-s", "1MiB", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["time_us"] > 0
    # another root is another collective: the program's sends start at rank 0
    result = _cli("verify", BROADCAST_XML, "-c", "broadcast", "--root", "3")
    assert result.exit_code == 1 and "holds no data" in result.output
    _one_error_line(_cli("simulate", BROADCAST_XML, "-t", "dgx1", "-c", "broadcast", "--root", "9"), "--root 9")
    _one_error_line(_cli("simulate", BROADCAST_XML, "-t", "dgx1", "-c", "scan"), "unknown collective")


def test_custom_broadcast_plots_with_c(tmp_path):
    out = tmp_path / "gantt.png"
    result = _cli("plot", BROADCAST_XML, "-t", "dgx1", "-c", "broadcast", "--root", "0", "-s", "1MiB", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_msccl_tools_reduce_xml_writes_its_input():
    """msccl-tools' XML of SCCL's reduce accumulates into the input buffer (out of place), which synth refuses;
    synth's own import of the same algorithm does not (test_sccl_algorithm_loads_and_verifies)."""
    result = _cli("verify", PEERS / "dgx1_reduce_root0.msccl.xml", "-c", "reduce")
    assert result.exit_code == 1 and "writes input buffer" in result.output


# ---- re-export ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("source,extra", [(ALLGATHER, ()), (PEERS / "dgx1_reduce_root0.msccl.json", ()),
                                          (BROADCAST_XML, ("-c", "broadcast", "--root", "0"))],
                         ids=["sccl-allgather", "sccl-reduce", "custom-broadcast"])
def test_convert_writes_files_that_verify(source, extra, tmp_path):
    expected = load_program(source).with_(collective=extra[1]) if extra else load_program(source)
    for suffix in (".xml", ".json"):
        out = tmp_path / f"out{suffix}"
        result = _cli("convert", source, *extra, "-o", out, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["verified"] is True
        again = load_program(out)
        assert again.collective == expected.collective and again.gpus == expected.gpus
        check = _cli("verify", out)
        assert check.exit_code == 0, check.output
    if source.suffix == ".json":   # the JSON program keeps the fabric: simulate needs no -t
        result = _cli("simulate", tmp_path / "out.json", "-s", "1MiB", "--json")
        assert result.exit_code == 0, result.output


def test_convert_for_microsoft_msccl_needs_a_size_range(tmp_path):
    out = tmp_path / "ag.xml"
    _one_error_line(_cli("convert", ALLGATHER, "--runtime", "msccl", "-o", out), "--max-bytes")
    assert not out.exists()
    result = _cli("convert", ALLGATHER, "--runtime", "msccl", "--max-bytes", "64MiB", "-o", out)
    assert result.exit_code == 0, result.output
    assert 'maxBytes="67108865"' in out.read_text() and "outofplace" not in out.read_text()
    result = _cli("verify", out, "--runtime", "msccl", "-s", "64MiB")   # that runtime loads and selects it
    assert result.exit_code == 0, result.output


def test_convert_refuses_a_wrong_program(tmp_path):
    out = tmp_path / "r.xml"
    result = _cli("convert", PEERS / "dgx1_reduce_root0.msccl.xml", "-c", "reduce", "-o", out)
    assert result.exit_code == 1 and "nothing written" in result.output
    assert not out.exists()


# ---- execute (one launch for the programs, one CLI run) --------------------------------------------------------

def test_peer_programs_execute():
    torch = pytest.importorskip("torch")  # noqa: F841
    from synth.execution.runner import execute_many

    programs = [load_program(p) for p in ALGORITHMS if "chunks2" not in p.name]
    programs.append(load_program(BROADCAST_XML).with_(collective="broadcast"))
    results = execute_many(programs, size_bytes=8 * 4 * 16, iters=1, warmup=0, dtype="int64")
    for r in results:
        assert r.ok, (r.program, r.errors)
    assert sorted(r.collective for r in results) == ["allgather", "allreduce", "alltoall", "broadcast", "broadcast",
                                                      "gather", "reduce", "reducescatter", "scatter"]


def test_custom_broadcast_executes_from_the_cli():
    pytest.importorskip("torch")
    result = _cli("execute", BROADCAST_XML, "-c", "broadcast", "-s", "1K", "--iters", "1", "--warmup", "0", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["ok"] is True and payload["collective"] == "broadcast" and payload["ranks"] == 8


# ---- msccl-tools topologies --------------------------------------------------------------------------------

def test_msccl_tools_topologies_are_the_builtins():
    assert load_topology(PEERS / "dgx1.topology.msccl.json").sha256 == load_topology("dgx1").sha256
    assert load_topology(PEERS / "dgx_a100.topology.msccl.json").sha256 == load_topology("dgx-a100").sha256
    hub = load_topology(PEERS / "hub_and_spoke4.topology.msccl.json")
    assert hub.num_ranks == 4 and len(hub.switches) == 1
    assert sorted((link.src, link.dst, link.bw) for link in hub.links if link.src < 4) == \
        [(r, 4, 25.0) for r in range(4)]


def test_topology_import_detects_msccl_tools(tmp_path):
    out = tmp_path / "dgx1.yaml"
    result = _cli("topology", "import", PEERS / "dgx1.topology.msccl.json", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    assert load_topology(out).sha256 == load_topology("dgx1").sha256
    result = _cli("synthesize", "-t", PEERS / "dgx1.topology.msccl.json", "-c", "allgather", "-m", "ring",
                  "-s", "1M", "-o", tmp_path / "ring.json")
    assert result.exit_code == 0, result.output


# ---- malformed inputs: exit 2, one line --------------------------------------------------------------------

def _mutate(doc: dict, how: str) -> dict:
    doc = copy.deepcopy(doc)
    if how == "no-steps":
        del doc["steps"]
    elif how == "unheld-send":
        doc["steps"][0]["sends"][0] = [5, 0, 1]          # rank 0 does not hold address 5 in step 1
    elif how == "self-send":
        doc["steps"][0]["sends"][0] = [0, 0, 0]
    elif how == "rank-out-of-range":
        doc["steps"][0]["sends"][0] = [0, 0, 8]
    elif how == "pipelined":
        doc["instance"]["pipeline"] = 2
    elif how == "no-collective":
        del doc["collective"]
    elif how == "bad-map":
        doc["input_map"]["0"] = "zero"
    elif how == "a-collective-object":
        doc = doc["collective"]
    elif how == "not-a-send":
        doc["steps"][1]["sends"][0] = [1, 2]
    return doc


@pytest.mark.parametrize("how", ["no-steps", "unheld-send", "self-send", "rank-out-of-range", "pipelined",
                                 "no-collective", "bad-map", "a-collective-object", "not-a-send"])
def test_malformed_sccl_algorithm_is_one_line(how, tmp_path):
    bad = tmp_path / "bad.msccl.json"
    bad.write_text(json.dumps(_mutate(json.loads(ALLGATHER.read_text()), how)))
    with pytest.raises(SynthError):
        load_program(bad)
    for command in (("verify",), ("simulate",), ("convert", "-o", tmp_path / "x.xml")):
        _one_error_line(_cli(command[0], bad, *command[1:]), "bad.msccl.json")


@pytest.mark.parametrize("how,words", [
    ("asymmetric", "not symmetric"), ("not-square", "must be 8 x 8"), ("self-link", "to itself"),
    ("odd-switch", "crossbar"), ("negative", "non-negative"),
])
def test_malformed_msccl_tools_topology_is_one_line(how, words, tmp_path):
    doc = json.loads((PEERS / "dgx1.topology.msccl.json").read_text())
    if how == "asymmetric":
        doc["links"][0][1] = 3
    elif how == "not-square":
        doc["links"][3] = doc["links"][3][:5]
    elif how == "self-link":
        doc["links"][2][2] = 1
    elif how == "odd-switch":
        doc["switches"] = [[[0, 1], [2, 3], 1, "pair"]]
    else:
        doc["links"][4][0] = -2
    bad = tmp_path / "bad.topology.json"
    bad.write_text(json.dumps(doc))
    _one_error_line(_cli("topology", "show", bad), words)
    _one_error_line(_cli("topology", "import", bad), words)

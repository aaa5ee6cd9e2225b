"""`synth topology import` (issue 34, item 1): every fixture imports to a topology that validates with the source's
ranks, NVLink/xGMI multiplicities and NICs; dgx1 and mi250 imports equal the built-ins; detection, overrides,
--nodes, and malformed input (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.errors import SynthError
from synth.topology import importers as im
from synth.topology.families import MI250_XGMI
from synth.topology.io import load_topology

FIXTURES = Path(__file__).parent / "fixtures" / "import"
REPO = Path(__file__).resolve().parents[1]

# fixture: (format, GPUs, NICs used, direct link count matrix row 0 or None, NVSwitch links per GPU)
EXPECTED = {
    "dgx1-v100.nvidia-smi.txt": ("nvidia-smi", 8, 4, (0, 2, 1, 1, 2, 0, 0, 0), 0),
    "dgx-a100.nvidia-smi.txt": ("nvidia-smi", 8, 8, None, 12),
    "dgx-h100.nvidia-smi.txt": ("nvidia-smi", 8, 8, None, 18),
    "pcie-8gpu.nvidia-smi.txt": ("nvidia-smi", 8, 1, (0,) * 8, 0),
    "mi250.rocm-smi.txt": ("rocm-smi", 16, 0, MI250_XGMI[0], 0),
    "dgx1-4gpu.nccl-topo.xml": ("nccl-xml", 4, 2, (0, 1, 1, 2), 0),
    "dgx-a100.nccl-topo.xml": ("nccl-xml", 8, 8, None, 12),
}


def run(*args: str):
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    return runner.invoke(cli, list(args), catch_exceptions=False)


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def undirected(topology) -> dict[tuple, float]:
    return {(topology.node_name(link.src), topology.node_name(link.dst)): link.bw for link in topology.links}


def test_every_fixture_has_a_source_line():
    for path in FIXTURES.iterdir():
        head = path.read_text()[:1200]
        assert "Source: https://" in head or "RECONSTRUCTED" in head, path.name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_imports_and_validates(name, tmp_path):
    fmt, gpus, nics, row0, switch = EXPECTED[name]
    assert im.detect_format(text(name)) == fmt
    box = im.parse(text(name))
    assert box.gpus == gpus and len(box.nics) == nics
    assert set(box.switch_links) == {switch}
    if row0 is not None:
        assert box.links[0] == tuple(row0)
    out = tmp_path / "t.yaml"
    result = run("topology", "import", str(FIXTURES / name), "-o", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["ranks"] == gpus and info["nics"] == nics and info["format"] == fmt
    loaded = load_topology(str(out))  # the normal loader validates it
    assert loaded.num_ranks == gpus and loaded.machines == (tuple(range(gpus)),)
    if switch:
        assert loaded.switches == ("nvswitch",)
        assert {bw for (a, _), bw in undirected(loaded).items() if isinstance(a, int)} == {switch * 25.0}


def test_dgx1_import_is_the_builtin_dgx1():
    _, topology = im.import_topology(text("dgx1-v100.nvidia-smi.txt"), name="dgx1")
    builtin = load_topology("dgx1")
    assert topology.links == builtin.links and topology.sha256 == builtin.sha256


def test_mi250_import_is_the_builtin_mi250():
    _, topology = im.import_topology(text("mi250.rocm-smi.txt"), name="mi250")
    assert topology.sha256 == load_topology("mi250").sha256


def test_nvswitch_imports_are_the_builtin_boxes():
    for name in ("dgx-a100.nvidia-smi.txt", "dgx-a100.nccl-topo.xml"):
        _, topology = im.import_topology(text(name), name="dgx-a100")
        assert topology.sha256 == load_topology("dgx-a100").sha256, name


def test_two_nodes_are_the_builtin_two_node_fabrics():
    _, a100 = im.import_topology(text("dgx-a100.nvidia-smi.txt"), nodes=2, ib_switches=2)
    assert a100.sha256 == load_topology("dgx-a100-2node").sha256
    _, h100 = im.import_topology(text("dgx-h100.nvidia-smi.txt"), nodes=2, ib_switches=2)
    assert h100.sha256 == load_topology("dgx-h100-2node").sha256
    _, mi250 = im.import_topology(text("mi250.rocm-smi.txt"), params=im.ImportParams(nic_bw=16), nodes=2)
    assert mi250.sha256 == load_topology("mi250-2node").sha256


def test_nodes_cli_writes_machines_and_nics(tmp_path):
    out = tmp_path / "two.yaml"
    result = run("topology", "import", str(FIXTURES / "dgx1-v100.nvidia-smi.txt"), "--nodes", "2", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    topology = load_topology(str(out))
    assert topology.num_ranks == 16 and topology.machines == (tuple(range(8)), tuple(range(8, 16)))
    nics = [s for s in topology.switches if ".nic" in s]
    assert len(nics) == 8 and "ib0" in topology.switches  # 4 NICs per box, two GPUs each (PIX affinity)
    links = undirected(topology)
    assert links[(0, "b0.nic0")] == links[(1, "b0.nic0")] == 12.5  # EDR default for an NVLink2 box
    assert links[("b1.nic3", "ib0")] == 12.5


def test_pcie_box_is_a_switch_tree():
    _, topology = im.import_topology(text("pcie-8gpu.nvidia-smi.txt"))
    assert topology.switches == ("pix0", "pix1", "pix2", "pix3", "phb0", "phb1", "sys0")
    links = undirected(topology)
    assert links[(0, "pix0")] == links[("pix0", "phb0")] == links[("phb1", "sys0")] == 32.0
    assert not any(isinstance(a, int) and isinstance(b, int) for a, b in links)


def test_overrides(tmp_path):
    params = im.parse_settings(["link_bw=20", "link-alpha=0.4", "nic_bw=50", "ib_alpha=3"])
    _, topology = im.import_topology(text("dgx1-4gpu.nccl-topo.xml"), params=params, nodes=2)
    links = {(topology.node_name(x.src), topology.node_name(x.dst)): x for x in topology.links}
    assert links[(0, 3)].bw == 40 and links[(0, 3)].alpha == 0.4
    assert links[("b0.nic0", "ib0")].bw == 50 and links[("b0.nic0", "ib0")].alpha == 3
    out = tmp_path / "p.yaml"
    result = run("topology", "import", str(FIXTURES / "pcie-8gpu.nvidia-smi.txt"), "--set", "pcie_bw=16",
                 "--set", "pcie_alpha=2", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert {(x.bw, x.alpha) for x in load_topology(str(out)).links} == {(16.0, 2.0)}
    for bad in ("link_bw=0", "nope=1", "nic_bw=x", "ib_alpha=-1", "link_bw"):
        with pytest.raises(SynthError):
            im.parse_settings([bad])


def test_format_option_and_detection():
    assert run("topology", "import", str(FIXTURES / "mi250.rocm-smi.txt"), "--format", "rocm-smi",
               "--json").exit_code == 0
    with pytest.raises(SynthError, match="cannot tell the format"):
        im.detect_format("hello\nworld\n")
    with pytest.raises(SynthError):
        im.parse(text("mi250.rocm-smi.txt"), "nvidia-smi")


def test_rocm_without_bandwidth_table_counts_one_link_per_direct_pair():
    cut = text("mi250.rocm-smi.txt").split("= Bandwidth =")[0]
    box = im.parse(cut)
    assert box.links[0][1] == 1 and box.links[0][2] == 0 and box.notes


def _synth(*args: str) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("SYNTH_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "synth", *args], capture_output=True, text=True, timeout=60, env=env)


NV = text("dgx-a100.nvidia-smi.txt")
MALFORMED = {
    "empty.txt": "",
    "garbage.txt": "\x00\x01 not a topology at all\n",
    "asym.txt": NV.replace("GPU1    NV12     X", "GPU1    NV4      X", 1),
    "cell.txt": NV.replace("NV12    NV12     X      NV12", "NV12    NV12     X      NVX", 1),
    "missing-row.txt": "\n".join(line for line in NV.splitlines() if not line.startswith("GPU3")),
    "rocm-bw.txt": text("mi250.rocm-smi.txt").replace("50000-200000", "50000-123", 1),
    "rocm-type.txt": text("mi250.rocm-smi.txt").replace("0            XGMI", "0            FOO", 1),
    "broken.xml": "<system version='1'><cpu><pci busid='0000:01:00.0'><gpu dev='0'",
    "entity.xml": "<!DOCTYPE s [<!ENTITY a 'x'>]><system>&a;</system>",
    "nogpu.xml": "<system version='1'><cpu numaid='0'/></system>",
    "badrank.xml": "<system><cpu><pci busid='a'><gpu rank='x'/></pci></cpu></system>",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_input_exit_2_one_line(name, tmp_path):
    path = tmp_path / name
    path.write_bytes(MALFORMED[name].encode("utf-8"))
    result = _synth("topology", "import", str(path), "-o", str(tmp_path / "out.yaml"))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not (tmp_path / "out.yaml").exists()


def test_bad_options_exit_2(tmp_path):
    src = str(FIXTURES / "dgx-a100.nvidia-smi.txt")
    for args in (["--nodes", "0"], ["--ib-switches", "99", "--nodes", "2"], ["--set", "zzz=1"]):
        result = run("topology", "import", src, *args)
        assert result.exit_code == 2 and "error:" in result.stderr, args
    result = run("topology", "import", src, "--name", "dgx1")  # would shadow the built-in with other content
    assert result.exit_code == 2 and "shadows" in result.stderr

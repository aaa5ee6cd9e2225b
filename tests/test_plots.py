"""synth.plots and `synth plot`: topology drawings, link heatmaps, gantt charts, gap plots (Agg, real PNGs)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from synth import plots
from synth.cli import cli
from synth.errors import SynthError
from synth.pipeline import synthesize
from synth.program.load import save_program
from synth.simulation import simulate
from synth.sweep import run_sweep, write_table
from synth.topology import generators as gen
from synth.topology.io import load_topology

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def png_shape(path) -> tuple[int, int]:
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    img = mpimg.imread(path)
    return img.shape[0], img.shape[1]


def test_layout_places_every_node_apart():
    for name in ("dgx1", "dgx-a100-2node", "ndv2-2node", "mi250-2node", "leaf-spine-4x4", "torus-4x4"):
        topo = load_topology(name)
        pos = plots.topology_layout(topo)
        assert set(pos) == set(range(topo.num_nodes))
        pts = list(pos.values())
        assert len(set(pts)) == len(pts), f"{name}: two nodes share a position"
        assert all(math.isfinite(x) and math.isfinite(y) for x, y in pts)


def test_layout_puts_nics_above_and_nvswitch_below_the_gpus():
    topo = load_topology("dgx-a100-2node")
    pos = plots.topology_layout(topo)
    gpu_y = {pos[r][1] for r in topo.ranks}
    assert len(gpu_y) == 1
    y = gpu_y.pop()
    nvs = topo.node_id("b0.nvswitch")
    nic = topo.node_id("b0.nic3")
    ib = topo.node_id("ib0")
    assert pos[nvs][1] < y < pos[nic][1] < pos[ib][1]
    assert pos[nic][0] == pytest.approx(pos[3][0])  # a NIC sits over its GPU


@pytest.mark.parametrize("name", ["dgx1", "dgx-a100-2node"])
def test_plot_topology_writes_a_png(tmp_path, name):
    out = plots.plot_topology(load_topology(name), tmp_path / "t.png")
    h, w = png_shape(out)
    assert h > 200 and w > 300


def test_link_matrix_matches_the_simulation():
    topo = load_topology("dgx-a100")
    res = synthesize(topo, "allgather", 2**20, "ring")
    sim = simulate(res.program, topo, 2**20)
    mat, labels = plots.link_matrix(topo, sim.link_utilization)
    assert labels[: topo.num_ranks] == [str(r) for r in topo.ranks] and labels[-1] == "nvswitch"
    assert mat.shape == (topo.num_nodes, topo.num_nodes)
    for link in topo.links:
        name = f"{topo.node_name(link.src)}->{topo.node_name(link.dst)}"
        assert mat[link.src, link.dst] == pytest.approx(sim.link_utilization.get(name, 0.0))
    assert np.isnan(mat[0, 1])  # GPUs of a DGX A100 only talk through the NVSwitch
    assert np.nanmax(mat) > 0 and np.nanmax(mat) <= 1 + 1e-9


def test_link_matrix_rejects_unknown_links():
    with pytest.raises(SynthError, match="unknown link"):
        plots.link_matrix(gen.ring(4), {"0->9": 0.5})


def test_heatmap_and_gantt_pngs(tmp_path):
    topo = load_topology("dgx1")
    res = synthesize(topo, "allreduce", 2**24, "ring")
    sim = simulate(res.program, topo, 2**24, record_events=True)
    assert png_shape(plots.plot_link_heatmap(sim, topo, tmp_path / "l.png"))[0] > 200
    assert png_shape(plots.plot_gantt(sim, topo, tmp_path / "g.png"))[0] > 150


def test_gaps_plot_and_bad_suffix_leaves_nothing(tmp_path):
    rows = run_sweep([gen.ring(4), gen.fully_connected(4)], ["allgather"], [1000, 10**6], ["ring", "greedy"],
                     cache_dir=None).rows
    out = plots.plot_gaps(rows, tmp_path / "gaps.png")
    assert png_shape(out)[1] > 500
    with pytest.raises(SynthError, match="cannot write"):
        plots.plot_gaps(rows, tmp_path / "gaps.notaformat")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gaps.png"]
    with pytest.raises(SynthError, match="no rows"):
        plots.plot_gaps([], tmp_path / "empty.png")


@pytest.fixture
def program_json(tmp_path):
    res = synthesize("dgx1", "allgather", 2**22, "ring")
    path = tmp_path / "ag.json"
    save_program(res.program, path)
    return path


@pytest.mark.parametrize("kind", ["gantt", "links", "topology"])
def test_cli_plot_program_kinds(tmp_path, program_json, kind):
    out = tmp_path / f"{kind}.png"
    res = invoke("plot", str(program_json), "--kind", kind, "-o", str(out), "-s", "4M", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"output": str(out), "kind": kind}
    assert png_shape(out)[0] > 100


def test_cli_plot_topology_without_program_and_gaps(tmp_path):
    out = tmp_path / "t.png"
    res = invoke("plot", "--kind", "topology", "-t", "dgx1", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert str(out) in res.output and png_shape(out)[0] > 100
    rows = run_sweep([gen.ring(4)], ["allreduce"], [1000, 10**6], ["ring"], cache_dir=None).rows
    table = write_table(rows, tmp_path / "r.csv")
    res = invoke("plot", str(table), "-o", str(tmp_path / "g.png"), "--json")  # kind inferred from the table
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["kind"] == "gaps" and png_shape(tmp_path / "g.png")[0] > 100


def test_cli_plot_xml_uses_its_recorded_fabric_and_foreign_xml_needs_a_topology(tmp_path):
    res = synthesize("dgx1", "allgather", 2**22, "ring")
    xml = tmp_path / "ag.xml"
    save_program(res.program, xml)
    own = invoke("plot", str(xml), "--kind", "links", "-o", str(tmp_path / "l.png"))   # its fabric comment
    assert own.exit_code == 0, own.output
    foreign = tmp_path / "foreign.xml"
    foreign.write_text(xml.read_text().split("\n", 1)[1])       # without synth's comment
    bad = invoke("plot", str(foreign), "--kind", "links", "-o", str(tmp_path / "l.png"))
    assert bad.exit_code == 2 and "pass -t" in bad.output
    good = invoke("plot", str(foreign), "--kind", "links", "-t", "dgx1", "-o", str(tmp_path / "l.png"))
    assert good.exit_code == 0, good.output


@pytest.mark.parametrize("args, message", [
    (["--kind", "gantt"], "needs a program"),
    (["--kind", "topology"], "needs -t"),
    (["--kind", "topology", "-t", "nosuch"], "nosuch"),
    (["--kind", "gaps"], "results table"),
])
def test_cli_plot_bad_input(tmp_path, args, message):
    out = tmp_path / "x.png"
    res = invoke("plot", *args, "-o", str(out))
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not out.exists()


def test_cli_plot_table_with_program_kind_is_refused(tmp_path):
    rows = run_sweep([gen.ring(4)], ["allgather"], [1000], ["ring"], cache_dir=None).rows
    table = write_table(rows, tmp_path / "r.json")
    res = invoke("plot", str(table), "--kind", "links", "-o", str(tmp_path / "x.png"))
    assert res.exit_code == 2 and "only --kind gaps" in res.output

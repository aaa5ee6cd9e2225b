"""The public fabric family (synth.topology.families) and benchmarks/bench_fabrics.py end to end."""

from __future__ import annotations

import csv
import importlib.util
import math
import re
import sys
from pathlib import Path

import networkx as nx
import pytest

from synth.errors import SynthError
from synth.lower_bounds import compute_bounds
from synth.topology import families as fam
from synth.topology import generators as gen
from synth.topology.io import load_topology, parse_topology, topology_to_dict

ROOT = Path(__file__).resolve().parent.parent
FAMILY = fam.fabric_family()
BUILT = {spec.name: spec.build() for spec in FAMILY}
BOX_RANKS = {"mi250": 16, "a100": 8, "h100": 8}


def ranks_from_name(name: str) -> int:
    """The rank count the name promises, read independently of the family's own bookkeeping."""
    name = name.removesuffix("-nomachines")
    if m := re.fullmatch(r"(mi250|a100|h100)x(\d+)(-ib[\d.]+)?", name):
        return BOX_RANKS[m[1]] * int(m[2])
    if name.startswith("mixed-"):
        total = 0
        for part in name.removeprefix("mixed-").split("-"):
            kind, _, count = part.partition("x")
            total += BOX_RANKS[kind] * int(count or 1)
        return total
    if m := re.fullmatch(r"leafspine-(\d+)x(\d+)-\dto1", name):
        return int(m[1]) * int(m[2])
    if m := re.fullmatch(r"(torus|mesh)-([\dx]+)", name):
        return math.prod(int(d) for d in m[2].split("x"))
    if m := re.fullmatch(r"rr\d-(\d+)-s\d+", name):
        return int(m[1])
    raise AssertionError(f"unexpected fabric name {name}")


def test_family_names_unique_and_kinds_present():
    names = [spec.name for spec in FAMILY]
    assert len(names) == len(set(names)) == 88
    assert {spec.kind for spec in FAMILY} == {"mi250", "a100", "h100", "mixed", "leafspine", "torus", "mesh",
                                              "random-regular"}
    for needed in ("mi250x3-ib16", "mi250x3-ib16-nomachines", "mi250x8-ib12.5", "torus-8x8", "rr3-16-s1",
                   "mesh-4x4x4", "leafspine-8x8-2to1", "mixed-a100x2-h100x2", "h100x8-nomachines"):
        assert needed in BUILT


@pytest.mark.parametrize("spec", FAMILY, ids=lambda s: s.name)
def test_every_fabric_builds_validates_and_has_its_ranks(spec):
    t = BUILT[spec.name]
    assert t.name == spec.name
    assert t.num_ranks == spec.ranks == ranks_from_name(spec.name)
    assert 16 <= t.num_ranks <= 256 or spec.kind == "random-regular"
    assert parse_topology(topology_to_dict(t), "x") == t  # survives the file format (validation included)
    for link in t.links:  # every link both ways, alike
        back = t.link(link.dst, link.src)
        assert back is not None and (back.bw, back.alpha) == (link.bw, link.alpha)


def test_with_and_without_machines_share_links():
    pairs = [n for n in BUILT if n.endswith("-nomachines")]
    assert len(pairs) == 2 * (16 + 4 + 4 + 4) // 2  # every box fabric has both variants
    for bare in pairs:
        full, without = BUILT[bare.removesuffix("-nomachines")], BUILT[bare]
        assert full.links == without.links and full.switches == without.switches
        assert without.machines == ()
        assert sorted(r for m in full.machines for r in m) == list(full.ranks)


@pytest.mark.parametrize("generated, builtin", [("mi250x2-ib16", "mi250-2node"), ("a100x2", "dgx-a100-2node"),
                                                ("a100x4", "dgx-a100-4node"), ("h100x2", "dgx-h100-2node")])
def test_boxes_match_the_builtins(generated, builtin):
    ours, theirs = BUILT[generated], load_topology(builtin)
    assert (ours.links, ours.switches, ours.machines) == (theirs.links, theirs.switches, theirs.machines)


def test_mi250_ib16_allgather_bound_matches_builtin():
    size = 2**30
    ours = compute_bounds(BUILT["mi250x2-ib16"], "allgather", size).time_bound_us
    theirs = compute_bounds(load_topology("mi250-2node"), "allgather", size).time_bound_us
    assert ours == pytest.approx(theirs, rel=1e-6) and theirs > 0


def test_mi250_ib_rates_and_mixed_boxes():
    for rate in fam.MI250_IB_GBPS:
        t = BUILT[f"mi250x3-ib{rate:g}"]
        ib = t.node_id("ib0")
        assert t.switches == ("ib0",) and all(t.link(r, ib).bw == rate for r in t.ranks)
        assert t.link(0, 1).bw == 4 * fam.XGMI_GBPS and t.link(16, 17).bw == 200 and t.link(0, 16) is None
    mixed = BUILT["mixed-mi250-a100"]
    ib = mixed.node_id("ib0")
    assert mixed.machines == (tuple(range(16)), tuple(range(16, 24)))
    assert mixed.link(0, ib).bw == 25 and mixed.link(mixed.node_id("b1.nic3"), ib).bw == 25
    assert mixed.link(16, mixed.node_id("b1.nvswitch")).bw == 300 and "ib1" not in mixed.switches
    ah = BUILT["mixed-a100-h100"]
    assert ah.link(ah.node_id("b0.nic0"), ah.node_id("ib0")).alpha == 2
    assert ah.link(ah.node_id("b1.nic0"), ah.node_id("ib0")).alpha == 1
    assert ah.link(8, ah.node_id("b1.nic0")).bw == 50
    assert fam.mixed_name(["a100", "a100", "h100", "mi250", "mi250"]) == "mixed-a100x2-h100-mi250x2"
    with pytest.raises(SynthError, match="unknown kind"):
        fam.mixed_boxes(["tpu"])


def test_leaf_spine_oversubscription():
    for leaves, per_leaf in fam.LEAF_SPINE_SHAPES:
        for over in (1, 2):
            t = BUILT[f"leafspine-{leaves}x{per_leaf}-{over}to1"]
            spines = [s for s in t.switches if s.startswith("spine")]
            assert len(spines) == per_leaf // over
            leaf0 = t.node_id("leaf0")
            up = sum(t.link(leaf0, t.node_id(s)).bw for s in spines)
            down = sum(t.link(leaf0, r).bw for r in range(per_leaf))
            assert down / up == over
    with pytest.raises(SynthError, match="oversubscription"):
        fam.oversubscribed_leaf_spine(2, 3, 2)


def test_random_regular_connected_regular_seeded():
    for spec in (s for s in FAMILY if s.kind == "random-regular"):
        t = BUILT[spec.name]
        degree = int(spec.name[2])
        assert all(len(t.out_links[r]) == degree == len(t.in_links[r]) for r in t.ranks)
        assert nx.is_connected(t.to_networkx().to_undirected())
        assert {link.bw for link in t.links} <= set(fam.REGULAR_GBPS)
        assert {link.alpha for link in t.links} == {gen.DEFAULT_ALPHA}
    assert gen.random_regular(16, 3, 1) == BUILT["rr3-16-s1"]  # the seed fixes everything
    assert gen.random_regular(16, 3, 1).links != gen.random_regular(16, 3, 2).links
    assert len({link.bw for link in BUILT["rr4-32-s1"].links}) > 1  # bandwidths drawn, not constant
    with pytest.raises(SynthError, match="regular graph"):
        gen.random_regular(7, 3, 1)


def test_boxes_on_ib_errors():
    with pytest.raises(SynthError, match="at least one box"):
        gen.boxes_on_ib([])
    with pytest.raises(SynthError, match="isolated"):
        gen.boxes_on_ib([gen.Box(4, nics=1)], 2)


def _bench():
    """benchmarks/ is not a package: load the script as a module (registered, as dataclasses need)."""
    if "bench_fabrics" in sys.modules:
        return sys.modules["bench_fabrics"]
    spec = importlib.util.spec_from_file_location("bench_fabrics", ROOT / "benchmarks" / "bench_fabrics.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_fabrics"] = module
    spec.loader.exec_module(module)
    return module


def test_bench_fabrics_list_and_end_to_end(tmp_path, capsys):
    bench = _bench()
    assert bench.main(["--list", "--max-ranks", "8"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed and all(BUILT[n].num_ranks <= 8 for n in listed) and "rr3-8-s1" in listed

    out_csv, out_md = tmp_path / "rows.csv", tmp_path / "rows.md"
    rc = bench.main(["--filter", "^torus-4x4$", "-c", "allgather", "-s", "1MiB", "-m", "ring",
                     "--workdir", str(tmp_path / "work"), "--csv", str(out_csv), "--markdown", str(out_md)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert re.fullmatch(r"least ratio: allgather (0\.\d{3}|1\.000) \(torus-4x4\)", lines[-1])
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["method"] == "ring"
    ratio = float(rows[0]["ratio"])
    assert 0 < ratio <= 1 + 1e-9
    assert ratio == pytest.approx(float(rows[0]["bound_us"]) / float(rows[0]["time_us"]))
    assert float(rows[0]["cpu_s"]) > 0
    assert (tmp_path / "work" / "torus-4x4.yaml").exists() and (tmp_path / "work" / "torus-4x4-allgather.json").exists()
    assert "| torus-4x4 | 16 | allgather |" in out_md.read_text()
    assert any(line.lstrip().startswith("torus-4x4") and " ok" in line for line in lines)


def test_bench_counts_a_program_no_runtime_loads_as_a_failure():
    bench = _bench()
    note = "no MSCCL runtime loads this program (method trees: lowering: ...); write it as a .json program"
    assert bench.runtime_refusal({"notes": ["SIZE note", note]}) == note
    assert bench.runtime_refusal({"notes": ["SIZE note"]}) is None and bench.runtime_refusal({}) is None


def test_bench_tried_text_and_least_line():
    bench = _bench()
    result = {"tried": [{"method": "ring", "time_us": 12.34}, {"method": "greedy", "skipped": "fallback only"},
                        {"method": "lp", "error": "not started"}, {"method": "trees"}]}
    assert bench.tried_text(result) == "ring 12.3; greedy skipped (fallback only); lp not started; trees -"
    row = bench.Row("f1", 8, "allgather", 9.0, 10.0, 0.9, "ring", 1.0, 2.0, "ok", "")
    bad = bench.Row("f2", 8, "allgather", None, None, None, "", 0.5, 1.0, "timeout", "ran past 1 s")
    low = bench.Row("f3", 8, "allgather", 8.0, 10.0, 0.8, "trees", 1.0, 2.0, "ok", "")
    assert bench.least_line([row, bad, low], ["allgather", "allreduce"]) == \
        "least ratio: allgather 0.800 (f3), allreduce n/a"
    assert "| f2 | 8 | allgather | - | - | - | - | 0.5 | timeout | ran past 1 s |" in bench.to_markdown([bad])

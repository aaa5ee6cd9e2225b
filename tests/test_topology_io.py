"""Topology files: parsing, validation messages, merging, round trips, built-ins, robustness."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.errors import SynthError
from synth.topology import generators as gen
from synth.topology.builtin import builtin_names
from synth.topology.io import (
    dump_topology,
    hop_diameter,
    load_topology,
    parse_topology,
    save_topology,
    topology_to_dict,
)
from synth.topology.model import Link

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def doc(**overrides):
    base = {"name": "t", "ranks": 3, "links": [{"src": 0, "dst": 1, "bw": 10}, {"src": 1, "dst": 2, "bw": 10}]}
    base.update(overrides)
    return base


def error_of(document, source="f.yaml") -> str:
    with pytest.raises(SynthError) as info:
        parse_topology(document, source)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{source}: ")
    return message


# --- the SPEC example and basic semantics ------------------------------------------------------


SPEC_EXAMPLE = """
name: dgx1
description: free text
ranks: 8
switches: [nvswitch]
machines: [[0,1,2,3,4,5,6,7]]
defaults: {alpha: 0.7}
links:
  - {src: 0, dst: 1, bw: 50, alpha: 0.7}
  - {src: 3, dst: nvswitch, bw: 300, alpha: 0.5}
  - {src: 0, dst: 1, bw: 25, directed: true}
""" + "".join(f"  - {{src: {r}, dst: nvswitch, bw: 300, alpha: 0.5}}\n" for r in (0, 1, 2, 4, 5, 6, 7))


def test_spec_example_parses_with_merging_and_defaults(tmp_path):
    t = load_topology(write(tmp_path, "spec.yaml", SPEC_EXAMPLE))
    assert t.name == "dgx1" and t.num_ranks == 8 and t.switches == ("nvswitch",)
    assert t.machines == (tuple(range(8)),)
    # undirected 50 + directed 25 on 0 -> 1; only 50 back
    assert t.link(0, 1) == Link(0, 1, 75.0, 0.7)
    assert t.link(1, 0) == Link(1, 0, 50.0, 0.7)
    sw = t.node_id("nvswitch")
    assert t.link(3, sw) == Link(3, sw, 300.0, 0.5) and t.link(sw, 3) == Link(sw, 3, 300.0, 0.5)
    assert list(t.links) == sorted(t.links, key=lambda x: (x.src, x.dst))
    assert t.source == str(tmp_path / "spec.yaml")


def test_json_and_yaml_give_the_same_topology(tmp_path):
    d = yaml.safe_load(SPEC_EXAMPLE)
    a = load_topology(write(tmp_path, "a.json", json.dumps(d)))
    b = load_topology(write(tmp_path, "b.yml", SPEC_EXAMPLE))
    assert a == b


def test_defaults_supply_bw_alpha_and_directed():
    t = parse_topology(
        {"name": "d", "ranks": 2, "defaults": {"bw": 7, "alpha": 1.5, "directed": True},
         "links": [{"src": 0, "dst": 1}, {"src": 1, "dst": 0, "bw": 3}]},
        "d.yaml",
    )
    assert t.links == (Link(0, 1, 7.0, 1.5), Link(1, 0, 3.0, 1.5))


def test_alpha_defaults_to_zero():
    t = parse_topology(doc(), "x")
    assert all(link.alpha == 0.0 for link in t.links)


# --- invalid documents: one line naming file, entry and problem ----------------------------------


@pytest.mark.parametrize(
    "document, needles",
    [
        (doc(links=[{"src": 0, "dst": 5, "bw": 1}]), ["links[0].dst", "unknown node 5", "0..2"]),
        (doc(links=[{"src": 0, "dst": "sw", "bw": 1}]), ["links[0].dst", "unknown node 'sw'"]),
        (doc(links=[{"src": 0, "dst": "1", "bw": 1}]), ["links[0].dst", "integers, not strings"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": 1}, {"src": 2, "dst": 2, "bw": 1}]), ["links[1]", "self-loop"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": -5}]), ["links[0].bw", "must be >= 1e-06", "-5"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": 0}]), ["links[0].bw", "must be >= 1e-06"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": 1, "alpha": -1}]), ["links[0].alpha", ">= 0"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": float("inf")}]), ["links[0].bw", "finite"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": float("nan")}]), ["links[0].bw"]),
        (doc(links=[{"src": 0, "dst": 1}]), ["links[0]", "missing required key 'bw'"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": "fast"}]), ["links[0].bw", "must be a number", "'fast'"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": True}]), ["links[0].bw", "must be a number"]),
        (doc(links=[{"src": 0, "bw": 1}]), ["links[0]", "missing required key 'dst'"]),
        (doc(links=[{"src": 0, "dst": 1, "bandwidth": 1}]), ["links[0]", "unknown key 'bandwidth'"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": 1}]), ["links", "cannot reach rank 2"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": 1, "directed": True}, {"src": 1, "dst": 2, "bw": 1},
                    {"src": 2, "dst": 0, "bw": 1, "directed": True}]), None),
        (doc(links=[{"src": 0, "dst": 1, "bw": 1, "directed": True}, {"src": 1, "dst": 2, "bw": 1}]),
         ["links", "rank 1 cannot reach rank 0"]),
        (doc(switches=["a", "b"], links=[{"src": 0, "dst": "a", "bw": 1}, {"src": 1, "dst": "a", "bw": 1},
                                          {"src": 2, "dst": "a", "bw": 1}]), ["switches[1]", "'b' is isolated"]),
        (doc(switches=["a", "a"]), ["switches", "duplicate entry 'a'"]),
        (doc(links=[{"src": 0, "dst": 1, "bw": 1, "alpha": 1}, {"src": 1, "dst": 2, "bw": 1},
                    {"src": 0, "dst": 1, "bw": 1, "alpha": 2}]), ["links[2]", "disagrees", "links[0]"]),
        ({"ranks": 2, "links": []}, ["missing required key 'name'"]),
        ({"name": "x", "links": []}, ["missing required key 'ranks'"]),
        ({"name": "x", "ranks": 2}, ["missing required key 'links'"]),
        (doc(ranks="8"), ["ranks", "must be an integer", "'8'"]),
        (doc(ranks=0), ["ranks", ">= 1"]),
        (doc(name=5), ["name", "must be a string"]),
        (doc(links={"src": 0}), ["links", "must be a list"]),
        (doc(colour="red"), ["unknown key 'colour'"]),
        (doc(machines=[[0, 1], [1, 2]]), ["machines[1]", "rank 1 is already in machines[0]"]),
        (doc(machines=[[0, 1]]), ["machines", "rank 2 is in no machine"]),
        (doc(machines=[[0, 1, 2, 3]]), ["machines[0]", "unknown rank 3"]),
        (doc(defaults={"bw": -1}), ["defaults.bw", ">= 1e-06"]),
        (doc(defaults={"speed": 1}), ["defaults", "unknown key 'speed'"]),
        ([1, 2, 3], ["top level must be a mapping"]),
        (None, ["top level must be a mapping"]),
    ],
)
def test_invalid_documents(document, needles):
    if needles is None:  # a directed cycle through all ranks is valid
        assert parse_topology(document, "f.yaml").num_ranks == 3
        return
    message = error_of(document)
    for needle in needles:
        assert needle in message, (needle, message)


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("bad.yaml", "name: x\nranks: [1\n", "malformed YAML at line"),
        ("bad.yaml", "name: x\nname: y\nranks: 1\nlinks: []\n", "duplicate key 'name'"),
        ("bad.yaml", "name: x\nranks: 1\nlinks: []\nwhen: 2021-02-30\n", "malformed YAML"),
        ("bad.yaml", "a: !!python/object:os.system {}\n", "malformed YAML"),
        ("bad.json", '{"name": "x", "ranks": 1, ', "malformed JSON"),
        ("empty.yaml", "   \n", "empty file"),
        ("list.yaml", "- 1\n- 2\n", "top level must be a mapping"),
    ],
)
def test_malformed_files(tmp_path, name, text, needle):
    path = write(tmp_path, name, text)
    with pytest.raises(SynthError) as info:
        load_topology(path)
    message = str(info.value)
    assert str(path) in message and needle in message and "\n" not in message


def test_unknown_name_and_binary_file(tmp_path):
    with pytest.raises(SynthError, match="no such file and no built-in"):
        load_topology("no-such-topology")
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(SynthError, match="not UTF-8"):
        load_topology(path)
    with pytest.raises(SynthError, match="is a directory"):
        load_topology(tmp_path)


def test_single_rank_without_links_is_valid():
    t = parse_topology({"name": "one", "ranks": 1, "links": []}, "x")
    assert t.num_ranks == 1 and t.links == () and hop_diameter(t) == 0


# --- round trips ---------------------------------------------------------------------------------


ROUND_TRIP = [
    gen.ring(5),
    gen.ring(6, 10, 1.25, bidirectional=False),
    gen.torus([3, 4]),
    gen.leaf_spine(3, 2, 2),
    gen.boxes_behind_nics(2, 4, nics_per_box=1),
]


@pytest.mark.parametrize("topology", ROUND_TRIP, ids=lambda t: t.name)
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_round_trip_save_load(tmp_path, topology, suffix):
    path = tmp_path / f"t{suffix}"
    save_topology(topology, path)
    again = load_topology(path)
    assert again == topology
    assert again.links == topology.links and again.machines == topology.machines
    assert parse_topology(topology_to_dict(topology), "x") == topology


def test_round_trip_keeps_asymmetric_and_mixed_links(tmp_path):
    t = load_topology(write(tmp_path, "spec.yaml", SPEC_EXAMPLE))
    save_topology(t, tmp_path / "out.yaml")
    assert load_topology(tmp_path / "out.yaml") == t
    entries = topology_to_dict(t)["links"]
    assert {"src": 0, "dst": 1, "bw": 75, "alpha": 0.7, "directed": True} in entries
    assert {"src": 1, "dst": 0, "bw": 50, "alpha": 0.7, "directed": True} in entries


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    save_topology(gen.ring(4), tmp_path / "r.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]


# --- built-ins -----------------------------------------------------------------------------------

EXPECTED_BUILTINS = {
    "dgx1", "ndv2-2node", "dgx2", "dgx-a100", "dgx-a100-2node", "dgx-a100-4node", "dgx-h100", "dgx-h100-2node",
    "mi250", "dgx-h100-nvls", "dgx-h100-2node-sharp",
    "mi250-2node", "torus-4x4", "torus-3x3x3", "mesh-5x5", "hypercube-16", "ring-8", "fully-connected-8",
}


def test_builtins_present_and_valid():
    names = set(builtin_names())
    assert EXPECTED_BUILTINS <= names
    for path in sorted((REPO / "topologies").iterdir()):
        if path.suffix in (".yaml", ".yml", ".json"):
            t = load_topology(path)
            assert t.name == path.stem
            assert t.description
            assert load_topology(path.stem) == t


def test_dgx1_numbers_from_the_nvlink_matrix():
    t = load_topology("dgx1")
    assert hop_diameter(t) == 2
    assert len(t.links) == 32  # 16 connected pairs, both directions
    for r in t.ranks:  # 6 NVLinks x 25 GB/s per direction
        assert t.out_bw(r) == 150 and t.in_bw(r) == 150
    assert {link.alpha for link in t.links} == {0.7}
    assert t.link(0, 1).bw == 50 and t.link(0, 2).bw == 25 and t.link(0, 5) is None


def test_a100_2node_structure():
    t = load_topology("dgx-a100-2node")
    assert t.num_ranks == 16 and t.machines == (tuple(range(8)), tuple(range(8, 16)))
    nic = t.node_id("b1.nic3")  # GPU 11 = box 1, GPU 3 -> IB switch 3 % 2 = 1
    assert t.link(11, nic).bw == 25
    assert t.link(nic, t.node_id("ib1")) == Link(nic, t.node_id("ib1"), 25.0, 2.0)
    assert t.link(nic, t.node_id("ib0")) is None
    assert t.link(3, t.node_id("b0.nvswitch")) == Link(3, t.node_id("b0.nvswitch"), 300.0, 0.7)


def test_h100_mi250_and_others():
    h = load_topology("dgx-h100-2node")
    assert h.link(h.node_id("b0.nic0"), h.node_id("ib0")).alpha == 1.0
    assert h.link(h.node_id("b0.nic0"), h.node_id("ib0")).bw == 50
    mi = load_topology("mi250")
    assert all(mi.out_bw(r) == 7 * 50 for r in mi.ranks)
    mi2 = load_topology("mi250-2node")
    ib = mi2.node_id("ib0")
    assert all(mi2.link(r, ib).bw == 16 for r in mi2.ranks)
    t = load_topology("torus-3x3x3")
    assert {(link.bw, link.alpha) for link in t.links} == {(50.0, 0.5)} and hop_diameter(t) == 3
    assert load_topology("dgx2").link(0, 16).bw == 125


def _make_reference():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_reference", REPO / "topologies" / "make_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_files_are_what_make_reference_builds():
    module = _make_reference()
    built = module.reference_topologies()
    assert EXPECTED_BUILTINS <= set(built)
    for name, topology in built.items():
        path = REPO / "topologies" / f"{name}.yaml"
        assert path.read_text(encoding="utf-8") == dump_topology(topology), name
        assert load_topology(name) == topology
    assert module.main(["--check"]) == 0


@pytest.mark.parametrize("fixture, attr", [("dgx1_nvlink.json", "DGX1_NVLINKS"), ("mi250_xgmi.json", "MI250_XGMI")])
def test_embedded_matrices_match_shared_fixtures(fixture, attr):
    path = REPO.parent / "shared" / "fixtures" / "topologies" / fixture
    if not path.exists():
        pytest.skip("shared fixtures not present")
    data = json.loads(path.read_text())
    assert getattr(_make_reference(), attr) == data["links"]


# --- scale ---------------------------------------------------------------------------------------


def test_large_topology_loads_fast(tmp_path):
    t = gen.torus([32, 32])  # 1024 ranks, 2048 file entries, 4096 directed links
    path = tmp_path / "big.yaml"
    save_topology(t, path)
    start = time.perf_counter()
    again = load_topology(path)
    elapsed = time.perf_counter() - start
    assert again == t
    assert elapsed < 2.0  # typically ~0.2 s; generous for a loaded 2-core CI box
    assert hop_diameter(again) == 32


# --- hypothesis: malformed documents never escape as another exception ---------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.sampled_from(["sw", "nic", "0", "", "ib0"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.sampled_from(["src", "dst", "bw", "alpha", "directed", "name", "ranks", "x"]), inner, max_size=4),
    max_leaves=12)
link_entries = st.fixed_dictionaries(
    {"src": st.one_of(st.integers(-1, 5), st.sampled_from(["sw", "ib", "3"]), values),
     "dst": st.one_of(st.integers(-1, 5), st.sampled_from(["sw", "ib"]), values)},
    optional={"bw": st.one_of(st.floats(-2, 100), st.integers(-2, 100), values),
              "alpha": st.one_of(st.floats(-1, 3), values), "directed": st.one_of(st.booleans(), values)},
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.text(max_size=5), values),
        "ranks": st.one_of(st.integers(-1, 6), values),
        "switches": st.one_of(st.lists(st.sampled_from(["sw", "ib", "sw"]), max_size=3), values),
        "machines": st.one_of(st.lists(st.lists(st.integers(-1, 6), max_size=4), max_size=3), values),
        "defaults": st.one_of(st.fixed_dictionaries({}, optional={"bw": st.floats(-1, 9), "alpha": st.floats(-1, 2),
                                                                  "directed": st.booleans()}), values),
        "links": st.one_of(st.lists(link_entries, max_size=8), values),
        "extra": values,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=st.one_of(documents, values))
def test_fuzz_documents_raise_only_synth_error(document):
    try:
        t = parse_topology(document, "fuzz.yaml")
    except SynthError as exc:
        message = str(exc)
        assert message.startswith("fuzz.yaml: ") and "\n" not in message
    else:  # whatever is accepted must be a consistent, valid topology that round-trips
        assert parse_topology(topology_to_dict(t), "again") == t
        assert all(link.bw > 0 and link.alpha >= 0 and link.src != link.dst for link in t.links)


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(["name: x", "ranks: 2", "links:", "  - {src: 0, dst: 1, bw: 1}", "- [", "{", "}",
                              "  bw: -1", "ranks: 1e3", "a: &a [*a]", ": :", "\t", "switches: [a, a]",
                              "links: [{src: 0, dst: 1}]", "defaults: {bw: 2}", "2001-02-30: x"]),
             max_size=8).map("\n".join),
))
def test_fuzz_text_raises_only_synth_error(tmp_path_factory, text):
    from synth.topology.io import decode_text

    for fmt in ("yaml", "json"):
        try:
            parse_topology(decode_text(text, "fuzz.txt", fmt), "fuzz.txt")
        except SynthError as exc:
            assert str(exc).startswith("fuzz.txt: ") and "\n" not in str(exc)


def _mutate(document, data):
    """Replace or delete one random value somewhere inside a valid document."""
    import copy

    document = copy.deepcopy(document)
    node = document
    while True:
        keys = list(node.keys()) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return document
        key = data.draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, (dict, list)) and child and data.draw(st.booleans()):
            node = child
            continue
        if isinstance(node, dict) and data.draw(st.booleans()):
            del node[key]
        else:
            node[key] = data.draw(values)
        return document


VALID = topology_to_dict(gen.boxes_behind_nics(2, 2, nics_per_box=1, intra="mesh"))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzz_mutated_valid_document(data):
    mutated = _mutate(VALID, data)
    try:
        t = parse_topology(mutated, "mut.yaml")
    except SynthError as exc:
        assert str(exc).startswith("mut.yaml: ") and "\n" not in str(exc)
    else:
        assert parse_topology(topology_to_dict(t), "again") == t


def _chips(widths=(5, 4, 4, 5), alphas=None, gpus: int = 8, features: dict | None = None) -> dict:
    """A DGX-H100-like box written per NVSwitch chip: every GPU links to chip c with widths[c] NVLinks of 25 GB/s."""
    alphas = alphas or [0.35] * len(widths)
    switches = [dict(name=f"c{c}", **(features or {})) if features else f"c{c}" for c in range(len(widths))]
    links = [{"src": g, "dst": f"c{c}", "bw": 25 * n, "alpha": alphas[c]}
             for g in range(gpus) for c, n in enumerate(widths)]
    return {"name": "chips", "ranks": gpus, "switches": switches, "links": links}


def test_planes_of_one_switch_are_joined_with_their_bandwidths_added():
    topology = parse_topology(_chips())
    assert topology.switches == ("c0",)
    assert {(link.bw, link.alpha) for link in topology.links} == {(450.0, 0.35)}
    one = parse_topology({"name": "one", "ranks": 8, "switches": ["c0"],
                          "links": [{"src": g, "dst": "c0", "bw": 450, "alpha": 0.35} for g in range(8)]})
    assert topology.sha256 == one.sha256


def test_a_gpus_two_nics_into_one_switch_are_joined():
    links = []
    for g in range(4):
        for n in range(2):
            links += [{"src": g, "dst": f"g{g}n{n}", "bw": 25, "alpha": 0.2},
                      {"src": f"g{g}n{n}", "dst": "ib", "bw": 25, "alpha": 1.0}]
    switches = ["ib"] + [f"g{g}n{n}" for g in range(4) for n in range(2)]
    topology = parse_topology({"name": "nics", "ranks": 4, "switches": switches, "links": links})
    assert topology.switches == ("ib", "g0n0", "g1n0", "g2n0", "g3n0")
    assert {link.bw for link in topology.links} == {50.0}


@pytest.mark.parametrize(("doc", "left"), [
    (_chips(alphas=[0.35, 0.35, 0.5, 0.35]), ("c0", "c2")),          # the chip of another α stays apart
    (_chips(features={"reduce": True}), ("c0", "c1", "c2", "c3")),  # in-network work is not striped
], ids=["alpha", "reduce"])
def test_switches_that_differ_are_not_joined(doc, left):
    assert parse_topology(doc).switches == left


def test_spines_are_not_planes():
    # two spines link the same leaves but no rank: sends take one of them (D-mod-k), as on a real fat tree
    topology = gen.leaf_spine(4, 4, 2)
    assert parse_topology(yaml.safe_load(dump_topology(topology))).switches == topology.switches


def test_chip_level_box_reaches_its_bound():
    from synth.pipeline import synthesize

    result = synthesize(parse_topology(_chips()), "allgather", 2**30)
    assert result.bound_us / result.time_us >= 0.98    # 0.55 with a route per pair through one 125 GB/s chip

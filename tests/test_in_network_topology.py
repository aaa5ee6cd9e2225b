"""In-network reduction in topology files (docs/topology.md, "In-network reduction"): the `switches` mapping
form, its validation, write-back, and every transformation that rebuilds a Topology keeping the features."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.errors import SynthError
from synth.topology import generators as gen
from synth.topology.builtin import builtin_names, builtin_path
from synth.topology.checks import switch_ranks, with_switch_features
from synth.topology.degrade import FabricEdits, degrade_topology
from synth.topology.families import without_machines
from synth.topology.io import dump_topology, load_topology, parse_topology, save_topology, topology_to_dict
from synth.topology.model import SwitchFeatures

NVLS = SwitchFeatures(reduce=True, multicast=True, reduce_alpha=0.3, reduce_bw=900.0)

FEATURED = {
    "name": "nvls-4",
    "ranks": 4,
    "switches": [{"name": "nvs", "reduce": True, "multicast": True, "reduce_alpha": 0.3, "reduce_bw": 900}, "ib"],
    "defaults": {"bw": 100, "alpha": 0.5},
    "links": [{"src": r, "dst": "nvs"} for r in range(4)] + [{"src": 2, "dst": "ib"}, {"src": 3, "dst": "ib"}],
}


def featured():
    return parse_topology(json.loads(json.dumps(FEATURED)), "nvls-4.yaml")


def test_mapping_form_loads_features_in_switch_order():
    t = featured()
    assert t.switches == ("nvs", "ib")
    assert t.features == (("nvs", NVLS),)
    assert t.reducing_switches == (4,)
    assert t.switch_features(4) == NVLS and t.switch_features(5).plain and t.switch_features(0).plain
    assert switch_ranks(t, 4) == (0, 1, 2, 3) and switch_ranks(t, 5) == (2, 3)


def test_features_change_the_hash_and_reduce_false_is_a_plain_switch():
    t = featured()
    plain = parse_topology({**FEATURED, "switches": ["nvs", "ib"]}, "p")
    off = parse_topology({**FEATURED, "switches": [{"name": "nvs", "reduce": False}, "ib"]}, "p")
    assert plain.features == () and off == plain and off.sha256 == plain.sha256
    assert t.sha256 != plain.sha256
    assert topology_to_dict(off)["switches"] == ["nvs", "ib"]


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_write_back_round_trips(tmp_path, suffix):
    t = featured()
    path = save_topology(t, tmp_path / f"t{suffix}")
    again = load_topology(path)
    assert again == t and again.sha256 == t.sha256
    assert dump_topology(again, suffix[1:]) == path.read_text(encoding="utf-8")
    assert topology_to_dict(t)["switches"][0] == FEATURED["switches"][0]


def test_every_builtin_file_round_trips_byte_identically():
    for name in builtin_names():
        path = builtin_path(name)
        assert dump_topology(load_topology(path)) == path.read_text(encoding="utf-8"), name


@pytest.mark.parametrize(("switch", "needle"), [
    ({"name": "nvs", "reduce": 1}, "switches[0].reduce: must be true or false"),
    ({"name": "nvs", "reduce": True, "reduce_bw": 0}, "switches[0].reduce_bw: must be >= 1e-06"),
    ({"name": "nvs", "reduce": True, "reduce_alpha": -1}, "switches[0].reduce_alpha: must be >= 0"),
    ({"name": "nvs", "reduce": True, "reduce_alpha": math.inf}, "switches[0].reduce_alpha: must be a finite number"),
    ({"name": "nvs", "multicast": True, "reduce_alpha": 1}, "reduce_alpha and reduce_bw need reduce: true"),
    ({"name": "nvs", "colour": "red"}, "switches[0]: unknown key 'colour'"),
    ({"reduce": True}, "switches[0]: missing required key 'name'"),
    (7, "switches[0]: must be a string or a mapping"),
])
def test_bad_switch_entries_fail_with_one_line(switch, needle):
    with pytest.raises(SynthError) as err:
        parse_topology({**FEATURED, "switches": [switch, "ib"]}, "bad.yaml")
    text = str(err.value)
    assert needle in text and "\n" not in text and text.startswith("bad.yaml: ")


def test_duplicate_switch_names_are_refused():
    with pytest.raises(SynthError, match=r"switches\[2\]: switch 'nvs' is already switches\[0\]"):
        parse_topology({**FEATURED, "switches": [*FEATURED["switches"], "nvs"]}, "bad.yaml")


def test_a_reducing_switch_must_serve_two_ranks():
    doc = {"name": "x", "ranks": 3, "switches": [{"name": "s", "reduce": True}],
           "links": [{"src": 0, "dst": "s", "bw": 1}, {"src": 0, "dst": 1, "bw": 1}, {"src": 1, "dst": 2, "bw": 1}]}
    with pytest.raises(SynthError, match=r"switches\[0\]: reducing switch 's' has links to and from 1 rank"):
        parse_topology(doc, "bad.yaml")
    # through another switch counts (SHARP on an IB switch behind NICs); through a rank does not
    doc["switches"].append("nic")
    doc["links"] += [{"src": 2, "dst": "nic", "bw": 1}, {"src": "nic", "dst": "s", "bw": 1}]
    assert switch_ranks(parse_topology(doc, "ok.yaml"), 3) == (0, 2)


def test_with_switch_features_validates():
    star = gen.star(4, 100, 0.5, switch="nvs")
    t = with_switch_features(star, {"nvs": NVLS})
    assert t.features == (("nvs", NVLS),) and t.links == star.links
    with pytest.raises(SynthError, match="unknown switch 'nope'"):
        with_switch_features(star, {"nope": NVLS})


# ---- every transformation keeps the features ------------------------------------------------------------


def test_reversed_circuit_capacities_and_replace_keep_features():
    t = featured()
    assert t.reversed().features == t.features
    slow = parse_topology({**FEATURED, "links": [*FEATURED["links"][:4], {"src": 2, "dst": "ib", "bw": 100},
                                                 {"src": "ib", "dst": 3, "bw": 500, "directed": True},
                                                 {"src": 3, "dst": "ib", "bw": 100, "directed": True}]}, "c")
    capped = slow.circuit_capacities()
    assert capped is not slow and capped.features == slow.features
    assert without_machines(t).features == t.features
    assert replace(t, name="renamed").features == t.features


def test_degrade_keeps_features_and_refuses_a_reducing_switch_left_with_one_rank():
    t = featured()
    slowed = degrade_topology(t, FabricEdits(degrade=(("0", "nvs", 0.5),))).topology
    assert slowed.features == t.features and slowed.switches == t.switches
    fewer = degrade_topology(t, FabricEdits(exclude_ranks=(0,))).topology
    assert fewer.features == t.features and switch_ranks(fewer, fewer.node_id("nvs")) == (0, 1, 2)
    no_ib = degrade_topology(t, FabricEdits(exclude_links=(("2", "ib"), ("3", "ib")))).topology
    assert no_ib.switches == ("nvs",) and no_ib.features == t.features
    two = parse_topology({**FEATURED, "ranks": 3, "links": [{"src": r, "dst": "nvs"} for r in range(3)]
                          + [{"src": 2, "dst": "ib"}, {"src": 1, "dst": "ib"}]}, "three")
    with pytest.raises(SynthError, match="reducing switch 'nvs' has links to and from 1 rank"):
        degrade_topology(two, FabricEdits(exclude_ranks=(0,), exclude_links=(("1", "nvs"),)))


def test_program_fabric_embedding_keeps_features():
    """A JSON program embeds ``topology_to_dict`` and reads it back with ``parse_topology``."""
    t = featured()
    doc = json.loads(json.dumps(topology_to_dict(t)))
    again = parse_topology(doc, "program: fabric.topology")
    assert again == t and again.sha256 == t.sha256


# ---- CLI -------------------------------------------------------------------------------------------------


def test_topology_show_lists_in_network_switches(tmp_path):
    path = save_topology(featured(), tmp_path / "nvls-4.yaml")
    res = CliRunner().invoke(cli, ["topology", "show", str(path), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["in_network"] == [{"switch": "nvs", "reduce": True, "multicast": True, "reduce_alpha_us": 0.3,
                                   "reduce_bw": 900.0, "ranks": [0, 1, 2, 3]}]
    res = CliRunner().invoke(cli, ["topology", "show", str(path)])
    assert res.exit_code == 0 and "in-network switches" in res.output and "900" in res.output
    plain = json.loads(CliRunner().invoke(cli, ["topology", "show", "dgx-a100", "--json"]).output)
    assert plain["in_network"] == []
    assert "in-network" not in CliRunner().invoke(cli, ["topology", "show", "dgx-a100"]).output


# ---- built-ins -------------------------------------------------------------------------------------------


def test_in_network_builtins():
    nvls = load_topology("dgx-h100-nvls")
    assert nvls.num_ranks == 8 and nvls.switches == ("nvswitch",)
    assert nvls.features == (("nvswitch", SwitchFeatures(reduce=True, multicast=True)),)
    assert {(link.bw, link.alpha) for link in nvls.links} == {(450.0, 0.7)} and len(nvls.links) == 16
    assert "Assumed" in nvls.description
    sharp, plain = load_topology("dgx-h100-2node-sharp"), load_topology("dgx-h100-2node")
    assert sharp.links == plain.links and sharp.switches == plain.switches and sharp.machines == plain.machines
    assert sorted(name for name, f in sharp.features if f.reduce and f.multicast) == [
        "b0.nvswitch", "b1.nvswitch", "ib0", "ib1"]
    assert switch_ranks(sharp, sharp.node_id("ib0")) == (0, 2, 4, 6, 8, 10, 12, 14)
    assert all(not load_topology(name).features for name in builtin_names()
               if name not in ("dgx-h100-nvls", "dgx-h100-2node-sharp"))

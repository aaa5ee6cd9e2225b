"""Lower bounds with in-network reduction (docs/cost-model.md, "In-network reduction"): synth/lower_bounds.py."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.collectives import COLLECTIVES
from synth.lower_bounds import compute_bounds
from synth.topology.builtin import builtin_names
from synth.topology.checks import with_switch_features
from synth.topology.io import load_topology, parse_topology, topology_to_dict
from synth.topology.model import SwitchFeatures, Topology

GiB = 2**30
NVLS = SwitchFeatures(reduce=True, multicast=True)
IN_NETWORK = ("dgx-h100-nvls", "dgx-h100-2node-sharp")
PLAIN = [name for name in builtin_names() if name not in IN_NETWORK]


def star(out_bw: list[float], in_bw: list[float], features: SwitchFeatures | None = NVLS) -> Topology:
    """Ranks 0..n-1 on switch ``s``: rank r -> s at ``out_bw[r]``, s -> r at ``in_bw[r]`` GB/s, α 0.5 µs."""
    links = [{"src": r, "dst": "s", "bw": b, "alpha": 0.5, "directed": True} for r, b in enumerate(out_bw)]
    links += [{"src": "s", "dst": r, "bw": b, "alpha": 0.5, "directed": True} for r, b in enumerate(in_bw)]
    switch = "s" if features is None else {"name": "s", "reduce": features.reduce, "multicast": features.multicast}
    return parse_topology({"name": "star", "ranks": len(out_bw), "switches": [switch], "links": links}, "star")


@pytest.mark.parametrize("name", PLAIN)
def test_plain_builtins_report_no_in_network_bound(name):
    b = compute_bounds(load_topology(name), "allreduce", GiB)
    assert b.host_only_bound_us is None
    assert "host_only_bound_us" not in b.as_dict() and "in_network" not in b.details
    assert "port_rounds_note" not in b.details and "traffic_us" in b.details["components_us"]


@pytest.mark.parametrize("name", PLAIN)
def test_reduce_false_is_the_plain_fabric(name):
    """Every switch of a built-in written as ``{name, reduce: false, multicast: false}`` is the same fabric: equal
    topology (so every method, bound and program is the same function of it), equal hash, equal bounds."""
    plain = load_topology(name)
    doc = topology_to_dict(plain)
    if "switches" in doc:
        doc["switches"] = [{"name": sw, "reduce": False, "multicast": False} for sw in doc["switches"]]
    off = parse_topology(doc, "off")
    assert off == plain and off.sha256 == plain.sha256 and off.features == ()
    collectives = COLLECTIVES if name == "dgx-a100" else ("allreduce",)
    for c in collectives:
        assert json.dumps(compute_bounds(off, c, GiB).as_dict()) == json.dumps(compute_bounds(plain, c, GiB).as_dict())


def test_nvls_allreduce_is_the_rank_cut_about_half_the_host_only_bound():
    t = load_topology("dgx-h100-nvls")
    b = compute_bounds(t, "allreduce", GiB)
    rank_cut = GiB / (450 * 1e3)             # SIZE / min(B_out, B_in): one send, one receive of SIZE per rank
    host = 2 * 7 / 8 * GiB / (450 * 1e3)     # 2(N-1)/N · SIZE / B
    assert b.time_bound_us == pytest.approx(rank_cut, rel=1e-12)
    assert b.host_only_bound_us == pytest.approx(host, rel=1e-12)
    assert b.time_bound_us / b.host_only_bound_us == pytest.approx(8 / 14)
    plain = compute_bounds(replace(t, features=()), "allreduce", GiB)
    assert plain.time_bound_us == b.host_only_bound_us
    d = b.as_dict()
    assert d["in_network_bound_us"] == d["time_bound_us"] and d["host_only_bound_us"] == b.host_only_bound_us
    assert d["details"]["in_network"]["switches"] == ["nvswitch"]


def test_sharp_allreduce_is_the_box_cut():
    t, plain = load_topology("dgx-h100-2node-sharp"), load_topology("dgx-h100-2node")
    b = compute_bounds(t, "allreduce", GiB)
    assert b.host_only_bound_us == compute_bounds(plain, "allreduce", GiB).time_bound_us
    assert b.time_bound_us == pytest.approx(GiB / (8 * 50 * 1e3), rel=1e-12)   # 8 NICs of 50 GB/s out of a box
    assert b.time_bound_us < b.host_only_bound_us


@pytest.mark.parametrize("name", IN_NETWORK)
def test_in_network_bounds_never_exceed_host_only(name):
    t = load_topology(name)
    for c in COLLECTIVES:
        for size in (1024, GiB):
            b = compute_bounds(t, c, size)
            assert b.host_only_bound_us is not None and b.time_bound_us <= b.host_only_bound_us + 1e-9, (c, size)
            if c not in ("allreduce",):   # bandwidth: information cuts, valid as they were (without the α of
                # the cut's links, which host-only bounds add: tests/test_cut_alpha.py)
                plain = compute_bounds(replace(t, features=()), c, size)
                assert b.bandwidth_bound_us == pytest.approx(
                    plain.details.get("cut_bound_us", plain.bandwidth_bound_us), rel=1e-12)


def test_small_allreduce_latency_drops_the_round_bound():
    b = compute_bounds(load_topology("dgx-h100-nvls"), "allreduce", 1024)
    assert b.latency_bound_us == pytest.approx(1.4)    # rank -> switch -> rank
    assert b.host_only_bound_us == pytest.approx(3 * 1.4)   # ⌈log2 8⌉ rounds of 1.4 µs
    assert "dropped" in b.details["port_rounds_note"]


def _cut_bounds_brute_force(t: Topology, size: float) -> float:
    """max over node sets S holding a rank and missing one of the information cuts: SIZE / B⁺(S),
    SIZE / B⁻(S), |S∩R|·M / B⁺(S) (allgather) and |S∩R|·M / B⁻(S) (reducescatter)."""
    n, nodes = t.num_ranks, t.num_nodes
    best = 0.0
    for k in range(1, nodes):
        for subset in itertools.combinations(range(nodes), k):
            s = set(subset)
            inside = len(s & set(range(n)))
            if inside == 0 or inside == n:
                continue
            out = sum(link.bw for link in t.links if link.src in s and link.dst not in s)
            into = sum(link.bw for link in t.links if link.dst in s and link.src not in s)
            best = max(best, size / (out * 1e3), size / (into * 1e3),
                       inside * size / n / (out * 1e3), inside * size / n / (into * 1e3))
    return best


@pytest.mark.parametrize(("out_bw", "in_bw"), [([10, 20, 30], [30, 20, 10]), ([5, 40, 40, 40], [40, 40, 40, 40]),
                                               ([25, 25], [50, 50]), ([40] * 4, [40] * 4)])
def test_star_bound_is_exact_brute_force(out_bw, in_bw):
    """On a reducing, multicasting star the bound equals both the brute-force maximum of the information cuts
    and the fluid time of the NVLS schedule (each rank streams SIZE to the switch, which sums and multicasts
    SIZE back): a lower bound met by a schedule is the optimum."""
    t = star(out_bw, in_bw)
    b = compute_bounds(t, "allreduce", GiB)
    nvls_fluid = max(GiB / (min(o, i) * 1e3) for o, i in zip(out_bw, in_bw))
    assert b.bandwidth_bound_us == pytest.approx(nvls_fluid, rel=1e-9)
    assert b.bandwidth_bound_us == pytest.approx(_cut_bounds_brute_force(t, GiB), rel=1e-9)
    host = compute_bounds(star(out_bw, in_bw, None), "allreduce", GiB)
    assert b.host_only_bound_us == host.time_bound_us >= b.time_bound_us
    if len(set(out_bw + in_bw)) == 1:   # equal ranks: host-only needs 2(N-1)/N · SIZE / B
        assert host.time_bound_us == pytest.approx(2 * (len(out_bw) - 1) / len(out_bw) * b.time_bound_us)


def test_group_traffic_needs_the_in_network_switch_inside_a_group():
    """Three boxes of two ranks, a reducing switch per box (inside its group) and one between the boxes: the
    group traffic bound holds only while the switch between the boxes forwards."""
    def boxes(middle_reduces: bool) -> Topology:
        links = [{"src": r, "dst": f"nv{r // 2}", "bw": 100, "alpha": 0.5} for r in range(6)]
        links += [{"src": r, "dst": "ib", "bw": 10, "alpha": 1} for r in range(6)]
        switches = [{"name": f"nv{k}", "reduce": True, "multicast": True} for k in range(3)]
        switches.append({"name": "ib", "reduce": True} if middle_reduces else "ib")
        return parse_topology({"name": "boxes", "ranks": 6, "switches": switches, "links": links}, "boxes")

    inside = compute_bounds(boxes(False), "allreduce", GiB)
    assert inside.details["binding_component"] == "group_traffic_us"
    # three groups: every element crosses 2(3-1) = 4 times, over 2 x 10 GB/s out of each box, 60 GB/s in all
    assert inside.bandwidth_bound_us == pytest.approx(4 * GiB / (60 * 1e3))
    between = compute_bounds(boxes(True), "allreduce", GiB)
    assert "group_traffic_us" not in between.details["components_us"]
    assert between.bandwidth_bound_us == pytest.approx(GiB / (20 * 1e3))   # the box cut: 2 x 10 GB/s out
    assert between.bandwidth_bound_us == pytest.approx(_cut_bounds_brute_force(boxes(True), GiB))


def test_with_switch_features_matches_the_file_form():
    t = with_switch_features(star([10, 20, 30], [30, 20, 10], None), {"s": NVLS})
    assert t == star([10, 20, 30], [30, 20, 10])


def test_bounds_cli_shows_both(tmp_path):
    res = CliRunner().invoke(cli, ["bounds", "-t", "dgx-h100-nvls", "-c", "allreduce", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["time_bound_us"] == d["in_network_bound_us"] < d["host_only_bound_us"]
    res = CliRunner().invoke(cli, ["bounds", "-t", "dgx-h100-nvls", "-c", "allreduce"])
    assert res.exit_code == 0 and "host-only" in res.output and "in-network" in res.output
    plain = json.loads(CliRunner().invoke(cli, ["bounds", "-t", "dgx-a100", "-c", "allreduce", "--json"]).output)
    assert "host_only_bound_us" not in plain and "in_network_bound_us" not in plain


def test_circuit_capacities_treat_an_in_network_switch_as_an_end():
    """Ranks feed a switch at 50 GB/s and it sends on at 200: a forwarding switch's transfers run at 50
    end to end, so the 200 links are capped; a multicasting switch starts its own transfers, so they are not
    (capping them would make the allgather bound claim 4x too much)."""
    plain = star([50] * 4, [200] * 4, None).circuit_capacities()
    assert {link.bw for link in plain.links} == {50.0}
    copying = star([50] * 4, [200] * 4, SwitchFeatures(multicast=True))
    assert copying.circuit_capacities() is copying
    # each rank sends its piece M once at 50 GB/s and the switch copies it: M / 50 is achievable; the
    # capped fabric's (N-1)·M / 50 is not a bound there
    b = compute_bounds(copying, "allgather", GiB)
    assert b.bandwidth_bound_us == pytest.approx(GiB / 4 / (50 * 1e3))
    assert compute_bounds(star([50] * 4, [200] * 4, None), "allgather", GiB).details["cut_bound_us"] == pytest.approx(
        3 * GiB / 4 / (50 * 1e3))


def test_a_host_only_program_is_told_its_host_only_bound():
    # the bound of a fabric whose switch reduces counts that switch; a program that does not use it is named the
    # host-only bound it can reach (fuzz65: a multicast star's allreduce at 0.651 of the first, 0.733 of the second)
    from synth.pipeline import synthesize

    t = load_topology("dgx-h100-nvls")
    host = synthesize(t, "allreduce", 64 * 2**20, "trees")
    only = compute_bounds(t, "allreduce", 64 * 2**20).host_only_bound_us
    assert only > host.bound_us
    assert any(f"host-only bound ({only:.1f} us)" in note for note in host.notes)
    assert not any("host-only" in note for note in synthesize(t, "allreduce", 64 * 2**20, "nvls").notes)

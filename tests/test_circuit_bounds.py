"""Bounds that charge a rank's links for the narrow routes into its group (synth.circuit_bounds): the closed form
on leaves under narrow uplinks, nothing changed where every route is as wide as the links it ends on, and no
verified program of any method beats them on small fabrics of narrow switch routes (a brute force over methods)."""

from __future__ import annotations

import random

import pytest

from synth.circuit_bounds import charged_gossip, reception_ratio
from synth.lower_bounds import compute_bounds, without_dead_ends
from synth.topology.families import fabric_family
from synth.topology.io import parse_topology
from synth.topology.routes import route_capacities
from tests.schedule_check import programs_at_or_above_bound

MiB = 2**20
SEEDS = 10


def leaf_spine(leaves: int, per_leaf: int, port: float, uplink: float, spines: int = 1):
    """``leaves`` leaf switches of ``per_leaf`` ranks on ``port`` GB/s links, each joined to every spine at
    ``uplink`` GB/s."""
    links = [{"src": leaf * per_leaf + i, "dst": f"leaf{leaf}", "bw": port, "alpha": 0.5}
             for leaf in range(leaves) for i in range(per_leaf)]
    links += [{"src": f"leaf{leaf}", "dst": f"spine{s}", "bw": uplink, "alpha": 1.0}
              for leaf in range(leaves) for s in range(spines)]
    switches = [f"leaf{leaf}" for leaf in range(leaves)] + [f"spine{s}" for s in range(spines)]
    return parse_topology({"name": f"ls{leaves}x{per_leaf}", "ranks": leaves * per_leaf, "switches": switches,
                           "links": links})


def capped(topology):
    return without_dead_ends(route_capacities(topology.circuit_capacities()))


@pytest.mark.parametrize("leaves, per_leaf, port, uplink, spines", [(5, 3, 50.0, 33.0, 3), (3, 4, 200.0, 100.0, 2),
                                                                    (4, 2, 100.0, 25.0, 2)])
def test_a_leafs_ports_take_other_leaves_pieces_at_the_uplinks_rate(leaves, per_leaf, port, uplink, spines):
    # a leaf's R ports receive R(N - 1) pieces; the N - R from other leaves arrive over spines, each holding its
    # port for port / uplink of a piece time: T >= (R(N - 1) + (port / uplink - 1)(N - R)) M / (R port)
    t = leaf_spine(leaves, per_leaf, port, uplink, spines)
    n, r = t.num_ranks, per_leaf
    expected = (r * (n - 1) + (port / uplink - 1) * (n - r)) / (r * port)
    leaves_of_ranks = tuple(tuple(range(leaf * r, (leaf + 1) * r)) for leaf in range(leaves))
    ratio, group = reception_ratio(capped(t), leaves_of_ranks)
    assert ratio == pytest.approx(expected, rel=1e-6)
    assert len(group) == per_leaf
    bounds = compute_bounds(t, "allgather", 2**30)
    assert bounds.bandwidth_bound_us == pytest.approx(2**30 / n * expected / 1e3, rel=1e-6)
    assert bounds.details["bandwidth_method"].startswith("receptions of a group")
    assert bounds.bandwidth_bound_us > bounds.details["forestcoll_cut_us"] * 1.05
    # allreduce: 2N - 2 calls per element, 2g - 2 of them between leaves, each of those charged port / uplink
    gossip = charged_gossip(capped(t), (tuple(rank // r for rank in range(n)),))
    assert gossip == pytest.approx((2 * n - 2 + (port / uplink - 1) * (2 * leaves - 2)) / (n * port), rel=1e-6)
    assert compute_bounds(t, "allreduce", 2**30).details["binding_component"] == "charged_traffic_us"


def test_wide_routes_change_nothing():
    # every bench fabric's route into a group is as wide as the links it ends on (or the cut bounds are higher):
    # the bounds are the ones before
    family = {f.name: f for f in fabric_family()}
    for name in ("a100x4", "h100x3", "mi250x2-ib16", "leafspine-4x4-2to1", "mixed-a100-h100"):
        t = family[name].build()
        for collective in ("allgather", "allreduce"):
            bounds = compute_bounds(t, collective, 2**30)
            assert "reception_group" not in bounds.details, name
            assert bounds.details.get("binding_component") != "charged_traffic_us", name


def random_switch_fabric(seed: int):
    """Two or three leaves of 1-3 ranks (ports of 40, 50 or 100 GB/s) under 1-3 spines, each uplink 20-50 GB/s:
    routes into a leaf are often narrower than the ports they end on, and the leaves unequal."""
    rng = random.Random(seed)
    leaves, spines = rng.choice((2, 3)), rng.randint(1, 3)
    links, rank = [], 0
    for leaf in range(leaves):
        for _ in range(rng.randint(1, 3)):
            links.append({"src": rank, "dst": f"leaf{leaf}", "bw": rng.choice((40.0, 50.0, 100.0)), "alpha": 0.5})
            rank += 1
        links += [{"src": f"leaf{leaf}", "dst": f"spine{s}", "bw": rng.choice((20.0, 25.0, 33.0, 50.0)),
                   "alpha": 1.0} for s in range(spines)]
    switches = [f"leaf{leaf}" for leaf in range(leaves)] + [f"spine{s}" for s in range(spines)]
    return parse_topology({"name": f"narrow{seed}", "ranks": rank, "switches": switches, "links": links})


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_no_verified_program_beats_the_charged_bounds(seed, collective):
    methods = ("ring", "greedy", "trees", "direct", "hierarchical", "lp", "rdh", "mirror")
    assert len(programs_at_or_above_bound(random_switch_fabric(seed), collective, 64 * MiB, methods)) >= 3


def test_the_random_fabrics_are_where_the_charged_bounds_bind():
    # the brute force above means something: on these fabrics the new bounds are the binding ones (seed 3's was
    # too until spines no send takes were left out: its plain cut then rose above it, 1476.4 -> 1610.6 us)
    allgather = sum("reception" in compute_bounds(random_switch_fabric(seed), "allgather", 64 * MiB)
                    .details["bandwidth_method"] for seed in range(SEEDS))
    allreduce = sum(compute_bounds(random_switch_fabric(seed), "allreduce", 64 * MiB)
                    .details["binding_component"] == "charged_traffic_us" for seed in range(SEEDS))
    assert allgather >= 1 and allreduce >= 4

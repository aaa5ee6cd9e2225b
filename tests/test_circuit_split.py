"""Switch splitting under circuits (synth.synthesis.packing.split_switches): a rank arc routed through the
switches moves at its route's least bandwidth and holds every link of the route, so the arcs split off a link
never need more of its time than there is (docs/cost-model.md, rule 4)."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import pytest

from synth.pipeline import instance, synthesize
from synth.synthesis.packing import integer_fabric
from synth.synthesis.trees.forest import _split_graph
from synth.topology.io import load_topology
from tests.schedule_check import slow_and_fast_boxes

PCIE_TREE = Path(__file__).parent / "fixtures" / "pcie-tree8.yaml"


def _check_split_fits(topology, reverse: bool) -> bool:
    """Split the switches of ``topology`` at its optimal forests' rate (or the least rate that splits) and check
    every link's time; whether some split arc crosses a link wider than its route."""
    planning = topology.reversed() if reverse else topology
    fabric = integer_fabric(planning)
    units = dict(zip(fabric.arcs, fabric.units.tolist()))
    _, k, graph, ratio, _ = _split_graph(topology, fabric, {r: 1 for r in range(topology.num_ranks)}, 256, reverse)
    # the capacity each link had to give: its units at the forest's rate
    scale = Fraction(k) * ratio
    busy: dict[tuple[int, int], Fraction] = defaultdict(Fraction)
    mixed = False
    for (u, v), pool in graph.routes.items():
        for route, count in pool:
            path = (u, *route, v)
            arcs = list(zip(path, path[1:]))
            narrow = min(units[arc] for arc in arcs)
            for arc in arcs:
                busy[arc] += Fraction(count * units[arc], narrow)   # its share of the link's time, in units
                mixed |= units[arc] != narrow and count > 0
    for arc, used in busy.items():
        assert used <= units[arc] * scale, (planning.node_name(arc[0]), planning.node_name(arc[1]))
    return mixed


@pytest.mark.parametrize("slow, fast, fast_boxes", [(10.0, 40.0, 2), (12.5, 50.0, 2), (25.0, 50.0, 3)])
@pytest.mark.parametrize("reverse", [False, True])
def test_split_arcs_fit_each_links_time(slow, fast, fast_boxes, reverse):
    topology = instance(slow_and_fast_boxes(slow, fast, fast_boxes=fast_boxes), "allgather", 2**30).topology
    assert _check_split_fits(topology, reverse), "some split arc crosses a link wider than its route"


@pytest.mark.parametrize("reverse", [False, True])
def test_a_pcie_tree_with_a_slower_socket_link_splits(reverse):
    # a join over the 20 GB/s socket link takes 32/20 of each 32 GB/s piece it joins; the cut check once counted
    # one unit each, so the rank pairs under a PCIe switch were split off first, took every rank's port, and no
    # rate split at all ("no tree packing fits this fabric's fixed routes")
    topology = load_topology(PCIE_TREE)
    assert _check_split_fits(topology, reverse)


def test_trees_runs_on_a_pcie_tree():
    # trees failed there and auto kept multiring at 0.6245 of the bound
    result = synthesize(load_topology(PCIE_TREE), "allgather", 2**30, "trees")
    assert result.bound_us / result.time_us >= 0.65


def switch_tree(ranks_per_leaf: int = 4, top_bw: float = 50.0):
    """Three levels of switches: 4 leaves of ``ranks_per_leaf`` ranks (100 GB/s), two aggregation switches of two
    leaves each (100 GB/s), one top switch (``top_bw``: 4:1 at 50)."""
    from synth.topology.io import parse_topology

    n = 4 * ranks_per_leaf
    links = [{"src": r, "dst": f"leaf{r // ranks_per_leaf}", "bw": 100, "alpha": 0.5} for r in range(n)]
    links += [{"src": f"leaf{i}", "dst": f"agg{i // 2}", "bw": 100, "alpha": 1.0} for i in range(4)]
    links += [{"src": f"agg{i}", "dst": "top", "bw": top_bw, "alpha": 1.0} for i in range(2)]
    return parse_topology({"name": "switch-tree", "ranks": n, "links": links,
                           "switches": [f"leaf{i}" for i in range(4)] + ["agg0", "agg1", "top"]})


@pytest.mark.parametrize("reverse", [False, True])
def test_a_switch_tree_splits_from_its_root(reverse):
    # split leaves first, the ranks under a leaf took each other's ports and the top's traffic found none left, at
    # any rate ("no tree packing fits this fabric's fixed routes"); the root first, the long routes come first
    topology = switch_tree()
    assert _check_split_fits(topology, reverse)


def test_trees_beats_the_ring_on_a_switch_tree():
    topology = switch_tree()
    ring = synthesize(topology, "allgather", 2**30, "multiring")
    trees = synthesize(topology, "allgather", 2**30, "trees")
    assert trees.time_us < 0.95 * ring.time_us    # 18902.5 against 20207.7 us


def dragonfly(groups: int = 4):
    """``groups`` groups of two switches (100 GB/s between them) with two ranks each (50 GB/s), one 25 GB/s global
    link between every two groups, spread over the groups' switches."""
    from itertools import combinations

    from synth.topology.model import Link, Topology

    n = groups * 4
    switch = {(g, s): n + 2 * g + s for g in range(groups) for s in range(2)}
    pairs = [(g * 4 + 2 * s + r, switch[(g, s)], 50.0, 0.5) for g in range(groups) for s in range(2) for r in range(2)]
    pairs += [(switch[(g, 0)], switch[(g, 1)], 100.0, 0.3) for g in range(groups)]
    pairs += [(switch[(a, i % 2)], switch[(b, (i + 1) % 2)], 25.0, 1.5)
              for i, (a, b) in enumerate(combinations(range(groups), 2))]
    links = tuple(Link(u, v, bw, alpha) for a, b, bw, alpha in pairs for u, v in ((a, b), (b, a)))
    return Topology("dragonfly", n, links, switches=tuple(f"g{g}s{s}" for g in range(groups) for s in range(2)))


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_trees_takes_the_orientation_that_splits(collective):
    # reversed, with its circuits charged, the dragonfly's switches do not split along the routes at any rate; the
    # flipped orientation's failure made trees fail ("no tree packing fits this fabric's fixed routes") though the
    # broadcast trees split: each phase now takes the orientation that splits
    from synth.verification import verify

    t = dragonfly()
    planned = instance(t, collective, 2**30).topology   # the route capacities the methods plan on
    with pytest.raises(Exception, match="no tree packing fits"):
        _split_graph(planned, integer_fabric(planned.reversed()), {r: 1 for r in range(t.num_ranks)}, 16, True)
    result = synthesize(t, collective, 2**30, "trees")
    assert verify(result.program, result.collective).ok and result.bound_us / result.time_us > 0.35

"""Switch splitting under circuits (synth.synthesis.packing.split_switches): a rank arc routed through the
switches moves at its route's least bandwidth and holds every link of the route, so the arcs split off a link
never need more of its time than there is (docs/cost-model.md, rule 4)."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import pytest

from synth.pipeline import instance
from synth.synthesis.packing import integer_fabric
from synth.synthesis.trees.forest import _split_graph
from tests.schedule_check import slow_and_fast_boxes


@pytest.mark.parametrize("slow, fast, fast_boxes", [(10.0, 40.0, 2), (12.5, 50.0, 2), (25.0, 50.0, 3)])
@pytest.mark.parametrize("reverse", [False, True])
def test_split_arcs_fit_each_links_time(slow, fast, fast_boxes, reverse):
    topology = instance(slow_and_fast_boxes(slow, fast, fast_boxes=fast_boxes), "allgather", 2**30).topology
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
    assert mixed, "some split arc crosses a link wider than its route"
    for arc, used in busy.items():
        assert used <= units[arc] * scale, (planning.node_name(arc[0]), planning.node_name(arc[1]))

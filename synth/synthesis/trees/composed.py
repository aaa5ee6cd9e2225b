"""Composed forests for boxes joined by rails: a rate-optimal forest of one box, copied into every box, fed by
the rails between boxes (issue 31, "composition with a proof").

On a fabric of equal boxes (:func:`synth.topology.structure.aligned_boxes`: position ``g`` of every box is the
same rank of the box's link graph) where rank ``g`` of a box reaches rank ``g`` of every other box by its own
route (a NIC to a switch, or a direct link), the tree of root ``r = (b, g)`` is

- the rail edges ``r → (b', g)`` for every other box ``b'``, each on the runtime's route between the two ranks;
- in every box ``b''`` the box forest's tree of root ``g``, mapped to that box's ranks.

So each rank's data crosses the network once per other box on its own rail, and inside every box the data that
entered at position ``g`` (the box's own piece of rank ``g``, and what the rail of ``g`` brought) is broadcast
over the box forest's trees of root ``g``. Rate (per root piece ``M``): a rail carries ``K − 1`` pieces, and a box
link carries what the box forest puts on it for ``K`` pieces per position, so the composed time is
``max(rail time, K × box-forest time)``, which :class:`Forest` reports from the links' loads (``ratio``) beside the
whole fabric's cut bound (``optimal``). Where the bound is the rails' cut and the box is fast enough (MI250 boxes
at 12.5-16 GB/s per GCD) the composition is rate-optimal, with far fewer distinct trees than a packing of the
whole fabric (every tree is a copy of one of the box's), which the pipeline then schedules with fewer α.
Reductions use the same construction on the reversed fabric. Boxes with switches inside (NVSwitch) are left to
``railblocks`` and the whole-fabric packing: their box forest would need the switch's edge splitting per copy.

Issue 31 also asks for a stated ratio to the bound: the composed forest's rate over the cut bound is that ratio
(``rate_ratio`` in the schedule's notes), and the pipeline's simulated time is what the program reaches.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from synth.synthesis.packing import integer_fabric, optimal_ratio
from synth.synthesis.trees import tuning
from synth.synthesis.trees.forest import Forest, PlannedTree, plan_forest
from synth.topology.model import Link, Topology
from synth.topology.routes import LazyRoutes
from synth.topology.structure import aligned_boxes, rails_join

Boxes = tuple[tuple[int, ...], ...]
COMPOSED = frozenset({"allgather", "reducescatter", "allreduce"})   # every rank a root


def box_fabric(topology: Topology, box: tuple[int, ...]) -> Topology | None:
    """The links among ``box``'s ranks as a switchless fabric of ``len(box)`` ranks (position order); None where a
    switch has links to the box's ranks only (a switch inside the box) or the box's links do not join its ranks."""
    import networkx as nx

    position = {r: i for i, r in enumerate(box)}
    peers: dict[int, set[int]] = {}
    for link in topology.links:
        if topology.is_switch(link.src):
            peers.setdefault(link.src, set()).add(link.dst)
    if any(reached <= position.keys() for reached in peers.values()):
        return None
    links = tuple(Link(position[link.src], position[link.dst], link.bw, link.alpha) for link in topology.links
                  if link.src in position and link.dst in position)
    graph = nx.DiGraph((link.src, link.dst) for link in links)
    graph.add_nodes_from(range(len(box)))
    if len(box) > 1 and not nx.is_strongly_connected(graph):
        return None
    return Topology(f"{topology.name}-box", len(box), links, ())


def rail_boxes(topology: Topology) -> tuple[Boxes, Topology] | None:
    """(aligned boxes, the first box's fabric) where the construction applies: two or more equal switchless boxes
    whose position ``g`` reaches position ``g`` of every other box on a route of its own (no rank on it); else
    None."""
    boxes = aligned_boxes(topology)
    if boxes is None or len(boxes[0]) < 2:
        return None
    box = box_fabric(topology, boxes[0])
    if box is None:
        return None
    return (boxes, box) if rails_join(boxes, LazyRoutes(topology)) else None


def composed_planner(topology: Topology, max_trees: int = tuning.TUNING.default_max_trees):
    """``planner(roots, reverse) -> Forest`` of the module docstring (every rank a root), or None where the
    fabric has no rail boxes (:func:`rail_boxes`)."""
    found = rail_boxes(topology)
    if found is None:
        return None
    boxes, box = found
    where = {r: (b, g) for b, members in enumerate(boxes) for g, r in enumerate(members)}

    def planner(roots: tuple[int, ...], reverse: bool) -> Forest:
        fabric_topology = topology.reversed() if reverse else topology
        routes = LazyRoutes(fabric_topology)
        fabric = integer_fabric(fabric_topology)
        link_index = {(link.src, link.dst): i for i, link in enumerate(fabric_topology.links)}
        local = plan_forest(box, tuple(range(len(boxes[0]))), reverse=reverse, max_trees=max_trees)
        by_position: dict[int, list[PlannedTree]] = {}
        for tree in local.trees:
            by_position.setdefault(tree.root, []).append(tree)
        trees: list[PlannedTree] = []
        load = np.zeros(len(fabric_topology.links))
        for r in roots:
            b, g = where[r]
            for inner in by_position[g]:
                edges: list[tuple[int, int]] = []
                hops: list[tuple[int, ...]] = []
                for c, members in enumerate(boxes):
                    if c != b:
                        edges.append((r, members[g]))
                        hops.append(tuple(routes[(r, members[g])][1:-1]))
                for members in boxes:
                    for u, v in inner.edges:
                        edges.append((members[u], members[v]))
                        hops.append(())
                trees.append(PlannedTree(r, inner.mult, tuple(edges), tuple(((h, inner.mult),) for h in hops)))
                for (u, v), h in zip(edges, hops):
                    path = (u, *h, v)
                    for a, z in zip(path, path[1:]):
                        load[link_index[(a, z)]] += inner.mult
        rate = Fraction(float((load / (fabric.units * local.k)).max())).limit_denominator(10**6)
        optimal = Fraction(optimal_ratio(fabric, {r: 1 for r in roots})).limit_denominator(10**6)
        return Forest(tuple(trees), local.k, max(rate, optimal), optimal, fabric.unit_GBps, reverse,
                      topology.num_ranks)

    return planner

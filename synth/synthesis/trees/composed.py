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

Where the box's own links are the cut and not the rails (MI250 boxes at 25-50 GB/s per GCD: rails carry ``K − 1``
pieces per NIC, the bound has each NIC bring 3.3 of them into a GCD pair on three boxes at 25 GB/s), the composition
loses rate (0.83-0.96 of the optimum on those fabrics). The network's switches join a box's ranks as well, so the
box forest may also be planned with a share of every rank's network links (:func:`box_with_network`): an edge
between two ranks of a box with no direct link then runs on their route through the network, as the runtime's
route is. The rails and those routes share the NICs, and the composed rate counts both (0.97-0.995 of the
optimum there).

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


NETWORK_SHARES = (Fraction(1, 4), Fraction(1, 2))   # shares of each rank's network links the box forest may use


def box_with_network(topology: Topology, box: tuple[int, ...], routes: LazyRoutes,
                     share: Fraction) -> Topology | None:
    """:func:`box_fabric` plus one switch ``net`` joining every position at ``share`` of its rank's links to the
    network (each way), standing for the routes out of the box and back into it: the network's switches join the
    box's ranks too, and where its own links are the cut (MI250 boxes at 25-50 GB/s per GCD: the rails leave most
    of the NICs idle) the box forest can use them. None where two of the box's ranks without a direct link have
    no switch route, or a rank has no link to a switch."""
    inner = box_fabric(topology, box)
    if inner is None:
        return None
    direct = {(link.src, link.dst) for link in inner.links}
    for u in range(len(box)):
        for v in range(len(box)):
            if u != v and (u, v) not in direct and (box[u], box[v]) not in routes:
                return None
    net = len(box)
    links = list(inner.links)
    for position, rank in enumerate(box):
        out = [lk for lk in topology.out_links[rank] if topology.is_switch(lk.dst)]
        into = [lk for lk in topology.in_links[rank] if topology.is_switch(lk.src)]
        if not out or not into:
            return None
        links.append(Link(position, net, float(sum(lk.bw for lk in out) * share), min(lk.alpha for lk in out)))
        links.append(Link(net, position, float(sum(lk.bw for lk in into) * share), min(lk.alpha for lk in into)))
    return Topology(f"{topology.name}-box-net", len(box), tuple(links), ("net",))


def composed_planner(topology: Topology, max_trees: int = tuning.TUNING.default_max_trees, network: bool = False):
    """``planner(roots, reverse) -> Forest`` of the module docstring (every rank a root), or None where the
    fabric has no rail boxes (:func:`rail_boxes`).

    ``network``: the box forest is planned with each of :data:`NETWORK_SHARES` of its ranks' network links
    instead (:func:`box_with_network`: a box edge between ranks with no direct link then runs on their route
    through the network's switches) and the composition of the least rate is kept; None where no share
    applies."""
    found = rail_boxes(topology)
    if found is None:
        return None
    boxes, box = found
    where = {r: (b, g) for b, members in enumerate(boxes) for g, r in enumerate(members)}
    lazy = LazyRoutes(topology)
    locals_ = [box]
    if network:
        locals_ = [b for b in (box_with_network(topology, boxes[0], lazy, share) for share in NETWORK_SHARES)
                   if b is not None]
        if not locals_:
            return None

    def composed(fabric_topology: Topology, routes: LazyRoutes, local: Forest,
                 roots: tuple[int, ...]) -> tuple[Fraction, tuple[PlannedTree, ...]]:
        """(rate, trees) of the rails plus ``local`` copied into every box."""
        fabric = integer_fabric(fabric_topology)
        link_index = {(link.src, link.dst): i for i, link in enumerate(fabric_topology.links)}
        by_position: dict[int, list[PlannedTree]] = {}
        for tree in local.trees:
            by_position.setdefault(tree.root, []).append(tree)
        trees: list[PlannedTree] = []
        load = np.zeros(len(fabric_topology.links))
        for r in roots:
            b, g = where[r]
            for inner in by_position[g]:
                edges: list[tuple[int, int]] = []
                pools: list[tuple[tuple[tuple[int, ...], int], ...]] = []
                for c, members in enumerate(boxes):
                    if c != b:
                        edges.append((r, members[g]))
                        pools.append(((tuple(routes[(r, members[g])][1:-1]), inner.mult),))
                for members in boxes:
                    for (u, v), pool in zip(inner.edges, inner.routes):
                        a, z = members[u], members[v]
                        edges.append((a, z))
                        # a route through the stand-in switch is the ranks' route through the network
                        pools.append(tuple(((tuple(routes[(a, z)][1:-1]) if hops else ()), units)
                                           for hops, units in pool))
                trees.append(PlannedTree(r, inner.mult, tuple(edges), tuple(pools)))
                for (u, v), pool in zip(edges, pools):
                    for hops, units in pool:
                        path = (u, *hops, v)
                        for a, z in zip(path, path[1:]):
                            load[link_index[(a, z)]] += units
        return Fraction(float((load / (fabric.units * local.k)).max())).limit_denominator(10**6), tuple(trees)

    def planner(roots: tuple[int, ...], reverse: bool) -> Forest:
        fabric_topology = topology.reversed() if reverse else topology
        routes = LazyRoutes(fabric_topology)
        positions = tuple(range(len(boxes[0])))
        best = None
        for local_fabric in locals_:
            local = plan_forest(local_fabric, positions, reverse=reverse, max_trees=max_trees)
            rate, trees = composed(fabric_topology, routes, local, roots)
            if best is None or rate < best[0]:
                best = (rate, trees, local.k)
        assert best is not None
        rate, trees, k = best
        fabric = integer_fabric(fabric_topology)
        optimal = Fraction(optimal_ratio(fabric, {r: 1 for r in roots})).limit_denominator(10**6)
        return Forest(trees, k, max(rate, optimal), optimal, fabric.unit_GBps, reverse, topology.num_ranks)

    return planner

"""Structure read from the fabric itself: boxes (machines) and their rank-for-rank alignment.

A topology file's ``machines`` key is an optional hint. Methods that work box by box use
:func:`boxes_of`, which always reads the boxes from the graph, so a hint consistent with the graph
never changes a result, and neither does its absence (docs/topology.md: ``machines`` is optional).

**Boxes** (:func:`infer_boxes`). Order the links by quality, ``(bw, -alpha)`` ascending (alpha only
breaks ties between links of one bandwidth: a NIC's 25 GB/s, 2 µs uplink ranks below a 25 GB/s, 0 µs
GPU-NIC link). Drop the links of the lowest classes, one class at a time, and take the connected
components of what is left (ranks and switches, links undirected). At the first class whose removal
splits the ranks, the components are boxes if

- every component holding a rank holds at least 2 ranks (a torus, a mesh, a ring, a hypercube or a
  fully connected fabric of equal links falls apart into single ranks: no boxes), and
- no dropped link joins two nodes of one component (the box's own fabric is whole: on one mi250 the
  50 GB/s xGMI links also run inside the packages the 100 and 200 GB/s links join, so those are not
  boxes; on mi250-2node only the 16 GB/s IB links are dropped, each between a box and the IB switch).

Otherwise the fabric has no box structure and the result is ``()``, as for one box holding every rank
(a single-box ``machines`` hint says nothing a method could use). The first split is the one by the
slowest class, so for boxes under an oversubscribed spine it finds the groups behind each spine port.
Cost: one connected-components pass (scipy) per class up to the first split.

**Alignment** (:func:`aligned_boxes`). Methods that pair rank ``i`` of one box with rank ``i`` of another
(rails, mirrors) need the boxes in an order where position ``i`` means the same place: each box's
ranks ordered so that the map between boxes preserves every link inside the boxes (bandwidth and α),
the ascending order where that already holds, else an isomorphism found by VF2 (networkx).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from synth.topology.model import Topology

Boxes = tuple[tuple[int, ...], ...]


def _components(topology: Topology, keep: np.ndarray) -> np.ndarray:
    """Component label of every node over the links ``keep`` selects (undirected)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    src, dst, _, _ = topology.arrays
    nodes = topology.num_nodes
    graph = coo_matrix((np.ones(int(keep.sum())), (src[keep], dst[keep])), shape=(nodes, nodes))
    return connected_components(graph, directed=True, connection="weak")[1]


def link_classes(topology: Topology) -> np.ndarray:
    """Each link's quality class: its index among the distinct ``(bw, -alpha)`` in ascending order."""
    _, _, bw, alpha = topology.arrays
    keys = np.stack([bw, -alpha], axis=1)
    _, classes = np.unique(keys, axis=0, return_inverse=True)
    return classes.reshape(-1)


def _split(topology: Topology, ranks: list[int], links: np.ndarray, classes: np.ndarray,
           through_switches: bool = False) -> list[tuple] | None:
    """The first clean split of ``ranks`` over the ``links`` mask (module docstring): a list of
    (ranks, links inside) per group, or None where the ranks do not split into boxes. With
    ``through_switches``, also None where a dropped link joins two groups directly (rank to rank): a
    box's own slower links (pairs joined at 50 GB/s, 25 GB/s between pairs) are not a network."""
    src, dst, _, _ = topology.arrays
    for c in np.unique(classes[links]):
        keep = links & (classes > c)
        labels = _components(topology, keep)
        rank_labels = labels[ranks]
        if len(np.unique(rank_labels)) == 1:
            continue   # still one piece: drop the next class too
        dropped = links & (classes <= c)
        if np.any(labels[src[dropped]] == labels[dst[dropped]]):
            return None   # a slow link inside a group: the group's own fabric, not a box boundary
        groups: dict[int, list[int]] = {}
        for rank, label in zip(ranks, rank_labels, strict=True):
            groups.setdefault(int(label), []).append(rank)
        if any(len(group) < 2 for group in groups.values()):
            return None
        if through_switches and np.any(np.isin(labels[src[dropped]], list(groups))
                                       & np.isin(labels[dst[dropped]], list(groups))):
            return None
        return [(group, keep & (labels[src] == label)) for label, group in groups.items()]
    return None


def infer_boxes(topology: Topology) -> Boxes:
    """The boxes of the module docstring: sorted rank tuples in ascending order, or ``()``.

    A group found by the first split is split again by its own links' classes where it splits cleanly
    through switches only, so boxes of different kinds on one network are found too (two H100 boxes
    whose 50 GB/s NICs share an IB switch with 25 GB/s A100 NICs: the first split, at 25 GB/s, leaves
    the H100s together)."""
    n = topology.num_ranks
    if n < 4 or not topology.links:
        return ()
    classes = link_classes(topology)
    found = _split(topology, list(range(n)), np.ones(len(classes), dtype=bool), classes)
    if found is None:
        return ()
    boxes: list[tuple[int, ...]] = []
    while found:
        ranks, links = found.pop()
        inner = _split(topology, ranks, links, classes, through_switches=True) if len(ranks) >= 4 else None
        if inner is None:
            boxes.append(tuple(ranks))
        else:
            found.extend(inner)
    return tuple(sorted(boxes))


def boxes_of(topology: Topology) -> Boxes:
    """The boxes every method uses: :func:`infer_boxes`, whatever ``topology.machines`` says (the hint is
    for checks and plots only, so a consistent hint never changes a result)."""
    return infer_boxes(topology)


def hint_consistent(topology: Topology) -> bool:
    """Whether ``topology.machines`` agrees with the graph: the inferred boxes, or no hint, or one box of
    every rank on a fabric without boxes."""
    hint = tuple(sorted(tuple(sorted(box)) for box in topology.machines))
    inferred = infer_boxes(topology)
    if not hint or hint == inferred:
        return True
    return not inferred and hint == (tuple(topology.ranks),)


def _box_graph(topology: Topology, box: tuple[int, ...]):
    """The links between ranks of ``box`` as a networkx DiGraph with ``bw`` and ``alpha``."""
    import networkx as nx

    inside = set(box)
    graph = nx.DiGraph()
    graph.add_nodes_from(box)
    for link in topology.links:
        if link.src in inside and link.dst in inside:
            graph.add_edge(link.src, link.dst, bw=link.bw, alpha=link.alpha)
    return graph


def _preserves(topology: Topology, first: tuple[int, ...], other: tuple[int, ...]) -> bool:
    """Whether ``first[i] -> other[i]`` maps the links inside ``first`` onto those inside ``other``."""
    to = dict(zip(first, other))
    inside, there = set(first), set(other)
    mine = {(to[link.src], to[link.dst], link.bw, link.alpha) for link in topology.links
            if link.src in inside and link.dst in inside}
    theirs = {(link.src, link.dst, link.bw, link.alpha) for link in topology.links
              if link.src in there and link.dst in there}
    return mine == theirs


def aligned_boxes(topology: Topology, boxes: Boxes | None = None) -> Boxes | None:
    """``boxes`` (default :func:`boxes_of`) with each box's ranks ordered so that position ``i`` of box 0
    maps to position ``i`` of every box by an isomorphism of the links inside the boxes (bandwidth and α
    equal); box 0 stays ascending. None when there are no boxes, or they differ in size or shape."""
    from networkx.algorithms.isomorphism import DiGraphMatcher

    boxes = boxes_of(topology) if boxes is None else boxes
    if len(boxes) < 2 or len({len(box) for box in boxes}) != 1:
        return None
    first = boxes[0]
    out = [first]
    base = _box_graph(topology, first)
    for box in boxes[1:]:
        if _preserves(topology, first, box):
            out.append(box)
            continue
        matcher = DiGraphMatcher(base, _box_graph(topology, box),
                                 edge_match=lambda a, b: a["bw"] == b["bw"] and a["alpha"] == b["alpha"])
        mapping = next(matcher.isomorphisms_iter(), None)   # VF2 explores in a fixed order: deterministic
        if mapping is None:
            return None
        out.append(tuple(mapping[r] for r in first))
    return tuple(out)


def rails_join(boxes: Boxes, routes: Mapping[tuple[int, int], tuple[int, ...]]) -> bool:
    """Whether position ``g`` of every box reaches position ``g`` of every other box by a route of ``routes``
    (a :func:`synth.topology.routes.rank_routes` mapping: a direct link or a switch-only path): the rails of
    boxes joined rank to rank through their NICs."""
    return all((a[g], c[g]) in routes for g in range(len(boxes[0])) for a in boxes for c in boxes if a is not c)

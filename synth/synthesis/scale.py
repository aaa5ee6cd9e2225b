"""Fast tree forests for very large fabrics (hundreds to thousands of ranks), used by ``trees``.

The exact packing (:mod:`synth.synthesis.packing`) needs a max-flow per tree arc, too slow beyond a
few hundred ranks. Here one spanning tree per root is built directly, in near-linear time:

- **Boxes behind switches** (:func:`synth.topology.structure.boxes_of`, with switch routes between
  boxes, e.g. DGX boxes whose GPUs have one NIC each): the tree of root ``r`` (local index ``k`` in
  box ``b``) runs on rail ``k`` only. Over boxes it is a binomial tree on positions ``p = (x - b) mod B``
  (box ``x`` of ``B``): position ``p`` feeds ``p + 2^t`` for every ``2^t > p`` below ``B``; the
  edge joins the rail-``k`` GPUs of the two boxes. Inside each box the piece then walks a chain
  ``k -> k+1 -> ... -> k-1`` (local indices mod the box size), so every GPU sends intra-box only
  to its successor: one send threadblock, no cross-threadblock ordering of the NVSwitch uplink
  (no ``nop`` steps), which keeps a rank of a 1024-rank allgather under MSCCL's 4096 XML nodes.
  Because the tree is rotated with the root's box, every box holds every position once per
  rail, so every NIC receives and sends exactly ``B - 1`` pieces: the box cut
  ``|R \\ box| / B⁺(box)`` is met when the NICs are the bottleneck (a hierarchical broadcast in
  the manner of Blink and NCCL's trees, balanced over the rails). A rank's inter-box peers are
  only the boxes at offsets ``±2^t``: ``⌈log2 B⌉`` per direction, so lowering stays under MSCCL's
  128 depended-on threadblocks (one per peer and direction) even at 128 boxes and more; the depth
  is ``⌈log2 B⌉`` inter-box hops plus the intra-box chain.
- **Switchless graphs** (tori, meshes, hypercubes): a BFS tree per root whose parent choice is
  load-aware: each newly reached rank takes, among its parents in the previous BFS layer, the link
  with the least load so far (per unit of bandwidth). On vertex-transitive graphs this spreads the
  N(N−1) tree arcs almost evenly over the links, close to the cut bound.

- **Tori** (recognised as a ``generators.torus`` grid: row-major ranks, one bandwidth and α): one
  tree ``T0`` for rank 0 and its translates ``T_r = T0 + coord(r)`` for the other roots. A translate
  maps the edges of ``T0`` that point one way along one dimension (a *class*) one-to-one onto that
  class's links, so every link of a class carries exactly one translate of each such edge: with
  ``T0``'s shortest-path parents chosen to even out the class counts, every link carries
  ``(N-1) / (2·dims)`` pieces, the cut bound. Timing is translation-invariant too: a slot per
  edge of ``T0``, distinct within a class, after its parent's slot (list scheduling of one tree on
  ``2·dims`` class "machines", highest subtree first); every translate uses the same slots, so no
  link ever carries two transfers at once. The makespan is ``(N-1)/(2·dims)`` slots plus a few
  (the bandwidth-dependence of Cayley-graph collectives in the manner of Bruck et al. 1997 and
  of ring algorithms on each dimension).

The rate is not certified exact here; the forest reports the achieved ratio from its link loads.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import chain, pairwise

import numpy as np

from synth.arrays import pair_index
from synth.errors import SynthError
from synth.synthesis.packing import Route, integer_fabric
from synth.topology.model import Topology
from synth.topology.routes import ALPHA_TOLERANCE, pick_path
from synth.topology.structure import boxes_of

REBALANCE_PASSES = 3


def switch_route(topology: Topology, u: int, v: int, _cache: dict | None = None) -> Route | None:
    """Switches on the path a program's ``u -> v`` send takes: () for a direct link, else the
    fewest-hop switch-only path of up to three switches, the widest, then least Σα, ties spread by destination
    (:mod:`synth.topology.routes`, searched locally here: a Dijkstra per rank is slow at 1024 ranks);
    None if none."""
    if topology.link(u, v) is not None:
        return ()
    out_sw = [lk for lk in topology.out_links[u] if topology.is_switch(lk.dst)]
    in_sw = {lk.src: lk for lk in topology.in_links[v] if topology.is_switch(lk.src)}
    found: list[tuple[float, float, tuple[int, ...]]] = []   # (narrowest link, Σα, switches)
    for a in out_sw:                       # one switch
        if a.dst in in_sw:
            last = in_sw[a.dst]
            found.append((min(a.bw, last.bw), a.alpha + last.alpha, (a.dst,)))
    if not found:
        for a in out_sw:                   # two switches
            for b in topology.out_links[a.dst]:
                if b.dst in in_sw:
                    last = in_sw[b.dst]
                    found.append((min(a.bw, b.bw, last.bw), a.alpha + b.alpha + last.alpha, (a.dst, b.dst)))
    if not found:
        for a in out_sw:                   # three switches
            for b in topology.out_links[a.dst]:
                if not topology.is_switch(b.dst):
                    continue
                for c in topology.out_links[b.dst]:
                    if c.dst in in_sw:
                        last = in_sw[c.dst]
                        found.append((min(a.bw, b.bw, c.bw, last.bw), a.alpha + b.alpha + c.alpha + last.alpha,
                                      (a.dst, b.dst, c.dst)))
    if not found:
        return None
    # the widest paths where a least-α one is narrower (routes.SourceRoutes), then the least Σα
    least = min(alpha for _, alpha, _ in found)
    widest = max(width for width, _, _ in found)
    if any(width < widest for width, alpha, _ in found if alpha <= least + ALPHA_TOLERANCE):
        found = [item for item in found if item[0] >= widest]
        least = min(alpha for _, alpha, _ in found)
    preds: dict[int, set[int]] = {}
    for _, alpha, switches in found:
        if alpha <= least + ALPHA_TOLERANCE:
            path = (u, *switches, v)
            for a, b in zip(path, path[1:]):
                preds.setdefault(b, set()).add(a)
    return pick_path(u, v, lambda node: sorted(preds.get(node, ())))[1:-1]


def box_trees(topology: Topology, roots: tuple[int, ...]) -> list[tuple[int, list[tuple[int, int]], list[Route]]]:
    """Three-level trees per root over the fabric's boxes (:func:`synth.topology.structure.boxes_of`)."""
    boxes = [list(box) for box in boxes_of(topology)]
    box_of = {r: b for b, box in enumerate(boxes) for r in box}
    if len(box_of) != topology.num_ranks:
        raise SynthError("machines do not cover every rank")
    routes: dict[tuple[int, int], Route] = {}

    def route(u: int, v: int) -> Route:
        key = (u, v)
        if key not in routes:
            found = switch_route(topology, u, v)
            if found is None:
                raise SynthError(f"no switch route from rank {u} to rank {v}")
            routes[key] = found
        return routes[key]

    nb = len(boxes)
    # binomial tree over box positions: (parent position, child position), parents first
    box_arcs = [(p, p + (1 << t)) for t in range(max(nb - 1, 1).bit_length())
                for p in range(min(1 << t, nb)) if p + (1 << t) < nb]
    out = []
    for r in roots:
        b = box_of[r]
        k = boxes[b].index(r)

        def rail(pos: int, b: int = b, k: int = k) -> int:
            box = boxes[(b + pos) % nb]
            return box[k % len(box)]

        def ring(pos: int, b: int = b, k: int = k) -> list[tuple[int, int]]:
            box = boxes[(b + pos) % nb]
            walk = [box[(k + j) % len(box)] for j in range(len(box))]
            return list(zip(walk, walk[1:]))

        edges = ring(0)
        edges += [(rail(p), rail(c)) for p, c in box_arcs]
        for pos in range(1, nb):
            edges += ring(pos)
        out.append((r, edges, [route(u, v) for u, v in edges]))
    return out


def balanced_bfs_trees(topology: Topology, roots: tuple[int, ...],
                       passes: int = REBALANCE_PASSES) -> list[tuple[int, list[tuple[int, int]], list[Route]]]:
    """Load-aware BFS trees on a switchless graph (module docstring), then rebalanced.

    Every tree keeps shortest paths: rank ``v`` hangs below some ``u`` with ``dist(r, u) =
    dist(r, v) - 1``. The greedy first pass sees only the trees built before; each later pass takes
    one tree out at a time and re-picks every parent against the loads of all the others (best
    response), which removes most of the greedy's imbalance (32x32 torus: the busiest link's load
    from 1.19x to ~1.0x the average).
    """
    if topology.switches:
        raise SynthError("balanced BFS trees need a switchless fabric")
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    src, dst, bw, _ = topology.arrays
    n = topology.num_ranks
    order = np.lexsort((dst, src))
    src, dst, bw = src[order].astype(np.int64), dst[order].astype(np.int64), bw[order]
    graph = csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    dist = shortest_path(graph, unweighted=True, indices=list(roots))
    if not np.isfinite(dist).all():
        bad = roots[int(np.nonzero(~np.isfinite(dist).all(axis=1))[0][0])]
        raise SynthError(f"rank {bad} cannot reach every rank")
    load = np.zeros(len(src))
    chosen: list[np.ndarray] = []
    for pos in range(len(roots)):
        pick = _parents(dist[pos], src, dst, bw, load)
        load[pick] += 1
        chosen.append(pick)
    for _ in range(passes):
        for pos in range(len(roots)):
            load[chosen[pos]] -= 1
            chosen[pos] = _parents(dist[pos], src, dst, bw, load)
            load[chosen[pos]] += 1
    out = []
    for pos, r in enumerate(roots):
        pick = chosen[pos]
        pick = pick[np.argsort(dist[pos][dst[pick]], kind="stable")]   # parents before children
        edges = list(zip(src[pick].tolist(), dst[pick].tolist()))
        out.append((r, edges, [()] * len(edges)))
    return out


def _parents(dist: np.ndarray, src: np.ndarray, dst: np.ndarray, bw: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Per non-root rank, the least-loaded (per bandwidth) link from the previous BFS layer."""
    cand = np.nonzero(dist[src] == dist[dst] - 1)[0]
    cost = (load[cand] + 1) / bw[cand]
    pick = cand[np.lexsort((cost, dst[cand]))]
    first = np.ones(pick.size, dtype=bool)
    first[1:] = dst[pick][1:] != dst[pick][:-1]
    return pick[first]


def torus_dims(topology: Topology) -> tuple[int, ...] | None:
    """The dimensions of a torus whose ranks are numbered row-major (as ``generators.torus`` does)
    and whose links all share one bandwidth and α; None for any other fabric."""
    from synth.topology import generators

    if topology.switches or not topology.links:
        return None
    if len({(link.bw, link.alpha) for link in topology.links}) != 1:
        return None
    n = topology.num_ranks
    pairs = {(link.src, link.dst) for link in topology.links}
    if len(pairs) % n or len(pairs) // n % 2:
        return None
    for dims in _ordered_factors(n, len(pairs) // n // 2):
        grid = generators.torus(list(dims))
        if {(link.src, link.dst) for link in grid.links} | {(link.dst, link.src) for link in grid.links} == pairs:
            return dims
    return None


def _ordered_factors(n: int, parts: int, smallest: int = 3) -> list[tuple[int, ...]]:
    """Every ``(d1, ..., d_parts)`` with product ``n`` and each ``d >= smallest`` (a size-2 dimension
    has one link per pair, not two, and is left to the general path)."""
    if parts == 1:
        return [(n,)] if n >= smallest else []
    return [(d, *rest) for d in range(smallest, n + 1) if n % d == 0
            for rest in _ordered_factors(n // d, parts - 1, smallest)]


def translated_tree_arrays(topology: Topology, dims: tuple[int, ...], roots: tuple[int, ...]
                           ) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """(parents, children, slots): the translates of one balanced shortest-path tree of rank 0 (module docstring),
    row ``i`` holding the (parent, child) of every edge of root ``roots[i]``'s tree, edges in the same order in
    every row (int32 arrays, one row per root), and the time slot of each edge (all edges are direct links)."""
    n = topology.num_ranks
    coords = np.array(np.unravel_index(np.arange(n), dims)).T          # row-major, as the generator
    dims_arr = np.array(dims)

    def rank_of(c: np.ndarray) -> np.ndarray:
        return np.ravel_multi_index(tuple((c % dims_arr).T), dims)

    steps = [(k, sign) for k in range(len(dims)) for sign in (1, -1)]
    dist = np.abs(((coords + dims_arr // 2) % dims_arr) - dims_arr // 2).sum(axis=1)   # hops from rank 0
    order = np.argsort(dist, kind="stable").tolist()[1:]
    options: list[list[tuple[int, int]]] = []     # per rank (in ``order``): (class, parent) choices
    for v in order:
        row = []
        for c, (k, sign) in enumerate(steps):
            u = int(rank_of(coords[v] - sign * np.eye(len(dims), dtype=int)[k]))
            if dist[u] == dist[v] - 1:
                row.append((c, u))
        options.append(row)
    picks = _balanced_choice(options, len(steps))
    parent_edge = {v: (options[i][picks[i]][1], v, steps[options[i][picks[i]][0]]) for i, v in enumerate(order)}
    edges = [parent_edge[v][:2] for v in np.argsort(dist, kind="stable").tolist()[1:]]
    classes = [parent_edge[v][2] for _, v in edges]
    slots = _slot_schedule(edges, classes)
    src0 = np.array([u for u, _ in edges], dtype=np.int64)
    dst0 = np.array([v for _, v in edges], dtype=np.int64)
    shifts = coords[np.asarray(roots, dtype=np.int64)]                   # (roots, dims)
    parents = np.empty((len(roots), len(edges)), dtype=np.int32)
    children = np.empty((len(roots), len(edges)), dtype=np.int32)
    for i in range(len(roots)):
        parents[i] = rank_of(coords[src0] + shifts[i])
        children[i] = rank_of(coords[dst0] + shifts[i])
    return parents, children, slots


def _balanced_choice(options: list[list[tuple[int, int]]], classes: int) -> list[int]:
    """One option per rank (in BFS order) so that the most-chosen class is chosen as few times as
    possible. A greedy pass (least-used class so far) mixes the classes evenly over the depths,
    which keeps the slot timing short; where it ends above the least possible maximum, a min-cost
    b-matching (rank -> its classes -> sink, class capacity ``L``; cost 1 per departure from the
    greedy pick) repairs it with the fewest changes, for the least feasible ``L``.
    """
    from ortools.graph.python import min_cost_flow

    used = [0] * classes
    greedy = []
    for row in options:
        pick = min(range(len(row)), key=lambda p: (used[row[p][0]], row[p][0]))
        used[row[pick][0]] += 1
        greedy.append(pick)
    ranks = len(options)
    limit = -(-ranks // classes)
    if max(used) <= limit:
        return greedy
    source, sink = ranks + classes, ranks + classes + 1
    while limit < max(used):
        solver = min_cost_flow.SimpleMinCostFlow()
        arcs = []
        for i, row in enumerate(options):
            solver.add_arc_with_capacity_and_unit_cost(source, i, 1, 0)
            for p, (c, _) in enumerate(row):
                arcs.append((solver.add_arc_with_capacity_and_unit_cost(i, ranks + c, 1, int(p != greedy[i])), i, p))
        for c in range(classes):
            solver.add_arc_with_capacity_and_unit_cost(ranks + c, sink, limit, 0)
        solver.set_node_supply(source, ranks)
        solver.set_node_supply(sink, -ranks)
        if solver.solve() == solver.OPTIMAL:
            picks = list(greedy)
            for arc, i, p in arcs:
                if solver.flow(arc) > 0:
                    picks[i] = p
            return picks
        limit += 1
    return greedy


def _slot_schedule(edges: list[tuple[int, int]], classes: list) -> tuple[int, ...]:
    """Slot per edge of one tree: after its parent edge's slot, distinct within a class, highest
    subtree first (list scheduling)."""
    import heapq

    index_of_child = {v: i for i, (_, v) in enumerate(edges)}
    children: list[list[int]] = [[] for _ in edges]
    roots_edges = []
    for i, (u, _) in enumerate(edges):
        if u in index_of_child:
            children[index_of_child[u]].append(i)
        else:
            roots_edges.append(i)
    height = [0] * len(edges)
    for i in range(len(edges) - 1, -1, -1):   # parents precede children in ``edges``
        height[i] = 1 + max((height[c] for c in children[i]), default=0)
    queues: dict = {c: [] for c in set(classes)}
    for i in roots_edges:
        heapq.heappush(queues[classes[i]], (-height[i], i))
    slots = [0] * len(edges)
    pending: dict[int, list[int]] = {}
    t, placed = 0, 0
    while placed < len(edges):
        for i in pending.pop(t, []):
            heapq.heappush(queues[classes[i]], (-height[i], i))
        for queue in queues.values():
            if queue:
                _, i = heapq.heappop(queue)
                slots[i] = t
                placed += 1
                for c in children[i]:
                    pending.setdefault(t + 1, []).append(c)
        t += 1
    return tuple(slots)


def achieved_ratio(topology: Topology, trees, reverse: bool) -> tuple[Fraction, Fraction]:
    """(ratio, unit) of a one-tree-per-root forest: max over links of load / bandwidth units (``trees``: (root,
    edges, routes) each)."""
    fabric = integer_fabric(topology.reversed() if reverse else topology)
    hops = []     # per tree, the node pairs its edges cross (a direct tree: its edges as they are)
    for _, edges, routes in trees:
        hops.append(edges if not any(routes) else
                    [hop for (u, v), route in zip(edges, routes) for hop in pairwise((u, *route, v))])
    pairs = np.fromiter(chain.from_iterable(chain.from_iterable(hops)), dtype=np.int64).reshape(-1, 2)
    return _max_ratio(link_load(fabric, pairs[:, 0], pairs[:, 1]), fabric), fabric.unit_GBps


def direct_ratio(topology: Topology, parents: np.ndarray, children: np.ndarray,
                 reverse: bool) -> tuple[Fraction, Fraction]:
    """:func:`achieved_ratio` of trees on direct links given as arrays of (parent, child) pairs."""
    fabric = integer_fabric(topology.reversed() if reverse else topology)
    return _max_ratio(link_load(fabric, parents.ravel(), children.ravel()), fabric), fabric.unit_GBps


def link_load(fabric, tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Hops (``tails[i]`` -> ``heads[i]``) per link of ``fabric`` (:func:`synth.arrays.pair_index`); a KeyError
    names a pair with no link."""
    link = pair_index(fabric.tails, fabric.heads, tails, heads)
    if (link < 0).any():
        i = int(np.argmin(link))
        raise KeyError((int(tails[i]), int(heads[i])))
    return np.bincount(link, minlength=len(fabric.units)).astype(np.int64)


def _max_ratio(load: np.ndarray, fabric) -> Fraction:
    return max(Fraction(int(x), int(u)) for x, u in zip(load, fabric.units))

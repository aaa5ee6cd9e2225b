"""Fractional packings of spanning trees on a switchless fabric, and the partition that proves one optimal.

A rank graph's undirected edge ``{u, v}`` has capacity ``c(u, v) = min(bw(u→v), bw(v→u))``: a spanning tree
of weight ``x`` used for a reduction toward a root and a broadcast back from it moves ``x`` GB/s each way
over every one of its edges. The packing LP is

    max Σ_T x_T   s.t.   Σ_{T ∋ e} x_T ≤ c(e)  for every edge e,   x ≥ 0,

over all spanning trees ``T``. By Tutte and Nash-Williams (J. London Math. Soc. 36, 1961), in its fractional
form (the base polytope of the graphic matroid; Cunningham, "Optimal attack and reinforcement of a network",
JACM 32(3), 1985), its optimum equals the graph's *strength*

    min over partitions P of the ranks into |P| ≥ 2 parts of  c(δ(P)) / (|P| - 1),

with ``δ(P)`` the edges between parts. The LP is solved by column generation (Dantzig-Wolfe): the restricted
master over the trees found so far (HiGHS, dual simplex, warm-started as columns arrive) prices the edges
(``y_e ≥ 0``), and the pricing problem is a minimum spanning tree under ``y`` (Kruskal): a tree of price
below 1 raises the LP, and none proves it optimal. The seeds are the breadth-first trees of every rank,
which keeps the packing's trees shallow where the LP does not care.

:func:`strongest_partition` reads a partition off the final prices (the components of the cheap edges, for
every price threshold) and returns the one of least ``c(δ(P)) / (|P| - 1)``; at the LP's optimum that
value equals the packing's rate on every fabric tried (brute force over all partitions of small graphs in
``tests/test_treepack.py``). :func:`synth.lower_bounds.group_traffic` uses the partition for the allreduce
traffic bound, so where the two meet the packing is provably optimal.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from synth.topology.model import Topology

PRICING_ROUNDS = 4000       # column-generation rounds at most (deterministic work, not wall clock)
IMPROVING = 1.0 - 1e-9      # a tree priced below this raises the LP
TIE_ORDERS = 8              # minimum spanning trees per pricing round, one per tie-breaking order
SHALLOW_SLACK = 1e-3        # share of the rate given up for shallower trees
MIN_WEIGHT = 1e-9           # trees whose LP weight is below this are dropped


@dataclass(frozen=True)
class RankGraph:
    """The undirected rank graph of a switchless fabric: edges ``(u, v)`` with ``u < v`` (sorted) and their
    capacities in GB/s (the slower direction)."""

    num_ranks: int
    edges: tuple[tuple[int, int], ...]
    capacity: np.ndarray


@dataclass(frozen=True)
class TreePacking:
    """Spanning trees (each a tuple of edge indices of ``graph``) with their weights in GB/s; ``optimal`` when
    the last pricing found no improving tree, so ``rate`` is the fabric's strength."""

    graph: RankGraph
    trees: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...]
    prices: np.ndarray
    optimal: bool
    strength: float     # the LP's rate: the fabric's strength where ``optimal``

    @property
    def rate(self) -> float:
        return float(sum(self.weights))


def rank_graph(topology: Topology) -> RankGraph | None:
    """The undirected rank graph, or None where the fabric has switches, an edge usable one way only
    leaves the graph disconnected, or there is a single rank."""
    n = topology.num_ranks
    if topology.num_nodes != n or n < 2:
        return None
    both: dict[tuple[int, int], list[float]] = {}
    for link in topology.links:
        pair = (min(link.src, link.dst), max(link.src, link.dst))
        both.setdefault(pair, [0.0, 0.0])[int(link.src > link.dst)] += link.bw
    edges = tuple(sorted(pair for pair, bw in both.items() if min(bw) > 0))
    capacity = np.array([min(both[pair]) for pair in edges])
    graph = RankGraph(n, edges, capacity)
    if _components(graph, np.ones(len(edges), dtype=bool))[1] != 1:
        return None
    return graph


def _components(graph: RankGraph, keep: np.ndarray) -> tuple[np.ndarray, int]:
    """(label per rank, number of components) of the graph's edges where ``keep``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    ends = np.array(graph.edges, dtype=np.int64).reshape(-1, 2)[keep]
    matrix = coo_matrix((np.ones(len(ends)), (ends[:, 0], ends[:, 1])), shape=(graph.num_ranks,) * 2)
    count, labels = connected_components(matrix, directed=False)
    return labels, count


def _min_tree(graph: RankGraph, prices: np.ndarray, ties: np.ndarray) -> tuple[int, ...]:
    """A minimum spanning tree under ``prices`` (Kruskal, ties broken by ``ties``, so deterministic)."""
    parent = list(range(graph.num_ranks))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    tree = []
    for e in np.lexsort((ties, prices)).tolist():
        u, v = graph.edges[e]
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[ru] = rv
            tree.append(e)
            if len(tree) == graph.num_ranks - 1:
                break
    return tuple(sorted(tree))


class _ShortestPathTrees:
    """Pricing over shortest-path trees: for a root ``r``, every other rank takes its cheapest edge to a rank one
    hop nearer ``r``, so the tree's height is ``r``'s eccentricity, the least any tree rooted at ``r`` has.
    Vectorised over all roots: the arcs of every root's breadth-first DAG, sorted per (root, rank) by price."""

    def __init__(self, graph: RankGraph) -> None:
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import shortest_path

        n = graph.num_ranks
        ends = np.array(graph.edges, dtype=np.int64)
        matrix = coo_matrix((np.ones(len(ends)), (ends[:, 0], ends[:, 1])), shape=(n, n)).tocsr()
        dist = shortest_path(matrix, directed=False, unweighted=True).astype(np.int64)
        # arcs (child, parent, edge) both ways round, then per root those where the parent is one hop nearer
        child = np.concatenate([ends[:, 0], ends[:, 1]])
        parent = np.concatenate([ends[:, 1], ends[:, 0]])
        edge = np.concatenate([np.arange(len(ends)), np.arange(len(ends))])
        roots, arcs = np.nonzero(dist[:, parent] == dist[:, child] - 1)
        self.n = n
        self.root = roots
        self.key = roots * n + child[arcs]
        self.edge = edge[arcs]

    def cheapest(self, prices: np.ndarray, count: int) -> list[tuple[int, ...]]:
        """The ``count`` cheapest shortest-path trees under ``prices`` (at most one per root), cheapest first."""
        order = np.lexsort((self.edge, prices[self.edge], self.key))
        keys = self.key[order]
        first = order[np.r_[True, keys[1:] != keys[:-1]]]
        price = np.bincount(self.root[first], weights=prices[self.edge[first]], minlength=self.n)
        trees = []
        for root in np.lexsort((np.arange(self.n), price))[:count].tolist():
            trees.append(tuple(sorted(self.edge[first[self.root[first] == root]].tolist())))
        return trees


def centred(graph: RankGraph, tree: tuple[int, ...]) -> tuple[int, list[int], dict[int, int]]:
    """(root, ranks in breadth-first order from the root, parent of each non-root rank) of ``tree`` rooted at its
    centre: the middle of a longest path, found by two breadth-first sweeps (ties: the smaller rank). Its height
    is ``⌈diameter / 2⌉``, the least of any root."""
    adjacency: list[list[int]] = [[] for _ in range(graph.num_ranks)]
    for e in tree:
        u, v = graph.edges[e]
        adjacency[u].append(v)
        adjacency[v].append(u)

    def bfs(root: int) -> tuple[list[int], dict[int, int]]:
        order, parent = [root], {}
        for u in order:
            for v in adjacency[u]:
                if v != root and v not in parent:
                    parent[v] = u
                    order.append(v)
        return order, parent

    far, _ = bfs(0)
    order, parent = bfs(far[-1])
    path = [order[-1]]
    while path[-1] in parent:
        path.append(parent[path[-1]])
    root = min(path[(len(path) - 1) // 2: len(path) // 2 + 1])
    order, parent = bfs(root)
    return root, order, parent


def depths(order: list[int], parent: dict[int, int]) -> dict[int, int]:
    """Hops from the root (``order[0]``) of every rank of a breadth-first ``order``."""
    depth = {order[0]: 0}
    for v in order[1:]:
        depth[v] = depth[parent[v]] + 1
    return depth


def tree_height(graph: RankGraph, tree: tuple[int, ...]) -> int:
    """The height of ``tree`` rooted at its centre (:func:`centred`)."""
    _, order, parent = centred(graph, tree)
    return max(depths(order, parent).values())


@functools.lru_cache(maxsize=16)
def pack_spanning_trees(topology: Topology, rounds: int = PRICING_ROUNDS) -> TreePacking | None:
    """The LP packing of spanning trees (module docstring), or None where :func:`rank_graph` is None.

    Three stages on one HiGHS model: column generation priced over shortest-path trees (the shallowest
    trees), then over all spanning trees (minimum spanning trees under the prices) until no tree improves
    the rate, which proves it optimal; then, over the trees found, the packing of least total
    ``height × weight`` that keeps ``1 - SHALLOW_SLACK`` of that rate (deep trees cost the pipeline its
    fill and drain: two hops of a chunk per level)."""
    import highspy

    from synth.solvers import silence_fds

    graph = rank_graph(topology)
    if graph is None:
        return None
    m = len(graph.edges)
    with silence_fds():   # HiGHS prints its banner even with output off
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
    h.setOptionValue("solver", "simplex")
    h.setOptionValue("simplex_strategy", 4)   # primal: a new column keeps the basis primal feasible
    h.setOptionValue("presolve", "off")
    h.addRows(m, np.full(m, -highspy.kHighsInf), graph.capacity, 0, np.zeros(m + 1, dtype=np.int32),
              np.zeros(0, dtype=np.int32), np.zeros(0))
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    trees: list[tuple[int, ...]] = []
    known: set[tuple[int, ...]] = set()

    def add(tree: tuple[int, ...]) -> None:
        known.add(tree)
        trees.append(tree)
        h.addCol(1.0, 0.0, highspy.kHighsInf, len(tree), np.array(tree, dtype=np.int32), np.ones(len(tree)))

    def solve() -> np.ndarray:
        with silence_fds():
            h.run()
        return np.maximum(np.abs(np.asarray(h.getSolution().row_dual, dtype=float)), 0.0)

    shortest = _ShortestPathTrees(graph)
    for tree in shortest.cheapest(np.zeros(m), graph.num_ranks):
        if tree not in known:
            add(tree)
    # tie orders for the pricing: prices are degenerate, and each order finds another tree of the same price
    generator = np.random.default_rng(0)
    orders = [np.arange(m), np.arange(m)[::-1].copy()] + [generator.permutation(m) for _ in range(TIE_ORDERS - 2)]
    stage_rounds = 0
    for pricing in ("shortest", "spanning"):
        while stage_rounds < rounds:
            stage_rounds += 1
            prices = solve()
            found = (shortest.cheapest(prices, TIE_ORDERS) if pricing == "shortest"
                     else [_min_tree(graph, prices, ties) for ties in orders])
            fresh = [tree for tree in dict.fromkeys(found)
                     if prices[list(tree)].sum() < IMPROVING and tree not in known]
            if not fresh:
                break
            for tree in fresh:
                add(tree)
    prices = solve()
    best = _min_tree(graph, prices, orders[0])
    optimal = prices[list(best)].sum() >= IMPROVING
    rate = float(h.getInfo().objective_function_value)
    # the shallowest packing within SHALLOW_SLACK of the rate
    heights = np.array([tree_height(graph, tree) for tree in trees], dtype=float)
    h.changeColsCost(len(trees), np.arange(len(trees), dtype=np.int32), heights)
    h.changeObjectiveSense(highspy.ObjSense.kMinimize)
    h.addRow(rate * (1 - SHALLOW_SLACK), highspy.kHighsInf, len(trees), np.arange(len(trees), dtype=np.int32),
             np.ones(len(trees)))
    solve()
    weights = np.asarray(h.getSolution().col_value, dtype=float)
    used = [j for j in range(len(trees)) if weights[j] > MIN_WEIGHT]
    return TreePacking(graph, tuple(trees[j] for j in used), tuple(float(weights[j]) for j in used), prices, optimal,
                       rate)


def partition_strength(graph: RankGraph, labels: np.ndarray) -> float:
    """``c(δ(P)) / (|P| - 1)`` of the partition given by ``labels`` (inf for a single part)."""
    parts = len(set(labels.tolist()))
    if parts < 2:
        return float("inf")
    ends = np.array(graph.edges, dtype=np.int64)
    crossing = labels[ends[:, 0]] != labels[ends[:, 1]]
    return float(graph.capacity[crossing].sum()) / (parts - 1)


def strongest_partition(packing: TreePacking) -> np.ndarray:
    """The partition (label per rank) of least :func:`partition_strength` among the components of the edges
    priced below each distinct price (module docstring); singletons are always among them."""
    graph = packing.graph
    best = np.arange(graph.num_ranks)
    best_value = partition_strength(graph, best)
    for threshold in np.unique(packing.prices):
        labels, _ = _components(graph, packing.prices < threshold)
        value = partition_strength(graph, labels)
        if value < best_value * (1 - 1e-12):
            best, best_value = labels, value
    return best

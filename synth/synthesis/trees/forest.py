"""Forest planning for method trees: ``k`` spanning trees per root at the cut bound's rate (ForestColl,
arXiv 2402.06787; :mod:`synth.synthesis.packing`), and the switch routes of their edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property

import numpy as np

from synth.errors import SynthError
from synth.synthesis.packing import (
    Fabric,
    Route,
    SplitError,
    allowed_subpaths,
    choose_capacities,
    disjoint_pair_split,
    integer_fabric,
    optimal_ratio,
    pack_arborescences,
    seeded_packing,
    slow_link_slack,
    split_switches,
)
from synth.synthesis.timing import tree_heights
from synth.synthesis.trees import tuning
from synth.topology.model import Topology
from synth.topology.routes import rank_routes
from synth.topology.structure import boxes_of

SKEWED_BISECTION = 6   # bisection steps for the rate a weighted forest's split needs (split_rank_fabric): 1/64 of T*

# ---------------------------------------------------------------------------------------------
# the forest
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedTree:
    """A distinct spanning tree: ``edges`` (parent, child) in BFS order on the *planning* fabric;
    ``routes[i]`` lists (switch route, units) for edge ``i`` (units sum to ``mult``)."""

    root: int
    mult: int
    edges: tuple[tuple[int, int], ...]
    routes: tuple[tuple[tuple[Route, int], ...], ...]

    @property
    def depth(self) -> dict[int, int]:
        depth = {self.root: 0}
        for parent, child in self.edges:
            depth[child] = depth[parent] + 1
        return depth

    @cached_property
    def heights(self) -> dict[int, int]:
        """:func:`~synth.synthesis.timing.tree_heights`, computed once per tree (phases and timings share trees)."""
        return tree_heights(self)


@dataclass(frozen=True)
class Forest:
    """``k`` trees per root (as distinct trees with multiplicities) at rate ``ratio`` (fabric units).

    The bandwidth time of a broadcast of ``M`` bytes per root is ``M · ratio / (unit_GBps · 1e3)`` µs;
    ``optimal`` is the cut bound in the same units (``ratio == optimal`` unless ``k`` was capped).
    """

    trees: tuple[PlannedTree, ...]
    k: int
    ratio: Fraction
    optimal: Fraction
    unit_GBps: Fraction
    reversed: bool
    num_ranks: int
    slots: tuple[int, ...] | None = None   # translation-invariant timing (scale.translated_tree_arrays)
    replicated: bool = False               # trees are translates with edges in the same order
    # warm start (plan_forest's ``healthy``): (trees kept from the healthy fabric's forest, its distinct trees)
    reused: tuple[int, int] | None = None
    # root weights per rank (an allreduce's ownership, trees.ownership): root r has k·w_r trees and owns
    # w_r units of the buffer; None: one unit per root
    weights: tuple[int, ...] | None = None
    # packed on capacities that leave slow links slack (:func:`synth.synthesis.packing.slow_link_slack`
    # changed them); False where it did not, or was not asked to
    slack: bool = False
    # translated trees (slots): every tree's (parent, child) pairs as arrays, row i for trees[i] (int32, trees x
    # edges), so that their timing need not read millions of edge tuples (not compared: the trees say the same)
    edge_arrays: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False, repr=False)

    def bandwidth_time_us(self, bytes_per_root: float) -> float:
        """µs to broadcast ``bytes_per_root`` per unit of root weight (per root where roots weigh 1)."""
        return bytes_per_root * float(self.ratio) / (float(self.unit_GBps) * 1e3)

    def weight(self, root: int) -> int:
        """Units of data root ``root`` carries (1 without weights)."""
        return 1 if self.weights is None else self.weights[root]

    def link_units(self) -> dict[tuple[int, int], int]:
        """Tree units each link of the planning fabric carries (node pairs; at most its capacity at the rate)."""
        load: dict[tuple[int, int], int] = {}
        for tree in self.trees:
            for (u, v), pool in zip(tree.edges, tree.routes):
                for route, units in pool:
                    path = (u, *route, v)
                    for arc in zip(path, path[1:]):
                        load[arc] = load.get(arc, 0) + units
        return load


def plan_forest(topology: Topology, roots: tuple[int, ...], *, reverse: bool = False,
                max_trees: int = tuning.TUNING.default_max_trees, healthy: Topology | None = None,
                weights: tuple[int, ...] | None = None, slack: bool = True) -> Forest:
    """Optimal forest for broadcasts from ``roots`` (reduce towards them if ``reverse``).

    Beyond ``TUNING.large_ranks`` ranks the fast constructions of :mod:`synth.synthesis.scale` replace
    the exact packing (one tree per root; the rate they reach is reported, not certified).

    ``healthy``: the fabric ``topology`` is an edited copy of (links removed or slowed, the same ranks;
    docs/cli.md, "Failed and degraded links"). Its forest is planned too, and every tree of it whose routes
    cross no removed or slowed link seeds the packing (:func:`warm_seeds`,
    :func:`synth.synthesis.packing.seeded_packing`); only the remainder is packed afresh. The rate is the one
    a fresh packing reaches (the seeds only take copies that keep the rest completable); ``Forest.reused``
    counts the trees kept.

    ``weights`` (per rank): root ``r`` gets ``k·w_r`` trees, as for a broadcast of ``w_r`` units (an allreduce's
    ownership, :mod:`synth.synthesis.trees.ownership`); no warm start then.

    ``slack``: capacities that leave the slow links slack (:func:`synth.synthesis.packing.slow_link_slack`);
    ``Forest.slack`` says whether that changed them.
    """
    if topology.num_ranks > tuning.TUNING.large_ranks:
        return _large_forest(topology, roots, reverse)
    fabric_topology = topology.reversed() if reverse else topology
    fabric = integer_fabric(fabric_topology)
    weights_of = {r: 1 for r in roots} if weights is None else {r: weights[r] for r in roots if weights[r] > 0}
    if weights is not None:
        healthy = None   # the healthy fabric's trees were packed for equal roots
    optimal, k, graph, ratio, slackened = _split_graph(topology, fabric, weights_of, max_trees, reverse, slack)
    pools = {key: [list(item) for item in pool] for key, pool in graph.routes.items()}
    trees = []
    reused = None
    if healthy is not None and healthy.num_ranks == topology.num_ranks:
        old = plan_forest(healthy, roots, reverse=reverse, max_trees=max_trees, slack=slack)
        seeds = warm_seeds(old, healthy, topology, k)
        kept, packed = seeded_packing(topology.num_ranks, dict(graph.cap), weights_of, k,
                                      [(root, edges, wanted) for root, edges, wanted, _ in seeds])
        preferred = {(seed[0], seed[1]): seed[3] for seed in seeds}
        for tree in kept:
            hints = preferred[(tree.root, tuple(tree.edges))]
            routes = [tuple(draw_units(pools[edge], tree.mult, hint)) for edge, hint in zip(tree.edges, hints)]
            trees.append(PlannedTree(tree.root, tree.mult, tuple(tree.edges), tuple(routes)))
        reused = (len(kept), len(old.trees))
    else:
        packed = pack_arborescences(topology.num_ranks, dict(graph.cap), weights_of, k)
    for tree in packed:
        routes = []
        for edge in tree.edges:
            routes.append(tuple(draw_units(pools[edge], tree.mult)))
        trees.append(PlannedTree(tree.root, tree.mult, tuple(tree.edges), tuple(routes)))
    return Forest(tuple(trees), k, ratio, optimal, fabric.unit_GBps, reverse, topology.num_ranks, reused=reused,
                  weights=weights, slack=slackened)


def _split_graph(topology: Topology, fabric: Fabric, weights: dict[int, int], max_trees: int, reverse: bool,
                 slack: bool = True, bisection: int = 24):
    """(optimal rate, k, rank-to-rank split of the switches, the rate it keeps, whether the slow links' slack was
    left) for forests from roots of ``weights`` with at most ``max_trees`` per unit of weight: capacities at the
    optimal rate (or the nearest ``k`` allows; ``slack``: with the slow links' slack left where that splits,
    :func:`slow_link_slack`), then disjoint rank pairings first, edge splitting along canonical routes next, else
    the least rate at which that splits (:func:`_degraded_split`, ``bisection`` steps)."""
    optimal = optimal_ratio(fabric, weights)
    k, caps, ratio = choose_capacities(fabric, weights, optimal, max_trees)
    allowed = allowed_routes(topology, reverse)
    # Reductions run on the reversed fabric; pairing u with u-1 there makes their real transfers
    # go u -> u+1 like the broadcasts', so allreduce keeps one peer per rank in both phases.
    step = -1 if reverse else 1
    # The slow links' slack first, only at the exact rate (capacities rounded for a capped k leave every link some
    # slack already, and trimming them to their tight values reshapes the forest: mi250-2node at 16 trees per root,
    # 0.952 -> 0.938); capacities that leave it may not split along the routes, so the full ones come next.
    trimmed = slow_link_slack(fabric, weights, k, caps, max_trees) if slack and ratio == optimal else (k, caps)
    for k_tried, caps_tried in [trimmed] + ([(k, caps)] if trimmed[1] is not caps else []):
        slackened = caps_tried is not caps
        for pairs in _disjoint_pair_candidates(topology, reverse):
            graph = disjoint_pair_split(fabric, caps_tried, weights, k_tried, pairs)
            if graph is not None:
                return optimal, k_tried, graph, ratio, slackened
        try:
            return (optimal, k_tried, split_switches(fabric, caps_tried, weights, k_tried, allowed, step), ratio,
                    slackened)
        except SplitError:
            pass
    return optimal, k, *_degraded_split(fabric, weights, optimal, k, allowed, step, bisection), False


def split_rank_fabric(topology: Topology, reverse: bool = False, weights: tuple[int, ...] | None = None) -> Fabric:
    """The fabric as ranks only: each rank pair's share of the links, as the switch split of the optimal
    forest with one unit per root gives it (:func:`_split_graph`, canonical routes only), at that forest's
    rate. Any forest packed on it routes through the switches as the runtime's paths do; on a switchless
    fabric it is the fabric itself. With ``weights``, the split of the forest with ``weights[r]`` units from root
    ``r``; where that needs a rate below the optimum, it is found to ``SKEWED_BISECTION`` steps (at 32 ranks each
    step is a complete edge splitting, about a second)."""
    planning = topology.reversed() if reverse else topology
    fabric = integer_fabric(planning)
    if not topology.switches:
        return fabric
    n = topology.num_ranks
    units = {r: 1 for r in range(n)} if weights is None else {r: w for r, w in enumerate(weights) if w > 0}
    _, k, graph, ratio, _ = _split_graph(topology, fabric, units, tuning.TUNING.default_max_trees, reverse,
                                         slack=False, bisection=24 if weights is None else SKEWED_BISECTION)
    arcs = sorted((u, v, c) for (u, v), c in graph.cap.items() if c > 0)
    # c units of capacity carry c trees of 1/k of a root's data each, at rate ``ratio``: c / (k·ratio) fabric units
    return Fabric(n, n, np.array([a[0] for a in arcs], dtype=np.int64), np.array([a[1] for a in arcs], dtype=np.int64),
                  np.array([a[2] for a in arcs], dtype=np.int64), fabric.unit_GBps / (k * ratio))


def warm_seeds(old: Forest, healthy: Topology, topology: Topology,
               k: int) -> list[tuple[int, tuple[tuple[int, int], ...], int, tuple[tuple[Route, ...], ...]]]:
    """The trees of ``old`` (planned on ``healthy``) that ``topology``, an edited copy of it, leaves untouched:
    ``(root, edges, copies wanted, routes per edge)`` in ``old``'s order, switch ids renamed to ``topology``'s.

    A tree is untouched when every link its routes cross (on the planning fabric: reversed for reductions) is
    still there with the same bandwidth and α. It wants its share of its root's data at ``k`` trees per root,
    ``⌈mult · k / old.k⌉`` copies (at least one), as it carried ``mult / old.k`` of it on the healthy fabric."""
    old_plan = healthy.reversed() if old.reversed else healthy
    new_plan = topology.reversed() if old.reversed else topology
    names = {topology.node_name(v): v for v in range(topology.num_nodes)}
    rename = {v: names.get(healthy.node_name(v)) for v in range(healthy.num_nodes)}

    def same(a: int, b: int) -> bool:
        was, now = old_plan.link(a, b), None
        if rename[a] is not None and rename[b] is not None:
            now = new_plan.link(rename[a], rename[b])
        return was is not None and now is not None and now.bw == was.bw and now.alpha == was.alpha

    seeds = []
    for tree in old.trees:
        paths = [(u, *route, v) for (u, v), pool in zip(tree.edges, tree.routes) for route, _ in pool]
        if not all(same(a, b) for path in paths for a, b in zip(path, path[1:])):
            continue
        routes = tuple(tuple(tuple(rename[w] for w in route) for route, _ in pool) for pool in tree.routes)
        wanted = max(1, -(-tree.mult * k // old.k))
        seeds.append((tree.root, tuple(tree.edges), wanted, routes))
    return seeds


def _large_forest(topology: Topology, roots: tuple[int, ...], reverse: bool) -> Forest:
    from synth.synthesis import scale

    fabric_topology = topology.reversed() if reverse else topology
    dims = scale.torus_dims(fabric_topology)
    if dims is not None:
        return _translated_forest(topology, fabric_topology, dims, roots, reverse)
    if topology.switches and boxes_of(topology):
        raw = scale.box_trees(fabric_topology, roots)
    else:
        raw = scale.balanced_bfs_trees(fabric_topology, roots)
    ratio, unit = scale.achieved_ratio(topology, raw, reverse)
    trees = tuple(PlannedTree(r, 1, tuple(edges), tuple(((route, 1),) for route in routes))
                  for r, edges, routes in raw)
    replicated = bool(topology.switches and boxes_of(topology))
    return Forest(trees, 1, ratio, ratio, unit, reverse, topology.num_ranks, None, replicated)


def _translated_forest(topology: Topology, fabric_topology: Topology, dims: tuple[int, ...], roots: tuple[int, ...],
                       reverse: bool) -> Forest:
    """The translated trees of a torus (:func:`synth.synthesis.scale.translated_tree_arrays`) as a Forest. A 64×64
    torus has 16.8 M edges: every tree shares one int object per rank and one tuple of direct routes."""
    from synth.synthesis import scale

    parents, children, slots = scale.translated_tree_arrays(fabric_topology, dims, roots)
    ratio, unit = scale.direct_ratio(topology, parents, children, reverse)
    ranks = list(range(topology.num_ranks))
    direct = ((((), 1),),) * parents.shape[1]
    trees = tuple(PlannedTree(r, 1, tuple(zip(map(ranks.__getitem__, p.tolist()), map(ranks.__getitem__, c.tolist()))),
                              direct) for r, p, c in zip(roots, parents, children))
    return Forest(trees, 1, ratio, ratio, unit, reverse, topology.num_ranks, slots, False,
                  edge_arrays=(parents, children))


def _disjoint_pair_candidates(topology: Topology, reverse: bool):
    """Rank pairings to try with :func:`disjoint_pair_split`, as switch paths on the planning fabric.

    With equal boxes: GPU ``i`` of box ``b`` to GPU ``i`` of box ``b + s`` (rails; box shift
    ``s = 1``, then half the boxes) before a ring inside each box; then a ring over all ranks and
    the half-way shift. Pairs joined by a direct link need no switch and are skipped; reductions
    plan on the reversed fabric, where the real pair ``u -> v`` is the arc ``v -> u``.
    """
    if not topology.switches:
        return
    routes = rank_routes(topology)
    n = topology.num_ranks

    def paths(pairs):
        found = (routes.get(pair) for pair in pairs)
        return [path[::-1] if reverse else path for path in found if path is not None and len(path) > 2]

    boxes = boxes_of(topology)
    if len(boxes) > 1 and len({len(box) for box in boxes}) == 1:
        width, count = len(boxes[0]), len(boxes)
        in_box = [(box[i], box[(i + 1) % width]) for box in boxes for i in range(width)]
        for shift in dict.fromkeys((1, count // 2)):
            rails = [(boxes[b][i], boxes[(b + shift) % count][i]) for b in range(count) for i in range(width)]
            yield paths(rails + in_box)
    for shift in dict.fromkeys((1, n // 2)):
        yield paths([(u, (u + shift) % n) for u in range(n)])


def allowed_routes(topology: Topology, reverse: bool) -> set[tuple[int, ...]] | None:
    """Path pieces a planned arc may use: those of the real fabric's canonical routes (reversed
    when planning on the reversed fabric, whose arcs run backwards in time)."""
    if not topology.switches:
        return None
    pieces = allowed_subpaths(rank_routes(topology))
    return {piece[::-1] for piece in pieces} if reverse else pieces


def _degraded_split(fabric, weights: dict[int, int], optimal: Fraction, k: int, allowed, step: int,
                    bisection: int = 24):
    """The least rate ``T >= T*`` (``bisection`` steps, ``k`` fixed) at which switches split completely along
    canonical routes: fixed per-peer routes can make the cut bound unreachable (e.g. one of two
    spines never on a shortest path)."""
    def attempt(t: float):
        caps = np.floor(fabric.units * t * k + 1e-9).astype(np.int64)
        try:
            return split_switches(fabric, caps, weights, k, allowed, step), caps
        except SplitError:
            return None, caps

    lo, hi = float(optimal), float(optimal) * 2
    while attempt(hi)[0] is None:
        lo, hi = hi, hi * 2
        if hi > float(optimal) * 1e6:
            raise SynthError("no tree packing fits this fabric's fixed routes")
    for _ in range(bisection):
        mid = (lo + hi) / 2
        if attempt(mid)[0] is None:
            lo = mid
        else:
            hi = mid
    graph, caps = attempt(hi)
    achieved = max(Fraction(int(c), int(b) * k) for c, b in zip(caps, fabric.units))
    return graph, max(achieved, optimal)


def draw_units(pool: list[list], amount: int, prefer: tuple[Route, ...] = ()) -> list[tuple[Route, int]]:
    """``amount`` units drawn from the end of ``pool`` (``[route, units]`` entries, consumed in place):
    the (route, units) pairs taken, in order. Routes in ``prefer`` are drawn first, in its order (a kept
    tree's healthy routes)."""
    taken = []
    for route in prefer:
        for item in pool:
            if amount > 0 and tuple(item[0]) == route and item[1] > 0:
                use = min(item[1], amount)
                taken.append((route, use))
                item[1] -= use
                amount -= use
    if prefer:
        pool[:] = [item for item in pool if item[1] > 0]
    while amount > 0:
        route, units = pool[-1]
        use = min(units, amount)
        taken.append((tuple(route), use))
        amount -= use
        if use == units:
            pool.pop()
        else:
            pool[-1][1] -= use
    return taken

"""Exact spanning-arborescence packing at the cut bound (the engine of method ``trees``).

Source: Liangyu Zhao et al., "ForestColl: Efficient Collective Communications on Heterogeneous
Network Fabrics", arXiv 2402.06787, §3–§5. The three steps, all on integer capacities:

1. **Optimal rate.** With weights ``w_r`` (1 for every root), add a source ``s`` with an arc
   ``s -> r`` of capacity ``w_r / T`` per unit time. The roots can broadcast ``w_r`` units each in
   time ``T`` (fractionally) iff ``maxflow(s, v) >= Σ w`` for every rank ``v``, i.e. iff for every
   node set ``S`` (switches allowed) that misses a rank, ``T · B⁺(S) >= w(S ∩ ranks)``. So
   ``T* = max_S w(S)/B⁺(S)``, the cut bound. We find it exactly with Dinkelbach's iteration:
   a violated max-flow test returns its min cut ``S`` and ``T <- w(S)/B⁺(S)``, strictly larger;
   at the fixed point no cut is violated (ForestColl's binary search, made exact).
2. **Switch removal by edge splitting** (Bang-Jensen, Frank & Jackson 1995, as used in ForestColl
   §4): at a switch ``w`` replace ``M`` units of ``(u,w),(w,t)`` by ``M`` units of ``(u,t)``, with
   ``M`` the largest amount that keeps every rooted cut condition; a unit of ``(u,t)`` remembers
   its route ``u -> w -> t`` through the fabric. Splitting only lowers the out-capacity of sets with
   ``u,t ∈ S ∌ w`` or ``w ∈ S ∌ u,t``, so ``M`` is a min over two families of max-flows.
3. **Packing** (Edmonds' branching theorem; the extension test of Bérczi & Frank used by ForestColl
   §5): with capacities ``c_e = B_e · T* · k`` every root gets ``k`` arborescences spanning all
   ranks, using each arc at most ``c_e`` times. Trees grow one arc at a time; partial trees ``T_i``
   (multiplicity ``C_i``, vertex set ``V_i``) can all be completed iff every nonempty set ``X``
   has ``ρ(X) >= Σ_{i: V_i ∩ X = ∅} C_i``; the number of copies of ``T_j`` that may take arc
   ``(x,y)`` is ``min(C_j, c_xy, maxflow(x, y) - Σ_{i≠j} C_i)`` in the graph with a node ``s_i``
   per tree, arcs ``s_i -> V_i`` (∞) and ``x -> s_i`` (``C_i``). A tree that can take fewer
   copies splits in two.

Everything is integer (bandwidths are scaled to integer units), so the result is exact.
Max-flows use OR-Tools' SimpleMaxFlow on numpy arrays.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from synth.errors import SynthError
from synth.topology.model import Topology

INF = 1 << 50


# ---------------------------------------------------------------------------------------------
# max-flow
# ---------------------------------------------------------------------------------------------
def max_flow(num_nodes: int, tails, heads, caps, source: int, sink: int, cut: bool = False):
    """Value of a maximum ``source -> sink`` flow (and the source side of a min cut if ``cut``)."""
    from ortools.graph.python import max_flow as mf

    solver = mf.SimpleMaxFlow()
    solver.add_arcs_with_capacity(np.asarray(tails, dtype=np.int64), np.asarray(heads, dtype=np.int64),
                                  np.asarray(caps, dtype=np.int64))
    if num_nodes > 0:
        solver.add_arc_with_capacity(num_nodes - 1, num_nodes - 1, 0)  # make every node exist
    value = solved_flow(solver, source, sink)
    return (value, solver.get_source_side_min_cut()) if cut else value


def solved_flow(solver, source: int, sink: int) -> int:
    """Solve an OR-Tools ``SimpleMaxFlow`` from ``source`` to ``sink``: the flow's value, or SynthError."""
    status = solver.solve(source, sink)
    if status != solver.OPTIMAL:
        raise SynthError(f"max-flow failed with status {status}")
    return solver.optimal_flow()


# ---------------------------------------------------------------------------------------------
# integer fabric
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fabric:
    """A topology with bandwidths as co-prime integer units: ``bw = units · unit_GBps``."""

    num_nodes: int
    num_ranks: int
    tails: np.ndarray
    heads: np.ndarray
    units: np.ndarray
    unit_GBps: Fraction

    @property
    def arcs(self) -> list[tuple[int, int]]:
        return list(zip(self.tails.tolist(), self.heads.tolist()))


def integer_fabric(topology: Topology) -> Fabric:
    """Scale bandwidths to integers with gcd 1 (bw as exact fractions, limit 1e-6 GB/s)."""
    src, dst, bw, _ = topology.arrays
    fracs = [Fraction(float(b)).limit_denominator(10**6) for b in bw]
    lcm = 1
    for f in fracs:
        lcm = lcm * f.denominator // math.gcd(lcm, f.denominator)
    ints = [int(f * lcm) for f in fracs]
    g = 0
    for x in ints:
        g = math.gcd(g, x)
    g = g or 1
    units = np.array([x // g for x in ints], dtype=np.int64)
    return Fabric(topology.num_nodes, topology.num_ranks, src.astype(np.int64), dst.astype(np.int64),
                  units, Fraction(g, lcm))


# ---------------------------------------------------------------------------------------------
# 1. the optimal rate (cut bound), exactly
# ---------------------------------------------------------------------------------------------
def _source_arcs(num_nodes: int, weights: dict[int, int], scale: int):
    s = num_nodes
    roots = sorted(r for r, w in weights.items() if w > 0)
    return [s] * len(roots), roots, [weights[r] * scale for r in roots]


def short_cuts(num_nodes: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray, weights: dict[int, int],
               scale: int, targets):
    """Edmonds' condition rank by rank: yields ``(v, S)`` for each ``v`` in ``targets`` whose max-flow from a
    super-source (``scale·w_r`` into every root ``r``) over the arcs falls short of ``scale·Σw``, with ``S``
    the source side of a min cut (the super-source left out): fewer than that many arborescences fit."""
    st, sh, sc = _source_arcs(num_nodes, weights, scale)
    all_tails = np.concatenate([tails, st]).astype(np.int64)
    all_heads = np.concatenate([heads, sh]).astype(np.int64)
    all_caps = np.concatenate([caps, sc]).astype(np.int64)
    need = scale * sum(weights.values())
    for v in targets:
        value, side = max_flow(num_nodes + 1, all_tails, all_heads, all_caps, num_nodes, v, cut=True)
        if value < need:
            yield v, [x for x in side if x != num_nodes]


def _violated_cut(fabric: Fabric, caps: np.ndarray, weights: dict[int, int], scale: int,
                  order: list[int]) -> list[int] | None:
    """First rank ``v`` (in ``order``) with ``maxflow(s, v) < scale·Σw``; returns the min cut side S."""
    for v, side in short_cuts(fabric.num_nodes, fabric.tails, fabric.heads, caps, weights, scale, order):
        order.remove(v)
        order.insert(0, v)  # a violated rank tends to stay violated: test it first next time
        return side
    return None


def optimal_ratio(fabric: Fabric, weights: dict[int, int]) -> Fraction:
    """``T* = max_S w(S ∩ ranks) / B⁺(S)`` in fabric units (time per unit of data per unit bw).

    Dinkelbach on the parametric cut condition (see the module docstring): exact, and usually a
    handful of rounds of ``N`` max-flows.
    """
    units = fabric.units
    ranks = list(range(fabric.num_ranks))
    in_units = np.bincount(fabric.heads, weights=units, minlength=fabric.num_nodes)
    total = sum(weights.values())
    # start from a per-rank bound (what a rank must receive over its own in-links)
    ratio = max(Fraction(total - weights.get(v, 0), int(in_units[v])) for v in ranks if in_units[v] > 0)
    if any(in_units[v] == 0 for v in ranks) and fabric.num_ranks > 1:
        raise SynthError("a rank has no incoming link; the collective cannot complete")
    order = list(ranks)
    while True:
        caps = units * ratio.numerator
        cut = _violated_cut(fabric, caps, weights, ratio.denominator, order)
        if cut is None:
            return ratio
        side = np.zeros(fabric.num_nodes, dtype=bool)
        side[cut] = True
        out = int(units[side[fabric.tails] & ~side[fabric.heads]].sum())
        demand = sum(weights.get(v, 0) for v in cut if v < fabric.num_ranks)
        if out == 0:
            raise SynthError("the fabric is not connected enough for this collective")
        new = Fraction(demand, out)
        if new <= ratio:  # cannot happen with exact arithmetic; guard against a loop
            raise SynthError("internal error: cut-bound iteration did not progress")
        ratio = new


def is_feasible(fabric: Fabric, caps: np.ndarray, weights: dict[int, int], k: int) -> bool:
    """Can every root ``r`` get ``k·w_r`` arborescences with arc capacities ``caps``? (Edmonds)"""
    return _violated_cut(fabric, caps, weights, k, list(range(fabric.num_ranks))) is None


def _caps_at(units: np.ndarray, t: float, k: int) -> np.ndarray:
    return np.floor(units * t * k + 1e-9).astype(np.int64)


def approximate_capacities(fabric: Fabric, weights: dict[int, int], ratio: Fraction,
                           k: int) -> tuple[np.ndarray, Fraction]:
    """``c_e = ⌊B_e·T·k⌋`` for (nearly) the least feasible ``T >= T*`` with ``k`` trees per root."""
    units = fabric.units
    lo, hi = float(ratio), float(ratio) + 1.0 / (k * int(units.min()))
    for _ in range(40):
        mid = (lo + hi) / 2
        if is_feasible(fabric, _caps_at(units, mid, k), weights, k):
            hi = mid
        else:
            lo = mid
    caps = _caps_at(units, hi, k)
    achieved = max(Fraction(int(c), int(b) * k) for c, b in zip(caps, units))
    return caps, max(achieved, ratio)


def choose_capacities(fabric: Fabric, weights: dict[int, int], ratio: Fraction,
                      max_trees: int) -> tuple[int, np.ndarray, Fraction]:
    """(k, capacities, achieved ratio): exact if ``T*``'s denominator allows ``k <= max_trees``."""
    if ratio.denominator <= max_trees:
        k = ratio.denominator
        return k, fabric.units * ratio.numerator, ratio
    caps, achieved = approximate_capacities(fabric, weights, ratio, max_trees)
    return max_trees, caps, achieved


#: The share of a slow link class's slack that :func:`slow_link_slack` keeps when it picks how many more trees
#: per root to plan (more trees make the shares finer, and the pipeline coarser).
SLACK_SHARE = 0.75


def slow_link_slack(fabric: Fabric, weights: dict[int, int], k: int, caps: np.ndarray,
                    max_trees: int) -> tuple[int, np.ndarray]:
    """(k', capacities) at the same rate as ``(k, caps)`` that leave every link slower than the fastest the
    slack the rate does not need.

    Edmonds' condition (module docstring, step 3) only bounds cuts from below, so capacities ``c_e = B_e·T*·k``
    let a packing load every link up to the rate, including links off the binding cut: on two DGX A100 boxes with
    one NIC link removed the binding cut is a rank's NVSwitch port, yet the packing filled all seven remaining
    NIC links into that box to the rate with 35 tree units where 32 cross (trees rooted in a box leaving it and
    coming back). A full slow link is a second bottleneck: it pays α on every message and delivers its last
    bytes at the bound's time, so the box behind it drains after that.

    For each class of links of one bandwidth (in fabric units), slowest first and the fastest class left alone,
    the least share ``f`` of its capacity that keeps every rank's ``maxflow >= k·Σw`` is found by bisection
    at ``m_max = max_trees // k`` times the trees (capacities ``⌈f·c_e⌉``, the other classes as already
    chosen). Capacities ``c_e·m`` with the class at ``⌈f·c_e·m⌉`` stay feasible for every ``m <= m_max`` (each
    is at least ``m / m_max`` times a feasible vector, and the cut condition scales), so ``m`` is the least
    multiplier at which every class keeps ``SLACK_SHARE`` of its slack ``1 - f``. Unchanged where no class
    has slack."""
    m_max = max(1, max_trees // k)
    trimmed = caps * m_max
    shares: list[tuple[np.ndarray, Fraction]] = []
    classes = sorted(set(fabric.units.tolist()))[:-1]
    for units in classes:
        members = (fabric.units == units) & (caps > 0)
        if not members.any():
            continue
        full = int(trimmed[members].max())
        lo, hi = 0, full        # hi: least feasible numerator of f = hi / full found so far
        while lo < hi:
            mid = (lo + hi) // 2
            trial = trimmed.copy()
            trial[members] = -(-trimmed[members] * mid // full)
            if is_feasible(fabric, trial, weights, k * m_max):
                hi = mid
            else:
                lo = mid + 1
        if hi < full:
            trimmed[members] = -(-trimmed[members] * hi // full)
            shares.append((members, Fraction(hi, full)))
    if not shares:
        return k, caps
    for m in range(1, m_max + 1):
        chosen = caps * m
        for members, share in shares:
            chosen[members] = -(-chosen[members] * share.numerator // share.denominator)
        if all(Fraction(int(chosen[members].max()), int(caps[members].max() * m)) <= 1 - SLACK_SHARE * (1 - share)
               for members, share in shares):
            break
    # feasible by the scaling argument; checked, as the packing relies on it
    return (k * m, chosen) if is_feasible(fabric, chosen, weights, k * m) else (k, caps)


# ---------------------------------------------------------------------------------------------
# the routes programs can take
# ---------------------------------------------------------------------------------------------
def allowed_subpaths(paths: dict[tuple[int, int], tuple[int, ...]]) -> set[tuple[int, ...]]:
    """Every contiguous piece (at least one arc) of a canonical path."""
    pieces: set[tuple[int, ...]] = set()
    for path in paths.values():
        for i in range(len(path) - 1):
            for j in range(i + 2, len(path) + 1):
                pieces.add(path[i:j])
    return pieces


# ---------------------------------------------------------------------------------------------
# 2. switch removal by edge splitting
# ---------------------------------------------------------------------------------------------
Route = tuple[int, ...]


@dataclass
class SplitGraph:
    """Integer arc capacities over all nodes; each unit of capacity maps to a route of switches."""

    num_nodes: int
    num_ranks: int
    cap: dict[tuple[int, int], int]
    routes: dict[tuple[int, int], list[list]]  # (u, v) -> [[route, units], ...]

    def arrays(self):
        items = [(u, v, c) for (u, v), c in self.cap.items() if c > 0]
        if not items:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        a = np.array(items, dtype=np.int64)
        return a[:, 0], a[:, 1], a[:, 2]


def _add_units(pool: list[list], route: Route, units: int) -> None:
    for item in pool:
        if item[0] == route:
            item[1] += units
            return
    pool.append([route, units])


def _direct_units(arcs) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], list[list]]]:
    """(capacity, route pools) of arcs ``(a, b, units)`` taken as they are (no switch crossed yet)."""
    cap: dict[tuple[int, int], int] = {}
    routes: dict[tuple[int, int], list[list]] = {}
    for a, b, c in arcs:
        if c > 0:
            cap[(a, b)] = cap.get((a, b), 0) + c
            _add_units(routes.setdefault((a, b), []), (), c)
    return cap, routes


def _flow_with(graph: SplitGraph, arcs, demand_arcs, extra, source: int, sink: int) -> int:
    """Max-flow on ``arcs`` (``graph.arrays()``, taken once per graph state by the caller: converting the arc
    dict per flow was half of split_switches' time), then the ``extra`` arcs, then the demand arcs."""
    t, h, c = arcs
    et = [a for a, _, _ in extra] + demand_arcs[0]
    eh = [b for _, b, _ in extra] + demand_arcs[1]
    ec = [x for _, _, x in extra] + demand_arcs[2]
    return max_flow(graph.num_nodes + 1, np.concatenate([t, et]), np.concatenate([h, eh]),
                    np.concatenate([c, ec]), source, sink)


def _split_amount(graph: SplitGraph, demand_arcs, need: int, u: int, w: int, t: int, limit: int,
                  charge: tuple[int, int, int] = (1, 1, 1)) -> int:
    """Largest ``M <= limit`` such that splitting ``M`` units off ``(u,w),(w,t)`` keeps every rooted cut condition,
    where the split takes ``M1 = ⌈M·b1/n⌉`` units of ``(u,w)`` and ``M2 = ⌈M·b2/n⌉`` of ``(w,t)`` (``charge`` =
    ``(b1, b2, n)``: a circuit holds its wider piece at the narrower one's rate, docs/cost-model.md).

    A sink set ``X`` (it holds a rank, so its condition binds) loses ``M1·[u∉X∋w] + M2·[w∉X∋t] − M·[u∉X∋t]``:
    (A) ``w ∈ X``, ``u, t ∉ X`` loses ``M1``; (B) ``u, t ∈ X``, ``w ∉ X`` loses ``M2``;
    and where the charge is more than ``M``, (A') ``w, t ∈ X``, ``u ∉ X`` loses ``M1 − M`` and (B') ``t ∈ X``,
    ``u, w ∉ X`` loses ``M2 − M``. Each loss must stay within its sets' slack (min cut − need).
    """
    s = graph.num_nodes
    nr = graph.num_ranks
    b1, b2, narrow = charge
    m = limit
    arcs = graph.arrays()   # the graph does not change until the split is made

    def least_slack(forced_source: tuple[int, ...], forced_sink: tuple[int, ...], sink: int,
                    ranks: list[tuple[int, ...]]) -> int:
        slack = None
        for more in ranks:
            extra = ([(s, x, INF) for x in forced_source]
                     + [(x, sink, INF) for x in forced_sink + more if x != sink])
            flow = _flow_with(graph, arcs, demand_arcs, extra, s, sink) - need
            slack = flow if slack is None else min(slack, flow)
            if slack <= 0:
                break
        return INF if slack is None else slack

    def within(slack: int, per_unit: int) -> int:
        # the largest M with ⌈M·per_unit/narrow⌉ <= slack
        return max(slack, 0) * narrow // per_unit

    def sink_ranks(sink_side: tuple[int, ...], source_side: tuple[int, ...]) -> list[tuple[int, ...]]:
        # the sink side must hold a rank: none more where it does, else each rank off the source side in turn
        if any(x < nr for x in sink_side):
            return [()]
        return [(v,) for v in range(nr) if v not in source_side]

    # (A): source side {s, u, t}, sink side {w, v}
    m = min(m, within(least_slack((u, t), (), w, sink_ranks((w,), (u, t))), b1))
    # (B): source side {s, w}, sink side {u, t} (+ a rank v if neither is one)
    if m > 0:
        m = min(m, within(least_slack((w,), (u,), t, sink_ranks((u, t), (w,))), b2))
    if u != t and m > 0 and b1 > narrow:
        # (A'): source side {s, u}, sink side {w, t} (+ a rank v if t is none)
        m = min(m, within(least_slack((u,), (w,), t, sink_ranks((w, t), (u,))), b1 - narrow))
    if u != t and m > 0 and b2 > narrow:
        # (B'): source side {s, u, w}, sink side {t} (+ a rank v if t is none)
        m = min(m, within(least_slack((u, w), (), t, sink_ranks((t,), (u, w))), b2 - narrow))
    return max(m, 0)


def _split_at(graph: SplitGraph, w: int, bottleneck, demand_arcs, need: int, allowed, step: int,
              charged_only: bool) -> None:
    """Split off what the cuts allow of every pair of arcs through switch ``w`` (:func:`split_switches`); with
    ``charged_only``, only the joins of pieces whose bottlenecks differ."""
    nr = graph.num_ranks
    preds = sorted(u for (u, x), c in graph.cap.items() if x == w and c > 0)
    for u in preds:
        # Pair u with its cyclic successor first: concentrated pairs (a ring through the switch)
        # keep few peers per rank, which serialise well on a shared port; a u->w->u loop
        # only wastes capacity, so it comes last.
        succs = sorted((t for (x, t), c in graph.cap.items() if x == w and c > 0),
                       key=lambda t: (t == u, (step * (t - u)) % nr if t < nr else t))
        for t in succs:
            for r1, r2 in _route_pairs(graph, u, w, t, allowed):
                # a circuit moves at its route's least bandwidth and holds every link of it: a unit of the
                # joined route takes wide / narrow units of the wider piece (docs/cost-model.md, rule 4)
                b1, b2 = bottleneck((u, *r1, w)), bottleneck((w, *r2, t))
                if charged_only and b1 == b2:
                    continue
                narrow = min(b1, b2)
                limit = min(_units_of(graph.routes[(u, w)], r1) * narrow // b1,
                            _units_of(graph.routes[(w, t)], r2) * narrow // b2)
                if limit == 0:
                    continue
                m = _split_amount(graph, demand_arcs, need, u, w, t, limit, (b1, b2, narrow))
                if m == 0:
                    continue
                m1, m2 = -(-m * b1 // narrow), -(-m * b2 // narrow)
                _remove_units(graph.routes[(u, w)], r1, m1)
                _remove_units(graph.routes[(w, t)], r2, m2)
                graph.cap[(u, w)] -= m1
                graph.cap[(w, t)] -= m2
                if u != t:
                    graph.cap[(u, t)] = graph.cap.get((u, t), 0) + m
                    _add_units(graph.routes.setdefault((u, t), []), r1 + (w,) + r2, m)
            if graph.cap.get((u, w), 0) == 0:
                break


def split_switches(fabric: Fabric, caps: np.ndarray, weights: dict[int, int], k: int,
                   allowed: set[tuple[int, ...]] | None = None, step: int = 1) -> SplitGraph:
    """Remove every switch by complete edge splitting (module docstring, step 2).

    Returns a graph on the ranks only whose capacity units each carry a route (the switches
    crossed). With ``allowed`` (see :func:`allowed_subpaths`) a split is only made when the
    combined path is a piece of a canonical path, so every rank arc can be realised by a program.
    ``step`` (+1 or -1) is the preferred cyclic direction of the pairs (see the loop). Where the two pieces
    joined have different bottlenecks, the wider one gives ``wide / narrow`` units per unit split off (a
    circuit holds its links at its route's rate, docs/cost-model.md); the cut check counts that charge
    (:func:`_split_amount`), and such joins are made first at each switch, before the others take what they need.
    Raises SplitError when what cannot be split is needed (a non-Eulerian switch, or routes the
    fabric's fixed paths exclude); complete splitting exists otherwise (Bang-Jensen et al.).

    The switches are split in id order, and where that fails, farthest from the ranks first: each split takes
    what the cuts allow, so on a tree of switches the leaves, split first, paired their ranks with each other
    until the ranks' ports were full, and the traffic from the other side of the root found no port left
    (a 4:1 three-level switch tree lost every rate; the root first splits the long routes first).
    """
    failure: SplitError | None = None
    for order in _split_orders(fabric):
        try:
            return _split_in_order(fabric, caps, weights, k, allowed, step, order)
        except SplitError as exc:
            failure = failure or exc
    assert failure is not None
    raise failure


def _split_orders(fabric: Fabric):
    """The switch orders :func:`split_switches` tries: by id, then (found only when asked for, after id order
    failed) by hops from the nearest rank, farthest first."""
    n, nr = fabric.num_nodes, fabric.num_ranks
    by_id = list(range(nr, n))
    yield by_id
    arcs = csr_matrix((np.ones(len(fabric.tails)), (fabric.tails, fabric.heads)), shape=(n, n))
    hops = dijkstra(arcs, unweighted=True, indices=list(range(nr)), min_only=True)
    farthest = sorted(by_id, key=lambda w: (-hops[w], w))
    if farthest != by_id:
        yield farthest


def _split_in_order(fabric: Fabric, caps: np.ndarray, weights: dict[int, int], k: int,
                    allowed: set[tuple[int, ...]] | None, step: int, order: list[int]) -> SplitGraph:
    """:func:`split_switches` with the switches split in ``order``."""
    n, nr = fabric.num_nodes, fabric.num_ranks
    graph = SplitGraph(n, nr, *_direct_units(zip(fabric.tails.tolist(), fabric.heads.tolist(), caps.tolist())))
    link_units = dict(zip(fabric.arcs, fabric.units.tolist()))

    def bottleneck(path: tuple[int, ...]) -> int:
        return min(link_units[arc] for arc in zip(path, path[1:]))

    st, sh, sc = _source_arcs(n, weights, k)
    demand_arcs = (st, sh, sc)
    need = k * sum(weights.values())
    for w in order:
        # Charged joins first: a join of pieces of unequal bottlenecks takes more of the wider piece than it gives,
        # so joins made before it could leave it too little (a PCIe tree whose sockets meet over a slower link:
        # the rank pairs under one PCIe switch would take every rank's port first).
        for charged_pass in (True, False):
            _split_at(graph, w, bottleneck, demand_arcs, need, allowed, step, charged_pass)
        # drop what is left at w (possible only for non-Eulerian switches) if the cuts allow it
        for key in [key for key, c in graph.cap.items() if c > 0 and w in key]:
            graph.cap[key] = 0
        for key in [key for key in graph.cap if w in key]:
            del graph.cap[key]
            graph.routes.pop(key, None)
    if not is_feasible(_rank_fabric(graph), _rank_caps(graph), weights, k):
        raise SplitError("switch removal lost capacity the packing needs")
    return graph


def disjoint_pair_split(fabric: Fabric, caps: np.ndarray, weights: dict[int, int], k: int,
                        pairs: list[tuple[int, ...]]) -> SplitGraph | None:
    """Switch removal by rank pairs whose switch paths share no link, or None if it loses rate.

    ``pairs`` are node paths ``(u, switches..., v)`` on ``fabric`` in order of preference; a path
    is kept when none of its arcs is held by an earlier kept path, and becomes the rank arc
    ``(u, v)`` with the least capacity along it. Every other switch arc is dropped. Under the
    cost model (docs/cost-model.md) a routed transfer holds its whole route, so two rank arcs that share a switch link
    cannot both run at full rate while one that owns its route behaves as a direct link: the
    packed trees then run on the switch fabric without contention. This is the special case of
    complete edge splitting (Bang-Jensen, Frank, Jackson 1995; ForestColl §4.2) in which every
    split pair owns its route; it is accepted only when the rank graph still passes Edmonds'
    condition at ``k`` trees per root (:func:`is_feasible`), i.e. the optimal rate is kept
    (e.g. GPU ``i`` of box A paired with GPU ``i`` of box B through an IB switch: rail pairing).
    """
    nr = fabric.num_ranks
    arc_index = {arc: i for i, arc in enumerate(fabric.arcs)}
    cap, routes = _direct_units((a, b, c) for (a, b), c in zip(fabric.arcs, caps.tolist()) if a < nr and b < nr)
    held: set[int] = set()
    for path in pairs:
        u, v = path[0], path[-1]
        arcs = [arc_index.get(arc) for arc in zip(path, path[1:])]
        if len(path) < 3 or None in arcs or held.intersection(arcs):
            continue
        units = min(int(caps[i]) for i in arcs)
        if units <= 0:
            continue
        held.update(arcs)
        cap[(u, v)] = cap.get((u, v), 0) + units
        _add_units(routes.setdefault((u, v), []), tuple(path[1:-1]), units)
    graph = SplitGraph(fabric.num_nodes, nr, cap, routes)
    return graph if is_feasible(_rank_fabric(graph), _rank_caps(graph), weights, k) else None


class SplitError(SynthError):
    """Edge splitting could not remove the switches at this rate."""


def _units_of(pool: list[list], route: Route) -> int:
    return sum(units for r, units in pool if r == route)


def _remove_units(pool: list[list], route: Route, amount: int) -> None:
    for item in pool:
        if item[0] == route:
            item[1] -= amount
    pool[:] = [item for item in pool if item[1] > 0]


def _route_pairs(graph: SplitGraph, u: int, w: int, t: int, allowed: set[tuple[int, ...]] | None):
    """(route u->w, route w->t) pairs whose concatenation may be split off (u == t: any, it is dropped)."""
    left = [r for r, units in graph.routes.get((u, w), []) if units > 0]
    right = [r for r, units in graph.routes.get((w, t), []) if units > 0]
    for r1 in left:
        for r2 in right:
            if u == t or allowed is None or (u, *r1, w, *r2, t) in allowed:
                yield r1, r2


def _rank_fabric(graph: SplitGraph) -> Fabric:
    t, h, c = graph.arrays()
    return Fabric(graph.num_ranks, graph.num_ranks, t, h, np.ones_like(c), Fraction(1))


def _rank_caps(graph: SplitGraph) -> np.ndarray:
    return graph.arrays()[2]


# ---------------------------------------------------------------------------------------------
# 3. packing arborescences
# ---------------------------------------------------------------------------------------------
@dataclass
class Tree:
    """An out-arborescence on the ranks: ``edges`` in BFS order from ``root``; ``mult`` copies."""

    root: int
    mult: int
    edges: list[tuple[int, int]] = field(default_factory=list)
    nodes: set[int] = field(default_factory=set)


def pack_arborescences(num_ranks: int, cap: dict[tuple[int, int], int], weights: dict[int, int],
                       k: int) -> list[Tree]:
    """``k·w_r`` spanning out-arborescences per root within integer capacities (module step 3).

    All trees grow together, one arc per turn (round robin), each from its shallowest node that
    can take one: growing one tree to completion first leaves the last trees only leftover arcs
    and makes them deep (long pipelines); growing them together keeps every tree shallow. Among
    nodes of equal depth the one with the most unused out-capacity (as a fraction) goes first,
    and its least-used arcs are tried first, so no arc is exhausted early while others idle.
    The extension test keeps every tree completable whatever the order (Bérczi & Frank), on one
    flow network kept for the whole packing (:class:`_ExtensionNetwork`).
    """
    cap = {key: c for key, c in cap.items() if c > 0}
    out: dict[int, list[int]] = {}
    for (x, y) in sorted(cap):
        out.setdefault(x, []).append(y)
    cap0 = dict(cap)
    network = _ExtensionNetwork(num_ranks, cap)
    active: deque[Tree] = deque(Tree(r, k * w, [], {r}) for r, w in sorted(weights.items()) if w > 0)
    for tree in active:
        network.add_tree(tree)
    depths: dict[int, dict[int, int]] = {id(t): {t.root: 0} for t in active}
    refused: dict[int, set[tuple[int, int]]] = {id(t): set() for t in active}
    # a tree's nodes that may still take an arc: one whose every out-arc is spent or leads into the tree never
    # will again (capacities only fall, trees only grow), so it leaves the scan for good
    growing_from: dict[int, set[int]] = {id(t): {t.root} for t in active}
    done: list[Tree] = []

    def unused_share(v: int) -> float:
        return sum(cap[(v, y)] / cap0[(v, y)] for y in out.get(v, ()))

    # each node's unused out-capacity (as a fraction), kept current: only the taken arc's tail changes
    out_left = {v: unused_share(v) for v in sorted(set(range(num_ranks)) | set(out))}

    while active:
        tree = active.popleft()
        network.set_active(tree, False)
        depth = depths[id(tree)]
        arc = None
        open_nodes = growing_from[id(tree)]
        for retry in (False, True):   # skip arcs refused before, unless nothing else fits
            for x in sorted(open_nodes, key=lambda v: (depth[v], -out_left[v], v)):
                can_grow = False
                for y in sorted(out.get(x, ()), key=lambda v: (-cap[(x, v)] / cap0[(x, v)], v)):
                    if y in tree.nodes or cap.get((x, y), 0) == 0:
                        continue
                    can_grow = True
                    if not retry and (x, y) in refused[id(tree)]:
                        continue
                    copies = network.extension_copies(x, y, min(tree.mult, cap[(x, y)]))
                    if copies == 0:
                        refused[id(tree)].add((x, y))
                        continue
                    arc = (x, y, copies)
                    break
                if not can_grow:
                    open_nodes.discard(x)
                if arc is not None:
                    break
            if arc is not None:
                break
        if arc is None:
            raise SynthError(f"internal error: arborescence packing stuck at root {tree.root}")
        x, y, copies = arc
        if copies < tree.mult:
            rest = Tree(tree.root, tree.mult - copies, list(tree.edges), set(tree.nodes))
            depths[id(rest)] = dict(depth)
            refused[id(rest)] = set(refused[id(tree)])
            growing_from[id(rest)] = set(open_nodes)
            active.append(rest)
            network.add_tree(rest)
            tree.mult = copies
        tree.edges.append((x, y))
        tree.nodes.add(y)
        open_nodes.add(y)
        network.add_node(tree, y)
        depth[y] = depth[x] + 1
        cap[(x, y)] -= copies
        network.set_capacity((x, y), cap[(x, y)])
        out_left[x] = unused_share(x)
        if len(tree.nodes) < num_ranks:
            active.append(tree)
            network.set_active(tree, True)
        else:
            network.finish(tree)
            done.append(tree)
    return done


class _ExtensionNetwork:
    """The flow network of the extension test (module docstring, step 3), kept and edited in place for a
    whole packing instead of rebuilt for every test.

    Nodes: the ranks, a hub ``h`` and one node ``s_i`` per tree. Arcs: the rank arcs at their remaining
    capacities, ``s_i -> v`` (∞) for the nodes ``v`` of tree ``i`` that still have an arc with capacity out of
    the tree, ``h -> s_i`` with the tree's multiplicity while it is growing and not the tree being extended
    (else 0), and ``r -> h`` for every rank, ∞ from the arc's tail ``x`` and 0 from the others.
    ``x -> h -> s_i`` carries what ``x -> s_i (C_i)`` carries in the test's graph, so ``maxflow(x, y)`` is the
    same value, found as follows.

    - The trees that hold ``y`` send ``C_i`` straight to it: some maximum flow does (rerouting a holder's flow
      along ``s_i -> y`` frees arcs), so ``maxflow(x, y) = Σ C_i`` over the holders whose ``s_i -> y`` was left
      out, plus the flow solved with their ``h -> s_i`` closed.
    - The flow of a tree not holding ``y`` ends outside it, so it leaves the tree's nodes through a node with an
      arc out of the tree; entering there straight from ``s_i`` frees arcs too. Nodes whose every arc with
      capacity leads into the tree (interior) need no ``s_i -> v``; capacities only fall and trees only grow, so
      an interior node stays one. Their arcs are left out when the network is rebuilt, once the tree arcs
      are a quarter more than the nodes with an arc out: OR-Tools rebuilds its graph on every solve, so a solve
      costs time with every arc (a 128-rank MI250 forest: 23.7 -> 14.0 s).
    - ``x -> y`` and the holders' paths are disjoint, so ``maxflow(x, y) >= cap(x, y) + Σ C_i`` over the
      holders: where that leaves the copies asked for, no flow is solved.
    - Per rank, ``Σ C_i`` over the growing trees that hold it and the holders whose ``s_i`` has no arc to it are
      kept as trees grow, split and finish, not found by scanning every tree that ever held it; the closed
      ``h -> s_i`` stay closed after a solve, and the next solve opens or closes only the trees that differ (a
      128-rank MI250 forest: 13.7 -> 10.6 s, the same trees).
    """

    def __init__(self, num_ranks: int, cap: dict[tuple[int, int], int]) -> None:
        self.num_ranks = num_ranks
        self.hub = num_ranks
        keys = sorted(cap)
        self.capacity = {key: cap[key] for key in keys}
        self.out: list[list[int]] = [[] for _ in range(num_ranks)]
        self.into: list[list[int]] = [[] for _ in range(num_ranks)]
        for a, b in keys:
            self.out[a].append(b)
            self.into[b].append(a)
        self.trees: dict[int, Tree] = {}
        self.holders: list[list[int]] = [[] for _ in range(num_ranks)]   # per rank, the trees that hold it
        self.exits: dict[int, dict[int, int]] = {}   # tree -> node -> its arcs with capacity out of the tree
        self.mult: dict[int, int] = {}
        self.active_mult = 0    # Σ multiplicities of the trees that take part (h -> s_i open)
        self.solves = 0         # max flows run (tests the written flow did not settle)
        self.boundary = 0       # (tree, node) pairs with an arc out of the tree: the tree arcs a rebuild keeps
        # per rank, Σ multiplicities of the growing trees that hold it (``counted``: each one's share in it) and
        # those of them whose s_i has no arc to it: kept as trees grow, so a test need not scan every holder
        self.held = [0] * num_ranks
        self.counted: dict[int, int] = {}
        self.unlinked: list[dict[int, None]] = [{} for _ in range(num_ranks)]
        self._build()

    def _build(self) -> None:
        from ortools.graph.python import max_flow as mf

        solver = mf.SimpleMaxFlow()
        self.rank_arc = {key: solver.add_arc_with_capacity(key[0], key[1], c) for key, c in self.capacity.items()}
        self.into_hub = [solver.add_arc_with_capacity(r, self.hub, 0) for r in range(self.num_ranks)]
        self.solver = solver
        self.source = -1
        self.next_node = self.num_ranks + 1
        self.tree_node: dict[int, int] = {}
        self.hub_arc: dict[int, int] = {}
        self.linked: dict[int, set[int]] = {}   # tree -> the nodes its s_i has an arc to
        self.tree_arcs = 0
        self.unlinked = [{} for _ in range(self.num_ranks)]
        self.closed: dict[int, None] = {}   # trees whose h -> s_i the last solve closed (still closed)
        for tid, tree in self.trees.items():
            if len(tree.nodes) < self.num_ranks:
                self._add_source(tid)

    def _add_source(self, tid: int) -> None:
        """Tree ``tid``'s node ``s_i``: arcs to its nodes with an arc out of the tree, and ``h -> s_i``."""
        nodes = [v for v, exits in self.exits[tid].items() if exits > 0]
        node = self.next_node
        self.next_node += 1
        self.tree_node[tid] = node
        for v in sorted(nodes):
            self.solver.add_arc_with_capacity(node, v, INF)
        self.linked[tid] = set(nodes)
        for v in sorted(self.trees[tid].nodes.difference(nodes)):
            self.unlinked[v][tid] = None
        self.tree_arcs += len(nodes)
        self.hub_arc[tid] = self.solver.add_arc_with_capacity(self.hub, node, self.mult[tid])

    def _exits_of(self, tree: Tree, v: int) -> int:
        return sum(1 for w in self.out[v] if w not in tree.nodes and self.capacity[(v, w)] > 0)

    def add_tree(self, tree: Tree) -> None:
        """A new growing tree (with its nodes so far), taking part in the tests."""
        tid = id(tree)
        self.trees[tid] = tree
        self.exits[tid] = {v: self._exits_of(tree, v) for v in sorted(tree.nodes)}
        self.boundary += sum(1 for exits in self.exits[tid].values() if exits > 0)
        for v in sorted(tree.nodes):
            self.holders[v].append(tid)
            self.held[v] += tree.mult
        self.counted[tid] = tree.mult
        self.mult[tid] = 0
        self._add_source(tid)
        self.set_active(tree, True)

    def add_node(self, tree: Tree, v: int) -> None:
        """``v`` has joined ``tree`` (already in ``tree.nodes``)."""
        tid = id(tree)
        exits = self.exits[tid]
        for u in self.into[v]:
            if u in exits and self.capacity[(u, v)] > 0:
                self._lose_exit(tid, u)
        exits[v] = self._exits_of(tree, v)
        if exits[v] > 0:
            self.boundary += 1
            self.solver.add_arc_with_capacity(self.tree_node[tid], v, INF)
            self.linked[tid].add(v)
            self.tree_arcs += 1
        else:
            self.unlinked[v][tid] = None
        self.holders[v].append(tid)
        self.held[v] += self.counted[tid]

    def finish(self, tree: Tree) -> None:
        """``tree`` spans every rank: it holds no rank as a growing tree any more."""
        tid = id(tree)
        for v in tree.nodes:
            self.held[v] -= self.counted[tid]
            self.unlinked[v].pop(tid, None)
        self.counted[tid] = 0

    def _lose_exit(self, tid: int, u: int) -> None:
        self.exits[tid][u] -= 1
        if self.exits[tid][u] == 0:
            self.boundary -= 1

    def set_active(self, tree: Tree, active: bool) -> None:
        """Whether ``tree`` takes part, with its current multiplicity."""
        mult = tree.mult if active else 0
        tid = id(tree)
        if active and tree.mult != self.counted[tid]:   # split: the rest holds the difference now
            for v in tree.nodes:
                self.held[v] += tree.mult - self.counted[tid]
            self.counted[tid] = tree.mult
        self.active_mult += mult - self.mult[tid]
        self.mult[tid] = mult
        self.solver.set_arc_capacity(self.hub_arc[tid], 0 if tid in self.closed else mult)

    def set_capacity(self, arc: tuple[int, int], capacity: int) -> None:
        a, b = arc
        if capacity == 0 < self.capacity[arc]:
            for tid in self.holders[a]:
                if b not in self.trees[tid].nodes:
                    self._lose_exit(tid, a)
        self.solver.set_arc_capacity(self.rank_arc[arc], capacity)
        self.capacity[arc] = capacity

    def extension_copies(self, x: int, y: int, limit: int) -> int:
        """How many copies (at most ``limit``) of the tree left out may take arc ``(x, y)`` and keep every
        tree completable: ``min(limit, maxflow(x, y) - Σ C_i)`` over the trees taking part."""
        mult = self.mult
        # the tree being extended does not hold y, and every other growing tree takes part
        held = self.held[y]
        if self.capacity[(x, y)] + held >= self.active_mult + limit:
            return limit
        if 4 * self.tree_arcs > 5 * self.boundary + 16 * self.num_ranks:
            self._build()
        if x != self.source:
            if self.source >= 0:
                self.solver.set_arc_capacity(self.into_hub[self.source], 0)
            self.solver.set_arc_capacity(self.into_hub[x], INF)
            self.source = x
        # a holder whose s_i -> y is in the network sends C_i along it in the solve; the others are closed (left
        # closed after it: the next test's holders are mostly the same trees)
        hub_arc, solver, closed, wanted = self.hub_arc, self.solver, self.closed, self.unlinked[y]
        for tid in [tid for tid in closed if tid not in wanted]:
            solver.set_arc_capacity(hub_arc[tid], mult[tid])
            del closed[tid]
        for tid in wanted:
            if tid not in closed:
                solver.set_arc_capacity(hub_arc[tid], 0)
                closed[tid] = None
        self.solves += 1
        flow = solved_flow(solver, x, y) + sum(mult[tid] for tid in wanted)
        return max(0, min(limit, flow - self.active_mult))


# ---------------------------------------------------------------------------------------------
# 3b. a packing seeded with whole trees (warm start on an edited fabric)
# ---------------------------------------------------------------------------------------------
def _completable(num_ranks: int, cap: dict[tuple[int, int], int], left: dict[int, int]) -> bool:
    """Edmonds' branching theorem with a count per root: ``left[r]`` spanning out-arborescences rooted at
    each ``r`` fit in ``cap`` iff every rank ``v`` gets ``maxflow(s, v) >= Σ left`` from a super-source
    with an arc ``s -> r`` of capacity ``left[r]`` (Edmonds 1973; the test of :func:`is_feasible`)."""
    items = [(a, b, c) for (a, b), c in cap.items() if c > 0]
    arr = np.array(items, dtype=np.int64).reshape(-1, 3)
    return next(short_cuts(num_ranks, arr[:, 0], arr[:, 1], arr[:, 2], left, 1, range(num_ranks)), None) is None


def seeded_packing(num_ranks: int, cap: dict[tuple[int, int], int], weights: dict[int, int], k: int,
                   seeds: list[tuple[int, tuple[tuple[int, int], ...], int]]) -> tuple[list[Tree], list[Tree]]:
    """``k·w_r`` spanning out-arborescences per root within ``cap``, as many as possible of them copies of the
    whole ``seeds`` (``(root, edges in BFS order, copies wanted)``, taken in order): ``(kept, packed)``.

    Each seed takes the most copies ``c <= wanted`` that keep the rest completable: with ``c`` copies taken off
    its arcs and its root's count, Edmonds' condition (:func:`_completable`) must still hold. That test is
    monotone in ``c`` (one copy fewer frees exactly the arcs a copy of the seed would use), so ``c`` is found by
    bisection. The remainder is packed on the residual capacities by :func:`pack_arborescences`, which the
    condition guarantees to succeed: the rate is the one ``cap`` was chosen for, whatever the seeds."""
    cap = {key: c for key, c in cap.items() if c > 0}
    left = {r: k * w for r, w in sorted(weights.items()) if w > 0}
    kept: list[Tree] = []
    for root, edges, wanted in seeds:
        nodes = {root} | {child for _, child in edges}
        if len(nodes) < num_ranks or len(edges) != num_ranks - 1 or left.get(root, 0) == 0:
            continue   # only whole spanning trees are seeds
        top = min([wanted, left[root]] + [cap.get(edge, 0) for edge in edges])

        def fits(copies: int, root: int = root, edges: tuple = edges) -> bool:
            trial = dict(cap)
            for edge in edges:
                trial[edge] -= copies
            return _completable(num_ranks, trial, {**left, root: left[root] - copies})

        lo, hi = 0, max(top, 0)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            continue
        for edge in edges:
            cap[edge] -= lo
        left[root] -= lo
        kept.append(Tree(root, lo, list(edges), nodes))
    rest = {r: c for r, c in left.items() if c > 0}
    packed = pack_arborescences(num_ranks, cap, rest, 1) if rest else []
    return kept, packed

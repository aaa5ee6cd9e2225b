"""Link capacities split between an allreduce's reduce-scatter and allgather forests, for phases that
run at the same time.

Run one after the other, the two phases take ``T_RS + T_AG`` (each at its cut bound). Run together,
each link can give part of its bandwidth to each phase, and where the phases' bottlenecks differ
(a mesh corner receives in the allgather and sends in the reduce-scatter) the allreduce needs less.
The best split is a linear program (the concurrent version of the ForestColl rate, arXiv 2402.06787
§3, whose multi-root condition is Edmonds' branching theorem), over rank pairs ``u → v`` joined by a link
or by the route a send between them takes through switches (``R_uv``, :func:`synth.topology.routes.rank_routes`):
``y_uv`` carries the allgather, ``z_uv`` the reduce-scatter. A transfer moves at its route's least bandwidth
``b(R_uv)`` and holds every link of the route (docs/cost-model.md), so

    maximise ρ  subject to  Σ_{uv: e ∈ R_uv} (y_uv + z_uv) / b(R_uv) ≤ 1                (every link e)
        y(δ⁺(S)) ≥ ρ·|S|,   z(δ⁻(S)) ≥ ρ·|S|         (every rank set S that misses a rank)

Without switches a pair is a link and its row reads ``y_e + z_e ≤ B_e``. By Edmonds' theorem ``y`` then
carries an allgather forest at ``ρ`` GB/s per root piece and ``z`` a reduce-scatter forest at the same rate:
both phases move ``M`` bytes per piece in ``M / ρ``. On a 5×5 mesh this meets the allreduce traffic bound
(2(N-1)·SIZE / ΣB, the binding bound there), 0.62× the time of the phases one after the other.

The split's shares are fractions of a link; packed into ``k`` trees per root they are rounded to
whole tree edges, phase by phase, and the forests can lose rate (mesh-5x5, one tree per root: 0.92 and
0.90 of ρ on an optimal vertex of an earlier flow formulation; all of it on this LP's, which fills the
links). :func:`whole_tree_split` rounds both phases together instead, as an integer program over tree
edges per link (below), which keeps ρ exactly on the 5×5 mesh and also shares every link out evenly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from synth.errors import TimeLimitReached
from synth.solvers import Model, silence_fds, solve
from synth.synthesis.packing import short_cuts
from synth.topology.model import Link, Topology
from synth.topology.routes import rank_routes

WHOLE_SPLIT_ROUNDS = 100   # cut-generation rounds of whole_tree_split before it gives up
SPLIT_ROUNDS = 100         # cutting-plane rounds of split_capacities before it gives up
SHARE_GRID = 1000          # split_capacities' shares in thousandths of the rate ρ (exact integer fabrics)
SEPARATION_SCALE = 10**6   # shares as integers for the max-flow separation, per unit of ρ
SHARE_WEIGHT = 1e-3        # split_capacities' objective: ρ, plus this much of the mean share


@dataclass(frozen=True)
class CapacitySplit:
    """``allgather`` and ``reducescatter``: the fabric with each link's share of the phase as its
    bandwidth (links without one dropped); only the shares' ratios matter to the forests planned on
    them. :func:`split_capacities` gives ranks only, shares in units of ``ρ / SHARE_GRID`` per rank pair;
    :func:`whole_tree_split` the fabric's links, tree edges per link."""
    rate_GBps: float          # ρ: per root piece, in each phase
    allgather: Topology       # the shares y (rank pairs or links without one dropped)
    reducescatter: Topology   # ... z

    def time_us(self, piece_bytes: float) -> float:
        return piece_bytes / (self.rate_GBps * 1e3)


def split_capacities(topology: Topology, give_up_us: float | None = None,
                     piece_bytes: float = 1.0) -> CapacitySplit | None:
    """The LP of the module docstring, or None where it does not settle or is not worth it (below).

    The cut rows are exponentially many; they are added by cutting planes (Kelley 1960) to one HiGHS model
    re-solved from its last basis, each round asking max-flow for every rank's violated cut of each phase
    (:func:`synth.synthesis.packing.short_cuts`) until none is (a 64-rank mesh: 0.1 s, where the LP with a
    flow per rank took 42 s). Every round's ``ρ`` is an upper bound on the optimum, so the loop stops (None)
    as soon as it promises no better than ``give_up_us`` for ``piece_bytes`` per root, and after
    ``SPLIT_ROUNDS``.

    The split's fabrics have ranks only, one link per rank pair with a share, in units of ``ρ / SHARE_GRID``
    (rounded down, so no link is charged more than the LP allows); a forest packed on them runs each edge on
    its pair's route. Deterministic: HiGHS's dual simplex and max-flow.
    """
    import highspy
    from scipy.sparse import csr_matrix

    n = topology.num_ranks
    routes = rank_routes(topology)
    pairs = sorted(routes)
    if n < 2 or not pairs:
        return None
    size = 2 * len(pairs) + 1
    rho = size - 1
    link_index = {(lk.src, lk.dst): i for i, lk in enumerate(topology.links)}
    bandwidth = np.array([lk.bw for lk in topology.links])
    rows, cols, vals = [], [], []
    for p, pair in enumerate(pairs):
        hops = [link_index[hop] for hop in zip(routes[pair], routes[pair][1:])]
        narrowest = float(bandwidth[hops].min())
        for e in hops:
            rows += [e, e]
            cols += [p, len(pairs) + p]
            vals += [1.0 / narrowest] * 2
    tails = np.array([u for u, _ in pairs], dtype=np.int64)
    heads = np.array([v for _, v in pairs], dtype=np.int64)
    # one model, re-solved from its last basis as cuts are added (dual simplex)
    with silence_fds():   # HiGHS prints its banner even with output off
        lp = highspy.Highs()
    lp.setOptionValue("output_flag", False)
    # no "threads": HiGHS fixes its pool once per process, and a different count makes run() fail; the
    # dual simplex of an LP runs serially, so the answer does not depend on it
    lp.addVars(size, np.zeros(size), np.full(size, highspy.kHighsInf))
    # maximise ρ, and a little the shares themselves: among optimal vertices those that fill the links
    # satisfy more cuts (without it the 4-box mixed fabric tailed for 100+ rounds at the optimal ρ)
    objective = np.full(size, -SHARE_WEIGHT / len(pairs))
    objective[rho] = -1.0
    lp.changeColsCost(size, np.arange(size, dtype=np.int32), objective)
    _add_rows(lp, csr_matrix((vals, (rows, cols)), shape=(len(bandwidth), size)), np.ones(len(bandwidth)))
    # (phase, source side): every rank alone and every rank left out, to start
    new = list(dict.fromkeys((phase, frozenset(side)) for v in range(n) for phase in (0, 1)
                             for side in ({v}, set(range(n)) - {v})))
    known = set(new)   # the cuts in the model
    for _ in range(SPLIT_ROUNDS):
        _add_rows(lp, _route_cut_rows(new, tails, heads, n, size), np.zeros(len(new)))
        with silence_fds():
            lp.run()
        if lp.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        values = np.maximum(np.asarray(lp.getSolution().col_value), 0.0)   # -1e-12 would be a negative capacity
        rate = float(values[rho])
        if rate <= 0 or (give_up_us is not None and piece_bytes / (rate * 1e3) > give_up_us):
            return None
        found = []
        for phase in (0, 1):
            shares = values[phase * len(pairs):(phase + 1) * len(pairs)]
            arc_tails, arc_heads = (tails, heads) if phase == 0 else (heads, tails)
            caps = np.floor(shares / rate * SEPARATION_SCALE * (1 + 1e-7)).astype(np.int64)
            found += [(phase, frozenset(side)) for _, side in
                      short_cuts(n, arc_tails, arc_heads, caps, dict.fromkeys(range(n), 1), SEPARATION_SCALE, range(n))]
        new = [cut for cut in dict.fromkeys(found) if cut not in known]
        if not new:
            return CapacitySplit(rate, _pair_fabric(topology, routes, pairs, values[:len(pairs)] / rate),
                                 _pair_fabric(topology, routes, pairs, values[len(pairs):2 * len(pairs)] / rate))
        known.update(new)
    return None


def _add_rows(lp, matrix, upper: np.ndarray) -> None:
    """Rows ``matrix · v ≤ upper`` added to a HiGHS model."""
    matrix = matrix.tocsr()
    lp.addRows(matrix.shape[0], np.full(matrix.shape[0], -np.inf), upper, matrix.nnz,
               matrix.indptr.astype(np.int32), matrix.indices.astype(np.int32), matrix.data)


def _route_cut_rows(cuts: list[tuple[int, frozenset[int]]], tails: np.ndarray, heads: np.ndarray, n: int, size: int):
    """``ρ·|S| − y(δ⁺(S)) ≤ 0`` (phase 0) and ``ρ·|S| − z(δ⁻(S)) ≤ 0`` (phase 1) as sparse rows."""
    from scipy.sparse import csr_matrix

    pairs = len(tails)
    rows, cols, vals = [], [], []
    for row, (phase, side) in enumerate(cuts):
        inside = np.zeros(n, dtype=bool)
        inside[list(side)] = True
        crossing = np.flatnonzero(inside[tails] & ~inside[heads] if phase == 0 else ~inside[tails] & inside[heads])
        rows += [row] * (len(crossing) + 1)
        cols += list(crossing + phase * pairs) + [size - 1]
        vals += [-1.0] * len(crossing) + [float(len(side))]
    return csr_matrix((vals, (rows, cols)), shape=(len(cuts), size))


def _pair_fabric(topology: Topology, routes: dict, pairs: list[tuple[int, int]], shares: np.ndarray) -> Topology:
    """Ranks only, a link ``u → v`` per rank pair whose share (in units of ρ) rounds down to at least one
    ``1/SHARE_GRID``; the link's α is its route's (``routes``: :func:`rank_routes`)."""
    grid = np.floor(shares * SHARE_GRID + 1e-6).astype(np.int64)
    links = []
    for (u, v), units in zip(pairs, grid):
        if units > 0:
            path = routes[(u, v)]
            links.append(Link(u, v, float(units) / SHARE_GRID,
                              sum(topology.link(a, b).alpha for a, b in zip(path, path[1:]))))
    return replace(topology, links=tuple(links), switches=(), features=())


def _with_bandwidths(topology: Topology, capacity: np.ndarray) -> Topology:
    """``topology`` with link ``e`` at bandwidth ``capacity[e]`` (its unit the caller's); links left (almost) empty
    are dropped."""
    links = tuple(Link(link.src, link.dst, float(c), link.alpha)
                  for link, c in zip(topology.links, capacity) if c > 1e-7 * link.bw)
    return replace(topology, links=links)


def whole_tree_split(topology: Topology, split: CapacitySplit, trees_per_root: int = 1, solver: str = "highs",
                     deadline: float | None = None, work_limit: float | None = None) -> CapacitySplit | None:
    """``split`` rounded to whole trees in both phases at once: with ``k`` trees per root and phase,
    each carrying ``1/k`` of a piece, find integer tree-edge counts ``x_e`` (allgather) and ``z_e``
    (reduce-scatter) per link,

        minimise λ  subject to  x_e + z_e ≤ λ · k · B_e / ρ                          (every link e)
            Σ_{e into U} x_e ≥ k · |ranks ∖ U|,   Σ_{e out of U} z_e ≥ k · |ranks ∖ U|   (every rank set U)

    the cut rows being Edmonds' branching theorem (k arborescences per root within the counts; the
    reduce-scatter's on the reversed fabric, ForestColl §3). The phases then run at ρ/λ, and λ = 1
    keeps the split's rate exactly. At that λ a second program shares the links out evenly: it
    maximises the least share ``min(x_e, z_e) / (k · B_e / ρ)`` over the links (then, a little, their
    sum). A link that carries both phases serves either while the other has nothing to send, the
    reduce-scatter before the first sums are complete and the allgather after the last: on the 5×5
    mesh, 36 of 80 links held one phase only and the allreduce reached 0.91 of its bound, with every
    link at least 3 of 15 tree edges each way it reaches 0.95.

    Cuts are generated lazily: each round solves the integer program (HiGHS) and adds, for every
    rank whose max-flow from a super-source is short, the sink side of its minimum cut. Switchless
    fabrics only (switches would need the edge splitting of :mod:`synth.synthesis.packing`); ``None``
    there, or where the solver's deterministic ``work_limit`` (per program) stops it before no cut is
    violated; ``deadline`` (a ``time.monotonic()`` instant) is the user's safety stop and raises
    :class:`TimeLimitReached`.
    """
    n = topology.num_ranks
    if topology.num_nodes != n or n < 2:
        return None
    src, dst, bw, _ = topology.arrays
    k = trees_per_root
    per_link = k * bw / split.rate_GBps      # tree edges a link carries in the split's time, λ = 1
    phases = ((dst, src), (src, dst))         # (head, tail) of the arcs each phase's trees use
    cuts: list[tuple[int, frozenset[int]]] = [(p, frozenset(u)) for v in range(n) for p in (0, 1)
                                              for u in ({v}, set(range(n)) - {v})]
    least = _counts_with_cuts(per_link, phases, cuts, k, n, None, solver, deadline, work_limit)
    if least is None:
        return None
    stretch = float(np.max((least[0] + least[1]) / per_link))
    x, z = _counts_with_cuts(per_link, phases, cuts, k, n, stretch, solver, deadline, work_limit) or least
    return CapacitySplit(split.rate_GBps / stretch, _with_bandwidths(topology, x.astype(float)),
                         _with_bandwidths(topology, z.astype(float)))


def _counts_with_cuts(per_link: np.ndarray, phases, cuts: list, k: int, n: int, stretch: float | None, solver: str,
                      deadline: float | None, work_limit: float | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The integer program of :func:`whole_tree_split` (least λ, or with ``stretch`` the most even shares
    at that λ), re-solved with the violated cuts added (to ``cuts``) until none is: (x, z) or None."""
    for _ in range(WHOLE_SPLIT_ROUNDS):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeLimitReached("trees: the time limit ran out while it rounded the split allreduce to whole "
                                   "trees; allow more time")
        counts = _whole_counts(per_link, phases, cuts, k, n, stretch, solver, left, work_limit)
        if counts is None:
            return None
        new = [(p, u) for p in (0, 1) for u in _short_cuts(counts[p], *phases[p], k, n)]
        if not new:
            return counts
        cuts += [cut for cut in dict.fromkeys(new) if cut not in cuts]
    return None


def _whole_counts(per_link: np.ndarray, phases, cuts, k: int, n: int, stretch: float | None, solver: str,
                  time_limit: float | None, work_limit: float | None) -> tuple[np.ndarray, np.ndarray] | None:
    """One integer program of :func:`whole_tree_split` with the ``cuts`` found so far: (x, z) or None."""
    m = len(per_link)
    model = Model("whole-tree-split")
    counts = [model.add_vars(m, integer=True), model.add_vars(m, integer=True)]
    arange = np.arange(m)
    if stretch is None:   # x_e + z_e - λ·per_link_e <= 0, minimise λ
        lam = model.add_var()
        model.add_rows(np.concatenate([arange, arange, arange]),
                       np.concatenate([counts[0], counts[1], np.full(m, lam)]),
                       np.concatenate([np.ones(2 * m), -per_link]), np.full(m, -np.inf), np.zeros(m))
        model.set_objective([lam], [1.0])
    else:                 # x_e + z_e <= λ·per_link_e; share_e <= x_e, z_e; least <= share_e / per_link_e
        model.add_rows(np.concatenate([arange, arange]), np.concatenate(counts), np.ones(2 * m),
                       np.full(m, -np.inf), np.floor(stretch * per_link + 1e-6))
        share, least = model.add_vars(m), model.add_var()
        for phase in (0, 1):
            model.add_rows(np.concatenate([arange, arange]), np.concatenate([share, counts[phase]]),
                           np.concatenate([np.ones(m), -np.ones(m)]), np.full(m, -np.inf), np.zeros(m))
        model.add_rows(np.concatenate([arange, arange]), np.concatenate([np.full(m, least), share]),
                       np.concatenate([per_link, -np.ones(m)]), np.full(m, -np.inf), np.zeros(m))
        model.set_objective(np.concatenate([[least], share]), np.concatenate([[1.0], 1e-3 / per_link]), "max")
    for phase, inside in cuts:
        heads, tails = phases[phase]
        crossing = np.isin(heads, list(inside)) & ~np.isin(tails, list(inside))
        model.add_row(counts[phase][crossing], np.ones(int(crossing.sum())), k * (n - len(inside)))
    result = solve(model, solver, time_limit=time_limit, work_limit=work_limit)
    if not result.has_solution:
        return None
    values = np.asarray(result.values)
    return tuple(np.round(values[c]).astype(np.int64) for c in counts)


def _short_cuts(count: np.ndarray, heads: np.ndarray, tails: np.ndarray, k: int, n: int) -> list[frozenset]:
    """Sink sides ``U`` of the ranks whose max-flow from a super-source (``k`` to every rank) over
    ``count`` arcs falls short of ``k·n``: each violates ``count(into U) ≥ k·|ranks ∖ U|``."""
    used = count > 0
    every_rank = dict.fromkeys(range(n), 1)
    return [frozenset(range(n)) - frozenset(side)
            for _, side in short_cuts(n, tails[used], heads[used], count[used], every_rank, k, range(n))]

"""Rate-optimal ring packings by column generation: the most bandwidth a set of weighted rings can carry.

A ring is a cyclic order of the ranks; consecutive ranks talk over a direct link or the switch-only route of
:func:`synth.topology.routes.rank_routes`. A ring allgather of rate ``w`` moves ``w`` GB/s over every route of
its ring, and rings of rates ``w_C`` finish an allgather of SIZE in ``(N-1)/N · SIZE / Σ w_C`` (Patarasuk &
Yuan, JPDC 2009, per ring). The packing problem is the LP

    max Σ_C w_C   s.t.   Σ_C u_C(l) · w_C ≤ b_l  for every link l,   w ≥ 0,

with ``u_C(l)`` the number of routes of ring ``C`` that use link ``l``. It has one column per Hamiltonian
cycle of the rank graph, so it is solved by column generation (Dantzig-Wolfe; Gilmore & Gomory, Oper. Res.
1961): the restricted master LP over the rings found so far gives link prices ``y_l ≥ 0`` (its duals), and
the pricing problem is a travelling-salesman tour of least price ``Σ_(a,b) Σ_(l in route(a,b)) y_l``; a tour
priced below 1 is a column that raises the LP. The pricing is CP-SAT's ``AddCircuit`` with one worker and a
deterministic-time budget, so the packing is the same on an idle and on a loaded machine. When no tour below
1 is found, the master's value ``Σ w_C`` is the best ring rate (proven when every pricing was solved to
optimality; the ``optimal`` flag says so).

Rings reach the allgather cut bound (ForestColl, arXiv 2402.06787) exactly when the binding cut is a single
rank's in-bandwidth (tori, hypercubes, switch boxes); on multi-box fabrics their rate is capped by the box
cut, and the tree methods are the better answer there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.topology.model import Topology
from synth.topology.routes import rank_routes

PRICING_ROUNDS = 15            # column-generation rounds at most
PRICING_DETERMINISTIC_S = 0.5  # CP-SAT deterministic time per pricing problem (work, not wall-clock)
PRICE_SCALE = 1_000_000        # link prices are rounded to integers of this resolution for CP-SAT
IMPROVING = 1.0 - 1e-6         # a tour priced below this raises the LP
MIN_SHARE = 1e-4               # rings below this share of the total rate are dropped
MAX_RINGS = 32                 # rings of an integral packing at most (one MSCCL channel each)
INTEGRAL_DETERMINISTIC_S = 3.0   # CP-SAT deterministic time for one integral packing


@dataclass(frozen=True)
class RingPacking:
    """Rings (rank orders) with their rates in GB/s; ``optimal`` when the LP's optimality was proven."""

    orders: tuple[tuple[int, ...], ...]
    rates: tuple[float, ...]
    optimal: bool

    @property
    def rate(self) -> float:
        return float(sum(self.rates))


def _arc_links(topology: Topology) -> tuple[list[tuple[int, int]], dict[tuple[int, int], list[int]], np.ndarray]:
    """The rank graph's arcs (sorted), the link indices each arc's route uses, and the link bandwidths."""
    routes = rank_routes(topology)
    index = {(lk.src, lk.dst): i for i, lk in enumerate(topology.links)}
    arcs = sorted(routes)
    uses = {arc: [index[(a, b)] for a, b in zip(routes[arc][:-1], routes[arc][1:], strict=False)] for arc in arcs}
    return arcs, uses, np.array([lk.bw for lk in topology.links], dtype=float)


def _column(order: tuple[int, ...], uses: dict[tuple[int, int], list[int]], num_links: int) -> np.ndarray:
    col = np.zeros(num_links)
    for k, a in enumerate(order):
        for link in uses[(a, order[(k + 1) % len(order)])]:
            col[link] += 1.0
    return col


def _master(columns: list[np.ndarray], bw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ring rates, link prices) of the restricted master LP, by HiGHS dual simplex."""
    from scipy.optimize import linprog

    matrix = np.column_stack(columns)
    res = linprog(-np.ones(len(columns)), A_ub=matrix, b_ub=bw, bounds=(0, None), method="highs-ds")
    if res.status != 0:  # pragma: no cover - the LP is bounded and feasible (w = 0)
        raise RuntimeError(f"ring packing LP failed: {res.message}")
    return np.asarray(res.x), -np.asarray(res.ineqlin.marginals)


def _cheapest_tour(n: int, arcs: list[tuple[int, int]], price: dict[tuple[int, int], int],
                   hint: tuple[int, ...] | None) -> tuple[tuple[int, ...] | None, int | None, bool]:
    """(tour from rank 0, its price, proven optimal) of the least-priced Hamiltonian cycle, by CP-SAT."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    literal = {arc: model.NewBoolVar(f"x{arc[0]}_{arc[1]}") for arc in arcs}
    model.AddCircuit([(a, b, lit) for (a, b), lit in literal.items()])
    model.Minimize(sum(price[arc] * lit for arc, lit in literal.items()))
    if hint:
        on = {(hint[k], hint[(k + 1) % n]) for k in range(n)}
        for arc, lit in literal.items():
            model.AddHint(lit, arc in on)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = PRICING_DETERMINISTIC_S
    solver.parameters.random_seed = 0
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, None, False
    return _tour(solver, literal, n), int(round(solver.ObjectiveValue())), status == cp_model.OPTIMAL


def _tour(solver, literal: dict, n: int) -> tuple[int, ...]:
    """The rank order, from rank 0, of the circuit a solved CP-SAT model chose among the arc ``literal``s."""
    succ = {a: b for (a, b), lit in literal.items() if solver.Value(lit)}
    tour = [0]
    while len(tour) < n:
        tour.append(succ[tour[-1]])
    return tuple(tour)


def _canonical(order: tuple[int, ...]) -> tuple[int, ...]:
    k = order.index(0)
    return order[k:] + order[:k]


def pack_rings(topology: Topology, initial: list[tuple[int, ...]] = (), *,
               rounds: int = PRICING_ROUNDS) -> RingPacking | None:
    """The rate-optimal weighted ring packing of ``topology`` (see the module docstring), or None when the
    rank graph has no Hamiltonian cycle the pricing can find.

    ``initial`` rings (rank orders) seed the master LP; every ring found is a Hamiltonian cycle of the rank
    graph. Deterministic: HiGHS and single-worker CP-SAT with a deterministic-time budget.
    """
    n = topology.num_ranks
    if n < 3:
        return None
    arcs, uses, bw = _arc_links(topology)
    arc_set = set(arcs)
    orders: list[tuple[int, ...]] = []
    for order in initial:
        order = _canonical(tuple(order))
        if len(set(order)) == n and all((order[k], order[(k + 1) % n]) in arc_set for k in range(n)) \
                and order not in orders:
            orders.append(order)
    proven = True
    hint = orders[0] if orders else None
    if not orders:
        tour, _, _ = _cheapest_tour(n, arcs, {arc: 1 for arc in arcs}, None)
        if tour is None:
            return None
        orders.append(tour)
    columns = [_column(o, uses, len(bw)) for o in orders]
    rates, prices = _master(columns, bw)
    for _ in range(rounds):
        scale = PRICE_SCALE / max(1.0, float(prices.max(initial=0.0))) if prices.max(initial=0.0) > 0 else 1.0
        price = {arc: int(round(scale * sum(prices[l] for l in uses[arc]))) for arc in arcs}
        tour, cost, optimal = _cheapest_tour(n, arcs, price, hint)
        if tour is None:
            proven = False
            break
        tour = _canonical(tour)
        exact = float(_column(tour, uses, len(bw)) @ prices)
        if exact >= IMPROVING or tour in orders:
            proven = proven and optimal
            break
        orders.append(tour)
        columns.append(_column(tour, uses, len(bw)))
        rates, prices = _master(columns, bw)
        hint = tour
    else:
        proven = False
    total = float(rates.sum())
    keep = [i for i, r in enumerate(rates) if r > MIN_SHARE * total]
    keep.sort(key=lambda i: (-rates[i], orders[i]))
    return RingPacking(tuple(orders[i] for i in keep), tuple(float(rates[i]) for i in keep), proven)


def ring_count(topology: Topology, rate: float, max_rings: int = MAX_RINGS) -> int:
    """Rings of equal rate an integral packing of ``rate`` GB/s is tried with: ``rate`` over the links'
    bandwidth unit (their greatest common divisor at 0.5 GB/s resolution), at most ``max_rings``."""
    halves = [max(1, round(2 * lk.bw)) for lk in topology.links]
    unit = np.gcd.reduce(np.array(halves, dtype=np.int64)) / 2.0
    return int(max(1, min(max_rings, round(rate / unit))))


def integral_rings(topology: Topology, rate: float, count: int, *, both_ways: bool = False) -> RingPacking | None:
    """``count`` rings of rate ``rate / count`` each whose routes fit every link's bandwidth, or None.

    A link of bandwidth ``b`` carries at most ``floor(b · count / rate)`` of the rings' routes. The model is
    CP-SAT circuits (``AddCircuit``) over the rank graph's arcs with those capacities, one worker and a
    deterministic-time budget; ring k's successor of rank 0 is at most ring k+1's, which breaks the symmetry
    between equal rings. ``both_ways`` (``count`` even) looks for ``count / 2`` circuits each run in both
    directions: half the variables, and on a fabric whose links pair up both ways (tori, meshes, boxes)
    the same packings. None when no packing is found within the budget.
    """
    from ortools.sat.python import cp_model

    n = topology.num_ranks
    if n < 3 or count < 1 or rate <= 0 or (both_ways and count % 2):
        return None
    arcs, uses, bw = _arc_links(topology)
    if both_ways and any((b, a) not in uses for a, b in arcs):
        return None
    circuits = count // 2 if both_ways else count
    caps = np.floor(bw * count / rate + 1e-6).astype(int)
    model = cp_model.CpModel()
    literal = [{arc: model.NewBoolVar(f"x{k}_{arc[0]}_{arc[1]}") for arc in arcs} for k in range(circuits)]
    for k in range(circuits):
        model.AddCircuit([(a, b, lit) for (a, b), lit in literal[k].items()])
    load: dict[int, list] = {}
    for (a, b) in arcs:
        for link in uses[(a, b)] + (uses[(b, a)] if both_ways else []):
            load.setdefault(link, []).extend(literal[k][(a, b)] for k in range(circuits))
    for link, lits in load.items():
        if caps[link] < len(lits):
            model.Add(sum(lits) <= int(caps[link]))
    first = [sum(b * literal[k][(a, b)] for (a, b) in arcs if a == 0) for k in range(circuits)]
    for k in range(circuits - 1):
        model.Add(first[k] <= first[k + 1])
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = INTEGRAL_DETERMINISTIC_S
    solver.parameters.random_seed = 0
    if solver.Solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    orders = []
    for k in range(circuits):
        tour = _tour(solver, literal[k], n)
        orders.append(tour)
        if both_ways:
            orders.append(_canonical(tuple(reversed(tour))))
    usage = sum(_column(o, uses, len(bw)) for o in orders)
    each = float(min(bw[l] / usage[l] for l in range(len(bw)) if usage[l] > 0))
    return RingPacking(tuple(orders), tuple(each for _ in orders), False)


def ring_rate_bound(topology: Topology) -> float:
    """The most any ring packing can carry, in GB/s: ``min over rank pairs (a, b) of λ(a, b)``.

    Every ring passes from any rank set to its complement, so the rings' total rate crosses every cut that
    separates two ranks: ``Σ w_C ≤ min_(S) B⁺(S)`` over node sets holding some but not all ranks, which is the
    least rank-to-rank max-flow, :func:`synth.lower_bounds.min_pair_cut` (Menger / max-flow min-cut).
    """
    from synth.lower_bounds import min_pair_cut

    return min_pair_cut(topology)


def _integral(topology: Topology, rate: float) -> RingPacking | None:
    """:func:`integral_rings` at ``rate`` with :func:`ring_count` rings, both ways round first."""
    count = ring_count(topology, rate)
    for both_ways in (True, False) if count % 2 == 0 else (False,):
        found = integral_rings(topology, rate, count, both_ways=both_ways)
        if found is not None:
            return found
    return None


def best_rings(topology: Topology, initial: list[tuple[int, ...]] = ()) -> RingPacking | None:
    """Equal-rate rings of the highest rate found, few enough for MSCCL's channels, or None.

    First integral rings at the cut rate (:func:`ring_rate_bound`): found, they are optimal among ring
    packings (``optimal``). Otherwise the column-generation LP (:func:`pack_rings`) gives the rate to aim
    for, and its integral packing is kept when one is found; else the LP's rings are returned with their
    fractional rates (the caller rounds them to weights).
    """
    if topology.num_ranks < 3:
        return None
    target = ring_rate_bound(topology)
    found = _integral(topology, target)
    if found is not None and found.rate >= target * (1 - 1e-9):
        return RingPacking(found.orders, found.rates, True)
    lp = pack_rings(topology, initial)
    if lp is None:
        return found
    packed = _integral(topology, lp.rate)
    candidates = [p for p in (found, packed, lp if len(lp.orders) <= MAX_RINGS else None) if p is not None]
    return max(candidates, key=lambda p: (round(p.rate, 9), -len(p.orders)), default=None)

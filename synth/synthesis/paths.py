"""Optimal routing of a scatter (and, reversed, a gather): one flow LP, decomposed into paths.

Scatter from one root is a single-commodity flow: every rank ``v ≠ root`` needs one unit of its own
data and all of it starts at the root, so the units are interchangeable on the way (a super sink
joined by ``v -> t`` arcs of capacity 1). By max-flow/min-cut the least time is the scatter cut bound
of :func:`synth.lower_bounds.scatter_cut`, and by the flow decomposition theorem (Ford & Fulkerson, *Flows
in Networks*, 1962, ch. I §2) the flow splits into ``root -> v`` paths that carry ``v``'s unit.

A rank reaches another one over the route the runtime takes (:func:`synth.topology.routes.rank_routes`,
a direct link or a switch path that holds every link on it), so the flow runs on those routes as arcs
and each physical link bounds the sum of the routes through it:

    min T   s.t.   Σ_out x − Σ_in x = N−1 at the root, −1 at every other rank;
                   Σ_{routes r ∋ e} x_r ≤ b_e · T for every link e;   x ≥ 0.

On a fabric without switches the routes are the links and ``T`` is the cut bound exactly; behind
switches the runtime's fixed routes may cost more, and ``T`` is what they allow. Solved with HiGHS
(:func:`scipy.optimize.linprog`), then again for a flow at that ``T`` that spreads the load
(:func:`_spread`). A gather uses the flow of the reversed fabric, its paths walked towards the root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from synth.errors import SynthError, TimeLimitReached
from synth.topology.model import Topology
from synth.topology.routes import rank_routes

Hop = tuple[int, int, tuple[int, ...]]   # (sender, receiver, switches crossed)
FLOW_TOL = 1e-9                          # flow below this share of a unit is rounding noise
SLACK = 1e-7                             # the spread flow may take this much longer than the optimum
LEVELS = (0.5, 0.75, 0.9)                # link shares above which the spread flow pays (see _spread)
HOP_COST = 1e-3                          # ... and its cost per unit and hop


@dataclass(frozen=True)
class Path:
    """``share`` of rank ``dest``'s unit travels the ``hops`` from the root (store-and-forward at ranks)."""

    dest: int
    share: float
    hops: tuple[Hop, ...]


@dataclass(frozen=True)
class PathPlan:
    """The paths of an optimal scatter flow; ``time_per_byte_us``: its time per byte of one rank's data."""

    root: int
    paths: tuple[Path, ...]
    time_per_byte_us: float


def plan_paths(topology: Topology, root: int) -> list[PathPlan]:
    """Optimal scatter flows from ``root`` over the runtime's routes, decomposed into paths (module doc):
    the LP's vertex solution (few paths, possibly long) and the flow at the same time that spreads
    the load (:func:`_spread`). Which pipelines better depends on the fabric, so both are returned."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n = topology.num_ranks
    bw = topology.arrays[2]
    arcs = route_arcs(topology)
    num = len(arcs.hops)
    # conservation rows (ranks), then one capacity row per link; the last column is T
    supply = np.full(n, -1.0)
    supply[root] = n - 1
    equality = coo_matrix((arcs.conservation_vals, (arcs.conservation_rows, np.tile(np.arange(num), 2))),
                          shape=(n, num + 1)).tocsr()
    links = len(topology.links)
    capacity = coo_matrix((np.ones(len(arcs.use_link)), (arcs.use_link, arcs.use_arc)), shape=(links, num + 1)).tolil()
    capacity[:, num] = -bw.reshape(-1, 1) * 1e3          # bytes per µs: T is µs per byte of a unit
    cost = np.zeros(num + 1)
    cost[num] = 1.0
    capacity = capacity.tocsr()
    result = linprog(cost, A_ub=capacity, b_ub=np.zeros(links), A_eq=equality, b_eq=supply,
                     bounds=[(0, None)] * (num + 1), method="highs")
    if result.status != 0:
        raise SynthError(f"scatter flow LP failed on {topology.name}: {result.message}")
    best = float(result.x[num])
    flows = [result.x[:num], _spread(capacity[:, :num], equality[:, :num], supply, bw * 1e3 * best)]
    return [PathPlan(root, tuple(decompose(arcs.hops, np.where(flow > FLOW_TOL, flow, 0.0), root, n)), best)
            for flow in flows if flow is not None]


@dataclass(frozen=True)
class RouteArcs:
    """The runtime's routes as flow arcs: ``hops[j]`` is arc ``j`` (sender, receiver, switches crossed);
    ``conservation_rows``/``_vals`` its +1 at the sender and -1 at the receiver (senders first, then
    receivers, for ``np.tile(arange(arcs), 2)`` columns); arc ``use_arc[i]`` holds link ``use_link[i]``."""

    hops: list[Hop]
    conservation_rows: np.ndarray
    conservation_vals: np.ndarray
    use_link: np.ndarray
    use_arc: np.ndarray


def route_arcs(topology: Topology) -> RouteArcs:
    """Every routed rank pair of :func:`synth.topology.routes.rank_routes` as an arc of the flow LPs."""
    routes = sorted(rank_routes(topology).items())
    link_index = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    uses = [(link_index[pair], j) for j, (_, path) in enumerate(routes) for pair in zip(path, path[1:])]
    num = len(routes)
    return RouteArcs(
        hops=[(u, v, path[1:-1]) for (u, v), path in routes],
        conservation_rows=np.array([u for (u, _), _ in routes] + [v for (_, v), _ in routes], dtype=np.int64),
        conservation_vals=np.concatenate([np.ones(num), -np.ones(num)]),
        use_link=np.array([e for e, _ in uses], dtype=np.int64),
        use_arc=np.array([j for _, j in uses], dtype=np.int64))


def _spread(uses, conservation, supply: np.ndarray, capacity: np.ndarray) -> np.ndarray | None:
    """Among the flows within ``capacity`` (units of a rank's data per link at the optimal T), one that leaves links
    slack where it can: any optimum may saturate every NIC or wander over 7 hops (dgx-a100-2node),
    while α and pipeline fill need room. Minimises ``Σ_e Σ_l max(0, u_e − l)`` over ``LEVELS`` ``l``
    (a convex piecewise-linear load penalty, ``u_e`` the share of link ``e`` used) plus ``HOP_COST``
    per unit and hop. None if HiGHS finds nothing."""
    from scipy.optimize import linprog
    from scipy.sparse import bmat, csr_matrix, diags, hstack, identity

    links, num = uses.shape
    share = (diags(1.0 / capacity) @ uses).tocsr()
    k = len(LEVELS)
    a_ub = bmat([[share] + [None] * k]
                + [[share] + [-identity(links) if j == i else None for j in range(k)] for i in range(k)]).tocsr()
    b_ub = np.concatenate([np.full(links, 1 + SLACK)] + [np.full(links, level) for level in LEVELS])
    a_eq = hstack([conservation, csr_matrix((conservation.shape[0], k * links))]).tocsr()
    cost = np.concatenate([np.full(num, HOP_COST), np.ones(k * links)])
    result = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=supply, bounds=(0, None), method="highs")
    return result.x[:num] if result.status == 0 else None


def decompose(arcs: list[Hop], flow: np.ndarray, root: int, n: int, tolerance: float = FLOW_TOL) -> list[Path]:
    """Split a scatter flow (``flow[j]`` on arc ``arcs[j]``, one unit absorbed by every rank but the
    root) into root -> v paths: walk positive arcs from the root to the first rank still absorbing,
    cancelling any cycle met on the way, and take the least flow along the walk. A rank stops
    absorbing within ``tolerance`` of its unit (a solver's feasibility tolerance)."""
    flow = flow.astype(float).copy()
    out: list[list[int]] = [[] for _ in range(n)]
    for j, (u, _v, _route) in enumerate(arcs):
        out[u].append(j)
    absorb = np.ones(n)
    absorb[root] = 0.0
    paths: list[Path] = []
    while absorb.max() > tolerance:
        node, walk, seen = root, [], {root: 0}
        while node == root or absorb[node] <= tolerance:
            j = max(out[node], key=lambda a: flow[a], default=None)
            if j is None or flow[j] <= FLOW_TOL:
                raise SynthError("internal error: scatter flow does not reach every rank")
            walk.append(j)
            node = arcs[j][1]
            if node in seen:   # a cycle carries nothing to anyone: cancel it
                cycle = walk[seen[node]:]
                flow[cycle] -= min(flow[a] for a in cycle)
                del walk[seen[node]:]
                seen = {arcs[a][0]: i for i, a in enumerate(walk)}
                seen[node] = len(walk)
                continue
            seen[node] = len(walk)
        share = min(absorb[node], *(flow[j] for j in walk))
        flow[walk] -= share
        absorb[node] -= share
        paths.append(Path(node, float(share), tuple(arcs[j] for j in walk)))
    return paths


# ---- alltoall: every rank's scatter at once ---------------------------------------------------------
ALLTOALL_SLACK = 1e-4    # the shortest-hop flow may take this much longer than the optimum
SOLVER_TOL = 1e-6        # units a backend's flow may miss conservation by (CBC, GLOP)


class LPTooLarge(SynthError):
    """The alltoall flow LP would pass its size cap (the caller may plan without it)."""


def plan_alltoall_paths(topology: Topology, solver: str = "highs", time_limit: float | None = None,
                        max_variables: int | None = None,
                        relay_limit: float | None = None) -> list[tuple[PathPlan, ...]]:
    """Alltoall as ``N`` scatters that share the links: the maximum concurrent flow over the runtime's
    routes (Shahrokhi & Matula, "The maximum concurrent flow problem", J. ACM 1990; TE-CCL's LP,
    SIGCOMM 2024, §4), each source's flow decomposed into paths as in :func:`decompose`:

        min T   s.t.   Σ_out x_s − Σ_in x_s = N−1 at rank s, −1 at every other rank   (every source s)
                       Σ_s Σ_{routes r ∋ e} x_{s,r} ≤ b_e · T                          (every link e)

    with one unit = one rank's piece for one peer (SIZE/N). Without switches the routes are the links
    and ``T`` is the concurrent-flow bound of :func:`synth.lower_bounds.alltoall_lp_ratio`; behind switches
    the fixed routes may cost more. Two flows are returned, each as one plan per source: the LP's
    vertex and, at ``T`` within :data:`ALLTOALL_SLACK`, the flow with the fewest unit-hops (relays
    cost α and pipeline fill). Raises :class:`SynthError` if the solver fails, or if the LP would have
    more than ``max_variables`` variables (sources × routed rank pairs): :class:`LPTooLarge`.

    ``relay_limit``: units a rank may relay, i.e. hold for others (the scratch a program of these paths needs,
    ``--max-scratch``). Where the fewest-hop flow relays more through some rank, the two stages are solved again
    with every rank's relay bounded, ``Σ_{s≠v} Σ_{arcs into v} x_s ≤ relay_limit + N − 1`` (all that enters
    ``v`` but the ``N − 1`` units it keeps), and only flows within the limit are returned (a slower ``T`` where
    the bound binds); where no flow is (a ring's alltoall relays more than its buffer), the unbounded ones."""
    from synth.solvers import Model, solve

    n = topology.num_ranks
    arcs = route_arcs(topology)
    num = len(arcs.hops)
    if max_variables is not None and n * num > max_variables:
        raise LPTooLarge(f"the alltoall flow LP on {topology.name} would have {n * num} variables (more than "
                         f"{max_variables})")

    heads = np.array([v for _, v, _ in arcs.hops], dtype=np.int64)   # each arc's receiving rank

    def build(at_most_us_per_mb: float | None, relays: float | None) -> tuple[Model, np.ndarray, int]:
        model = Model("alltoall-paths")
        x = model.add_vars(n * num).reshape(n, num)
        t = model.add_var()      # µs per MB of one unit
        for s in range(n):       # conservation: out - in = supply
            supply = np.full(n, -1.0)
            supply[s] = n - 1
            model.add_rows(arcs.conservation_rows, np.tile(x[s], 2), arcs.conservation_vals, supply, supply)
        links = len(topology.links)
        rows = np.concatenate([np.repeat(arcs.use_link, n), np.arange(links)])
        cols = np.concatenate([x[:, arcs.use_arc].T.ravel(), np.full(links, t)])
        vals = np.concatenate([np.ones(len(arcs.use_link) * n), -topology.arrays[2] * 1e-3])
        model.add_rows(rows, cols, vals, np.full(links, -np.inf), np.zeros(links))
        if relays is not None:   # Σ_{s≠v} inflow_s(v) ≤ relays + N − 1 at every rank v
            into = np.tile(heads, n)
            others = np.repeat(np.arange(n), num) != into
            model.add_rows(into[others], x.ravel()[others], np.ones(int(others.sum())),
                           np.full(n, -np.inf), np.full(n, relays + n - 1))
        if at_most_us_per_mb is None:
            model.set_objective([t], [1.0])
        else:        # the fewest unit-hops: every arc, a direct link or a switch route, is one hop
            model.add_row([t], [1.0], ub=at_most_us_per_mb)
            model.set_objective(x.ravel(), np.ones(n * num))
        return model, x, t

    def most_relayed(flow: np.ndarray) -> float:
        # what enters each rank from the other sources, less the N - 1 units it keeps
        others = np.arange(n)[:, None] != heads[None, :]
        return float((np.bincount(heads, weights=(flow * others).sum(axis=0), minlength=n) - (n - 1)).max())

    started = time.monotonic()

    def two_stages(relays: float | None) -> list[tuple[tuple[PathPlan, ...], float]]:
        found: list[tuple[tuple[PathPlan, ...], float]] = []   # (plans, the most a rank relays)
        best = None
        for stage in range(2):
            left = None if time_limit is None else max(1.0, time_limit - (time.monotonic() - started))
            model, x, t = build(None if best is None else best * (1 + ALLTOALL_SLACK), relays)
            result = solve(model, solver, time_limit=left)
            if result.status != "optimal" or result.values is None:
                if stage:
                    break            # the vertex flow stands alone
                raise SynthError(f"alltoall flow LP on {topology.name} ended {result.status} ({solver})"
                                 + ("" if relays is None else f" with at most {relays:g} units relayed per rank"))
            values = np.asarray(result.values)
            flow = np.where(values[x] > FLOW_TOL, values[x], 0.0)
            if best is None:
                best = float(values[t])
            per_byte = best * 1e-6
            found.append((tuple(PathPlan(s, tuple(decompose(arcs.hops, flow[s], s, n, SOLVER_TOL)), per_byte)
                                for s in range(n)), most_relayed(flow)))
        return found

    found = two_stages(None)
    if relay_limit is not None and any(most > relay_limit + SOLVER_TOL for _, most in found):
        # the flows within the budget, and both stages again with every rank's relay bounded; where no flow
        # relays that little (a ring's alltoall relays more than its buffer), the flows above stand
        try:
            found = [f for f in found if f[1] <= relay_limit + SOLVER_TOL] + two_stages(relay_limit)
        except TimeLimitReached:
            raise
        except SynthError:
            pass
    return [plans for plans, _ in found]


def runtime_route_plans(topology: Topology) -> tuple[PathPlan, ...]:
    """Alltoall without an LP: every piece on the one path the runtime's rule gives it
    (:mod:`synth.topology.routes`: a direct link or switch path, else ranks forward, as the simulator
    has a foreign program's sends do), cut at the ranks it crosses into hops. Its
    ``time_per_byte_us`` is the busiest link's: units crossing it ÷ its bandwidth."""
    from synth.topology.routes import RuntimePaths

    link_index = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    units = np.zeros(len(topology.links))
    runtime = RuntimePaths(topology)
    plans = []
    for src in topology.ranks:
        paths = []
        for dst in topology.ranks:
            if dst == src:
                continue
            nodes = runtime.path(src, dst)
            if nodes is None:
                raise SynthError(f"topology {topology.name!r}: no path from rank {src} to rank {dst}")
            for pair in zip(nodes, nodes[1:]):
                units[link_index[pair]] += 1
            cuts = [i for i, node in enumerate(nodes) if topology.is_rank(node)]
            hops = tuple((nodes[a], nodes[b], nodes[a + 1:b]) for a, b in zip(cuts, cuts[1:]))
            paths.append(Path(dst, 1.0, hops))
        plans.append((src, tuple(paths)))
    per_byte = float((units / (topology.arrays[2] * 1e3)).max())
    return tuple(PathPlan(src, paths, per_byte) for src, paths in plans)

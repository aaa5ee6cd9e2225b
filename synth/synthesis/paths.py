"""Optimal routing of a scatter (and, reversed, a gather): one flow LP, decomposed into paths.

Scatter from one root is a single-commodity flow: every rank ``v ≠ root`` needs one unit of its own
data and all of it starts at the root, so the units are interchangeable on the way (a super sink
joined by ``v -> t`` arcs of capacity 1). By max-flow/min-cut the least time is the scatter cut bound
of :func:`synth.bounds.scatter_cut`, and by the flow decomposition theorem (Ford & Fulkerson, *Flows
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

from dataclasses import dataclass

import numpy as np

from synth.errors import SynthError
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
    routes = sorted(rank_routes(topology).items())
    link_index = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    bw = topology.arrays[2]
    arcs = [(u, v, path[1:-1]) for (u, v), path in routes]
    num = len(arcs)
    # conservation rows (ranks), then one capacity row per link; the last column is T
    rows, cols, vals = [], [], []
    cap_rows, cap_cols = [], []
    for j, ((u, v), path) in enumerate(routes):
        rows += [u, v]
        cols += [j, j]
        vals += [1.0, -1.0]
        for a, b in zip(path, path[1:]):
            cap_rows.append(link_index[(a, b)])
            cap_cols.append(j)
    supply = np.full(n, -1.0)
    supply[root] = n - 1
    equality = coo_matrix((vals, (rows, cols)), shape=(n, num + 1)).tocsr()
    links = len(topology.links)
    capacity = coo_matrix((np.ones(len(cap_rows)) + 0.0, (cap_rows, cap_cols)), shape=(links, num + 1)).tolil()
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
    return [PathPlan(root, tuple(decompose(arcs, np.where(flow > FLOW_TOL, flow, 0.0), root, n)), best)
            for flow in flows if flow is not None]


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


def decompose(arcs: list[Hop], flow: np.ndarray, root: int, n: int) -> list[Path]:
    """Split a scatter flow (``flow[j]`` on arc ``arcs[j]``, one unit absorbed by every rank but the
    root) into root -> v paths: walk positive arcs from the root to the first rank still absorbing,
    cancelling any cycle met on the way, and take the least flow along the walk."""
    flow = flow.astype(float).copy()
    out: list[list[int]] = [[] for _ in range(n)]
    for j, (u, _v, _route) in enumerate(arcs):
        out[u].append(j)
    absorb = np.ones(n)
    absorb[root] = 0.0
    paths: list[Path] = []
    while absorb.max() > FLOW_TOL:
        node, walk, seen = root, [], {root: 0}
        while node == root or absorb[node] <= FLOW_TOL:
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

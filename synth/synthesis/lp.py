"""Method ``lp``: the optimal broadcast-forest rate from an explicit multi-commodity-flow LP.

Formulation (docs/cost-model.md; the fractional Steiner-flow relaxation used by ForestColl,
arXiv 2402.06787, §3 and by TE-CCL's LP, SIGCOMM'24): for every root ``r`` and destination rank
``v != r`` a unit flow ``f[r,v,e] >= 0`` from ``r`` to ``v`` (conservation at every other node,
switches included); the broadcast load of root ``r`` on link ``e`` is ``x[r,e] >= f[r,v,e]`` (data
is copied, so destinations share it); links are shared, ``Σ_r x[r,e] <= B_e · T``;
minimise ``T``. Its optimum equals the cut bound ``max_S |S ∩ roots| / B⁺(S)`` (max-flow/min-cut
per destination plus Edmonds' theorem), so it cross-checks method ``trees``.

The solution is then decomposed: per root, ``x[r,·]`` scaled by ``K`` and rounded up is an integer
capacity that carries ``K`` unit flows to every rank, so Edmonds' theorem (after the same edge
splitting of switches) packs ``K`` arborescences of that root in it; the trees are pipelined exactly
as in :mod:`synth.synthesis.trees`. Where the LP replicates data at a switch (allowed by the
relaxation, impossible for a program) a root's loads cannot be split; the method then packs the
joint forest at the rate the LP certified. Solver: ``--solver`` highs (default) | cbc | pulp-highs |
glop | pdlp (through :mod:`synth.solvers`).

Alltoall is the multi-commodity flow itself: :func:`synth.synthesis.paths.plan_alltoall_paths` solves
the maximum concurrent flow over the runtime's routes (every rank a scatter source, all sharing the
links), decomposes each source's flow into paths and pipelines the chunks down them, relaying at ranks
(:func:`synth.synthesis.trees.pathsched.forward_paths`), each rank relaying no more than the scratch budget holds
where some flow does (``relay_units``). Where ranks share no link the direct program sends over
the runtime's route, which may be a slow NIC; the flow relays through ranks instead where that is faster.
Behind switches the chunks' circuits are also run in rounds that share no port (a bipartite edge
colouring, :mod:`synth.synthesis.circuits`), which a list schedule's greedy circuit bookings do not
achieve: 1 GiB on dgx-a100-4node 0.781 -> 0.975 of the bound, mi250-2node 0.917 -> 0.998. Where the
LP would have more than ``ALLTOALL_VARIABLES`` columns on a switch fabric (64 ranks), every piece takes
the runtime's own route (:func:`synth.synthesis.paths.runtime_route_plans`) and the rounds alone do the
work: 8 A100 boxes behind one IB switch 0.994, where direct reaches 0.884.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from synth.collectives import Collective
from synth.errors import SynthError, TimeLimitReached
from synth.schedule import Schedule
from synth.synthesis.base import Instance, MethodSpec, SynthOptions
from synth.synthesis.packing import (
    SplitError,
    integer_fabric,
    pack_arborescences,
    split_switches,
)
from synth.synthesis.paths import LPTooLarge, plan_alltoall_paths, runtime_route_plans
from synth.synthesis.trees import Forest, PlannedTree, plan_forest, schedule_from_plans
from synth.synthesis.trees.forest import allowed_routes, draw_units
from synth.synthesis.trees.pathsched import forward_paths
from synth.topology.model import Topology

SUPPORTED = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"})
ALLTOALL_CHUNKS = (1, 2, 4, 8, 16)   # chunks per rank piece tried on the alltoall flow's paths
ALLTOALL_VARIABLES = 200_000         # sources x routed rank pairs the alltoall LP may have
ALLTOALL_JOBS = 50_000               # chunk-hops one list schedule of the alltoall may take (mi250-2node, 16
                                     # chunks: 26k; each count is scheduled 36 ways)
LP_SOLVERS = ("highs", "cbc", "pulp-highs", "glop", "pdlp")
TREE_SCALE = 48   # K: arborescences per root in the decomposition
# HiGHS solves LPs this large by interior point (+ crossover) instead of its default dual simplex:
# dgx-a100-4node (197k variables) 68 s against 248 s, mi250-2node (180k) 109 s against no solution in
# 600 s; below it simplex is 3-10x faster (dgx-a100-2node, 25k: 0.6 s against 2.4 s)
IPM_VARIABLES = 100_000
# auto runs lp only up to this many LP columns (the LP takes no work limit; HiGHS' interior point on rr4-32-s1's
# 131k columns took 175 s per solve, 762 s of CPU for an allreduce whose trees, at the same rate, won anyway)
AUTO_VARIABLES = 60_000
# under a work limit (auto gives lp 20 units) the forest LP's simplex stops after this many iterations per unit,
# a deterministic budget: the LPs of bench_fabrics and the built-ins take 0.6k-18.5k (rr3-32-s1, 98k columns, 4.6 s
# of CPU), a 4x6 torus of 100 and 25 GB/s links took 98.6k (200 s) where trees' forests were as fast
SIMPLEX_ITERATIONS_PER_WORK = 1_250


@dataclass(frozen=True)
class RateLP:
    """Optimum of the LP: ``ratio`` in fabric units (as :func:`packing.optimal_ratio`), per-root loads."""

    ratio: float
    loads: dict[int, np.ndarray]   # root -> x[r, e] per link of the (possibly reversed) topology
    status: str
    solver: str
    wall_s: float


def lp_columns(topology: Topology, roots: int) -> int:
    """Columns of :func:`build_model` for ``roots`` roots: ``x[r, e]`` and ``f[r, v, e]`` per root, and ``T``."""
    return roots * topology.num_ranks * len(topology.links) + 1


def build_model(topology: Topology, roots: tuple[int, ...], units: np.ndarray):
    """The LP of the module docstring as a :class:`synth.solvers.Model`; returns (model, T, x index)."""
    from synth.solvers import Model

    n, nodes = topology.num_ranks, topology.num_nodes
    src, dst, _, _ = topology.arrays
    m = len(src)
    model = Model("broadcast-forest-lp")
    t_var = model.add_var()
    x_index: dict[int, np.ndarray] = {}
    arange = np.arange(m)
    cap_rows, cap_cols, cap_vals = [], [], []
    for r in roots:
        x = model.add_vars(m)
        x_index[r] = x
        cap_rows.append(arange)
        cap_cols.append(x)
        cap_vals.append(np.ones(m))
        for v in range(n):
            if v == r:
                continue
            f = model.add_vars(m)
            # conservation: in - out = +1 at v, -1 at r, 0 elsewhere
            rows = np.concatenate([dst, src])
            cols = np.concatenate([f, f])
            vals = np.concatenate([np.ones(m), -np.ones(m)])
            rhs = np.zeros(nodes)
            rhs[v], rhs[r] = 1.0, -1.0
            model.add_rows(rows, cols, vals, rhs, rhs)
            # x[r,e] - f[r,v,e] >= 0
            model.add_rows(np.concatenate([arange, arange]), np.concatenate([x, f]),
                           np.concatenate([np.ones(m), -np.ones(m)]), np.zeros(m), np.full(m, np.inf))
    # Σ_r x[r,e] - B_e T <= 0
    rows = np.concatenate(cap_rows + [arange])
    cols = np.concatenate(cap_cols + [np.full(m, t_var)])
    vals = np.concatenate(cap_vals + [-units.astype(float)])
    model.add_rows(rows, cols, vals, np.full(m, -np.inf), np.zeros(m))
    model.set_objective([t_var], [1.0], "min")
    return model, t_var, x_index


def solve_rate(topology: Topology, roots: tuple[int, ...], solver: str = "highs",
               time_limit: float | None = None, threads: int | None = None,
               work_limit: float | None = None) -> RateLP:
    """Solve the LP on ``topology`` (in integer bandwidth units, see :func:`packing.integer_fabric`); under a
    ``work_limit``, HiGHS' simplex within ``SIMPLEX_ITERATIONS_PER_WORK`` iterations per unit of it."""
    from synth.solvers import solve

    if solver not in LP_SOLVERS:
        raise SynthError(f"method lp needs an LP solver; --solver must be one of {', '.join(LP_SOLVERS)}")
    fabric = integer_fabric(topology)
    model, t_var, x_index = build_model(topology, roots, fabric.units)
    algorithm = "ipm" if solver == "highs" and model.num_vars > IPM_VARIABLES else None
    iterations = (None if work_limit is None or solver != "highs"
                  else max(1, round(work_limit * SIMPLEX_ITERATIONS_PER_WORK)))
    result = solve(model, solver=solver, time_limit=time_limit, threads=threads, lp_algorithm=algorithm,
                   simplex_iterations=iterations)
    if iterations is not None and result.status == "no_solution" and "iteration" in result.message.lower():
        raise SynthError(f"method lp: its LP needs more than {iterations} simplex iterations, the budget of its "
                         f"work limit ({work_limit:g}); `-m lp` alone runs it to the end")
    if result.status not in ("optimal", "feasible") or result.values is None:
        raise SynthError(f"LP solver {solver} ended with status {result.status} {result.message}".strip())
    values = np.asarray(result.values)
    loads = {r: np.maximum(values[x], 0.0) for r, x in x_index.items()}
    return RateLP(float(values[t_var]), loads, result.status, solver, result.wall_s)


def forest_from_lp(topology: Topology, roots: tuple[int, ...], reverse: bool, solver: str,
                   time_limit: float | None, threads: int | None, scale: int = TREE_SCALE,
                   work_limit: float | None = None) -> Forest:
    """Decompose the LP's per-root loads into ``scale`` arborescences per root (module docstring)."""
    fabric_topology = topology.reversed() if reverse else topology
    lp = solve_rate(fabric_topology, roots, solver, time_limit, threads, work_limit)
    fabric = integer_fabric(fabric_topology)
    allowed = allowed_routes(topology, reverse)
    trees: list[PlannedTree] = []
    total = np.zeros(len(fabric.units))
    for r in roots:
        caps = np.ceil(lp.loads[r] * scale - 1e-6).astype(np.int64)
        total += caps
        try:
            graph = split_switches(fabric, caps, {r: 1}, scale, allowed, -1 if reverse else 1)
        except SplitError:
            # The LP may replicate at a switch (x[r, in] < x[r, out]), which no program can do: the
            # per-root loads then do not split. Fall back to the joint packing at the cut bound,
            # whose rate the LP has just confirmed.
            forest = plan_forest(topology, roots, reverse=reverse)
            return replace(forest, optimal=Fraction(lp.ratio).limit_denominator(10**6))
        pools = {key: [list(item) for item in pool] for key, pool in graph.routes.items()}
        for tree in pack_arborescences(topology.num_ranks, dict(graph.cap), {r: 1}, scale):
            routes = tuple(tuple(draw_units(pools[edge], tree.mult)) for edge in tree.edges)
            trees.append(PlannedTree(tree.root, tree.mult, tuple(tree.edges), routes))
    achieved = Fraction(float((total / (fabric.units * scale)).max())).limit_denominator(10**6)
    optimal = Fraction(lp.ratio).limit_denominator(10**6)
    return Forest(tuple(trees), scale, max(achieved, optimal), optimal, fabric.unit_GBps, reverse,
                  topology.num_ranks)


def synthesize(inst: Instance) -> Schedule:
    """LP-optimal forests, decomposed into trees and pipelined (see module docstring)."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    if collective.name not in SUPPORTED:
        raise SynthError(f"method lp does not support {collective.name}; it supports {', '.join(sorted(SUPPORTED))}")
    if topology.num_ranks == 1:
        return Schedule(collective, topology.name, (), method="lp", size_bytes=float(size_bytes))
    solver = options.solver or "highs"
    if collective.name == "alltoall":
        return _alltoall(topology, collective, size_bytes, options, solver)

    def planner(roots: tuple[int, ...], reverse: bool) -> Forest:
        return forest_from_lp(topology, roots, reverse, solver, options.time_limit, options.threads,
                              work_limit=options.work_limit)

    return schedule_from_plans(topology, collective, size_bytes, options, planner, "lp")


def _alltoall(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
              solver: str) -> Schedule:
    """The alltoall of the module docstring: the concurrent flow's paths (or, past the LP's size behind
    switches, the runtime's routes), pipelined, list-scheduled and in rounds of circuits."""
    if collective.inplace:
        raise SynthError("in-place alltoall is not supported by lp (its relays stage pieces in buffers the "
                         "in-place output overwrites); use the out-of-place form")
    try:
        candidates = plan_alltoall_paths(topology, solver, options.time_limit, ALLTOALL_VARIABLES,
                                         relay_units(options, size_bytes, collective.num_ranks))
    except LPTooLarge as exc:
        if not topology.switches:
            raise SynthError(f"method lp: {exc}; use -m greedy or -m direct") from None
        candidates = [runtime_route_plans(topology)]
    except TimeLimitReached:
        raise
    except SynthError as exc:
        raise SynthError(f"method lp: {exc}; use -m greedy or -m direct") from None
    unit_hops = max(sum(path.share * len(path.hops) for plan in plans for path in plan.paths) for plans in candidates)
    counts = tuple(c for c in ALLTOALL_CHUNKS if c == 1 or c * unit_hops <= ALLTOALL_JOBS)
    schedule = forward_paths(topology, collective, size_bytes, options, candidates, counts, method="lp",
                              priorities=("deadline", "position", "shift", "rounds"), alternatives=True)
    if schedule is None:
        raise SynthError(f"method lp: no alltoall program on the flow's paths fits MSCCL's limits on "
                         f"{topology.name}; try a smaller --chunks")
    return schedule


def relay_units(options: SynthOptions, size_bytes: float, n: int) -> float | None:
    """The scratch budget (``--max-scratch``; the buffer's size unless given) in alltoall units of ``SIZE / N``
    (what a rank relays sits in its scratch), or None without a budget."""
    budget = options.scratch_budget(size_bytes)
    return None if math.isinf(budget) else budget * n / float(size_bytes)


METHOD = MethodSpec(
    name="lp",
    run=synthesize,
    collectives=SUPPORTED,
    description="multi-commodity-flow LP: the optimal tree rate decomposed into pipelined trees; "
                "alltoall on its concurrent flow's paths",
    kind="exact",
)

"""Step/round Pareto synthesis (SCCL: Cai et al., "Synthesizing Optimal Collective Algorithms",
PPoPP'21; msccl-tools ``path_encoding.py``, ``strategies.py``), encoded for OR-Tools CP-SAT, not Z3.

**k-synchronous algorithms (SCCL).** An algorithm runs in ``S`` synchronous *steps*. Every
rank's piece is split into ``C`` chunks. Step ``s`` lasts ``r_s >= 1`` *rounds*, and ``R = Σ r_s``.
In one round a link of relative bandwidth ``b`` carries ``b`` chunks. Under the α-β model a step
costs ``α + r_s · chunk_bytes / bw_unit``, so an algorithm costs ``S·α + (R/C) · piece_bytes / bw_unit``:
``S`` is its latency cost and ``R/C`` its bandwidth cost. An algorithm is Pareto-optimal when no other
one has both ``S' <= S`` and ``R'/C' <= R/C`` with one of them strict.

**Encoding (msccl-tools ``path_encoding.py``), for one instance (C, S, R).** For a chunk
``c`` and a rank ``n``, SCCL's integer ``time[c,n]`` is the step after which ``n`` first holds ``c``
(0 at sources). We write it in order/one-hot form, which CP-SAT propagates well:
``recv[c,n,s]`` (``n`` first gets ``c`` in step ``s``), so ``time[c,n] = Σ_s s·recv[c,n,s]``, and
``snd[c,j,s]`` for a send of ``c`` over the (virtual) link ``j = u -> n`` in step ``s``.

- post: ``Σ_s recv[c,n,s] = 1`` for every destination ``n`` of ``c`` (so ``time[c,n] <= S``); other
  ranks receive ``c`` at most once;
- a rank receives ``c`` from exactly one sender: ``Σ_{j into n} snd[c,j,s] = recv[c,n,s]``;
- a chunk sent in step ``s`` is held before ``s``: ``snd[c,u->n,s] <= Σ_{s'<s} recv[c,u,s']`` (true at
  sources, where ``time = 0``);
- rounds: ``1 <= r_s``, ``Σ_s r_s = R``;
- bandwidth: for every physical link ``e`` and step ``s``,
  ``Σ_{c, j routed over e} snd[c,j,s] <= b_e · r_s``.

``b_e`` is link ``e``'s bandwidth in units of ``bw_unit`` (the largest bandwidth that divides them
all: on DGX-1, 25 GB/s, so ``b_e`` is the NVLink count 1 or 2 of the msccl-tools link matrix). Ranks
without a direct link talk over a fixed switch route (:func:`direct_first_links`),
and that route uses every physical link on it. On a switch fabric this gives SCCL's switch constraints:
on DGX-2 each GPU's link to the NVSwitch has ``b = 1``, so a GPU sends at most one chunk and receives at
most one chunk per round through the switch (as msccl-tools' ``hub_and_spoke`` per-node switch limits).

Pruning (valid for every solution, not heuristics): ``recv[c,n,s] = 0`` for ``s`` below the hop
distance from ``c``'s sources to ``n``; a rank that is not a destination of ``c`` receives it only if it can
still forward it to a destination in time; the ``C`` interchangeable chunks of one piece arrive in
non-decreasing order at one fixed rank (symmetry breaking: any solution can be relabelled so).

**Combining collectives (SCCL's non-combining dual, msccl-tools ``ncd_reduction.py``).**
ReduceScatter and Reduce are solved as their non-combining dual
(broadcast of each output chunk from its owner) on the reversed topology. The dual's sends are
inverted: a copy ``u -> v`` in dual step ``s`` becomes a reducing send ``v -> u`` in step ``S+1-s``.

**Allreduce** has no dual (every rank is a root of every address), and two encodings are searched, their
points reported in SCCL's units for allreduce: **C = chunks of the whole buffer** (SCCL's addresses, SIZE/C
bytes each; msccl-tools' ``allreduce`` collective chunked up C times), S steps, R rounds of one such chunk per
``b_e`` of link.

- *direct combining* (:mod:`synth.synthesis.combining`, SCCL's combining encoding): partial sums move and
  combine; a point is its (C, S, R) as solved.
- *composed*: a ReduceScatter followed by an Allgather, each solved with the same per-phase instance
  (c chunks per reduce-scatter owner, s steps, r rounds). Its buffer has C = N·c chunks of the same size as
  the phases' chunks, so the point is (N·c, 2s, 2r) and its R/C is 2r/(N·c). (synth before issue 35 printed
  (c, 2s, 2r): R/C N times too large against SCCL's.)

The two are merged into one frontier and pruned together. ``--chunks C`` for allreduce counts buffer chunks:
the combining encoding uses C, the composed one c = C/N where N divides C. The step and rounds-per-chunk lower
bounds printed for allreduce are the ones that hold for both: the fabric's diameter (every contribution
reaches every rank) and :func:`cut_rounds_per_chunk` of allreduce (synth's allreduce bandwidth bound in
round units).

**Frontier (msccl-tools ``strategies.solve_all_latency_bandwidth_tradeoffs``).** Lower bounds first:
``S >= S_lb`` (the largest hop distance from a chunk's sources to a destination) and ``R/C >= ρ``,
where ρ is the larger of SCCL's flow LP (:func:`rounds_per_chunk_lower_bound`) and the exact
bandwidth bound of :mod:`synth.lower_bounds` in round units (:func:`cut_rounds_per_chunk`). For DGX-1
Allgather these are 2 steps and 7/6, as in SCCL.
Then for ``C = 1, 2, ...`` and ``R = ⌈ρ·C⌉, ...`` with ``gcd(C, R) = 1`` (other
fractions were tried with fewer chunks), the least ``S`` in ``S_lb..min(R, max_steps)`` that is
feasible is found. (SCCL skips a fraction with ``gcd(C, R) = g > 1`` outright; since ``r_s >= 1`` forces
``S <= R``, the reduced instance never tried ``S > R/g``, so we try those step counts.)
A chunk count stops when one ``S`` is feasible; the search stops when ``R/C = ρ``
(bandwidth-optimal). Candidates already dominated by a found algorithm are skipped (exact). With
``assume_monotonic`` (SCCL's ``--assume-monotonic-feasibility``) an S that was infeasible at a ratio
is not tried at any smaller ratio again. Finally the found algorithms are pruned to the Pareto set.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule, Transfer
from synth.solvers import deterministic_search
from synth.synthesis import combining
from synth.synthesis.base import Instance, MethodSpec
from synth.synthesis.greedy import (
    CopyProblem,
    allreduce_owners,
    copy_problem,
)
from synth.synthesis.steps import (
    Algorithm,
    Fabric,
    fabric,
    step_duration,
    step_terms,
)
from synth.topology.model import Topology

COLLECTIVES = frozenset({"allgather", "alltoall", "broadcast", "gather", "scatter",
                         "reducescatter", "reduce", "allreduce"})
DEFAULT_MAX_STEPS = 8
DEFAULT_MAX_CHUNKS = 8
DEFAULT_TIME_LIMIT = 120.0    # CP-SAT deterministic time for the whole search (about seconds)
LP_ITERATIONS_PER_WORK_S = 20_000   # simplex iterations per unit of the rounds bound's budget


def _phys_users(fab: Fabric) -> list[list[int]]:
    """physical link -> the virtual links routed over it."""
    users: list[list[int]] = [[] for _ in range(fab.vl.num_phys)]
    for j, row in enumerate(fab.vl.phys):
        for e in row:
            if e >= 0:
                users[int(e)].append(j)
    return users


# ---- lower bounds ---------------------------------------------------------------------------------
def steps_lower_bound(fab: Fabric, problem: CopyProblem) -> int:
    """SCCL (msccl-tools ``steps_bound.py``): S >= max over chunks c and destinations d of the hop
    distance from c's sources to d."""
    best = 0
    for src, dst in zip(problem.sources, problem.dests):
        if dst:
            best = max(best, int(fab.dist[np.ix_(list(src), list(dst))].min(axis=0).max()))
    return best


def rounds_per_chunk_lower_bound(fab: Fabric, problem: CopyProblem, time_limit: float | None = None) -> Fraction:
    """SCCL's rounds-per-chunk bound (msccl-tools ``rounds_bound.py``), an LP solved with HiGHS:
    min ρ s.t. flows ``0 <= f[c,j] <= 1``; a destination receives ``Σ_{j into v} f[c,j] = 1``; a rank that is
    not a source of ``c`` sends on each out-link at most what it received; ``Σ_{c, j over e} f[c,j] <= b_e·ρ``.
    For a chunk with one destination (gather, scatter, alltoall, reductions' duals are not) a path is
    enough, so we require ``Σ out <= Σ in`` at relays and nothing out of the destination: tighter than
    SCCL's per-link rule, and still a lower bound.
    Returned as a fraction never above the LP value (so it stays a valid bound); 0 (no bound) where
    HiGHS does not finish within ``time_limit`` units of work, ``LP_ITERATIONS_PER_WORK_S`` simplex
    iterations each, so the bound never depends on the machine's speed (alltoall on 27 ranks: 702 chunks,
    over 3 minutes)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    vl = fab.vl
    nc, nv, n = problem.num_chunks, vl.count, problem.num_ranks
    if nc == 0 or not any(problem.dests):
        return Fraction(0)
    into = [np.flatnonzero(vl.dst == v) for v in range(n)]
    out = [np.flatnonzero(vl.src == u) for u in range(n)]
    rho = nc * nv
    rows_ub, cols_ub, vals_ub, rhs_ub = [], [], [], []
    rows_eq, cols_eq, vals_eq = [], [], []
    r_ub = r_eq = 0
    ub = np.ones(nc * nv + 1)
    ub[-1] = np.inf
    for c in range(nc):
        base = c * nv
        srcs = set(problem.sources[c])
        for s in srcs:
            ub[base + into[s]] = 0.0          # a source never needs its own chunk
        for v in problem.dests[c]:
            rows_eq += [r_eq] * len(into[v])
            cols_eq += (base + into[v]).tolist()
            vals_eq += [1.0] * len(into[v])
            r_eq += 1
        single = len(problem.dests[c]) == 1
        if single:
            ub[base + out[problem.dests[c][0]]] = 0.0     # a path ends at its destination
        for u in range(n):
            if u in srcs:
                continue
            # one destination: a path suffices, so flow is conserved (tighter than SCCL, still valid)
            for outs in ([out[u]] if single else [[j] for j in out[u]]):
                rows_ub += [r_ub] * (len(outs) + len(into[u]))
                cols_ub += [base + int(j) for j in outs] + (base + into[u]).tolist()
                vals_ub += [1.0] * len(outs) + [-1.0] * len(into[u])
                rhs_ub.append(0.0)
                r_ub += 1
    for e, users in enumerate(_phys_users(fab)):
        if not users:
            continue
        for c in range(nc):
            rows_ub += [r_ub] * len(users)
            cols_ub += [c * nv + j for j in users]
            vals_ub += [1.0] * len(users)
        rows_ub.append(r_ub)
        cols_ub.append(rho)
        vals_ub.append(-float(fab.mult[e]))
        rhs_ub.append(0.0)
        r_ub += 1
    nvar = nc * nv + 1
    cost = np.zeros(nvar)
    cost[-1] = 1.0
    a_ub = coo_matrix((vals_ub, (rows_ub, cols_ub)), shape=(r_ub, nvar)).tocsr()
    a_eq = coo_matrix((vals_eq, (rows_eq, cols_eq)), shape=(r_eq, nvar)).tocsr()
    work = {} if time_limit is None else {"maxiter": max(1, round(time_limit * LP_ITERATIONS_PER_WORK_S))}
    res = linprog(cost, A_ub=a_ub, b_ub=np.asarray(rhs_ub), A_eq=a_eq, b_eq=np.ones(r_eq),
                  bounds=np.column_stack([np.zeros(nvar), ub]), method="highs", options=work)
    if res.status == 1:   # iteration limit: an unfinished LP bounds nothing
        return Fraction(0)
    if res.status != 0:
        raise SynthError(f"pareto: the rounds lower-bound LP failed ({res.message})")
    value = float(res.fun)
    frac = Fraction(value).limit_denominator(1000)
    if float(frac) > value + 1e-7:       # keep it a lower bound
        frac = Fraction(math.floor(value * 1000 + 1e-6), 1000)
    return frac


def cut_rounds_per_chunk(topology: Topology, name: str, root: int, unit_GBps: float) -> Fraction:
    """R/C lower bound from the exact α-free bandwidth bound of :func:`synth.lower_bounds.compute_bounds`
    (ForestColl cut for allgather/reducescatter, rooted max-flow, alltoall concurrent-flow LP).

    A k-synchronous algorithm moves at most ``b_e·r_s`` chunks over link ``e`` in a step that lasts
    ``r_s·chunk/bw_unit``, so its bandwidth time ``R·chunk/bw_unit`` is at least that bound: with C = 1,
    ``ρ = bound_us · bw_unit / chunk_bytes``. SCCL's LP lets ranks justify each other's copies (a
    circulation), which behind a bottleneck can be far too low (two DGX-1 boxes on one NIC: 15/13
    rounds per chunk instead of 8); this bound has no such hole. The fraction returned never exceeds
    the float value by more than 1e-9 (relative)."""
    from synth.lower_bounds import compute_bounds

    coll = Collective(name, topology.num_ranks, 1, root=root)
    size = float(1 << 30)
    bounds = compute_bounds(topology, coll, size)
    bound = bounds.details.get("cut_bound_us", bounds.bandwidth_bound_us)   # bytes only: rounds carry no α
    value = bound * unit_GBps * 1e3 / coll.chunk_bytes(size)
    frac = Fraction(value).limit_denominator(1000)
    if float(frac) > value * (1 + 1e-9):
        frac = Fraction(math.floor(value * 1000), 1000)
    return frac


# ---- one instance --------------------------------------------------------------------------------
def chunked_problem(problem: CopyProblem, chunks: int, chunk_ids: tuple[int, ...] | None = None) -> CopyProblem:
    """Split every chunk of a C = 1 copy problem into ``chunks`` interchangeable chunks (chunk i*C + k)."""
    sources = tuple(s for s in problem.sources for _ in range(chunks))
    dests = tuple(d for d in problem.dests for _ in range(chunks))
    ids = chunk_ids if chunk_ids is not None else tuple(range(len(sources)))
    return CopyProblem(problem.num_ranks, sources, dests, ids)


def solve_instance(fab: Fabric, problem: CopyProblem, steps: int, rounds: int, *, groups: int = 1,
                   time_limit: float | None = None, threads: int | None = None,
                   seed: int = 0, work: list[float] | None = None) -> tuple[str, Algorithm | None]:
    """Decide one SCCL instance with CP-SAT (see the module docstring for the encoding).

    ``time_limit`` is CP-SAT deterministic time on a fixed worker count (synth.solvers.deterministic_search),
    so the answer never depends on the machine's speed; the deterministic time spent is appended to ``work``.

    ``groups``: consecutive runs of ``groups`` chunks with equal sources and destinations are
    interchangeable (symmetry breaking). Returns ("sat" | "unsat" | "unknown", algorithm or None)."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    if rounds < steps:
        return "unsat", None
    vl, dist, n = fab.vl, fab.dist, problem.num_ranks
    into = [np.flatnonzero(vl.dst == v).tolist() for v in range(n)]
    model = cp_model.CpModel()
    r = [model.new_int_var(1, rounds - steps + 1, f"r{s}") for s in range(1, steps + 1)]
    model.add(sum(r) == rounds)
    recv: dict[tuple[int, int], dict[int, object]] = {}
    snd: dict[tuple[int, int], list] = {}          # (chunk, step) -> [(vlink, var)]
    for c in range(problem.num_chunks):
        srcs = list(problem.sources[c])
        dsts = set(problem.dests[c])
        if not dsts:
            continue
        near = dist[srcs].min(axis=0)                       # hops from the sources
        to_dest = dist[:, sorted(dsts)].min(axis=1)         # hops to the nearest destination
        for v in range(n):
            if v in srcs:
                continue
            first = int(near[v])
            last = steps if v in dsts else steps - int(to_dest[v])
            if v in dsts and first > steps:
                return "unsat", None
            recv[(c, v)] = {s: model.new_bool_var(f"g{c}_{v}_{s}") for s in range(first, last + 1)}
        for v in range(n):
            slots = recv.get((c, v))
            if slots is None:
                continue
            if v in dsts:
                model.add_exactly_one(slots.values())
            elif slots:
                model.add_at_most_one(slots.values())
            for s, got in slots.items():
                senders = []
                for j in into[v]:
                    u = int(vl.src[j])
                    if u in srcs:
                        held = None
                    else:
                        before = [x for t, x in recv.get((c, u), {}).items() if t < s]
                        if not before:
                            continue
                        held = before
                    x = model.new_bool_var(f"x{c}_{j}_{s}")
                    senders.append(x)
                    snd.setdefault((c, s), []).append((j, x))
                    if held is not None:
                        model.add(x <= sum(held))
                model.add(sum(senders) == got)
    # bandwidth: per physical link and step
    on_link: dict[tuple[int, int], list] = {}
    for (_c, s), pairs in snd.items():
        for j, x in pairs:
            for e in vl.phys[j]:
                if e >= 0:
                    on_link.setdefault((int(e), s), []).append(x)
    for (e, s), xs in on_link.items():
        b = int(fab.mult[e])
        if len(xs) > b:
            model.add(sum(xs) <= b * r[s - 1])
    # symmetry: interchangeable chunks (same sources and destinations) arrive in order at one rank
    if groups > 1:
        for base in range(0, problem.num_chunks, groups):
            block = [c for c in range(base, min(base + groups, problem.num_chunks))
                     if problem.sources[c] == problem.sources[base] and problem.dests[c] == problem.dests[base]]
            ref = next((v for v in sorted(problem.dests[base]) if (base, v) in recv), None)
            if ref is None or len(block) < 2:
                continue
            times = [sum(s * x for s, x in recv[(c, ref)].items()) for c in block]
            for a, b in zip(times, times[1:]):
                model.add(a <= b)
    solver = cp_model.CpSolver()
    deterministic_search(solver.parameters, None, time_limit, threads)
    solver.parameters.random_seed = int(seed)
    status = solver.solve(model)
    elapsed = time.perf_counter() - t0
    if work is not None:
        work.append(solver.deterministic_time)
    if status == cp_model.INFEASIBLE:
        return "unsat", None
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "unknown", None
    sends = sorted((s, c, j) for (c, s), pairs in snd.items() for j, x in pairs if solver.boolean_value(x))
    rps = tuple(int(solver.value(x)) for x in r)
    algo = Algorithm(groups, steps, rounds, rps, tuple(sends), elapsed)
    check_algorithm(fab, problem, algo)
    return "sat", algo


def check_algorithm(fab: Fabric, problem: CopyProblem, algo: Algorithm) -> None:
    """Independent replay of a solved instance (held-before-send, postcondition, bandwidth, rounds)."""
    vl = fab.vl
    holds = [set(s) for s in problem.sources]
    load: dict[tuple[int, int], int] = {}
    if sum(algo.rounds_per_step) != algo.rounds or min(algo.rounds_per_step, default=1) < 1:
        raise SynthError("internal: pareto rounds do not add up")
    for step in range(1, algo.steps + 1):
        arrived = []
        for s, c, j in algo.sends:
            if s != step:
                continue
            if int(vl.src[j]) not in holds[c]:
                raise SynthError(f"internal: pareto sends chunk {c} from rank {int(vl.src[j])} before it holds it")
            arrived.append((c, int(vl.dst[j])))
            for e in vl.phys[j]:
                if e >= 0:
                    load[(int(e), step)] = load.get((int(e), step), 0) + 1
        for c, v in arrived:
            holds[c].add(v)
    for (e, step), k in load.items():
        if k > int(fab.mult[e]) * algo.rounds_per_step[step - 1]:
            raise SynthError(f"internal: pareto overloads link {e} in step {step}")
    for c, dests in enumerate(problem.dests):
        if not set(dests) <= holds[c]:
            raise SynthError(f"internal: pareto leaves chunk {c} short of a destination")


def algorithm_from_steps(fab: Fabric, problem: CopyProblem, steps: list[tuple[int, list[tuple[int, int, int]]]],
                         chunks: int = 1) -> Algorithm:
    """An algorithm given SCCL-style, as ``[(rounds, [(chunk, src, dst), ...]) per step]`` (msccl-tools'
    ``Algorithm.steps``), checked against this encoding's constraints (:func:`check_algorithm`)."""
    index = {(int(u), int(v)): j for j, (u, v) in enumerate(zip(fab.vl.src, fab.vl.dst))}
    sends = []
    for s, (_rounds, step_sends) in enumerate(steps, start=1):
        for c, u, v in step_sends:
            if (u, v) not in index:
                raise SynthError(f"step {s} sends chunk {c} over {u} -> {v}, which is not a link")
            sends.append((s, c, index[(u, v)]))
    rps = tuple(int(r) for r, _ in steps)
    algo = Algorithm(chunks, len(steps), sum(rps), rps, tuple(sorted(sends)), 0.0)
    check_algorithm(fab, problem, algo)
    return algo


# ---- collectives -> copy problems --------------------------------------------------------------------
def sccl_point(collective: Collective, key: tuple[int, int, int], phases: int) -> tuple[int, int, int]:
    """A per-phase (c, s, r) in SCCL's units for the collective (module docstring): allreduce's composed
    instance is (N·c, 2s, 2r) (c chunks per reduce-scatter owner, N·c of the buffer); others are unchanged."""
    c, s, r = key
    if collective.name == "allreduce" and phases == 2:
        return collective.num_ranks * c, 2 * s, 2 * r
    return c, phases * s, phases * r


def _base_collective(collective: Collective, chunks: int) -> Collective:
    c = chunks * collective.num_ranks if collective.name == "allreduce" else chunks
    return Collective(collective.name, collective.num_ranks, c, collective.root, collective.inplace)


def plan_for(collective: Collective, chunks: int) -> tuple[Collective, list[tuple[CopyProblem, bool]]]:
    """The collective with ``chunks`` chunks per piece and its copy phases (problem, on reversed graph?).

    Chunks of one piece are consecutive problem chunks, so they form the symmetry groups."""
    coll = _base_collective(collective, chunks)
    if coll.name == "allreduce":
        problem = allreduce_owners(coll)
        order = sorted(range(problem.num_chunks), key=lambda k: (problem.sources[k], k))
        problem = CopyProblem(problem.num_ranks, tuple(problem.sources[k] for k in order),
                              tuple(problem.dests[k] for k in order), tuple(problem.chunk_ids[k] for k in order))
        return coll, [(problem, True), (problem, False)]
    problem, reverse = copy_problem(coll)
    return coll, [(problem, reverse)]


# ---- the frontier -----------------------------------------------------------------------------------
class ParetoPoint(NamedTuple):
    chunks: int
    steps: int
    rounds: int
    synthesis_s: float
    schedule: Schedule

    @property
    def bandwidth_cost(self) -> Fraction:
        """R/C in SCCL's units (rounds per chunk)."""
        return Fraction(self.rounds, self.chunks)


@dataclass
class Exploration:
    """Everything the frontier search did: bounds, every instance tried, the Pareto points."""

    topology: str
    collective: str
    steps_lb: int
    rounds_per_chunk_lb: Fraction
    unit_GBps: float
    exact_units: bool
    tried: list[dict] = field(default_factory=list)
    points: list[ParetoPoint] = field(default_factory=list)
    bandwidth_optimal: bool = False
    total_s: float = 0.0
    stopped: str = ""
    undecided: int = 0            # instances that hit the per-instance time limit


def _dominated(found: list[tuple[int, int, int]], steps: int, rpc: Fraction) -> bool:
    return any(s <= steps and Fraction(r, c) <= rpc for c, s, r in found)


def _solve_collective(fab: Fabric, rfab: Fabric | None, collective: Collective, chunks: int, steps: int,
                      rounds: int, time_limit: float | None, threads: int | None,
                      seed: int, work: list[float] | None = None
                      ) -> tuple[str, list[Algorithm], Collective, list[tuple[CopyProblem, bool]]]:
    """Solve every phase of ``collective`` at per-phase (C, S, R); allreduce needs both phases feasible."""
    coll, phases = plan_for(collective, chunks)
    algos = []
    work = [] if work is None else work
    start = sum(work)
    for problem, reverse in phases:
        left = None if time_limit is None else max(0.01, time_limit - (sum(work) - start))
        f = rfab if reverse else fab
        assert f is not None
        status, algo = solve_instance(f, problem, steps, rounds, groups=chunks,
                                      time_limit=left, threads=threads, seed=seed, work=work)
        if status != "sat":
            return status, [], coll, phases
        algos.append(algo)
    return "sat", algos, coll, phases


def explore(topology: Topology, collective: Collective | str, *, max_steps: int | None = None,
            max_chunks: int = DEFAULT_MAX_CHUNKS, time_limit: float | None = DEFAULT_TIME_LIMIT,
            size_bytes: float = float(1 << 30), assume_monotonic: bool = False, threads: int | None = None,
            seed: int = 0, chunk_counts: list[int] | None = None, exhaustive: bool = False,
            instance_time_limit: float | None = None) -> Exploration:
    """SCCL's latency-bandwidth trade-off search (see the module docstring).

    ``time_limit`` is the budget for the whole search in CP-SAT deterministic time (about seconds on an
    idle machine; never the wall clock, so the frontier does not depend on the machine); one instance gets at most
    ``instance_time_limit`` (default a quarter of the budget): an instance still undecided then is
    logged ``unknown`` and treated as not found (the search goes on). ``max_steps`` defaults to
    ``max(8, S_lb + 4)`` steps per phase. Schedules of the Pareto points are timed at
    ``size_bytes``. ``chunk_counts`` restricts the chunk counts tried (default ``1..max_chunks``; for allreduce they
    count buffer chunks, SCCL's C, see the module docstring).
    ``exhaustive`` adds a second pass (:func:`_complete`) that makes the frontier exact for
    ``C <= max_chunks`` and ``S <= max_steps``; SCCL's search alone can miss a point."""
    t_start = time.perf_counter()
    if isinstance(collective, str):
        collective = Collective(collective, topology.num_ranks)
    if collective.num_ranks != topology.num_ranks:
        raise SynthError(f"collective has {collective.num_ranks} ranks but topology {topology.name} has "
                         f"{topology.num_ranks}")
    if collective.name not in COLLECTIVES:
        raise SynthError(f"pareto does not support {collective.name}")
    if (max_steps is not None and max_steps < 1) or max_chunks < 1:
        raise SynthError("pareto needs max steps >= 1 and max chunks >= 1")
    if time_limit is not None and time_limit <= 0:
        raise SynthError(f"time limit must be positive, got {time_limit}")
    fab = fabric(topology)
    _, phases = plan_for(collective, 1)
    rfab = fabric(topology.reversed()) if any(rev for _, rev in phases) else None
    # Allreduce runs two phases of the same per-phase (C, S, R): it is reported as (C, 2S, 2R).
    scale = len(phases)
    steps_lb, rpc_lb = 1, Fraction(0)
    for problem, rev in phases:
        f = rfab if rev else fab
        assert f is not None
        steps_lb = max(steps_lb, steps_lower_bound(f, problem))
        # the bound only prunes the search: it gets a quarter of the budget, like one instance
        rpc_lb = max(rpc_lb, rounds_per_chunk_lower_bound(f, problem, None if time_limit is None else time_limit / 4))
    for name in (("reducescatter", "allgather") if collective.name == "allreduce" else (collective.name,)):
        rpc_lb = max(rpc_lb, cut_rounds_per_chunk(topology, name, collective.root, fab.unit_GBps))
    allreduce = collective.name == "allreduce"
    exp = Exploration(topology.name, collective.name, scale * steps_lb, scale * rpc_lb, fab.unit_GBps, fab.exact)
    user_max_steps = max_steps
    phase_max_steps = max_steps // scale if max_steps is not None else max(DEFAULT_MAX_STEPS, steps_lb + 4)
    max_steps = scale * phase_max_steps if max_steps is None else max_steps
    per_instance = instance_time_limit if instance_time_limit is not None else (
        None if time_limit is None else time_limit / 4)
    found: list[tuple[int, int, int]] = []          # per-phase (C, S, R)
    algos: dict[tuple[int, int, int], tuple[list[Algorithm], Collective, list, float]] = {}
    step_rpc_lb: dict[int, Fraction] = {}

    work: list[float] = []    # deterministic time of every CP-SAT solve so far

    def left() -> float | None:
        return None if time_limit is None else time_limit - sum(work)

    combined: list = []
    composed_counts = chunk_counts
    if allreduce:
        # SCCL's units (module docstring): chunk counts are buffer chunks; the composed search takes C/N per owner
        exp.steps_lb = min(exp.steps_lb, combining_steps_lb(fab))
        exp.rounds_per_chunk_lb = cut_rounds_per_chunk(topology, "allreduce", 0, fab.unit_GBps)
        combined = _combining_points(topology, fab, chunk_counts or list(range(1, max_chunks + 1)), user_max_steps,
                                     None if time_limit is None else time_limit / 4, threads, seed, work, exp)
        n = collective.num_ranks
        if chunk_counts is not None:
            composed_counts = [c // n for c in chunk_counts if c % n == 0]
            if not composed_counts:
                exp.stopped = f"no chunk count divisible by the {n} ranks for reduce-scatter + allgather"
    if steps_lb > phase_max_steps and not exp.stopped:
        exp.stopped = f"every algorithm needs at least {scale * steps_lb} steps (> max steps {max_steps})"
    for chunks in ([] if exp.stopped else (composed_counts or range(1, max_chunks + 1))):
        rounds = max(math.ceil(rpc_lb * chunks), steps_lb)
        done = False
        while not done and not exp.stopped:
            rpc = Fraction(rounds, chunks)
            # The ratio R/C was tried with C/g chunks, but only for S <= R/g (R >= S): try the rest.
            g = math.gcd(chunks, rounds) if chunk_counts is None else 1
            first = max(steps_lb, rounds // g + 1) if g > 1 else steps_lb
            if _dominated(found, steps_lb, rpc):
                break                          # every larger R or S is dominated too
            for steps in range(first, min(rounds, phase_max_steps) + 1):
                if _dominated(found, steps, rpc):
                    break
                if assume_monotonic and rpc < step_rpc_lb.get(steps, Fraction(0)):
                    continue
                remaining = left()
                if remaining is not None and remaining <= 0:
                    exp.stopped = "time limit"
                    break
                t0 = time.perf_counter()
                cap = remaining if per_instance is None else min(per_instance, remaining or per_instance)
                status, phase_algos, coll, phs = _solve_collective(
                    fab, rfab, collective, chunks, steps, rounds, cap, threads, seed, work)
                took = time.perf_counter() - t0
                exp.tried.append({"chunks": chunks, "steps": scale * steps, "rounds": scale * rounds,
                                  "status": status, "solve_s": round(took, 3)})
                if allreduce:
                    exp.tried[-1]["encoding"] = "composed"   # chunks per owner until the end of the search
                if status == "sat":
                    found.append((chunks, steps, rounds))
                    algos[(chunks, steps, rounds)] = (phase_algos, coll, phs, took)
                    done = True
                    break
                if status == "unsat":
                    step_rpc_lb[steps] = max(step_rpc_lb.get(steps, Fraction(0)), rpc)
                elif (left() or 1.0) <= 0:
                    exp.stopped = "time limit"
                    break
                else:
                    exp.undecided += 1
            rounds += 1
        if exp.stopped:
            break
        if done and Fraction(found[-1][2], found[-1][0]) <= rpc_lb:
            exp.bandwidth_optimal = True
            exp.stopped = ("bandwidth-optimal algorithm found" if not allreduce
                           else "reduce-scatter + allgather at their bandwidth bound")
            break
    if not exp.stopped:
        exp.stopped = f"reached max chunks {max_chunks}"
    if exhaustive and exp.stopped != "time limit" and chunk_counts is None:
        _complete(exp, found, algos, fab, rfab, collective, steps_lb, rpc_lb, phase_max_steps, max_chunks,
                  scale, left, threads, seed, per_instance, work)
    # every candidate in the collective's SCCL units: (C, S, R) -> how to build its schedule
    makers: dict[tuple[int, int, int], tuple[float, object]] = {}
    for key in found:
        unit_key = sccl_point(collective, key, scale)
        makers.setdefault(unit_key, (algos[key][3], lambda k=unit_key, a=algos[key]: to_schedule(
            topology, fab, rfab, a[1], a[2], a[0], size_bytes, k)))
    for algo in combined:
        unit_key = (algo.chunks, algo.steps, algo.rounds)
        makers.setdefault(unit_key, (algo.solve_s, lambda a=algo: combining.to_schedule(
            topology, fab, collective, a, size_bytes, "pareto")))
    for key in prune_pareto(list(makers)):
        took, make = makers[key]
        exp.points.append(ParetoPoint(*key, took, make()))
    exp.points.sort(key=lambda p: (p.steps, p.bandwidth_cost))
    if allreduce:
        for t in exp.tried:
            if t.get("encoding") == "composed":
                t["chunks"] *= collective.num_ranks
        exp.bandwidth_optimal = any(p.bandwidth_cost <= exp.rounds_per_chunk_lb for p in exp.points)
    exp.total_s = time.perf_counter() - t_start
    return exp


def combining_steps_lb(fab: Fabric) -> int:
    """Least steps of a combining allreduce: the diameter (:func:`synth.synthesis.combining.steps_lower_bound`)."""
    return combining.steps_lower_bound(fab.dist)


def _combining_points(topology: Topology, fab: Fabric, chunk_counts: list[int], max_steps: int | None,
                      budget: float | None, threads: int | None, seed: int, work: list[float],
                      exp: Exploration) -> list:
    """Allreduce's direct combining instances (:func:`synth.synthesis.combining.search`, least R per (C, S)),
    within ``budget`` deterministic time charged to ``work``; logged in ``exp.tried``."""
    res = combining.search(topology, chunk_counts=tuple(chunk_counts), max_steps=max_steps, work_limit=budget,
                           threads=threads, seed=seed, fab=fab)
    work.append(res.work_s)
    for t in res.tried:
        exp.tried.append({**t, "encoding": "combining"})
        if t["status"] not in ("sat", "unsat", "too large", "budget spent"):
            exp.undecided += 1
    return res.found


def _complete(exp: Exploration, found: list[tuple[int, int, int]], algos: dict, fab: Fabric, rfab: Fabric | None,
              collective: Collective, steps_lb: int, rpc_lb: Fraction, max_steps: int, max_chunks: int, scale: int,
              left, threads: int | None, seed: int, per_instance: float | None, work: list[float]) -> None:
    """Second pass: for each S up to the largest S found, try every ratio R/C (C <= max_chunks, R >= S)
    below the best ratio found with at most S steps, smallest first; the first feasible one is the
    least bandwidth cost for S. SCCL stops a chunk count at its least R, so it never tries e.g. a
    larger R with fewer steps at that C, which can be Pareto-optimal."""
    tried = {(t["chunks"], t["steps"] // scale, t["rounds"] // scale) for t in exp.tried
             if t.get("encoding") != "combining"}
    top = min(max_steps, max((s for _, s, _ in found), default=0))
    for steps in range(steps_lb, top + 1):
        best = min((Fraction(r, c) for c, s, r in found if s <= steps), default=None)
        if best is None:
            continue
        cands = sorted({(Fraction(r, c), c, r) for c in range(1, max_chunks + 1)
                        for r in range(max(steps, math.ceil(rpc_lb * c)), math.ceil(best * c) + 1)
                        if Fraction(r, c) < best})
        for _rpc, c, r in cands:
            if (c, steps, r) in tried or _dominated(found, steps, Fraction(r, c)):
                continue
            remaining = left()
            if remaining is not None and remaining <= 0:
                exp.stopped = "time limit"
                return
            t0 = time.perf_counter()
            cap = remaining if per_instance is None else min(per_instance, remaining or per_instance)
            status, phase_algos, coll, phs = _solve_collective(fab, rfab, collective, c, steps, r, cap,
                                                               threads, seed, work)
            took = time.perf_counter() - t0
            tried.add((c, steps, r))
            exp.tried.append({"chunks": c, "steps": scale * steps, "rounds": scale * r, "status": status,
                              "solve_s": round(took, 3), "pass": "exhaustive"})
            if collective.name == "allreduce":
                exp.tried[-1]["encoding"] = "composed"
            if status == "sat":
                found.append((c, steps, r))
                algos[(c, steps, r)] = (phase_algos, coll, phs, took)
                break
            if status != "unsat":
                exp.undecided += 1
                if (left() or 1.0) <= 0:
                    exp.stopped = "time limit"
                    return


def prune_pareto(found: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Keep (C, S, R) not dominated in (S, R/C) (msccl-tools ``prune_pareto_optimal``)."""
    out = []
    for c, s, r in found:
        rpc = Fraction(r, c)
        if not any((s2 <= s and Fraction(r2, c2) <= rpc) and (s2 < s or Fraction(r2, c2) < rpc)
                   for c2, s2, r2 in found):
            out.append((c, s, r))
    return out


def pareto_frontier(topology: Topology, collective_name: str | Collective, max_steps: int = DEFAULT_MAX_STEPS,
                    max_chunks: int = DEFAULT_MAX_CHUNKS, time_limit: float | None = DEFAULT_TIME_LIMIT,
                    **kwargs) -> list[ParetoPoint]:
    """The Pareto-optimal (chunks, steps, rounds, synthesis_s, schedule) points, fewest steps first."""
    return explore(topology, collective_name, max_steps=max_steps, max_chunks=max_chunks,
                   time_limit=time_limit, **kwargs).points


# ---- schedules --------------------------------------------------------------------------------------
def predicted_time_us(point: ParetoPoint, size_bytes: float) -> float:
    """The point's α-β time at ``size_bytes`` (:func:`step_terms`, summed over steps)."""
    cb = point.schedule.collective.chunk_bytes(size_bytes)
    return float(sum(step_duration(t, cb) for t in point.schedule.notes["step_terms"]))


def to_schedule(topology: Topology, fab: Fabric, rfab: Fabric | None, coll: Collective,
                phases: list[tuple[CopyProblem, bool]], algos: list[Algorithm], size_bytes: float,
                key: tuple[int, int, int]) -> Schedule:
    """Transfers of each step at [T_s, T_s + d_s]; reversed phases are inverted in time and direction
    (reducing sends); ``group`` = global step, so a step's chunks on one link may merge into one send."""
    cb = coll.chunk_bytes(size_bytes)
    transfers: list[Transfer] = []
    offset = 0.0
    step_base = 0
    step_terms_all: list[list[tuple[float, float]]] = []
    rounds_per_step: list[int] = []
    for (problem, reverse), algo in zip(phases, algos):
        f = rfab if reverse else fab
        assert f is not None
        terms = step_terms(f, algo, problem.chunk_ids)
        dur = [step_duration(t, cb) for t in terms]
        order = list(range(algo.steps))
        if reverse:
            order = order[::-1]                    # dual step s runs as primal step S+1-s
        starts: dict[int, float] = {}
        t = offset
        for s0 in order:
            starts[s0 + 1] = t
            t += dur[s0]
            step_terms_all.append(terms[s0])
            rounds_per_step.append(algo.rounds_per_step[s0])
        for s, c, j in algo.sends:
            a, b = starts[s], starts[s] + dur[s - 1]
            chunk = problem.chunk_ids[c]
            u, v = int(f.vl.src[j]), int(f.vl.dst[j])
            route = f.vl.route[j]
            group = step_base + (algo.steps - s if reverse else s - 1)
            if reverse:
                transfers.append(Transfer(a, b, chunk, v, u, True, tuple(route[::-1]), 0, group))
            else:
                transfers.append(Transfer(a, b, chunk, u, v, False, tuple(route), 0, group))
        offset = t
        step_base += algo.steps
    transfers.sort(key=lambda x: (x.start, x.end, x.chunk, x.src, x.dst))
    c, s, r = key
    return Schedule(coll, topology.name, tuple(transfers), method="pareto", size_bytes=float(size_bytes),
                    predicted_time_us=offset,
                    solver="cp-sat",
                    notes={"chunks": c, "steps": s, "rounds": r,
                           "bandwidth_cost": f"{Fraction(r, c)}", "rounds_per_step": rounds_per_step,
                           "step_terms": step_terms_all, "unit_GBps": fab.unit_GBps})


# ---- the pipeline method ---------------------------------------------------------------------------
def synthesize(inst: Instance) -> Schedule:
    """The frontier point with the least α-β time at the request's SIZE (module docstring).

    ``options.chunks`` fixes C (then the least R, then least S, with exactly C chunks);
    ``options.extra`` may set ``max_steps``, ``max_chunks``, ``assume_monotonic`` and ``exhaustive``."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    extra = options.extra or {}
    chunks = options.chunks      # allreduce: buffer chunks (SCCL's C), module docstring
    exp = explore(topology, collective, max_steps=extra.get("max_steps"),
                  max_chunks=int(extra.get("max_chunks", DEFAULT_MAX_CHUNKS)),
                  time_limit=options.work_limit if options.work_limit is not None else DEFAULT_TIME_LIMIT,
                  size_bytes=size_bytes, assume_monotonic=bool(extra.get("assume_monotonic", False)),
                  threads=options.threads, seed=options.seed,
                  chunk_counts=[chunks] if chunks else None, exhaustive=bool(extra.get("exhaustive", False)))
    if not exp.points:
        raise SynthError(f"pareto found no algorithm for {collective.name} on {topology.name} "
                         f"({exp.stopped or 'no feasible instance'})")
    best = min(exp.points, key=lambda p: (predicted_time_us(p, size_bytes), p.steps))
    notes = dict(best.schedule.notes)
    notes.update({"frontier": [{"chunks": p.chunks, "steps": p.steps, "rounds": p.rounds} for p in exp.points],
                  "synthesis_s": exp.total_s})
    sched = best.schedule
    return Schedule(sched.collective, sched.topology, sched.transfers, "pareto", float(size_bytes),
                    predicted_time_us(best, size_bytes), notes, solver=sched.solver)


METHOD = MethodSpec(
    name="pareto",
    run=synthesize,
    collectives=COLLECTIVES,
    description="SCCL (chunks, steps, rounds) Pareto frontier on CP-SAT; picks the best α-β point for SIZE",
    kind="exact",
)

"""Direct combining allreduce: partial sums move and combine (SCCL's combining encoding, Cai et al.,
"Synthesizing Optimal Collective Algorithms", PPoPP'21, §4; msccl-tools ``path_encoding.py``), on CP-SAT.

**Why.** Every other allreduce in synth is composed: a reduce-scatter, then an allgather, each at least the
fabric's diameter in steps. A *combining* allreduce lets a rank send its current partial sum of a chunk to a
peer, which adds it to its own: on DGX-1 one step of exchanges inside each 4-GPU quad (every GPU then holds
its quad's sum) and one exchange with the partner GPU in the other quad is a complete allreduce in 2 steps,
where reduce-scatter + allgather needs 4.

**Units (SCCL's (C, S, R) for allreduce).** The buffer of SIZE bytes is split into ``C`` chunks
(*addresses*); chunk ``a`` of rank ``q`` is contribution ``(a, q)``. As in msccl-tools' ``allreduce``
collective (N chunks sharing one address, ``chunk_up(C)``), one address is one chunk of SIZE/C bytes. The
algorithm runs in ``S`` synchronous steps; step ``s`` lasts ``r_s >= 1`` rounds and ``R = Σ r_s``. In one
round a link of relative bandwidth ``b_e`` (NVLink count on DGX-1, :func:`synth.synthesis.steps.fabric`)
carries ``b_e`` addresses: a send carries one address whatever number of contributions its partial sum
holds (SCCL counts sends per address once per link). Under the α-β model an algorithm costs about
``S·α + (R/C)·SIZE/bw_unit``.

**Encoding** (one instance (C, S); CP-SAT minimises R):

- ``h[a,q,r,s]`` rank ``r``'s partial sum of address ``a`` contains ``q``'s contribution after step ``s``
  (``h[a,q,q,0] = 1``, else 0 at ``s = 0``; 0 wherever the hop distance from ``q`` to ``r`` exceeds ``s``);
- ``x[a,j,s]`` virtual link ``j = u -> v`` carries ``u``'s partial sum of ``a`` in step ``s``;
- a send carries *everything* its sender holds (one buffer slot is sent): ``y[a,q,j,s] = x[a,j,s] ∧
  h[a,q,u,s-1]``;
- the receiver adds what arrives, and no contribution is ever counted twice (SCCL's "receive a chunk from a
  unique source" with its rule that chunks at one address travel together):
  ``h[a,q,v,s] = h[a,q,v,s-1] + Σ_{j into v} y[a,q,j,s]`` (both sides 0/1);
- postcondition: ``h[a,q,r,S] = 1`` for every address, contributor and rank;
- copies (beyond SCCL's encoding, where a partial sum can never reach a rank whose own contribution it holds):
  ``z[a,j,s]`` sends ``u``'s *complete* sum of ``a`` (``z <= h[a,q,u,s-1]`` for every ``q``) as a plain copy that
  overwrites ``v``'s partial sum, so ``h[a,q,v,s] = max(h[a,q,v,s-1], y[a,q,·,s], z[a,·->v,s])``; at most one
  copy into ``v`` per step and none next to a reducing receive there. Reduce-then-broadcast trees need them; on
  DGX-1 and the small fabrics of the tests the least-steps algorithms do without;
- bandwidth: reducing sends and copies alike, ``Σ_{a, j over e} (x + z)[a,j,s] <= b_e · r_s``;
- objective: least ``R = Σ_s r_s`` (SCCL decides each (C, S, R) separately; one minimisation is the same).

Reads and writes of one step are ordered by the lowering (:mod:`synth.program.lower`: a send reads its slot at
the transfer's start, a reducing receive writes it at the end, and dependencies follow that order), so the
simultaneous exchanges of a step send the partial sums as of the step's start, as the encoding assumes.

**Search** (:func:`search`): for each chunk count, ``S`` from the diameter (every contribution must reach
every rank) up to max(diameter + 2, 2·radius, ⌈log2 N⌉); each instance minimises R; a larger S is tried only
while it could still lower R (it stops once ``R = S``, a round per step). Where N is a power of two and the
partners exist, recursive doubling is given to CP-SAT as a complete solution hint and is the answer where
CP-SAT does not reach it in its budget (:func:`doubling_hint`; 16 GPUs on one NVSwitch). The deterministic CP-SAT budget
(:func:`synth.solvers.deterministic_search`) is shared by all instances; an instance that runs out keeps its
best solution, flagged ``feasible``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from synth.collectives import Collective, CollectiveKind
from synth.errors import SynthError, TimeLimitReached
from synth.schedule import Schedule, Transfer
from synth.solvers import CLOCK_SHARE, cpsat_clock_stopped, deterministic_search
from synth.synthesis.steps import Algorithm, fabric, step_duration, step_terms
from synth.topology.model import Topology

# Largest model (send-carrying variables y, summed over addresses, contributors, links and steps) the search
# builds: dgx1 with C = 1 and S = 2 has 512, hypercube-16 with S = 4 about 16k.
MAX_CARRY_VARS = 40_000
DEFAULT_WORK_S = 10.0           # CP-SAT deterministic time for the whole search when none is given
EXTRA_STEPS = 2                 # steps beyond the diameter the search tries (at least up to 2·radius)
# Chunk counts :func:`best_schedule` tries without ``--chunks``: on dgx1 at 1 KB, C = 2 (2 steps, 2 rounds) runs
# 1.44 us where C = 1 (SCCL's least-steps instance) runs 1.48; larger C only pays at sizes where the composed
# reduce-scatter + allgather wins anyway.
DEFAULT_CHUNK_COUNTS = (1, 2)


@dataclass(frozen=True)
class CombiningAlgorithm:
    """A solved instance: per step its rounds, and the sends ``(step 1..S, address, virtual link)``."""

    chunks: int
    steps: int
    rounds: int
    rounds_per_step: tuple[int, ...]
    sends: tuple[tuple[int, int, int], ...]
    status: str          # optimal (R and the send count proved least) | feasible
    work_s: float        # CP-SAT deterministic time spent
    solve_s: float = 0.0  # wall seconds of the build and solve (reported only, never decides anything)
    copies: tuple[tuple[int, int, int], ...] = ()   # (step, address, virtual link): a complete sum, overwriting

    @property
    def bandwidth_cost(self) -> Fraction:
        """R/C in SCCL's units (rounds per buffer chunk)."""
        return Fraction(self.rounds, self.chunks)


def steps_lower_bound(dist: np.ndarray) -> int:
    """S >= the largest hop distance between two ranks: each contribution must reach every rank, and a send
    moves a partial sum one hop per step (SCCL's step bound, msccl-tools ``steps_bound.py``, for allreduce)."""
    return int(dist.max()) if dist.size else 0


def feasible_steps(dist: np.ndarray) -> int:
    """Steps within which a combining allreduce with copies always exists: 2·radius (reduce along a shortest-path
    tree into a centre, whose every contributor arrives by exactly one path, then copy the sum back down)."""
    return 2 * int(dist.max(axis=1).min()) if dist.size else 0


def doubling_hint(fab, chunks: int, steps: int) -> dict[tuple[int, int, int], int]:
    """Recursive doubling as a solution hint for CP-SAT, ``{(address, vlink, step): 0/1}``, where N is a power of
    two, ``steps >= log2 N`` and every rank has a virtual link to ``r XOR 2^k`` (switches, full meshes,
    hypercubes): in step k+1 every rank sends its partial sum of every address to that partner, whose sets are
    disjoint, and then holds 2^(k+1) contributions. Empty where it does not apply. It only guides the search
    (behind a 16-GPU switch CP-SAT found no 3- or 4-step solution within 15 units without it)."""
    vl = fab.vl
    n = fab.dist.shape[0]
    rounds = (n - 1).bit_length()
    if n < 2 or n & (n - 1) or steps < rounds:
        return {}
    index = {(int(u), int(v)): j for j, (u, v) in enumerate(zip(vl.src, vl.dst))}
    hint = {(a, j, s): 0 for a in range(chunks) for j in range(vl.count) for s in range(1, steps + 1)}
    for k in range(rounds):
        for r in range(n):
            j = index.get((r, r ^ (1 << k)))
            if j is None:
                return {}
            for a in range(chunks):
                hint[(a, j, k + 1)] = 1
    return hint


def _hinted_algorithm(fab, hint: dict[tuple[int, int, int], int], chunks: int, steps: int, work_s: float,
                      solve_s: float) -> CombiningAlgorithm:
    """The algorithm a :func:`doubling_hint` spells out (rounds per step from its link loads), replayed by
    :func:`check_algorithm`; status ``feasible``."""
    vl = fab.vl
    sends = tuple(sorted((s, a, j) for (a, j, s), on in hint.items() if on))
    rps = [1] * steps
    load: dict[tuple[int, int], int] = {}
    for s, _a, j in sends:
        for e in vl.phys[j]:
            if e >= 0:
                load[(s, int(e))] = load.get((s, int(e)), 0) + 1
    for (s, e), k in load.items():
        rps[s - 1] = max(rps[s - 1], -(-k // int(fab.mult[e])))
    algo = CombiningAlgorithm(chunks, steps, sum(rps), tuple(rps), sends, "feasible", work_s, solve_s)
    check_algorithm(fab, algo)
    return algo


def _add_hint(model, fab, hint: dict[tuple[int, int, int], int], x: dict, z: dict, derived: dict, r: list) -> None:
    """Give CP-SAT a complete solution hint from the sends ``hint`` (:func:`doubling_hint`): the contributor sets
    it builds (h, y), no copies, and each step's rounds; a partial hint (sends only) did not guide the search."""
    if not hint:
        return
    vl = fab.vl
    n = fab.dist.shape[0]
    steps = len(r)
    chunks = 1 + max(a for a, _j, _s in hint)
    held = {(a, 0): [{q} for q in range(n)] for a in range(chunks)}
    for a in range(chunks):
        for s in range(1, steps + 1):
            now = [set(h) for h in held[(a, s - 1)]]
            for j in range(vl.count):
                if hint.get((a, j, s)):
                    now[int(vl.dst[j])] |= held[(a, s - 1)][int(vl.src[j])]
            held[(a, s)] = now
    for key, var in x.items():
        model.add_hint(var, hint.get(key, 0))
    for var in z.values():
        model.add_hint(var, 0)
    for var, (kind, a, q, k, s) in derived.items():
        if kind == "y":
            on = hint.get((a, k, s), 0) and q in held[(a, s - 1)][int(vl.src[k])]
        else:
            on = q in held[(a, s)][k]
        model.add_hint(var, int(bool(on)))
    for s, var in enumerate(r, start=1):
        load: dict[int, int] = {}
        for (_a, j, t), on in hint.items():
            if on and t == s:
                for e in vl.phys[j]:
                    if e >= 0:
                        load[int(e)] = load.get(int(e), 0) + 1
        model.add_hint(var, max([1] + [-(-k // int(fab.mult[e])) for e, k in load.items()]))


def carry_vars(fab, chunks: int, steps: int) -> int:
    """How many y variables the instance has (its size, for :data:`MAX_CARRY_VARS`)."""
    dist, vl = fab.dist, fab.vl
    n = dist.shape[0]
    total = 0
    for s in range(1, steps + 1):
        # y[a,q,j,s] exists where q's contribution can be at src_j before step s
        reach = (dist <= s - 1).sum(axis=0)          # per rank u: contributors that can be there
        total += int(reach[vl.src].sum())
    return chunks * total if n else 0


def solve_instance(fab, chunks: int, steps: int, *, work_limit: float | None, threads: int | None = None,
                   seed: int = 0, time_limit: float | None = None, work: list[float] | None = None,
                   copies: bool = True) -> tuple[str, CombiningAlgorithm | None]:
    """Solve one (C, S) instance, least R (module docstring).

    ``fab`` is :func:`synth.synthesis.steps.fabric` of the topology. Returns ("sat" | "unsat" | "unknown",
    algorithm or None); "sat" carries ``status`` optimal or feasible (budget ran out with a solution). The CP-SAT
    deterministic time spent is appended to ``work``. ``copies=False`` is SCCL's encoding exactly (no copy of a
    complete sum)."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    vl, dist = fab.vl, fab.dist
    n = dist.shape[0]
    if steps < steps_lower_bound(dist) or chunks < 1:
        return "unsat", None
    into = [np.flatnonzero(vl.dst == v).tolist() for v in range(n)]
    users: dict[int, list[int]] = {}
    for j in range(vl.count):
        for e in vl.phys[j]:
            if e >= 0:
                users.setdefault(int(e), []).append(j)
    max_r = chunks * max((len(js) for js in users.values()), default=1)
    model = cp_model.CpModel()
    r = [model.new_int_var(1, max_r, f"r{s}") for s in range(1, steps + 1)]
    x = {(a, j, s): model.new_bool_var(f"x{a}_{j}_{s}")
         for a in range(chunks) for j in range(vl.count) for s in range(1, steps + 1)}
    z: dict[tuple[int, int, int], object] = {}     # copies of a complete sum
    derived: dict = {}                              # y and h variables -> what they stand for (for hints)
    for a in range(chunks):
        # h[q][v] at the previous step: 1, 0 or a variable
        prev: list[list[object]] = [[1 if q == v else 0 for v in range(n)] for q in range(n)]
        for s in range(1, steps + 1):
            copy_in: list[list[object]] = [[] for _ in range(n)]
            if copies:
                for j in range(vl.count):
                    u = int(vl.src[j])
                    held = [prev[q][u] for q in range(n)]
                    if any(isinstance(h, int) and not h for h in held):
                        continue                   # u cannot hold the complete sum before step s
                    zz = model.new_bool_var(f"z{a}_{j}_{s}")
                    for h in held:
                        if not isinstance(h, int):
                            model.add_implication(zz, h)
                    z[(a, j, s)] = zz
                    copy_in[int(vl.dst[j])].append(zz)
                for v in range(n):
                    if copy_in[v]:
                        # at most one copy, and none with a reducing receive of the same chunk in the step
                        model.add_at_most_one(copy_in[v])
                        for j in into[v]:
                            model.add(x[(a, j, s)] + sum(copy_in[v]) <= 1)
            cur: list[list[object]] = [[0] * n for _ in range(n)]
            for q in range(n):
                for v in range(n):
                    carried = []
                    for j in into[v]:
                        u = int(vl.src[j])
                        held = prev[q][u]
                        if isinstance(held, int):
                            if held:
                                carried.append(x[(a, j, s)])
                            continue
                        y = model.new_bool_var(f"y{a}_{q}_{j}_{s}")
                        derived[y] = ("y", a, q, j, s)
                        model.add_implication(y, x[(a, j, s)])
                        model.add_implication(y, held)
                        model.add_bool_or([y, x[(a, j, s)].Not(), held.Not()])
                        carried.append(y)
                    before = prev[q][v]
                    if isinstance(before, int) and before:
                        for c in carried:          # v already counts q: nothing may bring it again
                            model.add(c == 0)
                        cur[q][v] = 1
                        continue
                    old = [] if isinstance(before, int) else [before]
                    if len(carried) + len(old) > 1:
                        model.add(sum(carried) + sum(old) <= 1)     # q counted once
                    terms = old + carried + copy_in[v]
                    if s == steps:
                        model.add_bool_or(terms)       # empty: infeasible, as it should be
                        cur[q][v] = 1
                        continue
                    if not carried and not copy_in[v]:
                        cur[q][v] = before
                        continue
                    h = model.new_bool_var(f"h{a}_{q}_{v}_{s}")
                    derived[h] = ("h", a, q, v, s)
                    model.add_max_equality(h, terms)
                    cur[q][v] = h
            prev = cur
    for s in range(1, steps + 1):
        for e, js in users.items():
            load = [x[(a, j, s)] for a in range(chunks) for j in js]
            load += [z[(a, j, s)] for a in range(chunks) for j in js if (a, j, s) in z]
            if len(load) > int(fab.mult[e]):
                model.add(sum(load) <= int(fab.mult[e]) * r[s - 1])
    hint = doubling_hint(fab, chunks, steps)
    _add_hint(model, fab, hint, x, z, derived, r)
    # least R only: a tie-break on the send count made CP-SAT's proofs 100x slower (dgx-a100, C = 1, S = 2)
    model.minimize(sum(r))
    solver = cp_model.CpSolver()
    deterministic_search(solver.parameters, time_limit, work_limit, threads)
    solver.parameters.random_seed = int(seed)
    status = solver.solve(model)
    decided = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
    short_of_work = work_limit is None or solver.deterministic_time < CLOCK_SHARE * work_limit
    if not decided and time_limit is not None and (short_of_work or cpsat_clock_stopped(solver, decided, time_limit,
                                                                                       work_limit)):
        # the wall clock, not the deterministic budget, ended it: fail rather than return a machine-dependent result
        raise TimeLimitReached(f"combining: the time limit ({time_limit:g} s) ran out before the (C={chunks}, "
                               f"S={steps}) instance was decided; allow more time")
    spent = float(solver.deterministic_time)
    if work is not None:
        work.append(spent)
    if status == cp_model.INFEASIBLE:
        return "unsat", None
    # the hint is a solution: where CP-SAT did not reach it within its budget, it is the answer (as milp keeps
    # its greedy warm start)
    fallback = _hinted_algorithm(fab, hint, chunks, steps, spent, time.perf_counter() - t0) if hint else None
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return ("sat", fallback) if fallback is not None else ("unknown", None)
    if status == cp_model.FEASIBLE and fallback is not None and fallback.rounds < round(solver.objective_value):
        return "sat", fallback
    sends = tuple(sorted((s, a, j) for (a, j, s), var in x.items() if solver.boolean_value(var)))
    copied = tuple(sorted((s, a, j) for (a, j, s), var in z.items() if solver.boolean_value(var)))
    rps = tuple(int(solver.value(v)) for v in r)
    algo = CombiningAlgorithm(chunks, steps, sum(rps), rps, sends,
                              "optimal" if status == cp_model.OPTIMAL else "feasible", spent,
                              time.perf_counter() - t0, copied)
    check_algorithm(fab, algo)
    return "sat", algo


def check_algorithm(fab, algo: CombiningAlgorithm) -> None:
    """Independent replay of a combining algorithm: partial sums as contributor sets, every reducing send carrying
    its sender's whole set as of the step's start; no contribution counted twice; a copy only of a complete sum,
    to a rank that receives no reducing send of that chunk in the step; every rank complete at the end; no link
    over ``b_e · r_s`` addresses in a step."""
    vl = fab.vl
    n = fab.dist.shape[0]
    held = [[{q} for q in range(n)] for _ in range(algo.chunks)]
    if sum(algo.rounds_per_step) != algo.rounds or min(algo.rounds_per_step, default=1) < 1:
        raise SynthError("internal: combining rounds do not add up")
    for step in range(1, algo.steps + 1):
        snapshot = [[set(h) for h in per] for per in held]
        load: dict[int, int] = {}
        reduced: set[tuple[int, int]] = set()
        for s, a, j in algo.sends:
            if s != step:
                continue
            u, v = int(vl.src[j]), int(vl.dst[j])
            part = snapshot[a][u]
            if part & held[a][v]:
                raise SynthError(f"internal: combining counts contributions {sorted(part & held[a][v])} of "
                                 f"chunk {a} twice at rank {v} in step {step}")
            held[a][v] |= part
            reduced.add((a, v))
        for s, a, j in algo.copies:
            if s != step:
                continue
            u, v = int(vl.src[j]), int(vl.dst[j])
            if len(snapshot[a][u]) != n or (a, v) in reduced:
                raise SynthError(f"internal: combining copies chunk {a} {u} -> {v} in step {step} from an incomplete "
                                 "sum or next to a reducing receive")
            held[a][v] = set(range(n))
        for s, _a, j in algo.sends + algo.copies:
            if s == step:
                for e in vl.phys[j]:
                    if e >= 0:
                        load[int(e)] = load.get(int(e), 0) + 1
        for e, k in load.items():
            if k > int(fab.mult[e]) * algo.rounds_per_step[step - 1]:
                raise SynthError(f"internal: combining overloads link {e} in step {step}")
    for a in range(algo.chunks):
        for v in range(n):
            if len(held[a][v]) != n:
                raise SynthError(f"internal: combining leaves rank {v} short of chunk {a}")


def _as_pareto_algorithm(algo: CombiningAlgorithm):

    return Algorithm(algo.chunks, algo.steps, algo.rounds, algo.rounds_per_step,
                     tuple(sorted(algo.sends + algo.copies)), 0.0)


def to_schedule(topology: Topology, fab, collective: Collective, algo: CombiningAlgorithm, size_bytes: float,
                method: str) -> Schedule:
    """Reducing transfers of each step at ``[T_s, T_s + d_s]``, ``d_s`` the step's α-β time on its busiest
    link (:func:`synth.synthesis.steps.step_terms`); ``group`` = step, so a step's contiguous addresses on one
    link go as one MSCCL step. ``collective`` is the request's allreduce; its chunk count becomes C."""

    coll = Collective(collective.name, collective.num_ranks, algo.chunks, collective.root, collective.inplace)
    cb = coll.chunk_bytes(size_bytes)
    terms = step_terms(fab, _as_pareto_algorithm(algo), tuple(range(algo.chunks)))
    starts = np.concatenate([[0.0], np.cumsum([step_duration(t, cb) for t in terms])])
    transfers = []
    for reduce, sends in ((True, algo.sends), (False, algo.copies)):
        for s, a, j in sends:
            u, v = int(fab.vl.src[j]), int(fab.vl.dst[j])
            transfers.append(Transfer(float(starts[s - 1]), float(starts[s]), a, u, v, reduce,
                                      tuple(fab.vl.route[j]), 0, s - 1))
    transfers.sort(key=lambda t: (t.start, t.end, t.chunk, t.src, t.dst))
    notes = {"encoding": "combining allreduce (partial sums move and combine; SCCL's combining encoding)",
             "chunks": algo.chunks, "steps": algo.steps, "rounds": algo.rounds,
             "bandwidth_cost": f"{algo.bandwidth_cost}", "rounds_per_step": list(algo.rounds_per_step),
             "step_terms": terms, "unit_GBps": fab.unit_GBps, "combining_status": algo.status}
    return Schedule(coll, topology.name, tuple(transfers), method=method, size_bytes=float(size_bytes),
                    predicted_time_us=float(starts[-1]), notes=notes, solver="cp-sat")


@dataclass
class CombiningSearch:
    """What :func:`search` did: every instance tried and the algorithms found (one per (C, S))."""

    steps_lb: int
    tried: list[dict]
    found: list[CombiningAlgorithm]
    work_s: float


def search(topology: Topology, *, chunk_counts: tuple[int, ...] = (1,), max_steps: int | None = None,
           steps: tuple[int, ...] | None = None, work_limit: float | None = DEFAULT_WORK_S,
           instance_limit: float | None = None, threads: int | None = None, seed: int = 0,
           time_limit: float | None = None, fab=None) -> CombiningSearch:
    """Solve (C, S) for every C in ``chunk_counts`` and S from the diameter to ``max_steps`` (default: diameter
    + :data:`EXTRA_STEPS`, at least :func:`feasible_steps`; or exactly the S in ``steps``), least R each; a
    larger S only while R > S at the previous one. Instances above :data:`MAX_CARRY_VARS` are skipped (logged
    ``too large``). ``work_limit`` is shared by all instances, ``instance_limit`` (default a quarter of it)
    caps one; both deterministic."""

    fab = fab if fab is not None else fabric(topology)
    lb = steps_lower_bound(fab.dist)
    n = topology.num_ranks
    # ceil(log2 N): a rank's partial sum at most doubles per round when it takes one receive a round (behind a
    # switch port), so one round per step needs that many steps (recursive doubling's count)
    doubling = max(0, (n - 1).bit_length())
    top = max(lb + EXTRA_STEPS, feasible_steps(fab.dist), doubling) if max_steps is None else max_steps
    cap = instance_limit if instance_limit is not None else (None if work_limit is None else work_limit / 4)
    tried: list[dict] = []
    found: list[CombiningAlgorithm] = []
    work: list[float] = []
    if not np.isfinite(fab.dist).all() or topology.num_ranks < 2:
        return CombiningSearch(lb, tried, found, 0.0)
    for c in chunk_counts:
        for s in (steps if steps is not None else range(max(1, lb), top + 1)):
            left = None if work_limit is None else work_limit - sum(work)
            if left is not None and left <= 0:
                tried.append({"chunks": c, "steps": s, "status": "budget spent"})
                break
            if carry_vars(fab, c, s) > MAX_CARRY_VARS:
                tried.append({"chunks": c, "steps": s, "status": "too large"})
                break
            t0 = time.perf_counter()
            limit = left if cap is None else (cap if left is None else min(cap, left))
            status, algo = solve_instance(fab, c, s, work_limit=limit, threads=threads, seed=seed,
                                          time_limit=time_limit, work=work)
            entry = {"chunks": c, "steps": s, "status": status, "solve_s": round(time.perf_counter() - t0, 3)}
            if algo is not None:
                entry.update(rounds=algo.rounds, proved=algo.status)
                found.append(algo)
            tried.append(entry)
            if algo is not None and algo.rounds <= s:
                break
    return CombiningSearch(lb, tried, found, sum(work))


def predicted_us(fab, algo: CombiningAlgorithm, size_bytes: float) -> float:
    """α-β time of an algorithm at ``size_bytes`` (step terms summed over steps)."""

    cb = size_bytes / algo.chunks
    terms = step_terms(fab, _as_pareto_algorithm(algo), tuple(range(algo.chunks)))
    return float(sum(step_duration(t, cb) for t in terms))


def replicate(fab, algo: CombiningAlgorithm, chunks: int) -> CombiningAlgorithm:
    """``algo`` (one chunk) run on each of ``chunks`` chunks at once: every send carries all chunks, contiguous, so
    a link pays one α per step as with one chunk; step ``s`` takes ``r_s = max_e ⌈load_e / b_e⌉`` rounds. Its R/C
    is ``algo``'s or more, so it only pays where α dominates (a pinned ``--chunks`` at small SIZE)."""
    def spread(sends):
        return tuple(sorted((s, a, j) for s, _a, j in sends for a in range(chunks)))

    sends, copies = spread(algo.sends), spread(algo.copies)
    load: dict[tuple[int, int], int] = {}
    for s, _a, j in sends + copies:
        for e in fab.vl.phys[j]:
            if e >= 0:
                load[(s, int(e))] = load.get((s, int(e)), 0) + 1
    rps = [1] * algo.steps
    for (s, e), k in load.items():
        rps[s - 1] = max(rps[s - 1], -(-k // int(fab.mult[e])))
    out = CombiningAlgorithm(chunks, algo.steps, sum(rps), tuple(rps), sends, algo.status, 0.0, 0.0, copies)
    check_algorithm(fab, out)
    return out


def best_schedule(topology: Topology, collective: Collective, size_bytes: float, *, chunks: int | None,
                  work_limit: float | None, threads: int | None, seed: int, method: str,
                  time_limit: float | None = None) -> Schedule | None:
    """The combining allreduce with the least α-β time at ``size_bytes``, or None where the search found none
    (too large, infeasible within the steps tried, or the budget ran out); notes say what was tried.

    C = 1 at every step count :func:`search` tries; then, without ``chunks``, each further count of
    :data:`DEFAULT_CHUNK_COUNTS` at the step count fastest with C = 1 only (one instance each: more chunks make
    CP-SAT's proof of the least R much slower, e.g. dgx-a100 C = 2, S = 2). With ``chunks`` = C > 1 the
    candidates are C solved at that step count and the fastest C = 1 algorithm replicated to C (:func:`replicate`; the
    least-R solution scatters chunks over links, one α per run, which at small SIZE costs more than rounds)."""
    if collective.name != CollectiveKind.ALLREDUCE:
        raise SynthError(f"the combining encoding is for allreduce, not {collective.name}")

    fab = fabric(topology)
    more_counts = DEFAULT_CHUNK_COUNTS[1:] if not chunks else ((chunks,) if chunks > 1 else ())

    def fastest(algos: list[CombiningAlgorithm]) -> CombiningAlgorithm:
        return min(algos, key=lambda al: (predicted_us(fab, al, size_bytes), al.steps, al.rounds))

    first = search(topology, chunk_counts=(1,), work_limit=work_limit, threads=threads, seed=seed,
                   time_limit=time_limit, fab=fab)
    tried, found, spent = list(first.tried), list(first.found), first.work_s
    if found and more_counts:
        # more chunks only at the step count that was fastest with the first count: one instance each
        best1 = fastest(found)
        left = None if work_limit is None else work_limit - spent
        more = search(topology, chunk_counts=more_counts, steps=(best1.steps,), work_limit=left,
                      instance_limit=None if work_limit is None else work_limit / 4, threads=threads, seed=seed,
                      time_limit=time_limit, fab=fab)
        tried += more.tried
        spent += more.work_s
        if chunks:
            found = more.found + [replicate(fab, best1, chunks)]
        else:
            found += more.found
    if not found:
        return None
    sched = to_schedule(topology, fab, collective, fastest(found), size_bytes, method)
    sched.notes.update(combining_tried=tried, combining_work_s=spent)
    return sched

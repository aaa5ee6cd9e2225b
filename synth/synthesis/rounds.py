"""Round-timed tree pipelines: which part of each tree's data crosses each tree edge in which round.

A forest (``k`` spanning trees per root, :mod:`synth.synthesis.trees`) fixes *where* data goes; this
LP fixes *when*, in ``R`` rounds of free length ``τ_r`` (a time-expanded schedule in the manner of
TE-CCL, Liu et al., "Rethinking Machine Learning Collective Communication as a Multi-Commodity
Flow Problem", SIGCOMM 2024, §4, here over tree prefixes instead of per-chunk commodities):

    X[e, r] ∈ [0, 1]   the share of its tree's data that tree edge e has moved by the end of round r
                        (every edge moves its tree's data in the same order, so shares are prefixes)

    minimise  Σ_r τ_r
    s.t.  X[e, r-1] ≤ X[e, r],   X[e, R] = 1,   X[e, 1] = 0 below the root
          X[e, r] ≤ X[f, r-1]  for f in waits(e)         (store and forward: a rank sends what it holds)
          Σ_{e on link l} d_e (X[e, r] − X[e, r-1]) + α-charge(l, r) ≤ τ_r      (every link l, round r)

with ``d_e`` the µs the tree's whole data takes on the edge's route (``b / min bw``) and ``waits(e)``
the edges that bring e's data to its sender: in a broadcast tree the edge into the sender (``trees``
times reductions as mirrored broadcasts); in a reduction tree it would be every edge into the sender.
Run round by round, that schedule takes ``Σ τ_r``; run as soon as data and links allow, with each
link keeping the rounds' order, it can only be shorter (each transfer starts no later than its
round), up to rounding shares to whole chunks and MSCCL's split of messages over 71 chunks.

α is paid per message, and a message is one (edge, round) with ``X[e, r] > X[e, r-1]``: a count of
non-zeros, so α-charge(l, r) = Σ_{e on l, active in r} α_e is not linear. It is found by reweighted
ℓ1 minimisation (Candès, Wakin and Boyd, "Enhancing Sparsity by Reweighted ℓ1 Minimization",
J. Fourier Anal. Appl. 2008): α_e · ΔX / (ΔX_prev + δ) per edge and round, from the LP with one α
per link and round; then the rounds an edge moved data in are fixed and the LP is solved once more
with their α charged exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from synth.errors import TimeLimitReached
from synth.solvers import Model, solve

REWEIGHTS = 2           # reweighted-ℓ1 passes
REWEIGHT_DELTA = 0.01   # δ: shares moved below this cost less than one α during the passes
ACTIVE_SHARE = 1e-4     # an edge moving less of its tree's data in a round sends nothing then
# HiGHS' simplex clean-up after interior point, in iterations: a few to 2k where the LP is well posed; on
# rr4-16-s2's allreduce it ran past 70k (primal simplex, still infeasible) and stalled `lp` until the clock
# stop. A deterministic budget: an LP past it gives no round plan, and the pipeline times the forest otherwise.
CLEANUP_ITERATIONS = 10_000


@dataclass(frozen=True)
class TreeEdges:
    """Tree edges as plain data: ``waits[e]`` the edges whose shares a round earlier bound e's (none
    where the sender holds the data from the start), ``links[e]`` the link ids its route holds,
    ``data_us[e]`` the µs its tree's whole data takes on that route and ``alpha_us[e]`` the route's α."""

    waits: tuple[tuple[int, ...], ...]
    links: tuple[tuple[int, ...], ...]
    data_us: np.ndarray
    alpha_us: np.ndarray
    num_links: int


@dataclass(frozen=True)
class RoundPlan:
    shares: np.ndarray      # X: (edges, rounds) cumulative shares, last column 1
    round_us: np.ndarray    # τ_r of the exact-α LP
    messages: int           # (edge, round) pairs that move data

    @property
    def time_us(self) -> float:
        return float(self.round_us.sum())


def plan_rounds(edges: TreeEdges, rounds: int, solver: str = "highs", deadline: float | None = None,
                above_us: float | None = None, trace: list[float] | None = None) -> RoundPlan | None:
    """Solve the LP of the module docstring; ``None`` if a solve fails, or if the first LP (one α per link
    and round, an optimistic start) or a reweighted one already takes ``above_us`` or more. Past the
    ``time.monotonic()`` ``deadline`` (the user's safety stop) it raises :class:`TimeLimitReached`. ``trace``
    receives the times compared with ``above_us``, in order (the plan depends on nothing else, so a caller may
    replay another target against them)."""
    trace = [] if trace is None else trace
    result = _solve(edges, rounds, "link", None, solver, deadline)
    if result is not None:
        trace.append(float(result[1].sum()))
    if result is None or (above_us is not None and trace[-1] >= above_us):
        return None
    for _ in range(REWEIGHTS):
        weight = _moved(result[0]) + REWEIGHT_DELTA
        result = _solve(edges, rounds, "reweighted", weight, solver, deadline) or result
        trace.append(float(result[1].sum()))
        if above_us is not None and trace[-1] >= above_us:
            return None     # α nearly per message already: no faster than the target
    active = _moved(result[0]) > ACTIVE_SHARE
    exact = _solve(edges, rounds, "exact", active, solver, deadline)
    if exact is None:
        # moves below ACTIVE_SHARE left some edge short of its whole share: let the last round close
        # every edge (X[e, R] = 1), at one α per edge there (mi250 allgather: the last round 9 -> 14 µs)
        active[:, -1] = True
        exact = _solve(edges, rounds, "exact", active, solver, deadline)
    if exact is None:
        return None
    shares, tau = exact
    return RoundPlan(shares, tau, int((_moved(shares) > ACTIVE_SHARE).sum()))


def _moved(shares: np.ndarray) -> np.ndarray:
    return np.diff(shares, axis=1, prepend=0.0)


def _solve(edges: TreeEdges, rounds: int, alpha_mode: str, weight: np.ndarray | None, solver: str,
           deadline: float | None) -> tuple[np.ndarray, np.ndarray] | None:
    """One LP. ``alpha_mode``: ``link`` (one α per link and round), ``reweighted`` (``weight``: the
    ℓ1 weights), ``exact`` (``weight``: the boolean active (edge, round) pairs; others move nothing)."""
    count, R = len(edges.waits), rounds
    model = Model(f"tree-rounds-{alpha_mode}")
    upper = np.ones((count, R))
    waiting = np.array([bool(w) for w in edges.waits])
    upper[waiting, 0] = 0.0
    x = model.add_vars(count * R, 0.0, 1.0).reshape(count, R)
    tau = model.add_vars(R)
    lower_last = np.zeros((count, R))
    lower_last[:, -1] = 1.0
    _fix_bounds(model, x, lower_last, upper)
    # monotone: X[e, r-1] - X[e, r] <= 0
    prev, cur = x[:, :-1].ravel(), x[:, 1:].ravel()
    _pairs(model, prev, cur, -np.inf, 0.0)
    # store and forward: X[e, r] - X[f, r-1] <= 0 for f in waits(e)
    pairs = [(e, f) for e, fs in enumerate(edges.waits) for f in fs]
    if pairs:
        e_of, f_of = np.array(pairs).T
        _pairs(model, x[e_of, 1:].ravel(), x[f_of, :-1].ravel(), -np.inf, 0.0)
    if alpha_mode == "exact":
        idle = ~weight.astype(bool)
        idle[:, 0] = False           # round 1 has no previous share; its bound (0 below the root) rules
        e_idx, r_idx = np.nonzero(idle)
        _pairs(model, x[e_idx, r_idx], x[e_idx, r_idx - 1], 0.0, 0.0)
        idle0 = ~weight.astype(bool)[:, 0] & ~waiting
        if idle0.any():
            _fix_bounds_rows(model, x[idle0, 0])
    # link rows
    on_link: list[list[int]] = [[] for _ in range(edges.num_links)]
    for e, links in enumerate(edges.links):
        for link in links:
            on_link[link].append(e)
    for members in on_link:
        if not members:
            continue
        m = np.asarray(members)
        for r in range(R):
            cols = [x[m, r]]
            vals = [edges.data_us[m].copy()]
            charge = 0.0
            if alpha_mode == "link":
                charge = float(edges.alpha_us[m].max())
            elif alpha_mode == "exact":
                charge = float(edges.alpha_us[m][weight[m, r]].sum())
            else:
                vals[0] = vals[0] + edges.alpha_us[m] / weight[m, r]
            if r > 0:
                cols.append(x[m, r - 1])
                vals.append(-vals[0])
            cols.append(np.array([tau[r]]))
            vals.append(np.array([-1.0]))
            c = np.concatenate(cols)
            model.add_rows(np.zeros(len(c), dtype=np.int64), c, np.concatenate(vals), [-np.inf], [-charge])
    model.set_objective(tau, np.ones(R))
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise TimeLimitReached("rounds: the time limit ran out before the rounds LP; allow more time")
    highs = solver == "highs"
    result = solve(model, solver, time_limit=left, lp_algorithm="ipm" if highs else None,
                   simplex_iterations=CLEANUP_ITERATIONS if highs else None)
    if result.status != "optimal" or result.values is None:
        return None
    values = np.asarray(result.values)
    shares = np.clip(values[x.ravel()].reshape(count, R), 0.0, 1.0)
    shares = np.maximum.accumulate(shares, axis=1)
    shares[:, -1] = 1.0
    return shares, values[tau]


def _pairs(model: Model, left: np.ndarray, right: np.ndarray, lb: float, ub: float) -> None:
    """Rows ``lb <= x[left] - x[right] <= ub``, one per pair."""
    k = len(left)
    if not k:
        return
    rows = np.concatenate([np.arange(k), np.arange(k)])
    model.add_rows(rows, np.concatenate([left, right]), np.concatenate([np.ones(k), -np.ones(k)]),
                   np.full(k, lb), np.full(k, ub))


def _fix_bounds(model: Model, x: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> None:
    """Variable bounds as rows (the Model takes bounds per batch of variables)."""
    fixed_low = lower.ravel() > 0
    fixed_up = upper.ravel() < 1
    idx = x.ravel()
    if fixed_low.any():
        k = int(fixed_low.sum())
        model.add_rows(np.arange(k), idx[fixed_low], np.ones(k), lower.ravel()[fixed_low], np.ones(k))
    if fixed_up.any():
        _fix_bounds_rows(model, idx[fixed_up])


def _fix_bounds_rows(model: Model, cols: np.ndarray) -> None:
    k = len(cols)
    model.add_rows(np.arange(k), cols, np.ones(k), np.zeros(k), np.zeros(k))

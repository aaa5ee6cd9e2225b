"""Who owns how much of an allreduce: root weights for its reduce-scatter and allgather forests.

An allreduce on trees is a reduce-scatter into owners followed by an allgather from them. Which rank
owns which part of the buffer is the schedule's choice, not the collective's: every rank starts with
the whole buffer and ends with the whole sum. With every rank owning ``1/N``, a rank that is thin on
one side (a GPU whose NIC is down, a box of slower GPUs beside faster ones) sets both phases' rate.
Owning more where bandwidth is plentiful moves work off it.

:func:`ownership_weights` chooses the shares ``x_r`` that minimise the two forests' bandwidth time

    min  t_RS + t_AG   s.t.  Σ_r x_r = 1,  x ≥ 0,
         Σ_{r ∈ S} x_r ≤ t_AG · B⁺(S)        for every node set S that misses a rank (the fabric),
         Σ_{r ∈ S} x_r ≤ t_RS · B⁺_rev(S)    the same on the reversed fabric,

where, for fixed ``x``, the least ``t`` meeting the cut rows is the rate of optimal broadcast forests
from roots of weights ``x`` (Edmonds' branching theorem as used by ForestColl, Zhao et al., arXiv
2402.06787, §3: ``T* = max_S w(S ∩ ranks) / B⁺(S)``; :func:`synth.synthesis.packing.optimal_ratio`), and
a reduction forest is a broadcast forest of the reversed fabric. The cut rows are exponentially many, so
the LP is solved by cutting planes (Kelley 1960): solve on the rows found so far, then ask max-flow for a
violated cut of each fabric (:func:`synth.synthesis.packing.short_cuts`, the separation step of
``optimal_ratio``), until none is. The shares are then rounded to integer weights of a small total, so
that chunks split into whole pieces per root.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from fractions import Fraction

import numpy as np

from synth.errors import SynthError
from synth.synthesis.packing import Fabric, integer_fabric, optimal_ratio, short_cuts
from synth.synthesis.trees import tuning
from synth.synthesis.trees.forest import Forest, split_rank_fabric
from synth.topology.model import Topology

SEPARATION_SCALE = 10**9     # shares and capacities as integers for the max-flow separation
CUT_ROUNDS = 200             # cutting-plane rounds at most (a deterministic work budget)
TOTAL_RANGE = 8              # integer weights sum to a power of two from N up to this many times N (so that
# power-of-two buffers divide into whole chunks, as MSCCL runtimes need)
ROUNDING_SLACK = 0.015       # the least total whose rounding is within this of the LP optimum wins (fewer units:
# fewer trees and chunks to time; nicless dgx-a100-2node: 64 units 1.2 % above the LP, 128 units 0.7 %)
SPLIT_UNITS = 8              # the fabric LP's shares in this many units per rank, for the switch split they ask for
WORTH = 0.03                 # weights are used only where they save this share of the uniform forests' time


def forest_time_per_byte(fabric: Fabric, weights: dict[int, int]) -> Fraction:
    """µs per byte of one unit of weight's data through optimal forests from roots of ``weights``
    (``optimal_ratio`` in the fabric's units, as :meth:`Forest.bandwidth_time_us` reads it)."""
    return optimal_ratio(fabric, weights) / (fabric.unit_GBps * 1000)


def _weighted_time_per_byte(fabrics: tuple[Fabric, Fabric], weights: dict[int, int]) -> Fraction:
    """Reduce-scatter plus allgather time per byte of buffer, with ownership ``weights``."""
    total = sum(weights.values())
    return sum((forest_time_per_byte(f, weights) for f in fabrics), Fraction(0)) / total


def _cut_row(fabric: Fabric, side: list[int], n: int) -> tuple[np.ndarray, float]:
    """(rank indicator of ``S``, ``B⁺(S)`` in fabric units) of a source side ``S``."""
    inside = np.zeros(fabric.num_nodes, dtype=bool)
    inside[side] = True
    leaving = float(fabric.units[inside[fabric.tails] & ~inside[fabric.heads]].sum())
    return inside[:n].astype(float), leaving


def _rank_rows(fabric: Fabric, n: int) -> list[tuple[np.ndarray, float]]:
    """The cuts ``S = V ∖ {v}`` of every rank ``v``: what it must receive over its own in-links."""
    rows = []
    for v in range(n):
        side = [x for x in range(fabric.num_nodes) if x != v]
        rows.append(_cut_row(fabric, side, n))
    return rows


def _cutting_planes(fabrics: tuple[Fabric, Fabric], rows: list[list[tuple[np.ndarray, float]]], cost: np.ndarray,
                    extra_ub: list[tuple[np.ndarray, float]]) -> np.ndarray | None:
    """Minimise ``cost`` over (x, t_AG, t_RS, d) on the cut rows, adding violated cuts of each fabric (found by
    max-flow) until there is none; ``extra_ub``: more rows ``a·v ≤ b``. None if the LP fails or ``CUT_ROUNDS``
    pass. ``rows`` grows in place, so a later call starts from the cuts found."""
    from scipy.optimize import linprog

    n = fabrics[0].num_ranks
    unit = [1.0 / (float(f.unit_GBps) * 1000) for f in fabrics]   # µs per byte at one fabric unit of bandwidth
    size = len(cost)
    a_eq = np.zeros((1, size))
    a_eq[0, :n] = 1.0
    for _ in range(CUT_ROUNDS):
        a_ub, b_ub = [], []
        for phase, phase_rows in enumerate(rows):
            for indicator, leaving in phase_rows:   # x(S) - t·B⁺(S) ≤ 0, B⁺ in bytes per µs
                row = np.zeros(size)
                row[:n] = indicator
                row[n + phase] = -leaving / unit[phase]
                a_ub.append(row)
                b_ub.append(0.0)
        for row, bound in extra_ub:
            a_ub.append(row)
            b_ub.append(bound)
        result = linprog(cost, A_ub=np.array(a_ub), b_ub=np.array(b_ub), A_eq=a_eq, b_eq=[1.0],
                         bounds=[(0, None)] * size, method="highs")
        if result.status != 0:
            return None
        x, times = result.x[:n], result.x[n:n + 2]
        added = False
        for phase, fabric in enumerate(fabrics):
            weights = {r: int(round(x[r] * SEPARATION_SCALE)) for r in range(n)}
            caps = np.floor(fabric.units * times[phase] / unit[phase] * SEPARATION_SCALE * (1 + 1e-7)).astype(np.int64)
            for _, side in short_cuts(fabric.num_nodes, fabric.tails, fabric.heads, caps, weights, 1, range(n)):
                rows[phase].append(_cut_row(fabric, side, n))
                added = True
                break
        if not added:
            return result.x
    return None


def ownership_shares(fabrics: tuple[Fabric, Fabric]) -> tuple[np.ndarray, float] | None:
    """(shares ``x``, LP value in µs per byte of buffer) of the LP in the module docstring on ``fabrics`` (the
    allgather's and the reduce-scatter's planning fabrics), the optimal shares nearest ``1/N`` each (least
    ``Σ_r |x_r − 1/N|`` among those within ``1e-6`` of the optimum: a rank owns more or less only where that saves
    time); None if the cutting planes do not settle in ``CUT_ROUNDS`` rounds."""
    n = fabrics[0].num_ranks
    rows = [_rank_rows(fabrics[0], n), _rank_rows(fabrics[1], n)]
    # variables: x (n), t_AG, t_RS, d (n) with d_r ≥ |x_r − 1/N|
    size = 2 * n + 2
    fastest = np.zeros(size)
    fastest[n:n + 2] = 1.0
    solved = _cutting_planes(fabrics, rows, fastest, [])
    if solved is None:
        return None
    optimum = float(solved[n] + solved[n + 1])
    deviation = []
    for r in range(n):
        for sign in (1.0, -1.0):   # ±(x_r − 1/N) ≤ d_r
            row = np.zeros(size)
            row[r] = sign
            row[n + 2 + r] = -1.0
            deviation.append((row, sign / n))
    within = np.zeros(size)
    within[n:n + 2] = 1.0
    nearest = np.zeros(size)
    nearest[n + 2:] = 1.0
    solved = _cutting_planes(fabrics, rows, nearest, [*deviation, (within, optimum * (1 + 1e-6))])
    if solved is None:
        return None
    return solved[:n], float(solved[n] + solved[n + 1])


def round_shares(shares: np.ndarray, total: int) -> tuple[int, ...]:
    """Integer weights summing to ``total`` nearest ``shares · total`` (largest remainder, ties by rank)."""
    scaled = shares * total / shares.sum()
    weights = np.floor(scaled + 1e-12).astype(np.int64)
    order = sorted(range(len(shares)), key=lambda r: (-(scaled[r] - weights[r]), r))
    for r in order[:total - int(weights.sum())]:
        weights[r] += 1
    return tuple(int(w) for w in weights)


def _worth(fabrics: tuple[Fabric, Fabric]) -> Fraction:
    """The most weighted forests may take per byte to be used: one unit per rank's time on ``fabrics`` less
    ``WORTH`` of it."""
    n = fabrics[0].num_ranks
    return _weighted_time_per_byte(fabrics, {r: 1 for r in range(n)}) * (1 - Fraction(WORTH).limit_denominator(1000))


def _worth_it(fabrics: tuple[Fabric, Fabric], worth: Fraction) -> tuple[np.ndarray, float] | None:
    """(shares, LP value) of :func:`ownership_shares` on ``fabrics`` where the LP value is within ``worth``
    (:func:`_worth`); None otherwise."""
    solved = ownership_shares(fabrics)
    if solved is None or solved[1] > float(worth):
        return None
    return solved


def ownership_weights(topology: Topology) -> tuple[int, ...] | None:
    """Integer root weights for an allreduce's forests (module docstring), or None where owning ``1/N`` each
    is within ``WORTH`` of them.

    Only behind switches: on a switchless fabric
    :func:`synth.synthesis.trees.split_allreduce.split_allreduce` already shares the links between the
    phases by an LP, and weights there bought nothing measured (meshes, random regular graphs) for twice the
    CPU. The LP runs on the fabric first (cheap; most fabrics stop there). Behind switches its optimum may need
    routes the runtime never takes (out of a box's NIC and back into the same box), so it runs again on the
    rank-to-rank capacities of the switch split along canonical routes (:func:`split_rank_fabric`), where
    every forest is routable: the split of one unit per root, and the split of the forests at the fabric LP's
    shares (``SPLIT_UNITS`` units per rank), the one of lower LP value kept. A split made for equal roots can
    withhold the rate owners need: with one A100's NVSwitch port at half speed (dgx-a100-2node
    ``--degrade 13:b1.nvswitch=0.5``) the equal roots' split pairs the GPUs in a ring, and its LP is 37 % above
    the fabric's, the other split's 6 %. The shares are rounded to totals that are powers of two from ``N`` to
    ``TOTAL_RANGE·N``: the least total whose reduce-scatter plus allgather forests (exact rates,
    :func:`forest_time_per_byte`) come within ``ROUNDING_SLACK`` of the LP optimum, else the fastest rounding.
    Deterministic: LPs, max-flows and exact arithmetic.
    """
    n = topology.num_ranks
    if n < 2 or not topology.switches:
        return None
    on_fabric = (integer_fabric(topology), integer_fabric(topology.reversed()))
    fabric_lp = _worth_it(on_fabric, _worth(on_fabric))
    if fabric_lp is None:
        return None
    uniform = (split_rank_fabric(topology), split_rank_fabric(topology, reverse=True))
    worth = _worth(uniform)   # against the forests of one unit per root, which trees plans on this split
    skewed = round_shares(fabric_lp[0], SPLIT_UNITS * n)
    found, fabrics = _worth_it(uniform, worth), uniform
    try:
        split = (split_rank_fabric(topology, weights=skewed),
                 split_rank_fabric(topology, reverse=True, weights=skewed))
    except SynthError:   # those forests do not split along the fixed routes: the equal roots' split stands
        split = None
    solved = None if split is None else _worth_it(split, worth)
    if solved is not None and (found is None or solved[1] < found[1] * (1 - 1e-9)):
        found, fabrics = solved, split
    if found is None:
        return None
    shares, optimum = found
    best: tuple[Fraction, tuple[int, ...]] | None = None
    total = 1 << (n - 1).bit_length()
    while total <= TOTAL_RANGE * n:
        weights = round_shares(shares, total)
        total *= 2
        value = _weighted_time_per_byte(fabrics, dict(enumerate(weights)))
        if best is None or value < best[0]:
            best = (value, weights)
        if float(value) <= optimum * (1 + ROUNDING_SLACK):
            break
    if best is None or best[0] > worth:
        return None
    common = math.gcd(*best[1])
    return tuple(w // common for w in best[1])


# ---------------------------------------------------------------------------------------------
# ownership the runtime can run: pieces that differ by a unit
# ---------------------------------------------------------------------------------------------
EVEN_UNITS = 16     # runnable ownership: at least this many units per rank (a unit more is 1/16 of a piece at most)
EVEN_LIMIT = 4096   # ... and at most this many in all (one chunk each: the loop's chunk count)
EVEN_TOTALS = 3     # ... the largest totals in that range tried, each a search of message shapes


def even_weights(n: int, total: int) -> tuple[int, ...]:
    """``total`` units over ``n`` ranks as evenly as integers allow, the larger shares spread out: rank ``r`` gets
    ``⌊(r + 1)·total / n⌋ − ⌊r·total / n⌋``, so that any run of consecutive ranks (a box of them) holds its share of
    the total to within one unit."""
    cut = [r * total // n for r in range(n + 1)]
    return tuple(cut[r + 1] - cut[r] for r in range(n))


def runnable_totals(n: int, size_bytes: float, upper: int) -> list[int]:
    """Units of ownership to try for an allreduce whose equal pieces no MSCCL runtime runs at SIZE: where no count
    of up to ``upper`` chunks per rank makes a loop (``n`` times it) that divides the buffer's elements
    (:func:`synth.collectives.runtime_divides`; a power-of-two buffer on 24 or 48 ranks), the largest
    ``EVEN_TOTALS`` totals from ``EVEN_UNITS·n`` to ``EVEN_LIMIT`` that do. Empty where equal pieces can run, or no
    total does. (1 GiB, best of them: a100x3 2048, h100x3 1024, mi250x3-ib12.5 4096.)"""
    from synth.collectives import runtime_divides

    if any(runtime_divides(n * c, size_bytes) for c in range(1, upper + 1)):
        return []
    totals = [t for t in range(EVEN_UNITS * n, EVEN_LIMIT + 1) if runtime_divides(t, size_bytes)]
    return totals[-EVEN_TOTALS:]


def reweighted(forest: Forest, weights: tuple[int, ...]) -> Forest:
    """``forest`` (one unit per root) carrying ``weights[r]`` units from root ``r`` over the same trees: each tree's
    multiplicity and route units scaled by its root's weight, so that every root's chunks split over its trees as
    before (:func:`~synth.synthesis.trees.messages.balanced_split`). Its time per byte of a unit
    (:attr:`Forest.ratio`) is the uniform forest's times the heaviest weight, an upper bound on every link's load;
    the cut bound's (:attr:`Forest.optimal`) times the least."""
    trees = tuple(replace(tree, mult=tree.mult * weights[tree.root],
                          routes=tuple(tuple((route, units * weights[tree.root]) for route, units in pool)
                                       for pool in tree.routes))
                  for tree in forest.trees)
    return replace(forest, trees=trees, weights=weights, ratio=forest.ratio * max(weights),
                   optimal=forest.optimal * min(weights))


def runnable_forests(plans: Sequence[Forest], size_bytes: float) -> Iterator[tuple[int, list[Forest]]]:
    """(total, ``plans`` :func:`reweighted` with :func:`even_weights` of it) for each of :func:`runnable_totals`
    (equal pieces of up to ``2·TUNING.max_tail_chunks`` chunks, as :func:`~synth.synthesis.trees.messages.
    runtime_chunks` looks): the forests an allreduce times with pieces the runtimes run."""
    n = plans[0].num_ranks
    for total in runnable_totals(n, size_bytes, 2 * tuning.TUNING.max_tail_chunks):
        owners = even_weights(n, total)
        yield total, [reweighted(forest, owners) for forest in plans]

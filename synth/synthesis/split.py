"""Link capacities split between an allreduce's reduce-scatter and allgather forests, for phases that
run at the same time.

Run one after the other, the two phases take ``T_RS + T_AG`` (each at its cut bound). Run together,
each link can give part of its bandwidth to each phase, and where the phases' bottlenecks differ
(a mesh corner receives in the allgather and sends in the reduce-scatter) the allreduce needs less.
The best split is a linear program (the concurrent version of the ForestColl rate, arXiv 2402.06787
§3, whose multi-root condition is Edmonds' branching theorem):

    maximise ρ  subject to  x_e + z_e ≤ B_e                                     (every link e)
      for every rank v:  a flow f_v in the fabric from a super-source s (arcs s→r of capacity ρ,
                         every rank r) to v of value N·ρ, with f_v(e) ≤ x_e;
                         a flow g_v in the reversed fabric, likewise, with g_v(e) ≤ z_e.

By max-flow/min-cut and Edmonds' theorem, ``x`` then carries an allgather forest at ``ρ`` GB/s
per root piece and ``z`` a reduce-scatter forest at the same rate: both phases move ``M`` bytes per
piece in ``M / ρ``. On a 5×5 mesh this meets the allreduce traffic bound (2(N-1)·SIZE / ΣB, the
binding bound there), 0.62× the time of the phases one after the other.

The split's shares are fractions of a link; packed into ``k`` trees per root they are rounded to
whole tree edges, phase by phase, and the forests lose rate (mesh-5x5, one tree per root: 0.92 and
0.90 of ρ). :func:`whole_tree_split` rounds both phases together instead, as an integer program
over tree edges per link (below), which keeps ρ exactly on the 5×5 mesh.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from synth.errors import SynthError, TimeLimitReached
from synth.solvers import Model, solve
from synth.synthesis.packing import short_cuts
from synth.topology.model import Link, Topology

WHOLE_SPLIT_ROUNDS = 100   # cut-generation rounds of whole_tree_split before it gives up


@dataclass(frozen=True)
class CapacitySplit:
    """``allgather`` and ``reducescatter``: the fabric with each link's share of the phase as its
    bandwidth (links without one dropped); only the shares' ratios matter to the forests planned on
    them. :func:`split_capacities` gives GB/s, :func:`whole_tree_split` tree edges per link."""
    rate_GBps: float          # ρ: per root piece, in each phase
    allgather: Topology       # the fabric with bandwidths x_e (links with x_e = 0 dropped)
    reducescatter: Topology   # ... z_e

    def time_us(self, piece_bytes: float) -> float:
        return piece_bytes / (self.rate_GBps * 1e3)


def split_capacities(topology: Topology, solver: str = "highs") -> CapacitySplit:
    """Solve the LP of the module docstring (HiGHS through :mod:`synth.solvers`)."""
    n, nodes = topology.num_ranks, topology.num_nodes
    src, dst, bw, _ = topology.arrays
    m = len(src)
    model = Model("allreduce-capacity-split")
    rho = model.add_var()
    x, z = model.add_vars(m), model.add_vars(m)
    arange = np.arange(m)
    model.add_rows(np.concatenate([arange, arange]), np.concatenate([x, z]), 1.0, np.full(m, -np.inf), bw)
    # switches stay Eulerian in each phase (in = out): edge splitting, and so the forests, need it
    switch = np.arange(n, nodes)
    for caps in (x, z):
        into, out = np.isin(dst, switch), np.isin(src, switch)
        model.add_rows(np.concatenate([dst[into] - n, src[out] - n]), np.concatenate([caps[into], caps[out]]),
                       np.concatenate([np.ones(int(into.sum())), -np.ones(int(out.sum()))]),
                       np.zeros(nodes - n), np.zeros(nodes - n))
    source = nodes   # the super-source, one past the last node
    for caps, tails, heads in ((x, src, dst), (z, dst, src)):
        arc_tail = np.concatenate([tails, np.full(n, source)])
        arc_head = np.concatenate([heads, np.arange(n)])
        head_in, tail_in = arc_head < nodes, arc_tail < nodes
        # per sink, rows over its flow's columns: link capacity, source arcs, conservation
        cap_rows, cap_vals = np.concatenate([arange, arange]), np.concatenate([np.ones(m), -np.ones(m)])
        source_rows = np.concatenate([np.arange(n), np.arange(n)])
        conserve_rows = np.concatenate([arc_head[head_in], arc_tail[tail_in]])
        conserve_vals = np.concatenate([np.ones(int(head_in.sum())), -np.ones(int(tail_in.sum())), [-float(n)]])
        for v in range(n):
            flow = model.add_vars(m + n)
            # f(e) <= the phase's capacity of link e; f(s -> r) <= ρ
            model.add_rows(cap_rows, np.concatenate([flow[:m], caps]), cap_vals, np.full(m, -np.inf), np.zeros(m))
            model.add_rows(source_rows, np.concatenate([flow[m:], np.full(n, rho)]),
                           np.concatenate([np.ones(n), -np.ones(n)]), np.full(n, -np.inf), np.zeros(n))
            # in - out = 0 at every node but v, and at least N·ρ at v
            lower, upper = np.zeros(nodes), np.zeros(nodes)
            upper[v] = np.inf
            model.add_rows(np.concatenate([conserve_rows, [v]]),
                           np.concatenate([flow[head_in], flow[tail_in], [rho]]), conserve_vals, lower, upper)
    model.set_objective([rho], [1.0], "max")
    result = solve(model, solver=solver)
    if result.status != "optimal" or result.values is None:
        raise SynthError(f"the allreduce capacity split LP ended with status {result.status} {result.message}".strip())
    values = np.asarray(result.values)
    rate = float(values[rho])
    if rate <= 0:
        raise SynthError(f"topology {topology.name}: no allreduce capacity split carries data")
    return CapacitySplit(rate, _with_bandwidths(topology, values[x]), _with_bandwidths(topology, values[z]))


def _with_bandwidths(topology: Topology, capacity: np.ndarray) -> Topology:
    """``topology`` with link ``e`` at ``capacity[e]`` GB/s; links left (almost) empty are dropped."""
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

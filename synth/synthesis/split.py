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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from synth.errors import SynthError
from synth.topology.model import Link, Topology


@dataclass(frozen=True)
class CapacitySplit:
    rate_GBps: float          # ρ: per root piece, in each phase
    allgather: Topology       # the fabric with bandwidths x_e (links with x_e = 0 dropped)
    reducescatter: Topology   # ... z_e

    def time_us(self, piece_bytes: float) -> float:
        return piece_bytes / (self.rate_GBps * 1e3)


def split_capacities(topology: Topology, solver: str = "highs") -> CapacitySplit:
    """Solve the LP of the module docstring (HiGHS through :mod:`synth.solvers`)."""
    from synth.solvers import Model, solve

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

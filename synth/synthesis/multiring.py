"""``multiring``: the classic ring algorithms over a rate-optimal set of rings.

The rings come from :func:`synth.synthesis.ringpack.best_rings`: equal-rate rings found as CP-SAT circuits at
the rank-pair cut rate (``min λ(a, b)``, which no ring packing exceeds), else at the column-generation LP's
rate. Where they reach the cut rate they are provably the best rings: on a torus, a hypercube or boxes behind
one switch layer, ``2·d`` edge-disjoint directed Hamiltonian rings fill every link, and a ring allgather over
them takes ``(N-1)/N · SIZE / Σ w`` plus one α per step: the per-rank bound, the exact allgather bound on
those fabrics (Patarasuk & Yuan, JPDC 2009; ForestColl, arXiv 2402.06787, for the cut bound). The
schedule per ring is :func:`synth.synthesis.ring.ring_schedule`'s; the greedy rings of the ``ring`` baseline
are kept instead where they carry more.
"""

from __future__ import annotations

import numpy as np

from synth.errors import SynthError
from synth.schedule import Schedule
from synth.synthesis.base import Instance, MethodSpec
from synth.synthesis.ring import Ring, find_rings, ring_schedule
from synth.synthesis.ringpack import best_rings
from synth.topology.model import Topology
from synth.topology.routes import rank_routes

SUPPORTED = frozenset({"allgather", "reducescatter", "allreduce"})


def optimal_rings(topology: Topology) -> list[Ring]:
    """The rings of :func:`best_rings` (seeded with the greedy rings), or the greedy rings where they carry
    more; SynthError when the fabric has no ring."""
    try:
        greedy = find_rings(topology)
    except SynthError:
        greedy = []
    packing = best_rings(topology, [ring.order for ring in greedy])
    if packing is None or packing.rate <= sum(ring.rate for ring in greedy) * (1 + 1e-9):
        if not greedy:
            raise SynthError(f"topology {topology.name!r}: found no ring through all {topology.num_ranks} ranks")
        return greedy
    routes = rank_routes(topology)
    n = topology.num_ranks
    return [Ring(order, tuple(tuple(routes[(order[k], order[(k + 1) % n])][1:-1]) for k in range(n)), rate)
            for order, rate in zip(packing.orders, packing.rates, strict=True)]


def synthesize(inst: Instance) -> Schedule:
    """Ring allgather / reducescatter / allreduce over :func:`optimal_rings`."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    if collective.name not in SUPPORTED:
        raise SynthError(f"multiring does not support {collective.name}")
    return ring_schedule(topology, collective, size_bytes, options, optimal_rings(topology), method="multiring")


def floor_us(inst: Instance) -> float | None:
    """No multiring program is faster than ``max over A of (D + M · c(A)) / B⁺(A)``, with ``D = (N-1)/N · SIZE``
    and ``M = N - 1`` (allgather, reducescatter) or twice both (allreduce: a reduce-scatter then an allgather on the
    same rings). ``A`` runs over the node sets of the least rank-splitting cuts
    (:func:`synth.synthesis.ringpack.ring_rate_bound`, one from the fabric's and one from its reverse's max-flow),
    ``B⁺(A)`` is the bandwidth of the links leaving ``A``, and
    ``c(A) = min b_l · α_l`` over those links of the least α a route through ``l`` pays (:func:`_route_alpha_floor`).

    Proof (the ring algorithm of Patarasuk & Yuan, JPDC 2009, as :func:`synth.synthesis.ring.ring_schedule` runs
    it): a ring of the program carries a share ``w`` of every rank's data in ``N`` pieces of ``w · SIZE / N``
    bytes, and each piece travels ``N - 1`` consecutive arcs of the ring: all but the arc into its owner (a
    reduction's partial sum the same way round). The ring visits ``A`` and its complement, so ``c ≥ 1`` of its arcs
    lead out of ``A``; a piece misses at most one of them, so the ring sends at least ``N - 1`` pieces across them
    (``N·(c-1) ≥ N`` when ``c ≥ 2``), each in a message of its own. So at least ``D`` bytes in at least ``M``
    messages cross ``A``'s out-links. Under the cost model (docs/cost-model.md) a message holds every link of its
    route for ``Σα + bytes / (least bandwidth of the route)``, so a link ``l`` leaving ``A`` that is busy until
    ``T`` carries at most ``b_l · (T - n_l · α_l)`` bytes in its ``n_l`` messages. Summed over the out-links,
    ``D ≤ B⁺(A) · T - Σ n_l · b_l · α_l ≤ B⁺(A) · T - M · c(A)``. Waiting only adds time. None for fewer than two
    ranks or collectives multiring does not serve."""
    n, name = inst.topology.num_ranks, inst.collective.name
    if n < 2 or name not in SUPPORTED:
        return None
    cuts = _least_cuts(inst.topology)
    # the least of the two cuts' bandwidths is ring_rate_bound's λ: none, and no ring crosses them
    if not cuts or min(out_bw for out_bw, _ in cuts) <= 0:
        return None
    phases = 2 if name == "allreduce" else 1
    data = phases * (n - 1) / n * float(inst.size_bytes)
    messages = phases * (n - 1)
    return max((data + messages * alpha_bytes) / (out_bw * 1e3) for out_bw, alpha_bytes in cuts)


def _least_cuts(topology: Topology) -> list[tuple[float, float]]:
    """(``B⁺(A)`` in GB/s, ``c(A)`` in bytes) for a least rank-splitting cut ``A`` of the fabric (from rank 0 to the
    rank it is weakest towards) and one of its reverse (towards rank 0): see :func:`floor_us`."""
    from synth.flows import FlowNetwork, integer_bandwidths
    from synth.lower_bounds import rooted_min_cut

    src, dst, bw, alpha = topology.arrays
    floor = _route_alpha_floor(topology)
    ints = integer_bandwidths(bw).ints
    cuts = []
    for reverse in (False, True):
        tails, heads = (dst, src) if reverse else (src, dst)
        _, weakest = rooted_min_cut(topology.reversed() if reverse else topology, 0)
        if weakest == 0:
            continue
        _, side = FlowNetwork(topology.num_nodes, tails, heads, ints).flow(0, weakest)
        inside = ~side if reverse else side   # the reverse's source side is where the fabric's cut ends
        leaving = inside[src] & ~inside[dst]
        per_byte = bw[leaving] * floor[leaving] * 1e3   # GB/s x µs = kB
        usable = np.isfinite(per_byte)
        cuts.append((float(bw[leaving].sum()), float(per_byte[usable].min()) if usable.any() else 0.0))
    return cuts


def _route_alpha_floor(topology: Topology) -> np.ndarray:
    """Per link ``(u, v)``, the least ``Σα`` of a rank-to-rank route through it (a path whose inner nodes are all
    switches): the least α from a rank to ``u`` through switches, plus the link's, plus the least from ``v`` to a
    rank; ``inf`` for a link on no such route."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    src, dst, _, alpha = topology.arrays
    n, nodes = topology.num_ranks, topology.num_nodes

    def from_ranks(tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
        # one source node (index ``nodes``) joined to every switch a rank's link enters, then switch to switch
        into_switch = (tails < n) & (heads >= n)
        between = (tails >= n) & (heads >= n)
        rows = np.concatenate([np.full(into_switch.sum(), nodes), tails[between]])
        cols = np.concatenate([heads[into_switch], heads[between]])
        # a zero-α link still counts as an edge (csgraph drops explicit zeros): shift by a tiny amount, then round
        weights = np.concatenate([alpha[into_switch], alpha[between]]) + 1e-12
        # parallel edges (every rank into one switch): the least α of each pair (a sparse matrix would add them)
        order = np.lexsort((weights, cols, rows))
        rows, cols, weights = rows[order], cols[order], weights[order]
        first = np.ones(len(rows), dtype=bool)
        first[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        graph = csr_matrix((weights[first], (rows[first], cols[first])), shape=(nodes + 1, nodes + 1))
        dist = dijkstra(graph, indices=nodes, min_only=True)[:nodes]
        dist[:n] = 0.0
        return np.where(np.isfinite(dist), np.maximum(dist - 1e-9, 0.0), np.inf)

    reach = from_ranks(src, dst)       # least α from some rank to each node
    leave = from_ranks(dst, src)       # least α from each node to some rank (the reversed links)
    return reach[src] + alpha + leave[dst]


METHOD = MethodSpec(
    name="multiring",
    run=synthesize,
    collectives=SUPPORTED,
    description="rings of the highest total rate (CP-SAT circuits at the rank-pair cut, column-generation LP)",
    floor_us=floor_us,
)

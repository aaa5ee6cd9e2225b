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


METHOD = MethodSpec(
    name="multiring",
    run=synthesize,
    collectives=SUPPORTED,
    description="rings of the highest total rate (CP-SAT circuits at the rank-pair cut, column-generation LP)",
)

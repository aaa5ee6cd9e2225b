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
from synth.synthesis.ringpack import best_rings, ring_rate_bound
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
    """No multiring program is faster than ``(N-1)/N · SIZE / λ`` (allgather, reducescatter) or twice that
    (allreduce: a reduce-scatter then an allgather on the same rings), ``λ`` = :func:`ring_rate_bound`, the
    least out-capacity ``B⁺(A)`` over node sets ``A`` that hold some ranks but not all.

    Proof (the ring algorithm of Patarasuk & Yuan, JPDC 2009, as :func:`synth.synthesis.ring.ring_schedule` runs
    it): take a set ``A`` with ``B⁺(A) = λ``. A ring of the program carries a share ``w`` of every rank's data in
    ``N`` pieces of ``w · SIZE / N`` bytes, and each piece travels ``N - 1`` consecutive arcs of the ring: all
    but the arc into its owner (a reduction's partial sum the same way round). The ring visits ``A`` and its
    complement, so ``c ≥ 1`` of its arcs lead out of ``A``; a piece misses at most one of them, so the ring
    sends at least ``N - 1`` pieces across them (``N·(c-1) ≥ N`` when ``c ≥ 2``). Each such arc's route leaves
    ``A`` through a link of ``B⁺(A)``, so the rings move at least ``(N-1)/N · SIZE`` bytes (twice that for
    allreduce) over links of total bandwidth ``λ``. α and waiting only add time (docs/cost-model.md). None for
    fewer than two ranks or collectives multiring does not serve."""
    n, name = inst.topology.num_ranks, inst.collective.name
    if n < 2 or name not in SUPPORTED:
        return None
    rate = ring_rate_bound(inst.topology)
    if rate <= 0:
        return None
    phases = 2 if name == "allreduce" else 1
    return phases * (n - 1) / n * float(inst.size_bytes) / (rate * 1e3)


METHOD = MethodSpec(
    name="multiring",
    run=synthesize,
    collectives=SUPPORTED,
    description="rings of the highest total rate (CP-SAT circuits at the rank-pair cut, column-generation LP)",
    floor_us=floor_us,
)

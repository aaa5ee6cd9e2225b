"""``auto``: which registered methods are worth trying for a (topology, collective, size).

The pipeline runs every candidate, verifies and simulates each result, and keeps the fastest. The
rule here only decides which methods are cheap enough to try: each method may add a predicate to
``RULES`` (name -> function(topology, collective, size_bytes) -> bool). A registered method with no
rule is not tried by ``auto`` (only on explicit ``-m NAME``); ``ring`` is always tried, so auto has a
verified fallback everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

from synth.collectives import Collective
from synth.synthesis.registry import METHODS
from synth.topology.model import Topology

Rule = Callable[[Topology, Collective, float], bool]


def _always(topology: Topology, collective: Collective, size_bytes: float) -> bool:
    return True


def _bandwidth_bound(topology: Topology, collective: Collective, size_bytes: float) -> bool:
    """``trees`` (throughput-optimal, ForestColl): worth it once every rank's piece is large enough
    that bandwidth dominates α (>= 256 KiB per pipelined piece) and the exact packing stays fast."""
    pieces = topology.num_ranks if collective.name in ("allgather", "reducescatter", "allreduce") else 1
    return size_bytes / pieces >= 256 * 1024 and topology.num_ranks <= 256


def _latency_bound(topology: Topology, collective: Collective, size_bytes: float) -> bool:
    """Baselines with log-depth schedules (``dbt``, ``rdh``) win at latency-bound sizes (<= 16 MiB)."""
    return size_bytes <= 16 * 2**20


def _direct(topology: Topology, collective: Collective, size_bytes: float) -> bool:
    """All-pairs: alltoall at any size (the natural pattern), allgather at latency-bound sizes."""
    return collective.name == "alltoall" or size_bytes <= 16 * 2**20


def _multi_box(topology: Topology, collective: Collective, size_bytes: float) -> bool:
    """``hierarchical`` needs boxes (``machines``) to split the fabric into intra- and inter-box rings."""
    return len(topology.machines) >= 2


RULES: dict[str, Rule] = {
    "ring": _always,
    "trees": _bandwidth_bound,
    "dbt": _latency_bound,
    "rdh": _latency_bound,
    "direct": _direct,
    "hierarchical": _multi_box,
}


def candidates(topology: Topology, collective: Collective, size_bytes: float) -> list[str]:
    """Registered methods that support the collective and whose auto rule accepts this instance."""
    out = []
    for name in METHODS:
        rule = RULES.get(name)
        if rule is None or collective.name not in METHODS[name].collectives:
            continue
        if rule(topology, collective, size_bytes):
            out.append(name)
    return out

"""Topology IR: ranks, switches, and directed α-β links (plain data).

Node ids are dense integers: ranks are ``0..num_ranks-1`` and switch ``k`` is ``num_ranks + k``.
Links are directed and merged: parallel entries of a file add their bandwidth (docs/topology.md).
A switch forwards; one that declares :class:`SwitchFeatures` may also reduce or multicast in the
network (NVLS, SHARP).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Link:
    """One direction of a link: ``bw`` in GB/s, ``alpha`` in µs."""

    src: int
    dst: int
    bw: float
    alpha: float = 0.0


@dataclass(frozen=True)
class SwitchFeatures:
    """What a switch does besides forwarding (docs/topology.md, "In-network reduction").

    ``reduce``: it sums the messages its members send it for one reduction and sends the result on
    (NVSwitch NVLS multimem, InfiniBand SHARP), paying ``reduce_alpha`` µs once per reduction and moving
    at most ``reduce_bw`` GB/s through its reduction engine. ``multicast``: one message in, a copy out on
    every link named by the operation.
    """

    reduce: bool = False
    multicast: bool = False
    reduce_alpha: float = 0.0
    reduce_bw: float = math.inf

    @property
    def plain(self) -> bool:
        return not (self.reduce or self.multicast)


NO_FEATURES = SwitchFeatures()


@dataclass(frozen=True)
class Topology:
    name: str
    num_ranks: int
    links: tuple[Link, ...]
    switches: tuple[str, ...] = ()
    machines: tuple[tuple[int, ...], ...] = ()
    description: str = ""
    # In-network features by switch name; only switches that do more than forward are listed.
    features: tuple[tuple[str, SwitchFeatures], ...] = ()
    # Provenance only (not part of equality): the file it came from.
    source: str | None = field(default=None, compare=False)
    # The fabric as the file wrote it where planes of one switch were joined on load (checks.join_parallel_switches):
    # its switch names, links and bandwidths are what --exclude-link and --degrade name (synth.topology.degrade).
    as_written: Topology | None = field(default=None, compare=False, repr=False)

    @property
    def num_nodes(self) -> int:
        return self.num_ranks + len(self.switches)

    @property
    def ranks(self) -> range:
        return range(self.num_ranks)

    def is_rank(self, node: int) -> bool:
        return 0 <= node < self.num_ranks

    def is_switch(self, node: int) -> bool:
        return self.num_ranks <= node < self.num_nodes

    def switch_features(self, node: int) -> SwitchFeatures:
        """The in-network features of switch ``node`` (plain forwarding for a rank or an undeclared switch)."""
        if not self.is_switch(node):
            return NO_FEATURES
        return self._features_by_name.get(self.switches[node - self.num_ranks], NO_FEATURES)

    @cached_property
    def _features_by_name(self) -> dict[str, SwitchFeatures]:
        return dict(self.features)

    @property
    def in_network_switches(self) -> tuple[int, ...]:
        """Node ids, ascending, of the switches that reduce or multicast in the network."""
        return tuple(sorted(self.node_id(name) for name, f in self.features if not f.plain))

    @property
    def reducing_switches(self) -> tuple[int, ...]:
        """Node ids of the switches that can reduce in the network."""
        return tuple(self.node_id(name) for name, f in self.features if f.reduce)

    def node_name(self, node: int) -> int | str:
        """The file-level name: the rank integer or the switch name."""
        return node if self.is_rank(node) else self.switches[node - self.num_ranks]

    def node_id(self, name: int | str) -> int:
        """Inverse of :meth:`node_name`; raises KeyError for unknown nodes."""
        if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
            if 0 <= int(name) < self.num_ranks:
                return int(name)
            raise KeyError(name)
        return self.num_ranks + self.switches.index(str(name)) if name in self.switches else _raise(name)

    @cached_property
    def sha256(self) -> str:
        """Content hash of the fabric (hex): what a program was made for (docs/topology.md, "Identity").

        SHA-256 of the UTF-8 compact JSON ``{"format": "synth-fabric/1", "ranks": N, "switches": [names],
        "links": [[src, dst, bw, alpha], ...]}`` with node ids as in this model, ``bw``/``alpha`` as floats and
        links sorted by ``(src, dst)``. The name, description, ``machines`` and ``source`` are left out: they
        do not change how long any transfer takes, and a renamed copy is the same fabric.
        """
        links = sorted((link.src, link.dst, float(link.bw), float(link.alpha)) for link in self.links)
        doc = {"format": "synth-fabric/1", "ranks": self.num_ranks, "switches": list(self.switches),
               "links": [list(link) for link in links]}
        if self.features:  # only then: a fabric without in-network features keeps its hash
            doc["features"] = {name: [f.reduce, f.multicast, float(f.reduce_alpha),
                                      f.reduce_bw if math.isfinite(f.reduce_bw) else None]
                               for name, f in sorted(self.features)}
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @cached_property
    def link_map(self) -> dict[tuple[int, int], Link]:
        return {(link.src, link.dst): link for link in self.links}

    def link(self, src: int, dst: int) -> Link | None:
        return self.link_map.get((src, dst))

    @cached_property
    def out_links(self) -> tuple[tuple[Link, ...], ...]:
        out: list[list[Link]] = [[] for _ in range(self.num_nodes)]
        for link in self.links:
            out[link.src].append(link)
        return tuple(tuple(x) for x in out)

    @cached_property
    def in_links(self) -> tuple[tuple[Link, ...], ...]:
        inc: list[list[Link]] = [[] for _ in range(self.num_nodes)]
        for link in self.links:
            inc[link.dst].append(link)
        return tuple(tuple(x) for x in inc)

    def out_bw(self, node: int) -> float:
        return float(sum(link.bw for link in self.out_links[node]))

    def in_bw(self, node: int) -> float:
        return float(sum(link.bw for link in self.in_links[node]))

    @cached_property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, bw, alpha) as numpy arrays, one entry per directed link."""
        src = np.fromiter((link.src for link in self.links), dtype=np.int64, count=len(self.links))
        dst = np.fromiter((link.dst for link in self.links), dtype=np.int64, count=len(self.links))
        bw = np.fromiter((link.bw for link in self.links), dtype=np.float64, count=len(self.links))
        alpha = np.fromiter((link.alpha for link in self.links), dtype=np.float64, count=len(self.links))
        return src, dst, bw, alpha

    def to_networkx(self):
        """A networkx DiGraph with edge attributes ``bw`` and ``alpha`` and node attribute ``switch``."""
        import networkx as nx

        graph = nx.DiGraph(name=self.name)
        for node in range(self.num_nodes):
            graph.add_node(node, switch=self.is_switch(node), label=self.node_name(node))
        for link in self.links:
            graph.add_edge(link.src, link.dst, bw=link.bw, alpha=link.alpha)
        return graph

    def csr_bandwidth(self):
        """scipy CSR matrix of bandwidths (GB/s), for max-flow and shortest paths at scale."""
        from scipy.sparse import csr_matrix

        src, dst, bw, _ = self.arrays
        return csr_matrix((bw, (src, dst)), shape=(self.num_nodes, self.num_nodes))

    def circuit_capacities(self) -> Topology:
        """The same fabric with each link's bandwidth capped at the widest rank-to-rank path through it.

        Under the cost model of docs/cost-model.md a transfer holds every link of its route and moves at the
        route's smallest bandwidth, and a link carries one transfer at a time. So link ``(u, v)`` never moves
        data faster than ``min(b_uv, W_in(u), W_out(v))``, with ``W_in(u)`` the largest bottleneck of a path
        from any rank to ``u`` and ``W_out(v)`` from ``v`` to any rank (both unbounded at a rank). A switch
        that reduces or multicasts (:class:`SwitchFeatures`) ends the transfers into it and starts those of
        what it sends on, so it counts as an end like a rank. Capping ``b_uv`` there leaves every route's
        smallest bandwidth, hence every transfer's duration, as it was: programs, the simulator and the
        verifier cannot tell the two fabrics apart, and a fluid bound on the capped one is a valid, tighter
        bound on the original (a 200 GB/s leaf uplink fed by 50 GB/s rank links moves at most 50 GB/s).
        Returns ``self`` where nothing is capped; links no rank-to-rank path crosses keep their bandwidth.
        """
        into = _widest_from_ranks(self, incoming=True)
        out_of = _widest_from_ranks(self, incoming=False)
        links = []
        for link in self.links:
            cap = min(into[link.src], out_of[link.dst])
            links.append(Link(link.src, link.dst, cap, link.alpha) if 0 < cap < link.bw else link)
        if all(new is old for new, old in zip(links, self.links)):
            return self
        return Topology(name=self.name, num_ranks=self.num_ranks, links=tuple(links), switches=self.switches,
                        machines=self.machines, description=self.description, features=self.features,
                        source=self.source)

    def reversed(self) -> Topology:
        """The same fabric with every link turned around (reducescatter is allgather reversed)."""
        return Topology(
            name=self.name,
            num_ranks=self.num_ranks,
            links=tuple(Link(link.dst, link.src, link.bw, link.alpha) for link in self.links),
            switches=self.switches,
            machines=self.machines,
            description=self.description,
            features=self.features,
            source=self.source,
        )


def _widest_from_ranks(topology: Topology, incoming: bool) -> list[float]:
    """Per node, the largest bottleneck bandwidth of a path from any rank to it (``incoming``) or
    from it to any rank; ``inf`` at ranks, which start and end every path, and at in-network switches,
    which start and end transfers too."""
    return widest_paths(topology, [*topology.ranks, *topology.in_network_switches], incoming)


def widest_paths(topology: Topology, ends, incoming: bool) -> list[float]:
    """Per node, the largest bottleneck bandwidth of a path from any node of ``ends`` to it (``incoming``) or
    from it to any of them; ``inf`` at ``ends``. Paths may pass any node. Max-min Dijkstra."""
    import heapq

    width = [0.0] * topology.num_nodes
    for v in ends:
        width[v] = math.inf
    heap = [(-math.inf, v) for v in ends]
    done = [False] * topology.num_nodes
    while heap:
        negative, u = heapq.heappop(heap)
        if done[u]:
            continue
        done[u] = True
        links = topology.out_links[u] if incoming else topology.in_links[u]
        for link in links:
            v = link.dst if incoming else link.src
            cand = min(-negative, link.bw)
            if cand > width[v]:
                width[v] = cand
                heapq.heappush(heap, (-cand, v))
    return width


def _raise(name: object) -> int:
    raise KeyError(name)

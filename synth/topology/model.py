"""Topology IR: ranks, forwarding-only switches, and directed α-β links (plain data).

Node ids are dense integers: ranks are ``0..num_ranks-1`` and switch ``k`` is ``num_ranks + k``.
Links are directed and merged: parallel entries of a file add their bandwidth (SPEC).
"""

from __future__ import annotations

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
class Topology:
    name: str
    num_ranks: int
    links: tuple[Link, ...]
    switches: tuple[str, ...] = ()
    machines: tuple[tuple[int, ...], ...] = ()
    description: str = ""
    # Provenance only (not part of equality): the file it came from.
    source: str | None = field(default=None, compare=False)

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

    def reversed(self) -> Topology:
        """The same fabric with every link turned around (reducescatter is allgather reversed)."""
        return Topology(
            name=self.name,
            num_ranks=self.num_ranks,
            links=tuple(Link(link.dst, link.src, link.bw, link.alpha) for link in self.links),
            switches=self.switches,
            machines=self.machines,
            description=self.description,
            source=self.source,
        )


def _raise(name: object) -> int:
    raise KeyError(name)

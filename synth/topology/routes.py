"""The path a rank-to-rank send takes through the fabric (shared by the methods and the simulator's rule).

An MSCCL program names peers, not routes; the runtime's transport to a peer is fixed. synth models it
as: the direct link when there is one, else the switch-only path with the fewest hops, then the least
Σα, then the smallest node ids (the rule :mod:`synth.simulate` applies too). Ranks never forward here.
"""

from __future__ import annotations

import heapq

from synth.topology.model import Topology

Path = tuple[int, ...]


def rank_routes(topology: Topology) -> dict[tuple[int, int], Path]:
    """(src rank, dst rank) -> node path (src, switches..., dst) for every pair a switch-only path joins."""
    adjacency = [sorted((link.dst, link.alpha) for link in topology.out_links[node])
                 for node in range(topology.num_nodes)]
    routes: dict[tuple[int, int], Path] = {}
    for src in topology.ranks:
        best: dict[int, tuple[int, float]] = {src: (0, 0.0)}
        path: dict[int, Path] = {src: (src,)}
        heap = [(0, 0.0, src)]
        done: set[int] = set()
        while heap:
            hops, alpha, node = heapq.heappop(heap)
            if node in done:
                continue
            done.add(node)
            if node != src and topology.is_rank(node):
                continue  # ranks are endpoints, never forwarders
            for nxt, link_alpha in adjacency[node]:
                cand = (hops + 1, alpha + link_alpha)
                if nxt not in best or cand < best[nxt]:
                    best[nxt] = cand
                    path[nxt] = path[node] + (nxt,)
                    heapq.heappush(heap, (cand[0], cand[1], nxt))
        for dst, route in path.items():
            if dst != src and topology.is_rank(dst):
                routes[(src, dst)] = (src, dst) if topology.link(src, dst) is not None else route
    return routes

"""The path a rank-to-rank send takes through the fabric (shared by the methods and the simulator's rule).

An MSCCL program names peers, not routes; the runtime's transport to a peer is fixed. synth models it
as: the direct link when there is one, else a switch-only path with the fewest hops, then the widest (its
narrowest link the widest, as a runtime takes NVLink over a PCIe switch between the same two GPUs), then the
least Σα. Where several such paths tie (several spines of a fat tree), the destination picks one, as the
destination-mod-k routing of fat-tree subnet managers does (Zahavi, "D-Mod-K Routing Providing
Non-Blocking Traffic for Shift Permutations on Real Life Fat Trees", 2010; OpenSM's ftree): walking
back from ``dst``, each node with ``m`` equal-cost predecessors (in id order) takes the one the next digit
of ``dst`` in radix ``m`` names: ``dst mod m`` at the first such node, ``⌊dst / m⌋ mod m'`` at the next.
So the sends into different ranks spread over the spines, and over every core of a three-level fat tree,
instead of all taking the first.
Ranks never forward here. :mod:`synth.simulation` and :func:`synth.synthesis.scale.switch_route`
apply the same rule.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from synth.gcpause import gc_paused
from synth.topology.model import Topology

Path = tuple[int, ...]
ALPHA_TOLERANCE = 1e-9   # Σα that differ by rounding only tie


def switch_predecessors(topology: Topology, src: int, through_ranks: bool = False,
                        min_bw: float = 0.0) -> dict[int, list[int]]:
    """Per node reachable from rank ``src`` over switches only (``through_ranks``: over other ranks
    too; ``min_bw``: over links of at least that bandwidth only): its predecessors on the paths with the
    fewest hops, then the least Σα (every one of them where several tie), in id order."""
    return _least_alpha(topology, src, through_ranks, min_bw)[0]


def _least_alpha(topology: Topology, src: int, through_ranks: bool,
                 min_bw: float) -> tuple[dict[int, list[int]], dict[int, float], dict[int, float]]:
    """(:func:`switch_predecessors`; per node the widest narrowest link over its fewest-hop paths; per node the
    narrowest link over its least-α tie paths), in one search: hops come first in the labels, so every node of a
    layer is settled before the next, and its predecessors before it."""
    best: dict[int, tuple[int, float]] = {src: (0, 0.0)}
    preds: dict[int, list[int]] = {src: []}
    widest = {src: math.inf}
    narrowest = {src: math.inf}
    heap = [(0, 0.0, src)]
    done: set[int] = set()
    while heap:
        hops, alpha, node = heapq.heappop(heap)
        if node in done:
            continue
        done.add(node)
        if node != src:
            narrowest[node] = min(min(narrowest[u], topology.link(u, node).bw) for u in preds[node])
        if node != src and topology.is_rank(node) and not through_ranks:
            continue  # ranks are endpoints, never forwarders
        for link in topology.out_links[node]:
            if link.bw < min_bw:
                continue
            cand = (hops + 1, alpha + link.alpha)
            old = best.get(link.dst)
            reach = min(widest[node], link.bw)
            if old is None or cand[0] < old[0]:
                widest[link.dst] = reach
            elif cand[0] == old[0]:
                widest[link.dst] = max(widest[link.dst], reach)
            if old is None or cand[0] < old[0] or (cand[0] == old[0] and cand[1] < old[1] - ALPHA_TOLERANCE):
                best[link.dst] = cand
                preds[link.dst] = [node]
                heapq.heappush(heap, (cand[0], cand[1], link.dst))
            elif cand[0] == old[0] and cand[1] <= old[1] + ALPHA_TOLERANCE:
                preds[link.dst].append(node)   # hops grow by one per link: all ties come before dst pops
    for options in preds.values():
        options.sort()
    return preds, widest, narrowest


class SourceRoutes:
    """The paths sends from rank ``src`` take by the module's rule, over switches only (``through_ranks``: over
    other ranks too), found once per source and picked per destination on demand (:meth:`path`; not the direct
    link: callers take that first). The least-α paths (:func:`switch_predecessors`) serve every rank they reach at
    its widest width over the fewest hops; for a rank that some of them reach narrower, the paths are searched
    again over the links at least that wide."""

    def __init__(self, topology: Topology, src: int, through_ranks: bool = False) -> None:
        self.topology, self.src, self.through_ranks = topology, src, through_ranks
        self.preds, self.widest, self.narrowest = _least_alpha(topology, src, through_ranks, 0.0)
        self._by_width: dict[float, dict[int, list[int]]] = {}

    def ranks(self) -> list[int]:
        """The other ranks a path reaches."""
        return [v for v in self.preds if v != self.src and self.topology.is_rank(v)]

    def path(self, dst: int) -> Path | None:
        if dst == self.src or dst not in self.preds:
            return None
        need = self.widest[dst]
        if self.narrowest[dst] >= need:
            return pick_path(self.src, dst, self.preds.__getitem__)
        preds = self._by_width.get(need)
        if preds is None:
            preds = self._by_width[need] = switch_predecessors(self.topology, self.src, self.through_ranks, need)
        return pick_path(self.src, dst, preds.__getitem__)


def pick_path(src: int, dst: int, predecessors: Callable[[int], list[int]]) -> Path:
    """The path from ``src`` to ``dst`` that the module's rule picks: back from ``dst``, at every node with ``m``
    equal-cost ``predecessors`` (none at the source) the next digit of ``dst`` in radix ``m``: ``dst mod m₁`` at
    the first tie, ``⌊dst / m₁⌋ mod m₂`` at the next, and so on (Zahavi's D-mod-k; with one digit for every level,
    the destinations under one switch spread over every core of a three-level fat tree, not only over the cores
    whose index repeats the first digit).

    A tie among ``dst``'s own links in (a GPU with two NICs, one per plane) takes ``(src + dst) mod m₁`` instead:
    with ``dst`` alone every sender would reach ``dst`` through the same NIC, and its others would idle; with the
    sum the senders of one ``dst``, and the receivers of one ``src``, spread over the planes."""
    path = [dst]
    digits = dst
    options = predecessors(dst)
    while options:
        shift = src if len(path) == 1 else 0   # the tie at dst itself
        path.append(options[(digits + shift) % len(options)])
        digits //= len(options)
        options = predecessors(path[-1])
    return tuple(reversed(path))


def rank_routes(topology: Topology) -> dict[tuple[int, int], Path]:
    """(src rank, dst rank) -> node path (src, switches..., dst) for every pair a switch-only path joins."""
    routes: dict[tuple[int, int], Path] = {}
    with gc_paused():   # N^2 tuples that form no cycles: collector passes made 2048 ranks take 11x 1024's time
        for src in topology.ranks:
            found = SourceRoutes(topology, src)
            for dst in found.ranks():
                routes[(src, dst)] = (src, dst) if topology.link(src, dst) is not None else found.path(dst)
    return routes


class LazyRoutes(Mapping[tuple[int, int], tuple[int, ...]]):
    """:func:`synth.topology.routes.rank_routes` computed per source on first use: the same paths (the direct
    link, else the switch-only path that ``pick_path`` picks), for the few pairs a two-level ring uses. A
    1024-rank leaf-spine has about a million rank pairs; routing them all took 18 of 44 s of profiled CPU."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._from: dict[int, SourceRoutes] = {}
        self._paths: dict[tuple[int, int], tuple[int, ...]] = {}

    def __getitem__(self, pair: tuple[int, int]) -> tuple[int, ...]:
        path = self._paths.get(pair)
        if path is not None:
            return path
        src, dst = pair
        topo = self.topology
        if src == dst or not (topo.is_rank(src) and topo.is_rank(dst)):
            raise KeyError(pair)
        if topo.link(src, dst) is not None:
            path = (src, dst)
        else:
            found = self._from.get(src)
            if found is None:
                found = self._from[src] = SourceRoutes(topo, src)
            path = found.path(dst)
            if path is None:
                raise KeyError(pair)
        self._paths[pair] = path
        return path

    def __iter__(self) -> Iterator[tuple[int, int]]:
        n = self.topology.num_ranks
        return iter([(a, b) for a in range(n) for b in range(n) if (a, b) in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class RuntimePaths:
    """The node path of a send from rank ``src`` to rank ``dst`` under the module's rule: the direct link,
    else the switch-only path, else (a foreign program on a sparse fabric) the same rule across ranks,
    which only forward. Predecessors are computed once per source and kind. The simulator times sends
    on these paths, and lp's alltoall plans on them where its LP would be too large."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._from: dict[tuple[int, bool], SourceRoutes] = {}

    def path(self, src: int, dst: int) -> Path | None:
        """(src, nodes..., dst), or None where no path joins them (or ``src == dst``)."""
        if src == dst:
            return None
        if self.topology.link(src, dst) is not None:
            return (src, dst)
        for through_ranks in (False, True):
            found = self._from.get((src, through_ranks))
            if found is None:
                found = self._from[(src, through_ranks)] = SourceRoutes(self.topology, src, through_ranks)
            path = found.path(dst)
            if path is not None:
                return path
        return None


def longest_switch_route(topology: Topology) -> int:
    """The most switches on any rank-to-rank route of :func:`rank_routes` (0 without switches).

    One BFS over the switches per set of entry switches (ranks of a box share theirs), so it is cheap
    where :func:`rank_routes` would not be: it bounds what methods that enumerate a route's sub-paths pay.
    """
    from collections import deque

    n = topology.num_ranks
    if not topology.switches:
        return 0
    entries: dict[frozenset[int], None] = {}
    for rank in topology.ranks:
        entry = frozenset(link.dst for link in topology.out_links[rank] if topology.is_switch(link.dst))
        if entry:
            entries[entry] = None
    # each set of exit switches once (ranks behind one switch share theirs), and each switch's switch neighbours
    # read once rather than per BFS (512 DGX A100 boxes: 4096 BFS, each through the IB switches' 2048 links)
    exits = list(dict.fromkeys(tuple(sorted(link.src for link in topology.in_links[rank]
                                            if topology.is_switch(link.src))) for rank in topology.ranks))
    onward = {x: [link.dst for link in topology.out_links[x] if link.dst >= n] for x in range(n, topology.num_nodes)}
    longest = 0
    for entry in entries:
        depth = dict.fromkeys(entry, 1)     # switches on the path so far
        queue = deque(entry)
        while queue:
            node = queue.popleft()
            for nxt in onward[node]:
                if nxt not in depth:
                    depth[nxt] = depth[node] + 1
                    queue.append(nxt)
        for switches in exits:
            reached = [depth[s] for s in switches if s in depth]
            if reached:
                longest = max(longest, min(reached))
    return longest


ROUTE_CAP_MAX_RANKS = 512   # all N² routes: 1.3 s at 512 ranks; larger fabrics plan on circuit capacities only


def route_capacities(topology: Topology) -> Topology:
    """The fabric with each link that touches a switch capped at the widest *route* through it, and the links no
    route crosses left out.

    Refines :meth:`Topology.circuit_capacities`, which caps a link at the widest path from any rank, to the
    paths rank-to-rank sends take (the module's rule). Under docs/cost-model.md a transfer moves at its
    route's smallest bandwidth and holds every link of the route, one transfer per link at a time, so link
    ``e`` moves at most ``max over routes R through e of min_{f ∈ R} b_f`` bytes per second. A 50 GB/s
    H100 NIC link whose routes all lead to 25 GB/s MI250 NICs is therefore a 25 GB/s link: the widest
    *path* into it comes from an H100 GPU, but no H100 GPU sends to another through the IB switch, since
    the box's NVSwitch is its route. Every route keeps its smallest bandwidth, so no transfer's duration
    changes; what the methods plan with becomes what the simulator times.

    The routes are every path the simulator times a send on (:func:`_send_paths`), those a foreign program's
    sends take across other ranks included, so no link is capped below a transfer that can run on it: a fluid
    bound on the capped fabric holds for every program (the bounds, :func:`synth.lower_bounds.compute_bounds`,
    work on it), since link ``e`` carries one transfer at a time, none faster than ``cap(e)``, and so moves at
    most ``cap(e)·T`` bytes in time ``T``. Four switches in a ring, one rank on each, 50 GB/s between them: each
    rank's 300 GB/s port carries only 50 GB/s circuits, so the allgather takes twice the fluid cut's time.

    A link on no route (the maximum over an empty set) moves nothing, whatever its bandwidth: sixteen GPUs on
    one NVLink switch, each also linked to two NICs it shares with a neighbour, send to each other over the
    switch (fewer hops, then wider), so the NIC links carry no transfer and the allgather's per-rank cut is the
    900 GB/s switch port alone, not 1000 GB/s. Such links are left out only where that leaves every send's path
    as it was (a link removed from a tie of equal-cost paths no send took could move the destination-mod-k
    pick of the others); elsewhere they keep their bandwidth. Not on fabrics with in-network switches (they
    end and start transfers), nor beyond ``ROUTE_CAP_MAX_RANKS`` ranks.
    """
    if not topology.switches or topology.in_network_switches or topology.num_ranks > ROUTE_CAP_MAX_RANKS:
        return topology
    bandwidth = {(link.src, link.dst): link.bw for link in topology.links}
    paths = {(path[0], path[-1]): path for path in _send_paths(topology)}
    widest: dict[tuple[int, int], float] = {}
    for path in paths.values():
        arcs = list(zip(path, path[1:]))
        bottleneck = min(bandwidth[arc] for arc in arcs)
        for arc in arcs:
            if widest.get(arc, 0.0) < bottleneck:
                widest[arc] = bottleneck
    capped = [replace(link, bw=widest[(link.src, link.dst)]) if widest.get((link.src, link.dst), link.bw) < link.bw
              else link for link in topology.links]
    if len(widest) < len(capped):
        trimmed = replace(topology, links=tuple(link for link in capped if (link.src, link.dst) in widest))
        if {(path[0], path[-1]): path for path in _send_paths(trimmed)} == paths:
            return trimmed
    if all(new is old for new, old in zip(capped, topology.links)):
        return topology
    return replace(topology, links=tuple(capped))


def _send_paths(topology: Topology) -> Iterator[Path]:
    """Every path the simulator times a send on: those of :func:`rank_routes`, and for the pairs no switch-only
    path joins, the one :class:`RuntimePaths` takes across ranks (methods never send there; a foreign program may,
    and without those paths a link that only they widen would be capped below them)."""
    routes = rank_routes(topology)
    yield from routes.values()
    if len(routes) < topology.num_ranks * (topology.num_ranks - 1):
        runtime = RuntimePaths(topology)
        for src in topology.ranks:
            for dst in topology.ranks:
                if src != dst and (src, dst) not in routes:
                    path = runtime.path(src, dst)
                    if path is not None:
                        yield path

"""Rounds of disjoint circuits behind switches: bipartite edge colouring of the transfers a switch carries.

Under the cost model (docs/cost-model.md) a transfer through switches holds every link of its route, so two
transfers that meet at a port cannot overlap. A list scheduler that books circuits greedily leaves ports idle while
it waits for the far end (dgx-a100-4node alltoall: NIC links busy 79 % of the time). A switch serves
traffic without such waits when it runs in *rounds*, each a set of transfers that share no port: the
Birkhoff–von Neumann schedule of an input-queued crossbar (Chang, Chen and Huang, "Birkhoff-von
Neumann input buffered crossbar switches", INFOCOM 2000). With equal transfers, one per chunk, the
rounds are the colours of a proper edge colouring of the bipartite multigraph (sending port ->
receiving port), and by König's edge-colouring theorem (1916; Schrijver, *Combinatorial
Optimization*, Thm. 20.1) ``Δ`` colours suffice, ``Δ`` the most transfers at one port: the rounds
then take exactly the busiest port's time, the bound of a switch. Where links inside the switches
are shared as well (a fat tree's spines) the conflicts are no longer bipartite, and rounds are taken
greedily in pipeline order.

:func:`circuit_rounds` colours the slowest switch hop of every chunk's path (its bottleneck) and
places the path's other hops one round earlier per hop before it and one round later per hop after
it (relays through a fast switch feed the next round while this one runs). :func:`ordered_schedule`
then times the transfers with every link taking its transfers strictly in round order, as the
runtime does with a threadblock's steps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np


def edge_colouring(edges: Sequence[tuple[Hashable, Hashable]]) -> list[int]:
    """A proper edge colouring of a bipartite multigraph (``edges``: (left node, right node)) with
    ``Δ`` colours, ``Δ`` its largest degree: König's alternating-path construction. Each edge takes
    the least colour ``a`` free at its left end; if ``a`` is taken at its right end, the path from
    the right end alternating ``a`` and ``b`` (a colour free there) has ``a`` and ``b`` swapped first.
    The path never reaches the left end (bipartite), so ``a`` stays free there. ``O(E·V)``."""
    at: dict[tuple[int, Hashable], dict[int, int]] = defaultdict(dict)   # node -> colour -> edge
    colour = [0] * len(edges)

    def ends(e: int) -> tuple[tuple[int, Hashable], tuple[int, Hashable]]:
        return (0, edges[e][0]), (1, edges[e][1])

    def least_free(node: tuple[int, Hashable]) -> int:
        used, c = at[node], 0
        while c in used:
            c += 1
        return c

    for e in range(len(edges)):
        left, right = ends(e)
        a, b = least_free(left), least_free(right)
        if a in at[right]:
            path, node, c = [], right, a
            while c in at[node]:
                f = at[node][c]
                path.append(f)
                f_left, f_right = ends(f)
                node = f_left if node == f_right else f_right
                c = b if c == a else a
            for f in path:
                for end in ends(f):
                    del at[end][colour[f]]
            for f in path:
                colour[f] = b if colour[f] == a else a
                for end in ends(f):
                    at[end][colour[f]] = f
        colour[e] = a
        at[left][a] = e
        at[right][a] = e
    return colour


def chains_of(deps: Sequence[tuple[int, ...]]) -> list[list[int]]:
    """The jobs as paths: each job with no predecessor starts one, followed by the job that waits on it
    (every job waits on at most one and is waited on by at most one, as a path's hops are)."""
    successor = [-1] * len(deps)
    has_predecessor = [False] * len(deps)
    for job, before in enumerate(deps):
        for d in before:
            successor[d] = job
            has_predecessor[job] = True
    chains = []
    for job in range(len(deps)):
        if not has_predecessor[job]:
            chain = [job]
            while successor[chain[-1]] >= 0:
                chain.append(successor[chain[-1]])
            chains.append(chain)
    return chains


def circuit_rounds(chains: list[list[int]], links: Sequence[Sequence[int]], switched: Sequence[bool],
                   duration: np.ndarray, keys: Sequence[tuple]) -> list[int | None]:
    """Round of every job (``None`` for a path without a switch hop).

    Per path (``chains``, of job ids), its slowest ``switched`` hop is its bottleneck. Bottlenecks
    conflict through their first link (the sending port) and their last link (the receiving port);
    where every link inside a route is shared by bottlenecks of one sending port or of one receiving
    port (a crossbar, NICs behind it) the conflict graph is that bipartite multigraph and
    :func:`edge_colouring` gives ``Δ`` rounds. Otherwise (the spine links of a fat tree) the
    bottlenecks take rounds by :func:`first_fit` in ``keys`` order (a pipeline order: the ``j``-th
    chunks of all paths first; leaf-spine-4x4 1 GiB alltoall 0.977 of the bound, unordered 0.888).
    A path's hop ``h`` gets round ``colour + h - b``, ``b`` its bottleneck's position."""
    bottleneck: list[int | None] = []
    for chain in chains:
        hops = [job for job in chain if switched[job]]
        bottleneck.append(max(hops, key=lambda job: duration[job]) if hops else None)
    ports: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for job in bottleneck:
        if job is not None:
            for link in links[job][1:-1]:
                ports[link].add((links[job][0], links[job][-1]))
    coloured = [job for job in bottleneck if job is not None]
    if any(len({s for s, _ in pairs}) > 1 and len({r for _, r in pairs}) > 1 for pairs in ports.values()):
        coloured.sort(key=lambda job: keys[job])
        colours = dict(zip(coloured, first_fit([links[job] for job in coloured])))
    else:
        colours = dict(zip(coloured, edge_colouring([(links[job][0], links[job][-1]) for job in coloured])))
    rounds: list[int | None] = [None] * len(links)
    for chain, job in zip(chains, bottleneck):
        if job is not None:
            at = chain.index(job)
            for h, hop in enumerate(chain):
                rounds[hop] = colours[job] + h - at
    return rounds


def first_fit(routes: Sequence[Sequence[int]]) -> list[int]:
    """Rounds for circuits (``routes``: their link ids) in the order given: each takes the first round
    in which none of its links is taken yet (greedy colouring of the conflict graph; at most
    ``2Δ - 1`` rounds on a bipartite one, so :func:`edge_colouring` is used there)."""
    taken: dict[int, set[int]] = defaultdict(set)
    rounds = []
    for route in routes:
        r = 0
        while any(r in taken[link] for link in route):
            r += 1
        for link in route:
            taken[link].add(r)
        rounds.append(r)
    return rounds


def ordered_schedule(keys: Sequence[tuple], deps: Sequence[tuple[int, ...]], links: Sequence[Sequence[int]],
                     duration: np.ndarray, num_links: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Every link takes its jobs strictly in ``keys`` order, each job as soon as its inputs (``deps``)
    have arrived and every link of its route has finished the jobs before it: (order, start, end).
    ``keys`` must order every job after the jobs it waits on."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    free = np.zeros(num_links)
    start = np.zeros(len(keys))
    end = np.zeros(len(keys))
    for job in order:
        ready = max((end[d] for d in deps[job]), default=0.0)
        route = links[job]
        begin = max(ready, float(free[route].max()))
        start[job], end[job] = begin, begin + duration[job]
        free[route] = end[job]
    return order, start, end

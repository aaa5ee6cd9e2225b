"""``levels``: a short allreduce, allgather or reducescatter by levels of route α: reduce (gather) inside each
cluster of cheap routes to a leader, recursive doubling among the leaders of the top clusters, and the result
broadcast back down.

A short allreduce costs routes' α, not bytes, and behind a switch a link holds one transfer at a time for the whole
α of its route (docs/cost-model.md). Flat patterns (recursive doubling, double binary trees, rings) cross the
costliest routes in many rounds, and many transfers at once queue on their links: two data centres joined by one
link of 500 µs took 1533 µs (a ring, three crossings) for 64 KiB, where one crossing each way is enough. So the
ranks are clustered by the α of the routes between them (single linkage: the connected components of the routes of
at most each α a minimum spanning tree uses, Gower & Ross 1969), which gives nested levels: a box behind its
switch, the boxes under one leaf, a site. Inside a cluster the leaders of its sub-clusters reduce to one of them by a
binomial tree (the first sub-cluster's leader is its member of least route α to the rest of the enclosing cluster,
each next one's its member nearest the leaders chosen before it, with a route to as many of them as any: a GPU with
a NIC on the same rail rather than one without; ⌈log2 m⌉ rounds, each leader sending its partial sum once); the
leaders of the top clusters exchange and reduce by recursive doubling (Thakur, Rabenseifner & Gropp, IJHPCA 2005:
log2 P rounds of the whole buffer; where P is no power of two they reduce to one leader and broadcast instead); then
every cluster broadcasts down the binomial trees it reduced up. Each level's costly routes are crossed ⌈log2 m⌉
times in each direction, by one transfer per pair of leaders, and no cluster's cheaper routes are left waiting on a
costlier one's. The whole buffer travels as one chunk, or as ``--chunks`` chunks pipelined through the same moves; the
plan is the α-β list schedule of :class:`synth.synthesis.baselines.Plan`.

An allgather runs the same moves with copies: a leader gathers its cluster's pieces up the binomial tree (each
message the pieces its sender holds and its receiver lacks: a box of consecutive ranks is one run of the buffer),
the top leaders exchange what they hold by recursive doubling, and every leader sends each member below it the
pieces it lacks. Two sites 500 µs apart, 64 KiB: 511.3 µs where trees crossed three times (1511.1). A reducescatter
is that allgather's time mirror (:func:`synth.synthesis.mirror.mirrored`), on a fabric equal to its reverse.

Every leader pair must share a link or a switch-only route (a partial sum is never relayed by another rank), else
the method does not apply.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule
from synth.synthesis.base import Instance, MethodSpec
from synth.synthesis.baselines import Plan
from synth.topology.model import Topology
from synth.topology.routes import rank_routes

SUPPORTED = frozenset({"allreduce", "allgather", "reducescatter"})
Cluster = tuple  # a rank (int) or a tuple of sub-clusters


def route_alphas(topology: Topology, routes) -> np.ndarray:  # noqa: ANN001 (a rank_routes mapping)
    """``a[u, v]``: the α a transfer from rank ``u`` to rank ``v`` pays on its route (every hop's α,
    docs/cost-model.md), ``inf`` where the two share no link or switch route."""
    n = topology.num_ranks
    alpha = {(link.src, link.dst): link.alpha for link in topology.links}
    out = np.full((n, n), np.inf)
    np.fill_diagonal(out, 0.0)
    for (u, v), path in routes.items():
        if u < n and v < n and u != v:
            out[u, v] = sum(alpha[(a, b)] for a, b in zip(path, path[1:]))
    return out


def symmetric_route_alphas(topology: Topology, routes) -> np.ndarray:  # noqa: ANN001 (a rank_routes mapping)
    """:func:`route_alphas` of the costlier direction of each rank pair."""
    one_way = route_alphas(topology, routes)
    return np.maximum(one_way, one_way.T)


def alpha_levels(topology: Topology, routes, both: np.ndarray | None = None) -> Cluster:  # noqa: ANN001
    """The ranks as nested clusters (module docstring): at each α a minimum spanning tree of the symmetric route
    α uses, from the least up, the clusters joined by routes of at most that α merge into one. Leaves are ranks,
    in rank order; a cluster's first member holds its lowest rank. SynthError where the routes do not join every
    rank. ``both``: :func:`symmetric_route_alphas` of ``routes`` where the caller has it."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import minimum_spanning_tree

    n = topology.num_ranks
    both = symmetric_route_alphas(topology, routes) if both is None else both
    finite = np.isfinite(both)
    # spanning-tree weights: α + 1 so a route of α 0 stays an edge of the sparse matrix
    tree = minimum_spanning_tree(csr_matrix(np.where(finite, both + 1.0, 0.0))).tocoo()
    if n > 1 and len(tree.data) != n - 1:
        raise SynthError(f"levels does not apply to {topology.name!r}: its ranks are not all joined by direct links "
                         "or switch routes")
    clusters: dict[int, Cluster] = {r: r for r in range(n)}   # component root -> its cluster
    root = list(range(n))                                      # rank -> its component's root

    def find(x: int) -> int:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    edges = sorted(zip((tree.data - 1.0).tolist(), tree.row.tolist(), tree.col.tolist()))
    i = 0
    while i < len(edges):
        level, j = edges[i][0], i
        joined: dict[int, set[int]] = {}   # new root -> the components (old roots) it joins at this level
        while j < len(edges) and edges[j][0] <= level + 1e-9:
            a, b = find(edges[j][1]), find(edges[j][2])
            keep, drop = min(a, b), max(a, b)
            root[drop] = keep
            joined[keep] = joined.pop(keep, {keep}) | joined.pop(drop, {drop})
            j += 1
        for top, members in joined.items():
            clusters[top] = tuple(clusters.pop(m) for m in sorted(members))
        i = j
    return clusters[find(0)]


def _members(cluster) -> list[int]:  # noqa: ANN001 (a Cluster)
    """The ranks of a cluster, in order."""
    return [r for sub in cluster for r in _members(sub)] if isinstance(cluster, tuple) else [cluster]


def synthesize(inst: Instance) -> Schedule:
    """The allreduce, allgather or reducescatter of the module docstring on ``inst``'s fabric."""
    if inst.collective.name not in SUPPORTED:
        raise SynthError(f"method levels does not support {inst.collective.name}; it supports "
                         f"{', '.join(sorted(SUPPORTED))}")
    if inst.collective.name == "reducescatter":
        from synth.synthesis.mirror import mirrored, reversible

        if not reversible(inst.topology):
            raise SynthError(f"levels does not apply to {inst.topology.name!r}: a reducescatter is its allgather's "
                             "time mirror, which needs a fabric equal to its reverse (links and routes)")
        gathered = _levels(replace(inst, collective=Collective("allgather", inst.ranks, 1)))
        scattered = mirrored(gathered, replace(inst.collective, chunk_factor=gathered.collective.chunk_factor))
        return replace(scattered, method="levels")
    return _levels(inst)


def _levels(inst: Instance) -> Schedule:
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    n = topology.num_ranks
    chunks = options.chunks or 1
    coll = Collective(collective.name, n, chunks, inplace=collective.inplace)
    routes = rank_routes(topology)
    alpha = symmetric_route_alphas(topology, routes)
    whole = alpha_levels(topology, routes, alpha) if n > 1 else 0

    def _nearest(cluster, around: list[int]) -> int:  # noqa: ANN001 (a Cluster)
        """The member of ``cluster`` with routes to the most ranks of ``around`` outside it, then of least route α
        to them (the lowest rank on a tie): a leader whose partial sum travels on."""
        members = _members(cluster)
        inside = set(members)
        others = [r for r in around if r not in inside]
        if not others:
            return members[0]
        costs = alpha[np.ix_(members, others)]
        reach = np.isfinite(costs)
        key = [(-int(reach[k].sum()), float(costs[k][reach[k]].sum()), k) for k in range(len(members))]
        return members[min(key)[2]]
    plan = Plan(topology, coll, size_bytes, "levels", options, routes=routes)
    gather = collective.name == "allgather"
    held: dict[int, list[int]] = defaultdict(list)   # allreduce: rank -> the moves its partial sum (result) waits on
    have = {r: {coll.contribution(r, k) for k in range(chunks)} for r in range(n)}   # allgather: pieces held
    into: dict[tuple[int, int], list[int]] = {}      # allgather: (rank, piece chunk) -> the moves that brought it
    counter = iter(range(1 << 30))
    downs: list[tuple[list[int], list[tuple[int, int]]]] = []   # per cluster reduced: (leaders, its reduce pairs)

    def copied(level: int, src: int, dst: int, pieces: set[int]) -> None:
        _check_route(routes, topology, src, dst)
        send = sorted(pieces - have[dst])
        deps = sorted({d for c in send for d in into.get((src, c), ())})
        moves = plan.send(level, src, dst, send, False, 0, deps)
        for c in send:
            into[(dst, c)] = moves
        have[dst] |= set(send)

    def moved(level: int, src: int, dst: int, reduce: bool) -> None:
        if gather:   # a gather up or a broadcast down: every piece the sender holds and the receiver lacks
            copied(level, src, dst, set(have[src]))
            return
        _check_route(routes, topology, src, dst)
        for c in range(chunks):   # one move per chunk: later chunks pipeline behind earlier ones
            moves = plan.send(level + c, src, dst, [c], reduce, 0, held[src])
            held[dst] = held[dst] + moves if reduce else moves

    def reduce_up(cluster, prefer: int) -> int:  # noqa: ANN001 (a Cluster)
        if not isinstance(cluster, tuple):
            return cluster
        # the sub-cluster holding the preferred leader reduces into it; each other one into its member nearest
        # (in route α) the rest of this cluster, which its partial sum has to reach
        subs = sorted(cluster, key=lambda sub: prefer not in _members(sub))
        leaders = [reduce_up(subs[0], prefer)]
        for sub in subs[1:]:
            leaders.append(reduce_up(sub, _nearest(sub, leaders)))
        pairs = binomial_pairs(len(leaders))
        for rnd in pairs:
            level = next(counter) * chunks
            for a, b in rnd:
                moved(level, leaders[a], leaders[b], True)
        downs.append((leaders, pairs))
        return leaders[0]

    if n > 1:
        top = whole if isinstance(whole, tuple) else (whole,)
        leaders = [reduce_up(top[0], _nearest(top[0], _members(whole)))]
        for sub in top[1:]:
            leaders.append(reduce_up(sub, _nearest(sub, leaders)))
        m = len(leaders)
        if m & (m - 1) == 0 and m > 1:
            bit = 1
            while bit < m:
                level = next(counter) * chunks
                before = {i: list(held[leaders[i]]) for i in range(m)}
                held_before = {i: set(have[leaders[i]]) for i in range(m)}
                for i in range(m):
                    j = i ^ bit
                    if i < j and gather:   # both send what they held before the round
                        copied(level, leaders[i], leaders[j], held_before[i])
                        copied(level, leaders[j], leaders[i], held_before[j])
                    elif i < j:
                        _check_route(routes, topology, leaders[i], leaders[j])
                        _check_route(routes, topology, leaders[j], leaders[i])
                        for c in range(chunks):
                            there, back = plan.exchange(level + c, leaders[i], leaders[j], [c], True, 0, before[i],
                                                        before[j])
                            held[leaders[j]] = held[leaders[j]] + there
                            held[leaders[i]] = held[leaders[i]] + back
                bit *= 2
        elif m > 1:
            pairs = binomial_pairs(m)
            for rnd in pairs:
                level = next(counter) * chunks
                for a, b in rnd:
                    moved(level, leaders[a], leaders[b], True)
            downs.append((leaders, pairs))
        for leaders_of, pairs in reversed(downs):   # every reduce tree run backwards as a broadcast, top down
            for rnd in reversed(pairs):
                level = next(counter) * chunks
                for a, b in rnd:
                    moved(level, leaders_of[b], leaders_of[a], False)
    return plan.schedule("levels", size_bytes, {"levels": _depth(whole), "top_clusters": len(whole)
                                                if isinstance(whole, tuple) else 1})


def binomial_pairs(m: int) -> list[list[tuple[int, int]]]:
    """Rounds of a binomial reduce of ``m`` members to member 0: in the round of distance ``d`` (1, 2, 4, ...)
    member ``i`` with ``i mod 2d = d`` sends to ``i − d``; ``⌈log2 m⌉`` rounds, each member sending once."""
    rounds, d = [], 1
    while d < m:
        rounds.append([(i, i - d) for i in range(d, m, 2 * d)])
        d *= 2
    return rounds


def _check_route(routes, topology: Topology, a: int, b: int) -> None:  # noqa: ANN001 (a rank_routes mapping)
    if (a, b) not in routes:
        raise SynthError(f"levels does not apply to {topology.name!r}: ranks {a} and {b} share no link or switch "
                         "route")


def _depth(cluster) -> int:  # noqa: ANN001 (a Cluster)
    return 1 + max(_depth(sub) for sub in cluster) if isinstance(cluster, tuple) else 0


METHOD = MethodSpec(
    name="levels",
    run=synthesize,
    collectives=SUPPORTED,
    description="short allreduce / allgather / reducescatter by levels of route α: reduce (gather) inside clusters "
                "of cheap routes, recursive doubling among the top leaders, broadcast back",
)

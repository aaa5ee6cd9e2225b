"""Jobs of method trees: messages pipelined down broadcast trees and up reduction trees
(:class:`synth.synthesis.timing.Jobs`, keyed critical path first).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from synth.collectives import Collective
from synth.synthesis.packing import Route
from synth.synthesis.timing import Jobs, route_cost
from synth.synthesis.trees.forest import Forest, PlannedTree
from synth.synthesis.trees.messages import message_shapes, split_chunks
from synth.topology.model import Topology


def _route_for(tree: PlannedTree, edge_index: int, j: int, count: int) -> Route:
    """Route of the ``j``-th of ``count`` chunks on a tree edge: chunks share the units evenly."""
    pieces = tree.routes[edge_index]
    if len(pieces) == 1:
        return pieces[0][0]
    pos = (j + 0.5) * tree.mult / count
    for route, units in pieces:
        if pos < units:
            return route
        pos -= units
    return pieces[-1][0]


def real_edge(forest: Forest, parent: int, child: int, route: Route) -> tuple[int, int, Route]:
    """The physical transfer of a planned edge: reversed fabrics run child -> parent."""
    if forest.reversed:
        return child, parent, tuple(reversed(route))
    return parent, child, route


def _message_shares(chunks: list[tuple[int, ...]]):
    """(index, message, its share of the tree's data, share sent up to and including it)."""
    total = sum(len(c) for c in chunks)
    done = 0
    for j, chunk in enumerate(chunks):
        done += len(chunk)
        yield j, chunk, len(chunk) / total, done / total


def add_broadcast(jobs: Jobs, forest: Forest, tree_index: int, chunks: list[tuple[int, ...]], phase: int,
                  root_deps: dict[int, tuple[int, ...]] | None = None,
                  wanted: list[set[int]] | None = None, height_weight: float = 1.0) -> None:
    """Pipeline messages (``chunks``: tuples of chunk ids) down a tree (copy). ``root_deps[chunk]``:
    jobs the root must wait for. ``wanted[j]``: if given, message ``j`` only travels on edges
    leading to those ranks (scatter). ``height_weight`` scales the hops-ahead term of the priority.
    Each message's jobs are added at once (a 1024-rank torus allreduce adds 3 million)."""
    tree = forest.trees[tree_index]
    edges, n = tree.edges, forest.num_ranks
    edge_of_child = {child: e for e, (_, child) in enumerate(edges)}
    parent_edge = [edge_of_child.get(parent, -1) for parent, _ in edges]
    below = [tree.heights[child] for _, child in edges]
    count = len(chunks)
    fixed_routes = wanted is None and all(len(pieces) == 1 for pieces in tree.routes)
    kept, parent_at = list(range(len(edges))), parent_edge
    for j, chunk, size, finish in _message_shares(chunks):
        if wanted is not None:   # only the edges towards the wanted ranks; a job's parent is counted among them
            needed = _needed_nodes(tree, wanted[j])
            kept = [e for e, (_, child) in enumerate(edges) if child in needed]
            at = {e: i for i, e in enumerate(kept)}
            parent_at = [at.get(parent_edge[e], -1) for e in kept]
        if j == 0 or not fixed_routes:
            real = [real_edge(forest, *edges[e], _route_for(tree, e, j, count)) for e in kept]
            turns = [(dst - src) % n for src, dst, _ in real]
        base = len(jobs.msg)
        from_root = tuple(sorted({d for c in chunk for d in (root_deps or {}).get(c, ())}))
        # critical path first: a message's urgency is its position in the tree's data minus the
        # hops still ahead of it (height of the subtree it enters), so deep subtrees are fed
        # early and the last transfers on each link are leaf deliveries (short drain); ties rotate
        # by the sender so concurrent senders fan out to different receivers (a switch shift)
        jobs.extend([chunk] * len(kept), [src for src, _, _ in real], [dst for _, dst, _ in real],
                    [route for _, _, route in real], [False] * len(kept),
                    [(base + p,) if p >= 0 else from_root for p in parent_at],
                    [(phase, finish - height_weight * below[e] * size, -below[e], turn, tree_index, e)
                     for e, turn in zip(kept, turns, strict=True)])


def add_reduction(jobs: Jobs, forest: Forest, tree_index: int, chunks: list[tuple[int, ...]], phase: int,
                  into_root: dict[int, list[int]], planned: dict[tuple[int, int, int], float] | None = None) -> None:
    """Pipeline messages up a reduction tree (``forest`` planned on the reversed fabric): a rank
    sends its partial sum of a message to its parent once its children's partial sums have arrived.
    ``into_root[chunk]`` collects the jobs that complete the chunk's sum at the root. ``planned``
    (tree, edge, message) -> start time, if given, is the priority (e.g. the mirrored broadcast's)."""
    tree = forest.trees[tree_index]
    depth = tree.depth
    count = len(chunks)
    n = forest.num_ranks
    order = range(len(tree.edges) - 1, -1, -1)   # children before parents
    fixed = all(len(pieces) == 1 for pieces in tree.routes)   # then each edge's transfer is made once
    real = [real_edge(forest, *tree.edges[e], tree.routes[e][0][0]) for e in order] if fixed else None
    for j, chunk, size, finish in _message_shares(chunks):
        inputs: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(order):
            parent, child = tree.edges[e]
            src, dst, route = real[i] if fixed else real_edge(forest, parent, child, _route_for(tree, e, j, count))
            # the hops still ahead of a partial sum are its depth: far leaves go first
            urgency = planned[(tree_index, e, j)] if planned is not None else finish - depth[child] * size
            key = (phase, urgency, -depth[child], (dst - src) % n, tree_index, e)
            inputs[parent].append(jobs.add(chunk, src, dst, route, True, tuple(inputs[child]), key))
        for c in chunk:
            into_root[c].extend(inputs[tree.root])


Connection = tuple[int, int, Route]   # sender, receiver, switch route


def heavy_alphas(fabric: Topology, connections, ratio: float) -> dict[Connection, float]:
    """The route α (the sum over its links) of each of ``connections`` in the costliest class: the route α
    values above the highest gap where one is at least ``ratio`` times the next below it (a network hop, 4 µs
    through an IB switch, beside 1.4 µs through an NVSwitch and 0.5 µs of xGMI: only the network's routes).
    Empty where no such gap exists."""
    link_index = {(link.src, link.dst): i for i, link in enumerate(fabric.links)}
    _, _, bw, alpha = fabric.arrays
    costs = {connection: route_cost((connection[0], *connection[2], connection[1]), link_index, alpha, bw)[1]
             for connection in set(connections)}
    values = sorted(set(costs.values()), reverse=True)
    floor = next((upper for upper, lower in zip(values, values[1:]) if upper >= ratio * lower), None)
    return {} if floor is None else {connection: cost for connection, cost in costs.items() if cost >= floor}


def heavy_routes(jobs: Jobs, fabric: Topology, ratio: float) -> set[Connection]:
    """The connections of ``jobs`` on heavy routes (:func:`heavy_alphas`)."""
    return set(heavy_alphas(fabric, zip(jobs.src, jobs.dst, jobs.route), ratio))


def heavy_link_ends_late(fabric: Topology, transfers, makespan: float, ratio: float) -> bool:
    """Does a link of a heavy route (:func:`heavy_alphas`) carry messages until within half their route α of the
    schedule's ``makespan``? Only then can merging that route's messages in pairs, which saves at most half of
    that α there, shorten the schedule: elsewhere the links that end it are not the heavy ones."""
    messages = {(t.start, t.end, t.src, t.dst, t.route) for t in transfers}
    heavy = heavy_alphas(fabric, ((src, dst, route) for *_, src, dst, route in messages), ratio)
    ends: dict[tuple[int, int], float] = defaultdict(float)
    alphas: dict[tuple[int, int], float] = defaultdict(float)
    for _, end, src, dst, route in messages:
        cost = heavy.get((src, dst, route))
        if cost is None:
            continue
        nodes = (src, *route, dst)
        for hop in zip(nodes, nodes[1:]):
            ends[hop] = max(ends[hop], end)
            alphas[hop] += cost
    return any(ends[hop] >= makespan - alphas[hop] / 2 for hop in ends)


def merge_heavy_messages(jobs: Jobs, fabric: Topology, keep: tuple[int, int], ratio: float) -> Jobs:
    """``jobs`` (:func:`add_broadcast`'s, on ``fabric``) with each tree's consecutive messages on a heavy route
    (:func:`heavy_routes`) merged in pairs, but for the first ``keep[0]`` and the last ``keep[1]`` of its stream
    there: one α for two messages' bytes where the network's α is what a link pays most for, while the first
    message still starts the subtree beyond early and the last ones still drain it in small steps. A tree's
    consecutive messages hold consecutive chunks, so a merged pair is one step; the merged job waits for what
    either waited for, takes the first one's key, and the jobs after either wait for it."""
    heavy = heavy_routes(jobs, fabric, ratio)
    streams: dict[tuple, list[int]] = defaultdict(list)
    for i, connection in enumerate(zip(jobs.src, jobs.dst, jobs.route)):
        if connection in heavy:   # add_broadcast's key ends (tree index, edge index): one stream per tree edge
            streams[(jobs.key[i][0], *jobs.key[i][-2:], connection)].append(i)
    into: dict[int, int] = {}
    for members in streams.values():
        members.sort(key=lambda i: jobs.msg[i][0])
        body = members[keep[0]:len(members) - keep[1]]
        for a in range(0, len(body) - 1, 2):
            into[body[a + 1]] = body[a]
    if not into:
        return jobs
    kept = [i for i in range(len(jobs.msg)) if i not in into]
    index = {i: k for k, i in enumerate(kept)}
    index.update((j, index[first]) for j, first in into.items())
    partner = {first: j for j, first in into.items()}
    merged = Jobs.empty()
    for i in kept:
        members = (i, partner[i]) if i in partner else (i,)
        merged.add(tuple(c for m in members for c in jobs.msg[m]), jobs.src[i], jobs.dst[i], jobs.route[i],
                   jobs.reduce[i], tuple(sorted({index[d] for m in members for d in jobs.deps[m]} - {index[i]})),
                   jobs.key[i])
    return merged


def _needed_nodes(tree: PlannedTree, targets) -> set[int]:
    parent_of = {child: parent for parent, child in tree.edges}
    needed: set[int] = set()
    for v in targets:
        while v in parent_of and v not in needed:
            needed.add(v)
            v = parent_of[v]
    return needed


def phase_jobs(coll: Collective, forest: Forest, phase: int, chunks: int, parts: int | None,
               height_weight: float = 1.0, tail: int = 0) -> Jobs:
    """Broadcast jobs of one phase on its planning fabric (a reversed forest is mirrored later)."""
    name, n, root = coll.name, coll.num_ranks, coll.root
    plain = replace(forest, reversed=False)
    jobs = Jobs.empty()

    def emit(t: int, messages: list[tuple[int, ...]]) -> None:
        add_broadcast(jobs, plain, t, messages, phase, height_weight=height_weight)

    if name not in ("scatter", "gather"):
        for r in (range(n) if name in ("allgather", "reducescatter", "allreduce") else (root,)):
            spread_chunks(plain, r, root_chunk_ids(coll, r, chunks, forest.weights), parts, emit, tail)
    else:  # scatter, gather: each chunk only travels towards (or from) its own rank
        if name == "scatter":
            items = [(coll.contribution(root, q * chunks + s), q) for s in range(chunks) for q in range(n) if q != root]
        else:
            items = [(coll.contribution(q, s), q) for s in range(chunks) for q in range(n) if q != root]
        _spread_items(plain, root, items,
                      lambda t, cs, ws: add_broadcast(jobs, plain, t, [(c,) for c in cs], phase,
                                                      wanted=[{w} for w in ws]))
    return jobs


def root_chunk_ids(coll: Collective, root: int, chunks: int, weights: tuple[int, ...] | None = None) -> list[int]:
    """The chunk ids a root's trees carry: its contribution (allgather, broadcast), the piece it
    owns (reducescatter, allreduce) or the whole buffer (reduce). An allreduce with ownership
    ``weights`` (:attr:`Forest.weights`): root ``r`` owns the ``chunks·w_r`` chunks after its predecessors'."""
    if coll.name in ("allgather", "broadcast"):
        return [coll.contribution(root, s) for s in range(chunks)]
    if coll.name == "reduce":
        return list(range(chunks))
    return owned_chunk_ids(root, chunks, weights)


def owned_chunk_ids(root: int, chunks: int, weights: tuple[int, ...] | None = None) -> list[int]:
    """The chunks ``root`` owns when each unit of ownership holds ``chunks`` (one unit per rank without
    ``weights``), in rank order."""
    if weights is None:
        return list(range(root * chunks, (root + 1) * chunks))
    first = chunks * sum(weights[:root])
    return list(range(first, first + chunks * weights[root]))


def tree_shares(forest: Forest, root: int, items: list):
    """(distinct tree of ``root``, its consecutive share of ``items``) for the trees that get any
    (:func:`split_chunks`; ``items`` holds the root's weight in units)."""
    if not items:
        return
    pos = 0
    for t, c in enumerate(split_chunks(forest, root, len(items) // forest.weight(root))):
        if c:
            yield t, items[pos:pos + c]
            pos += c


def spread_chunks(forest: Forest, root: int, chunk_ids: list[int], parts: int | None, emit, tail: int = 0) -> None:
    """Give each distinct tree of ``root`` its share of ``chunk_ids``, cut into messages (:func:`message_shapes`)."""
    for t, share in tree_shares(forest, root, chunk_ids):
        emit(t, message_shapes(share, parts, tail))


def _spread_items(forest: Forest, root: int, items: list[tuple[int, int]], emit) -> None:
    """Scatter/gather: ``items`` (chunk, rank) come slot-major, so each tree carries every rank's data."""
    for t, part in tree_shares(forest, root, items):
        emit(t, [chunk for chunk, _ in part], [w for _, w in part])

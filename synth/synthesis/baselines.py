"""The standard baselines users run today: double binary tree, recursive doubling/halving, direct
all-pairs, hierarchical (intra-box / inter-box rails) and NCCL's own ring-or-tree choice.

Shared machinery. Each algorithm is written over *logical* nodes and placed on the ranks by
:func:`embed` (the identity first, then a backtracking search under a step budget) so that every
logical edge is a pair of ranks that talk both ways over a direct link or a switch-only route
(:func:`synth.topology.routes.rank_routes`, the simulator's routing rule). Copy collectives may also
send between ranks that are not adjacent: the piece is relayed by the ranks on a shortest path
(least loaded first), one transfer per hop. Reductions never are, since a relaying rank would hold
someone else's partial sum in its own slot; a reduction whose pattern does not embed raises
:class:`SynthError` ("does not apply"). Times come from the ring module's α-β list schedule
(:class:`synth.synthesis.timing.KeyOrderTimer`: a transfer starts when its inputs have arrived and every link
of its route is free; α per hop plus bytes / bottleneck bw), so predictions respect link
serialization and lowering orders the steps by them.

Algorithms:

- ``dbt`` (NCCL's double binary tree; Sanders, Speck & Träff, "Two-tree algorithms for full
  bandwidth broadcast, reduction and scan", Parallel Computing 2009): two complementary in-order
  binary trees (tree B is tree A shifted or mirrored, whichever leaves fewer ranks interior in
  both), each carrying half the chunks, pipelined chunk by chunk. allreduce: both trees span every
  rank and have different roots; reduce up, then broadcast down. broadcast / reduce: the root sits
  on top of two trees over the other ranks (down only / up only). On boxed fabrics (boxes read from the fabric)
  the trees are NCCL's multi-node ones: a double binary tree over the boxes and, inside each box, a
  chain in ring order whose head talks to the parent box's head over its NIC rail (tree B runs the
  chain the other way, from another head, so the trees cross boxes on different rails). Where the
  in-order trees do not embed (a hypercube, a ring), two binary spanning trees are grown over the
  links, tree B avoiding tree A's interior ranks. Chunks per tree p = sqrt(h·S/(2·bw·α)) (the
  minimiser of (h+p)(α + S/(2p·bw)) for h hops of pipeline fill), at most 16.
- ``rdh`` (Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in
  MPICH", IJHPCA 2005): allgather by recursive doubling (log2 N steps, the data doubles each step),
  reducescatter by recursive halving, allreduce by Rabenseifner's algorithm (halving RS then
  doubling AG); where the α-β estimate over the butterfly's routes favours it (short messages, MPICH's
  choice), allreduce by plain recursive doubling instead: log2 P steps, each exchanging and reducing the
  whole buffer, log2(P)·(α + S/bw) against Rabenseifner's 2·log2(P)·α + 2(P-1)/P·S/bw
  (``options.extra['rdh_allreduce']`` = ``auto`` / ``halving`` / ``doubling`` picks; the schedule's
  ``notes['variant']`` says which ran). For N not a power of two, allgather, reducescatter and the halving
  allreduce run Bruck's rounds (:func:`bruck_rounds`, MPICH's allgather there: ⌈log2 N⌉ rounds, each block
  received once; the allreduce is Bruck's reduce-scatter, then its allgather, ``variant`` ``bruck``): folding
  the N − P extra ranks into a power-of-two core sent every extra rank's data twice. Plain doubling still runs on
  P = 2^⌊log2 N⌋ core ranks, each of the N-P extra ranks folded into a core partner first (sends its data,
  reducing) and unfolded at the end (receives the result). On a fully connected fabric allgather takes
  ⌈log2 N⌉·α + (N-1)/N·S/bw. On boxed fabrics the box index fills the low butterfly bits, so the
  rounds that cross boxes are the ones that move the least data.
- ``direct``: all-pairs for alltoall and allgather: in round d = 1..N-1 rank r sends its piece for
  (r+d) mod N straight to it (switch routes) or relayed along a shortest rank path.
- ``hierarchical`` (multi-box fabrics, boxes read from the fabric, equal boxes): intra-box multi-rings (the
  ring module's packing on each box) and inter-box rings over NIC rails (rail g = GPU g of each
  box; the ring weight budget, 1, 4 or 16 chunks per piece, is whichever predicts fastest: fewer
  rings pay fewer α at small sizes). allreduce = intra RS, per-rail ring allreduce, intra AG;
  allgather = per-rail ring AG then intra AG of the rail bundles; reducescatter = intra RS of the
  rail bundles then per-rail ring RS.
- ``nccl``: what NCCL would run. NCCL's tuner models each algorithm's time as latency + size / bw
  and takes the smallest; we do the same with the α-β predictions of its two algorithms: for
  allreduce the faster of ``ring`` and ``dbt`` (so tree for small sizes, ring for large ones),
  ``ring`` for allgather, reducescatter, broadcast and reduce, and ``direct`` for alltoall (NCCL has
  no alltoall algorithm; users post all-pairs send/recv). Where a switch reduces and multicasts for every
  rank (NVSwitch NVLS), allreduce may also be NCCL's NVLS algorithm (reduce-scatter by ``multimem.ld_reduce``,
  allgather by ``multimem.st``: :func:`synth.synthesis.nvls.nccl_nvls_program`), taken where its simulated
  time is the smallest.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule
from synth.synthesis.base import Instance, MethodSpec, SynthOptions, deadline_of, time_limit_error
from synth.synthesis.ring import MAX_WEIGHT, find_rings, ring_weights, split_counts
from synth.synthesis.timing import KeyOrderTimer
from synth.topology.model import Link, Topology
from synth.topology.routes import rank_routes
from synth.topology.structure import boxes_of

MAX_TREE_PIPELINE = 16     # chunks per tree (dbt)
EMBED_STEPS = 50_000       # backtracking budget of :func:`embed`
MAX_CHUNKS = 128           # hierarchical allreduce: about this many chunks at most

Pair = tuple[int, int]


# ---- shared helpers -------------------------------------------------------------------------------
def _two_way(routes: dict[Pair, tuple[int, ...]], n: int) -> list[set[int]]:
    """rank -> ranks it reaches and is reached from without crossing another rank."""
    adj: list[set[int]] = [set() for _ in range(n)]
    for a, b in routes:
        if (b, a) in routes:
            adj[a].add(b)
    return adj


def embed(routes: dict[Pair, tuple[int, ...]], n: int, edges: Iterable[Pair], fixed: dict[int, int] | None = None,
          max_steps: int = EMBED_STEPS, first: Sequence[int] | None = None) -> list[int] | None:
    """An injective map logical node -> rank (logical nodes 0..n-1) such that every logical edge is a
    pair of ranks that talk both ways without crossing another rank, or None.

    ``first`` (a complete candidate map, e.g. the identity) is tried before the search; ``fixed``
    pins logical nodes to ranks. The search places logical nodes in BFS order and tries, for each,
    the free ranks adjacent to its placed neighbours (fewest neighbours first), under ``max_steps``.
    """
    fixed = fixed or {}
    adj = _two_way(routes, n)
    nbrs: list[set[int]] = [set() for _ in range(n)]
    for a, b in edges:
        if a != b:
            nbrs[a].add(b)
            nbrs[b].add(a)

    def ok(mapping: Sequence[int]) -> bool:
        return all(mapping[b] in adj[mapping[a]] for a in range(n) for b in nbrs[a])

    if first is not None and all(first[k] == r for k, r in fixed.items()) and ok(first):
        return list(first)
    # BFS order from the pinned nodes (or the busiest logical node)
    starts = list(fixed) or [max(range(n), key=lambda v: (len(nbrs[v]), -v))]
    order: list[int] = []
    seen = set(starts)
    queue = list(starts)
    while len(order) < n:
        if not queue:
            rest = [v for v in range(n) if v not in seen]
            queue.append(rest[0])
            seen.add(rest[0])
        v = queue.pop(0)
        order.append(v)
        for w in sorted(nbrs[v], key=lambda w: -len(nbrs[w])):
            if w not in seen:
                seen.add(w)
                queue.append(w)
    mapping = [-1] * n
    used = [False] * n
    steps = 0

    def candidates(v: int) -> list[int]:
        if v in fixed:
            r = fixed[v]
            return [] if used[r] else [r]
        placed = [mapping[w] for w in nbrs[v] if mapping[w] >= 0]
        pool = set(range(n)) if not placed else set.intersection(*(adj[r] for r in placed))
        return sorted((r for r in pool if not used[r]), key=lambda r: (len(adj[r]), r))

    stack = [iter(candidates(order[0]))]
    while stack:
        steps += 1
        if steps > max_steps:
            return None
        depth = len(stack) - 1
        v = order[depth]
        if mapping[v] >= 0:
            used[mapping[v]] = False
            mapping[v] = -1
        r = next(stack[-1], None)
        if r is None:
            stack.pop()
            continue
        mapping[v], used[r] = r, True
        if depth + 1 == n:
            return mapping
        stack.append(iter(candidates(order[depth + 1])))
    return None


def _loc(coll: Collective, dests: dict[int, dict[int, int]], rank: int, chunk: int, reduce: bool) -> tuple:
    """Approximate buffer location of ``chunk`` on ``rank`` (lowering's placement rule), used to cut a
    message into runs that lowering can send as one step (contiguous at both ends)."""
    if coll.is_reduction:
        return ("i", chunk)
    origin, slot = coll.split_contribution(chunk)
    dest = dests[chunk].get(rank)
    if rank == origin:
        if not coll.inplace and dest is not None:   # lowering sends it from there beside relayed chunks
            return ("o", dest)
        alias = coll.alias(rank, "i")
        return (alias[0], alias[1] + slot) if alias else ("i", slot)
    return ("o", dest) if dest is not None else ("s", chunk)


class Plan:
    """Logical messages -> timed transfers (ring module's α-β list schedule), with relays for copies.

    ``send`` returns the indices of the moves that deliver the data at ``dst`` (one per contiguous
    run); pass them as ``deps`` of the moves that forward it. ``level`` orders moves for the list
    schedule (lower first, then insertion order); a move's level must not be below its deps'.

    ``method`` and ``options``: whose plan it is and its ``--time-limit``; a ``send`` past that limit
    raises the time-out error (routing every pair of a 256-rank torus takes about a minute). ``routes``: the
    rank routes to plan on, :func:`rank_routes` by default (a method that needs only a few pairs passes a
    mapping that routes them on demand by the same rule).
    """

    def __init__(self, topology: Topology, coll: Collective, size_bytes: float, method: str = "",
                 options: SynthOptions | None = None, routes: Mapping[Pair, tuple[int, ...]] | None = None):
        self.method = method
        self.time_limit = options.time_limit if options is not None else None
        self.deadline = deadline_of(options) if options is not None else None
        self.topology = topology
        self.coll = coll
        self.reduction = coll.is_reduction
        self.routes = rank_routes(topology) if routes is None else routes
        self.timer = KeyOrderTimer(topology, self.routes, coll.chunk_bytes(size_bytes))
        self.dests = {c: coll.chunk_destinations(c) for c in coll.schedule_chunks}
        self.load: dict[Pair, int] = defaultdict(int)
        self.seq = 0
        self.levels: list[float] = []     # move index -> its level
        self._adj: list[list[int]] | None = None

    def _add(self, level: float, src: int, dst: int, chunks: tuple[int, ...], reduce: bool, channel: int,
             deps: Sequence[int]) -> list[int]:
        # runs contiguous at both ends; a run breaks before index i
        ordered = sorted(chunks)
        if self.reduction:   # every chunk at ("i", chunk) on both ends (_loc): consecutive chunks
            breaks = [i for i in range(1, len(ordered)) if ordered[i] != ordered[i - 1] + 1]
        else:
            locs = [(_loc(self.coll, self.dests, src, c, reduce), _loc(self.coll, self.dests, dst, c, reduce))
                    for c in ordered]
            breaks = [i for i in range(1, len(ordered))
                      if not all(h[0] == p[0] and h[1] == p[1] + 1 for h, p in zip(locs[i], locs[i - 1], strict=True))]
        runs = [ordered[a:b] for a, b in zip([0, *breaks], [*breaks, len(ordered)], strict=True)] if ordered else []
        # the list schedule needs every dependency earlier in key order: never below a dependency's level
        level = max([level] + [self.levels[d] for d in deps])
        out = []
        for run in runs:
            self.seq += 1
            out.append(self.timer.add((level, self.seq), src, dst, tuple(run), reduce, channel, tuple(deps)))
            self.levels.append(level)
        path = self.routes[(src, dst)]
        for a, b in zip(path, path[1:]):
            self.load[(a, b)] += len(chunks)
        return out

    def rank_path(self, src: int, dst: int) -> list[int]:
        """Ranks from src to dst, consecutive ones routable; fewest hops, then least loaded."""
        if self._adj is None:
            n = self.topology.num_ranks
            self._adj = [[] for _ in range(n)]
            for a, b in sorted(self.routes):
                self._adj[a].append(b)
        best = {src: (0, 0)}
        prev: dict[int, int] = {}
        heap = [(0, 0, src)]
        while heap:
            hops, load, u = heapq.heappop(heap)
            if u == dst:
                break
            if (hops, load) > best[u]:
                continue
            for v in self._adj[u]:
                path = self.routes[(u, v)]
                cand = (hops + 1, load + max(self.load[(a, b)] for a, b in zip(path, path[1:])))
                if v not in best or cand < best[v]:
                    best[v] = cand
                    prev[v] = u
                    heapq.heappush(heap, (cand[0], cand[1], v))
        if dst not in best:
            raise SynthError(f"topology {self.topology.name!r}: no path from rank {src} to rank {dst}")
        out = [dst]
        while out[-1] != src:
            out.append(prev[out[-1]])
        return out[::-1]

    def send(self, level: float, src: int, dst: int, chunks: Iterable[int], reduce: bool = False, channel: int = 0,
             deps: Sequence[int] = ()) -> list[int]:
        chunks = tuple(chunks)
        if not chunks:
            return []
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise time_limit_error(self.method, self.time_limit, f"it had planned every transfer ({len(self.levels)} "
                                   "so far)")
        if (src, dst) in self.routes:
            return self._add(level, src, dst, chunks, reduce, channel, deps)
        if reduce:
            raise SynthError(f"ranks {src} and {dst} share no link or switch route and a partial sum cannot be "
                             "relayed through another rank")
        path = self.rank_path(src, dst)
        got = list(deps)
        for h, (a, b) in enumerate(zip(path, path[1:])):
            got = self._add(level + h, a, b, chunks, False, channel, got)
        return got

    def exchange(self, level: float, a: int, b: int, chunks: Iterable[int], reduce: bool, channel: int,
                 deps_a: Sequence[int], deps_b: Sequence[int]) -> tuple[list[int], list[int]]:
        """``a`` sends ``chunks`` to ``b`` and ``b`` the same chunks to ``a``, both moves starting at once
        (:meth:`KeyOrderTimer.exchange`): each reads its sender's partial sum before the other's lands there,
        where a move that could start first would otherwise hand its receiver's own data back (recursive
        doubling whose ranks are ready at different times). ``deps_a``, ``deps_b``: what each sender waits for.
        Both need a direct link or switch route, on links the other does not use."""
        chunks = tuple(chunks)
        forward, backward = self.routes[(a, b)], self.routes[(b, a)]
        if set(zip(forward, forward[1:])) & set(zip(backward, backward[1:])):
            raise SynthError(f"ranks {a} and {b} cannot exchange at once: their routes share a link")
        level = max([level] + [self.levels[d] for d in (*deps_a, *deps_b)])
        there = self._add(level, a, b, chunks, reduce, channel, deps_a)
        back = self._add(level, b, a, chunks, reduce, channel, deps_b)
        if len(there) != 1 or len(back) != 1:
            raise SynthError("internal: an exchange's chunks are not one run")
        self.timer.exchange(there[0], back[0])
        return there, back

    def schedule(self, method: str, size_bytes: float, notes: dict | None = None) -> Schedule:
        transfers = self.timer.run()
        return Schedule(self.coll, self.topology.name, tuple(transfers), method=method, size_bytes=float(size_bytes),
                        predicted_time_us=max((t.end for t in transfers), default=0.0), notes=notes or {})


def routes_cost(topology: Topology, routes: Mapping[Pair, tuple[int, ...]],
                pairs: Iterable[Pair]) -> tuple[float, float]:
    """(smallest bottleneck bw in GB/s, largest summed α in µs) over the routes of ``pairs``."""
    bw, alpha = math.inf, 0.0
    for a, b in pairs:
        path = routes[(a, b)]
        links = [topology.link(u, v) for u, v in zip(path, path[1:])]
        bw = min(bw, min(lk.bw for lk in links))
        alpha = max(alpha, sum(lk.alpha for lk in links))
    return (bw if math.isfinite(bw) else 1.0), alpha


# ---- dbt: double binary tree --------------------------------------------------------------------
def _inorder_tree(m: int) -> list[int]:
    """Parents (-1 for the root) of a balanced in-order binary tree over positions 0..m-1."""
    parent = [-1] * m

    def build(lo: int, hi: int, up: int) -> None:
        if lo > hi:
            return
        mid = (lo + hi + 1) // 2
        parent[mid] = up
        build(lo, mid - 1, mid)
        build(mid + 1, hi, mid)

    build(0, m - 1, -1)
    return parent


def double_binary_tree(m: int) -> tuple[list[int], list[int]]:
    """Two complementary binary trees over positions 0..m-1: tree A in order, tree B its image under
    a shift by one or a mirror, whichever leaves fewer positions interior in both (NCCL's choice:
    shift for odd, mirror for even counts)."""
    a = _inorder_tree(m)
    best: list[int] | None = None
    best_overlap = math.inf
    for f in (lambda p: (p + 1) % m, lambda p: m - 1 - p):
        b = [-1] * m
        for p in range(m):
            b[f(p)] = f(a[p]) if a[p] >= 0 else -1
        interior_a = {q for q in a if q >= 0}
        interior_b = {q for q in b if q >= 0}
        overlap = len(interior_a & interior_b)
        if overlap < best_overlap:
            best, best_overlap = b, overlap
    assert best is not None
    return a, best


def spanning_binary_tree(routes: dict[Pair, tuple[int, ...]], n: int, root: int,
                         avoid: set[int] | frozenset[int] = frozenset()) -> list[int] | None:
    """Parents (-1 at ``root``) of a spanning tree with at most two children per rank whose edges are
    two-way routable, grown greedily (shallow parents first, ranks in ``avoid`` last as parents,
    then the child with the fewest other ways in), or None when the greedy growth gets stuck."""
    adj = _two_way(routes, n)
    parent = [-1] * n
    depth = {root: 0}
    kids = [0] * n
    while len(depth) < n:
        best = None
        for c in range(n):
            if c in depth:
                continue
            ways = [p for p in adj[c] if p in depth and kids[p] < 2]
            for p in ways:
                key = (p in avoid, depth[p], len(ways), sum(1 for x in adj[c] if x not in depth), p, c)
                if best is None or key < best[0]:
                    best = (key, p, c)
        if best is None:
            return None
        _, p, c = best
        parent[c] = p
        depth[c] = depth[p] + 1
        kids[p] += 1
    return parent


def _box_chain_trees(topology: Topology, routes: dict[Pair, tuple[int, ...]], root: int,
                     two_heads: bool) -> list[list[int]] | None:
    """NCCL's multi-node trees: a double binary tree over the boxes, and inside each box a chain
    (the box's ring order) whose head links to the parent box's head over the head's NIC rail.
    Tree B runs the chain the other way, from a head half-way round the ring when ``two_heads``
    (allreduce: the two trees then cross boxes on different rails); both trees start at ``root``'s
    box and chain from ``root`` otherwise. None without equal boxes or when an edge is not routable."""
    boxes = [tuple(b) for b in boxes_of(topology)]
    n = topology.num_ranks
    if len(boxes) < 2 or len({len(b) for b in boxes}) != 1 or sorted(r for b in boxes for r in b) != list(range(n)):
        return None
    g, nb = len(boxes[0]), len(boxes)
    home = next(b for b, box in enumerate(boxes) if root in box)
    box_trees = double_binary_tree(nb)
    rings = []
    for box in boxes:
        if g == 1:
            rings.append(list(box))
            continue
        try:
            found = find_rings(_box_topology(topology, box), max_rings=1)
        except SynthError:
            return None
        rings.append([box[v] for v in found[0].order])
    out = []
    for t, btree in enumerate(box_trees):
        # box-tree position p holds box p (allreduce: the two trees' roots are in different boxes), or,
        # for a rooted collective, the root position holds the root's box and the rest follow in order
        pos_box = {p: p for p in range(nb)}
        if not two_heads:
            top = btree.index(-1)
            rest = [b for b in range(nb) if b != home]
            pos_box = {p: (home if p == top else rest.pop(0)) for p in range(nb)}
        # every box's chain starts at the same local index (one NIC rail per tree): the root's for a
        # rooted collective; for allreduce GPU ring[0] (tree A) and the one half-way round (tree B)
        if two_heads:
            head_local = boxes[0].index(rings[0][0 if t == 0 else g // 2])
        else:
            head_local = boxes[home].index(root)
        step = 1 if t == 0 else -1
        parent = [-1] * n
        heads = {}
        for p in range(nb):
            b = pos_box[p]
            ring = rings[b]
            start = ring.index(boxes[b][head_local])
            chain = [ring[(start + step * i) % g] for i in range(g)]
            heads[p] = chain[0]
            for a, c in zip(chain, chain[1:]):
                parent[c] = a
        for p in range(nb):
            if btree[p] >= 0:
                parent[heads[p]] = heads[btree[p]]
        for c, a in enumerate(parent):
            if a >= 0 and ((a, c) not in routes or (c, a) not in routes):
                return None
        out.append(parent)
    return out


def _dbt(inst: Instance) -> Schedule:
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    name, n = collective.name, topology.num_ranks
    root = collective.root if name != "allreduce" else 0
    routes = rank_routes(topology)
    boxed = _box_chain_trees(topology, routes, root, name == "allreduce")
    if boxed is not None:
        trees = boxed
        rank_parent = [list(tree) for tree in boxed]
        place = None
    elif name == "allreduce":
        # NCCL: both trees span every rank and have different roots, so no rank carries both halves
        trees = double_binary_tree(n)
        parents = [list(tree) for tree in trees]          # logical node = tree position
        place = embed(routes, n, {(v, par[v]) for par in parents for v in range(n) if par[v] >= 0},
                      first=list(range(n)))
    else:
        # rooted: the root on top (logical 0) of two trees over the others (logical p+1 = position p)
        trees = double_binary_tree(n - 1)
        parents = [[-1] + [0 if q < 0 else q + 1 for q in tree] for tree in trees]
        place = embed(routes, n, {(v, par[v]) for par in parents for v in range(1, n)}, fixed={0: root},
                      first=[(root + i) % n for i in range(n)])
    if boxed is not None:
        pass
    elif place is not None:
        rank_parent = [[-1] * n for _ in trees]     # tree t: rank -> parent rank (-1 at the root)
        for t, par in enumerate(parents):
            for v in range(n):
                if par[v] >= 0:
                    rank_parent[t][place[v]] = place[par[v]]
    else:
        # the in-order trees do not fit the fabric (e.g. a hypercube, a ring): grow two binary spanning
        # trees over its links instead, tree B avoiding tree A's interior ranks as parents (and, for
        # allreduce, rooted at one of tree A's deepest leaves)
        tree_a = spanning_binary_tree(routes, n, root)
        if tree_a is None:
            raise SynthError(f"dbt does not apply to {topology.name!r}: no binary spanning tree over its links "
                             "and switch routes")
        interior = {p for p in tree_a if p >= 0}
        root_b = root
        if name == "allreduce":
            def depth_a(r: int) -> int:
                return 0 if tree_a[r] < 0 else 1 + depth_a(tree_a[r])
            root_b = max((r for r in range(n) if r not in interior), key=lambda r: (depth_a(r), -r))
        tree_b = spanning_binary_tree(routes, n, root_b, avoid=interior - {root})
        if tree_b is None:
            raise SynthError(f"dbt does not apply to {topology.name!r}: no second binary spanning tree over its "
                             "links and switch routes")
        rank_parent = [tree_a, tree_b]
    children = [[[] for _ in range(n)] for _ in trees]
    for t in range(len(trees)):
        for r in range(n):
            if rank_parent[t][r] >= 0:
                children[t][rank_parent[t][r]].append(r)

    def height(t: int, r: int) -> int:
        return 1 + max((height(t, c) for c in children[t][r]), default=-1)

    def depth(t: int, r: int) -> int:
        return 0 if rank_parent[t][r] < 0 else 1 + depth(t, rank_parent[t][r])

    roots = [rank_parent[t].index(-1) for t in range(len(trees))]
    top_h = max(height(t, roots[t]) for t in range(len(trees)))
    if options.chunks is not None:
        chunks = options.chunks
    else:
        bw, alpha = routes_cost(topology, routes, [(r, rank_parent[t][r]) for t in range(len(trees))
                                                   for r in range(n) if rank_parent[t][r] >= 0])
        hops = 2 * top_h - 1 if name == "allreduce" else max(top_h - 1, 0)
        share = size_bytes / 2
        p = math.sqrt(hops * share / (bw * 1e3 * alpha)) if alpha > 0 else MAX_TREE_PIPELINE
        chunks = 2 * max(1, min(MAX_TREE_PIPELINE, round(p)))
    coll = Collective(name, n, chunks, root=root, inplace=collective.inplace)
    plan = Plan(topology, coll, size_bytes, "dbt", options)
    counts = split_counts(chunks, [1, 1])
    k0 = 0
    for t in range(len(trees)):
        ks = list(range(k0, k0 + counts[t]))
        k0 += counts[t]
        post = sorted(range(n), key=lambda r, t=t: height(t, r))
        pre = sorted(range(n), key=lambda r, t=t: depth(t, r))
        up: dict[tuple[int, int], list[int]] = defaultdict(list)    # (rank, k) -> moves into rank
        for m_, k in enumerate(ks):
            if name in ("allreduce", "reduce"):
                for r in post:
                    par = rank_parent[t][r]
                    if par < 0:
                        continue
                    deps = [d for c in children[t][r] for d in up[(c, k)]]
                    up[(r, k)] = plan.send(m_ + height(t, r), r, par, [k], True, t, deps)
            if name in ("allreduce", "broadcast"):
                chunk = coll.contribution(root, k) if name == "broadcast" else k
                base = top_h + 1 if name == "allreduce" else 0
                top = roots[t]
                got: dict[int, list[int]] = {top: [d for c in children[t][top] for d in up[(c, k)]]}
                for r in pre:
                    for c in children[t][r]:
                        got[c] = plan.send(base + m_ + depth(t, r), r, c, [chunk], False, t, got[r])
    return plan.schedule("dbt", size_bytes, {"trees": [list(p) for p in rank_parent], "roots": roots,
                                             "chunks_per_tree": counts})


# ---- rdh: recursive doubling / halving ----------------------------------------------------------
def _box_interleaved(topology: Topology) -> list[int]:
    """logical -> rank with the box index in the low logical bits (GPU g of box b is logical
    g·B + b): the butterfly then crosses boxes in the rounds that move the least data (the last
    halving round, the first doubling round). The identity when there are no equal boxes."""
    boxes = [tuple(b) for b in boxes_of(topology)]
    n = topology.num_ranks
    if len(boxes) < 2 or len({len(b) for b in boxes}) != 1 or sorted(r for b in boxes for r in b) != list(range(n)):
        return list(range(n))
    nb = len(boxes)
    return [boxes[i % nb][i // nb] for i in range(n)]


def bruck_rounds(n: int) -> list[tuple[int, int]]:
    """Bruck's allgather over ``n`` ranks (Bruck et al., "Efficient algorithms for all-to-all communications in
    multiport message-passing systems", IEEE TPDS 1997; MPICH's allgather where N is no power of two, Thakur,
    Rabenseifner & Gropp 2005 §4.1): per round ``(distance, count)``: rank ``v`` sends the ``count`` blocks
    ``v .. v + count − 1`` (mod n) it holds to rank ``v − distance`` (mod n). Distances 1, 2, 4, ...; every rank
    then holds every block after ``⌈log2 n⌉`` rounds, having received each block once: ``n − 1`` blocks in all."""
    rounds, distance = [], 1
    while distance < n:
        rounds.append((distance, min(distance, n - distance)))
        distance *= 2
    return rounds


def _placement(topology: Topology, routes, name: str, edges: set[tuple[int, int]], first: list[int],
               pattern: str) -> list[int]:
    """logical -> rank such that the partner pairs ``edges`` are links or switch routes (:func:`embed`); an
    allgather that does not embed keeps the identity (copies may be relayed by ranks), anything else raises."""
    place = embed(routes, topology.num_ranks, edges, first=first)
    if place is not None:
        return place
    if name == "allgather":
        return list(range(topology.num_ranks))
    raise SynthError(f"rdh does not apply to {topology.name!r}: {pattern} partner pairs do not embed in the fabric's "
                     "links and switch routes")


def _logical_sends(plan: Plan, place: list[int]):
    """``send(level, a, b, chunk_ids, reduce)`` between logical ranks (placed by ``place``), each after the moves
    that delivered its chunks to ``a``; ``into`` is that record, (logical, chunk) -> moves."""
    into: dict[tuple[int, int], list[int]] = defaultdict(list)

    def send(level: int, a: int, b: int, chunk_ids: list[int], reduce: bool) -> None:
        deps = sorted({d for c in chunk_ids for d in into[(a, c)]})
        moves = plan.send(level, place[a], place[b], chunk_ids, reduce, 0, deps)
        for c in chunk_ids:
            into[(b, c)] = into[(b, c)] + moves if reduce else list(moves)

    return send, into


def _rdh(inst: Instance) -> Schedule:
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    name, n = collective.name, topology.num_ranks
    p = 1 << (n.bit_length() - 1)
    extras = n - p
    if extras and name in ("allgather", "reducescatter"):
        return _bruck(inst)
    bits = [1 << i for i in range(p.bit_length() - 1)]
    edges = {(i, i ^ b) for i in range(p) for b in bits} | {(i, p + i) for i in range(extras)}
    routes = rank_routes(topology)
    # each extra rank sits next to its core partner (core i <-> extra p+i at positions 2i, 2i+1), so the
    # pieces a core holds stay contiguous in the buffers (one step per exchange)
    base = _box_interleaved(topology)
    position = [2 * v if v < extras else extras + v if v < p else 2 * (v - p) + 1 for v in range(n)]
    place = _placement(topology, routes, name, edges, [base[position[v]] for v in range(n)], "the butterfly's")
    variant = _rdh_allreduce_variant(topology, routes, place, bits, size_bytes, options) if name == "allreduce" \
        else None
    if extras and variant == "halving":
        return _bruck(inst)    # Bruck's reduce-scatter and allgather in place of the folded halving and doubling
    if options.chunks is not None:
        chunks = options.chunks
    else:
        chunks = p if variant == "halving" else 1
    coll = Collective(name, n, chunks, root=collective.root, inplace=collective.inplace)
    plan = Plan(topology, coll, size_bytes, "rdh", options)
    C = chunks
    send, into = _logical_sends(plan, place)

    if name == "allgather":
        piece = {v: [coll.contribution(place[v], k) for k in range(C)] for v in range(n)}
        have = {i: list(piece[i]) for i in range(p)}
        for e in range(extras):
            send(0, p + e, e, piece[p + e], False)
            have[e] += piece[p + e]
        for s, b in enumerate(bits):
            snapshot = {i: list(have[i]) for i in range(p)}
            for i in range(p):
                send(1 + s, i, i ^ b, snapshot[i], False)
            for i in range(p):
                have[i] = snapshot[i] + snapshot[i ^ b]
        for e in range(extras):
            send(1 + len(bits), e, p + e, [c for c in have[e] if c not in piece[p + e]], False)
    elif variant == "doubling":
        total = list(range(C))
        for e in range(extras):
            send(0, p + e, e, total, True)
        for s, b in enumerate(bits):     # every core rank exchanges its whole partial sum, both reduce
            # each send carries the partial sum as it was before this round's receive (no double count)
            before = {i: sorted({d for c in total for d in into[(i, c)]}) for i in range(p)}
            arrived = []
            for i in range(p):
                if i < i ^ b:   # both directions start at once: see Plan.exchange
                    there, back = plan.exchange(1 + s, place[i], place[i ^ b], total, True, 0, before[i],
                                                before[i ^ b])
                    arrived += [(i ^ b, there), (i, back)]
            for j, moves in arrived:
                for c in total:
                    into[(j, c)] = into[(j, c)] + moves
        for e in range(extras):
            send(1 + len(bits), e, p + e, total, False)
    elif name in ("reducescatter", "allreduce"):
        if name == "reducescatter":
            block = {i: [place[i] * C + k for k in range(C)] for i in range(p)}
            for e in range(extras):
                block[e] = block[e] + [place[p + e] * C + k for k in range(C)]
            total = list(range(n * C))
        else:
            sizes = split_counts(C, [1] * p)
            starts = [sum(sizes[:i]) for i in range(p)]
            block = {i: list(range(starts[i], starts[i] + sizes[i])) for i in range(p)}
            total = list(range(C))
        for e in range(extras):
            send(0, p + e, e, total, True)
        # halving: high bit first; after processing bit b, i owns the blocks of the core nodes that agree
        # with it on every processed bit
        for s, b in enumerate(reversed(bits)):
            done = bits[len(bits) - s:]   # bits processed before this step (higher ones)
            for i in range(p):
                j = i ^ b
                group = [x for x in range(p) if all((x & d) == (i & d) for d in done) and (x & b) == (j & b)]
                send(1 + s, i, j, [c for x in group for c in block[x]], True)
        level = 1 + len(bits)
        if name == "reducescatter":
            for e in range(extras):
                send(level, e, p + e, [place[p + e] * C + k for k in range(C)], False)
        else:
            have = {i: list(block[i]) for i in range(p)}
            for s, b in enumerate(bits):
                snapshot = {i: list(have[i]) for i in range(p)}
                for i in range(p):
                    send(level + s, i, i ^ b, snapshot[i], False)
                for i in range(p):
                    have[i] = snapshot[i] + snapshot[i ^ b]
            for e in range(extras):
                send(level + len(bits), e, p + e, total, False)
    else:  # pragma: no cover - guarded by the MethodSpec
        raise SynthError(f"rdh does not support {name}")
    notes = {"core": p, "extras": extras, "placement": place}
    if variant is not None:
        notes["variant"] = variant
    return plan.schedule("rdh", size_bytes, notes)


def _bruck(inst: Instance) -> Schedule:
    """rdh where N is no power of two (:func:`bruck_rounds`): allgather by Bruck's rounds, reducescatter by the
    same rounds mirrored in time and direction (each block's partial sums flow back along the allgather's tree of
    it, summed on the way), allreduce by the two. Unlike folding the extra ranks into a power-of-two core, every
    rank sends and receives each block once per phase, in ``⌈log2 N⌉`` rounds: on one switch (a 72-GPU NVLink
    domain) the bandwidth bound plus ``⌈log2 N⌉`` messages' α. Placement as for the butterfly: the box index
    fills the low logical positions, so the short early rounds cross boxes."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    name, n = collective.name, topology.num_ranks
    rounds = bruck_rounds(n)
    edges = {(v, (v + sign * d) % n) for v in range(n) for d, _ in rounds for sign in (1, -1)}
    place = _placement(topology, rank_routes(topology), name, edges, _box_interleaved(topology), "Bruck's")
    chunks = options.chunks if options.chunks is not None else (n if name == "allreduce" else 1)
    coll = Collective(name, n, chunks, root=collective.root, inplace=collective.inplace)
    plan = Plan(topology, coll, size_bytes, "rdh", options)
    send, _ = _logical_sends(plan, place)
    if name == "allgather":
        block = {v: [coll.contribution(place[v], k) for k in range(chunks)] for v in range(n)}
    elif name == "reducescatter":
        block = {v: [place[v] * chunks + k for k in range(chunks)] for v in range(n)}
    else:
        sizes = split_counts(chunks, [1] * n)
        starts = [sum(sizes[:v]) for v in range(n)]
        block = {v: list(range(starts[v], starts[v] + sizes[v])) for v in range(n)}

    def run(v: int, count: int) -> list[int]:
        return [c for j in range(count) for c in block[(v + j) % n]]

    level = 1
    if name in ("reducescatter", "allreduce"):
        for distance, count in reversed(rounds):
            for u in range(n):
                send(level, u, (u + distance) % n, run((u + distance) % n, count), True)
            level += 1
    if name in ("allgather", "allreduce"):
        for distance, count in rounds:
            for v in range(n):
                send(level, v, (v - distance) % n, run(v, count), False)
            level += 1
    notes: dict = {"core": n, "extras": 0, "placement": place, "bruck_rounds": len(rounds)}
    if name == "allreduce":
        notes["variant"] = "bruck"
    return plan.schedule("rdh", size_bytes, notes)


def _rdh_allreduce_variant(topology: Topology, routes: dict[Pair, tuple[int, ...]], place: Sequence[int],
                           bits: Sequence[int], size_bytes: float, options: SynthOptions) -> str:
    """``halving`` (Rabenseifner) or ``doubling`` (plain recursive doubling) for an allreduce of SIZE S
    over P = 2^len(bits) core ranks, by the α-β estimate with α the largest route α and bw the smallest
    route bandwidth over the butterfly's pairs (Thakur, Rabenseifner & Gropp 2005, §4.4):

        doubling = log2(P)·(α + S/bw),   halving = 2·log2(P)·α + 2·(P−1)/P·S/bw;

    doubling only where strictly faster. ``options.extra['rdh_allreduce']`` forces either."""
    forced = str(options.extra.get("rdh_allreduce", "auto"))
    if forced not in ("auto", "halving", "doubling"):
        raise SynthError(f"rdh_allreduce must be auto, halving or doubling, got {forced!r}")
    if forced != "auto" or not bits:
        return forced if forced != "auto" else "halving"
    p = 1 << len(bits)
    pairs = [(place[i], place[i ^ b]) for i in range(p) for b in bits]
    bw, alpha = routes_cost(topology, routes, pairs)
    per_byte = 1.0 / (bw * 1e3)
    doubling = len(bits) * (alpha + size_bytes * per_byte)
    halving = 2 * len(bits) * alpha + 2 * (p - 1) / p * size_bytes * per_byte
    return "doubling" if doubling < halving else "halving"


# ---- direct: all pairs ----------------------------------------------------------------------------
def _direct(inst: Instance) -> Schedule:
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    name, n = collective.name, topology.num_ranks
    coll = Collective(name, n, options.chunks or 1, root=collective.root, inplace=collective.inplace)
    C = coll.chunk_factor
    plan = Plan(topology, coll, size_bytes, "direct", options)
    if coll.inplace and name == "alltoall":
        # in place, a piece received overwrites the slot of the piece for its sender: exchange pairs
        # (r + q = d mod N) in round d, so each slot is read by the send as it is overwritten
        for d in range(n):
            for r in range(n):
                q = (d - r) % n
                if q == r:
                    continue
                if (r, q) not in plan.routes:
                    raise SynthError(f"direct in-place alltoall needs every rank pair adjacent or switch-routed; "
                                     f"ranks {r} and {q} of {topology.name!r} are not")
                plan.send(d, r, q, [coll.contribution(r, q * C + k) for k in range(C)])
        return plan.schedule("direct", size_bytes)
    for d in range(1, n):
        for r in range(n):
            q = (r + d) % n
            if name == "alltoall":
                ids = [coll.contribution(r, q * C + k) for k in range(C)]
            else:
                ids = [coll.contribution(r, k) for k in range(C)]
            plan.send(d, r, q, ids)
    return plan.schedule("direct", size_bytes)


# ---- hierarchical ---------------------------------------------------------------------------------
def _box_topology(topology: Topology, box: Sequence[int]) -> Topology:
    """The box's ranks (relabelled 0..G-1) with every switch and the links among them."""
    local = {r: i for i, r in enumerate(box)}
    g, n = len(box), topology.num_ranks

    def node(x: int) -> int | None:
        if topology.is_switch(x):
            return g + x - n
        return local.get(x)

    links = []
    for lk in topology.links:
        a, b = node(lk.src), node(lk.dst)
        if a is not None and b is not None:
            links.append(Link(a, b, lk.bw, lk.alpha))
    return Topology(f"{topology.name}:box", g, tuple(links), switches=topology.switches)


def _hierarchical(inst: Instance) -> Schedule:
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    name, n = collective.name, topology.num_ranks
    boxes = [tuple(b) for b in boxes_of(topology)]
    if len(boxes) < 2:
        raise SynthError(f"hierarchical needs a multi-box topology (2 or more boxes in its fabric); "
                         f"{topology.name!r} has {len(boxes)}")
    g = len(boxes[0])
    if any(len(b) != g for b in boxes) or sorted(r for b in boxes for r in b) != list(range(n)):
        raise SynthError(f"hierarchical needs equal boxes that cover every rank once ({topology.name!r})")
    nb = len(boxes)
    routes = rank_routes(topology)
    for gi in range(g):
        for b in range(nb):
            a, c = boxes[b][gi], boxes[(b + 1) % nb][gi]
            if (a, c) not in routes or (c, a) not in routes:
                raise SynthError(f"hierarchical: rail {gi} ranks {a} and {c} share no link or switch route")
    found_per_box = [None if g == 1 else find_rings(_box_topology(topology, box)) for box in boxes]
    # fewer, fatter rings pay fewer α at small sizes; more rings move more bytes at large ones: try
    # a few ring-weight budgets and keep the fastest prediction (allreduce also caps its chunk count)
    caps = [MAX_WEIGHT, 4, 1]
    if name == "allreduce":
        caps = [min(c, max(1, MAX_CHUNKS // (g * nb))) for c in caps]
    best: Schedule | None = None
    for cap in dict.fromkeys(caps):
        rings: list[list[tuple[int, ...]]] = []       # per box: ring orders (global ranks)
        weights: list[list[int]] = []
        for box, found in zip(boxes, found_per_box, strict=True):
            if found is None:
                rings.append([tuple(box)])
                weights.append([1])
                continue
            w = ring_weights(found, cap)
            if sum(w) == 0:                           # a budget below the ring count keeps the fastest ring
                w = [1] + [0] * (len(found) - 1)
            keep = [i for i, x in enumerate(w) if x > 0]
            rings.append([tuple(box[v] for v in found[i].order) for i in keep])
            weights.append([w[i] for i in keep])
        schedule = _hierarchical_build(topology, collective, size_bytes, options, boxes, rings, weights)
        if best is None or schedule.predicted_time_us < best.predicted_time_us - 1e-9:
            best = schedule
    assert best is not None
    return best


def _hierarchical_build(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                        boxes: list[tuple[int, ...]], rings: list[list[tuple[int, ...]]],
                        weights: list[list[int]]) -> Schedule:
    name, n = collective.name, topology.num_ranks
    g, nb = len(boxes[0]), len(boxes)
    wsum = max(sum(w) for w in weights)
    if options.chunks is not None:
        chunks = options.chunks
    else:
        chunks = g * nb * wsum if name == "allreduce" else wsum
    coll = Collective(name, n, chunks, root=collective.root, inplace=collective.inplace)
    C = chunks
    plan = Plan(topology, coll, size_bytes, "hierarchical", options)
    into: dict[tuple[int, int], list[int]] = defaultdict(list)   # (rank, chunk) -> moves delivering it

    def send(level: float, a: int, b: int, ids: list[int], reduce: bool, channel: int, extra: Sequence[int] = ()
             ) -> list[int]:
        deps = sorted({d for c in ids for d in into[(a, c)]} | set(extra))
        moves = plan.send(level, a, b, ids, reduce, channel, deps)
        for c in ids:
            into[(b, c)] = into[(b, c)] + moves if reduce else list(moves)
        return moves

    def ring_rs(level: int, order: tuple[int, ...], owner: int, ids: list[int], channel: int) -> None:
        """Reduce ``ids`` around ``order`` into ``owner`` (each rank adds its own and passes on)."""
        k = len(order)
        pos = order.index(owner)
        for t in range(k - 1):
            send(level + t, order[(pos + 1 + t) % k], order[(pos + 2 + t) % k], ids, True, channel)

    def ring_ag(level: int, order: tuple[int, ...], owner: int, ids: list[int], channel: int) -> None:
        k = len(order)
        pos = order.index(owner)
        for t in range(k - 1):
            send(level + t, order[(pos + t) % k], order[(pos + t + 1) % k], ids, False, channel)

    def split_rings(b: int, ids: list[int]) -> list[list[int]]:
        counts = split_counts(len(ids), weights[b])
        out, j = [], 0
        for c in counts:
            out.append(ids[j:j + c])
            j += c
        return out

    rail = [tuple(boxes[b][gi] for b in range(nb)) for gi in range(g)]
    inter_ch = max(len(r) for r in rings)    # rails get their own channel
    if name == "allreduce":
        share = split_counts(C, [1] * g)
        starts = [sum(share[:i]) for i in range(g)]
        sub: list[list[list[int]]] = []     # [gi][u] -> slots of sub-block u of share gi
        for gi in range(g):
            ids = list(range(starts[gi], starts[gi] + share[gi]))
            cnt = split_counts(len(ids), [1] * nb)
            sub.append([ids[sum(cnt[:u]):sum(cnt[:u + 1])] for u in range(nb)])
        for b in range(nb):               # intra-box reduce-scatter of share gi to GPU gi
            for gi in range(g):
                for u in range(nb):
                    for r, part in enumerate(split_rings(b, sub[gi][u])):
                        if part:
                            ring_rs(0, rings[b][r], boxes[b][gi], part, r)
        for gi in range(g):               # per rail: ring allreduce over boxes (RS to box u, then AG)
            for u in range(nb):
                ids = sub[gi][u]
                if ids:
                    ring_rs(g, rail[gi], rail[gi][u], ids, inter_ch)
                    ring_ag(g + nb, rail[gi], rail[gi][u], ids, inter_ch)
        for b in range(nb):               # intra-box allgather from GPU gi
            for gi in range(g):
                for u in range(nb):
                    for r, part in enumerate(split_rings(b, sub[gi][u])):
                        if part:
                            ring_ag(g + 2 * nb, rings[b][r], boxes[b][gi], part, r)
    elif name == "allgather":
        for gi in range(g):               # per rail: ring allgather of the rail's pieces
            for u in range(nb):
                q = rail[gi][u]
                ring_ag(0, rail[gi], q, [coll.contribution(q, k) for k in range(C)], inter_ch)
        for b in range(nb):               # intra-box allgather of each rail's bundle
            for gi in range(g):
                for r, ks in enumerate(split_rings(b, list(range(C)))):
                    ids = [coll.contribution(q, k) for q in rail[gi] for k in ks]
                    if ids:
                        ring_ag(nb, rings[b][r], boxes[b][gi], ids, r)
    elif name == "reducescatter":
        for b in range(nb):               # intra-box reduce-scatter of each rail's bundle to GPU gi
            for gi in range(g):
                for r, ks in enumerate(split_rings(b, list(range(C)))):
                    ids = [q * C + k for q in rail[gi] for k in ks]
                    if ids:
                        ring_rs(0, rings[b][r], boxes[b][gi], ids, r)
        for gi in range(g):               # per rail: ring reduce-scatter over boxes
            for u in range(nb):
                q = rail[gi][u]
                ring_rs(g, rail[gi], q, [q * C + k for k in range(C)], inter_ch)
    else:  # pragma: no cover - guarded by the MethodSpec
        raise SynthError(f"hierarchical does not support {name}")
    return plan.schedule("hierarchical", size_bytes, {"boxes": nb, "box_rings": [[list(o) for o in rs]
                                                                                   for rs in rings]})


# ---- nccl: NCCL's own choice ----------------------------------------------------------------------
def _nccl(inst: Instance) -> Schedule:
    from synth.synthesis.ring import OWN_CHUNKS
    from synth.synthesis.ring import synthesize as ring

    options = inst.options
    # NCCL runs its own rings, at their own chunk counts, at any size: MSCCL's rule on nchunksperloop does not bind it
    inst = inst.with_options(replace(options, runtime_chunks=False, extra={**options.extra, OWN_CHUNKS: True}))
    name = inst.collective.name
    if name == "alltoall":
        choice, schedule = "direct", _direct(inst)
    elif name != "allreduce":
        choice, schedule = "ring", ring(inst)
    else:
        choice, schedule = "ring", ring(inst)
        try:
            tree = _dbt(inst)
        except SynthError:
            tree = None
        if tree is not None and tree.predicted_time_us < schedule.predicted_time_us:
            choice, schedule = "dbt", tree
        if inst.topology.reducing_switches:   # NVLS, where a switch reduces and multicasts for every rank
            from synth.synthesis.nvls import nccl_nvls

            nvls = nccl_nvls(inst)
            if nvls is not None and nvls.predicted_time_us < schedule.predicted_time_us:
                choice, schedule = "nvls", nvls
    notes = dict(schedule.notes)
    notes["nccl_algorithm"] = choice
    return replace(schedule, method="nccl", notes=notes)


DBT = MethodSpec("dbt", _dbt, frozenset({"allreduce", "broadcast", "reduce"}),
                 "NCCL's double binary tree: two complementary pipelined binary trees, half the data each")
RDH = MethodSpec("rdh", _rdh, frozenset({"allgather", "reducescatter", "allreduce"}),
                 "recursive doubling/halving (Rabenseifner allreduce); Bruck's rounds for non-powers of two")
DIRECT = MethodSpec("direct", _direct, frozenset({"alltoall", "allgather"}),
                    "all-pairs: every rank sends straight to every other (relayed along shortest paths if needed)")
HIERARCHICAL = MethodSpec("hierarchical", _hierarchical, frozenset({"allreduce", "allgather", "reducescatter"}),
                          "multi-box: intra-box rings, inter-box rings over NIC rails, intra-box again")
NCCL = MethodSpec("nccl", _nccl, frozenset({"allreduce", "allgather", "reducescatter", "broadcast", "reduce",
                                            "alltoall"}),
                  "what NCCL runs: ring, double binary tree or NVLS by α-β time (allreduce), ring otherwise, "
                  "all-pairs alltoall")

"""Method ``trees``: throughput-optimal pipelined spanning trees (ForestColl, arXiv 2402.06787).

Planning (see :mod:`synth.synthesis.packing`): the exact cut-bound rate, switch removal by edge
splitting, and ``k`` spanning out-arborescences per root (a few distinct trees with multiplicities).

Collectives:
- allgather: every rank broadcasts its piece over its ``k`` trees;
- broadcast / scatter: the root's trees (scatter sends each rank's piece down the root->rank path of
  the trees; the rate is then the broadcast forest's, optimal for broadcast, a heuristic for scatter);
- reducescatter / reduce / gather: the broadcast schedule planned and timed on the *reversed*
  fabric, then mirrored in time (t -> T - t) and direction: data flows leaf -> root along each
  tree and ranks combine (reduce) or relay (gather) on the way; the makespan, link serialization
  and data dependencies carry over unchanged;
- allreduce: the optimal reducescatter (every rank owns ``1/N`` of the buffer) then the optimal
  allgather of the reduced pieces, in one schedule; where it is faster, the two overlap (a piece's
  allgather leaves its owner once its reduction is complete there, :func:`_timed_forward`). On
  switchless fabrics where the phases' bottlenecks differ (a mesh), the two forests are also planned
  on link capacities split between them by an LP (:mod:`synth.synthesis.split`), rounded to whole
  trees in both phases at once, and run side by side (:func:`_split_allreduce`); the faster
  allreduce is kept.

Chunking (cost model). A root's data of ``M`` bytes is cut into ``C`` chunks; a distinct tree of
multiplicity ``m`` carries ``≈ C·m/k`` of them (largest remainder), each chunk pipelined down the
tree. For a candidate ``C`` with chunk size ``b = M/C`` we predict

    time(C) ≈ max_link Σ_{transfers on it} (α_route + b / bw_route)  +  (D − 1) · (α_max + b / bw_min)

(busiest link's α-β work, plus the pipeline fill/drain of the deepest tree, depth ``D``). The first
term grows with ``C`` through α, the second shrinks; we take the ``C`` minimising it, bounded by
MSCCL's limits (≤ 32 channels × 64 steps per connection). Timings in the Schedule come from an
in-order list schedule: transfers in pipeline-round order, each starting when its data is ready
and every link of its route is free (one transfer at a time per link direction, SPEC). Where
schedules are cheap the neighbouring pipeline depths are timed too and the fastest is kept, and
where fill, drain and α cost more than 1 % the last message of every tree is also split
geometrically (:func:`_messages`): large messages mid-pipeline, small ones where the drain starts.
A message of more than 71 chunks is lowered as several MSCCL steps and is timed with one α per step.

Coalescing (broadcasts, and reductions timed as mirrored broadcasts): when a link frees up, the
transfer it starts also carries the queued transfers of the same root that continue its chunks on
the same route (one step with ``cnt`` > 1, one α), until α is ``ALPHA_SHARE`` of the message. Only
bottleneck links build such a backlog, so α drops where it costs time while the pipeline keeps
small messages elsewhere; each phase keeps the faster of the coalesced and the plain timing. The
shape the search settles on is built once more with each share in ``ALPHA_SHARES``: where α is most
of the gap (NVSwitch ports pay it twice), half the share means longer messages and fewer α.
The shape finally kept (after the trees-per-root search) is polished (:func:`_polish`, ``POLISH``):
timed again with messages that are at most ``0.7×`` what their links still carry after them
(each link's stream ends in shrinking messages while its earlier ones grow) and with the transfers
ready at one instant queued together before a link starts one (so the first does not leave alone).

Round timing: where α, fill and drain still cost more than 1 % at a bandwidth-bound SIZE, the same
forests are also timed by rounds (:mod:`synth.synthesis.rounds`): an LP over ``ROUNDS`` rounds
chooses which prefix of each tree's data crosses each tree edge in which round, with one α per
message, and every connection then sends in round order as soon as data and links allow. The faster
schedule is kept (mi250 1 GiB allgather: 0.968 of the bound as a list schedule, 0.985 by rounds).
The LP grows with tree edges × rounds; beyond ``ROUND_VARIABLES`` shares it is not tried, nor on
switch fabrics (see :func:`schedule_from_plans`).

Switches: ranks are first paired through the switches so that no two rank pairs share a switch
link (:func:`synth.synthesis.packing.disjoint_pair_split`; rails between boxes, a ring inside a
box or over all ranks), kept only when the optimal rate survives; a routed transfer then never
waits for another pair's transfer (SPEC: a transfer holds its whole route). Otherwise general edge
splitting (below) applies.

Routes: an MSCCL program names peers, not paths, so a planned arc through switches may only use
the path a send between those ranks takes (:func:`synth.topology.routes.rank_routes`, the simulator's rule);
switch splitting is restricted to such paths, which can cost rate on fabrics whose fixed paths leave
links idle (e.g. a second spine).

Scale: beyond ``LARGE_RANKS`` ranks one tree per root comes from :mod:`synth.synthesis.scale`.
Translates of one tree (tori, boxes) are timed once and the times copied to every translate
(:func:`slot_schedule`, :func:`replicated_schedule`); other huge schedules level by level
(:func:`level_schedule`). Up to ``TREE_SEARCH_RANKS`` ranks 16, 8 and 4 trees per root are tried
besides the optimum's count (fewer messages per link at a rate within ~1/K of the optimum).
Reductions are also timed forward, leaf to root (:func:`_timed_forward`), below ``FORWARD_JOBS``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from fractions import Fraction

import numpy as np

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule, Transfer
from synth.synthesis import circuits, rounds
from synth.synthesis.base import (
    MAX_CHANNELS,
    MAX_STEP_CHUNKS,
    MAX_STEPS_PER_TB,
    MAX_XML_NODES,
    MethodSpec,
    SynthOptions,
    deadline_of,
)
from synth.synthesis.packing import (
    Route,
    SplitError,
    allowed_subpaths,
    choose_capacities,
    disjoint_pair_split,
    integer_fabric,
    optimal_ratio,
    pack_arborescences,
    split_switches,
)
from synth.synthesis.paths import PathPlan, plan_paths
from synth.synthesis.ring import split_counts
from synth.synthesis.timing import (
    ALPHA_SHARE,
    Coalescing,
    Jobs,
    connection_steps,
    justify,
    level_schedule,
    list_schedule,
    message_groups,
    phase_transfers,
    replayed_makespan,
    replicated_schedule,
    route_cost,
    route_costs,
    shares_links,
    slot_schedule,
    tree_heights,
)
from synth.topology.model import Topology
from synth.topology.routes import rank_routes

# collectives whose chunks of one root are contiguous in the buffers (so coalesced messages are one step)
COALESCING = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce"})
SUPPORTED = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter"})
DEFAULT_MAX_TREES = 256     # trees per root; the packing cost grows with distinct trees, not with k
MAX_CHUNKS = 512            # chunks per root piece considered by the cost model
ONE_ROOT = frozenset({"broadcast", "reduce"})   # one root piece, the whole buffer: deeper pipelines pay
ONE_ROOT_CHUNKS = 2048      # ... chunks it may be cut into (ring-8 broadcast of 1 GiB: 512 -> 0.966 of the bound)
DEEP_GRID = (192, 256, 384, 512)   # ... messages per tree tried beyond PIPELINE_GRID there
MAX_TRANSFERS = 3_000_000   # keep schedules within memory/time budgets
TREE_SEARCH_RANKS = 64      # up to this many ranks, fewer trees per root are tried too
TREE_SEARCH_CAPS = (16, 8, 4)
CAP_STOP = 0.005            # ... past a cap this much slower than the best (mi250-2node: 8 trees +0.7 %) only
CAP_ROOM = 0.05             # ... where the next cap's rate leaves this much room below the best time
LARGE_RANKS = 256           # beyond this, one fast tree per root (synth.synthesis.scale)
REFINE_JOBS = 80_000        # time other pipeline depths only below this many transfers (mi250-2node AR: 69.5k)
REPLAY = True
PATH_CHUNKS = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # chunks per rank piece tried for scatter/gather on flow paths
ROUNDS_RUNNERS_UP = 3       # ... chunk counts whose rounds of circuits (best plans first) the pipeline simulates
JUSTIFY_TRANSFERS = 1_500_000   # ... tried on schedules of at most this many transfers
DRAINS = (None, 0.7)        # the kept shape is also coalesced with each link's stream ending in shrinking messages
BATCHES = (False, True)     # ... and with the transfers ready at one instant queued together
HEIGHT_WEIGHTS = (1.0, 4.0)  # priorities tried: hops ahead weighed 1x (default) and 4x (mi250, dgx-a100-2node)
ALT_PRIORITY_JOBS = 10_000  # ... the 4x one only up to this many transfers at the first depth
FORWARD_JOBS = 20_000        # forward-timed reductions only below this many transfers
LEVEL_JOBS = 200_000        # beyond this many transfers, vectorised level timing
ALPHA_SHARES = (ALPHA_SHARE, 0.005, 0.02, 0.0035, 0.0025)  # ... the shape chosen is also built with these
TAIL_SPLITS = (3, 2, 4)     # the last message of each tree halved this many times: P is searched at the first
MAX_TAIL_CHUNKS = 1024      # chunks per root piece a tailed message shape may use
HALVING = -1                # ``tail`` value of the halving shape: every message half of what is left
HALVING_CHUNKS = (64, 32)   # ... timed with this many chunks per tree and root where tails are searched
TAIL_GAIN = 0.01            # ... searched only where fill, drain and α cost more than this share
SPLIT_GAIN = 0.05           # allreduce on split capacities where that LP beats RS then AG by this share
SPLIT_TREES = (1, 2, 4, 8)  # ... with this many trees per root, fewer first (MSCCL step limits favour few)
SPLIT_CHUNKS = (32, 64, 96, 128)  # ... and this many chunks per tree and root, or per root where trees are
                                  # many (one chunk per message; 4 trees of 32 outgrow MSCCL's steps on 10 ranks)
WHOLE_SPLIT_SECONDS = 60.0  # ... rounded to whole trees within this long (8x8 torus: 25 s), else on the LP's
STEP_MARGIN = 1.3           # ... kept where messages x this (nop steps: 1.2-1.25 on mesh-5x5) fit MSCCL's limits
ROUNDS = 30                 # rounds of a round-timed schedule (synth.synthesis.rounds); mi250 AG 20: 0.973, 30: 0.983
ROUND_VARIABLES = 40_000    # ... tried only up to this many (tree edge, round) shares
ROUND_CHUNKS = (256, 512)   # ... chunks per root tried (nearest runtime-usable counts)
ROUND_ALPHA_SHARE = 0.05    # ... only where α on a two-hop route in every round stays below this share of the time
ROUND_TIMED = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce"})


# ---------------------------------------------------------------------------------------------
# the forest
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedTree:
    """A distinct spanning tree: ``edges`` (parent, child) in BFS order on the *planning* fabric;
    ``routes[i]`` lists (switch route, units) for edge ``i`` (units sum to ``mult``)."""

    root: int
    mult: int
    edges: tuple[tuple[int, int], ...]
    routes: tuple[tuple[tuple[Route, int], ...], ...]

    @property
    def depth(self) -> dict[int, int]:
        depth = {self.root: 0}
        for parent, child in self.edges:
            depth[child] = depth[parent] + 1
        return depth


@dataclass(frozen=True)
class Forest:
    """``k`` trees per root (as distinct trees with multiplicities) at rate ``ratio`` (fabric units).

    The bandwidth time of a broadcast of ``M`` bytes per root is ``M · ratio / (unit_GBps · 1e3)`` µs;
    ``optimal`` is the cut bound in the same units (``ratio == optimal`` unless ``k`` was capped).
    """

    trees: tuple[PlannedTree, ...]
    k: int
    ratio: Fraction
    optimal: Fraction
    unit_GBps: Fraction
    reversed: bool
    num_ranks: int
    slots: tuple[int, ...] | None = None   # translation-invariant timing (scale.translated_trees)
    replicated: bool = False               # trees are translates with edges in the same order

    def bandwidth_time_us(self, bytes_per_root: float) -> float:
        return bytes_per_root * float(self.ratio) / (float(self.unit_GBps) * 1e3)


def plan_forest(topology: Topology, roots: tuple[int, ...], *, reverse: bool = False,
                max_trees: int = DEFAULT_MAX_TREES) -> Forest:
    """Optimal forest for broadcasts from ``roots`` (reduce towards them if ``reverse``).

    Beyond ``LARGE_RANKS`` ranks the fast constructions of :mod:`synth.synthesis.scale` replace
    the exact packing (one tree per root; the rate they reach is reported, not certified).
    """
    if topology.num_ranks > LARGE_RANKS:
        return _large_forest(topology, roots, reverse)
    fabric_topology = topology.reversed() if reverse else topology
    fabric = integer_fabric(fabric_topology)
    weights = {r: 1 for r in roots}
    optimal = optimal_ratio(fabric, weights)
    k, caps, ratio = choose_capacities(fabric, weights, optimal, max_trees)
    allowed = _allowed(topology, reverse)
    # Reductions run on the reversed fabric; pairing u with u-1 there makes their real transfers
    # go u -> u+1 like the broadcasts', so allreduce keeps one peer per rank in both phases.
    step = -1 if reverse else 1
    graph = None
    for pairs in _disjoint_pair_candidates(topology, reverse):
        graph = disjoint_pair_split(fabric, caps, weights, k, pairs)
        if graph is not None:
            break
    if graph is None:
        try:
            graph = split_switches(fabric, caps, weights, k, allowed, step)
        except SplitError:
            graph, ratio = _degraded_split(fabric, weights, optimal, k, allowed, step)
    packed = pack_arborescences(topology.num_ranks, dict(graph.cap), weights, k)
    pools = {key: [list(item) for item in pool] for key, pool in graph.routes.items()}
    trees = []
    for tree in packed:
        routes = []
        for edge in tree.edges:
            routes.append(tuple(_draw_units(pools[edge], tree.mult)))
        trees.append(PlannedTree(tree.root, tree.mult, tuple(tree.edges), tuple(routes)))
    return Forest(tuple(trees), k, ratio, optimal, fabric.unit_GBps, reverse, topology.num_ranks)


def _large_forest(topology: Topology, roots: tuple[int, ...], reverse: bool) -> Forest:
    from synth.synthesis import scale

    fabric_topology = topology.reversed() if reverse else topology
    slots = None
    dims = scale.torus_dims(fabric_topology)
    if dims is not None:
        raw, slots = scale.translated_trees(fabric_topology, dims, roots)
    elif topology.switches and topology.machines:
        raw = scale.box_trees(fabric_topology, roots)
    else:
        raw = scale.balanced_bfs_trees(fabric_topology, roots)
    ratio, unit = scale.achieved_ratio(topology, raw, reverse)
    trees = tuple(PlannedTree(r, 1, tuple(edges), tuple(((route, 1),) for route in routes))
                  for r, edges, routes in raw)
    replicated = slots is None and bool(topology.switches and topology.machines)
    return Forest(trees, 1, ratio, ratio, unit, reverse, topology.num_ranks, slots, replicated)


def _disjoint_pair_candidates(topology: Topology, reverse: bool):
    """Rank pairings to try with :func:`disjoint_pair_split`, as switch paths on the planning fabric.

    With equal boxes: GPU ``i`` of box ``b`` to GPU ``i`` of box ``b + s`` (rails; box shift
    ``s = 1``, then half the boxes) before a ring inside each box; then a ring over all ranks and
    the half-way shift. Pairs joined by a direct link need no switch and are skipped; reductions
    plan on the reversed fabric, where the real pair ``u -> v`` is the arc ``v -> u``.
    """
    if not topology.switches:
        return
    routes = rank_routes(topology)
    n = topology.num_ranks

    def paths(pairs):
        found = (routes.get(pair) for pair in pairs)
        return [path[::-1] if reverse else path for path in found if path is not None and len(path) > 2]

    boxes = topology.machines
    if len(boxes) > 1 and len({len(box) for box in boxes}) == 1:
        width, count = len(boxes[0]), len(boxes)
        in_box = [(box[i], box[(i + 1) % width]) for box in boxes for i in range(width)]
        for shift in dict.fromkeys((1, count // 2)):
            rails = [(boxes[b][i], boxes[(b + shift) % count][i]) for b in range(count) for i in range(width)]
            yield paths(rails + in_box)
    for shift in dict.fromkeys((1, n // 2)):
        yield paths([(u, (u + shift) % n) for u in range(n)])


def _allowed(topology: Topology, reverse: bool) -> set[tuple[int, ...]] | None:
    """Path pieces a planned arc may use: those of the real fabric's canonical routes (reversed
    when planning on the reversed fabric, whose arcs run backwards in time)."""
    if not topology.switches:
        return None
    pieces = allowed_subpaths(rank_routes(topology))
    return {piece[::-1] for piece in pieces} if reverse else pieces


def _degraded_split(fabric, weights: dict[int, int], optimal: Fraction, k: int, allowed, step: int):
    """The least rate ``T >= T*`` (bisection, ``k`` fixed) at which switches split completely along
    canonical routes: fixed per-peer routes can make the cut bound unreachable (e.g. one of two
    spines never on a shortest path)."""
    def attempt(t: float):
        caps = np.floor(fabric.units * t * k + 1e-9).astype(np.int64)
        try:
            return split_switches(fabric, caps, weights, k, allowed, step), caps
        except SplitError:
            return None, caps

    lo, hi = float(optimal), float(optimal) * 2
    while attempt(hi)[0] is None:
        lo, hi = hi, hi * 2
        if hi > float(optimal) * 1e6:
            raise SynthError("no tree packing fits this fabric's fixed routes")
    for _ in range(24):
        mid = (lo + hi) / 2
        if attempt(mid)[0] is None:
            lo = mid
        else:
            hi = mid
    graph, caps = attempt(hi)
    achieved = max(Fraction(int(c), int(b) * k) for c, b in zip(caps, fabric.units))
    return graph, max(achieved, optimal)


def _draw_units(pool: list[list], amount: int) -> list[tuple[Route, int]]:
    taken = []
    while amount > 0:
        route, units = pool[-1]
        use = min(units, amount)
        taken.append((tuple(route), use))
        amount -= use
        if use == units:
            pool.pop()
        else:
            pool[-1][1] -= use
    return taken


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


def _real_edge(forest: Forest, parent: int, child: int, route: Route) -> tuple[int, int, Route]:
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
    leading to those ranks (scatter). ``height_weight`` scales the hops-ahead term of the priority."""
    tree = forest.trees[tree_index]
    height = tree_heights(tree)
    count = len(chunks)
    for j, chunk, size, finish in _message_shares(chunks):
        arrived: dict[int, int] = {}
        needed = _needed_nodes(tree, wanted[j]) if wanted is not None else None
        for e, (parent, child) in enumerate(tree.edges):
            if needed is not None and child not in needed:
                continue
            src, dst, route = _real_edge(forest, parent, child, _route_for(tree, e, j, count))
            if parent in arrived:
                deps = (arrived[parent],)
            else:
                deps = tuple(sorted({d for c in chunk for d in (root_deps or {}).get(c, ())}))
            # critical path first: a message's urgency is its position in the tree's data minus the
            # hops still ahead of it (height of the subtree it enters), so deep subtrees are fed
            # early and the last transfers on each link are leaf deliveries (short drain); ties rotate
            # by the sender so concurrent senders fan out to different receivers (a switch shift)
            key = (phase, finish - height_weight * height[child] * size, -height[child],
                   (dst - src) % forest.num_ranks, tree_index, e)
            arrived[child] = jobs.add(chunk, src, dst, route, False, deps, key)


def add_reduction(jobs: Jobs, forest: Forest, tree_index: int, chunks: list[tuple[int, ...]], phase: int,
                  into_root: dict[int, list[int]], planned: dict[tuple[int, int, int], float] | None = None) -> None:
    """Pipeline messages up a reduction tree (``forest`` planned on the reversed fabric): a rank
    sends its partial sum of a message to its parent once its children's partial sums have arrived.
    ``into_root[chunk]`` collects the jobs that complete the chunk's sum at the root. ``planned``
    (tree, edge, message) -> start time, if given, is the priority (e.g. the mirrored broadcast's)."""
    tree = forest.trees[tree_index]
    depth = tree.depth
    count = len(chunks)
    for j, chunk, size, finish in _message_shares(chunks):
        inputs: dict[int, list[int]] = defaultdict(list)
        for e in range(len(tree.edges) - 1, -1, -1):   # children before parents
            parent, child = tree.edges[e]
            src, dst, route = _real_edge(forest, parent, child, _route_for(tree, e, j, count))
            # the hops still ahead of a partial sum are its depth: far leaves go first
            urgency = planned[(tree_index, e, j)] if planned is not None else finish - depth[child] * size
            key = (phase, urgency, -depth[child], (dst - src) % forest.num_ranks, tree_index, e)
            inputs[parent].append(jobs.add(chunk, src, dst, route, True, tuple(inputs[child]), key))
        for c in chunk:
            into_root[c].extend(inputs[tree.root])


def _needed_nodes(tree: PlannedTree, targets) -> set[int]:
    parent_of = {child: parent for parent, child in tree.edges}
    needed: set[int] = set()
    for v in targets:
        while v in parent_of and v not in needed:
            needed.add(v)
            v = parent_of[v]
    return needed


# the shapes a search keeps are built with every share of α; the shape finally kept with drains and batches too
BUILT = tuple(Coalescing(share) for share in ALPHA_SHARES)
POLISH = tuple(Coalescing(share, drain, batch) for share in ALPHA_SHARES for drain in DRAINS for batch in BATCHES
               if (drain, batch) != (None, False))


# ---------------------------------------------------------------------------------------------
# chunk counts: the cost model
# ---------------------------------------------------------------------------------------------
def _any_chunks(chunks: int) -> list[int]:
    """The ``fit`` of ``--any-chunks``: every count is fine."""
    return [chunks]


def split_chunks(forest: Forest, root: int, count: int) -> list[int]:
    """Chunks per distinct tree of ``root`` when every root of ``forest`` has ``count`` chunks
    (:func:`_balanced_split`; others' trees 0)."""
    key = (id(forest), count)
    if key not in _SPLITS or _SPLITS[key][0] is not forest:
        if len(_SPLITS) > 64:
            _SPLITS.clear()
        _SPLITS[key] = (forest, _balanced_split(forest, count))
    return [c if t.root == root else 0 for t, c in zip(forest.trees, _SPLITS[key][1])]


_SPLITS: dict[tuple[int, int], tuple[Forest, tuple[int, ...]]] = {}   # by identity: hashing a forest walks it


def _balanced_split(forest: Forest, count: int) -> tuple[int, ...]:
    """Chunks per distinct tree, every root's ``count`` shared in proportion to multiplicity: a tree
    of multiplicity ``m`` gets ``⌊count·m/k⌋`` or one more. Who gets one more is chosen root by root
    so that the links stay level (greedy, least-loaded tree first, then the larger remainder)
    rather than by remainder alone, which would hand the extra chunk of every root to trees
    crossing the same links (dgx1 at 8 chunks per root, 6 trees each)."""
    shares = [Fraction(count * t.mult, forest.k) for t in forest.trees]
    counts = [math.floor(x) for x in shares]
    if counts == shares:
        return tuple(counts)
    links = [{(a, b) for (parent, child), routes in zip(t.edges, t.routes)
              for nodes in [(parent, *routes[0][0], child)] for a, b in zip(nodes, nodes[1:])}
             for t in forest.trees]
    load: dict[tuple[int, int], int] = defaultdict(int)
    for t, c in enumerate(counts):
        for link in links[t]:
            load[link] += c
    by_root: dict[int, list[int]] = defaultdict(list)
    for t, tree in enumerate(forest.trees):
        by_root[tree.root].append(t)
    for root in sorted(by_root):
        trees = [t for t in by_root[root] if shares[t] > counts[t]]
        for _ in range(count - sum(counts[t] for t in by_root[root])):
            pick = min(trees, key=lambda t: (max(load[link] for link in links[t]), counts[t] - shares[t], t))
            trees.remove(pick)
            counts[pick] += 1
            for link in links[pick]:
                load[link] += 1
    return tuple(counts)


@dataclass(frozen=True)
class _Usage:
    """Per distinct tree: the physical links it loads (with α of the route and min bw), per rank pair."""

    link_rows: list[np.ndarray]        # per tree: link ids, one entry per (edge, hop)
    route_alpha: list[np.ndarray]      # per tree: Σα of the route of that hop's edge
    route_bw: list[np.ndarray]         # per tree: min bw of the route of that hop's edge
    pairs: list[list[tuple[int, int]]]
    depth: list[int]


def _usage(forest: Forest, topology: Topology) -> _Usage:
    link_index = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    _, _, bw, alpha = topology.arrays
    rows, alphas, bws, pairs, depths = [], [], [], [], []
    for tree in forest.trees:
        r, a, b, p = [], [], [], []
        for e, (parent, child) in enumerate(tree.edges):
            route = tree.routes[e][0][0]
            src, dst, route = _real_edge(forest, parent, child, route)
            links, route_alpha_us, route_bw = route_cost((src, *route, dst), link_index, alpha, bw)
            for link in links:
                r.append(link)
                a.append(route_alpha_us)
                b.append(route_bw)
            p.append((src, dst))
        rows.append(np.array(r, dtype=np.int64))
        alphas.append(np.array(a))
        bws.append(np.array(b))
        pairs.append(p)
        depths.append(max(tree.depth.values()))
    return _Usage(rows, alphas, bws, pairs, depths)


def predicted_time(phases: list[tuple[Forest, _Usage, list[int], list[float], int]],
                   num_links: int) -> tuple[float, int]:
    """Cost model of the module docstring; returns (µs, most steps on one rank pair).

    ``phases``: (forest, usage, messages per distinct tree, bytes per message, roots) per phase.
    Fill/drain is charged per phase as the deepest tree's ``(D-1)`` hops divided by the number of
    roots (with many roots every link is busy from the start, as in a ring).
    """
    busy = np.zeros(num_links)
    pair_load: dict[tuple[int, int], int] = defaultdict(int)
    fill = 0.0
    for _forest, usage, messages, msg_bytes, roots in phases:
        phase_fill = 0.0
        for t, (n, b) in enumerate(zip(messages, msg_bytes)):
            if n == 0:
                continue
            hop = usage.route_alpha[t] + b / (usage.route_bw[t] * 1e3)
            np.add.at(busy, usage.link_rows[t], n * hop)
            for pair in usage.pairs[t]:
                pair_load[pair] += n
            phase_fill = max(phase_fill, (usage.depth[t] - 1) * float(hop.max()))
        fill += phase_fill / roots
    return float(busy.max()) + fill, max(pair_load.values(), default=0)


# ---------------------------------------------------------------------------------------------
# the method
# ---------------------------------------------------------------------------------------------
def synthesize(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions) -> Schedule:
    """Throughput-optimal trees for ``collective`` at ``size_bytes`` (see module docstring)."""
    name = collective.name
    if name not in SUPPORTED:
        raise SynthError(f"method trees does not support {name}; it supports {', '.join(sorted(SUPPORTED))}")
    n = topology.num_ranks
    if collective.num_ranks != n:
        raise SynthError(f"collective has {collective.num_ranks} ranks but topology {topology.name} has {n}")
    max_trees = options.max_trees if options.max_trees is not None else DEFAULT_MAX_TREES
    if max_trees < 1:
        raise SynthError("--max-trees must be at least 1")
    if options.chunks is not None and options.chunks < 1:
        raise SynthError("--chunks must be at least 1")
    if n == 1:
        return Schedule(Collective(name, 1, options.chunks or 1, collective.root, collective.inplace),
                        topology.name, (), method="trees", size_bytes=float(size_bytes))
    options = _piece_options(collective, options)

    symmetric = not topology.switches and _symmetric(topology)
    # the other orientation's forests (_flipped_planner) only where shapes are searched: its timing is capped
    # at FORWARD_JOBS transfers anyway, and the route check runs one search per rank
    flippable = (bool(topology.switches) and n <= TREE_SEARCH_RANKS and _symmetric(topology)
                 and _routes_symmetric(topology))
    cache: dict[tuple[tuple[int, ...], int], Forest] = {}

    def planner_for(trees_cap: int):
        def planner(roots: tuple[int, ...], reverse: bool) -> Forest:
            if not symmetric:
                return plan_forest(topology, roots, reverse=reverse, max_trees=trees_cap)
            # a switchless fabric equal to its reverse: the reduction trees are the broadcast trees
            if (roots, trees_cap) not in cache:
                cache[(roots, trees_cap)] = plan_forest(topology, roots, max_trees=trees_cap)
            return replace(cache[(roots, trees_cap)], reversed=reverse)
        return planner

    def flipped_for(trees_cap: int):
        return _flipped_planner(topology, trees_cap) if flippable else None

    def pipelined(trees_cap: int) -> tuple[_Pipelined, Schedule]:
        found = _pipeline(topology, collective, size_bytes, options, planner_for(trees_cap), flipped_for(trees_cap))
        return found, _finish(topology, collective, size_bytes, options, found, "trees")

    def polished(found: _Pipelined, kept: Schedule) -> Schedule:
        # only the shape finally kept is polished (POLISH tries 15 more list schedules)
        better = _polish(topology, collective, size_bytes, found)
        if better is found or better.timed[1] >= kept.predicted_time_us * (1 - 1e-9):
            return kept
        return _finish(topology, collective, size_bytes, options, better, "trees", rounds_tried=True)

    began = time.monotonic()
    best_found, best = pipelined(max_trees)
    if options.max_trees is not None or n > TREE_SEARCH_RANKS:
        return _or_paths(topology, collective, size_bytes, options, polished(best_found, best))
    # Many trees per root mean many messages per link (α) and coarse pipelines under the MSCCL
    # chunk limits; a few trees at a rate within ~1/K of the optimum are often faster in the
    # α-β model (mi250-2node allgather: 83 trees 0.875 of the bound, 8 trees 0.92).
    budget = None if options.time_limit is None else began + options.time_limit
    slower = False
    for cap in TREE_SEARCH_CAPS:
        if cap >= max(best.notes["trees_per_root"]):
            continue
        if budget is not None and time.monotonic() + (time.monotonic() - began) > budget:
            break
        # after a clearly slower cap, fewer trees can only win by cutting α and pipeline fill: only
        # if the rate they keep leaves room (dgx-a100-2node 64 MB: 13 trees 252 µs, 8 trees 257, 4 trees 224)
        if slower and _capped_floor_us(topology, collective, size_bytes, cap) > best.predicted_time_us * (1 - CAP_ROOM):
            break
        trial_found, trial = pipelined(cap)
        if trial.predicted_time_us < best.predicted_time_us * (1 - 1e-9):
            best_found, best = trial_found, trial
        elif trial.predicted_time_us > best.predicted_time_us * (1 + CAP_STOP):
            slower = True
    best = polished(best_found, best)
    if name == "allreduce" and not topology.switches:
        deadline = None if budget is None else budget - (time.monotonic() - began) / 2
        try:
            split = _split_allreduce(topology, collective, size_bytes, best.notes["tree_bandwidth_time_us"], deadline,
                                     _chunk_fit(collective, size_bytes, options))
        except SynthError:   # an alternative only: the schedule above stands
            split = None
        if split is not None and split.predicted_time_us < best.predicted_time_us * (1 - 1e-9):
            best = split
    return _or_rings(topology, collective, size_bytes, options, _or_paths(topology, collective, size_bytes, options,
                                                                         best))


RING_FOREST_CHUNKS = 256   # chunks per root of a ring forest (the nearest count the runtime runs is used)


def _or_rings(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
              best: Schedule) -> Schedule:
    """``best``, and for an allgather, reducescatter or allreduce on two machines of rank pairs the ring
    forest's schedule (:mod:`synth.synthesis.ringforest`) as an alternative after it: the pipeline times
    both and keeps the faster (mi250-2node 1 GiB allgather: 3089.7 µs against 3183.7), and a ring forest
    that does not fit MSCCL's limits is dropped there rather than making the method retry with fewer chunks."""
    if collective.name not in ("allgather", "reducescatter", "allreduce") or options.max_trees is not None:
        return best
    from synth.synthesis import ringforest

    chunks = _chunk_fit(collective, size_bytes, options)(RING_FOREST_CHUNKS)[0]
    try:
        ring = ringforest.schedule(topology, collective, size_bytes, chunks)
    except SynthError:   # an alternative only: the forest's schedule stands
        ring = None
    if ring is None:
        return best
    return _first_with_runner_ups([best, ring])


def _or_paths(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
              best: Schedule) -> Schedule:
    """``best`` justified (:func:`_justified`); for scatter and gather up to ``TREE_SEARCH_RANKS``
    ranks, the schedule on the optimal flow's paths (:func:`_path_schedule`, justified too) where that
    is faster (not with ``--max-trees``, which asks for trees)."""
    best = _justified(topology, best)
    if (collective.name not in ("scatter", "gather") or options.max_trees is not None
            or topology.num_ranks > TREE_SEARCH_RANKS):   # one LP column per routed rank pair
        return best
    found = _path_schedule(topology, collective, size_bytes, options)
    if found is None:
        return best
    paths = [replace(found, alternatives=()), *found.alternatives]
    return _first_with_runner_ups(sorted([best, *(_justified(topology, s) for s in paths)],
                                         key=lambda s: max(s.predicted_time_us, s.notes.get("score_us", 0.0))))


def _first_with_runner_ups(schedules: list[Schedule]) -> Schedule:
    """``schedules[0]`` with every other schedule, and their own alternatives, as its alternatives
    (:attr:`Schedule.alternatives`, which the pipeline times)."""
    flat = [s for schedule in schedules for s in (schedule, *schedule.alternatives)]
    return replace(flat[0], alternatives=tuple(replace(s, alternatives=()) for s in flat[1:]))


def _forest_phases(collective: Collective) -> list[tuple[tuple[int, ...], bool]]:
    """(roots, reverse) of each forest a collective runs on, in phase order (reverse: a reduction)."""
    name, all_ranks, root = collective.name, tuple(range(collective.num_ranks)), (collective.root,)
    if name == "allgather":
        return [(all_ranks, False)]
    if name == "reducescatter":
        return [(all_ranks, True)]
    if name == "allreduce":
        return [(all_ranks, True), (all_ranks, False)]
    if name in ("broadcast", "scatter"):
        return [(root, False)]
    return [(root, True)]   # reduce, gather


def _capped_floor_us(topology: Topology, collective: Collective, size_bytes: float, cap: int) -> float:
    """Bandwidth time of the forests at most ``cap`` trees per root can reach (the rate of
    :func:`synth.synthesis.packing.choose_capacities`; the packed forests can only be slower)."""
    per_root_bytes = _per_root_bytes(collective.name, topology.num_ranks, size_bytes)
    total = 0.0
    for roots, reverse in _forest_phases(collective):
        fabric = integer_fabric(topology.reversed() if reverse else topology)
        weights = {r: 1 for r in roots}
        _, _, ratio = choose_capacities(fabric, weights, optimal_ratio(fabric, weights), cap)
        total += per_root_bytes * float(ratio) / (float(fabric.unit_GBps) * 1e3)
    return total


def _split_allreduce(topology: Topology, collective: Collective, size_bytes: float, sequential_us: float,
                     deadline: float | None, fit=_any_chunks) -> Schedule | None:
    """Allreduce on forests planned on link capacities split between its two phases
    (:mod:`synth.synthesis.split`) and timed side by side (:func:`_timed_forward`, ``joint``).

    The split is rounded to whole trees in both phases at once (:func:`~synth.synthesis.split.whole_tree_split`)
    where that solves in time, so the forests keep its rate (mesh-5x5, one tree per root: 0.92 / 0.90
    of it rounded phase by phase, all of it together). The fastest candidate is timed once more with
    :data:`POLISH`'s coalescings.

    None where that LP is not ``SPLIT_GAIN`` faster than the phases one after the other
    (``sequential_us``), and where no candidate fits MSCCL's limits. Switchless fabrics only: a
    split fabric can route a rank pair through other switches than the runtime would.
    """
    from synth.synthesis.split import split_capacities, whole_tree_split

    n = topology.num_ranks
    split = split_capacities(topology)
    piece_bytes = _per_root_bytes("allreduce", n, size_bytes)
    split_us = split.time_us(piece_bytes)
    if split_us > sequential_us * (1 - SPLIT_GAIN):
        return None
    roots = tuple(range(n))

    def fits(jobs: Jobs, heads: list[int] | None) -> bool:
        steps = connection_steps(jobs, heads)
        # each phase keeps its own channels, so a connection splits over half of them
        return (max(steps.values(), default=0) * STEP_MARGIN <= MAX_CHANNELS // 2 * MAX_STEPS_PER_TB
                and _busiest_rank_xml(steps, n) <= MAX_XML_NODES)

    best = None
    for cap in SPLIT_TREES:
        budget = time.monotonic() + WHOLE_SPLIT_SECONDS
        whole = whole_tree_split(topology, split, cap, deadline=budget if deadline is None else min(deadline, budget))
        shares = whole or split
        plans = [plan_forest(shares.reducescatter, roots, reverse=True, max_trees=cap),
                 plan_forest(shares.allgather, roots, max_trees=cap)]
        k = max(f.k for f in plans)
        wanted = sorted({c for c in SPLIT_CHUNKS if c >= k} | {k * c for c in SPLIT_CHUNKS})
        for chunks in dict.fromkeys(fit(c)[0] for c in wanted):   # see _runtime_chunks
            if deadline is not None and time.monotonic() > deadline:
                break
            # one chunk per message; split_chunks gives each root's trees their chunks and the others 0
            per_tree_chunks = [[sum(c) for c in zip(*(split_chunks(f, r, chunks) for r in roots))] for f in plans]
            if _pair_load(plans, per_tree_chunks) > MAX_CHANNELS * MAX_STEPS_PER_TB:
                break
            coll = Collective("allreduce", n, _chunk_factor("allreduce", n, chunks), collective.root,
                              collective.inplace)
            # built as it is timed: the transfers are cheap next to the list schedule
            timed = _timed_forward(coll, plans, topology, chunks, None, coll.chunk_bytes(size_bytes), True,
                                   joint=True, fits=fits)
            if timed is not None and (best is None or timed[0] < best[0] * (1 - 1e-9)):
                best = (*timed, plans, chunks, coll, shares)
        if whole is not None and whole.rate_GBps >= split.rate_GBps * (1 - 1e-9):
            break   # whole trees at the split's rate: more trees per root only cut the messages finer
    if best is None:
        return None
    makespan, transfers, plans, chunks, coll, shares = best
    if deadline is None or time.monotonic() < deadline:
        polished = _timed_forward(coll, plans, topology, chunks, None, coll.chunk_bytes(size_bytes), True,
                                  joint=True, coalescings=POLISH, fits=fits)
        if polished is not None and polished[0] < makespan * (1 - 1e-9):
            makespan, transfers = polished
    return _forest_schedule(topology, coll, transfers, makespan, plans, size_bytes, "trees",
                            chunks_per_root=chunks, messages_per_tree=None, tail_splits=0, halving_messages=False,
                            depth_trials=0,
                            capacity_split_time_us=split_us,
                            # the phases run side by side, each on its share (in tree edges, not GB/s)
                            tree_bandwidth_time_us=shares.time_us(piece_bytes)
                            * max(float(f.ratio / f.optimal) for f in plans))


def _path_schedule(topology: Topology, collective: Collective, size_bytes: float,
                   options: SynthOptions) -> Schedule | None:
    """Scatter or gather over the paths of its optimal flow (:mod:`synth.synthesis.paths`,
    :func:`_forward_paths`); a scatter is also built as the time mirror of the gather on the reversed
    fabric, whose flow is the same one walked back (:func:`_mirrored_gather`), and the faster plan kept.
    A gather walks the reversed fabric's flow from each rank to the root. None if no flow can be planned."""
    name, root = collective.name, collective.root
    try:
        flows = plan_paths(topology.reversed() if name == "gather" else topology, root)
    except SynthError:
        return None
    if name == "gather":
        return _forward_paths(topology, collective, size_bytes, options, _one_each(_towards_root(flows)),
                              alternatives=True)
    found = [_forward_paths(topology, collective, size_bytes, options, _one_each(flows), alternatives=True),
             *(_mirrored_gather(topology, collective, size_bytes, options, _towards_root(flows), levelled)
               for levelled in (False, True))]
    found = sorted((schedule for schedule in found if schedule is not None), key=lambda s: s.predicted_time_us)
    return _first_with_runner_ups(found) if found else None


def _towards_root(plans: list[PathPlan]) -> list[PathPlan]:
    """``plans`` with every path walked backwards, from its rank to the root (on the reversed fabric)."""
    return [replace(plan, paths=tuple(replace(path, hops=tuple((b, a, route[::-1]) for a, b, route
                                                                in reversed(path.hops)))
                                       for path in plan.paths)) for plan in plans]


def _mirrored_gather(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                     gather_plans: list[PathPlan], levelled: bool = False) -> Schedule | None:
    """A scatter as the gather on the reversed fabric (:func:`_forward_paths` on ``gather_plans``) run
    backwards in time, every transfer the other way, then re-timed forwards by :func:`justify` (always:
    the mirror alone plans what the runtime does not do; mi250-2node 3094 µs planned, 3371 simulated,
    justified 3123 and 3292). Each rank's sources push their own data from the start, which pipelines
    better than pulling it from the root: simulated scatter mi250-2node 0.855 -> 0.921 of the bound,
    dgx-h100-2node 0.964 -> 0.969, dgx-a100-4node 0.931 -> 0.940, and never slower on the built-in fabrics.
    ``levelled``: the gather's chunks shared among its paths with the links kept level
    (:func:`_levelled_counts`); :func:`_path_schedule` builds both, and the levelled mirror is the faster on
    mi250-2node (scatter 0.921 -> 0.959), mi250 and dgx-h100-2node, though not as a gather of its own."""
    gather = _forward_paths(topology.reversed(), replace(collective, name="gather"), size_bytes, options,
                            _one_each(gather_plans), levelled=levelled)
    if gather is None:
        return None
    span = gather.predicted_time_us
    coll = replace(gather.collective, name="scatter")
    base = collective.root * coll.input_chunks   # a gather's chunk q·C+s is slot q·C+s of the root's input
    mirrored = [Transfer(span - t.end, span - t.start, base + t.chunk, t.dst, t.src, False, t.route[::-1],
                         t.channel, t.group) for t in gather.transfers]
    timed = justify(mirrored, topology, coll.chunk_bytes(size_bytes), math.inf)
    if timed is None:
        return None
    makespan, transfers = timed
    transfers.sort(key=lambda t: (t.start, t.end))
    notes = {**gather.notes, "score_us": makespan, "mirrored_gather": True}
    return Schedule(coll, topology.name, tuple(transfers), method="trees", size_bytes=float(size_bytes),
                    predicted_time_us=makespan, notes=notes)


def _one_each(plans: list[PathPlan]) -> list[tuple[PathPlan, ...]]:
    """Each plan a candidate of its own (a scatter or gather has one root)."""
    return [(plan,) for plan in plans]


def _forward_paths(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                   candidates: list[tuple[PathPlan, ...]], counts_tried: tuple[int, ...] = PATH_CHUNKS,
                   method: str = "trees", priorities: tuple[str, ...] = ("deadline", "position", "rounds"),
                   alternatives: bool = False, levelled: bool | None = None) -> Schedule | None:
    """Scatter, gather or alltoall on flow paths (each candidate: one plan per root,
    :func:`synth.synthesis.paths.plan_paths` with each path walked in the collective's direction, or
    :func:`synth.synthesis.paths.plan_alltoall_paths`) instead of a broadcast forest, whose subtrees load
    links by where ranks sit in the trees rather than by what the cut needs (dgx-a100-2node scatter: 0.71
    of the bound on trees).
    Each rank's chunks are shared among its paths by their flow and pipelined hop by hop (one job per
    chunk, coalesced as in :func:`list_schedule`), for each plan, each of ``priorities`` of :func:`_path_jobs`
    and each of ``counts_tried`` chunks per rank piece (or ``--chunks``) within MSCCL's limits; the
    fastest is kept (behind shared switch links by the mean of the planned and the replayed makespan,
    :func:`replayed_makespan`). With ``alternatives`` the best of every other priority comes along as
    the schedule's alternatives, for the pipeline to time (behind switches the score mispredicts which
    priority the runtime serves best). None if no candidate fits."""
    name = collective.name
    fit = _chunk_fit(collective, size_bytes, options)
    counts = [options.chunks] if options.chunks else sorted({fit(c)[0] for c in counts_tried})
    best: dict[tuple[str, int], tuple] = {}   # (priority, chunks or 0) -> its best (score, collective, jobs, ...)
    # Do rank pairs share switch links (the runtime's arbitration then matters)? Judged on the first
    # candidate, the fewest chunks. On mi250-2node its few transfers share none, so candidates there are
    # scored by their plan alone, which simulates better than the replay-scored choice (gather 0.979 of
    # the bound against 0.899).
    shared = None
    # an alltoall's pieces share their paths' chunks with the links kept level (many roots' pieces meet
    # at every port: dgx-a100-4node 0.966 -> 0.975); one root's piece by piece, which simulates better
    # there (levelled: dgx-a100-2node scatter 0.978 -> 0.972, dgx-h100-2node gather 0.982 -> 0.964)
    levelled = len(candidates[0]) > 1 if levelled is None else levelled
    for plans, priority, chunks in itertools.product(candidates, priorities, counts):
        coll = replace(collective, chunk_factor=chunks)
        chunk_bytes = coll.chunk_bytes(size_bytes)
        jobs = _path_jobs(coll, plans, chunks, topology, chunk_bytes, priority, levelled)
        if jobs is None:
            continue
        if shared is None:
            shared = bool(topology.switches) and shares_links(jobs)
        # rounds: each count's best is a runner-up of its own (see _timed_paths)
        kind = (priority, chunks) if priority == "rounds" else (priority, 0)
        for score, start, end, heads in _timed_paths(jobs, topology, chunk_bytes, priority == "rounds", shared):
            if kind not in best or score < best[kind][0] * (1 - 1e-9):
                best[kind] = (score, coll, jobs, start, end, heads, plans, priority)
    if not best:
        return None
    ranked = sorted(best.values(), key=lambda found: found[0])
    kept_rounds = {id(found) for found in [found for found in ranked if found[-1] == "rounds"][:ROUNDS_RUNNERS_UP]}
    ranked = [found for found in ranked if found[-1] != "rounds" or id(found) in kept_rounds]
    return _first_with_runner_ups([_path_schedule_of(topology, name, size_bytes, method, *found)
                                   for found in (ranked if alternatives else ranked[:1])])


def _timed_paths(jobs: Jobs, topology: Topology, chunk_bytes: float, in_rounds: bool, shared: bool):
    """(score, start, end, heads) of each timing of path ``jobs`` that fits MSCCL's limits: list
    schedules plain and coalesced (:data:`BUILT`), or, for rounds of circuits, every link in round
    order (:func:`synth.synthesis.circuits.ordered_schedule`; nothing else keeps the rounds).

    Behind ``shared`` switch links the runtime serves sends as they become ready: a list schedule
    scores the mean of its planned and replayed makespans, as the forests' search does. Rounds keep
    their order on the uplinks (the lowering's uplink dependencies), so their plan is their score; the
    receiving ports still take sends as they come, and rounds at different chunk counts simulate
    further apart than their plans (dgx-a100-4node: 33.3 ms to 36.0 ms for plans within 1 %)."""
    n = topology.num_ranks
    limit = MAX_CHANNELS * MAX_STEPS_PER_TB
    costs = route_costs(jobs, topology, chunk_bytes)
    for how in (("ordered",) if in_rounds else (None, *BUILT)):
        if how == "ordered":
            links, _, _, duration = costs
            order, start, end = circuits.ordered_schedule(jobs.key, jobs.deps, links, duration, len(topology.links))
        else:
            order, start, end = list_schedule(jobs, topology, chunk_bytes, coalesce=how is not None,
                                              **(asdict(how) if how is not None else {}), costs=costs)
        heads = list(jobs.head) if isinstance(how, Coalescing) else None   # only coalescing merges jobs
        steps = connection_steps(jobs, heads)
        if max(steps.values()) > limit or _busiest_rank_xml(steps, n) > MAX_XML_NODES:
            continue
        makespan = float(end.max())
        score = (makespan + replayed_makespan(jobs, topology, chunk_bytes, order, costs)) / 2 \
            if shared and not in_rounds else makespan
        yield score, start, end, heads


def _path_schedule_of(topology: Topology, name: str, size_bytes: float, method: str, score: float,
                      coll: Collective, jobs: Jobs, start: np.ndarray, end: np.ndarray, heads: list[int] | None,
                      plans: tuple[PathPlan, ...], priority: str) -> Schedule:
    """The Schedule of one timed path candidate of :func:`_forward_paths` (``priority``: how its jobs were ordered)."""
    n = topology.num_ranks
    groups = message_groups(jobs, heads)
    transfers = [Transfer(float(start[i]), float(end[i]), chunk, jobs.src[i], jobs.dst[i], False, jobs.route[i], 0,
                          groups[i]) for i, msg in enumerate(jobs.msg) for chunk in msg]
    transfers.sort(key=lambda t: (t.start, t.end))
    notes = {"paths": sum(len(plan.paths) for plan in plans), "chunks_per_root": coll.chunk_factor,
             "score_us": score, "flow_time_us": plans[0].time_per_byte_us * _per_root_bytes(name, n, size_bytes),
             "priority": priority}
    return Schedule(coll, topology.name, tuple(transfers), method=method, size_bytes=float(size_bytes),
                    predicted_time_us=float(end.max()), notes=notes)


def _path_jobs(coll: Collective, plans: tuple[PathPlan, ...], chunks: int, fabric: Topology, chunk_bytes: float,
               priority: str = "deadline", levelled: bool = True) -> Jobs | None:
    """One job per chunk and hop, for the paths of every plan (one per root): rank ``q``'s chunks from
    the plan's root are shared among its paths in proportion to their flow (:func:`_levelled_counts`,
    ``levelled`` or piece by piece), a contiguous block each, and pipelined down the path.

    ``priority`` ``deadline``: the latest start that keeps the flow's pace (earliest deadline first):
    chunk ``j`` of ``m`` on a path is due at its rank at ``(j+1)/m`` of the flow's time, less the α-β
    time of the hops still ahead, so data bound for a slow last hop (a NIC) leaves the root first.
    ``position``: as in :func:`add_broadcast`, the chunk's position in its path's data less the hops
    ahead. ``shift`` (alltoall): the chunk's index, then the destination's offset from the root, so that
    each root's ``j``-th chunks go out to its peers in the order ``root+1, root+2, ...``: at any time the
    roots tend to feed different ranks, the rounds of permutations a switch serves without two circuits
    meeting at one port (dgx-a100-4node 1 GiB alltoall: 0.691 -> 0.781 of the bound). ``rounds``: switch
    hops in rounds of disjoint circuits (:func:`_in_circuit_rounds`; None where no path crosses a
    switch). Which one is fastest depends on the fabric; :func:`_forward_paths` times those it is given."""
    n = coll.num_ranks
    span = plans[0].time_per_byte_us * chunk_bytes * chunks   # the flow's time: the plans share one T
    link_index = {(link.src, link.dst): i for i, link in enumerate(fabric.links)}
    _, _, bw, alpha = fabric.arrays

    def hop_load(src: int, dst: int, route: tuple[int, ...]) -> tuple[list[int], float]:
        links, route_alpha_us, route_bw = route_cost((src, *route, dst), link_index, alpha, bw)
        return links, route_alpha_us + chunk_bytes / (route_bw * 1e3)

    jobs = Jobs.empty()
    first = 0    # paths numbered across plans, for the priority's last ties
    base = "position" if priority == "rounds" else priority
    counts_of = _levelled_counts(plans, chunks, hop_load, levelled)
    for k, plan in enumerate(plans):
        for q, members in _pieces(plan):
            ids = ([coll.contribution(plan.root, q * chunks + s) for s in range(chunks)]
                   if coll.name in ("scatter", "alltoall") else [coll.contribution(q, s) for s in range(chunks)])
            counts = counts_of[(k, q)]
            pos = 0
            for p, count in zip(members, counts):
                hops = plan.paths[p].hops
                offset = (plan.paths[p].dest - plan.root) % n
                times = [hop_load(*hop)[1] for hop in hops]
                for j, chunk in enumerate(ids[pos:pos + count]):
                    before = ()
                    for h, (src, dst, route) in enumerate(hops):
                        if base == "shift":
                            key = (0, j, offset, h, first + p)
                        else:
                            latest = (span * (j + 1) / count - sum(times[h:]) if base == "deadline"
                                      else (j + 1 - (len(hops) - h - 1)) / count)
                            key = (0, latest, h - len(hops), (dst - src) % n, first + p, h)
                        before = (jobs.add((chunk,), src, dst, route, False, before, key),)
                pos += count
        first += len(plan.paths)
    return jobs if priority != "rounds" else _in_circuit_rounds(jobs, fabric, chunk_bytes)


def _pieces(plan: PathPlan) -> list[tuple[int, list[int]]]:
    """(rank, the indices of its paths) for every rank the plan's root sends a piece to, by rank."""
    by_dest: dict[int, list[int]] = defaultdict(list)
    for p, path in enumerate(plan.paths):
        by_dest[path.dest].append(p)
    return sorted(by_dest.items())


def _levelled_counts(plans: tuple[PathPlan, ...], chunks: int, hop_load,
                     levelled: bool = True) -> dict[tuple[int, int], list[int]]:
    """Chunks per path of every piece (plan ``k``, rank ``q``; its paths in plan order): each path's
    share of ``chunks`` rounded down, then the chunks left given one at a time, piece by piece, to the
    path whose busiest link (``hop_load(src, dst, route)``: link ids, µs per chunk) would carry the
    least, larger remainder first on ties. Rounding each piece alone (largest remainder) can hand
    every piece's extra chunk to the same port: on dgx-a100-4node's alltoall at one chunk per piece a
    NIC then carries 25 pieces where the flow gives each 24 (one round, 4 %, longer). Without
    ``levelled``, each piece's chunks go by largest remainder (Hamilton's method)."""
    if not levelled:
        return {(k, q): split_counts(chunks, [plan.paths[p].share for p in members])
                for k, plan in enumerate(plans) for q, members in _pieces(plan)}
    load: dict[int, float] = defaultdict(float)
    pieces = []
    for k, plan in enumerate(plans):
        for q, members in _pieces(plan):
            shares = [plan.paths[p].share for p in members]
            exact = [chunks * share / sum(shares) for share in shares]
            counts = [math.floor(x + 1e-9) for x in exact]
            uses = [[hop_load(*hop) for hop in plan.paths[p].hops] for p in members]
            for count, hops in zip(counts, uses):
                for links, per_chunk in hops:
                    for link in links:
                        load[link] += count * per_chunk
            pieces.append(((k, q), exact, counts, uses))
    counts_by_piece = {}
    for piece, exact, counts, uses in pieces:
        for _ in range(chunks - sum(counts)):
            after = [max(load[link] + per_chunk for links, per_chunk in hops for link in links) for hops in uses]
            pick = min(range(len(counts)), key=lambda i: (counts[i] >= math.ceil(exact[i] - 1e-9), after[i],
                                                          counts[i] - exact[i], i))
            counts[pick] += 1
            for links, per_chunk in uses[pick]:
                for link in links:
                    load[link] += per_chunk
        counts_by_piece[piece] = counts
    return counts_by_piece


def _in_circuit_rounds(jobs: Jobs, fabric: Topology, chunk_bytes: float) -> Jobs | None:
    """``jobs`` (keyed by position) keyed by the round of :func:`synth.synthesis.circuits.circuit_rounds`
    instead: switch hops in rounds of disjoint circuits, a path's other hops a round per hop before or
    after its bottleneck; paths without a switch hop by position, spread over as many rounds. None
    where no path crosses a switch."""
    links, _, _, duration = route_costs(jobs, fabric, chunk_bytes)
    chains = circuits.chains_of(jobs.deps)
    rounds_of = circuits.circuit_rounds(chains, links, [bool(route) for route in jobs.route], duration, jobs.key)
    if all(r is None for r in rounds_of):
        return None
    span = 1 + max(r for r in rounds_of if r is not None)
    # a position key is (0, position, -hops ahead, ...): rounds take the position's place
    keys = [(0, float(r), *key[2:]) if r is not None else (0, key[1] * span, *key[2:])
            for r, key in zip(rounds_of, jobs.key)]
    return replace(jobs, key=keys)


def _forest_schedule(topology: Topology, coll: Collective, transfers: list[Transfer], makespan: float,
                     plans: list[Forest], size_bytes: float, method: str, **notes) -> Schedule:
    """The Schedule of timed forests, with the forests' figures and ``notes`` in its notes."""
    per_root_bytes = _per_root_bytes(coll.name, topology.num_ranks, size_bytes)
    transfers.sort(key=lambda t: (t.start, t.end))
    notes = {
        "trees_per_root": [f.k for f in plans],
        "distinct_trees": [len(f.trees) for f in plans],
        "rate_ratio": [float(f.optimal / f.ratio) for f in plans],
        "tree_bandwidth_time_us": sum(f.bandwidth_time_us(per_root_bytes) for f in plans),
        **notes,
    }
    return Schedule(coll, topology.name, tuple(transfers), method=method, size_bytes=float(size_bytes),
                    predicted_time_us=makespan, notes=notes)


def _pair_loads(plans: list[Forest], messages: list[list[int]]) -> dict[tuple[int, int], int]:
    """Messages per directed rank pair, all phases together, when every edge of tree ``t`` of
    ``plans[f]`` carries ``messages[f][t]`` (a reduction's edges run child -> parent)."""
    load: dict[tuple[int, int], int] = defaultdict(int)
    for forest, counts in zip(plans, messages):
        for tree, count in zip(forest.trees, counts):
            for parent, child in tree.edges:
                load[(child, parent) if forest.reversed else (parent, child)] += count
    return load


def _pair_load(plans: list[Forest], messages: list[list[int]]) -> int:
    """Most messages one directed rank pair carries (:func:`_pair_loads`)."""
    return max(_pair_loads(plans, messages).values(), default=0)


def _xml_nodes(plans: list[Forest], messages: list[list[int]]) -> float:
    """XML nodes of the busiest rank when tree ``t`` of ``plans[f]`` sends ``messages[f][t]`` per edge
    (:func:`_busiest_rank_xml` of :func:`_pair_loads`)."""
    return _busiest_rank_xml(_pair_loads(plans, messages), plans[0].num_ranks)


def _busiest_rank_xml(steps: dict[tuple, int], n: int) -> float:
    """XML nodes of the busiest of ``n`` ranks, with ``steps`` keyed by (sender, receiver, ...): a step per
    message sent or received, × ``STEP_MARGIN`` for nops, plus the algo, gpu and (at most
    ``4 · MAX_CHANNELS``) threadblock nodes."""
    per_rank: dict[int, int] = defaultdict(int)
    for (src, dst, *_), count in steps.items():
        per_rank[src] += count
        per_rank[dst] += count
    return max(per_rank.values(), default=0) * STEP_MARGIN + 1 + n + 4 * MAX_CHANNELS


def _symmetric(topology: Topology) -> bool:
    """Every link has a reverse twin of the same bandwidth and α."""
    links = {(lk.src, lk.dst): (lk.bw, lk.alpha) for lk in topology.links}
    return all(links.get((b, a)) == v for (a, b), v in links.items())


def _routes_symmetric(topology: Topology) -> bool:
    """Does every rank pair's route through switches run back the same way?"""
    routes = rank_routes(topology)
    return all(routes.get((b, a)) == path[::-1] for (a, b), path in routes.items())


def _flipped_planner(topology: Topology, trees_cap: int):
    """Each phase's forest planned on the other orientation (broadcast trees on the reversed fabric,
    reductions on the fabric itself). On a fabric equal to its reverse, routes included, those trees
    are as optimal and as valid, but the packing breaks its ties differently, and one forest may suit
    the message shape better (dgx-a100-2node allgather at 64 chunks per root: 0.9794, flipped 0.9807)."""
    def planner(roots: tuple[int, ...], reverse: bool) -> Forest:
        return replace(plan_forest(topology, roots, reverse=not reverse, max_trees=trees_cap), reversed=reverse)
    return planner


def _piece_options(collective: Collective, options: SynthOptions) -> SynthOptions:
    """``options`` with ``--chunks`` counted per root piece, as the forests count: an allreduce's
    chunk factor covers the whole buffer, which its ``n`` roots own ``C / n`` chunks of each."""
    if collective.name != "allreduce" or options.chunks is None:
        return options
    n = collective.num_ranks
    if options.chunks % n:
        raise SynthError(f"--chunks {options.chunks}: an allreduce on trees needs a multiple of its {n} ranks "
                         f"(each rank reduces and broadcasts C/{n} of the buffer's chunks)")
    return replace(options, chunks=options.chunks // n)


def schedule_from_plans(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                        planner, method: str, other_planner=None) -> Schedule:
    """Plan the forests a collective needs with ``planner(roots, reverse)`` and pipeline them
    (:func:`_pipeline`, :func:`_polish`, :func:`_finish`)."""
    options = _piece_options(collective, options)
    pipelined = _pipeline(topology, collective, size_bytes, options, planner, other_planner)
    return _justified(topology, _finish(topology, collective, size_bytes, options,
                                        _polish(topology, collective, size_bytes, pipelined), method))


def _justified(topology: Topology, schedule: Schedule) -> Schedule:
    """``schedule`` compacted by :func:`justify` where that is shorter (up to ``LARGE_RANKS`` ranks
    and ``JUSTIFY_TRANSFERS`` transfers); its notes say whether it was (``justified``)."""
    transfers = list(schedule.transfers)
    found = None
    if topology.num_ranks <= LARGE_RANKS and 0 < len(transfers) <= JUSTIFY_TRANSFERS:
        found = justify(transfers, topology, schedule.collective.chunk_bytes(schedule.size_bytes),
                        schedule.predicted_time_us)
    if found is None:
        return replace(schedule, notes={**schedule.notes, "justified": False})
    makespan, transfers = found
    transfers.sort(key=lambda t: (t.start, t.end))
    return replace(schedule, transfers=tuple(transfers), predicted_time_us=makespan,
                   notes={**schedule.notes, "justified": True})


@dataclass(frozen=True)
class _Pipelined:
    """Forests timed at the message shape found for them: ``timed`` is (collective, makespan,
    transfers) at ``chunks`` per root, ``messages`` per tree and ``tail`` (:func:`_messages`), with
    priority ``weight``; ``floor`` is the forests' bandwidth time."""
    plans: list[Forest]
    timed: tuple[Collective, float, list[Transfer]]
    chunks: int
    messages: int | None
    tail: int
    trials: int
    weight: float
    floor: float
    deadline: float | None


def _pipeline(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
              planner, other_planner=None) -> _Pipelined:
    """Plan the forests with ``planner`` and search their pipeline depth and message shape.

    ``other_planner``: forests as good by rate, timed at the message shape found for the first ones
    and kept if faster (:func:`_flipped_planner`)."""
    name, n = collective.name, topology.num_ranks
    # --time-limit: the planning always completes; the pipeline-depth search stops early
    deadline = deadline_of(options)
    plans = [planner(roots, reverse) for roots, reverse in _forest_phases(collective)]

    per_root_bytes = _per_root_bytes(name, n, size_bytes)
    fit = _chunk_fit(collective, size_bytes, options)
    first_chunks, first_messages = _choose_chunks(topology, collective, plans, per_root_bytes, options.chunks, fit)
    outcome = None
    # each priority (see HEIGHT_WEIGHTS) gets its own depth search; the fastest schedule is kept
    # the 4x priority only where the first search is cheap (deterministic: by transfer count)
    weights = HEIGHT_WEIGHTS if _job_estimate(plans, first_chunks, first_messages) <= ALT_PRIORITY_JOBS else (1.0,)
    floor = sum(f.bandwidth_time_us(per_root_bytes) for f in plans)   # the forests' bandwidth time
    for weight in weights:
        chunks, messages, tail, trials = first_chunks, first_messages, 0, 0
        # at scale one message per tree is final (see _choose_chunks): no depth search, one timing pass
        search = (messages is not None and n <= LARGE_RANKS
                  and (deadline is None or time.monotonic() < deadline))
        # a search starts plain (it tries mirrors itself; its shape is built with every α share below);
        # a timing without a search tries everything at once
        first = _Timing(weight, mirror=False) if search else _Timing(weight, coalescings=BUILT)
        best = _timed(topology, collective, plans, chunks, messages, size_bytes, build=not search, timing=first)
        if search:
            best, shape, messages, tail, trials = _refine_depth(topology, collective, plans, size_bytes, best,
                                                                chunks, messages, deadline, weight, floor, fit)
            # the shape found is built with every share of α for coalesced messages (see ALPHA_SHARES)
            built = [(_timed(topology, collective, plans, c, m, size_bytes, tail=tail,
                             timing=_Timing(weight, coalescings=BUILT)), c, m)
                     for c, m in _built_shapes(plans, fit, shape, messages, tail)]
            best, chunks, messages = min(built, key=lambda b: b[0][1])
        if outcome is None or best[1] < outcome[0][1] * (1 - 1e-9):
            outcome = (best, chunks, messages, tail, trials, weight)
        if not search:   # no search, no alternatives: large schedules are timed once
            break
    best, chunks, messages, tail, trials, weight = outcome
    # five more list schedules: only where they are quick (dgx-a100-2node 2.4k transfers, mi250-2node 70k)
    if (other_planner is not None and _job_estimate(plans, chunks, messages, tail) <= FORWARD_JOBS
            and (deadline is None or time.monotonic() < deadline)):
        others = [other_planner(roots, reverse) for roots, reverse in _forest_phases(collective)]
        if [f.k for f in others] == [f.k for f in plans]:
            timed = _timed(topology, collective, others, chunks, messages, size_bytes, tail=tail,
                           timing=_Timing(weight, coalescings=BUILT))
            if timed[1] < best[1] * (1 - 1e-9):
                best, plans = timed, others
    return _Pipelined(plans, best, chunks, messages, tail, trials, weight, floor, deadline)


def _polish(topology: Topology, collective: Collective, size_bytes: float, pipelined: _Pipelined) -> _Pipelined:
    """The kept shape timed once more with the coalescings only it gets (:data:`POLISH`: drained and
    batched messages); the faster timing is kept. Not at scale (one timing pass there) nor past
    the time limit."""
    if topology.num_ranks > LARGE_RANKS or (pipelined.deadline is not None and time.monotonic() > pipelined.deadline):
        return pipelined
    timed = _timed(topology, collective, pipelined.plans, pipelined.chunks, pipelined.messages, size_bytes,
                   tail=pipelined.tail, timing=_Timing(pipelined.weight, coalescings=POLISH))
    return replace(pipelined, timed=timed) if timed[1] < pipelined.timed[1] * (1 - 1e-9) else pipelined


def _finish(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
            pipelined: _Pipelined, method: str, rounds_tried: bool = False) -> Schedule:
    """The Schedule of a pipeline, or of its forests timed by rounds where that is faster (unless
    ``rounds_tried``)."""
    name, n = collective.name, topology.num_ranks
    plans, floor, trials = pipelined.plans, pipelined.floor, pipelined.trials
    coll, offset, transfers = pipelined.timed
    if (not rounds_tried and offset > floor * (1 + TAIL_GAIN) and n <= LARGE_RANKS and name in ROUND_TIMED
            and not topology.switches and ROUNDS * float(topology.arrays[3].max()) * 2 <= ROUND_ALPHA_SHARE * floor):
        # α, fill and drain cost more than 1 %: try timing the same forests by rounds (synth.synthesis.rounds).
        # Not behind switches, where every message pays α on each hop and holds its whole route: there
        # rounds lose (dgx-a100-2node allgather 0.947 against 0.978, dgx-a100-4node 0.928 against 0.976)
        fit = _chunk_fit(collective, size_bytes, options)
        options_chunks = list(dict.fromkeys(fit(c)[0] for c in ROUND_CHUNKS))
        timed = _timed_rounds(topology, collective, plans, options_chunks, size_bytes, pipelined.deadline, offset)
        if timed is not None and timed[1] < offset * (1 - 1e-9):
            coll, offset, transfers, chunks = timed
            return _forest_schedule(topology, coll, transfers, offset, plans, size_bytes, method,
                                    chunks_per_root=chunks, round_timed=ROUNDS, depth_trials=trials)
    tail, messages = pipelined.tail, pipelined.messages
    return _forest_schedule(topology, coll, transfers, offset, plans, size_bytes, method,
                            chunks_per_root=pipelined.chunks,
                            messages_per_tree=None if tail == HALVING else messages, tail_splits=max(tail, 0),
                            halving_messages=tail == HALVING, depth_trials=trials)


PIPELINE_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def _refine_depth(topology: Topology, collective: Collective, plans: list[Forest], size_bytes: float, best,
                  chunks: int, messages: int, deadline: float | None, height_weight: float = 1.0,
                  floor: float = 0.0, fit=_any_chunks):
    """Search the pipeline depth, timing each candidate with the list schedule (the closed form is
    rough about fill and drain), while schedules are cheap and the time limit allows.

    Three message shapes are tried, each hill-climbed on :data:`PIPELINE_GRID` (broadcast and reduce,
    whose one piece is the whole buffer, also on :data:`DEEP_GRID`, up to ``ONE_ROOT_CHUNKS`` chunks and
    within a rank's XML nodes, :func:`_xml_nodes`): ``P`` messages per
    distinct tree (``C = k·P`` chunks per root; a tree of multiplicity ``m`` sends messages of
    ``m`` chunks); one chunk per message (``C = k·P``; a tree of multiplicity ``m`` sends
    ``m·P`` equal messages, so every link pays α in proportion to its bytes, not to the number of
    trees crossing it); and ``P`` messages per tree whose last one is halved ``L`` times
    (``C = k·P·2^L``, :func:`_messages`), with ``L`` from :data:`TAIL_SPLITS` (``P`` is climbed at
    the first, the others are timed at the ``P`` found) when the best of the first two is more than
    ``TAIL_GAIN`` above ``floor`` (the forest's bandwidth time). There the halving shape
    (``tail == HALVING``, ``C = k·P`` with ``P`` from :data:`HALVING_CHUNKS`; allreduce: the first) is timed too.
    Each shape is timed at the nearest ``C`` that ``fit`` allows (:func:`_runtime_chunks`).
    Returns (best timed, the shape's own chunks, messages or None, tail, candidates timed).
    """
    k = max(f.k for f in plans)
    one_root = collective.name in ONE_ROOT
    grid = PIPELINE_GRID + DEEP_GRID if one_root else PIPELINE_GRID

    def fitted(per_tree: bool, p: int, tail: int) -> tuple[int, int | None]:
        raw = _shape_chunks(k, p, tail)
        chunks = fit(raw)[0]
        return chunks, _refit_messages(p if per_tree else None, chunks, raw, tail)

    # candidates: (one message per tree part?, P, tail)
    timed: dict[tuple[bool, int, int], float] = {(True, messages, 0): best[1]}
    # several candidates can fit to one (chunks, messages) shape (always, with --chunks): each is timed once
    by_shape: dict[tuple, float] = {}
    choice = (True, messages, 0)
    last_trial = 0.0

    def feasible(per_tree: bool, p: int, tail: int) -> bool:
        cap = ONE_ROOT_CHUNKS if one_root else MAX_TAIL_CHUNKS if tail != 0 else MAX_CHUNKS   # tailed or halving
        if _shape_chunks(k, p, tail) > cap:
            return False
        shape = (*fitted(per_tree, p, tail), tail)
        if _job_estimate(plans, *shape) > REFINE_JOBS:
            return False
        loads = _pair_loads(plans, _tree_messages(plans, *shape))
        # deep pipelines of one root can outgrow a relaying rank's XML nodes before any connection's steps
        return (max(loads.values(), default=0) <= MAX_CHANNELS * MAX_STEPS_PER_TB
                and (not one_root or _busiest_rank_xml(loads, topology.num_ranks) <= MAX_XML_NODES))

    def neighbours(p: int) -> list[int]:
        # two grid points each way: the makespan is not unimodal in P (ndv2-2node: 12 < 16 > 24 > 32)
        below = [g for g in grid if g < p]
        above = [g for g in grid if g > p]
        return below[-2:] + above[:2]

    def trial(per_tree: bool, p: int, tail: int, mirror: bool = False) -> bool:
        """Time one candidate; False when the time limit would not allow it."""
        nonlocal best, choice, last_trial
        shape = (*fitted(per_tree, p, tail), tail, mirror)
        if shape in by_shape:   # the same schedule: it cannot beat the best it was compared with
            timed[(per_tree, p, tail)] = by_shape[shape]
            return True
        began = time.monotonic()
        if deadline is not None and began + last_trial > deadline:   # the next one would not fit
            return False
        timed_now = _timed(topology, collective, plans, *shape[:2], size_bytes, build=False,
                           tail=tail, timing=_Timing(height_weight, mirror))
        last_trial = time.monotonic() - began
        timed[(per_tree, p, tail)] = by_shape[shape] = timed_now[1]
        if timed_now[1] < best[1] * (1 - 1e-9):
            best, choice = timed_now, (per_tree, p, tail)
        return True

    def climb(per_tree: bool, first: int, tail: int) -> bool:
        current = first
        while True:
            moved = False
            for p in ([current] if (per_tree, current, tail) not in timed else []) + neighbours(current):
                if (per_tree, p, tail) in timed or not feasible(per_tree, p, tail):
                    continue
                if not trial(per_tree, p, tail):
                    return False
                if choice == (per_tree, p, tail) and p != current:
                    moved = True
            if not moved:
                return True
            current = choice[1]

    def done():
        per_tree, p, tail = choice
        return best, _shape_chunks(k, p, tail), p if per_tree else None, tail, len(by_shape)

    def mirrored():
        # allgather: its mirrored reduction timed forward (see _timed) at the shape found and the
        # two grid points below (a reduction pipelines best with fewer messages: dgx-h100-2node P 2 -> 1)
        if collective.name == "allgather":
            per_tree, p, tail = choice
            for q in [p] + [g for g in grid if g < p][-2:]:
                if not _forward_fits(plans, *fitted(per_tree, q, tail), tail):
                    continue   # the trial would only repeat the plain timing
                if feasible(per_tree, q, tail) and not trial(per_tree, q, tail, mirror=True):
                    break
        return done()

    for per_tree, first in ((True, messages), (False, 4)):
        if not climb(per_tree, first, 0):
            return done()
    if best[1] <= floor * (1 + TAIL_GAIN):
        return done()
    # tails start from the best plain per-tree depth
    start = min((key for key in timed if key[0] and key[2] == 0), key=timed.__getitem__)[1]
    if not climb(True, start, TAIL_SPLITS[0]):
        return done()
    at = min((key for key in timed if key[2] == TAIL_SPLITS[0]), key=timed.__getitem__, default=None)
    for tail in TAIL_SPLITS[1:]:
        if at is not None and feasible(True, at[1], tail) and not trial(True, at[1], tail):
            return done()
    # allreduce: its trials time two phases three ways, so only the first size (ndv2-2node 0.986 -> 0.992)
    for p in HALVING_CHUNKS if collective.name != "allreduce" else HALVING_CHUNKS[:1]:
        if feasible(True, p, HALVING) and not trial(True, p, HALVING):
            return done()
    return mirrored()


def _built_shapes(plans: list[Forest], fit, shape: int, messages: int | None,
                  tail: int) -> list[tuple[int, int | None]]:
    """(chunks, messages per tree) at which the shape the depth search found (``shape`` chunks per root)
    is built: the runtime-usable count nearest its own and, where its own is not usable, the second
    nearest (``fit``, :func:`_runtime_chunks`), each with the shape's messages per tree and with as many
    as keep its message size (:func:`_refit_messages`); those within MSCCL's steps per connection."""
    near = fit(shape)
    shapes = list(dict.fromkeys((c, m) for c in near[:1 if near[0] == shape else 2]
                                for m in (messages, _refit_messages(messages, c, shape, tail))))
    limit = MAX_CHANNELS * MAX_STEPS_PER_TB
    # the search timed one of them within the limit; the estimate rounds up, so keep the first regardless
    return [(c, m) for c, m in shapes if _pair_load(plans, _tree_messages(plans, c, m, tail)) <= limit] or shapes[:1]


def _refit_messages(messages: int | None, chunks: int, shape_chunks: int, tail: int) -> int | None:
    """Messages per tree at ``chunks`` per root for a plain shape of ``shape_chunks`` (:func:`_runtime_chunks`):
    as many more or fewer as keep each message the shape's number of chunks (uneven messages pipeline
    worse: dgx1 broadcast at 512 for 432 chunks per root, 72 messages per tree 0.912, 85 messages 0.938).
    Tailed and halving shapes keep their count (their last messages are cut anyway; dgx-a100-4node
    allgather 0.976 kept, 0.974 refitted)."""
    if messages is None or tail != 0 or chunks == shape_chunks:
        return messages
    return max(1, round(messages * chunks / shape_chunks))


def _shape_chunks(k: int, p: int, tail: int) -> int:
    """Chunks per root of a message shape (see :func:`_refine_depth`)."""
    return k * p if tail == HALVING else k * p * 2 ** tail


@dataclass(frozen=True)
class _Timing:
    """How :func:`_timed` times a message shape.

    ``height_weight``: the hops-ahead term of the priority (:func:`add_broadcast`); ``mirror``: an
    allgather is also timed as the mirror of its reduction timed forward (:func:`_mirrored_reduction`)
    and the faster is kept; ``coalescings``: the coalesced timings tried (:func:`list_schedule`).
    """
    height_weight: float = 1.0
    mirror: bool = True
    coalescings: tuple[Coalescing, ...] = (Coalescing(),)


def _timed(topology: Topology, collective: Collective, plans: list[Forest], chunks: int, messages: int | None,
           size_bytes: float, build: bool = True, tail: int = 0,
           timing: _Timing = _Timing()) -> tuple[Collective, float, list[Transfer]]:
    """All phases, one after the other: (collective with its chunk factor, makespan, transfers;
    the transfers only if ``build``, else a search score in place of the makespan, see
    :func:`_timed_phase`). ``tail``: the message shape (:func:`_messages`)."""
    name, n = collective.name, topology.num_ranks
    coll = Collective(name, n, _chunk_factor(name, n, chunks), collective.root, collective.inplace)
    chunk_bytes = coll.chunk_bytes(size_bytes)
    transfers: list[Transfer] = []
    offset = 0.0
    for phase, forest in enumerate(plans):
        jobs = _phase_jobs(coll, forest, phase, chunks, messages, timing.height_weight, tail)
        if len(jobs.msg) > MAX_TRANSFERS:
            raise SynthError(f"--chunks {chunks} makes {len(jobs.msg)} transfers; use fewer chunks")
        # each phase on its own channel: an allreduce's two phases fill a threadblock each
        part, makespan = _timed_phase(jobs, forest, topology, chunk_bytes, offset, coll.is_reduction, build,
                                      channel=phase, coalesce=name in COALESCING,
                                      coalescings=timing.coalescings)
        transfers += part
        offset += makespan
    if name in ("reducescatter", "allreduce"):
        forward = _timed_forward(coll, plans, topology, chunks, messages, chunk_bytes, build, tail,
                                 coalescings=timing.coalescings)
        if forward is not None and forward[0] < offset * (1 - 1e-9):
            return coll, forward[0], forward[1]
    if name == "allgather" and timing.mirror:
        mirrored = _mirrored_reduction(coll, plans[0], topology, chunks, messages, chunk_bytes, build, tail,
                                       timing.coalescings)
        if mirrored is not None and mirrored[0] < offset * (1 - 1e-9):
            return coll, mirrored[0], mirrored[1]
    return coll, offset, transfers


def _mirrored_reduction(coll: Collective, forest: Forest, topology: Topology, chunks: int, messages: int | None,
                        chunk_bytes: float, build: bool, tail: int = 0,
                        coalescings: tuple[Coalescing, ...] = (Coalescing(),)
                        ) -> tuple[float, list[Transfer]] | None:
    """A broadcast phase as the time mirror of the reduction on its trees timed forward
    (:func:`_timed_forward`) on the reversed fabric: t -> T - t, every transfer the other way."""
    if not _forward_fits([forest], chunks, messages, tail):   # checked before any job is built
        return None
    reduction = _timed_forward(coll, [replace(forest, reversed=True)], topology.reversed(), chunks, messages,
                               chunk_bytes, build, tail, coalescings=coalescings)
    if reduction is None:
        return None
    makespan, transfers = reduction
    return makespan, [Transfer(makespan - t.end, makespan - t.start, t.chunk, t.dst, t.src, False, t.route[::-1],
                               0, t.group) for t in transfers]


def _timed_forward(coll: Collective, plans: list[Forest], topology: Topology, chunks: int, messages: int | None,
                   chunk_bytes: float, build: bool, tail: int = 0,
                   joint: bool = False, coalescings: tuple[Coalescing, ...] = (Coalescing(),),
                   fits=None) -> tuple[float, list[Transfer]] | None:
    """Reductions timed forward, leaf to root (:func:`add_reduction`), instead of as a mirrored
    broadcast; for allreduce the two phases overlap: each piece's allgather starts from its owner
    as soon as its sum is complete there, and links serve reduction transfers first.

    ``joint``: forests planned on split capacities (:func:`_split_allreduce`), meant to run side
    by side: links serve both phases by pipeline position (hops ahead only), with no limit on size
    but the list schedule's.

    One list schedule of all transfers, plain and coalesced (each of ``coalescings``;
    the fastest is kept, among those ``fits(jobs, heads)`` accepts where given). Where a rank's
    in- and out-links are not all saturated in both phases (a mesh corner), the allgather of early
    pieces fills the reduction's idle links. None on fabrics where rank pairs share switch links
    (the runtime's arbitration is not modelled here) and on schedules too large to list-schedule.
    """
    n = coll.num_ranks
    priorities: list[dict | None] = [None]
    if not joint:
        # the start times of the mirrored broadcast schedule (the reduction that _timed_phase builds)
        mirror = _phase_jobs(coll, plans[0], 0, chunks, messages, tail=tail)
        if len(mirror.msg) * len(plans) > FORWARD_JOBS:   # five more list schedules: keep synthesis quick
            return None
        _, _, mirror_end = list_schedule(mirror, topology.reversed(), chunk_bytes)
        total = float(mirror_end.max()) if len(mirror_end) else 0.0
        planned: dict[tuple[int, int, int], float] = {}
        seen: dict[tuple[int, int], int] = defaultdict(int)
        for key, finish in zip(mirror.key, mirror_end.tolist()):
            edge = (key[-2], key[-1])
            planned[(*edge, seen[edge])] = total - finish
            seen[edge] += 1
        priorities.append(planned)
    best = None
    # priorities for the reductions (hops still ahead; the mirrored broadcast's times), each
    # timed plain and coalesced: the fastest is kept
    for priority in priorities:
        jobs = _forward_jobs(plans, n, chunks, messages, priority, tail, 0 if joint else 1)
        if len(jobs.msg) > MAX_TRANSFERS or len(jobs.msg) > LEVEL_JOBS or (topology.switches and shares_links(jobs)):
            return None
        costs = route_costs(jobs, topology, chunk_bytes)
        for how in (None, *coalescings):
            if how is None and fits is not None and not fits(jobs, None):
                continue   # one message per job: its steps are known before the timing
            timed = list_schedule(jobs, topology, chunk_bytes, coalesce=how is not None,
                                  **(asdict(how) if how is not None else {}), costs=costs)
            heads = list(jobs.head) if how is not None else None
            if heads is not None and fits is not None and not fits(jobs, heads):
                continue
            if best is None or timed[2].max() < best[1][2].max() * (1 - 1e-9):
                best = (jobs, timed, heads)
    if best is None:
        return None
    jobs, (order, start, end), heads = best
    makespan = float(end.max()) if len(end) else 0.0
    if not build:
        return makespan, []
    groups = message_groups(jobs, heads)
    out = []
    for i in order:
        for chunk in jobs.msg[i]:
            out.append(Transfer(float(start[i]), float(end[i]), chunk, jobs.src[i], jobs.dst[i], jobs.reduce[i],
                                jobs.route[i], 0 if jobs.reduce[i] else 1, groups[i]))
    return makespan, out


def _forward_jobs(plans: list[Forest], n: int, chunks: int, messages: int | None,
                  priority: dict[tuple[int, int, int], float] | None, tail: int = 0,
                  gather_phase: int = 1) -> Jobs:
    """Jobs of :func:`_timed_forward`: reductions leaf to root, then (allreduce) the allgather of
    each piece released by the jobs that complete its sum at the owner. The allgather's jobs rank
    after every reduction job (``gather_phase`` 1) or by pipeline position with them (0)."""
    reduce_forest = plans[0]
    jobs = Jobs.empty()
    if_reduced: dict[int, list[int]] = defaultdict(list)
    for r in range(n):
        _spread(reduce_forest, r, [r * chunks + s for s in range(chunks)], messages,
                lambda t, msgs: add_reduction(jobs, reduce_forest, t, msgs, 0, if_reduced, priority), tail)
    if len(plans) == 2:
        root_deps = {c: tuple(d) for c, d in if_reduced.items()}
        plain = replace(plans[1], reversed=False)
        for r in range(n):
            _spread(plain, r, [r * chunks + s for s in range(chunks)], messages,
                    lambda t, msgs: add_broadcast(jobs, plain, t, msgs, gather_phase, root_deps), tail)
    return jobs


def _tree_messages(plans: list[Forest], chunks: int, messages: int | None, tail: int = 0) -> list[list[int]]:
    """Messages per tree edge, per forest and tree, with ``chunks`` per root and ``messages`` per tree
    (or one chunk per message; ``tail``: :func:`_messages`); a tree of multiplicity ``m`` carries
    ``chunks · m / k`` chunks."""
    return [[_message_count(max(1, -(-chunks * t.mult // f.k)), messages, tail) for t in f.trees] for f in plans]


def _job_estimate(plans: list[Forest], chunks: int, messages: int | None, tail: int = 0) -> int:
    """Transfers of a schedule (:func:`_tree_messages` on every tree edge)."""
    return sum(len(t.edges) * m for f, counts in zip(plans, _tree_messages(plans, chunks, messages, tail))
               for t, m in zip(f.trees, counts))


def _forward_fits(plans: list[Forest], chunks: int, messages: int | None, tail: int) -> bool:
    """Is an allgather's schedule small enough for its mirrored reduction to be timed forward
    (:func:`_mirrored_reduction`; ``FORWARD_JOBS``, by :func:`_job_estimate`)?"""
    return _job_estimate(plans, chunks, messages, tail) <= FORWARD_JOBS


def _message_count(tree_chunks: int, parts: int | None, tail: int) -> int:
    """How many messages :func:`_messages` cuts a tree's ``tree_chunks`` chunks into (at most)."""
    if tail == HALVING:
        return len(_messages(list(range(tree_chunks)), None, HALVING))
    return parts + max(tail, 0) if parts else tree_chunks


def _timed_phase(jobs: Jobs, forest: Forest, topology: Topology, chunk_bytes: float, offset: float,
                 reducing: bool, build: bool = True, channel: int = 0,
                 coalesce: bool = False,
                 coalescings: tuple[Coalescing, ...] = (Coalescing(),)
                 ) -> tuple[list[Transfer], float]:
    """Time one phase's broadcasts on its planning fabric; a reversed forest's schedule is then
    mirrored in time (t -> T - t) and direction: the broadcast becomes a reduction (or a gather)
    with the same makespan, and link serialization and data dependencies carry over. With
    ``coalesce``, coalesced timings (one per :class:`Coalescing` in ``coalescings``) compete with the plain one."""
    fabric = topology.reversed() if forest.reversed else topology
    heads = None   # set when a coalesced timing wins: the first job of each job's message
    if forest.slots is not None and len(jobs.msg) == len(forest.trees) * len(forest.slots):
        order, start, end = slot_schedule(jobs, fabric, chunk_bytes, forest.slots)
        order = order.tolist()
    elif forest.replicated and (timed := replicated_schedule(jobs, fabric, chunk_bytes, forest)) is not None:
        order, start, end = timed
        order = order.tolist()
    elif len(jobs.msg) > LEVEL_JOBS and all(len(d) <= 1 for d in jobs.deps):
        order, start, end = level_schedule(jobs, fabric, chunk_bytes)
        order = order.tolist()
    else:
        costs = route_costs(jobs, fabric, chunk_bytes)
        order, start, end = list_schedule(jobs, fabric, chunk_bytes, costs=costs)
        # Coalescing usually cuts α on bottleneck links but can delay a pipeline: keep the faster.
        # Mirrored into reductions too: once the lowering kept the planned order (blocks per
        # connection, one α per step), their simulated times match the plan (benchmarks/bench_trees.py
        # sim/plan 1.000; mi250-2node reducescatter 0.930 -> 0.944, dgx-a100-2node 0.970 -> 0.978).
        for how in coalescings if coalesce else ():
            merged = list_schedule(jobs, fabric, chunk_bytes, coalesce=True, **asdict(how), costs=costs)
            if merged[2].max() < end.max() - 1e-9:
                (order, start, end), heads = merged, list(jobs.head)
        if topology.switches and not forest.reversed and REPLAY and not build and shares_links(jobs):
            # Search score on switch fabrics. Links there are shared by many connections, and the
            # runtime serves them in the order sends become ready, not by our priority; replay
            # that rule (each connection's sends in priority order, spread round-robin over
            # threadblocks of <= 64 steps, no backfilling) and score the mean of the two makespans
            # (the simulator lies between them). The transfers keep the priority order's times.
            return [], (float(end.max()) + replayed_makespan(jobs, fabric, chunk_bytes, order, costs)) / 2
    makespan = float(end.max()) if len(end) else 0.0
    if not build:
        return [], makespan
    transfers = phase_transfers(jobs, forest.reversed, order, start, end, makespan, offset, reducing, channel, heads)
    return transfers, makespan


def _tree_edges(forest: Forest, fabric: Topology, per_root_bytes: float) -> rounds.TreeEdges | None:
    """The forest's tree edges for :func:`synth.synthesis.rounds.plan_rounds` (broadcasts on
    ``fabric``); ``None`` where an edge's units take several routes (a message has one route)."""
    link_index = {(link.src, link.dst): i for i, link in enumerate(fabric.links)}
    _, _, bw, alpha = fabric.arrays
    waits, links, data_us, alpha_us = [], [], [], []
    for tree in forest.trees:
        into: dict[int, int] = {}
        share = per_root_bytes * tree.mult / forest.k
        for e, (u, v) in enumerate(tree.edges):
            if len(tree.routes[e]) > 1:
                return None
            nodes = (u, *tree.routes[e][0][0], v)
            ids = tuple(link_index[(a, b)] for a, b in zip(nodes, nodes[1:]))
            into[v] = len(waits)
            waits.append((into[u],) if u in into else ())
            links.append(ids)
            data_us.append(share / (float(bw[list(ids)].min()) * 1e3))
            alpha_us.append(float(alpha[list(ids)].sum()))
    return rounds.TreeEdges(tuple(waits), tuple(links), np.array(data_us), np.array(alpha_us), len(fabric.links))


def _round_jobs(coll: Collective, forest: Forest, phase: int, chunks: int, shares: np.ndarray) -> Jobs:
    """One job per tree edge and round that moves chunks: the chunks of the tree's prefix between
    the two rounds' shares (rounded down to whole chunks), waiting for the parent's jobs that carry them."""
    plain = replace(forest, reversed=False)
    jobs = Jobs.empty()
    edge = 0
    ids_of = {t: ids for root in dict.fromkeys(tree.root for tree in plain.trees)
                 for t, ids in _tree_shares(plain, root, _root_chunk_ids(coll, root, chunks))}
    for t, tree in enumerate(plain.trees):
        ids = ids_of.get(t, [])
        count = len(ids)
        placed: dict[int, list[tuple[int, int, int]]] = {}    # rank -> (first, end, job) of what reached it
        for e, (u, v) in enumerate(tree.edges):
            cuts = np.floor(shares[edge] * count + 1e-6).astype(np.int64)
            cuts[-1] = count
            edge += 1
            if not count:
                continue
            route = tree.routes[e][0][0]
            done, mine = 0, []
            for r, cut in enumerate(cuts.tolist()):
                if cut <= done:
                    continue
                deps = tuple(j for a, b, j in placed.get(u, ()) if a < cut and b > done)
                job = jobs.add(tuple(ids[done:cut]), u, v, route, False, deps, (phase, r, t, e))
                mine.append((done, cut, job))
                done = cut
            placed[v] = mine
    return jobs


def _timed_rounds(topology: Topology, coll: Collective, plans: list[Forest], chunk_options: list[int],
                  size_bytes: float, deadline: float | None,
                  beat_us: float) -> tuple[Collective, float, list[Transfer], int] | None:
    """All phases round-timed (:mod:`synth.synthesis.rounds`), each link keeping the rounds' order:
    (collective, makespan, transfers, chunks per root) at the fastest of ``chunk_options``, or None
    (also where a phase's optimistic first LP cannot beat ``beat_us``)."""
    name, n = coll.name, topology.num_ranks
    per_root_bytes = _per_root_bytes(name, n, size_bytes)
    planned = []
    solved: dict[tuple, rounds.RoundPlan] = {}
    for forest in plans:
        fabric = topology.reversed() if forest.reversed else topology
        edges = _tree_edges(forest, fabric, per_root_bytes)
        if edges is None or len(edges.waits) * ROUNDS > ROUND_VARIABLES:
            return None
        # the LP is fixed by which edges share a link, their times and waits: an allreduce on a fabric
        # equal to its reverse poses the same one twice (mi250 allreduce: 4 solves instead of 8)
        hops = tuple(tuple((fabric.links[i].src, fabric.links[i].dst) for i in ids) for ids in edges.links)
        key = (edges.waits, hops, edges.data_us.tobytes(), edges.alpha_us.tobytes())
        if key not in solved:
            plan = rounds.plan_rounds(edges, ROUNDS, deadline=deadline, above_us=beat_us)
            if plan is None:
                return None
            solved[key] = plan
        planned.append((forest, fabric, solved[key]))
    best = None
    for chunks in chunk_options:
        timed = Collective(name, n, _chunk_factor(name, n, chunks), coll.root, coll.inplace)
        chunk_bytes = timed.chunk_bytes(size_bytes)
        transfers: list[Transfer] = []
        offset = 0.0
        for phase, (forest, fabric, plan) in enumerate(planned):
            jobs = _round_jobs(timed, forest, phase, chunks, plan.shares)
            if max(connection_steps(jobs).values()) > MAX_CHANNELS * MAX_STEPS_PER_TB:
                break
            # each connection sends in round order (one threadblock chain); links serve them as ready
            chained = [-1] * len(jobs.msg)
            last: dict[tuple, int] = {}
            for i in sorted(range(len(jobs.msg)), key=jobs.key.__getitem__):
                link = (jobs.src[i], jobs.dst[i], jobs.route[i])
                chained[i] = last.get(link, -1)
                last[link] = i
            order, start, end = list_schedule(jobs, fabric, chunk_bytes, chained)
            makespan = float(end.max())
            transfers += phase_transfers(jobs, forest.reversed, order, start, end, makespan, offset, timed.is_reduction,
                                          phase, None)
            offset += makespan
        else:
            if best is None or offset < best[1]:
                best = (timed, offset, transfers, chunks)
    return best


def _per_root_bytes(name: str, n: int, size_bytes: float) -> float:
    """Bytes each tree root broadcasts / collects (SPEC size conventions)."""
    if name in ("allgather", "reducescatter", "allreduce"):
        return size_bytes / n
    if name in ("scatter", "gather"):
        return size_bytes * (n - 1) / n   # their trees carry the N-1 pieces of the other ranks
    return size_bytes


def _chunk_factor(name: str, n: int, chunks: int) -> int:
    """Collective chunk factor from chunks per root piece."""
    if name == "allreduce":
        return n * chunks
    return chunks


def _runtime_chunks(collective: Collective, size_bytes: float, upper: int = 2 * MAX_TAIL_CHUNKS):
    """``fit(C)``: the chunk counts per root piece near ``C`` at which an MSCCL runtime runs the program
    on the SIZE buffer (:meth:`Collective.runtime_divides`; the runtime silently runs its own algorithm
    otherwise: dgx-a100-2node 1 GiB allgather, 39 chunks per root, 624 per loop), nearest first
    (log scale, within a factor 2); ``[C]`` where there is none."""
    name, n = collective.name, collective.num_ranks
    usable = [c for c in range(1, upper + 1)
              if replace(collective, chunk_factor=_chunk_factor(name, n, c)).runtime_divides(size_bytes)]

    def fit(chunks: int) -> list[int]:
        near = sorted((c for c in usable if chunks <= 2 * c and c <= 2 * chunks),
                      key=lambda c: (abs(math.log(c / chunks)), c))
        return near or [chunks]
    return fit


def _chunk_fit(collective: Collective, size_bytes: float, options: SynthOptions):
    """The ``fit`` the options ask for: ``--chunks C`` (every count becomes ``C``), :func:`_runtime_chunks`,
    or any count (``--any-chunks``)."""
    if options.chunks is not None:
        return lambda _chunks: [options.chunks]
    return _runtime_chunks(collective, size_bytes) if options.runtime_chunks else _any_chunks


def _choose_chunks(topology: Topology, collective: Collective, plans: list[Forest], per_root_bytes: float,
                   requested: int | None, fit=_any_chunks) -> tuple[int, int | None]:
    """(chunks per root piece, messages per distinct tree or None for one chunk per message).

    Default: ``C = k · P``, so a tree of multiplicity ``m`` carries ``m·P`` chunks in ``P``
    messages of ``m`` contiguous chunks (one α each); ``P`` minimises :func:`predicted_time`
    within MSCCL's limits, and ``C`` is then the nearest count ``fit`` allows (:func:`_runtime_chunks`).
    ``--chunks C`` (``requested``) keeps that message size at ``C`` chunks per root, with fewer
    messages where MSCCL's steps per connection need it (an error where even its largest steps do not fit).
    Scatter/gather always send one chunk per message (each goes to its own rank), as does ``--chunks``
    on forests of unequal ``k`` and beyond ``LARGE_RANKS`` ranks.
    """
    name = collective.name
    n = topology.num_ranks
    k = max(f.k for f in plans)
    if requested is None and n > LARGE_RANKS:
        return k, 1   # every link already carries hundreds of messages: no pipelining needed
    usages = [_usage(f, topology) for f in plans]
    limit = MAX_CHANNELS * MAX_STEPS_PER_TB
    roots = list(range(n)) if name in ("allgather", "reducescatter", "allreduce") else [collective.root]
    spread = (n - 1) if name in ("scatter", "gather") else 1

    def counts(forest: Forest, c: int) -> np.ndarray:
        total = np.zeros(len(forest.trees), dtype=np.int64)
        for r in roots:
            total += np.array(split_chunks(forest, r, c * spread))
        return total

    def per_chunk(c: int) -> tuple[float, int]:
        phases = []
        for forest, usage in zip(plans, usages):
            cnt = counts(forest, c)
            b = per_root_bytes / (c * spread)
            phases.append((forest, usage, cnt.tolist(), [b] * len(cnt), len(roots)))
        return predicted_time(phases, len(topology.links))

    def per_message(p: int) -> tuple[float, int]:
        phases = []
        for forest, usage in zip(plans, usages):
            cnt = counts(forest, k * p) // p if forest.k == k else counts(forest, k * p)
            msg_bytes = [per_root_bytes * t.mult / forest.k / p for t in forest.trees]
            phases.append((forest, usage, [p if c else 0 for c in cnt.tolist()], msg_bytes, len(roots)))
        return predicted_time(phases, len(topology.links))

    uneven = spread > 1 or any(f.k != k for f in plans)
    if requested is not None and (uneven or n > LARGE_RANKS):
        _, steps = per_chunk(requested)
        if steps > limit:
            raise SynthError(f"--chunks {requested} needs {steps} steps on one connection, more than "
                             f"MSCCL's {MAX_CHANNELS} channels x {MAX_STEPS_PER_TB} steps; use fewer --chunks")
        return requested, None
    if uneven:
        chunks = _best(per_chunk, limit, MAX_CHUNKS)
        return next((c for c in fit(chunks) if per_chunk(c)[1] <= limit), chunks), None
    p = _best(per_message, limit, max(1, MAX_CHUNKS // k))
    if requested is not None:
        return requested, _requested_messages(plans, requested, _refit_messages(p, requested, k * p, 0), limit)
    return fit(k * p)[0], p


def _requested_messages(plans: list[Forest], chunks: int, messages: int, limit: int) -> int:
    """At most ``messages`` per tree at ``chunks`` per root, as many as MSCCL's ``limit`` steps per
    connection allow (messages of up to ``MAX_STEP_CHUNKS`` chunks); a ``--chunks`` error where none do."""
    fewest = [[-(-c // MAX_STEP_CHUNKS) for c in counts] for counts in _tree_messages(plans, chunks, None)]
    steps = _pair_load(plans, fewest)
    if steps > limit:
        raise SynthError(f"--chunks {chunks} needs {steps} steps on one connection even with MSCCL's largest "
                         f"steps ({MAX_STEP_CHUNKS} chunks), more than its {MAX_CHANNELS} channels x "
                         f"{MAX_STEPS_PER_TB} steps; use fewer --chunks")
    while messages > 1 and _pair_load(plans, _tree_messages(plans, chunks, messages)) > limit:
        messages = max(1, messages * 3 // 4)
    return messages


def _best(cost, limit: int, upper: int) -> int:
    """The argument in 1..upper (geometric grid beyond 16) with the least cost within ``limit`` steps."""
    best_x, best_t = 1, math.inf
    x = 1
    while x <= upper:
        t, steps = cost(x)
        if steps > limit:
            break
        if t < best_t * (1 - 1e-6):
            best_x, best_t = x, t
        x = x + 1 if x < 16 else int(x * 1.25)
    return best_x


def _messages(chunk_ids: list[int], parts: int | None, tail: int = 0) -> list[tuple[int, ...]]:
    """``chunk_ids`` cut into ``parts`` equal messages (None: one chunk each), the last of them then
    halved ``tail`` times (sizes ..., g, g/2, g/4, ..., 1, 1 chunks). Large messages keep α low
    mid-pipeline; a geometric tail shortens the drain, where the last message crosses every level of
    the tree (the classic pipelined-broadcast trade-off, Träff & Ripke, "Optimal broadcast for fully
    connected processor-node networks", JPDC 2008, with message sizes that shrink at the end).

    ``tail == HALVING``: every message takes half of the chunks left (at most one MSCCL step), so
    sizes shrink geometrically over the whole pipeline, ``parts`` aside: few messages (α) and a
    one-chunk drain. Where every link is a bottleneck (mi250-2node) this beats equal messages."""
    if tail == HALVING:
        shape, pos = [], 0
        while pos < len(chunk_ids):
            left = len(chunk_ids) - pos
            take = 1 if left <= 2 else min(MAX_STEP_CHUNKS, (left + 1) // 2)
            shape.append(tuple(int(c) for c in chunk_ids[pos:pos + take]))
            pos += take
        return shape
    if parts is None:
        return [(c,) for c in chunk_ids]
    body = [tuple(int(c) for c in part) for part in np.array_split(np.array(chunk_ids), min(parts, len(chunk_ids)))]
    last = body.pop()
    for _ in range(tail):
        if len(last) < 2:
            break
        half = len(last) // 2
        body.append(last[:half])
        last = last[half:]
    body.append(last)
    return body


def _phase_jobs(coll: Collective, forest: Forest, phase: int, chunks: int, parts: int | None,
                height_weight: float = 1.0, tail: int = 0) -> Jobs:
    """Broadcast jobs of one phase on its planning fabric (a reversed forest is mirrored later)."""
    name, n, root = coll.name, coll.num_ranks, coll.root
    plain = replace(forest, reversed=False)
    jobs = Jobs.empty()

    def emit(t: int, messages: list[tuple[int, ...]]) -> None:
        add_broadcast(jobs, plain, t, messages, phase, height_weight=height_weight)

    if name not in ("scatter", "gather"):
        for r in (range(n) if name in ("allgather", "reducescatter", "allreduce") else (root,)):
            _spread(plain, r, _root_chunk_ids(coll, r, chunks), parts, emit, tail)
    else:  # scatter, gather: each chunk only travels towards (or from) its own rank
        if name == "scatter":
            items = [(coll.contribution(root, q * chunks + s), q) for s in range(chunks) for q in range(n) if q != root]
        else:
            items = [(coll.contribution(q, s), q) for s in range(chunks) for q in range(n) if q != root]
        _spread_items(plain, root, items,
                      lambda t, cs, ws: add_broadcast(jobs, plain, t, [(c,) for c in cs], phase,
                                                      wanted=[{w} for w in ws]))
    return jobs


def _root_chunk_ids(coll: Collective, root: int, chunks: int) -> list[int]:
    """The chunk ids a root's trees carry: its contribution (allgather, broadcast), the piece it
    owns (reducescatter, allreduce) or the whole buffer (reduce)."""
    if coll.name in ("allgather", "broadcast"):
        return [coll.contribution(root, s) for s in range(chunks)]
    if coll.name == "reduce":
        return list(range(chunks))
    return [root * chunks + s for s in range(chunks)]


def _tree_shares(forest: Forest, root: int, items: list):
    """(distinct tree of ``root``, its consecutive share of ``items``) for the trees that get any
    (:func:`split_chunks`)."""
    pos = 0
    for t, c in enumerate(split_chunks(forest, root, len(items))):
        if c:
            yield t, items[pos:pos + c]
            pos += c


def _spread(forest: Forest, root: int, chunk_ids: list[int], parts: int | None, emit, tail: int = 0) -> None:
    """Give each distinct tree of ``root`` its share of ``chunk_ids``, cut into messages (:func:`_messages`)."""
    for t, share in _tree_shares(forest, root, chunk_ids):
        emit(t, _messages(share, parts, tail))


def _spread_items(forest: Forest, root: int, items: list[tuple[int, int]], emit) -> None:
    """Scatter/gather: ``items`` (chunk, rank) come slot-major, so each tree carries every rank's data."""
    for t, part in _tree_shares(forest, root, items):
        emit(t, [chunk for chunk, _ in part], [w for _, w in part])


METHOD = MethodSpec(
    name="trees",
    run=synthesize,
    collectives=SUPPORTED,
    description="throughput-optimal pipelined spanning trees at the exact cut bound (ForestColl)",
    kind="heuristic",
)

"""Ring baselines (what NCCL runs), over one or several rings at once.

Rings. A ring is a cyclic order of the ranks; consecutive ranks talk over a direct link or, where
there is none, over the shortest switch-only route (fewest hops, the widest, then least α: the same rule as the
simulator), so a star/NVSwitch fabric or boxes behind NICs always have a ring. Rings are packed
greedily: each round finds a Hamiltonian cycle whose bottleneck residual bandwidth is as large as
possible (thresholds tried from high to low, direct links preferred at equal threshold, DFS with
Warnsdorff ordering under a step budget, so results are deterministic), gives it the rate
``min residual / uses`` over its links, and subtracts that rate. The two directions of a
full-duplex cycle use different directed links, so they count as separate rings. On DGX-1 this
recovers NCCL's rings: the double-NVLink cycle in both directions (50 GB/s each) and the
single-NVLink cycle in both directions (25 GB/s each).

Chunks are split across rings in proportion to their rates (integer weights, largest remainder),
each ring on its own channel. Per ring the classic algorithms (Patarasuk & Yuan, JPDC 2009 for the
bandwidth-optimal ring allreduce = reduce-scatter then allgather):

- allgather: every piece travels N-1 hops around the ring; reducescatter: the reverse, reducing;
- allreduce: reducescatter to each chunk's owner, then allgather from it;
- broadcast / reduce: a pipelined chain from / to the root, ``p`` chunks per ring, with
  p* = sqrt((N-2)·S/(bw·α)) minimising (N-2+p)(α + S/(p·bw));
- gather / scatter: pieces flow along the ring to / from the root (farthest first for scatter);
- alltoall: every piece is relayed around the ring to its destination.

Times come from a list schedule under the α-β model of docs/cost-model.md (a transfer pays the α of every hop plus
bytes / bottleneck bw, and holds every link of its route; transfers on a link are serialized).

Chunk counts (unless ``--chunks``): the count above, and the most promising counts at which an MSCCL
runtime runs the program at SIZE (:func:`_runnable_candidates`; with ``--any-chunks`` any counts), are all
timed; the fastest runnable one (any one) is kept (ring-8 1 GiB broadcast: 128 chunks, 7.8 % faster than
p*'s 64; dgx-a100-2node 1 MiB allgather: 2 per piece, 0.62x the time of 256). The ``nccl`` baseline keeps the
rings' own count (``OWN_CHUNKS``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from synth.collectives import Collective
from synth.errors import SynthError
from synth.limits import check_transfer_count
from synth.schedule import Schedule, Transfer
from synth.synthesis.base import MAX_CHANNELS, MAX_STEP_CHUNKS, MAX_STEPS_PER_TB, Instance, MethodSpec, SynthOptions
from synth.synthesis.timing import KeyOrderTimer
from synth.topology.model import Topology
from synth.topology.routes import rank_routes

MAX_RINGS = 8
MAX_WEIGHT = 16          # total integer ring weight (chunks per piece with no pipelining)
MAX_PIPELINE = 32        # chunks per ring for the pipelined chain (broadcast / reduce)
DFS_STEPS = 20_000       # expansions per Hamiltonian DFS (a deterministic budget)
OWN_CHUNKS = "own_chunks"  # SynthOptions.extra key: keep the rings' own chunk count (what NCCL runs)
RUNNABLE_TIMED = 8       # runtime-usable chunk counts timed, the lowest estimated costs (_runnable_candidates)
RUNNABLE_SLACK = 1e-3    # ... the fastest kept, or one this close to it with fewer chunks
RUNNABLE_LOSS = 0.25     # ... kept only within this share of the rings' own count (else a note says so)
_EPS = 1e-9

Route = tuple[tuple[int, int], ...]   # the directed links (src, dst) of one ring edge


@dataclass(frozen=True)
class Ring:
    order: tuple[int, ...]              # ranks in ring order; edge k is order[k] -> order[k+1]
    switches: tuple[tuple[int, ...], ...]  # switches crossed by edge k (empty for a direct link)
    rate: float                          # GB/s this ring is given

    @property
    def direct(self) -> bool:
        return not any(self.switches)


# ---- routes ---------------------------------------------------------------------------------------
def _links_of(path: tuple[int, ...]) -> Route:
    return tuple(zip(path[:-1], path[1:], strict=False))


# ---- ring search ----------------------------------------------------------------------------------
def _hamiltonian(n: int, adj: list[list[int]], max_steps: int = DFS_STEPS, *, start: int = 0,
                 closed: bool = True, cost: dict[tuple[int, int], int] | None = None,
                 closers_last: bool = True) -> list[int] | None:
    """A Hamiltonian cycle (or path from ``start`` when not ``closed``) through ranks 0..n-1, or None
    (also on timeout). DFS whose successor order is: for a cycle, ranks that can close it (edge back
    to ``start``) last, so they are still free at the end (this is what makes multi-box fabrics
    solvable: leave the start's box first, come back at the end); then cheaper edges (``cost``:
    direct before routed); then Warnsdorff (fewest onward options first)."""
    closers = {u for u in range(n) if start in adj[u]} if closed and closers_last else set()
    cost = cost or {}
    if n == 1:
        return [start]
    if closed:
        if any(not a for a in adj):
            return None
        into = [0] * n
        for a in adj:
            for b in a:
                into[b] += 1
        if any(x == 0 for x in into):
            return None
    path = [start]
    visited = [False] * n
    # onward[v]: v's unvisited successors, kept up to date on each visit (Warnsdorff's key, O(1) to read)
    into_of: list[list[int]] = [[] for _ in range(n)]
    for u, succ in enumerate(adj):
        for v in succ:
            into_of[v].append(u)
    onward = [len(succ) for succ in adj]

    def visit(v: int, step: int) -> None:
        visited[v] = step > 0
        for u in into_of[v]:
            onward[u] -= step

    visit(start, 1)
    stack = [iter(sorted(adj[start], key=lambda v: (v in closers, cost.get((start, v), 0))))]
    steps = 0
    while stack:
        steps += 1
        if steps > max_steps:
            return None
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            visit(path.pop(), -1)
            continue
        if visited[nxt]:
            continue
        path.append(nxt)
        visit(nxt, 1)
        if len(path) == n:
            if not closed or start in adj[nxt]:
                return path
            visit(path.pop(), -1)
            continue
        # Warnsdorff: try successors with the fewest onward options first.
        cands = [v for v in adj[nxt] if not visited[v]]
        cands.sort(key=lambda v, u=nxt: (v in closers, cost.get((u, v), 0), onward[v]))
        stack.append(iter(cands))
    return None


def find_line(topology: Topology, max_steps: int = DFS_STEPS) -> tuple[int, ...] | None:
    """A Hamiltonian path whose consecutive ranks talk both ways (links or switch routes), or None.

    The fallback when no Hamiltonian cycle exists (e.g. an odd mesh such as 5x5, which is bipartite
    with unequal sides): the "line" algorithms send pieces both ways along it."""
    n = topology.num_ranks
    routes = rank_routes(topology)
    adj: list[list[int]] = [[] for _ in range(n)]
    for (a, b) in routes:
        if (b, a) in routes:
            adj[a].append(b)
    for a in range(n):
        adj[a].sort(key=lambda b, a=a: (len(routes[(a, b)]), len(adj[b]), b))
    starts = sorted(range(n), key=lambda v: (len(adj[v]), v))
    for start in starts[:4]:
        path = _hamiltonian(n, adj, max_steps, start=start, closed=False)
        if path:
            return tuple(path)
    return None


def _strongly_connected(n: int, adj: list[list[int]]) -> bool:
    def reach(graph: list[list[int]]) -> int:
        seen = {0}
        todo = [0]
        while todo:
            u = todo.pop()
            for v in graph[u]:
                if v not in seen:
                    seen.add(v)
                    todo.append(v)
        return len(seen)

    rev: list[list[int]] = [[] for _ in range(n)]
    for u, a in enumerate(adj):
        for v in a:
            rev[v].append(u)
    return reach(adj) == n and reach(rev) == n


def find_rings(topology: Topology, max_rings: int = MAX_RINGS, max_steps: int = DFS_STEPS) -> list[Ring]:
    """Greedy packing of Hamiltonian rings by bottleneck residual bandwidth (see module docstring).

    Two DFS orders are tried (closing ranks last, or plain Warnsdorff), each DFS with ``max_steps``;
    the packing with the larger total rate wins (fewer rings on ties)."""
    n = topology.num_ranks
    if n < 2:
        return []
    best: list[Ring] = []
    for closers_last in (True, False):
        rings = _pack_rings(topology, max_rings, max_steps, closers_last)
        if sum(r.rate for r in rings) > sum(r.rate for r in best) + _EPS:
            best = rings
    if not best:
        raise SynthError(f"topology {topology.name!r}: found no ring through all {n} ranks "
                         "(no Hamiltonian cycle over its links or switch routes)")
    return best


def _pack_rings(topology: Topology, max_rings: int, max_steps: int, closers_last: bool) -> list[Ring]:
    n = topology.num_ranks
    routes = rank_routes(topology)
    cost = {pair: len(path) for pair, path in routes.items()}
    residual = {(link.src, link.dst): link.bw for link in topology.links}
    rings: list[Ring] = []
    while len(rings) < max_rings:
        thresholds = sorted({bw for bw in residual.values() if bw > _EPS}, reverse=True)
        found: list[int] | None = None
        for thr in thresholds:
            for allow_routes in (False, True):
                adj: list[list[int]] = [[] for _ in range(n)]
                for (a, b), path in routes.items():
                    if len(path) > 2 and not allow_routes:
                        continue
                    if all(residual[link] >= thr - _EPS for link in _links_of(path)):
                        adj[a].append(b)
                # direct links first, then by rank distance (keeps rings tidy on symmetric fabrics)
                for a in range(n):
                    adj[a].sort(key=lambda b, a=a: (len(routes[(a, b)]), (b - a) % n))
                if not _strongly_connected(n, adj):
                    continue
                # start where the cycle is hardest to close: the rank with the fewest in-neighbours
                indeg = [0] * n
                for a in range(n):
                    for b in adj[a]:
                        indeg[b] += 1
                for start in sorted(range(n), key=lambda v: (indeg[v], v))[:2]:
                    found = _hamiltonian(n, adj, max_steps, start=start,
                                         cost=cost, closers_last=closers_last)
                    if found:
                        break
                if found:
                    break
            if found:
                break
        if not found:
            break
        order = tuple(found)
        paths = [routes[(order[k], order[(k + 1) % n])] for k in range(n)]
        uses: dict[tuple[int, int], int] = {}
        for path in paths:
            for link in _links_of(path):
                uses[link] = uses.get(link, 0) + 1
        rate = min(residual[link] / count for link, count in uses.items())
        if rate <= _EPS or (rings and rate < 1e-3 * rings[0].rate):
            break
        for link, count in uses.items():
            residual[link] -= rate * count
        rings.append(Ring(order, tuple(tuple(p[1:-1]) for p in paths), rate))
    return rings


def ring_weights(rings: list[Ring], max_total: int = MAX_WEIGHT) -> list[int]:
    """Integer weights proportional to ring rates, summing to at most ``max_total`` (0 drops a ring)."""
    low = min(r.rate for r in rings)
    weights = [max(1, round(r.rate / low)) for r in rings]
    if sum(weights) > max_total:
        unit = sum(r.rate for r in rings) / max_total
        weights = [round(r.rate / unit) for r in rings]
    return weights


def split_counts(total: int, weights: Sequence[float]) -> list[int]:
    """Largest-remainder split of ``total`` items in proportion to ``weights`` (Hamilton's method; ties
    go to the larger weight, then the first)."""
    wsum = sum(weights)
    if wsum <= 0:
        return [0] * len(weights)
    exact = [total * w / wsum for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), -weights[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


# ---- the method -----------------------------------------------------------------------------------
def _pipeline_chunks(n: int, size_bytes: float, bw: float, alpha: float) -> int:
    """p* = sqrt((N-2)·S/(bw·α)) for a chain of N-1 hops (bw in GB/s, α in µs)."""
    if n <= 2 or alpha <= 0:
        return MAX_PIPELINE if n > 2 else 1
    p = math.sqrt((n - 2) * size_bytes / (bw * 1e3 * alpha))
    return max(1, min(MAX_PIPELINE, round(p)))


def _default_chunks(name: str, n: int, wsum: int, options: SynthOptions, share_bytes: float, bw: float,
                    alpha: float) -> int:
    if options.chunks is not None:
        return options.chunks
    if name == "allreduce":
        return n * wsum
    if name in ("broadcast", "reduce"):
        return wsum * _pipeline_chunks(n, share_bytes, bw, alpha)
    return wsum


def _owner_splits(chunks: int, n: int, weights: list[int]) -> list[list[int]]:
    """Allreduce: per owner, how many of the chunks it owns (contiguous, as even as possible over the
    ranks) each ring carries."""
    return [split_counts(count, weights) for count in split_counts(chunks, [1] * n)]


def _ring_messages(name: str, n: int, chunks: int, weights: list[int]) -> list[list[int]]:
    """Per ring, the chunks of each message it sends per piece (one message per owner for allreduce)."""
    if name == "allreduce":
        per_owner = _owner_splits(chunks, n, weights)
        return [[counts[r] for counts in per_owner] for r in range(len(weights))]
    if name in ("broadcast", "reduce"):   # pipelined: one chunk per message
        return [[1] * c for c in split_counts(chunks, weights)]
    return [[c] for c in split_counts(chunks, weights)]


def _ring_alpha(topology: Topology, ring: Ring) -> float:
    """The largest α of one ring step: a send pays every hop's α on its switch route (docs/cost-model.md)."""
    order = ring.order
    paths = [(order[k], *ring.switches[k], order[(k + 1) % len(order)]) for k in range(len(order))]
    return max(sum(topology.link(a, b).alpha for a, b in _links_of(path)) for path in paths)


def _runnable_candidates(collective: Collective, chunks: int, weights: list[int], rates: list[float],
                         size_bytes: float, alphas: list[float], runnable: bool = True) -> list[int]:
    """Chunk factors at which an MSCCL runtime runs the program on the SIZE buffer (its ``nchunksperloop``
    divides the element count, :meth:`Collective.runtime_divides`; dgx1 allgather: 6 rings' weights sum
    to 6, 48 chunks per loop do not divide 1 GiB), or any if not ``runnable``, up to 64x ``chunks`` and
    other than it, the ``RUNNABLE_TIMED`` of lowest estimated cost first; empty where no count runs.

    Each candidate is estimated by its slowest ring under the α-β model. A ring moves its pieces' messages
    (an allreduce owner's, a pipelined chain's single chunks) in lockstep around the ring, so it takes
    ``(messages + fill)·(α + m·b / rate)`` with ``m`` the most chunks of ``b`` bytes in one message and α
    the ring's slowest step (every hop of a switch route pays its own, docs/cost-model.md) (dgx1 64 MB allreduce at 625
    chunks: owners of 79 and 78 chunks send 27 and 26 on a 50 GB/s ring, 3.6 % over the 6-chunk ideal,
    not the 0.3 % their sum suggests); the broadcast / reduce chain's fill is ``N - 2`` messages,
    (N - 2 + p)(α + b / rate) (see :func:`_pipeline_chunks`). The estimate ignores that pieces fewer
    than the ranks leave links idle, so the candidates are then timed (:func:`synthesize`). Messages stay
    within one MSCCL step (at most 71 chunks), and a ring's connection within one threadblock (at most 64
    steps)."""
    name, n = collective.name, collective.num_ranks
    fill = n - 2 if name in ("broadcast", "reduce") else 0

    def cost(c: int) -> float | None:
        messages = _ring_messages(name, n, c, weights)
        if max(max(ms, default=0) for ms in messages) > MAX_STEP_CHUNKS or max(map(len, messages)) > MAX_STEPS_PER_TB:
            return None
        chunk_bytes = replace(collective, chunk_factor=c).chunk_bytes(size_bytes)
        # a ring moves one message per piece each step, so its largest message sets the pace
        return max((len(ms) + fill) * (alpha + max(ms) * chunk_bytes / (rate * 1e3))
                   for ms, rate, alpha in zip(messages, rates, alphas, strict=True) if ms)

    scored = sorted((t, c) for c in range(1, 64 * chunks + 1) if c != chunks
                    and (not runnable or replace(collective, chunk_factor=c).runtime_divides(size_bytes))
                    and (t := cost(c)) is not None)
    # the two fewest chunks too (cheap to time): the estimate has every ring step pay the slowest hop, which
    # overprices few pieces on a fabric with one slow hop (ndv2-2node 1 KB allreduce: 1 chunk 35.6 µs, 10 102.5)
    fewest = sorted(c for _, c in scored)[:2]
    return list(dict.fromkeys(fewest + [c for _, c in scored]))[:RUNNABLE_TIMED]


def _line_schedule(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                   line: tuple[int, ...]) -> Schedule:
    """The fallback on a Hamiltonian path: pieces travel both ways along the line (one channel)."""
    n = topology.num_ranks
    name = collective.name
    routes = rank_routes(topology)
    bw = min(min(lk.bw for lk in (topology.link(a, b) for a, b in _links_of(routes[(line[i], line[i + 1])])))
             for i in range(n - 1))
    alpha = max((lk.alpha for lk in topology.links), default=0.0)
    coll = Collective(name, n, _default_chunks(name, n, 1, options, size_bytes, bw, alpha),
                      root=collective.root, inplace=collective.inplace)
    if coll.inplace and name == "alltoall":
        raise SynthError("ring alltoall relays through the ranks and needs an out-of-place buffer")
    check_transfer_count(coll.min_transfers, f"{name} on {n} ranks in {coll.chunk_factor} chunks needs at least")
    timer = KeyOrderTimer(topology, routes, coll.chunk_bytes(size_bytes))
    C = coll.chunk_factor
    pos = {rank: i for i, rank in enumerate(line)}

    def hops(a: int, b: int) -> list[tuple[int, int]]:
        """(src, dst) hops along the line from rank a to rank b."""
        i, j = pos[a], pos[b]
        step = 1 if j > i else -1
        return [(line[k], line[k + step]) for k in range(i, j, step)]

    def chain(a: int, b: int, chunks: tuple[int, ...], reduce: bool, key0: int, tag: tuple,
              deps: tuple[int, ...] = ()) -> int:
        prev = -1
        for h, (src, dst) in enumerate(hops(a, b)):
            prev = timer.add((key0 + h,) + tag + (h,), src, dst, chunks, reduce, 0, deps if h == 0 else (prev,))
        return prev

    ends = (line[0], line[-1])
    if name == "allreduce":
        owners = split_counts(C, [1] * n)
        j = 0
        for q, count in enumerate(owners):
            if not count:
                continue
            slots = tuple(range(j, j + count))
            j += count
            last = [chain(e, q, slots, True, n - 1 - len(hops(e, q)), (0, q)) for e in ends if e != q]
            for e in ends:
                if e != q:
                    chain(q, e, slots, False, n - 1, (1, q), tuple(last))
    elif name == "allgather":
        for q in range(n):
            ids = tuple(coll.contribution(q, k) for k in range(C))
            for e in ends:
                chain(q, e, ids, False, 0, (q,))
    elif name == "reducescatter":
        for q in range(n):
            slots = tuple(q * C + k for k in range(C))
            for e in ends:
                if e != q:
                    chain(e, q, slots, True, n - 1 - len(hops(e, q)), (q,))
    elif name in ("broadcast", "reduce"):
        root = coll.root
        for k in range(C):
            chunk = coll.contribution(root, k) if name == "broadcast" else k
            for e in ends:
                if e == root:
                    continue
                if name == "broadcast":
                    chain(root, e, (chunk,), False, k, (e,))
                else:
                    chain(e, root, (chunk,), True, k + n - 1 - len(hops(e, root)), (e,))
    elif name == "gather":
        root = coll.root
        for q in range(n):
            if q != root:
                chain(q, root, tuple(coll.contribution(q, k) for k in range(C)), False, 0, (q,))
    elif name == "scatter":
        root = coll.root
        for q in range(n):
            if q != root:
                d = len(hops(root, q))
                chain(root, q, tuple(coll.contribution(root, q * C + k) for k in range(C)), False, n - 1 - d, (q,))
    elif name == "alltoall":
        for q in range(n):
            for r in range(n):
                if r != q:
                    d = len(hops(q, r))
                    chain(q, r, tuple(coll.contribution(q, r * C + k) for k in range(C)), False, n - 1 - d, (q, r))
    transfers = timer.run()
    return Schedule(coll, topology.name, tuple(transfers), method="ring", size_bytes=float(size_bytes),
                    predicted_time_us=max((t.end for t in transfers), default=0.0),
                    notes={"line": list(line)})


def synthesize(inst: Instance) -> Schedule:
    """Ring (multi-ring) schedule of the request's collective on its topology (see module docstring)."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    try:
        rings = find_rings(topology, max_rings=int(options.extra.get("max_rings", MAX_RINGS)))
    except SynthError:
        line = find_line(topology)
        if line is None:
            raise
        return _line_schedule(topology, collective, size_bytes, options, line)
    return ring_schedule(topology, collective, size_bytes, options, rings)


def ring_schedule(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                  rings: list[Ring], method: str = "ring") -> Schedule:
    """The schedule of ``collective`` over ``rings`` (chunks split by their rates; see module docstring)."""
    n = topology.num_ranks
    name = collective.name
    if name == "alltoall":
        # every link of a ring relays N(N-1)/2 pieces: MSCCL's 64 steps per threadblock and 32
        # channels cap how many rings (each on its own channels) fit
        per_ring = math.ceil(n * (n - 1) / 2 / (MAX_STEPS_PER_TB - 4))
        if per_ring > MAX_CHANNELS:
            raise SynthError(f"ring alltoall on {n} ranks relays {n * (n - 1) // 2} pieces per link, more than "
                             f"{MAX_CHANNELS} channels of {MAX_STEPS_PER_TB} MSCCL steps hold; use another method")
        rings = rings[: max(1, MAX_CHANNELS // per_ring)]
    weights = ring_weights(rings)
    keep = [i for i, w in enumerate(weights) if w > 0]
    rings, weights = [rings[i] for i in keep], [weights[i] for i in keep]
    wsum = sum(weights)
    alpha = max((lk.alpha for lk in topology.links), default=0.0)
    chunks = _default_chunks(name, n, wsum, options, size_bytes * weights[0] / wsum, rings[0].rate, alpha)
    if collective.inplace and name == "alltoall":
        raise SynthError("ring alltoall relays through the ranks and needs an out-of-place buffer")
    routes = rank_routes(topology)

    def timed(c: int, build: bool = False) -> tuple[float, Collective, list[Transfer]]:
        coll = Collective(name, n, c, root=collective.root, inplace=collective.inplace)
        check_transfer_count(coll.min_transfers, f"{name} on {n} ranks in {c} chunks needs at least")
        makespan, transfers = _ring_transfers(topology, coll, rings, weights, routes, size_bytes, build)
        return makespan, coll, transfers

    # OWN_CHUNKS in options.extra: the rings' own count, untimed alternatives aside (NCCL's rings, `nccl`)
    if options.chunks is None and not options.extra.get(OWN_CHUNKS):
        own = timed(chunks)
        candidates = _runnable_candidates(collective, chunks, weights, [rg.rate for rg in rings], size_bytes,
                                          [_ring_alpha(topology, rg) for rg in rings], options.runtime_chunks)
        timings = [timed(c) for c in candidates]
        if not options.runtime_chunks or own[1].runtime_divides(size_bytes):
            timings.append(own)
        fastest = min((t for t, _, _ in timings), default=None)
        # the fastest runnable count (fewer chunks within RUNNABLE_SLACK), unless far slower than the rings' own
        if fastest is not None and fastest <= own[0] * (1 + RUNNABLE_LOSS):
            chunks = min(coll.chunk_factor for t, coll, _ in timings if t <= fastest * (1 + RUNNABLE_SLACK))
    makespan, coll, transfers = timed(chunks, build=True)
    schedule = Schedule(
        collective=coll,
        topology=topology.name,
        transfers=tuple(transfers),
        method=method,
        size_bytes=float(size_bytes),
        predicted_time_us=makespan,
        notes={"rings": [{"order": list(rg.order), "rate_GBps": rg.rate, "weight": w,
                          "switches": [list(s) for s in rg.switches]} for rg, w in zip(rings, weights, strict=True)]},
    )
    return schedule


def _ring_transfers(topology: Topology, coll: Collective, rings: list[Ring], weights: list[int],
                    routes: dict[tuple[int, int], tuple[int, ...]], size_bytes: float,
                    build: bool = True) -> tuple[float, list[Transfer]]:
    """(makespan, the timed transfers) of ``coll`` over ``rings`` (chunks split by ``weights``), as in the
    module docstring; no transfers unless ``build``."""
    name, n = coll.name, coll.num_ranks
    timer = KeyOrderTimer(topology, routes, coll.chunk_bytes(size_bytes))
    C = coll.chunk_factor
    if name == "allreduce":
        # chunk j -> owner (contiguous, as even as possible), then rings within each owner's share
        j = 0
        per_ring: list[list[tuple[int, list[int]]]] = [[] for _ in rings]   # (owner, chunk slots)
        for q, counts in enumerate(_owner_splits(C, n, weights)):
            slots = list(range(j, j + sum(counts)))
            j += sum(counts)
            k = 0
            for r, c in enumerate(counts):
                if c:
                    per_ring[r].append((q, slots[k:k + c]))
                k += c
    else:
        counts = split_counts(C, weights)
        blocks: list[list[int]] = []
        k = 0
        for c in counts:
            blocks.append(list(range(k, k + c)))
            k += c

    for r, ring in enumerate(rings):
        order, chan = ring.order, r
        pos = {rank: i for i, rank in enumerate(order)}

        def at(q: int, hop: int, order: tuple[int, ...] = order, pos: dict[int, int] = pos) -> int:
            return order[(pos[q] + hop) % n]

        if name == "allreduce":
            for q, slots in per_ring[r]:
                prev = -1
                for t in range(n - 1):   # reduce-scatter to owner q
                    prev = timer.add((t, r, pos[q]), at(q, 1 + t), at(q, 2 + t), tuple(slots), True, chan, (prev,))
                for t in range(n - 1):   # allgather from owner q
                    prev = timer.add((n - 1 + t, r, pos[q]), at(q, t), at(q, t + 1), tuple(slots), False, chan, (prev,))
            continue
        ks = blocks[r]
        if not ks:
            continue
        if name == "allgather":
            for q in range(n):
                chunk_ids = tuple(coll.contribution(q, k) for k in ks)
                prev = -1
                for t in range(n - 1):
                    prev = timer.add((t, r, pos[q]), at(q, t), at(q, t + 1), chunk_ids, False, chan, (prev,))
        elif name == "reducescatter":
            for q in range(n):
                slots = tuple(q * C + k for k in ks)
                prev = -1
                for t in range(n - 1):
                    prev = timer.add((t, r, pos[q]), at(q, 1 + t), at(q, 2 + t), slots, True, chan, (prev,))
        elif name in ("broadcast", "reduce"):
            root = coll.root
            for m, k in enumerate(ks):
                chunk = coll.contribution(root, k) if name == "broadcast" else k
                prev = -1
                for h in range(n - 1):
                    if name == "broadcast":
                        src, dst = at(root, h), at(root, h + 1)
                    else:
                        src, dst = at(root, 1 + h), at(root, 2 + h)
                    prev = timer.add((m + h, h, r), src, dst, (chunk,), name == "reduce", chan, (prev,))
        elif name == "gather":
            root = coll.root
            for p in range(1, n):        # rank at relative position p walks n - p hops to the root
                q = at(root, p)
                chunk_ids = tuple(coll.contribution(q, k) for k in ks)
                prev = -1
                for h in range(n - p):
                    prev = timer.add((h, p, r), at(q, h), at(q, h + 1), chunk_ids, False, chan, (prev,))
        elif name == "scatter":
            root = coll.root
            for p in range(1, n):        # farthest first
                q = at(root, p)
                chunk_ids = tuple(coll.contribution(root, q * C + k) for k in ks)
                prev = -1
                for h in range(p):
                    prev = timer.add((n - 1 - p + h, -p, r), at(root, h), at(root, h + 1), chunk_ids, False, chan,
                                     (prev,))
        elif name == "alltoall":
            for q in range(n):
                for dst in range(n):
                    if dst == q:
                        continue
                    d = (pos[dst] - pos[q]) % n
                    chunk_ids = tuple(coll.contribution(q, dst * C + k) for k in ks)
                    prev = -1
                    for h in range(d):
                        prev = timer.add((h + n - 1 - d, -d, r, q), at(q, h), at(q, h + 1), chunk_ids, False, chan,
                                         (prev,))
        else:  # pragma: no cover - COLLECTIVES is closed
            raise SynthError(f"ring does not support {name}")

    transfers = timer.run(build)
    return max((m.end for m in timer.moves), default=0.0), transfers


METHOD = MethodSpec(
    name="ring",
    run=synthesize,
    collectives=frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter",
                           "alltoall"}),
    description="NCCL-style rings (multi-ring over disjoint Hamiltonian cycles, switch routes where needed)",
)

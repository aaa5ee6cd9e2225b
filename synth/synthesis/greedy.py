"""Greedy time-expanded link-chunk matching (TACOS, Won et al., MICRO'24).

TACOS grows a collective over a time-expanded network: whenever a link is free, it is matched to
a chunk its source holds and its destination still needs, and the chunk arrives one link-time
later. We follow that scheme on the α-β cost model of docs/cost-model.md:

- **Virtual links.** A rank reaches another rank either over a direct link or over a route through
  switches (switches hold no buffers, so rank -> switch -> ... -> rank is ONE transfer carrying a
  ``route``). A transfer of ``b`` bytes on virtual link ``j`` takes ``Σ α(hops) + b / min bw(hops)``
  and holds every physical link of the route for that time (docs/cost-model.md).
- **Events.** At every event time, all virtual links whose physical links are free are matched to
  chunks in one vectorized pass (numpy boolean matrices chunks × candidate links), conflicts are
  resolved (one chunk per (chunk, destination), one transfer per physical link), and the matched
  transfers start. Store-and-forward: a rank may forward a chunk only after it fully arrived.
- **Usefulness.** A chunk is useful on ``u -> v`` if ``v`` must end up holding it, or (copy
  collectives with sparse destinations: alltoall, gather, scatter) if ``v`` is strictly closer in hops
  to one of the chunk's destinations than every rank that holds it (a relay that makes progress).
- **Priority.** Chunks with the most ranks still waiting for them (fewest holders) and the longest
  remaining hop distance go first; a seeded random tie-break makes each try different and every
  run deterministic. The best of ``k`` tries (``options.extra['greedy_tries']``, default 4) wins.
- **Time limit.** Every event checks ``--time-limit``: a first run past it ends with a clear
  time-out (exit 2), later runs past it are dropped, and no run starts that would end past it.
- **Reductions** (reducescatter, reduce) run the copy problem (broadcast from each chunk's owner)
  on the reversed graph and reverse it in time: each copy ``u -> v`` over ``[s, e]`` becomes a
  reducing send ``v -> u`` over ``[T-e, T-s]``, so every rank sends its partial sum after all of
  its children's partials arrived. **Allreduce** is that reduce-scatter followed by an allgather
  of the reduced chunks (owner of chunk ``k`` is rank ``k mod N``).

The public helpers :func:`virtual_links`, :func:`copy_problem` and :func:`greedy_copy` are shared
with :mod:`synth.synthesis.milp` (warm start and horizon).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace

import numpy as np

from synth.arrays import unique_values
from synth.collectives import COLLECTIVES, Collective, CollectiveKind
from synth.errors import SynthError
from synth.limits import check_transfer_count
from synth.schedule import Schedule, Transfer
from synth.synthesis.base import Instance, MethodSpec, SynthOptions, deadline_of, time_limit_error
from synth.topology.model import Topology

# Cap on the candidate virtual links examined per event (keeps huge switched fabrics fast).
_MAX_CANDIDATES = 60_000
# Relative tolerance under which completion times count as one event (float rounding only).
_TIE_US = 1e-12


# ---- virtual links ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class VirtualLinks:
    """Rank-to-rank connections: direct links and routes through switches (one per ordered pair)."""

    src: np.ndarray        # (V,) rank
    dst: np.ndarray        # (V,) rank
    alpha: np.ndarray      # (V,) µs, sum of α over the hops
    bw: np.ndarray         # (V,) GB/s, smallest bw on the route
    route: tuple[tuple[int, ...], ...]   # switches crossed, in order
    phys: np.ndarray       # (V, H) physical link indices of the hops, padded with -1
    num_phys: int

    @property
    def count(self) -> int:
        return len(self.src)

    def time_us(self, nbytes: float, chunks: int = 1) -> np.ndarray:
        """α-β time of one transfer of ``chunks`` chunks of ``nbytes`` on every virtual link."""
        return self.alpha + chunks * nbytes / (self.bw * 1e3)


def virtual_links(topology: Topology) -> VirtualLinks:
    """Direct rank links, plus for every rank pair without one the best route through switches only
    (least total α, then fewest hops, then the widest bottleneck)."""
    n = topology.num_ranks
    index = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    src, dst, alpha, bw, routes, phys = [], [], [], [], [], []
    for u in range(n):
        # Dijkstra from u that only expands switch nodes: label = (alpha, hops, -minbw, path links)
        best: dict[int, tuple[float, int, float, tuple[int, ...], tuple[int, ...]]] = {}
        heap: list = []
        for link in topology.out_links[u]:
            lid = index[(link.src, link.dst)]
            heapq.heappush(heap, (link.alpha, 1, -link.bw, link.dst, (lid,), ()))
        settled: set[int] = set()
        while heap:
            a, hops, nbw, node, lids, sw = heapq.heappop(heap)
            if node in settled:
                continue
            settled.add(node)
            if topology.is_rank(node):
                if node != u:
                    best[node] = (a, hops, -nbw, lids, sw)
                continue
            for link in topology.out_links[node]:
                if link.dst in settled or link.dst == u:
                    continue
                lid = index[(link.src, link.dst)]
                heapq.heappush(heap, (a + link.alpha, hops + 1, max(nbw, -link.bw), link.dst,
                                      lids + (lid,), sw + (node,)))
        for v in sorted(best):
            a, hops, b, lids, sw = best[v]
            src.append(u)
            dst.append(v)
            alpha.append(a)
            bw.append(b)
            routes.append(sw)
            phys.append(lids)
    width = max((len(p) for p in phys), default=1)
    table = np.full((len(phys), width), -1, dtype=np.int64)
    for i, p in enumerate(phys):
        table[i, : len(p)] = p
    return VirtualLinks(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                        np.asarray(alpha, dtype=float), np.asarray(bw, dtype=float), tuple(routes),
                        table, len(topology.links))


def hop_distances(vl: VirtualLinks, n: int) -> np.ndarray:
    """All-pairs hop counts over virtual links (BFS via scipy)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    graph = csr_matrix((np.ones(vl.count), (vl.src, vl.dst)), shape=(n, n))
    dist = shortest_path(graph, unweighted=True, directed=True)
    if not np.isfinite(dist).all():
        raise SynthError("some rank cannot reach another rank (no direct link or switch route)")
    return dist.astype(np.int64)


# ---- the copy problem ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CopyProblem:
    """Chunks that start at ``sources[c]`` and must reach every rank of ``dests[c]`` (copy semantics)."""

    num_ranks: int
    sources: tuple[tuple[int, ...], ...]
    dests: tuple[tuple[int, ...], ...]
    chunk_ids: tuple[int, ...]         # schedule chunk id of each problem chunk

    @property
    def num_chunks(self) -> int:
        return len(self.sources)

    def matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """(holds at start, must hold at end) as bool matrices chunks × ranks."""
        h = np.zeros((self.num_chunks, self.num_ranks), dtype=bool)
        d = np.zeros_like(h)
        for c, (s, t) in enumerate(zip(self.sources, self.dests)):
            h[c, list(s)] = True
            d[c, list(t)] = True
        return h, d & ~h


@dataclass(frozen=True)
class Plan:
    """A plan over virtual links: ``(start, end, problem chunk, virtual link)`` per transfer."""

    starts: np.ndarray
    ends: np.ndarray
    chunks: np.ndarray
    links: np.ndarray
    tries: int = 1          # seeded runs it was the best of

    @property
    def makespan(self) -> float:
        return float(self.ends.max()) if len(self.ends) else 0.0


def dest_distance(problem: CopyProblem, dist: np.ndarray) -> np.ndarray:
    """D[c, v] = hops from v to the nearest destination of chunk c (0 for destinations)."""
    n = problem.num_ranks
    out = np.zeros((problem.num_chunks, n), dtype=np.int64)
    for c, dests in enumerate(problem.dests):
        if len(dests) + len(problem.sources[c]) >= n or not dests:
            continue
        out[c] = dist[:, list(dests)].min(axis=1)
    return out


def _packed_columns(matrix: np.ndarray) -> np.ndarray:
    """``np.packbits(matrix.T, axis=1)`` for a bool (chunks × ranks) matrix, built from groups of 8 rows
    without transposing the matrix first (that strided copy was half of a 128-rank torus alltoall's time)."""
    rows, cols = matrix.shape
    if rows % 8:
        matrix = np.concatenate([matrix, np.zeros((8 - rows % 8, cols), dtype=bool)])
    octets = matrix.view(np.uint8).reshape(-1, 8, cols)
    packed = octets[:, 0] << 7
    for bit in range(1, 8):
        packed |= octets[:, bit] << (7 - bit)
    return np.ascontiguousarray(packed.T)


_LEAD = np.array([7 - int(np.log2(b)) if b else 0 for b in range(256)], dtype=np.int64)  # first set bit


class GreedyTimeout(SynthError):
    """A greedy run passed its ``time.monotonic()`` deadline before every chunk was delivered."""


def greedy_copy(vl: VirtualLinks, problem: CopyProblem, chunk_bytes: float, seed: int = 0,
                dist: np.ndarray | None = None, deadline: float | None = None) -> Plan:
    """One TACOS-style greedy run (see the module docstring); deterministic for a given seed.

    Per event, chunks are sorted by priority and the hold / useful matrices are bit-packed in that
    order, so the best chunk of every candidate link is the first set bit of ``hold[src] & useful[dst]``.
    Raises :class:`GreedyTimeout` at the first event past ``deadline``: a run's events are matrix
    passes over every (chunk, rank), so one run can take a minute (256-rank torus alltoall: 56 s).
    """
    rng = np.random.default_rng(seed)
    if dist is None:
        dist = hop_distances(vl, problem.num_ranks)
    run = _GreedyRun(vl, problem, chunk_bytes, dist, rng)
    while run.remaining > 0:
        if deadline is not None and time.monotonic() > deadline:
            raise GreedyTimeout(f"{problem.num_chunks} chunks on {problem.num_ranks} ranks")
        for _ in range(2):  # matching passes at this event time
            if not run.match():
                break
        run.next_event()
    return run.plan()


class _GreedyRun:
    """The state of one greedy run: who holds, has in flight and still wants which chunk, the links' busy
    times and the transfers started; :meth:`match` and :meth:`next_event` are its two moves."""

    def __init__(self, vl: VirtualLinks, problem: CopyProblem, chunk_bytes: float, dist: np.ndarray,
                 rng: np.random.Generator) -> None:
        n, nc = problem.num_ranks, problem.num_chunks
        self.vl, self.n, self.rng = vl, n, rng
        self.hold, self.need = problem.matrices()
        sparse = np.array([0 < len(d) and len(d) + len(s) < n for d, s in zip(problem.dests, problem.sources)])
        self.any_sparse = bool(sparse.any())
        dd = dest_distance(problem, dist)
        self.inflight = np.zeros_like(self.hold)
        self.duration = vl.time_us(chunk_bytes)
        self.npad = vl.num_phys
        self.busy_until = np.zeros(self.npad + 1)      # last slot: padding, never busy
        self.phys = np.where(vl.phys < 0, self.npad, vl.phys)
        self.multi = (vl.phys >= 0).sum(axis=1) > 1
        self.out_deg = np.bincount(vl.src, minlength=n)
        self.noise = rng.random(nc) * 0.5
        self.pend_end = np.zeros(0)
        self.pend_c = np.zeros(0, dtype=np.int64)
        self.pend_v = np.zeros(0, dtype=np.int64)
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.now = 0.0
        self.remaining = int(self.need.sum())
        # What each chunk is wanted or usefully relayed for, and its priority. A chunk's rows change only
        # when it starts moving (a completion turns in-flight into held, and held only grows), so they
        # are set once here and refreshed there for the chunks that moved.
        self.want = self.need & ~self.inflight
        self.prio = np.empty(nc)
        self.relay = None
        if self.any_sparse:
            dd = dd.astype(np.int16) if n < np.iinfo(np.int16).max else dd   # hop counts: less memory traffic
            self.relay_ok = sparse[:, None] & (dd > 0)          # where a relay can make progress at all
            self.held = self.hold | self.inflight
            self.best = np.where(self.held, dd, np.iinfo(dd.dtype).max).min(axis=1)   # hops from the nearest holder
            self.relay = np.zeros_like(self.want)
            self.useful = np.zeros_like(self.want)
        else:
            self.useful = self.want      # the same array: nothing is relayed
        self.dd = dd
        self.refresh(slice(None))

    def refresh(self, rows) -> None:
        """Recompute the usefulness and priority of chunks ``rows``."""
        want, prio = self.want, self.prio
        if self.any_sparse:
            self.relay[rows] = self.relay_ok[rows] & (self.dd[rows] < self.best[rows, None]) & ~self.held[rows]
            self.useful[rows] = want[rows] | self.relay[rows]
            prio[rows] = want[rows].sum(axis=1) * 4.0 + np.minimum(self.best[rows], self.n) * 2.0 + self.noise[rows]
        else:
            prio[rows] = want[rows].sum(axis=1) * 4.0 + self.noise[rows]

    def match(self) -> bool:
        """One matching pass at ``now``: free links take their best chunks; False when nothing started."""
        cand = self._candidates()
        if not len(cand):
            return False
        cand, pick = self._best_chunks(cand)
        if not len(cand):
            return False
        cand, pick = self._one_per_destination(cand, pick)
        accept = self._free_routes(cand)
        cand, pick = cand[accept], pick[accept]
        if not len(cand):
            return False
        self._start(cand, pick)
        return True

    def _candidates(self) -> np.ndarray:
        """Virtual links whose physical links are free, whose source holds and destination wants a chunk."""
        vl, useful = self.vl, self.useful
        rank_has = (self.hold & useful.any(axis=1)[:, None]).any(axis=0)
        rank_wants = useful.any(axis=0)
        free = (self.busy_until[self.phys] <= self.now).all(axis=1)
        cand = np.flatnonzero(free & rank_has[vl.src] & rank_wants[vl.dst])
        if len(cand) > _MAX_CANDIDATES:
            cand = np.sort(self.rng.choice(cand, _MAX_CANDIDATES, replace=False))
        return cand

    def _best_chunks(self, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each candidate link's highest-priority chunk (bit-packed first set bit); links with none dropped."""
        vl = self.vl
        order = np.argsort(-self.prio, kind="stable")
        hp = _packed_columns(self.hold[order])
        up = _packed_columns(self.useful[order])
        ok = hp[vl.src[cand]] & up[vl.dst[cand]]
        nz = ok != 0
        has = nz.any(axis=1)
        cand, ok, nz = cand[has], ok[has], nz[has]
        if not len(cand):
            return cand, cand
        fb = nz.argmax(axis=1)
        return cand, order[fb * 8 + _LEAD[ok[np.arange(len(cand)), fb]]]

    def _one_per_destination(self, cand: np.ndarray, pick: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Priority order with a seeded tie-break, then one transfer per (chunk, destination) (per (chunk,
        distance) for relays)."""
        n = self.n
        rank = np.lexsort((self.rng.random(len(cand)), -self.prio[pick]))
        cand, pick = cand[rank], pick[rank]
        dst = self.vl.dst[cand]
        key = pick * n + dst
        if self.relay is not None:
            is_relay = self.relay[pick, dst] & ~self.want[pick, dst]
            key = np.where(is_relay, -(pick * (n + 1) + self.dd[pick, dst]) - 1, key)
        _, first = np.unique(key, return_index=True)
        first.sort()
        return cand[first], pick[first]

    def _free_routes(self, cand: np.ndarray) -> np.ndarray:
        """Accept mask: direct links always; routes, which share physical links, keep the best few per
        source and are then matched one by one onto links still free."""
        accept = ~self.multi[cand]
        if accept.all():
            return accept
        idx = np.flatnonzero(~accept)
        src = self.vl.src[cand[idx]]
        seen = np.zeros(self.n, dtype=np.int64)
        keep = []
        for i, s in zip(idx.tolist(), src.tolist()):
            if seen[s] < 2 * self.out_deg[s] and seen[s] < 8:
                seen[s] += 1
                keep.append(i)
        used = self.busy_until > self.now
        for i in keep:
            p = self.phys[cand[i]]
            if used[p].any():
                continue
            used[p] = True
            used[self.npad] = False
            accept[i] = True
        return accept

    def _start(self, cand: np.ndarray, pick: np.ndarray) -> None:
        """Start the matched transfers: links busy until they end, chunks in flight, priorities refreshed."""
        end = self.now + self.duration[cand]
        self.busy_until[self.phys[cand]] = end[:, None]
        self.busy_until[self.npad] = 0.0
        dst = self.vl.dst[cand]
        self.inflight[pick, dst] = True
        self.want[pick, dst] = False
        if self.any_sparse:
            self.held[pick, dst] = True
            np.minimum.at(self.best, pick, self.dd[pick, dst])
        self.refresh(unique_values(pick))
        self.pend_end = np.concatenate([self.pend_end, end])
        self.pend_c = np.concatenate([self.pend_c, pick])
        self.pend_v = np.concatenate([self.pend_v, dst])
        self.parts.append((np.full(len(cand), self.now), end, pick, cand))

    def next_event(self) -> None:
        """Advance to the next completion and apply every completion at that time.

        Completions a few ulps apart (sums of α and β terms taken in different orders) form one event;
        ``now`` is the LATEST of them, so a send matched at ``now`` never starts before a chunk it forwards
        has fully arrived, nor on a link that is still busy (link freedom is then tested exactly)."""
        if not len(self.pend_end):
            raise SynthError("greedy: no useful transfer is possible; some destination is unreachable")
        first = float(self.pend_end.min())
        done = self.pend_end <= first + _TIE_US * max(1.0, first)
        self.now = float(self.pend_end[done].max())
        c, v = self.pend_c[done], self.pend_v[done]
        self.inflight[c, v] = False
        self.hold[c, v] = True
        self.remaining -= int(self.need[c, v].sum())
        self.need[c, v] = False
        self.pend_end, self.pend_c, self.pend_v = self.pend_end[~done], self.pend_c[~done], self.pend_v[~done]

    def plan(self) -> Plan:
        """The transfers started, as a :class:`Plan`."""
        if not self.parts:
            return Plan(np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        starts, ends, chunks, links = (np.concatenate(x) for x in zip(*self.parts))
        return Plan(starts, ends, chunks.astype(np.int64), links.astype(np.int64))


def best_greedy(vl: VirtualLinks, problem: CopyProblem, chunk_bytes: float, seed: int = 0, tries: int = 4,
                dist: np.ndarray | None = None, deadline: float | None = None) -> Plan:
    """The shortest plan over ``tries`` seeded greedy runs (ties: the first). Every run is made, so the
    plan never depends on the machine's speed; :class:`GreedyTimeout` (a clear time-out, exit 2) where
    one passes the ``time.monotonic()`` ``deadline``, the user's wall-clock safety stop."""
    if dist is None:
        dist = hop_distances(vl, problem.num_ranks)
    best: Plan | None = None
    for k in range(max(1, tries)):
        plan = greedy_copy(vl, problem, chunk_bytes, seed=seed + k, dist=dist, deadline=deadline)
        if best is None or plan.makespan < best.makespan - 1e-9:
            best = plan
    assert best is not None
    return replace(best, tries=max(1, tries))


# ---- collectives -> copy problems ------------------------------------------------------------------
def effective_collective(collective: Collective, options: SynthOptions) -> Collective:
    """The collective the methods plan: ``options.chunks`` overrides C; allreduce with C = 1 uses
    C = N so the reduce-scatter/allgather halves have one chunk per rank."""
    c = options.chunks if options.chunks else collective.chunk_factor
    if options.chunks is None and collective.name == CollectiveKind.ALLREDUCE and collective.chunk_factor == 1:
        c = collective.num_ranks
    if c == collective.chunk_factor:
        return collective
    return Collective(collective.name, collective.num_ranks, c, collective.root, collective.inplace)


def check_supported(collective: Collective) -> None:
    """In-place alltoall needs scratch staging (each rank's slot q is both the chunk it sends to q and
    the one it receives from q), which the copy-problem model cannot express."""
    if collective.name == CollectiveKind.ALLTOALL and collective.inplace:
        raise SynthError("in-place alltoall is not supported by greedy/milp (it needs scratch staging); "
                         "use the out-of-place form")


def copy_problem(collective: Collective) -> tuple[CopyProblem, bool]:
    """The copy problem whose plan implements ``collective``; the flag says "run it on the reversed
    graph and reverse it in time" (reductions). Allreduce is handled by the caller (two phases)."""
    n = collective.num_ranks
    if collective.name == CollectiveKind.ALLREDUCE:
        raise ValueError("allreduce is two phases; use allreduce_owners")
    chunks, ranks, _ = collective.destinations()      # by chunk, then rank
    if collective.is_reduction:
        # reducescatter, reduce: one destination per chunk, which the reversed broadcast starts from
        owners = ranks.tolist()
        return CopyProblem(n, tuple((o,) for o in owners),
                           tuple(tuple(r for r in range(n) if r != o) for o in owners), tuple(chunks.tolist())), True
    away = ranks != collective.chunk_origin(chunks)   # a chunk already at its destination needs no transfer
    chunks, ranks = chunks[away], ranks[away]
    ids, first = np.unique(chunks, return_index=True)
    bounds = [*first.tolist(), len(ranks)]
    targets = ranks.tolist()
    return CopyProblem(n, tuple((o,) for o in collective.chunk_origin(ids).tolist()),
                       tuple(tuple(targets[a:b]) for a, b in zip(bounds, bounds[1:])), tuple(ids.tolist())), False


def allreduce_owners(collective: Collective) -> CopyProblem:
    """Allreduce phase problem: chunk k is reduced to (and then broadcast from) rank k mod N."""
    n = collective.num_ranks
    chunks = collective.schedule_chunks
    return CopyProblem(n, tuple((k % n,) for k in chunks),
                       tuple(tuple(r for r in range(n) if r != k % n) for k in chunks), tuple(chunks))


def plan_transfers(vl: VirtualLinks, problem: CopyProblem, plan: Plan, *, reverse: bool, offset: float = 0.0,
                   groups: np.ndarray | None = None, group_base: int = 0) -> list[Transfer]:
    """Schedule transfers from a plan, sorted by (start, end, chunk, src, dst); ``reverse`` turns it
    around in time and direction (reducing sends)."""
    total = plan.makespan
    ids = np.asarray(problem.chunk_ids, dtype=np.int64)
    chunk = ids[plan.chunks] if len(plan.chunks) else np.zeros(0, dtype=np.int64)
    u, v = vl.src[plan.links], vl.dst[plan.links]
    group = np.full(len(chunk), -1) if groups is None else group_base + np.asarray(groups)
    if reverse:
        s, e, u, v = offset + total - plan.ends, offset + total - plan.starts, v, u
    else:
        s, e = offset + plan.starts, offset + plan.ends
    order = np.lexsort((v, u, chunk, e, s))
    links = plan.links[order].tolist()
    routes = [vl.route[j][::-1] if reverse else vl.route[j] for j in links]
    return [Transfer(a, b, c, x, y, reverse, r, 0, g) for a, b, c, x, y, r, g in
            zip(s[order].tolist(), e[order].tolist(), chunk[order].tolist(), u[order].tolist(),
                v[order].tolist(), routes, group[order].tolist())]


def synthesize(inst: Instance) -> Schedule:
    """TACOS-style greedy schedule for any of the eight collectives (see the module docstring)."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    t0 = time.perf_counter()
    coll = effective_collective(collective, options)
    check_supported(coll)
    check_transfer_count(coll.min_transfers, f"{coll.name} on {coll.num_ranks} ranks in {coll.chunk_factor} "
                         "chunks needs at least")
    tries = int(options.extra.get("greedy_tries", 4))
    try:
        transfers, phases = _plan_phases(topology, coll, size_bytes, options, tries, deadline_of(options))
    except GreedyTimeout as exc:
        raise time_limit_error("greedy", options.time_limit, f"its {tries} runs finished ({exc})") from None
    # phases are sorted and follow each other in time, so the whole list is sorted
    makespan = max((t.end for t in transfers), default=0.0)
    return Schedule(coll, topology.name, tuple(transfers), method="greedy", size_bytes=float(size_bytes),
                    predicted_time_us=makespan,
                    notes={"tries": min((p.tries for p in phases), default=tries),
                           "seed": options.seed,
                           "synthesis_s": time.perf_counter() - t0})


def _plan_phases(topology: Topology, coll: Collective, size_bytes: float, options: SynthOptions, tries: int,
                 deadline: float | None) -> tuple[list[Transfer], list[Plan]]:
    """The greedy plans of ``coll`` (reduce-scatter then allgather for allreduce) and their transfers."""
    chunk_bytes = coll.chunk_bytes(size_bytes)
    transfers: list[Transfer] = []
    phases: list[Plan] = []
    if coll.num_ranks > 1:
        if coll.name == CollectiveKind.ALLREDUCE:
            problem = allreduce_owners(coll)
            rvl = virtual_links(topology.reversed())
            rs = best_greedy(rvl, problem, chunk_bytes, options.seed, tries, deadline=deadline)
            transfers += plan_transfers(rvl, problem, rs, reverse=True)
            vl = virtual_links(topology)
            ag = best_greedy(vl, problem, chunk_bytes, options.seed, tries, deadline=deadline)
            transfers += plan_transfers(vl, problem, ag, reverse=False, offset=rs.makespan)
            phases = [rs, ag]
        else:
            problem, reverse = copy_problem(coll)
            vl = virtual_links(topology.reversed() if reverse else topology)
            plan = best_greedy(vl, problem, chunk_bytes, options.seed, tries, deadline=deadline)
            transfers += plan_transfers(vl, problem, plan, reverse=reverse)
            phases = [plan]
    return transfers, phases


METHOD = MethodSpec(
    name="greedy",
    run=synthesize,
    collectives=frozenset(COLLECTIVES),
    description="TACOS-style greedy time-expanded link-chunk matching (fast, any scale; warm start for milp)",
    kind="heuristic",
)

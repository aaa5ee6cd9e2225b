"""Job-shop timing of transfers on a fabric: the one list-scheduling engine of the synthesis methods.

A :class:`Jobs` record lists transfers before timing (chunks, sender, receiver, switch route, reduction
flag, dependencies, priority key). The engines give each job a start and an end under the docs/cost-model.md
(a transfer holds every link of its route for ``Σα + b / min bw``):

- :func:`list_schedule`: work-conserving list schedule, smallest key first, optionally coalescing queued
  transfers into one message (:class:`Coalescing`) or replaying the runtime's threadblock rule; its event loop
  is :func:`synth.synthesis.listkernel.list_kernel` (numba), fed the jobs as arrays;
- :func:`justify`: forward-backward improvement of a timed schedule (Valls, Ballestín & Quintanilla,
  EJOR 165(2), 2005);
- :func:`level_schedule`, :func:`slot_schedule`, :func:`replicated_schedule`: vectorised timings for very
  large or translation-invariant forests;
- :func:`phase_transfers`: the timed jobs as :class:`synth.schedule.Transfer` records (mirrored in time and
  direction for reductions planned on the reversed fabric);
- :class:`KeyOrderTimer`: strict key-order placement of rank-to-rank moves (no overtaking).

Used by :mod:`synth.synthesis.trees` and :mod:`synth.synthesis.ringforest`; the ring and the baselines use
:class:`KeyOrderTimer`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple, Protocol

import numpy as np

from synth.errors import SynthError
from synth.gcpause import gc_paused
from synth.schedule import Transfer
from synth.synthesis.base import MAX_STEP_CHUNKS, MAX_STEPS_PER_TB
from synth.synthesis.packing import Route
from synth.topology.model import Topology

# tuple.__new__ skips a named tuple's Python-level __new__ (schedules build millions of Transfers)
new_tuple = tuple.__new__


class TreeShape(Protocol):
    """A rooted tree: ``edges`` (parent, child) with parents before children."""

    root: int
    edges: tuple[tuple[int, int], ...]


class ForestShape(Protocol):
    """Trees timed together (:class:`synth.synthesis.trees.forest.Forest` is one)."""

    trees: tuple[TreeShape, ...]


JUSTIFY_PASSES = 6          # backward-forward pairs of justify(), while they gain
ALPHA_SHARE = 0.01          # coalesced messages grow until α is this share of their time
MAX_COALESCE = 64           # chunks one coalesced message may carry (MSCCL cnt stays < 72)


# ---------------------------------------------------------------------------------------------
# jobs: transfers before timing
# ---------------------------------------------------------------------------------------------
@dataclass
class Jobs:
    """Transfers before timing, one entry per job in each list: the chunks it moves (one message, one α),
    sender, receiver, switch route, whether it reduces, the jobs it waits for, and its priority key
    (smallest first)."""

    msg: list[tuple[int, ...]]    # the chunks one step moves (contiguous slots; one α)
    src: list[int]
    dst: list[int]
    route: list[Route]
    reduce: list[bool]
    deps: list[tuple[int, ...]]
    key: list[tuple]
    head: list[int] = field(default_factory=list)  # set by the timing: first job of its message
    # derived once per set of jobs, for the several timings of it (list_schedule): (count, dependents, key ranks
    # as an array and as a list, the job of each key rank)
    derived: tuple | None = field(default=None, repr=False, compare=False)
    # likewise for coalesced timings: (count, first-chunk keys, next-chunk keys), see _message_keys
    message_keys: tuple | None = field(default=None, repr=False, compare=False)

    @classmethod
    def empty(cls) -> Jobs:
        return cls([], [], [], [], [], [], [])

    def add(self, msg: tuple[int, ...], src: int, dst: int, route: Route, reduce: bool, deps: tuple[int, ...],
            key: tuple) -> int:
        self.msg.append(msg)
        self.src.append(src)
        self.dst.append(dst)
        self.route.append(route)
        self.reduce.append(reduce)
        self.deps.append(deps)
        self.key.append(key)
        return len(self.msg) - 1

    def extend(self, msg: list[tuple[int, ...]], src: list[int], dst: list[int], route: list[Route],
               reduce: list[bool], deps: list[tuple[int, ...]], key: list[tuple]) -> None:
        """:meth:`add` for many jobs at once (the i-th of each list makes one job; ids follow on)."""
        self.msg += msg
        self.src += src
        self.dst += dst
        self.route += route
        self.reduce += reduce
        self.deps += deps
        self.key += key


def tree_heights(tree: TreeShape) -> dict[int, int]:
    """Height of the subtree below each node (0 for a leaf)."""
    height = {tree.root: 0}
    for _parent, child in tree.edges:
        height.setdefault(child, 0)
    for parent, child in reversed(tree.edges):  # parents precede children: reversed, children first
        height[parent] = max(height.get(parent, 0), height[child] + 1)
    return height


# ---------------------------------------------------------------------------------------------
# timing: in-order list schedule with link serialization
# ---------------------------------------------------------------------------------------------
def route_cost(nodes: tuple[int, ...], link_index: dict[tuple[int, int], int], alpha: np.ndarray,
               bw: np.ndarray) -> tuple[list[int], float, float]:
    """A route through ``nodes``: its link ids, their summed α (µs) and their least bandwidth (GB/s);
    a transfer of ``b`` bytes on it takes ``Σα + b / min bw`` (docs/cost-model.md)."""
    links = [link_index[pair] for pair in zip(nodes, nodes[1:])]
    return links, float(alpha[links].sum()), float(bw[links].min())


class RouteCosts(NamedTuple):
    """Per job of a :class:`Jobs`: its route's link ids (a list, and as CSR arrays), summed α (µs), least bandwidth
    (bytes/µs) and duration (µs); see :func:`route_costs`."""
    hops: list[list[int]]
    route_alpha: np.ndarray
    route_rate: np.ndarray
    duration: np.ndarray
    hop_ptr: np.ndarray     # job i's links are hop_link[hop_ptr[i]:hop_ptr[i + 1]]
    hop_link: np.ndarray


def route_costs(jobs: Jobs, topology: Topology, chunk_bytes: float) -> RouteCosts:
    """Per job: the link ids of its route, their summed α (µs), their least bandwidth (bytes/µs)
    and the transfer's duration ``Σα + b / min bw`` (docs/cost-model.md), with one ``Σα`` per MSCCL
    step: a message of more than ``MAX_STEP_CHUNKS`` chunks is lowered as several steps."""
    link_index = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    _, _, bw, alpha = topology.arrays
    n = len(jobs.msg)
    ids: dict[tuple, int] = {}   # each distinct (sender, receiver, route) is costed once
    route_id = np.fromiter((ids.setdefault(key, len(ids)) for key in zip(jobs.src, jobs.dst, jobs.route)),
                           dtype=np.int64, count=n)
    unique_links: list[list[int]] = []
    unique_alpha = np.zeros(len(ids))
    unique_rate = np.zeros(len(ids))
    for r, (src, dst, route) in enumerate(ids):
        nodes = (src, *route, dst)
        try:
            links, route_alpha_us, route_bw = route_cost(nodes, link_index, alpha, bw)
        except KeyError as exc:
            raise SynthError(f"internal error: route {nodes} uses a missing link") from exc
        unique_links.append(links)
        unique_alpha[r], unique_rate[r] = route_alpha_us, route_bw * 1e3
    unique_len = np.fromiter(map(len, unique_links), dtype=np.int64, count=len(ids))
    unique_ptr = np.concatenate(([0], np.cumsum(unique_len)[:-1])).astype(np.int64)
    unique_flat = np.fromiter(chain.from_iterable(unique_links), dtype=np.int64, count=int(unique_len.sum()))
    lengths = unique_len[route_id]
    hop_ptr = np.zeros(n + 1, dtype=np.int64)
    hop_ptr[1:] = np.cumsum(lengths)
    hop_link = unique_flat[np.repeat(unique_ptr[route_id] - hop_ptr[:-1], lengths) + np.arange(hop_ptr[-1])]
    route_alpha, route_rate = unique_alpha[route_id], unique_rate[route_id]
    size = np.fromiter(map(len, jobs.msg), dtype=np.float64, count=n)
    steps = np.ceil(size / MAX_STEP_CHUNKS)
    hops = [unique_links[r] for r in route_id.tolist()]
    return RouteCosts(hops, route_alpha, route_rate, route_alpha * steps + size * chunk_bytes / route_rate, hop_ptr,
                      hop_link)


@dataclass(frozen=True)
class Coalescing:
    """How one coalesced :func:`list_schedule` merges messages: α at most ``alpha_share`` of a message's
    time; with ``drain``, a message at most ``drain`` times what its links carry after it; with
    ``batch``, every transfer that becomes ready at one instant is queued before a link starts one
    (otherwise the first one ready may leave alone)."""
    alpha_share: float = ALPHA_SHARE
    drain: float | None = None
    batch: bool = False


def list_schedule(jobs: Jobs, topology: Topology, chunk_bytes: float,
                  chained: list[int] | None = None,
                  coalesce: bool = False, alpha_share: float = ALPHA_SHARE,
                  drain: float | None = None, batch: bool = False,
                  costs: RouteCosts | None = None) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Work-conserving list schedule: whenever a link is free it starts the ready transfer with the
    smallest key (critical path first, see :func:`add_broadcast`) among those whose route begins on it.

    A transfer holds every link of its route for ``Σα + b / min bw`` (docs/cost-model.md); it starts
    once its data has arrived and all its links are free. Returns (order by start, start, end).

    With ``coalesce``, the transfer started also takes along the other transfers queued (ready) for
    the same sender, receiver and route whose chunks extend its own contiguously, up to
    ``MAX_COALESCE`` chunks and until α is ``alpha_share`` of the message's time: one message, one α
    (an MSCCL step with ``cnt`` > 1). A link only has such a backlog when it is the bottleneck, so
    this cuts α where it costs time and keeps small messages (short pipeline fill) elsewhere.
    Merged transfers share ``jobs.head`` (the first one).

    With ``drain`` as well, a message carries at most ``drain`` times the data its links still
    carry after it, so each link's stream ends in geometrically shrinking messages: the last
    data a link delivers is forwarded soon after it arrives, while earlier, larger messages pay
    less α (the shrinking tail of a pipelined broadcast, Träff & Ripke, JPDC 2008, applied per
    link instead of per tree).

    With ``chained`` (per job, the job before it on its threadblock, or -1) the runtime's rule is
    replayed instead: a send is ready when its data has arrived and the previous send of its
    threadblock has delivered, and links take transfers in the order they became ready (the
    simulator's rule, without its backfilling of gaps).

    ``costs``: :func:`route_costs` of these jobs, where the caller times them several ways.
    """
    from synth.synthesis.listkernel import list_kernel  # numba: imported (and its cache loaded) when first timed

    n = len(jobs.msg)
    costs = costs if costs is not None else route_costs(jobs, topology, chunk_bytes)
    jobs.head = list(range(n))
    key_rank, job_at, dep_ptr, dep_idx, dnt_ptr, dnt_idx, msg_size = _derived(jobs)
    if chained is not None:
        deps_of = [d + (c,) if c >= 0 else d for d, c in zip(jobs.deps, chained)]
        return _fifo_schedule(deps_of, key_rank, costs.hops, costs.duration, len(topology.links))
    if n == 0:
        return [], np.zeros(0), np.zeros(0)
    chunk_bytes = float(chunk_bytes)
    data_time = msg_size * chunk_bytes / costs.route_rate if drain is not None else np.zeros(0)
    # without coalescing the kernel reads no message ids: any int array stands in
    head_id, next_id, num_head_ids = _message_keys(jobs) if coalesce else (dep_ptr, dep_ptr, 0)
    start, end, head, unplaced = list_kernel(
        len(topology.links), costs.hop_ptr, costs.hop_link, dep_ptr, dep_idx, dnt_ptr, dnt_idx, key_rank, job_at,
        costs.duration, costs.route_alpha, costs.route_rate, msg_size, chunk_bytes, MAX_STEP_CHUNKS, MAX_COALESCE,
        bool(coalesce), float(alpha_share), drain is not None, float(drain or 0.0), data_time, bool(batch),
        head_id, next_id, num_head_ids)
    if unplaced:
        raise SynthError("internal error: cyclic transfer dependencies")
    jobs.head = head.tolist()
    # by start, then key (the stable rank of every key, computed once per set of jobs)
    order = np.lexsort((key_rank, start)).tolist()
    return order, start, end


def _message_keys(jobs: Jobs) -> tuple[np.ndarray, np.ndarray, int]:
    """Per job, the id of its (sender, receiver, route, first chunk) and the id of the chunk after its last on the
    same (sender, receiver, route), or -1 where no job starts there: a coalesced message continues with the job
    whose first id is this one's next id. Ids are dense (their count is the third item). Computed once per set of
    jobs (as :func:`_derived`)."""
    n = len(jobs.msg)
    if jobs.message_keys is None or jobs.message_keys[0] != n:
        pair_ids: dict[tuple, int] = {}
        pair = np.array([pair_ids.setdefault(p, len(pair_ids)) for p in zip(jobs.src, jobs.dst, jobs.route)],
                        dtype=np.int64)
        first = np.fromiter((m[0] for m in jobs.msg), dtype=np.int64, count=n)
        last = np.fromiter((m[-1] for m in jobs.msg), dtype=np.int64, count=n)
        stride = int(last.max(initial=0)) - int(first.min(initial=0)) + 2
        head_key = pair * stride + first
        next_key = pair * stride + last + 1
        keys = np.unique(head_key)
        head_id = np.searchsorted(keys, head_key)
        next_pos = np.minimum(np.searchsorted(keys, next_key), max(len(keys) - 1, 0))
        next_id = np.where(keys[next_pos] == next_key, next_pos, -1) if len(keys) else next_pos
        jobs.message_keys = (n, head_id.astype(np.int64), next_id.astype(np.int64), len(keys))
    return jobs.message_keys[1:]


def _derived(jobs: Jobs) -> tuple[np.ndarray, ...]:
    """Each job's rank in key order (ties by index), the job of each rank, the dependencies and dependents as
    CSR arrays (pointers, indices) and each job's chunk count, computed once for the several timings of one set
    of jobs (jobs are only ever appended, so the count tells a stale copy)."""
    n = len(jobs.deps)
    if jobs.derived is None or jobs.derived[0] != n:
        job_at, key_rank = _key_ranks(jobs.key)
        dep_ptr = np.zeros(n + 1, dtype=np.int64)
        dep_ptr[1:] = np.cumsum(np.fromiter(map(len, jobs.deps), dtype=np.int64, count=n))
        dep_idx = np.fromiter(chain.from_iterable(jobs.deps), dtype=np.int64, count=int(dep_ptr[-1]))
        waiter = np.repeat(np.arange(n, dtype=np.int64), np.diff(dep_ptr))
        by_dep = np.argsort(dep_idx, kind="stable")
        dnt_ptr = np.zeros(n + 1, dtype=np.int64)
        dnt_ptr[1:] = np.cumsum(np.bincount(dep_idx, minlength=n))
        msg_size = np.fromiter(map(len, jobs.msg), dtype=np.int64, count=n)
        jobs.derived = (n, key_rank, np.array(job_at, dtype=np.int64), dep_ptr, dep_idx, dnt_ptr, waiter[by_dep],
                        msg_size)
    return jobs.derived[1:]


def _key_ranks(keys: list[tuple]) -> tuple[list[int], np.ndarray]:
    """(the job of each rank, each job's rank): ranks in key order, ties by index, so that comparing two jobs'
    ranks compares (key, index)."""
    job_at = sorted(range(len(keys)), key=keys.__getitem__)
    key_rank = np.empty(len(keys), dtype=np.int64)
    key_rank[job_at] = np.arange(len(keys))
    return job_at, key_rank


def _fifo_schedule(deps: list[tuple[int, ...]], key_rank: np.ndarray, hops: list[list[int]], duration: np.ndarray,
                   num_links: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Transfers placed in the order they become ready, each at the earliest time all its links
    are free (see :func:`list_schedule`); ties by key rank (:func:`_key_ranks`)."""
    import heapq

    n = len(deps)
    rank_of = key_rank.tolist()
    waiting, dependents = _dependents(deps)
    free = [0.0] * num_links
    start = [0.0] * n
    end = [0.0] * n
    heap = [(0.0, rank_of[i], i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    placed = 0
    while heap:
        t, _, i = heapq.heappop(heap)
        links = hops[i]
        s = t
        for link in links:
            if free[link] > s:
                s = free[link]
        e = s + duration[i]
        start[i], end[i] = s, e
        for link in links:
            free[link] = e
        placed += 1
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (max(end[d] for d in deps[j]), rank_of[j], j))
    if placed < n:
        raise SynthError("internal error: cyclic transfer dependencies")
    start_array = np.array(start)
    return np.lexsort((key_rank, start_array)).tolist(), start_array, np.array(end)


def _dependents(deps: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]]:
    """Per job: how many jobs it waits for, and the jobs that wait for it."""
    dependents: list[list[int]] = [[] for _ in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            dependents[d].append(i)
    return [len(d) for d in deps], dependents


def justify(transfers: list[Transfer], topology: Topology, chunk_bytes: float, makespan: float,
            passes: int = JUSTIFY_PASSES) -> tuple[float, list[Transfer]] | None:
    """A timed schedule compacted by forward-backward improvement ("double justification": Valls,
    Ballestín & Quintanilla, "Justification and RCPSP: A technique that pays", EJOR 165(2), 2005).

    Its messages keep their chunks, links and data dependencies (:func:`_message_jobs`). A backward
    pass list-schedules them in reversed time on the reversed fabric, the message that ended last
    first: every message moves as late as the others allow. The forward pass that follows takes
    them in the order they start there: every message moves as early as possible. Pairs of passes
    repeat while one of them shortens the schedule. Behind switches only forward schedules are kept:
    a backward one, mirrored in time, is as valid, but the runtime serves shared switch links in the
    order sends become ready, not as that plan has it. Returns (makespan, transfers) if one is
    shorter than ``makespan``, else None.

    List schedules place a message as soon as its link is free (critical path first); one pair of
    passes repacks what that greedy rule left idle (ring-8 scatter: 0.974 -> 1.0 of the first
    schedule's time; dgx-h100-2node broadcast 0.951).
    """
    messages = schedule_messages(transfers)
    jobs = _message_jobs(transfers, messages)
    n = len(jobs.msg)
    if n == 0:
        return None
    backward_fabric = topology.reversed()
    _, dependents = _dependents(jobs.deps)
    reversed_jobs = Jobs.empty()
    for i in range(n):
        reversed_jobs.add(jobs.msg[i], jobs.dst[i], jobs.src[i], jobs.route[i][::-1], jobs.reduce[i],
                          tuple(dependents[i]), ())
    first = np.array([transfers[members[0]].start for members in messages])
    start, end = _prioritised(jobs, first, topology, chunk_bytes)
    best = (float(end.max()), start, end)
    for _ in range(passes):
        back_start, back_end = _prioritised(reversed_jobs, -end, backward_fabric, chunk_bytes)
        span = float(back_end.max())
        start, end = _prioritised(jobs, span - back_end, topology, chunk_bytes)
        gained = min(span, end.max()) < best[0] * (1 - 1e-9)
        if span < best[0] and not topology.switches:
            best = (span, span - back_end, span - back_start)
        if end.max() < best[0]:
            best = (float(end.max()), start, end)
        if not gained:
            break
    if best[0] >= makespan * (1 - 1e-9):
        return None
    span, start, end = best
    out = []
    for m, members in enumerate(messages):
        group = m if len(members) > 1 else -1
        out += [transfers[i]._replace(start=float(start[m]), end=float(end[m]), group=group) for i in members]
    return span, out


def _prioritised(jobs: Jobs, priority: np.ndarray, fabric: Topology,
                 chunk_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) per job of :func:`list_schedule` with ``priority`` (smallest first). Jobs are
    renumbered in priority order first: transfers that become ready at one instant reach their
    links in job order, so without that the first-numbered one would leave first."""
    order = np.argsort(priority, kind="stable")
    new_index = np.empty(len(order), dtype=np.int64)
    new_index[order] = np.arange(len(order))
    ranked = Jobs.empty()
    for rank, i in enumerate(order.tolist()):
        ranked.add(jobs.msg[i], jobs.src[i], jobs.dst[i], jobs.route[i], jobs.reduce[i],
                   tuple(int(new_index[d]) for d in jobs.deps[i]), (rank,))
    _, start, end = list_schedule(ranked, fabric, chunk_bytes)
    return start[new_index], end[new_index]


def schedule_messages(transfers: list[Transfer]) -> list[list[int]]:
    """Transfer indices per message: those of one ``group`` moving together, or one transfer."""
    grouped: dict[tuple, list[int]] = defaultdict(list)
    for i, t in enumerate(transfers):
        grouped[(t.group, t.src, t.dst, t.start) if t.group >= 0 else (-1, i)].append(i)
    return list(grouped.values())


def _message_jobs(transfers: list[Transfer], messages: list[list[int]]) -> Jobs:
    """One job per message. A message sending chunk ``c`` from rank ``u`` waits for the messages that
    brought ``c`` to ``u`` before it started; one bringing ``c`` to ``u`` waits for those that sent
    ``c`` from ``u`` before it started (the order of a rank's partial sums stays as planned). Every
    dependency points back in time, so the schedule given is one order that keeps them all."""
    tol = 1e-9 * max(1.0, max((t.end for t in transfers), default=0.0))
    owner = [0] * len(transfers)
    for m, members in enumerate(messages):
        for i in members:
            owner[i] = m
    arrivals: dict[tuple[int, int], list[tuple[float, int]]] = defaultdict(list)
    sends: dict[tuple[int, int], list[tuple[float, int]]] = defaultdict(list)
    for i, t in enumerate(transfers):
        arrivals[(t.dst, t.chunk)].append((t.end, owner[i]))
        sends[(t.src, t.chunk)].append((t.end, owner[i]))
    deps: list[set[int]] = [set() for _ in messages]
    for i, t in enumerate(transfers):
        m = owner[i]
        deps[m].update(a for end, a in arrivals.get((t.src, t.chunk), ()) if end <= t.start + tol)
        deps[m].update(s for end, s in sends.get((t.dst, t.chunk), ()) if end <= t.start + tol)
    jobs = Jobs.empty()
    for m, members in enumerate(messages):
        t = transfers[members[0]]
        jobs.add(tuple(transfers[i].chunk for i in members), t.src, t.dst, t.route, t.reduce,
                 tuple(sorted(deps[m] - {m})), ())   # keyed by each pass (_prioritised)
    return jobs


def level_schedule(jobs: Jobs, topology: Topology, chunk_bytes: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised timing for very large forests (one dependency per transfer, as broadcasts have).

    Tree levels are timed one after another; within a level each link serves its transfers in
    order of readiness (FIFO, as the simulator does): ``s_i = max(r_i, s_{i-1} + d_{i-1})``, i.e.
    ``s_i = C_i + max_{j<=i}(r_j - C_j)`` with ``C`` the prefix sum of durations on the link, a
    grouped running maximum. A routed transfer is serialised on the first and the last link of
    its route (its sender's and receiver's ports), the links that saturate on switch fabrics.
    Returns (order by start, start, end).
    """
    n = len(jobs.msg)
    hops, _, _, duration, _, _ = route_costs(jobs, topology, chunk_bytes)
    first = np.fromiter((h[0] for h in hops), dtype=np.int64, count=n)
    last = np.fromiter((h[-1] for h in hops), dtype=np.int64, count=n)
    dep = np.fromiter((d[0] if d else -1 for d in jobs.deps), dtype=np.int64, count=n)
    level = np.zeros(n, dtype=np.int64)
    for i in np.nonzero(dep >= 0)[0].tolist():   # parents are created before their children
        level[i] = level[dep[i]] + 1
    free = np.zeros(len(topology.links))
    start = np.zeros(n)
    end = np.zeros(n)
    for d in range(int(level.max()) + 1 if n else 0):
        idx = np.nonzero(level == d)[0]
        ready = np.where(dep[idx] >= 0, end[np.maximum(dep[idx], 0)], 0.0)
        s = _serialize(ready, first[idx], duration[idx], free)
        routed = last[idx] != first[idx]
        if routed.any():
            s2 = _serialize(s[routed], last[idx][routed], duration[idx][routed], free)
            s[routed] = s2
        start[idx] = s
        end[idx] = s + duration[idx]
    order = np.lexsort((level, start))
    return order, start, end


def slot_schedule(jobs: Jobs, topology: Topology, chunk_bytes: float,
                  slots: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Translation-invariant timing (:func:`synth.synthesis.scale.translated_tree_arrays`): one message per
    tree, and the job on edge ``e`` of any tree runs in slot ``slots[e]``; a slot lasts the longest
    transfer. Returns (order by start, start, end)."""
    longest = float(route_costs(jobs, topology, chunk_bytes).duration.max(initial=0.0))
    edge = np.fromiter((key[-1] for key in jobs.key), dtype=np.int64, count=len(jobs.key))
    slot = np.asarray(slots, dtype=np.float64)[edge]
    start, end = slot * longest, (slot + 1) * longest   # a child's start is exactly its parent's end
    return np.argsort(start, kind="stable"), start, end


def replicated_schedule(jobs: Jobs, topology: Topology, chunk_bytes: float,
                        forest: ForestShape) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Timing for a forest whose trees are translates of one another (``scale.box_trees``): time
    the first tree alone with each *kind* of link as one resource (a kind: the roles of its two
    ends, a rank or a switch of a given rank/switch degree), then give every tree the same times.

    If translates put exactly one copy of each edge on each link of its kinds (boxes and rails
    alike), no link then carries two transfers at once; that is checked on the real links and
    None is returned when it fails (the caller falls back to the level timing).
    """
    per_tree = len(forest.trees[0].edges)
    if any(len(t.edges) != per_tree for t in forest.trees) or len(jobs.msg) != per_tree * len(forest.trees):
        return None
    n = topology.num_ranks
    degree = [(sum(1 for lk in topology.out_links[v] if lk.dst < n), len(topology.out_links[v]))
              for v in range(topology.num_nodes)]
    role = ["rank" if v < n else degree[v] for v in range(topology.num_nodes)]
    kinds: dict[tuple, int] = {}
    links_of, _, _, duration, _, _ = route_costs(jobs, topology, chunk_bytes)
    edge = np.fromiter((key[-1] for key in jobs.key), dtype=np.int64, count=len(jobs.key))
    tree = np.fromiter((key[-2] for key in jobs.key), dtype=np.int64, count=len(jobs.key))
    first = np.nonzero(tree == tree[0])[0]
    first = first[np.argsort(edge[first])]
    if not np.array_equal(edge[first], np.arange(per_tree)):
        return None
    resources = []
    for i in first.tolist():
        ids = []
        for lid in links_of[i]:
            link = topology.links[lid]
            ids.append(kinds.setdefault((role[link.src], role[link.dst]), len(kinds)))
        resources.append(ids)
    local = {int(j): pos for pos, j in enumerate(first.tolist())}
    deps = [tuple(local[d] for d in jobs.deps[i]) for i in first.tolist()]
    height = tree_heights(forest.trees[int(tree[0])])
    keys = [(-height[forest.trees[int(tree[0])].edges[e][1]], e) for e in range(per_tree)]
    _, start0, end0 = _fifo_schedule(deps, _key_ranks(keys)[1], resources, duration[first], len(kinds))
    start, end = start0[edge], end0[edge]
    if not np.allclose(end - start, duration):
        return None
    # check: no real link carries two transfers at once
    rows = np.repeat(np.arange(len(jobs.msg)), [len(h) for h in links_of])
    link_ids = np.fromiter((lid for h in links_of for lid in h), dtype=np.int64, count=len(rows))
    order = np.lexsort((start[rows], link_ids))
    same = link_ids[order][1:] == link_ids[order][:-1]
    if (same & (start[rows][order][1:] < end[rows][order][:-1] - 1e-9)).any():
        return None
    return np.argsort(start, kind="stable"), start, end


def _serialize(ready: np.ndarray, link: np.ndarray, duration: np.ndarray, free: np.ndarray) -> np.ndarray:
    """FIFO-by-readiness start times on each link (see :func:`level_schedule`); updates ``free``."""
    order = np.lexsort((ready, link))
    r, lk, d = ready[order], link[order], duration[order]
    head = np.ones(len(lk), dtype=bool)
    head[1:] = lk[1:] != lk[:-1]
    r = r.copy()
    r[head] = np.maximum(r[head], free[lk[head]])
    group = np.cumsum(head) - 1
    csum = np.cumsum(d) - d                       # prefix sums, restarted per group below
    csum -= (csum[head])[group]
    big = (float(np.abs(r).max()) + float(csum.max()) + 1.0) * 4 if len(r) else 1.0
    s = np.maximum.accumulate(r - csum + group * big) - group * big + csum
    s = np.maximum(s, r)                          # no rounding below readiness
    out = np.empty_like(s)
    out[order] = s
    tail = np.ones(len(lk), dtype=bool)
    tail[:-1] = lk[1:] != lk[:-1]
    free[lk[tail]] = (s + d)[tail]
    return out


def message_groups(jobs: Jobs, heads: list[int] | None) -> list[int]:
    """Transfer ``group`` per job: its message's first job when the message has several chunks or
    coalesced several jobs (``heads``, from a coalescing timing), else -1 (a one-chunk step)."""
    heads = heads if heads is not None else list(range(len(jobs.msg)))
    shared = {h for i, h in enumerate(heads) if h != i}
    return [h if len(msg) > 1 or h in shared else -1 for msg, h in zip(jobs.msg, heads)]


def replayed_makespan(jobs: Jobs, fabric: Topology, chunk_bytes: float, order: list[int],
                      costs: RouteCosts | None = None) -> float:
    """Makespan under the runtime's rule (:func:`list_schedule` with ``chained``): each connection's
    sends in ``order``, spread round-robin over threadblocks of at most ``MAX_STEPS_PER_TB`` steps."""
    count: dict[tuple[int, int], int] = defaultdict(int)
    for i in order:
        count[(jobs.src[i], jobs.dst[i])] += 1
    width = {c: max(1, math.ceil(v / MAX_STEPS_PER_TB)) for c, v in count.items()}
    seen: dict[tuple[int, int], list[int]] = defaultdict(list)
    chained = [-1] * len(jobs.msg)
    for i in order:
        prev = seen[(jobs.src[i], jobs.dst[i])]
        m = width[(jobs.src[i], jobs.dst[i])]
        chained[i] = prev[-m] if len(prev) >= m else -1
        prev.append(i)
    return float(list_schedule(jobs, fabric, chunk_bytes, chained, costs=costs)[2].max())


def phase_transfers(jobs: Jobs, mirrored: bool, order: list[int], start: np.ndarray, end: np.ndarray,
                    makespan: float, offset: float, reducing: bool, channel: int,
                    heads: list[int] | None) -> list[Transfer]:
    """The Transfers of one timed phase (its broadcasts mirrored into reductions on a reversed forest,
    about its ``makespan``)."""
    starts, ends = start.tolist(), end.tolist()
    if mirrored:  # mirror: t -> T - t, and every transfer runs the other way
        starts, ends = [makespan - e for e in ends], [makespan - x for x in starts]
    groups = message_groups(jobs, heads)
    msgs, routes = jobs.msg, jobs.route
    if mirrored:
        senders, receivers, red = jobs.dst, jobs.src, reducing
        routes = [route[::-1] for route in routes]
    else:
        senders, receivers, red = jobs.src, jobs.dst, False
    return [new_tuple(Transfer, (starts[i] + offset, ends[i] + offset, chunk, senders[i], receivers[i], red,
                                 routes[i], channel, groups[i]))
            for i in order for chunk in msgs[i]]


def connection_steps(jobs: Jobs, heads: list[int] | None = None) -> dict[tuple[int, int, bool], int]:
    """MSCCL steps per rank pair and phase (reduction or not) of the jobs' messages (:func:`message_steps`).
    ``heads``: each job's message, from a coalescing timing (None: every job its own message)."""
    chunks: dict[int, int] = defaultdict(int)
    for i, msg in enumerate(jobs.msg):
        chunks[i if heads is None else heads[i]] += len(msg)
    return message_steps((jobs.src[head], jobs.dst[head], jobs.reduce[head], count) for head, count in chunks.items())


def message_steps(messages: Iterable[tuple[int, int, bool, int]]) -> dict[tuple[int, int, bool], int]:
    """MSCCL steps per rank pair and phase of ``messages`` (sender, receiver, reduction or not, chunks): one per
    message of up to ``MAX_STEP_CHUNKS`` chunks (a longer one is lowered as several steps)."""
    steps: dict[tuple[int, int, bool], int] = defaultdict(int)
    for src, dst, reduce, count in messages:
        steps[(src, dst, reduce)] += -(-count // MAX_STEP_CHUNKS)
    return steps


def shares_links(jobs: Jobs) -> bool:
    """Do two rank pairs send over a common switch link (so the runtime's arbitration matters)?"""
    owner: dict[tuple[int, int], tuple[int, int]] = {}
    for src, dst, route in set(zip(jobs.src, jobs.dst, jobs.route)):
        nodes = (src, *route, dst)
        for hop in zip(nodes, nodes[1:]):
            if owner.setdefault(hop, (src, dst)) != (src, dst):
                return True
    return False


# ---------------------------------------------------------------------------------------------
# key-ordered placement (the ring and the baselines)
# ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Move:
    key: tuple
    src: int
    dst: int
    chunks: tuple[int, ...]
    reduce: bool
    channel: int
    deps: tuple[int, ...]
    partner: int = -1     # a move placed with this one, both starting at once (an exchange)
    start: float = 0.0
    end: float = 0.0


class KeyOrderTimer:
    """Place moves strictly in key order: each starts when its dependencies have ended and every link of
    its rank-to-rank route is free, and holds those links for ``Σα + bytes / min bw`` (docs/cost-model.md).

    Unlike :func:`list_schedule`, which starts whichever job is ready first, a move never overtakes one
    with a smaller key: the ring and the baselines state their step order by the key (step, ring, position).

    Two moves may be *partners* (:meth:`exchange`): both start when both could, so each reads its sender's buffer
    before the other's write lands there (a write ends its move; the lowering orders buffer accesses by time)."""

    def __init__(self, topology: Topology, routes: dict[tuple[int, int], tuple[int, ...]], chunk_bytes: float):
        self.topology = topology
        self.routes = routes
        self.chunk_bytes = chunk_bytes
        self.moves: list[_Move] = []

    def add(self, key: tuple, src: int, dst: int, chunks: tuple[int, ...], reduce: bool, channel: int,
            deps: tuple[int, ...] = ()) -> int:
        """Queue one move (negative ``deps`` are ignored); returns its index for later ``deps``."""
        self.moves.append(_Move(key, src, dst, chunks, reduce, channel, deps if min(deps, default=0) >= 0
                                else tuple(d for d in deps if d >= 0)))
        return len(self.moves) - 1

    def exchange(self, first: int, second: int) -> None:
        """Place moves ``first`` and ``second`` together (class docstring): at the first of them in key order, both
        start at the latest time either could; every dependency of either must come before both in key order."""
        self.moves[first].partner = second
        self.moves[second].partner = first

    def run(self, build: bool = True) -> list[Transfer]:
        """The moves timed in key order (their ``start``/``end`` set), as per-chunk Transfers if ``build``."""
        with gc_paused():   # hundreds of thousands of Transfers, no cycles
            return self._run(build)

    def _run(self, build: bool) -> list[Transfer]:
        free: dict[tuple[int, int], float] = {}
        hops: dict[tuple[int, int], tuple[tuple[tuple[int, int], ...], float, float, tuple[int, ...]]] = {}
        moves = self.moves
        order = sorted(range(len(moves)), key=lambda i: moves[i].key)
        done = [False] * len(moves)
        out: list[Transfer] = []

        def route_of(m: _Move):
            pair = (m.src, m.dst)
            if pair not in hops:   # one route per pair: its links, summed α and narrowest bw, once
                path = self.routes[pair]
                links = [self.topology.link(a, b) for a, b in zip(path[:-1], path[1:], strict=True)]
                hops[pair] = (tuple((lk.src, lk.dst) for lk in links), sum(lk.alpha for lk in links),
                              min(lk.bw for lk in links) * 1e3, tuple(path[1:-1]))
            return hops[pair]

        def earliest(m: _Move, keys) -> float:
            start = 0.0
            for d in m.deps:
                if not done[d]:
                    raise SynthError("internal: a timed move is ordered before its input")
                start = max(start, moves[d].end)
            for key in keys:
                start = max(start, free.get(key, 0.0))
            return start

        for group, i in enumerate(order):
            m = moves[i]
            pair = (m.src, m.dst)
            keys, alpha, rate, route = hops[pair] if pair in hops else route_of(m)
            if m.partner < 0:
                start = earliest(m, keys)
                m.start, m.end = start, start + alpha + len(m.chunks) * self.chunk_bytes / rate
                for key in keys:
                    free[key] = m.end
                done[i] = True
            elif not done[i]:   # the first of two partners: both start when both could
                both = (m, moves[m.partner])
                start = max(earliest(move, route_of(move)[0]) for move in both)
                for move in both:
                    move_keys, move_alpha, move_rate, _ = route_of(move)
                    move.start, move.end = start, start + move_alpha + len(move.chunks) * self.chunk_bytes / move_rate
                    for key in move_keys:
                        free[key] = move.end
                done[i] = done[m.partner] = True
            if build:
                out += [new_tuple(Transfer, (m.start, m.end, c, m.src, m.dst, m.reduce, route, m.channel, group))
                        for c in m.chunks]
        return out

"""Timing of forests for method trees: phases one after the other, mirrored reductions, and the
forward-timed allreduce (:mod:`synth.synthesis.timing`).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from itertools import chain

import numpy as np

from synth.arrays import pair_index
from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Transfer, TransferTable, time_mirrored
from synth.synthesis.base import MAX_STEP_CHUNKS
from synth.synthesis.timing import (
    Coalescing,
    Jobs,
    level_schedule,
    list_schedule,
    message_groups,
    new_tuple,
    phase_transfers,
    replayed_makespan,
    replicated_schedule,
    route_costs,
    shares_links,
    slot_schedule,
)
from synth.synthesis.trees import tuning
from synth.synthesis.trees.forest import Forest
from synth.synthesis.trees.jobs import (
    add_broadcast,
    add_reduction,
    merge_heavy_messages,
    owned_chunk_ids,
    phase_jobs,
    root_chunk_ids,
    spread_chunks,
    tree_shares,
)
from synth.synthesis.trees.messages import job_estimate, loop_chunk_factor, message_shapes, owner_units
from synth.synthesis.trees.tuning import COALESCING
from synth.topology.model import Topology

SEARCH_SCORING = (Coalescing(),)   # depth searches score a shape by its plain coalesced timing


@dataclass(frozen=True)
class Timing:
    """How :func:`timed_forests` times a message shape.

    ``height_weight``: the hops-ahead term of the priority (:func:`add_broadcast`); ``mirror``: an
    allgather is also timed as the mirror of its reduction timed forward (:func:`_mirrored_reduction`)
    and the faster is kept; ``coalescings``: the coalesced timings tried (:func:`list_schedule`);
    ``merge``: the messages on heavy routes merged in pairs but for the first and last ``merge`` of each
    stream (:func:`merge_heavy_messages`).
    """
    height_weight: float = 1.0
    mirror: bool = True
    coalescings: tuple[Coalescing, ...] = SEARCH_SCORING
    merge: tuple[int, int] | None = None


def timed_forests(topology: Topology, collective: Collective, plans: list[Forest], chunks: int, messages: int | None,
                  size_bytes: float, build: bool = True, tail: int = 0,
                  timing: Timing = Timing()) -> tuple[Collective, float, list[Transfer]]:
    """All phases, one after the other: (collective with its chunk factor, makespan, transfers;
    the transfers only if ``build``, else a search score in place of the makespan, see
    :func:`_timed_phase`). ``tail``: the message shape (:func:`message_shapes`)."""
    name, n = collective.name, topology.num_ranks
    coll = Collective(name, n, loop_chunk_factor(name, n, chunks, owner_units(plans)), collective.root,
                      collective.inplace)
    chunk_bytes = coll.chunk_bytes(size_bytes)
    parts: list[list[Transfer] | TransferTable] = []
    offset = 0.0
    mirror = None   # phase 0's jobs and plain end times, which timed_forward's mirrored priorities reuse
    for phase, forest in enumerate(plans):
        # each phase on its own channel: an allreduce's two phases fill a threadblock each
        slotted = _slot_phase(coll, forest, phase, chunks, messages, tail, topology, chunk_bytes, offset, build)
        if slotted is not None:
            part, makespan = slotted
        else:
            jobs = phase_jobs(coll, forest, phase, chunks, messages, timing.height_weight, tail)
            if timing.merge is not None:   # the jobs are on the forest's planning fabric
                jobs = merge_heavy_messages(jobs, topology.reversed() if forest.reversed else topology, timing.merge,
                                            tuning.TUNING.heavy_ratio)
            _check_transfer_limit(len(jobs.msg), chunks)
            part, makespan, plain_end = _timed_phase(jobs, forest, topology, chunk_bytes, offset, coll.is_reduction,
                                                     build, channel=phase, coalesce=name in COALESCING,
                                                     coalescings=timing.coalescings)
            # timed_forward's mirror: the first forest's default-priority jobs, timed plain on the reversed fabric
            if (phase == 0 and forest.reversed and plain_end is not None and timing.height_weight == 1.0
                    and timing.merge is None):
                mirror = (jobs, plain_end)
        parts.append(part)
        offset += makespan
    transfers = _joined(parts)
    if name in ("reducescatter", "allreduce"):
        forward = timed_forward(coll, plans, topology, chunks, messages, chunk_bytes, build, tail,
                                coalescings=timing.coalescings, mirror=mirror)
        if forward is not None and forward[0] < offset * (1 - 1e-9):
            return coll, forward[0], forward[1]
    if name == "allgather" and timing.mirror:
        mirrored = _mirrored_reduction(coll, plans[0], topology, chunks, messages, chunk_bytes, build, tail,
                                       timing.coalescings)
        if mirrored is not None and mirrored[0] < offset * (1 - 1e-9):
            return coll, mirrored[0], mirrored[1]
    return coll, offset, transfers


def _check_transfer_limit(jobs: int, chunks: int, limit: int | None = None) -> None:
    if jobs > (tuning.TUNING.max_transfers if limit is None else limit):
        raise SynthError(f"--chunks {chunks} makes {jobs} transfers; use fewer chunks")


def _joined(parts: list[list[Transfer] | TransferTable]) -> list[Transfer] | TransferTable:
    """The phases' transfers one after the other: a table where every phase built one."""
    if parts and all(isinstance(part, TransferTable) for part in parts):
        return TransferTable.concatenate(parts)
    return [t for part in parts for t in part]


def _slot_phase(coll: Collective, forest: Forest, phase: int, chunks: int, messages: int | None, tail: int,
                topology: Topology, chunk_bytes: float, offset: float, build: bool
                ) -> tuple[TransferTable, float] | None:
    """One phase of translated trees (``forest.slots``, :func:`synth.synthesis.scale.translated_tree_arrays`) as a
    :class:`TransferTable`: the transfers :func:`phase_jobs`, :func:`slot_schedule` and :func:`phase_transfers`
    make of it, computed on arrays instead of a Python record per job (a 64×64 torus allgather has 16.8 M).

    Slot timing: the job on edge ``e`` of any tree runs in ``[slots[e]·L, (slots[e] + 1)·L]`` with ``L`` the
    longest transfer ``α·⌈c / MAX_STEP_CHUNKS⌉ + c·b / bw`` (``c`` chunks of ``b`` bytes, docs/cost-model.md); a
    reversed forest is mirrored in time and direction (a reduction). None where that timing does not apply: a
    tree that carries other than one message, or a fabric with switches (routes a table does not hold); the job
    path then times the phase."""
    name, n = coll.name, coll.num_ranks
    fabric = topology.reversed() if forest.reversed else topology
    if forest.slots is None or fabric.switches or name in ("scatter", "gather"):
        return None
    plain = replace(forest, reversed=False)
    tree_order: list[int] = []
    carried: list[tuple[int, ...]] = []
    for r in (range(n) if name in ("allgather", "reducescatter", "allreduce") else (coll.root,)):
        for t, share in tree_shares(plain, r, root_chunk_ids(coll, r, chunks, forest.weights)):
            shapes = message_shapes(share, messages, tail)
            if len(shapes) != 1:
                return None
            tree_order.append(t)
            carried.append(shapes[0])
    per_tree = len(forest.slots)
    trees = [forest.trees[t] for t in tree_order]
    if len(trees) != len(forest.trees) or any(len(tree.edges) != per_tree for tree in trees):
        return None
    _check_transfer_limit(len(trees) * per_tree, chunks, tuning.TUNING.max_table_transfers)
    if forest.edge_arrays is not None:
        rows = np.asarray(tree_order, dtype=np.int64)
        parent, child = (a[rows].astype(np.int64).ravel() for a in forest.edge_arrays)
    else:
        edges = np.array([tree.edges for tree in trees], dtype=np.int64).reshape(len(trees) * per_tree, 2)
        parent, child = edges[:, 0], edges[:, 1]
    counts = np.fromiter(map(len, carried), dtype=np.int64, count=len(carried))
    size = np.repeat(counts.astype(np.float64), per_tree)
    # the (parent, child) link of each job on the planning fabric, as route_costs finds it
    link = pair_index([lk.src for lk in fabric.links], [lk.dst for lk in fabric.links], parent, child)
    if (link < 0).any():
        i = int(np.argmin(link))
        raise SynthError(f"internal error: route {(int(parent[i]), int(child[i]))} uses a missing link")
    _, _, bw, alpha = fabric.arrays
    duration = alpha[link] * np.ceil(size / MAX_STEP_CHUNKS) + size * chunk_bytes / (bw[link] * 1e3)
    longest = float(duration.max(initial=0.0))
    slot = np.tile(np.asarray(forest.slots, dtype=np.float64), len(trees))
    start, end = slot * longest, (slot + 1) * longest
    makespan = float(end.max()) if len(end) else 0.0
    if not build:
        return TransferTable.of(start=np.zeros(0), end=np.zeros(0), chunk=[], src=[], dst=[]), makespan
    order = np.argsort(start, kind="stable")
    if forest.reversed:   # mirrored: t -> T - t, every transfer the other way, reducing
        start, end, sender, receiver = makespan - end, makespan - start, child, parent
    else:
        sender, receiver = parent, child
    # each job in start order, then its message's chunks in order
    first = np.cumsum(counts) - counts
    flat_chunks = (np.array(carried, dtype=np.int64).ravel() if (counts == counts[0]).all() else
                   np.fromiter(chain.from_iterable(carried), dtype=np.int64, count=int(counts.sum())))
    job_tree = order // per_tree
    per_job = counts[job_tree]
    job = np.repeat(order, per_job)
    within = np.arange(int(per_job.sum())) - np.repeat(np.cumsum(per_job) - per_job, per_job)
    group = np.where(np.repeat(counts[job_tree] > 1, per_job), job, -1)
    return TransferTable.of(start=start[job] + offset, end=end[job] + offset,
                            chunk=flat_chunks[first[job // per_tree] + within], src=sender[job], dst=receiver[job],
                            reduce=forest.reversed and coll.is_reduction, channel=phase, group=group), makespan


def _mirrored_reduction(coll: Collective, forest: Forest, topology: Topology, chunks: int, messages: int | None,
                        chunk_bytes: float, build: bool, tail: int = 0,
                        coalescings: tuple[Coalescing, ...] = (Coalescing(),)
                        ) -> tuple[float, list[Transfer]] | None:
    """A broadcast phase as the time mirror of the reduction on its trees timed forward
    (:func:`timed_forward`) on the reversed fabric: t -> T - t, every transfer the other way."""
    if not forward_fits([forest], chunks, messages, tail):   # checked before any job is built
        return None
    reduction = timed_forward(coll, [replace(forest, reversed=True)], topology.reversed(), chunks, messages,
                               chunk_bytes, build, tail, coalescings=coalescings)
    if reduction is None:
        return None
    makespan, transfers = reduction
    return makespan, time_mirrored(transfers, makespan, reduce=False, channel=0)


def timed_forward(coll: Collective, plans: list[Forest], topology: Topology, chunks: int, messages: int | None,
                  chunk_bytes: float, build: bool, tail: int = 0,
                  joint: bool = False, coalescings: tuple[Coalescing, ...] = (Coalescing(),),
                  fits=None, mirror: tuple[Jobs, np.ndarray] | None = None) -> tuple[float, list[Transfer]] | None:
    """Reductions timed forward, leaf to root (:func:`add_reduction`), instead of as a mirrored
    broadcast; for allreduce the two phases overlap: each piece's allgather starts from its owner
    as soon as its sum is complete there, and links serve reduction transfers first.

    ``joint``: forests planned on split capacities (:func:`split_allreduce`), meant to run side
    by side: links serve both phases by pipeline position (hops ahead only), with no limit on size
    but the list schedule's.

    One list schedule of all transfers, plain and coalesced (each of ``coalescings``;
    the fastest is kept, among those ``fits(jobs, heads)`` accepts where given). Where a rank's
    in- and out-links are not all saturated in both phases (a mesh corner), the allgather of early
    pieces fills the reduction's idle links. None on fabrics where rank pairs share switch links
    (the runtime's arbitration is not modelled here) and on schedules too large to list-schedule.

    ``mirror``: the first forest's broadcast jobs (:func:`phase_jobs`, default priority) and their plain list
    schedule's end times on the reversed fabric, where the caller has timed them already.
    """
    key = (coll, tuple(map(id, plans)), topology.num_ranks, topology.links, chunks, messages, chunk_bytes, tail,
           joint, coalescings)
    known = _FORWARD_WINNERS.get(key) if fits is None else None
    if known is not None and all(ref() is plan for ref, plan in zip(known[0], plans)):
        _, winner, makespan = known
        if winner is None or not build:
            return None if winner is None else (makespan, [])
    else:
        winner = None
    best, winner = _forward_search(coll, plans, topology, chunks, messages, chunk_bytes, tail, joint, coalescings,
                                   fits, winner, mirror)
    if fits is None:   # weak references: a forest that dies frees its id for another, which they then tell apart
        makespan = float(best[1][2].max()) if best is not None and len(best[1][2]) else 0.0
        _FORWARD_WINNERS[key] = (tuple(weakref.ref(plan) for plan in plans), winner, makespan)
        if len(_FORWARD_WINNERS) > FORWARD_WINNERS_SIZE:
            del _FORWARD_WINNERS[next(iter(_FORWARD_WINNERS))]
    if best is None:
        return None
    jobs, (order, start, end), heads = best
    makespan = float(end.max()) if len(end) else 0.0
    if not build:
        return makespan, []
    groups = message_groups(jobs, heads)
    out = []
    starts, ends = start.tolist(), end.tolist()
    for i in order:
        s, e, src, dst, reduce, route, group = starts[i], ends[i], jobs.src[i], jobs.dst[i], jobs.reduce[i], \
            jobs.route[i], groups[i]
        out += [new_tuple(Transfer, (s, e, chunk, src, dst, reduce, route, 0 if reduce else 1, group))
                for chunk in jobs.msg[i]]
    return makespan, out


# the winning forward timing of recent arguments (:func:`timed_forward`): the depth search times a shape and the
# pipeline builds it later (a third of an allreduce search's forward timings repeat one); only the winner is kept
# (which priority and coalescing, and its makespan), as its jobs would hold megabytes
_FORWARD_WINNERS: dict[tuple, tuple[tuple[weakref.ref, ...], tuple[int, int] | None, float]] = {}
FORWARD_WINNERS_SIZE = 256


def _forward_search(coll: Collective, plans: list[Forest], topology: Topology, chunks: int,
                    messages: int | None, chunk_bytes: float, tail: int, joint: bool,
                    coalescings: tuple[Coalescing, ...], fits, only: tuple[int, int] | None,
                    mirror: tuple[Jobs, np.ndarray] | None):
    """The timings of :func:`timed_forward` (its docstring): the fastest as ((jobs, (order, start, end), heads),
    (priority, coalescing) indices), or (None, None); ``only``: time just that (priority, coalescing)."""
    n = coll.num_ranks
    priorities: list[dict | None] = [None]
    if not joint:
        # each root with chunks sends them down spanning trees, n - 1 jobs at least: refused before building them
        owners = n if plans[0].weights is None else sum(1 for w in plans[0].weights if w > 0)
        if owners * (n - 1) * len(plans) > tuning.TUNING.forward_jobs:
            return None, None
    if not joint and (only is None or only[0] == 1):
        # the start times of the mirrored broadcast schedule (the reduction that _timed_phase builds)
        mirror_jobs = mirror[0] if mirror is not None else phase_jobs(coll, plans[0], 0, chunks, messages, tail=tail)
        if len(mirror_jobs.msg) * len(plans) > tuning.TUNING.forward_jobs:   # five more list schedules: keep it quick
            return None, None
        mirror_end = mirror[1] if mirror is not None else list_schedule(mirror_jobs, topology.reversed(),
                                                                          chunk_bytes)[2]
        total = float(mirror_end.max()) if len(mirror_end) else 0.0
        planned: dict[tuple[int, int, int], float] = {}
        seen: dict[tuple[int, int], int] = defaultdict(int)
        for key, finish in zip(mirror_jobs.key, mirror_end.tolist()):
            edge = (key[-2], key[-1])
            planned[(*edge, seen[edge])] = total - finish
            seen[edge] += 1
        priorities.append(planned)
    best = winner = None
    # priorities for the reductions (hops still ahead; the mirrored broadcast's times), each
    # timed plain and coalesced: the fastest is kept
    for p, priority in enumerate(priorities):
        if only is not None and p != only[0]:
            continue
        jobs = _forward_jobs(plans, n, chunks, messages, priority, tail, 0 if joint else 1)
        if (len(jobs.msg) > tuning.TUNING.max_transfers or len(jobs.msg) > tuning.TUNING.level_jobs
                or (topology.switches and shares_links(jobs))):
            return None, None
        costs = route_costs(jobs, topology, chunk_bytes)
        for h, how in enumerate((None, *coalescings)):
            if only is not None and h != only[1]:
                continue
            if how is None and fits is not None and not fits(jobs, None):
                continue   # one message per job: its steps are known before the timing
            timed = list_schedule(jobs, topology, chunk_bytes, coalesce=how is not None,
                                  **(asdict(how) if how is not None else {}), costs=costs)
            heads = list(jobs.head) if how is not None else None
            if heads is not None and fits is not None and not fits(jobs, heads):
                continue
            if best is None or timed[2].max() < best[1][2].max() * (1 - 1e-9):
                best, winner = (jobs, timed, heads), (p, h)
    return best, winner


def _forward_jobs(plans: list[Forest], n: int, chunks: int, messages: int | None,
                  priority: dict[tuple[int, int, int], float] | None, tail: int = 0,
                  gather_phase: int = 1) -> Jobs:
    """Jobs of :func:`timed_forward`: reductions leaf to root, then (allreduce) the allgather of
    each piece released by the jobs that complete its sum at the owner. The allgather's jobs rank
    after every reduction job (``gather_phase`` 1) or by pipeline position with them (0)."""
    reduce_forest = plans[0]
    jobs = Jobs.empty()
    if_reduced: dict[int, list[int]] = defaultdict(list)
    for r in range(n):
        spread_chunks(reduce_forest, r, owned_chunk_ids(r, chunks, reduce_forest.weights), messages,
                lambda t, msgs: add_reduction(jobs, reduce_forest, t, msgs, 0, if_reduced, priority), tail)
    if len(plans) == 2:
        root_deps = {c: tuple(d) for c, d in if_reduced.items()}
        plain = replace(plans[1], reversed=False)
        for r in range(n):
            spread_chunks(plain, r, owned_chunk_ids(r, chunks, plain.weights), messages,
                    lambda t, msgs: add_broadcast(jobs, plain, t, msgs, gather_phase, root_deps), tail)
    return jobs


def forward_fits(plans: list[Forest], chunks: int, messages: int | None, tail: int) -> bool:
    """Is an allgather's schedule small enough for its mirrored reduction to be timed forward
    (:func:`_mirrored_reduction`; ``TUNING.forward_jobs``, by :func:`job_estimate`)?"""
    return job_estimate(plans, chunks, messages, tail) <= tuning.TUNING.forward_jobs


def _timed_phase(jobs: Jobs, forest: Forest, topology: Topology, chunk_bytes: float, offset: float,
                 reducing: bool, build: bool = True, channel: int = 0,
                 coalesce: bool = False,
                 coalescings: tuple[Coalescing, ...] = (Coalescing(),)
                 ) -> tuple[list[Transfer], float, np.ndarray | None]:
    """Time one phase's broadcasts on its planning fabric; a reversed forest's schedule is then
    mirrored in time (t -> T - t) and direction: the broadcast becomes a reduction (or a gather)
    with the same makespan, and link serialization and data dependencies carry over. With
    ``coalesce``, coalesced timings (one per :class:`Coalescing` in ``coalescings``) compete with the plain one.
    Returns (transfers, makespan, the plain list schedule's end times where one was made)."""
    fabric = topology.reversed() if forest.reversed else topology
    heads = None   # set when a coalesced timing wins: the first job of each job's message
    plain_end = None
    if forest.slots is not None and len(jobs.msg) == len(forest.trees) * len(forest.slots):
        order, start, end = slot_schedule(jobs, fabric, chunk_bytes, forest.slots)
        order = order.tolist()
    elif forest.replicated and (timed := replicated_schedule(jobs, fabric, chunk_bytes, forest)) is not None:
        order, start, end = timed
        order = order.tolist()
    elif len(jobs.msg) > tuning.TUNING.level_jobs and all(len(d) <= 1 for d in jobs.deps):
        order, start, end = level_schedule(jobs, fabric, chunk_bytes)
        order = order.tolist()
    else:
        costs = route_costs(jobs, fabric, chunk_bytes)
        order, start, end = list_schedule(jobs, fabric, chunk_bytes, costs=costs)
        plain_end = end
        # Coalescing usually cuts α on bottleneck links but can delay a pipeline: keep the faster.
        # Mirrored into reductions too: once the lowering kept the planned order (blocks per
        # connection, one α per step), their simulated times match the plan (benchmarks/bench_trees.py
        # sim/plan 1.000; mi250-2node reducescatter 0.930 -> 0.944, dgx-a100-2node 0.970 -> 0.978).
        for how in coalescings if coalesce else ():
            merged = list_schedule(jobs, fabric, chunk_bytes, coalesce=True, **asdict(how), costs=costs)
            if merged[2].max() < end.max() - 1e-9:
                (order, start, end), heads = merged, list(jobs.head)
        if topology.switches and not forest.reversed and tuning.TUNING.replay and not build and shares_links(jobs):
            # Search score on switch fabrics. Links there are shared by many connections, and the
            # runtime serves them in the order sends become ready, not by our priority; replay
            # that rule (each connection's sends in priority order, spread round-robin over
            # threadblocks of <= 64 steps, no backfilling) and score the mean of the two makespans
            # (the simulator lies between them). The transfers keep the priority order's times.
            return [], (float(end.max()) + replayed_makespan(jobs, fabric, chunk_bytes, order, costs)) / 2, plain_end
    makespan = float(end.max()) if len(end) else 0.0
    if not build:
        return [], makespan, plain_end
    transfers = phase_transfers(jobs, forest.reversed, order, start, end, makespan, offset, reducing, channel, heads)
    return transfers, makespan, plain_end

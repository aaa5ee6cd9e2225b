"""Scatter and gather of method trees on the paths of the optimal flow (:mod:`synth.synthesis.paths`).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import asdict, replace

import numpy as np

from synth.collectives import Collective
from synth.errors import SynthError, TimeLimitReached
from synth.schedule import Schedule, Transfer
from synth.synthesis import circuits
from synth.synthesis.base import MAX_CHANNELS, MAX_STEPS_PER_TB, MAX_XML_NODES, SynthOptions
from synth.synthesis.paths import PathPlan, plan_paths
from synth.synthesis.ring import split_counts
from synth.synthesis.timing import (
    Coalescing,
    Jobs,
    connection_steps,
    justify,
    list_schedule,
    message_groups,
    replayed_makespan,
    route_cost,
    route_costs,
    shares_links,
)
from synth.synthesis.trees import tuning
from synth.synthesis.trees.messages import busiest_rank_xml, chunk_fit, root_piece_bytes
from synth.synthesis.trees.programs import first_with_runner_ups
from synth.topology.model import Topology


def path_schedule(topology: Topology, collective: Collective, size_bytes: float,
                  options: SynthOptions) -> Schedule | None:
    """Scatter or gather over the paths of its optimal flow (:mod:`synth.synthesis.paths`,
    :func:`forward_paths`); a scatter is also built as the time mirror of the gather on the reversed
    fabric, whose flow is the same one walked back (:func:`_mirrored_gather`), and the faster plan kept.
    A gather walks the reversed fabric's flow from each rank to the root. None if no flow can be planned."""
    name, root = collective.name, collective.root
    try:
        flows = plan_paths(topology.reversed() if name == "gather" else topology, root)
    except TimeLimitReached:
        raise
    except SynthError:
        return None
    if name == "gather":
        return forward_paths(topology, collective, size_bytes, options, _one_each(_towards_root(flows)),
                              alternatives=True)
    found = [forward_paths(topology, collective, size_bytes, options, _one_each(flows), alternatives=True),
             *(_mirrored_gather(topology, collective, size_bytes, options, _towards_root(flows), levelled)
               for levelled in (False, True))]
    found = sorted((schedule for schedule in found if schedule is not None), key=lambda s: s.predicted_time_us)
    return first_with_runner_ups(found) if found else None


def _towards_root(plans: list[PathPlan]) -> list[PathPlan]:
    """``plans`` with every path walked backwards, from its rank to the root (on the reversed fabric)."""
    return [replace(plan, paths=tuple(replace(path, hops=tuple((b, a, route[::-1]) for a, b, route
                                                                in reversed(path.hops)))
                                       for path in plan.paths)) for plan in plans]


def _mirrored_gather(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                     gather_plans: list[PathPlan], levelled: bool = False) -> Schedule | None:
    """A scatter as the gather on the reversed fabric (:func:`forward_paths` on ``gather_plans``) run
    backwards in time, every transfer the other way, then re-timed forwards by :func:`justify` (always:
    the mirror alone plans what the runtime does not do; mi250-2node 3094 µs planned, 3371 simulated,
    justified 3123 and 3292). Each rank's sources push their own data from the start, which pipelines
    better than pulling it from the root: simulated scatter mi250-2node 0.855 -> 0.921 of the bound,
    dgx-h100-2node 0.964 -> 0.969, dgx-a100-4node 0.931 -> 0.940, and never slower on the built-in fabrics.
    ``levelled``: the gather's chunks shared among its paths with the links kept level
    (:func:`_levelled_counts`); :func:`path_schedule` builds both, and the levelled mirror is the faster on
    mi250-2node (scatter 0.921 -> 0.959), mi250 and dgx-h100-2node, though not as a gather of its own."""
    gather = forward_paths(topology.reversed(), replace(collective, name="gather"), size_bytes, options,
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


def forward_paths(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                  candidates: list[tuple[PathPlan, ...]], counts_tried: tuple[int, ...] = tuning.TUNING.path_chunks,
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
    fit = chunk_fit(collective, size_bytes, options)
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
    in_rounds = [found for found in ranked if found[-1] == "rounds"]
    kept_rounds = {id(found) for found in in_rounds[:tuning.TUNING.rounds_runners_up]}
    ranked = [found for found in ranked if found[-1] != "rounds" or id(found) in kept_rounds]
    return first_with_runner_ups([_path_schedule_of(topology, name, size_bytes, method, *found)
                                   for found in (ranked if alternatives else ranked[:1])])


def _timed_paths(jobs: Jobs, topology: Topology, chunk_bytes: float, in_rounds: bool, shared: bool):
    """(score, start, end, heads) of each timing of path ``jobs`` that fits MSCCL's limits: list
    schedules plain and coalesced (:attr:`TreesTuning.built`), or, for rounds of circuits, every link in round
    order (:func:`synth.synthesis.circuits.ordered_schedule`; nothing else keeps the rounds).

    Behind ``shared`` switch links the runtime serves sends as they become ready: a list schedule
    scores the mean of its planned and replayed makespans, as the forests' search does. Rounds keep
    their order on the uplinks (the lowering's uplink dependencies), so their plan is their score; the
    receiving ports still take sends as they come, and rounds at different chunk counts simulate
    further apart than their plans (dgx-a100-4node: 33.3 ms to 36.0 ms for plans within 1 %)."""
    n = topology.num_ranks
    limit = MAX_CHANNELS * MAX_STEPS_PER_TB
    costs = route_costs(jobs, topology, chunk_bytes)
    for how in (("ordered",) if in_rounds else (None, *tuning.TUNING.built)):
        if how == "ordered":
            links, duration = costs.hops, costs.duration
            order, start, end = circuits.ordered_schedule(jobs.key, jobs.deps, links, duration, len(topology.links))
        else:
            order, start, end = list_schedule(jobs, topology, chunk_bytes, coalesce=how is not None,
                                              **(asdict(how) if how is not None else {}), costs=costs)
        heads = list(jobs.head) if isinstance(how, Coalescing) else None   # only coalescing merges jobs
        steps = connection_steps(jobs, heads)
        if max(steps.values()) > limit or busiest_rank_xml(steps, n) > MAX_XML_NODES:
            continue
        makespan = float(end.max())
        score = (makespan + replayed_makespan(jobs, topology, chunk_bytes, order, costs)) / 2 \
            if shared and not in_rounds else makespan
        yield score, start, end, heads


def _path_schedule_of(topology: Topology, name: str, size_bytes: float, method: str, score: float,
                      coll: Collective, jobs: Jobs, start: np.ndarray, end: np.ndarray, heads: list[int] | None,
                      plans: tuple[PathPlan, ...], priority: str) -> Schedule:
    """The Schedule of one timed path candidate of :func:`forward_paths` (``priority``: how its jobs were ordered)."""
    n = topology.num_ranks
    groups = message_groups(jobs, heads)
    transfers = [Transfer(float(start[i]), float(end[i]), chunk, jobs.src[i], jobs.dst[i], False, jobs.route[i], 0,
                          groups[i]) for i, msg in enumerate(jobs.msg) for chunk in msg]
    transfers.sort(key=lambda t: (t.start, t.end))
    notes = {"paths": sum(len(plan.paths) for plan in plans), "chunks_per_root": coll.chunk_factor,
             "score_us": score, "flow_time_us": plans[0].time_per_byte_us * root_piece_bytes(name, n, size_bytes),
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
    switch). Which one is fastest depends on the fabric; :func:`forward_paths` times those it is given."""
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
    links, _, _, duration, _, _ = route_costs(jobs, fabric, chunk_bytes)
    chains = circuits.chains_of(jobs.deps)
    rounds_of = circuits.circuit_rounds(chains, links, [bool(route) for route in jobs.route], duration, jobs.key)
    if all(r is None for r in rounds_of):
        return None
    span = 1 + max(r for r in rounds_of if r is not None)
    # a position key is (0, position, -hops ahead, ...): rounds take the position's place
    keys = [(0, float(r), *key[2:]) if r is not None else (0, key[1] * span, *key[2:])
            for r, key in zip(rounds_of, jobs.key)]
    return replace(jobs, key=keys)

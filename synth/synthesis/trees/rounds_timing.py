"""Round-timed schedules of method trees (:mod:`synth.synthesis.rounds`): transfers of each tree edge
in rounds of an LP's shares.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from synth.collectives import Collective
from synth.schedule import Transfer
from synth.synthesis import rounds
from synth.synthesis.base import MAX_CHANNELS, MAX_STEPS_PER_TB
from synth.synthesis.timing import Jobs, connection_steps, list_schedule, phase_transfers
from synth.synthesis.trees import tuning
from synth.synthesis.trees.forest import Forest
from synth.synthesis.trees.jobs import root_chunk_ids, tree_shares
from synth.synthesis.trees.messages import loop_chunk_factor, owner_units, root_piece_bytes
from synth.topology.model import Topology


def tree_edges(forest: Forest, fabric: Topology, per_root_bytes: float) -> rounds.TreeEdges | None:
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
                 for t, ids in tree_shares(plain, root, root_chunk_ids(coll, root, chunks, forest.weights))}
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


SOLVED_PLANS = 16   # round plans kept per process (a method's later calls and other methods' pose the same LPs)
_plans: dict[tuple, tuple[list[float], rounds.RoundPlan | None, bool]] = {}


def _round_plan(key: tuple, edges: rounds.TreeEdges, deadline: float | None, beat_us: float) -> rounds.RoundPlan | None:
    """:func:`synth.synthesis.rounds.plan_rounds` of ``edges`` against ``beat_us``, each LP ``key`` poses solved once
    per process: ``mirror`` times trees' forests of the other collective, which on a fabric equal to its reverse
    pose the same LPs (a 16-rank hypercube of two link classes: 4 interior-point solves, 45 s of CPU, per call).
    A later target is replayed against the times the solves were compared with (``trace``), which is what
    ``plan_rounds`` would decide; it solves again only where the first stopped short of a target the new one
    passes. Deterministic: the same answer whether solved here or earlier."""
    key = (key, tuning.TUNING.rounds)
    if key in _plans:
        trace, plan, complete = _plans[key]
        if any(t >= beat_us for t in trace):
            return None
        if complete:
            return plan
    trace: list[float] = []
    plan = rounds.plan_rounds(edges, tuning.TUNING.rounds, deadline=deadline, above_us=beat_us, trace=trace)
    if len(_plans) >= SOLVED_PLANS:
        del _plans[next(iter(_plans))]
    _plans[key] = (trace, plan, not any(t >= beat_us for t in trace))
    return plan


def clear_round_plans() -> None:
    """Forget the round plans solved so far (a test that counts solves starts from none)."""
    _plans.clear()


def timed_rounds(topology: Topology, coll: Collective, plans: list[Forest], chunk_options: list[int],
                 size_bytes: float, deadline: float | None,
                 beat_us: float) -> tuple[Collective, float, list[Transfer], int] | None:
    """All phases round-timed (:mod:`synth.synthesis.rounds`), each link keeping the rounds' order:
    (collective, makespan, transfers, chunks per root) at the fastest of ``chunk_options``, or None
    (also where a phase's optimistic first LP cannot beat ``beat_us``)."""
    name, n = coll.name, topology.num_ranks
    per_root_bytes = root_piece_bytes(name, n, size_bytes, owner_units(plans))
    posed = []
    for forest in plans:
        fabric = topology.reversed() if forest.reversed else topology
        edges = tree_edges(forest, fabric, per_root_bytes)
        if edges is None:
            return None
        # the LP is fixed by which edges share a link, their times and waits: an allreduce on a fabric
        # equal to its reverse poses the same one twice (mi250 allreduce: 4 solves instead of 8), and _round_plan
        # solves each once
        hops = tuple(tuple((fabric.links[i].src, fabric.links[i].dst) for i in ids) for ids in edges.links)
        posed.append((forest, fabric, edges, (edges.waits, hops, edges.data_us.tobytes(), edges.alpha_us.tobytes())))
    # the budget is the shares of every distinct LP the phases pose (an allreduce's two on forests that differ:
    # 2 x 14.4k on a 16-rank hypercube of two link classes, 78 s of interior point for 0.25 %)
    distinct = {key: len(edges.waits) for _, _, edges, key in posed}
    if sum(distinct.values()) * tuning.TUNING.rounds > tuning.TUNING.round_variables:
        return None
    planned = []
    for forest, fabric, edges, key in posed:
        plan = _round_plan(key, edges, deadline, beat_us)
        if plan is None:
            return None
        planned.append((forest, fabric, plan))
    best = None
    for chunks in chunk_options:
        timed = Collective(name, n, loop_chunk_factor(name, n, chunks, owner_units(plans)), coll.root, coll.inplace)
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

"""Allreduce of method trees on link capacities split between its two phases
(:mod:`synth.synthesis.split`), timed side by side.
"""

from __future__ import annotations

from dataclasses import replace

from synth.collectives import Collective
from synth.schedule import Schedule
from synth.synthesis.base import MAX_CHANNELS, MAX_STEPS_PER_TB, MAX_XML_NODES, check_deadline
from synth.synthesis.timing import Jobs, connection_steps
from synth.synthesis.trees import tuning
from synth.synthesis.trees.forest import plan_forest
from synth.synthesis.trees.messages import (
    any_chunks,
    busiest_pair_load,
    busiest_rank_xml,
    loop_chunk_factor,
    root_piece_bytes,
    split_chunks,
)
from synth.synthesis.trees.programs import forest_schedule
from synth.synthesis.trees.timed import timed_forward
from synth.topology.model import Topology


def split_allreduce(topology: Topology, collective: Collective, size_bytes: float, sequential_us: float,
                    deadline: float | None, fit=any_chunks, runnable: bool = False) -> Schedule | None:
    """Allreduce on forests planned on link capacities split between its two phases
    (:mod:`synth.synthesis.split`) and timed side by side (:func:`timed_forward`, ``joint``).

    The split is rounded to whole trees in both phases at once (:func:`~synth.synthesis.split.whole_tree_split`)
    where that solves in time, so the forests keep its rate and both phases get a share of every link
    (:mod:`synth.synthesis.split`). The fastest candidate is timed once more with
    :attr:`TreesTuning.polish`'s coalescings.

    ``runnable``: where no count of equal pieces makes a loop an MSCCL runtime runs at SIZE, the forests kept are
    also timed with pieces a unit apart (:func:`runnable_split`), the schedule's alternative.

    None where that LP is not ``TUNING.split_gain`` faster than the phases one after the other
    (``sequential_us``), and where no candidate fits MSCCL's limits. Switchless fabrics only: behind
    switches the split's rank pairs share the links of their routes, and a transfer must find all of them
    free at once; timed side by side, such forests took 1.4-1.6x their bandwidth time (mixed boxes, a DGX
    pair without one NIC: session 32), where each phase alone took 1.07x.
    """
    from synth.synthesis.split import split_capacities, whole_tree_split

    n = topology.num_ranks
    piece_bytes = root_piece_bytes("allreduce", n, size_bytes)
    split = split_capacities(topology, sequential_us * (1 - tuning.TUNING.split_gain), piece_bytes)
    if split is None:
        return None
    split_us = split.time_us(piece_bytes)
    roots = tuple(range(n))

    def fits(jobs: Jobs, heads: list[int] | None) -> bool:
        steps = connection_steps(jobs, heads)
        # each phase keeps its own channels, so a connection splits over half of them
        return (max(steps.values(), default=0) * tuning.TUNING.step_margin <= MAX_CHANNELS // 2 * MAX_STEPS_PER_TB
                and busiest_rank_xml(steps, n) <= MAX_XML_NODES)

    best = None
    for cap in tuning.TUNING.split_trees:
        whole = whole_tree_split(topology, split, cap, deadline=deadline, work_limit=tuning.TUNING.whole_split_work)
        shares = whole or split
        plans = [plan_forest(shares.reducescatter, roots, reverse=True, max_trees=cap),
                 plan_forest(shares.allgather, roots, max_trees=cap)]
        k = max(f.k for f in plans)
        wanted = sorted({c for c in tuning.TUNING.split_chunks if c >= k} | {k * c for c in tuning.TUNING.split_chunks})
        for chunks in dict.fromkeys(fit(c)[0] for c in wanted):   # see runtime_chunks
            check_deadline(deadline, "trees", "timing the split allreduce")
            # one chunk per message; split_chunks gives each root's trees their chunks and the others 0
            per_tree_chunks = [[sum(c) for c in zip(*(split_chunks(f, r, chunks) for r in roots))] for f in plans]
            if busiest_pair_load(plans, per_tree_chunks) > MAX_CHANNELS * MAX_STEPS_PER_TB:
                break
            coll = Collective("allreduce", n, loop_chunk_factor("allreduce", n, chunks), collective.root,
                              collective.inplace)
            # built as it is timed: the transfers are cheap next to the list schedule
            timed = timed_forward(coll, plans, topology, chunks, None, coll.chunk_bytes(size_bytes), True,
                                   joint=True, fits=fits)
            if timed is not None and (best is None or timed[0] < best[0] * (1 - 1e-9)):
                best = (*timed, plans, chunks, coll, shares)
        if whole is not None and whole.rate_GBps >= split.rate_GBps * (1 - 1e-9):
            break   # whole trees at the split's rate: more trees per root only cut the messages finer
    if best is None:
        return None
    makespan, transfers, plans, chunks, coll, shares = best
    check_deadline(deadline, "trees", "polishing the split allreduce")
    polished = timed_forward(coll, plans, topology, chunks, None, coll.chunk_bytes(size_bytes), True,
                              joint=True, coalescings=tuning.TUNING.polish, fits=fits)
    if polished is not None and polished[0] < makespan * (1 - 1e-9):
        makespan, transfers = polished
    schedule = forest_schedule(topology, coll, transfers, makespan, plans, size_bytes, "trees",
                               chunks_per_root=chunks, messages_per_tree=None, tail_splits=0, halving_messages=False,
                               depth_trials=0,
                               capacity_split_time_us=split_us,
                               # the phases run side by side, each on its share (in tree edges, not GB/s)
                               tree_bandwidth_time_us=shares.time_us(piece_bytes)
                               * max(float(f.ratio / f.optimal) for f in plans))
    other = runnable_split(topology, collective, size_bytes, plans, fits, deadline) if runnable else None
    return schedule if other is None else replace(schedule, alternatives=(other,))


def runnable_split(topology: Topology, collective: Collective, size_bytes: float, plans: list, fits,
                   deadline: float | None) -> Schedule | None:
    """The split forests ``plans`` carrying pieces a unit apart (:func:`~synth.synthesis.trees.ownership.
    runnable_forests`), one chunk per unit, timed side by side
    as :func:`split_allreduce` times them; the fastest total, or None where equal pieces can run at SIZE or no
    total fits MSCCL's limits."""
    from synth.synthesis.trees.ownership import runnable_forests

    found = None
    for total, heavy in runnable_forests(plans, size_bytes):
        check_deadline(deadline, "trees", "timing the split allreduce with pieces the runtime runs")
        coll = Collective("allreduce", topology.num_ranks, total, collective.root, collective.inplace)
        timed = timed_forward(coll, heavy, topology, 1, None, coll.chunk_bytes(size_bytes), True, joint=True,
                              coalescings=tuning.TUNING.polish, fits=fits)
        if timed is not None and (found is None or timed[0] < found[0] * (1 - 1e-9)):
            found = (*timed, heavy, coll, total)
    if found is None:
        return None
    makespan, transfers, heavy, coll, total = found
    return forest_schedule(topology, coll, transfers, makespan, heavy, size_bytes, "trees", chunks_per_root=1,
                           messages_per_tree=None, tail_splits=0, halving_messages=False, depth_trials=0,
                           even_ownership=total)

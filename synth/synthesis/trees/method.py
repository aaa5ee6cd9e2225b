"""Method ``trees`` (:func:`synthesize`, :data:`METHOD`): the pipeline at several trees-per-root caps,
the split allreduce, flow paths and the ring forest as alternatives.
"""

from __future__ import annotations

from dataclasses import replace

from synth.collectives import Collective
from synth.errors import SynthError, TimeLimitReached
from synth.schedule import Schedule
from synth.synthesis.base import Instance, MethodSpec, SynthOptions, check_deadline, deadline_of
from synth.synthesis.trees import tuning
from synth.synthesis.trees.composed import COMPOSED, composed_planner
from synth.synthesis.trees.forest import Forest, plan_forest
from synth.synthesis.trees.jobs import heavy_link_ends_late
from synth.synthesis.trees.messages import chunk_fit, root_piece_bytes
from synth.synthesis.trees.ownership import ownership_weights, runnable_forests
from synth.synthesis.trees.pathsched import path_schedule
from synth.synthesis.trees.pipeline import (
    Pipelined,
    capped_floor_us,
    finish_schedule,
    flipped_planner,
    forest_phases,
    forests_floor_us,
    is_symmetric,
    piece_options,
    polish,
    routes_symmetric,
    run_pipeline,
    schedule_from_plans,
    with_runner_ups,
)
from synth.synthesis.trees.programs import first_with_runner_ups, justified_schedule
from synth.synthesis.trees.split_allreduce import split_allreduce
from synth.synthesis.trees.timed import Timing, timed_forests
from synth.synthesis.trees.tuning import SUPPORTED
from synth.topology.model import Topology


# ---------------------------------------------------------------------------------------------
# the method
# ---------------------------------------------------------------------------------------------
def synthesize(inst: Instance) -> Schedule:
    """Throughput-optimal trees for the request's collective at its SIZE (see :mod:`synth.synthesis.trees`)."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    name = collective.name
    if name not in SUPPORTED:
        raise SynthError(f"method trees does not support {name}; it supports {', '.join(sorted(SUPPORTED))}")
    n = topology.num_ranks
    max_trees = options.max_trees if options.max_trees is not None else tuning.TUNING.default_max_trees
    if n == 1:
        return Schedule(Collective(name, 1, options.chunks or 1, collective.root, collective.inplace),
                        topology.name, (), method="trees", size_bytes=float(size_bytes))
    options = piece_options(collective, options)
    # each phase moves every root's piece to the n - 1 other ranks, a transfer each at least: refuse before
    # packing forests whose schedule could not be kept (a 64x64 torus allgather: 16.8 M transfers)
    least = sum(len(roots) for roots, _ in forest_phases(collective)) * (n - 1)
    # past large_ranks a torus gets translated trees, whose schedule is built as columns (max_table_transfers)
    tabled = n > tuning.TUNING.large_ranks and inst.torus_dims is not None
    limit = tuning.TUNING.max_table_transfers if tabled else tuning.TUNING.max_transfers
    if least > limit:
        raise SynthError(f"method trees needs at least {least:,} transfers for {name} on {n} ranks, more than its "
                         f"limit of {limit:,}")
    # an allreduce's ownership, where owning 1/N each is clearly slower (trees.ownership): an alternative forest
    # pair, not with --chunks (counted per rank)
    weights = ownership_weights(topology) if name == "allreduce" and options.chunks is None else None
    # an allreduce whose pieces the search chooses: where equal pieces cannot run at SIZE, pieces a unit apart too
    runnable = name == "allreduce" and options.chunks is None and options.runtime_chunks

    symmetric = not topology.switches and is_symmetric(topology)
    # the other orientation's forests (flipped_planner) only where shapes are searched: its timing is capped
    # at FORWARD_JOBS transfers anyway, and the route check runs one search per rank
    flippable = (bool(topology.switches) and n <= tuning.TUNING.tree_search_ranks and is_symmetric(topology)
                 and routes_symmetric(topology))
    cache: dict[tuple[tuple[int, ...], int, bool, tuple[int, ...] | None, bool, bool], Forest] = {}

    # on an edited fabric, the forests warm-started from the healthy fabric's are tried at the shape found (_or_warm)
    healthy = options.healthy

    def planner_for(trees_cap: int, warm: Topology | None = None, owners: tuple[int, ...] | None = None,
                    slack: bool = True):
        def planner(roots: tuple[int, ...], reverse: bool) -> Forest:
            # each forest planned once (the weighted caps read their floor before the search plans them again);
            # on a switchless fabric equal to its reverse the reduction trees are the broadcast trees
            planned_reverse = reverse and not symmetric
            key = (roots, trees_cap, warm is not None, owners, slack, planned_reverse)
            if key not in cache:
                cache[key] = plan_forest(topology, roots, reverse=planned_reverse, max_trees=trees_cap, healthy=warm,
                                         weights=owners, slack=slack)
            return replace(cache[key], reversed=reverse) if symmetric else cache[key]
        return planner

    def flipped_for(trees_cap: int, owners: tuple[int, ...] | None = None, slack: bool = True):
        return flipped_planner(topology, trees_cap, weights=owners, slack=slack) if flippable else None

    phases = forest_phases(collective)

    def searched(planner, other_planner) -> Pipelined:
        # run_pipeline, once per set of forests: a capped k often packs the forests the default did, and the cap
        # search would search them again (dgx-a100-2node without one NIC, allreduce: 4 trees per root, 10.6 s)
        planned, flipped = [], False
        for phase in phases:
            try:
                planned.append(planner(*phase))
            except TimeLimitReached:
                raise
            except SynthError:
                if other_planner is None:
                    raise
                # one orientation may not split along the fixed routes where the other does (a dragonfly's
                # switches, reversed, with circuits charged): the phase takes the other orientation's forest, which
                # is then no alternative
                planned.append(other_planner(*phase))
                flipped = True
        plans = tuple(planned)
        other_planner = None if flipped or other_planner is None else _or_none(other_planner)
        key = (plans, other_planner is None)
        for earlier_others, found in searches.get(key, []):
            # run_pipeline plans the other orientation only where its schedule is small: the same forests decide
            # that the same way, and where it did, those forests must match too
            if earlier_others is None or earlier_others == tuple(other_planner(*phase) for phase in phases):
                return found
        others: list[Forest] = []

        def other_recorded(roots: tuple[int, ...], reverse: bool) -> Forest:
            others.append(other_planner(roots, reverse))
            return others[-1]

        by_phase = dict(zip(phases, plans))
        found = run_pipeline(topology, collective, size_bytes, options,
                             lambda roots, reverse: by_phase[(roots, reverse)],
                             other_recorded if other_planner is not None else None)
        searches.setdefault(key, []).append((tuple(others) if others else None, found))
        return found

    def pipelined(trees_cap: int, owners: tuple[int, ...] | None = None) -> tuple[Pipelined, Schedule]:
        found = searched(planner_for(trees_cap, owners=owners), flipped_for(trees_cap, owners))
        if any(f.slack for f in found.plans):
            # slack on the slow links is not always faster (mixed MI250 + A100 allgather 0.952 against 0.962 with full
            # capacities): the forests on full capacities are searched too, and the faster kept
            full = searched(planner_for(trees_cap, owners=owners, slack=False),
                            flipped_for(trees_cap, owners, slack=False))
            if full.timed[1] < found.timed[1] * (1 - 1e-9):
                found, full = full, found
            if trees_cap == max_trees and owners is None:   # the runner-up is simulated too (the plan can misrank)
                capacity_runner_ups.append(full)
        if healthy is not None and owners is None:   # the healthy fabric's forests were packed for equal roots
            warm = [_or_none(planner_for(trees_cap, healthy))] + (
                [_or_none(flipped_planner(topology, trees_cap, healthy))] if flippable else [])
            found = _or_warm(topology, collective, size_bytes, found, warm)
        return found, finish_schedule(topology, collective, size_bytes, options, found, "trees")

    def polished(found: Pipelined, kept: Schedule) -> Schedule:
        # only the shape finally kept is polished (TUNING.polish: 15 more list schedules); the shapes planned
        # nearly as fast go with it for the pipeline to simulate (polish)
        better = polish(topology, collective, size_bytes, found)
        if better.timed[1] < kept.predicted_time_us * (1 - 1e-9):
            kept = finish_schedule(topology, collective, size_bytes, options, better, "trees", rounds_tried=True)
        return with_runner_ups(topology, collective, size_bytes, options, kept, better)

    def composed_schedules(kept: Schedule) -> list[Schedule]:
        # the rails + box forest composition (trees.composed), where the fabric has rail boxes: pipelined only
        # where its forests' bandwidth time leaves room below the schedule kept; the pipeline simulates both.
        # Also the composition whose box forest uses the network too, where that raises the rate by
        # TUNING.network_gain (MI250 boxes at 25-50 GB/s per GCD: the rails leave the NICs mostly idle)
        if name not in COMPOSED or options.max_trees is not None:
            return []
        planner = composed_planner(topology, max_trees)
        if planner is None:
            return []
        check_deadline(deadline, "trees", "timing the composed box forests")
        piece = root_piece_bytes(name, n, size_bytes)
        found: list[Schedule] = []
        plain_time = None
        netted = composed_planner(topology, max_trees, network=True)
        for candidate in (planner, netted):
            if candidate is None:
                continue
            plans = {phase: candidate(*phase) for phase in phases}
            floor = sum(forest.bandwidth_time_us(piece) for forest in plans.values())
            if plain_time is not None and floor > plain_time * (1 - tuning.TUNING.network_gain):
                break
            plain_time = floor
            if floor >= kept.predicted_time_us:
                continue
            # the request's own options: schedule_from_plans counts --chunks per root piece itself; searched again,
            # batch-scored, where polish finds the plain score misjudged them (schedule_from_plans' rescoring), but
            # not an allreduce: its two phases make a search cost twice, and on mi250x8-ib16 that took it past 120 s
            # of CPU for the same program (0.8218); nor the network composition (mi250x8-ib50 reducescatter: the
            # same 0.8593 in 76 s of CPU instead of 90)
            rescoring = tuning.TUNING.composed_scoring if name != "allreduce" and candidate is planner else None
            done = schedule_from_plans(topology, collective, size_bytes, inst.options,
                                       lambda roots, reverse, plans=plans: plans[(roots, reverse)], "trees",
                                       rescoring=rescoring)
            found.append(replace(done, notes={**done.notes, "composed_boxes": True}))
            planned.append((done.predicted_time_us, [plans[phase] for phase in phases]))
        return found

    def runnable_schedule() -> Schedule | None:
        # an allreduce whose equal pieces no MSCCL runtime runs at SIZE (24 or 48 ranks, a power-of-two buffer): the
        # fastest forests planned again carry pieces that differ by a unit (trees.ownership.runnable_totals), so that a
        # program the runtimes run stands beside the faster one they would not, and the pipeline keeps it (auto keeps
        # a faster program of another method the runtimes would not run only where this one is RUNNABLE_LOSS slower;
        # --any-chunks keeps the fastest: a100x3 1 GiB, 7361.4 us runnable against 7314.0)
        # not past large_ranks: translated trees there, timed by slots (scale.py)
        if not runnable or weights is not None or n > tuning.TUNING.large_ranks:
            return None
        _, plans = min(planned, key=lambda entry: entry[0])
        found = None
        for total, heavy in runnable_forests(plans, size_bytes):
            check_deadline(deadline, "trees", "timing forests with pieces the runtime runs")
            by_phase = dict(zip(phases, heavy))
            try:
                done = schedule_from_plans(topology, collective, size_bytes, replace(inst.options, chunks=n),
                                           lambda roots, reverse, by_phase=by_phase: by_phase[(roots, reverse)],
                                           "trees")
            except TimeLimitReached:
                raise
            except SynthError:   # an alternative only (one chunk per unit past MSCCL's steps: a 6x6x6 torus)
                continue
            if found is None or done.predicted_time_us < found.predicted_time_us * (1 - 1e-9):
                found = replace(done, notes={**done.notes, "even_ownership": total})
        return found

    def weighted_schedule(kept: Schedule) -> Schedule | None:
        # the allreduce's forests with weighted ownership (trees.ownership), at few trees per unit
        # (TUNING.weighted_caps) up to the cap, where they are planned faster than the schedule
        # kept (a slower runner-up that MSCCL runtimes load would stand in for a kept program over their limits,
        # which the pipeline otherwise refits); the pipeline simulates both
        if weights is None:
            return None
        found = done = None
        uniform_floor = min(earlier.floor for entries in searches.values() for _, earlier in entries
                            if earlier.plans[0].weights is None)
        # fewest trees first: those forests are the cheapest to time, and more trees per unit win only while
        # their finer rate outweighs the α and the coarser pipelines that come with them
        for cap in (*sorted(c for c in tuning.TUNING.weighted_caps if c < max_trees), max_trees):
            check_deadline(deadline, "trees", f"timing the weighted allreduce forests at {cap} trees per unit")
            planner = planner_for(cap, owners=weights)
            floor = forests_floor_us(collective, [planner(*phase) for phase in phases], size_bytes)
            if floor >= uniform_floor * (1 - 1e-9):
                continue   # weights buy no rate at this cap (dgx-a100-2node without one NIC: 1 and 2 per unit)
            trial_found, trial = pipelined(cap, weights)
            if done is None or trial.predicted_time_us < done.predicted_time_us * (1 - 1e-9):
                found, done = trial_found, trial
            elif trial.predicted_time_us > done.predicted_time_us * (1 + tuning.TUNING.cap_stop):
                break
        if found is None or found.floor >= kept.predicted_time_us:
            return None
        done = polished(found, done)
        if done.predicted_time_us >= kept.predicted_time_us:
            return None
        return replace(done, notes={**done.notes, "ownership_weights": list(weights)})

    def with_alternatives(schedule: Schedule, *others: Schedule | None) -> Schedule:
        # the fastest plan first, the others as its runner-ups: the pipeline keeps the fastest simulated program
        # (at 64 MI250 ranks a composed reducescatter planned faster simulated at 0.65 of the bound)
        found = [s for s in (schedule, *others) if s is not None]
        if len(found) == 1:
            return schedule
        return first_with_runner_ups(sorted(found, key=lambda s: s.predicted_time_us))

    def capacity_runner_up() -> Schedule | None:
        # the forests on the other capacities (with or without the slow links' slack), polished as the kept ones:
        # the pipeline simulates both (mixed MI250 + A100 allgather: slack plans faster, simulates 0.952 against
        # 0.962)
        if not capacity_runner_ups:
            return None
        other = capacity_runner_ups[0]
        return polished(other, finish_schedule(topology, collective, size_bytes, options, other, "trees"))

    def merged_schedule(found: Pipelined) -> Schedule | None:
        # an allgather's kept forests searched again with each tree's messages on heavy routes merged in pairs
        # (jobs.merge_heavy_messages): where the network's α is what its links pay most for, fewer messages there
        # win (mixed MI250 + H100: 0.9747 -> 0.9814); the pipeline simulates both
        if name != "allgather" or not topology.switches or not heavy_link_ends_late(
                topology, found.timed[2], found.timed[1], tuning.TUNING.heavy_ratio):
            return None
        check_deadline(deadline, "trees", "searching its forests with merged network messages")
        by_phase = dict(zip(phases, found.plans))
        return schedule_from_plans(topology, collective, size_bytes, inst.options,
                                   lambda roots, reverse: by_phase[(roots, reverse)], "trees",
                                   merge=tuning.TUNING.heavy_keep)

    capacity_runner_ups: list[Pipelined] = []
    planned: list[tuple[float, list[Forest]]] = []   # (time, forests) of the main search and each composition
    searches: dict[tuple[tuple[Forest, ...], bool], list[tuple[tuple[Forest, ...] | None, Pipelined]]] = {}
    deadline = deadline_of(options)
    best_found, best = pipelined(max_trees)
    composed = composed_schedules(best)
    if options.max_trees is not None or n > tuning.TUNING.tree_search_ranks:
        kept = _or_paths(topology, collective, size_bytes, options, polished(best_found, best))
        planned.append((kept.predicted_time_us, best_found.plans))
        return with_alternatives(kept, *composed, weighted_schedule(kept), capacity_runner_up(), runnable_schedule())
    # Many trees per root mean many messages per link (α) and coarse pipelines under the MSCCL
    # chunk limits; a few trees at a rate within ~1/K of the optimum are often faster in the
    # α-β model (mi250-2node allgather: 83 trees 0.875 of the bound, 8 trees 0.92).
    slower = False
    least_cap = 1 if topology.switches else tuning.TUNING.switchless_least_cap
    for cap in (c for c in tuning.TUNING.tree_search_caps if c >= least_cap):
        if cap >= max(best.notes["trees_per_root"]):
            continue
        check_deadline(deadline, "trees", f"it had tried {cap} trees per root")
        # after a clearly slower cap, fewer trees can only win by cutting α and pipeline fill: only
        # if the rate they keep leaves room (dgx-a100-2node 64 MB: 13 trees 252 µs, 8 trees 257, 4 trees 224)
        if (slower and capped_floor_us(topology, collective, size_bytes, cap)
                > best.predicted_time_us * (1 - tuning.TUNING.cap_room)):
            break
        trial_found, trial = pipelined(cap)
        if trial.predicted_time_us < best.predicted_time_us * (1 - 1e-9):
            best_found, best = trial_found, trial
        elif trial.predicted_time_us > best.predicted_time_us * (1 + tuning.TUNING.cap_stop):
            slower = True
    best = polished(best_found, best)
    planned.append((best.predicted_time_us, best_found.plans))
    merged = merged_schedule(best_found)
    if name == "allreduce" and not topology.switches:
        try:
            split = split_allreduce(topology, collective, size_bytes, best.notes["tree_bandwidth_time_us"], deadline,
                                     chunk_fit(collective, size_bytes, options), runnable=runnable)
        except TimeLimitReached:
            raise
        except SynthError:   # an alternative only: the schedule above stands
            split = None
        if split is not None and split.predicted_time_us < best.predicted_time_us * (1 - 1e-9):
            best = split
    kept = or_rings(topology, collective, size_bytes, options,
                    _or_paths(topology, collective, size_bytes, options, best))
    return with_alternatives(kept, *composed, weighted_schedule(kept), capacity_runner_up(), merged,
                             runnable_schedule())


def _or_none(planner):
    """``planner``, giving None where its forests do not split along the fixed routes (a SynthError; the clock's
    stop still stops): the other orientation is only an alternative (:func:`flipped_planner`)."""
    def planner_or_none(roots: tuple[int, ...], reverse: bool) -> Forest | None:
        try:
            return planner(roots, reverse)
        except TimeLimitReached:
            raise
        except SynthError:
            return None
    return planner_or_none


def _or_warm(topology: Topology, collective: Collective, size_bytes: float, found: Pipelined,
             planners: list) -> Pipelined:
    """``found`` (today's forests, packed afresh and searched), or the forests ``planners`` warm-start from the
    healthy fabric (:func:`plan_forest`'s ``healthy``; the flipped orientation too where the method tries it),
    timed at the message shape found for ``found`` (as :func:`run_pipeline` times its ``other_planner``): each
    that is as fast as the best so far or faster replaces it (a tie goes to the warm start). All reach the same
    rate; this keeps the healthy program's trees wherever that costs no time at that shape, and the result is
    never slower than without the warm start. The forests kept report ``reused`` (0 trees for fresh ones)."""
    best, healthy_trees = found, None
    for planner in planners:
        warm = [planner(roots, reverse) for roots, reverse in forest_phases(collective)]
        if None in warm:
            continue
        healthy_trees = healthy_trees or [f.reused for f in warm]
        if [f.k for f in warm] != [f.k for f in found.plans]:
            continue
        timed = timed_forests(topology, collective, warm, found.chunks, found.messages, size_bytes, tail=found.tail,
                              timing=Timing(found.weight, coalescings=tuning.TUNING.built, merge=found.merge))
        if timed[1] <= best.timed[1] * (1 + 1e-9):
            best = replace(found, plans=warm, timed=timed)
    if best is not found:
        return best
    return replace(found, plans=[replace(f, reused=(0, r[1]) if r is not None else None)
                                 for f, r in zip(found.plans, healthy_trees or [])])


def or_rings(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
             best: Schedule) -> Schedule:
    """``best``, and for an allgather, reducescatter or allreduce on two machines of rank pairs the ring
    forest's schedule (:mod:`synth.synthesis.ringforest`) as an alternative after it: the pipeline times
    both and keeps the faster (mi250-2node 1 GiB allgather: 3089.7 µs against 3183.7), and a ring forest
    that does not fit MSCCL's limits is dropped there rather than making the method retry with fewer chunks."""
    if collective.name not in ("allgather", "reducescatter", "allreduce") or options.max_trees is not None:
        return best
    from synth.synthesis import ringforest

    chunks = chunk_fit(collective, size_bytes, options)(tuning.TUNING.ring_forest_chunks)[0]
    try:
        ring = ringforest.schedule(topology, collective, size_bytes, chunks)
    except TimeLimitReached:
        raise
    except SynthError:   # an alternative only: the forest's schedule stands
        ring = None
    if ring is None:
        return best
    return first_with_runner_ups([best, ring])


def _or_paths(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
              best: Schedule) -> Schedule:
    """``best`` justified (:func:`justified_schedule`); for scatter and gather up to ``TUNING.tree_search_ranks``
    ranks, the schedule on the optimal flow's paths (:func:`path_schedule`, justified too) where that
    is faster (not with ``--max-trees``, which asks for trees)."""
    best = justified_schedule(topology, best)
    if (collective.name not in ("scatter", "gather") or options.max_trees is not None
            or topology.num_ranks > tuning.TUNING.tree_search_ranks):   # one LP column per routed rank pair
        return best
    found = path_schedule(topology, collective, size_bytes, options)
    if found is None:
        return best
    paths = [replace(found, alternatives=()), *found.alternatives]
    return first_with_runner_ups(sorted([best, *(justified_schedule(topology, s) for s in paths)],
                                         key=lambda s: max(s.predicted_time_us, s.notes.get("score_us", 0.0))))


METHOD = MethodSpec(
    name="trees",
    run=synthesize,
    collectives=SUPPORTED,
    description="throughput-optimal pipelined spanning trees at the exact cut bound (ForestColl)",
    kind="heuristic",
)

"""The pipeline of method trees: forests planned per phase, chunks chosen, depths searched, timed,
polished and finished into a schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule, Transfer
from synth.synthesis.base import (
    MAX_CHANNELS,
    MAX_STEPS_PER_TB,
    MAX_XML_NODES,
    SynthOptions,
    check_deadline,
    deadline_of,
)
from synth.synthesis.packing import choose_capacities, integer_fabric, optimal_ratio
from synth.synthesis.timing import Coalescing, schedule_messages
from synth.synthesis.trees import tuning
from synth.synthesis.trees.depth import built_shapes, choose_chunks, refine_depth, refine_limit
from synth.synthesis.trees.forest import Forest, plan_forest
from synth.synthesis.trees.messages import (
    busiest_pair_load,
    busiest_rank_xml,
    chunk_fit,
    job_estimate,
    owner_units,
    root_piece_bytes,
    tree_messages,
)
from synth.synthesis.trees.programs import first_with_runner_ups, forest_schedule, justified_schedule
from synth.synthesis.trees.rounds_timing import timed_rounds
from synth.synthesis.trees.timed import SEARCH_SCORING, Timing, timed_forests
from synth.synthesis.trees.tuning import HALVING, ROUND_TIMED
from synth.topology.model import Topology
from synth.topology.routes import rank_routes


def forest_phases(collective: Collective) -> list[tuple[tuple[int, ...], bool]]:
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


def capped_floor_us(topology: Topology, collective: Collective, size_bytes: float, cap: int) -> float:
    """Bandwidth time of the forests at most ``cap`` trees per root can reach (the rate of
    :func:`synth.synthesis.packing.choose_capacities`; the packed forests can only be slower)."""
    per_root_bytes = root_piece_bytes(collective.name, topology.num_ranks, size_bytes)
    total = 0.0
    for roots, reverse in forest_phases(collective):
        fabric = integer_fabric(topology.reversed() if reverse else topology)
        weights = {r: 1 for r in roots}
        _, _, ratio = choose_capacities(fabric, weights, optimal_ratio(fabric, weights), cap)
        total += per_root_bytes * float(ratio) / (float(fabric.unit_GBps) * 1e3)
    return total


def forests_floor_us(collective: Collective, plans: list[Forest], size_bytes: float) -> float:
    """The bandwidth time of a collective's forests, phase after phase (:attr:`Pipelined.floor`)."""
    per_root_bytes = root_piece_bytes(collective.name, collective.num_ranks, size_bytes, owner_units(plans))
    return sum(forest.bandwidth_time_us(per_root_bytes) for forest in plans)


def is_symmetric(topology: Topology) -> bool:
    """Every link has a reverse twin of the same bandwidth and α."""
    links = {(lk.src, lk.dst): (lk.bw, lk.alpha) for lk in topology.links}
    return all(links.get((b, a)) == v for (a, b), v in links.items())


def routes_symmetric(topology: Topology) -> bool:
    """Does every rank pair's route through switches run back the same way?"""
    routes = rank_routes(topology)
    return all(routes.get((b, a)) == path[::-1] for (a, b), path in routes.items())


def flipped_planner(topology: Topology, trees_cap: int, healthy: Topology | None = None,
                    weights: tuple[int, ...] | None = None, slack: bool = True):
    """Each phase's forest planned on the other orientation (broadcast trees on the reversed fabric,
    reductions on the fabric itself). On a fabric equal to its reverse, routes included, those trees
    are as optimal and as valid, but the packing breaks its ties differently, and one forest may suit
    the message shape better (dgx-a100-2node allgather at 64 chunks per root: 0.9794, flipped 0.9807).
    ``healthy``, ``weights``, ``slack``: :func:`plan_forest`'s warm start on an edited fabric, root weights and
    slow-link slack."""
    def planner(roots: tuple[int, ...], reverse: bool) -> Forest:
        return replace(plan_forest(topology, roots, reverse=not reverse, max_trees=trees_cap, healthy=healthy,
                                   weights=weights, slack=slack), reversed=reverse)
    return planner


def piece_options(collective: Collective, options: SynthOptions) -> SynthOptions:
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
                        planner, method: str, other_planner=None,
                        rescoring: tuple[Coalescing, ...] | None = None,
                        merge: tuple[int, int] | None = None) -> Schedule:
    """Plan the forests a collective needs with ``planner(roots, reverse)`` and pipeline them
    (:func:`run_pipeline`, :func:`polish`, :func:`finish_schedule`), merging heavy routes' messages by ``merge``
    (:class:`Timing`).

    ``rescoring``: where polish's coalescings time the shape found more than ``TUNING.rescore_gain`` faster than
    the search's own timing did, that timing misjudged these forests, and the search runs again scored by the
    ``rescoring`` coalescings (:func:`run_pipeline`); both schedules go to the pipeline, which simulates them."""
    options = piece_options(collective, options)
    found = run_pipeline(topology, collective, size_bytes, options, planner, other_planner, merge=merge)
    pipelined = polish(topology, collective, size_bytes, found)
    kept = justified_schedule(topology, finish_schedule(topology, collective, size_bytes, options, pipelined, method))
    kept = with_runner_ups(topology, collective, size_bytes, options, kept, pipelined, method)
    if rescoring is None or pipelined.timed[1] >= found.timed[1] * (1 - tuning.TUNING.rescore_gain):
        return kept
    again = polish(topology, collective, size_bytes,
                   run_pipeline(topology, collective, size_bytes, options, planner, other_planner, rescoring, merge))
    other = justified_schedule(topology, finish_schedule(topology, collective, size_bytes, options, again, method))
    return first_with_runner_ups([kept, with_runner_ups(topology, collective, size_bytes, options, other, again,
                                                        method)])


def with_runner_ups(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                    kept: Schedule, polished: Pipelined, method: str = "trees") -> Schedule:
    """``kept`` with the schedules of ``polished``'s runner-up shapes (:func:`polish`) as its alternatives, which
    the pipeline simulates, keeping the fastest."""
    if not polished.runner_ups:
        return kept
    others = [finish_schedule(topology, collective, size_bytes, options, other, method, rounds_tried=True)
              for other in polished.runner_ups]
    others = [replace(other, notes={**other.notes, "polish_runner_up": True}) for other in others]
    return first_with_runner_ups([kept, *others])


@dataclass(frozen=True)
class Pipelined:
    """Forests timed at the message shape found for them: ``timed`` is (collective, makespan,
    transfers) at ``chunks`` per root, ``messages`` per tree and ``tail`` (:func:`message_shapes`), with
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
    runners: tuple[tuple[int, int | None, int], ...] = ()   # the search's next best shapes (chunks, messages, tail)
    finer: int | None = None   # chunks per root of the kept one-chunk-per-message shape cut finer (polish builds it)
    # other shapes polish timed within TUNING.runner_up_margin of this one, fastest first: the pipeline simulates
    # them as alternatives (polish sets them)
    runner_ups: tuple[Pipelined, ...] = ()
    merge: tuple[int, int] | None = None   # heavy routes' messages merged (Timing.merge) in every timing of these


def run_pipeline(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                 planner, other_planner=None, scoring: tuple[Coalescing, ...] = SEARCH_SCORING,
                 merge: tuple[int, int] | None = None) -> Pipelined:
    """Plan the forests with ``planner`` and search their pipeline depth and message shape.

    ``other_planner``: forests as good by rate, timed at the message shape found for the first ones
    and kept if faster (:func:`flipped_planner`). ``scoring``: the coalescings the search scores shapes by (the
    fastest of them, :func:`refine_depth`); the shape found is built with each of them at every share of α.
    ``merge``: every timing merges the heavy routes' messages so (:class:`Timing`)."""
    name, n = collective.name, topology.num_ranks
    # --time-limit is a safety stop: past it the search fails (check_deadline), it never stops early
    deadline = deadline_of(options)
    plans = [planner(roots, reverse) for roots, reverse in forest_phases(collective)]

    per_root_bytes = root_piece_bytes(name, n, size_bytes, owner_units(plans))
    fit = chunk_fit(collective, size_bytes, options, owner_units(plans))
    first_chunks, first_messages = choose_chunks(topology, collective, plans, per_root_bytes, options.chunks, fit)
    outcome = None
    # each priority (see HEIGHT_WEIGHTS) gets its own depth search; the fastest schedule is kept
    # the 4x priority only where the first search is cheap (deterministic: by transfer count)
    cheap = job_estimate(plans, first_chunks, first_messages) <= tuning.TUNING.alt_priority_jobs
    weights = tuning.TUNING.height_weights if cheap else (1.0,)
    floor = forests_floor_us(collective, plans, size_bytes)
    built_with = tuning.TUNING.built_as(scoring)
    for weight in weights:
        chunks, messages, tail, trials, runners = first_chunks, first_messages, 0, 0, ()
        # at scale one message per tree is final (see choose_chunks): no depth search, one timing pass
        check_deadline(deadline, "trees", "its pipeline-depth search")
        search = messages is not None and n <= tuning.TUNING.large_ranks
        # a search starts plain (it tries mirrors itself; its shape is built with every α share below);
        # a timing without a search tries everything at once
        first = (Timing(weight, mirror=False, coalescings=scoring, merge=merge) if search
                 else Timing(weight, coalescings=built_with, merge=merge))
        best = timed_forests(topology, collective, plans, chunks, messages, size_bytes, build=not search, timing=first)
        if search:
            best, shape, messages, tail, trials, runners = refine_depth(topology, collective, plans, size_bytes, best,
                                                                        chunks, messages, deadline, weight, floor,
                                                                        fit, scoring, merge)
            # the shape found is built with every share of α for coalesced messages (see TUNING.alpha_shares)
            built = [(timed_forests(topology, collective, plans, c, m, size_bytes, tail=tail,
                             timing=Timing(weight, coalescings=built_with, merge=merge)), c, m)
                     for c, m in built_shapes(plans, fit, shape, messages, tail)]
            best, chunks, messages = min(built, key=lambda b: b[0][1])
            # the same messages cut from coarser chunks: a message holds at most MAX_COALESCE chunks, so on a link that
            # is busy to the end coarser chunks mean fewer, larger messages (polish times them)
            coarser = [(c, messages, tail) for c in dict.fromkeys(fit(max(1, chunks // d))[0]
                                                                  for d in tuning.TUNING.coarser_chunks) if c < chunks]
            runners = tuple(dict.fromkeys((*runners, *coarser)))
        if outcome is None or best[1] < outcome[0][1] * (1 - 1e-9):
            outcome = (best, chunks, messages, tail, trials, weight, runners)
        if not search:   # no search, no alternatives: large schedules are timed once
            break
    best, chunks, messages, tail, trials, weight, runners = outcome
    finer = _finer_chunks(plans, fit, chunks, messages, tail, refine_limit(collective)) if search else None
    # five more list schedules: only where they are quick (dgx-a100-2node 2.4k transfers, mi250-2node 70k)
    check_deadline(deadline, "trees", "timing the flipped forests")
    if other_planner is not None and job_estimate(plans, chunks, messages, tail) <= tuning.TUNING.forward_jobs:
        others = [other_planner(roots, reverse) for roots, reverse in forest_phases(collective)]
        # (None: the other orientation does not split along the routes, trees.method._or_none)
        if None not in others and [(f.k, f.weights) for f in others] == [(f.k, f.weights) for f in plans]:
            timed = timed_forests(topology, collective, others, chunks, messages, size_bytes, tail=tail,
                           timing=Timing(weight, coalescings=built_with, merge=merge))
            if timed[1] < best[1] * (1 - 1e-9):
                best, plans = timed, others
    return Pipelined(plans, best, chunks, messages, tail, trials, weight, floor, deadline, runners, finer, merge=merge)


def _finer_chunks(plans: list[Forest], fit, chunks: int, messages: int | None, tail: int,
                  limit: int) -> int | None:
    """Twice the chunks per root of a one-chunk-per-message shape (the nearest count ``fit`` allows), where the
    depth search could not time it (more than ``limit`` transfers, :func:`refine_limit`) and it has at most
    ``TUNING.finer_jobs`` transfers within MSCCL's steps per connection; else None. Searches on switch fabrics
    score shapes by the mean of the plan and the runtime's replayed order, which can rank such a shape well below
    what it simulates at (mi250x4-ib16 allgather: 32 chunks per root, 3399.8 µs planned and simulated, against
    3649.0 for the 16 the search kept)."""
    if messages is not None or tail != 0:
        return None
    finer = fit(chunks * 2)[0]
    if finer <= chunks or not (limit < job_estimate(plans, finer, None)
                               <= tuning.TUNING.finer_jobs):
        return None
    steps = busiest_pair_load(plans, tree_messages(plans, finer, None))
    return finer if steps <= MAX_CHANNELS * MAX_STEPS_PER_TB else None


def polish(topology: Topology, collective: Collective, size_bytes: float, pipelined: Pipelined) -> Pipelined:
    """The kept shape timed once more with the coalescings only it gets (:attr:`TreesTuning.polish`: drained and
    batched messages), and so are the search's next best shapes (``runners``) where their schedules are small
    (``TUNING.forward_jobs``): the search scores shapes without drains, which can rank them differently. The
    fastest timing is kept. Not at scale (one timing pass there).

    The plan can misrank shapes that are close (mi250x4-ib25 composed allgather: 64 chunks per root, 3 messages,
    tail 2 plans 3267.5 µs and simulates 3677.6; 32 chunks, 3 messages, tail 2 plans 3266.3 and simulates as
    planned), so runners too large for the polish's coalescings are timed with ``TUNING.runner_coalescings`` up to
    ``TUNING.finer_jobs`` transfers, and the timed shapes within
    ``TUNING.runner_up_margin`` of the fastest, at most ``TUNING.runner_ups`` of them, come back as its
    :attr:`Pipelined.runner_ups` for the pipeline to simulate."""
    if topology.num_ranks > tuning.TUNING.large_ranks:
        return pipelined
    check_deadline(pipelined.deadline, "trees", "polishing its schedule")
    timed_shapes = [pipelined]
    shapes = [(pipelined.chunks, pipelined.messages, pipelined.tail)]
    for shape in pipelined.runners:
        jobs = job_estimate(pipelined.plans, *shape)
        if jobs <= tuning.TUNING.forward_jobs:
            shapes.append(shape)
        elif jobs <= tuning.TUNING.finer_jobs and tuning.TUNING.runner_ups:
            # one batched coalescing, the one that wins on such shapes, instead of the polish's fifteen
            timed = timed_forests(topology, collective, pipelined.plans, *shape[:2], size_bytes, tail=shape[2],
                                  timing=Timing(pipelined.weight, coalescings=tuning.TUNING.runner_coalescings,
                                                merge=pipelined.merge))
            timed_shapes.append(_reshaped(pipelined, timed, shape))
    for shape in shapes:
        timed = timed_forests(topology, collective, pipelined.plans, *shape[:2], size_bytes, tail=shape[2],
                              timing=Timing(pipelined.weight, coalescings=tuning.TUNING.polish, merge=pipelined.merge))
        timed_shapes.append(_reshaped(pipelined, timed, shape))
    if pipelined.finer is not None:   # one chunk per job: the messages are what batched coalescing makes of them
        batched = tuple(how for how in tuning.TUNING.polish if how.batch)
        timed = timed_forests(topology, collective, pipelined.plans, pipelined.finer, None, size_bytes,
                              timing=Timing(pipelined.weight, coalescings=batched, merge=pipelined.merge))
        if _xml_nodes(timed[2], topology.num_ranks) <= MAX_XML_NODES:
            timed_shapes.append(_reshaped(pipelined, timed, (pipelined.finer, None, 0)))
    # fastest first; a tie keeps the earlier (the kept shape before its runners)
    ordered = sorted(range(len(timed_shapes)), key=lambda i: (timed_shapes[i].timed[1], i))
    best = timed_shapes[ordered[0]]
    if best is not pipelined and best.timed[1] >= pipelined.timed[1] * (1 - 1e-9):
        best = pipelined
    others: list[Pipelined] = []
    seen = {(best.chunks, best.messages, best.tail)}
    within = best.timed[1] * (1 + tuning.TUNING.runner_up_margin)
    for i in ordered:
        found = timed_shapes[i]
        shape = (found.chunks, found.messages, found.tail)
        if len(others) < tuning.TUNING.runner_ups and found.timed[1] <= within and shape not in seen:
            others.append(found)
            seen.add(shape)
    return replace(best, runner_ups=tuple(others))


def _reshaped(pipelined: Pipelined, timed: tuple[Collective, float, list[Transfer]],
              shape: tuple[int, int | None, int]) -> Pipelined:
    """``pipelined`` timed at another message shape (chunks, messages, tail)."""
    chunks, messages, tail = shape
    return replace(pipelined, timed=timed, chunks=chunks, messages=messages, tail=tail)


def _xml_nodes(transfers: list[Transfer], n: int) -> float:
    """XML nodes of the busiest rank of a timed schedule (:func:`busiest_rank_xml`), a step per message: the
    messages of :func:`synth.synthesis.timing.schedule_messages` (mi250x4-ib16 reducescatter at 32 chunks per root,
    one per message: 5440 estimated, 4174 lowered, over MSCCL's 4096)."""
    per_pair: dict[tuple[int, int], int] = {}
    for members in schedule_messages(transfers):
        first = transfers[members[0]]
        per_pair[(first.src, first.dst)] = per_pair.get((first.src, first.dst), 0) + 1
    return busiest_rank_xml(per_pair, n)


def finish_schedule(topology: Topology, collective: Collective, size_bytes: float, options: SynthOptions,
                    pipelined: Pipelined, method: str, rounds_tried: bool = False) -> Schedule:
    """The Schedule of a pipeline, or of its forests timed by rounds where that is faster (unless
    ``rounds_tried``)."""
    name, n = collective.name, topology.num_ranks
    plans, floor, trials = pipelined.plans, pipelined.floor, pipelined.trials
    coll, offset, transfers = pipelined.timed
    tune = tuning.TUNING
    if (not rounds_tried and offset > floor * (1 + tune.tail_gain) and n <= tune.large_ranks and name in ROUND_TIMED
            and not topology.switches
            and tune.rounds * float(topology.arrays[3].max()) * 2 <= tune.round_alpha_share * floor):
        # α, fill and drain cost more than 1 %: try timing the same forests by rounds (synth.synthesis.rounds).
        # Not behind switches, where every message pays α on each hop and holds its whole route: there
        # rounds lose (dgx-a100-2node allgather 0.947 against 0.978, dgx-a100-4node 0.928 against 0.976)
        fit = chunk_fit(collective, size_bytes, options, owner_units(plans))
        options_chunks = list(dict.fromkeys(fit(c)[0] for c in tuning.TUNING.round_chunks))
        timed = timed_rounds(topology, collective, plans, options_chunks, size_bytes, pipelined.deadline, offset)
        if timed is not None and timed[1] < offset * (1 - 1e-9):
            coll, offset, transfers, chunks = timed
            return forest_schedule(topology, coll, transfers, offset, plans, size_bytes, method,
                                    chunks_per_root=chunks, round_timed=tuning.TUNING.rounds, depth_trials=trials)
    tail, messages = pipelined.tail, pipelined.messages
    return forest_schedule(topology, coll, transfers, offset, plans, size_bytes, method,
                            chunks_per_root=pipelined.chunks,
                            messages_per_tree=None if tail == HALVING else messages, tail_splits=max(tail, 0),
                            halving_messages=tail == HALVING, depth_trials=trials)

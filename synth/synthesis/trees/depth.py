"""Depth search of method trees: the cost model that picks chunks per root and messages per tree,
and the search over pipeline depths and message shapes around it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from synth.collectives import Collective
from synth.errors import SynthError
from synth.synthesis.base import MAX_CHANNELS, MAX_STEPS_PER_TB, MAX_XML_NODES, check_deadline
from synth.synthesis.timing import Coalescing, route_cost
from synth.synthesis.trees import tuning
from synth.synthesis.trees.forest import Forest
from synth.synthesis.trees.jobs import real_edge
from synth.synthesis.trees.messages import (
    any_chunks,
    busiest_pair_load,
    busiest_rank_xml,
    job_estimate,
    pair_loads,
    refit_messages,
    requested_messages,
    shape_chunk_count,
    split_chunks,
    tree_messages,
)
from synth.synthesis.trees.timed import SEARCH_SCORING, Timing, forward_fits, timed_forests
from synth.synthesis.trees.tuning import HALVING, ONE_ROOT
from synth.topology.model import Topology


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
            src, dst, route = real_edge(forest, parent, child, route)
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
    """Cost model of :mod:`synth.synthesis.trees` (its docstring); returns (µs, most steps on one rank pair).

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


def refine_limit(collective: Collective) -> int:
    """Transfers a shape may have for the depth search to time it: ``TUNING.wide_refine_jobs`` for an allgather or
    reducescatter past ``TUNING.tree_search_ranks`` ranks (where no trees-per-root search runs, so at 128 MI250
    ranks the one at ``TUNING.refine_jobs`` could time no shape but the first), else ``TUNING.refine_jobs``."""
    tune = tuning.TUNING
    wide = collective.name in ("allgather", "reducescatter") and collective.num_ranks > tune.tree_search_ranks
    return tune.wide_refine_jobs if wide else tune.refine_jobs


def refine_depth(topology: Topology, collective: Collective, plans: list[Forest], size_bytes: float, best,
                 chunks: int, messages: int, deadline: float | None, height_weight: float = 1.0,
                 floor: float = 0.0, fit=any_chunks, scoring: tuple[Coalescing, ...] = SEARCH_SCORING,
                 merge: tuple[int, int] | None = None):
    """Search the pipeline depth, timing each candidate with the list schedule (the closed form is
    rough about fill and drain), while schedules are cheap and the time limit allows.

    Three message shapes are tried, each hill-climbed on :attr:`TreesTuning.pipeline_grid` (broadcast and
    reduce, whose one piece is the whole buffer, also on :attr:`TreesTuning.deep_grid`, up to
    ``TUNING.one_root_chunks`` chunks and within a rank's XML nodes, :func:`xml_nodes`): ``P`` messages per
    distinct tree (``C = k·P`` chunks per root; a tree of multiplicity ``m`` sends messages of
    ``m`` chunks); one chunk per message (``C = k·P``; a tree of multiplicity ``m`` sends
    ``m·P`` equal messages, so every link pays α in proportion to its bytes, not to the number of
    trees crossing it); and ``P`` messages per tree whose last one is halved ``L`` times
    (``C = k·P·2^L``, :func:`message_shapes`), with ``L`` from :attr:`TreesTuning.tail_splits` (``P`` is climbed at
    the first, the others are timed at the ``P`` found) when the best of the first two is more than
    ``TUNING.tail_gain`` above ``floor`` (the forest's bandwidth time). There the halving shape
    (``tail == HALVING``, ``C = k·P`` with ``P`` from :attr:`TreesTuning.halving_chunks`; allreduce: the first)
    is timed too.
    Each shape is timed at the nearest ``C`` that ``fit`` allows (:func:`runtime_chunks`) and scored by the fastest
    of the ``scoring`` coalescings, with ``merge`` (:class:`Timing`).
    Returns (best timed, the shape's own chunks, messages or None, tail, candidates timed, the next best shapes
    timed as (chunks, messages, tail), at most ``TUNING.polish_runners``).
    """
    k = max(f.k for f in plans)
    one_root = collective.name in ONE_ROOT
    limit = refine_limit(collective)
    grid = tuning.TUNING.pipeline_grid + tuning.TUNING.deep_grid if one_root else tuning.TUNING.pipeline_grid

    def fitted(per_tree: bool, p: int, tail: int) -> tuple[int, int | None]:
        raw = shape_chunk_count(k, p, tail)
        chunks = fit(raw)[0]
        return chunks, refit_messages(p if per_tree else None, chunks, raw, tail)

    # candidates: (one message per tree part?, P, tail)
    timed: dict[tuple[bool, int, int], float] = {(True, messages, 0): best[1]}
    # several candidates can fit to one (chunks, messages) shape (always, with --chunks): each is timed once
    by_shape: dict[tuple, float] = {}
    choice = (True, messages, 0)

    def feasible(per_tree: bool, p: int, tail: int) -> bool:
        tune = tuning.TUNING
        # tailed or halving shapes may use more chunks
        cap = tune.one_root_chunks if one_root else tune.max_tail_chunks if tail != 0 else tune.max_chunks
        if shape_chunk_count(k, p, tail) > cap:
            return False
        shape = (*fitted(per_tree, p, tail), tail)
        if job_estimate(plans, *shape) > limit:
            return False
        loads = pair_loads(plans, tree_messages(plans, *shape))
        # deep pipelines of one root can outgrow a relaying rank's XML nodes before any connection's steps
        return (max(loads.values(), default=0) <= MAX_CHANNELS * MAX_STEPS_PER_TB
                and (not one_root or busiest_rank_xml(loads, topology.num_ranks) <= MAX_XML_NODES))

    def neighbours(p: int) -> list[int]:
        # two grid points each way: the makespan is not unimodal in P (ndv2-2node: 12 < 16 > 24 > 32)
        below = [g for g in grid if g < p]
        above = [g for g in grid if g > p]
        return below[-2:] + above[:2]

    def trial(per_tree: bool, p: int, tail: int, mirror: bool = False) -> bool:
        """Time one candidate (TimeLimitReached past ``deadline``); True."""
        nonlocal best, choice
        shape = (*fitted(per_tree, p, tail), tail, mirror)
        if shape in by_shape:   # the same schedule: it cannot beat the best it was compared with
            timed[(per_tree, p, tail)] = by_shape[shape]
            return True
        check_deadline(deadline, "trees", "its pipeline-depth search")
        timed_now = timed_forests(topology, collective, plans, *shape[:2], size_bytes, build=False,
                           tail=tail, timing=Timing(height_weight, mirror, scoring, merge))
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
        # the next best shapes timed, as built (chunks, messages, tail): polish() times them too
        kept = (*fitted(*choice), tail)
        runners: list[tuple[int, int | None, int]] = []
        for key in sorted(timed, key=lambda key: (timed[key], key)):
            shape = (*fitted(*key), key[2])
            if shape != kept and shape not in runners:
                runners.append(shape)
        return (best, shape_chunk_count(k, p, tail), p if per_tree else None, tail, len(by_shape),
                tuple(runners[:tuning.TUNING.polish_runners]))

    def mirrored():
        # allgather: its mirrored reduction timed forward (see timed_forests) at the shape found and the
        # two grid points below (a reduction pipelines best with fewer messages: dgx-h100-2node P 2 -> 1)
        if collective.name == "allgather":
            per_tree, p, tail = choice
            for q in [p] + [g for g in grid if g < p][-2:]:
                if not forward_fits(plans, *fitted(per_tree, q, tail), tail):
                    continue   # the trial would only repeat the plain timing
                if feasible(per_tree, q, tail) and not trial(per_tree, q, tail, mirror=True):
                    break
        return done()

    for per_tree, first in ((True, messages), (False, 4)):
        if not climb(per_tree, first, 0):
            return done()
    if best[1] <= floor * (1 + tuning.TUNING.tail_gain):
        return done()
    # tails start from the best plain per-tree depth
    start = min((key for key in timed if key[0] and key[2] == 0), key=timed.__getitem__)[1]
    if not climb(True, start, tuning.TUNING.tail_splits[0]):
        return done()
    at = min((key for key in timed if key[2] == tuning.TUNING.tail_splits[0]), key=timed.__getitem__, default=None)
    for tail in tuning.TUNING.tail_splits[1:]:
        if at is not None and feasible(True, at[1], tail) and not trial(True, at[1], tail):
            return done()
    # allreduce: its trials time two phases three ways, so only the first size (ndv2-2node 0.986 -> 0.992)
    for p in tuning.TUNING.halving_chunks if collective.name != "allreduce" else tuning.TUNING.halving_chunks[:1]:
        if feasible(True, p, HALVING) and not trial(True, p, HALVING):
            return done()
    return mirrored()


def built_shapes(plans: list[Forest], fit, shape: int, messages: int | None,
                 tail: int) -> list[tuple[int, int | None]]:
    """(chunks, messages per tree) at which the shape the depth search found (``shape`` chunks per root)
    is built: the runtime-usable count nearest its own and, where its own is not usable, the second
    nearest (``fit``, :func:`runtime_chunks`), each with the shape's messages per tree and with as many
    as keep its message size (:func:`refit_messages`); those within MSCCL's steps per connection."""
    near = fit(shape)
    shapes = list(dict.fromkeys((c, m) for c in near[:1 if near[0] == shape else 2]
                                for m in (messages, refit_messages(messages, c, shape, tail))))
    limit = MAX_CHANNELS * MAX_STEPS_PER_TB
    # the search timed one of them within the limit; the estimate rounds up, so keep the first regardless
    return [(c, m) for c, m in shapes
            if busiest_pair_load(plans, tree_messages(plans, c, m, tail)) <= limit] or shapes[:1]


def choose_chunks(topology: Topology, collective: Collective, plans: list[Forest], per_root_bytes: float,
                  requested: int | None, fit=any_chunks) -> tuple[int, int | None]:
    """(chunks per root piece, messages per distinct tree or None for one chunk per message).

    Default: ``C = k · P``, so a tree of multiplicity ``m`` carries ``m·P`` chunks in ``P``
    messages of ``m`` contiguous chunks (one α each), and ``C`` is then the nearest count ``fit`` allows
    (:func:`runtime_chunks`); ``P`` minimises :func:`predicted_time` within MSCCL's limits, costed at that ``C``
    with each tree's chunks as :func:`balanced_split` gives them (where ``C ≠ k·P`` the trees carry unequal shares).
    ``--chunks C`` (``requested``) keeps that message size at ``C`` chunks per root, with fewer
    messages where MSCCL's steps per connection need it (an error where even its largest steps do not fit).
    Scatter/gather always send one chunk per message (each goes to its own rank), as does ``--chunks``
    on forests of unequal ``k`` and beyond ``TUNING.large_ranks`` ranks.
    """
    name = collective.name
    n = topology.num_ranks
    k = max(f.k for f in plans)
    if requested is None and n > tuning.TUNING.large_ranks:
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

    def shape_cost(chunks: int, messages: int | None) -> tuple[float, int]:
        # each tree's chunks as balanced_split deals them, in at most ``messages`` messages (None: one chunk each)
        chunk_bytes = per_root_bytes / (chunks * spread)
        phases = []
        for forest, usage in zip(plans, usages):
            carried = counts(forest, chunks).tolist()
            if messages is None:
                sent, msg_bytes = carried, [chunk_bytes] * len(carried)
            else:
                sent = [min(c, messages) for c in carried]
                msg_bytes = [chunk_bytes * c / m if m else 0.0 for c, m in zip(carried, sent)]
            phases.append((forest, usage, sent, msg_bytes, len(roots)))
        return predicted_time(phases, len(topology.links))

    def per_chunk(c: int) -> tuple[float, int]:
        return shape_cost(c, None)

    def per_message(p: int) -> tuple[float, int]:
        # costed at the count the runtime runs, fit(k·p), split over the trees as they will carry it: with k = 3
        # trees per root and power-of-two counts, 3 chunks become 2 and one tree carries none (mi250x8-ib25
        # allgather, where no depth search can correct it: 0.864 of the bound at 2 chunks per root, 0.919 at 8)
        return shape_cost(fit(k * p)[0], p)

    uneven = spread > 1 or any(f.k != k for f in plans)
    if requested is not None and (uneven or n > tuning.TUNING.large_ranks):
        _, steps = per_chunk(requested)
        if steps > limit:
            raise SynthError(f"--chunks {requested} needs {steps} steps on one connection, more than "
                             f"MSCCL's {MAX_CHANNELS} channels x {MAX_STEPS_PER_TB} steps; use fewer --chunks")
        return requested, None
    if uneven:
        chunks = _best(per_chunk, limit, tuning.TUNING.max_chunks)
        return next((c for c in fit(chunks) if per_chunk(c)[1] <= limit), chunks), None
    p = _best(per_message, limit, max(1, tuning.TUNING.max_chunks // k))
    if requested is not None:
        return requested, requested_messages(plans, requested, refit_messages(p, requested, k * p, 0), limit)
    return fit(k * p)[0], p


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

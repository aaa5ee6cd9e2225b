"""``rsag``: an allreduce made of the best reduce-scatter and the best allgather that ``trees`` finds, one after
the other (Patarasuk & Yuan, JPDC 69(2), 2009, §3: an allreduce is a reduce-scatter followed by an allgather).

Where the allreduce's lower bound is the sum of its two phases' bounds (:func:`bounds_add_up`: every bound of
:func:`synth.lower_bounds.compute_bounds` that could be lower, the traffic bounds among them, is not), no program
beats its phases by overlapping them in the bound's terms, so an allreduce of the best program of each phase
reaches their ratio to the bound. ``trees``' own allreduce searches one pipeline shape for both forests;
its allgather search is wider (composed box forests searched again, merged network messages), which is what the
phases gain. 1 GiB, ratio to the allreduce bound, against auto before (trees; spantree on the torus):
mi250x8-ib12.5 0.853 -> 0.906, mi250x8-ib16 0.822 -> 0.875, mi250x8-ib50 0.802 -> 0.863, torus-4x4x8 0.967 ->
0.987, mi250x4-ib12.5 0.937 -> 0.967 (with -m rsag; auto tries it above 64 ranks only, docs/results.md). At 128
ranks the fastest composed plans can outgrow MSCCL's 4096 XML nodes per rank (twice the allgather's steps): the
first schedule handed on is the fastest that fits by trees' estimate (:func:`_xml_nodes`), so mi250x8-ib12.5 keeps
0.906 where its allgather reaches 0.952.

**The reduce-scatter is the allgather's time mirror.** On a fabric whose every link has a reverse twin of the
same bandwidth and α, and whose rank routes run back the same way (:func:`applies`), each transfer of chunk
``c`` from ``u`` to ``v`` over ``[s, e]`` becomes one of ``c`` from ``v`` to ``u`` over ``[T − e, T − s]``, a
reduction (:func:`synth.synthesis.mirror.mirrored`). Every link then holds the mirrored transfers for as long as
it held the originals, and the data order holds: where ``v`` forwarded ``c`` to ``w`` after receiving it
(``s_w ≥ e``), the partial sum ``w → v`` ends at ``T − s_w ≤ T − e``, before ``v`` sends its own on. A
contribution chunk ``r·k + j`` of the allgather is the chunk ``j`` of the piece rank ``r`` owns in the
reduce-scatter, so the ids carry over, and the allgather's chunk count serves both phases. trees itself builds
its reductions this way (mirrored broadcasts).

**The allreduce** is the mirrored schedule, then the allgather's shifted by its makespan, on channels and message
groups of their own (:func:`concatenated`); each owner's sends of a chunk wait for its sum there, as the lowering
reads the data flow. The pipeline lowers, verifies and simulates it like any schedule, each of the allgather's
runner-ups composed the same way.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule
from synth.synthesis.base import MAX_XML_NODES, Instance, MethodSpec
from synth.synthesis.mirror import mirrored, reversible, trees_programs
from synth.synthesis.timing import message_steps
from synth.topology.model import Topology

if TYPE_CHECKING:
    from synth.lower_bounds import Bounds

SUPPORTED = frozenset({"allreduce"})
MAX_RANKS = 128      # trees' allgather search at this scale takes up to about 100 s of CPU (mi250x8-ib16)
SUM_TOLERANCE = 1e-9
RUNNER_UPS = 2       # composed allreduces the pipeline lowers and simulates beside the first (5 s each, 128 ranks)


@functools.lru_cache(maxsize=16)
def bounds_add_up(topology: Topology, size_bytes: float) -> bool:
    """Is the allreduce's time bound the reduce-scatter's plus the allgather's (within ``SUM_TOLERANCE``)?
    Only then does running the phases one after the other lose nothing against the bound."""
    from synth.lower_bounds import compute_bounds

    whole = compute_bounds(topology, "allreduce", size_bytes).time_bound_us
    phases = sum(_without_cut_alpha(compute_bounds(topology, name, size_bytes))
                 for name in ("reducescatter", "allgather"))
    return whole >= phases * (1 - SUM_TOLERANCE)


def _without_cut_alpha(bounds: Bounds) -> float:
    """A phase's time bound without the α its cut's links pay (``cut_bound_us``): the allreduce bound's traffic
    terms count bytes only, so the phases' α would keep them from ever adding up."""
    return max(bounds.details.get("cut_bound_us", bounds.bandwidth_bound_us), bounds.latency_bound_us)


def applies(inst: Instance) -> bool:
    """An allreduce of 2 to ``MAX_RANKS`` ranks on a fabric equal to its reverse, routes included
    (:func:`synth.synthesis.mirror.reversible`), whose bound is the sum of its phases' (:func:`bounds_add_up`)."""
    return inst.collective.name == "allreduce" and refusal(inst) is None


def refusal(inst: Instance) -> str | None:
    """Which condition of :func:`applies` (other than the collective) the instance misses, in words; None where
    it misses none."""
    if not 2 <= inst.ranks <= MAX_RANKS:
        return f"it has {inst.ranks} ranks, rsag 2 to {MAX_RANKS}"
    if not reversible(inst.topology):
        return "the fabric is not equal to its reverse (links and routes), so the allgather has no time mirror"
    if not bounds_add_up(inst.topology, float(inst.size_bytes)):
        return ("its allreduce bound is below the sum of its reduce-scatter's and allgather's, so the phases one "
                "after the other cannot reach it")
    return None


def concatenated(reduce_scatter: Schedule, allgather: Schedule, collective: Collective) -> Schedule:
    """The allreduce ``collective`` (chunk factor N·k for k chunks per piece) of ``reduce_scatter`` then
    ``allgather``, both with k chunks per rank piece: the allgather shifted by the reduce-scatter's makespan, its
    channels and message groups after the reduce-scatter's."""
    chunks = reduce_scatter.collective.chunk_factor
    if allgather.collective.chunk_factor != chunks or collective.chunk_factor != collective.num_ranks * chunks:
        raise SynthError(f"rsag: the phases have {reduce_scatter.collective.chunk_factor} and "
                         f"{allgather.collective.chunk_factor} chunks per piece, the allreduce "
                         f"{collective.chunk_factor} in all")
    first = tuple(reduce_scatter.transfers)
    shift = reduce_scatter.makespan
    channels = 1 + max((t.channel for t in first), default=-1)
    groups = 1 + max((t.group for t in first), default=-1)
    second = tuple(t._replace(start=t.start + shift, end=t.end + shift, channel=t.channel + channels,
                              group=t.group + groups if t.group >= 0 else t.group) for t in allgather.transfers)
    return Schedule(collective, allgather.topology, first + second, "rsag", allgather.size_bytes,
                    shift + allgather.makespan)


def synthesize(inst: Instance) -> Schedule:
    """The allreduce of the module docstring: trees' allgather (and each runner-up it hands the pipeline), its
    mirror before it. SynthError where :func:`applies` does not hold."""
    from synth.synthesis.trees.programs import first_with_runner_ups

    if inst.collective.name not in SUPPORTED:
        raise SynthError(f"method rsag does not support {inst.collective.name}; it supports allreduce")
    reason = refusal(inst)
    if reason is not None:
        raise SynthError(f"rsag does not apply to {inst.topology.name!r}: {reason}")
    n = inst.ranks
    options = inst.options
    if options.chunks is not None:   # an allreduce's --chunks cut the whole buffer; the allgather's, each piece
        if options.chunks % n:
            raise SynthError(f"rsag cuts each of the {n} ranks' pieces alike: --chunks {options.chunks} is not a "
                             f"multiple of {n}")
        options = replace(options, chunks=options.chunks // n)
    composed = []
    for allgather in trees_programs(inst, "allgather", options):
        collective = Collective("allreduce", n, n * allgather.collective.chunk_factor, inst.collective.root,
                                inst.collective.inplace)
        done = concatenated(mirrored(allgather), allgather, collective)
        composed.append(replace(done, notes={"allgather": dict(allgather.notes), "phases_us":
                                             [allgather.makespan, allgather.makespan]}))
    # the fastest plan that fits MSCCL's XML size first: the pipeline halves the chunks (and runs trees again) only
    # where the first schedule does not lower, and skips runner-ups that do not (mi250x8-ib12.5: the two fastest
    # composed plans need 4190-4560 XML nodes on a rank, the next 20 channels and fit)
    ranked = sorted(composed, key=lambda s: (_xml_nodes(s) > MAX_XML_NODES, s.predicted_time_us))
    return first_with_runner_ups(ranked[:1 + RUNNER_UPS])


def _xml_nodes(schedule: Schedule) -> float:
    """The busiest rank's XML nodes, estimated as trees does (:func:`~synth.synthesis.trees.messages.
    busiest_rank_xml`): a step per message (transfers of one pair, direction and interval) of up to
    ``MAX_STEP_CHUNKS`` chunks."""
    from synth.synthesis.trees.messages import busiest_rank_xml

    chunks = Counter((t.src, t.dst, t.reduce, t.start, t.end) for t in schedule.transfers)
    steps = message_steps((src, dst, reduce, count) for (src, dst, reduce, *_), count in chunks.items())
    return busiest_rank_xml(steps, schedule.collective.num_ranks)


METHOD = MethodSpec(
    name="rsag",
    run=synthesize,
    collectives=SUPPORTED,
    description="allreduce as trees' best reducescatter (the allgather's time mirror) then its allgather",
    supersedes=frozenset({"trees", "spantree", "greedy"}),   # the allreduce's own tree methods (auto._rsag)
)

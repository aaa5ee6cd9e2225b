"""``mirror``: a reducescatter as trees' best allgather run backwards in time and direction, and an allgather as
trees' best reducescatter run so, on a fabric equal to its reverse (links and routes); likewise a reduce as trees'
best broadcast from the same root, and a broadcast as its best reduce.

On such a fabric the two collectives are each other's time mirror (:func:`synth.schedule.time_mirrored`): each
transfer of chunk ``c`` from ``u`` to ``v`` over ``[s, e]`` becomes one of ``c`` from ``v`` to ``u`` over
``[T − e, T − s]``, a copy turned into a partial sum or back. Every link holds the mirrored transfers as long as
it held the originals (its reverse twin has the same bandwidth and α, and the routes run back the same way), and
the data order holds: where ``v`` forwarded ``c`` to ``w`` after receiving it (``s_w ≥ e``), the partial sum
``w → v`` ends at ``T − s_w ≤ T − e``, before ``v`` sends its own on; where ``v`` summed its children's partial sums
before sending (``s ≥ e_w``), the mirrored copy reaches ``v`` before ``v`` passes it on. The allgather's
contribution chunk ``r·k + j`` is chunk ``j`` of the piece rank ``r`` owns in the reducescatter, so the ids, the
chunk count and the makespan carry over, and so does the lowered program's size (one step per message either way).

A broadcast and a reduce to the same root mirror each other the same way: the root's contribution ``k`` (chunk
``root·C + k``) becomes the slot ``k`` every rank contributes to, the copies partial sums that end at the root.

The two lower bounds are equal there (a cut's reverse has the same capacity), so the mirror reaches the other
collective's ratio. ``trees`` searches the two with different timings (an allgather's forests are also searched
with merged network messages, a reducescatter's reductions are also timed forward), and on some fabrics one
finds the faster program: mixed-mi250-h100, 1 GiB, allgather 0.9814 of the bound against the reducescatter's
0.9718, mixed-mi250-a100 0.9693 against 0.9623, h100x4 the reducescatter's 0.9546 against the allgather's 0.9540
(docs/results.md, "Each collective as the other's mirror"); two data centres 500 µs apart (fuzz65), 1 GiB reduce
to rank 0: trees' broadcast mirrored 29866 µs against its own reduce's 31708. ``auto`` tries this method after
``trees`` up to :data:`synth.synthesis.auto.MIRROR_MAX_RANKS` ranks (broadcast and reduce: ``MIRROR_ROOTED_MAX_RANKS``),
where the two searches together stay well within two minutes of CPU; the pipeline lowers, verifies and simulates
each mirrored schedule like any other and keeps the faster.
"""

from __future__ import annotations

from dataclasses import replace

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule, time_mirrored
from synth.synthesis.base import Instance, MethodSpec, SynthOptions
from synth.topology.model import Topology

OTHER = {"allgather": "reducescatter", "reducescatter": "allgather", "broadcast": "reduce", "reduce": "broadcast"}
REDUCING = frozenset({"reducescatter", "reduce"})
SUPPORTED = frozenset(OTHER)
MAX_RANKS = 128      # trees' own search at this scale takes up to about 100 s of CPU (mi250x8-ib16)


def reversible(topology: Topology) -> bool:
    """Is ``topology`` equal to its reverse: every link with a reverse twin of the same bandwidth and α, and
    every rank route running back the same way? Only there is a schedule's time mirror as fast."""
    from synth.synthesis.trees.pipeline import is_symmetric, routes_symmetric

    return is_symmetric(topology) and routes_symmetric(topology)


def applies(inst: Instance) -> bool:
    """An allgather, reducescatter, broadcast or reduce of 2 to ``MAX_RANKS`` ranks on a :func:`reversible`
    fabric."""
    return inst.collective.name in SUPPORTED and 2 <= inst.ranks <= MAX_RANKS and reversible(inst.topology)


def mirrored(schedule: Schedule, collective: Collective | None = None) -> Schedule:
    """The time mirror of a ``schedule`` of a collective of :data:`OTHER` (module docstring): the other collective,
    with the same chunks, makespan and notes, planned on a fabric equal to its reverse. ``collective``: the one
    the mirror implements (root and in-place flag; default: the other collective with the schedule's chunks and
    root)."""
    coll = schedule.collective
    name = OTHER[coll.name]
    if collective is None:
        collective = Collective(name, coll.num_ranks, coll.chunk_factor, root=coll.root)
    elif collective.name != name or collective.chunk_factor != coll.chunk_factor:
        raise SynthError(f"the mirror of a {coll.name} of {coll.chunk_factor} chunks per piece is a {name} of as "
                         f"many, not a {collective.name} of {collective.chunk_factor}")
    transfers = time_mirrored(schedule.transfers, schedule.makespan, reduce=name in REDUCING)
    # a broadcast's chunks are the root's contributions (root·C + k), a reduce's the slots k they sum into
    shift = (-coll.root * coll.input_chunks if coll.name == "broadcast"
             else collective.root * collective.input_chunks if coll.name == "reduce" else 0)
    if shift:
        transfers = [t._replace(chunk=t.chunk + shift) for t in transfers]
    return Schedule(collective, schedule.topology, tuple(sorted(transfers)), schedule.method, schedule.size_bytes,
                    schedule.makespan, notes=dict(schedule.notes))


def trees_programs(inst: Instance, name: str, options: SynthOptions | None = None) -> list[Schedule]:
    """trees' schedule for the collective ``name`` (out of place) on ``inst``'s fabric and SIZE, then each runner-up
    it hands the pipeline, each without alternatives; ``options``: the request's unless given."""
    from synth.synthesis.trees import METHOD as TREES

    other = Instance(inst.topology, Collective(name, inst.ranks, 1, inst.collective.root, False), inst.size_bytes,
                     inst.options if options is None else options, inst.fabric)
    found = TREES.run(other)
    return [replace(schedule, alternatives=()) for schedule in (found, *found.alternatives)]


def synthesize(inst: Instance) -> Schedule:
    """The request's collective as the mirror of trees' program for the other one (and of each runner-up trees
    hands the pipeline); SynthError where :func:`applies` does not hold."""
    from synth.synthesis.trees.programs import first_with_runner_ups

    name = inst.collective.name
    if name not in SUPPORTED:
        raise SynthError(f"method mirror does not support {name}; it supports {', '.join(sorted(SUPPORTED))}")
    if not applies(inst):
        raise SynthError(f"mirror does not apply to {inst.topology.name!r}: it needs 2 to {MAX_RANKS} ranks and a "
                         "fabric equal to its reverse (links and routes)")
    done = []
    for schedule in trees_programs(inst, OTHER[name]):
        collective = replace(inst.collective, chunk_factor=schedule.collective.chunk_factor)
        done.append(replace(mirrored(schedule, collective), method="mirror",
                            notes={**schedule.notes, "mirror_of": OTHER[name]}))
    return first_with_runner_ups(done)


METHOD = MethodSpec(
    name="mirror",
    run=synthesize,
    collectives=SUPPORTED,
    description="allgather / reducescatter, broadcast / reduce as the time mirror of trees' best program for the "
                "other one",
)

"""An allreduce whose chunks per loop no MSCCL runtime runs at SIZE is spread over more chunks
(synth.schedule.spread_chunks, synth.pipeline.runnable_allreduce): the same moves, a loop that divides the buffer,
at most 4 % more bytes per transfer (SPREAD_COST)."""

from __future__ import annotations

import pytest

from synth.collectives import Collective, runtime_divides
from synth.pipeline import SPREAD_COST, synthesize
from synth.program.lower import lower
from synth.schedule import spread_chunks
from synth.synthesis.base import SynthOptions
from synth.topology import generators as gen
from synth.verification import verify
from tests.test_circuit_bounds import leaf_spine

MiB = 2**20


def _sends(program) -> int:
    return sum(1 for gpu in program.gpus for tb in gpu.threadblocks for step in tb.steps
               if step.type in ("s", "rcs", "rrcs", "rrs"))


def test_spread_schedule_computes_the_allreduce_with_one_message_per_transfer():
    topology = gen.torus([3, 2])
    planned = synthesize(topology, "allreduce", 64 * MiB, "ring", options=SynthOptions(runtime_chunks=False))
    schedule = planned.schedule
    chunks = schedule.collective.chunk_factor
    spread = spread_chunks(schedule, 7 * chunks + 3)
    assert spread.collective.chunk_factor == 7 * chunks + 3
    loop = 7 * chunks + 3
    assert len(spread.transfers) == sum((c + 1) * loop // chunks - c * loop // chunks
                                        for c in (t.chunk for t in schedule.transfers))
    program = lower(spread, name="spread")
    assert verify(program, spread.collective, topology=topology).ok
    # one step per transfer of the plan: each spread transfer is one message
    assert _sends(program) == _sends(planned.program)
    with pytest.raises(ValueError):
        spread_chunks(schedule, chunks)
    with pytest.raises(ValueError):
        spread_chunks(schedule.__class__(Collective("allgather", 6), "x", ()), 12)


def test_fifteen_ranks_get_a_runnable_allreduce_near_the_bound():
    # 15 equal pieces divide no power-of-two buffer: the leaf rings' allreduce was passed over for a ring that runs
    # (0.843 of the bound); spread over 2048 chunks it runs, 0.5 % above the bound
    topology = leaf_spine(5, 3, 50.0, 33.0, 3)
    result = synthesize(topology, "allreduce", 2**30)
    assert runtime_divides(result.program.nchunksperloop, 2**30)
    assert result.method in ("leafring", "hierarchical", "railblocks")
    assert result.bound_us / result.time_us > 0.99
    chunks, loop = result.schedule.notes["spread_chunks"]
    assert loop > chunks and runtime_divides(loop, 2**30)


def test_spreading_costs_at_most_a_sixty_fourth():
    topology = gen.torus([3, 2])
    for method in ("ring", "trees"):
        free = synthesize(topology, "allreduce", 64 * MiB, method, options=SynthOptions(runtime_chunks=False))
        kept = synthesize(topology, "allreduce", 64 * MiB, method)
        assert not runtime_divides(free.program.nchunksperloop, 64 * MiB)
        assert runtime_divides(kept.program.nchunksperloop, 64 * MiB), method
        assert kept.time_us <= free.time_us * (1 + SPREAD_COST), method
        # --chunks pins the count: nothing is spread
        pinned = synthesize(topology, "allreduce", 64 * MiB, method,
                            options=SynthOptions(chunks=free.schedule.collective.chunk_factor))
        assert pinned.program.nchunksperloop == free.program.nchunksperloop

"""A connection whose nops crowd in one stretch (synth.program.lower.assign: blocks of equal steps where equal
lengths overflow MSCCL's channels), seen through the default synthesize on a generated fabric."""

from __future__ import annotations

from synth.pipeline import synthesize
from synth.program.msccl_xml import check_runtime_limits
from synth.topology.families import fabric_family


def test_weighted_ownership_allreduce_loads_in_the_runtime():
    # MI250 and H100 boxes, allreduce at 1 GiB: trees with rank 17 owning 11 units; its connection 17 -> 18 took
    # 374 messages and 310 nops on one receiving threadblock, so equal blocks overflowed 16 channels of 64 steps
    # and the program was JSON only (the .xml default output exited 2; the best loadable, multiring, 1.6x slower)
    t = {f.name: f for f in fabric_family()}["mixed-mi250-h100"].build()
    result = synthesize(t, "allreduce", 2**30)
    assert result.method == "trees"
    assert "over_limits" not in result.schedule.notes
    check_runtime_limits(result.program, runtime="msccl-executor")
    assert result.bound_us / result.time_us >= 0.89

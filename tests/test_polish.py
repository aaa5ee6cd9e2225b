"""polish() times the depth search's next best shapes as well as its best (``TUNING.polish_runners``)."""

from dataclasses import replace

import synth
from synth.synthesis.trees import tuning
from synth.topology.degrade import FabricEdits, degrade_topology


def test_polish_times_the_search_runners_up_too(monkeypatch):
    # the search ranks shapes without drains; polishing its next best shapes finds a faster one on this fabric
    topology = degrade_topology(synth.load_topology("dgx-a100-2node"),
                                FabricEdits(exclude_links=(("b0.nic3", "ib1"),))).topology
    # the search's runners alone (the coarser chunks polish also times are tested below)
    monkeypatch.setattr(tuning, "TUNING", replace(tuning.TUNING, coarser_chunks=()))
    with_runners = synth.synthesize(topology, "allgather", "256MiB", method="trees")
    monkeypatch.setattr(tuning, "TUNING", replace(tuning.TUNING, polish_runners=0))
    without = synth.synthesize(topology, "allgather", "256MiB", method="trees")
    assert with_runners.time_us < without.time_us * 0.995   # 906.1 against 914.4 us measured
    assert with_runners.time_us >= with_runners.bound_us


def test_polish_times_coarser_chunks_too(monkeypatch):
    # a message holds at most MAX_COALESCE chunks: on the NIC-less rank's port, busy to the end, coarser chunks mean
    # fewer messages and less α (128 -> 32 chunks per root: 3414.2 against 3425.4 us measured)
    topology = degrade_topology(synth.load_topology("dgx-a100-2node"),
                                FabricEdits(exclude_links=(("b0.nic3", "ib1"),))).topology
    coarse = synth.synthesize(topology, "allgather", "1GiB", method="trees")
    monkeypatch.setattr(tuning, "TUNING", replace(tuning.TUNING, coarser_chunks=()))
    fine = synth.synthesize(topology, "allgather", "1GiB", method="trees")
    assert coarse.schedule.collective.chunk_factor < fine.schedule.collective.chunk_factor
    assert coarse.time_us < fine.time_us * 0.998

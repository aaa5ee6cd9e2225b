"""Method trees searches each set of forests once, and skips weighted allreduce forests that buy no rate."""

from __future__ import annotations

import pytest

from synth.api import load_topology
from synth.collectives import Collective
from synth.synthesis.base import Instance, SynthOptions
from synth.synthesis.trees import method as trees_method
from synth.topology.degrade import FabricEdits, degrade_topology


@pytest.fixture(scope="module")
def degraded_pair_searches():
    """The run_pipeline calls of the trees allreduce on two DGX A100 boxes with one NIC down (1 MiB): the
    full-capacity forests of the slack search are also the 4-trees-per-root forests of the cap search, and
    the weighted forests at 1 and 2 trees per unit run at the uniform forests' rate."""
    topology = degrade_topology(load_topology("dgx-a100-2node"),
                                FabricEdits(exclude_links=(("b0.nic3", "ib1"),))).topology
    calls = []
    original = trees_method.run_pipeline

    def recording(*args, **kwargs):
        found = original(*args, **kwargs)
        calls.append(found)
        return found

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(trees_method, "run_pipeline", recording)
    try:
        schedule = trees_method.synthesize(Instance(topology, Collective("allreduce", 16, 1, 0, True), float(2**20),
                                                    SynthOptions()))
    finally:
        monkeypatch.undo()
    assert schedule.predicted_time_us > 0
    return calls, schedule


def test_each_set_of_forests_is_searched_once(degraded_pair_searches) -> None:
    calls, _ = degraded_pair_searches
    forests = [tuple(found.plans) for found in calls]
    assert len(forests) == len(set(forests))
    # the cap search's 4 trees per root are the slack search's full-capacity forests: searched once, still there
    assert any(found.plans[0].weights is None and found.plans[0].k == 4 for found in calls)


def test_weighted_forests_without_a_faster_rate_are_not_searched(degraded_pair_searches) -> None:
    calls, _ = degraded_pair_searches
    uniform = min(found.floor for found in calls if found.plans[0].weights is None)
    weighted = [found for found in calls if found.plans[0].weights is not None]
    assert weighted, "the weighted forests below the uniform rate are searched"
    assert all(found.floor < uniform for found in weighted)
    assert sorted(found.plans[0].k for found in weighted) == [4, 7]   # 1 and 2 per unit: the uniform rate


def test_no_forest_outlives_its_synthesis() -> None:
    """The forests a synthesis packs are freed with it: a 1024-rank torus forest holds a million edges, and
    trees' split cache (``messages._SPLITS``) used to keep the last 64 forests alive for good."""
    import gc

    from synth.synthesis.trees.forest import Forest
    from synth.topology import generators as gen

    def forests() -> int:
        gc.collect()
        return sum(type(o) is Forest for o in gc.get_objects())   # isinstance would wake lazy modules

    before = forests()
    schedule = trees_method.synthesize(Instance(gen.torus([4, 4]), Collective("allgather", 16), float(2**30),
                                                SynthOptions()))
    assert schedule.transfers
    assert forests() == before


def test_trees_refuses_past_its_transfer_limit_before_packing(monkeypatch) -> None:
    """A request whose least schedule exceeds ``TUNING.max_transfers`` is refused at once, naming the count."""
    from dataclasses import replace

    from synth.errors import SynthError
    from synth.synthesis.trees import tuning
    from synth.topology import generators as gen

    monkeypatch.setattr(tuning, "TUNING", replace(tuning.TUNING, max_transfers=2 * 16 * 15 - 1))
    planned = []
    monkeypatch.setattr(trees_method, "plan_forest", lambda *a, **k: planned.append(a))
    inst = Instance(gen.torus([4, 4]), Collective("allreduce", 16), float(2**30), SynthOptions())
    with pytest.raises(SynthError, match="at least 480 transfers for allreduce on 16 ranks"):
        trees_method.synthesize(inst)
    assert not planned


def test_translated_tree_schedules_have_their_own_transfer_limit(monkeypatch) -> None:
    """Past ``large_ranks`` a torus's schedule is built as columns: ``max_table_transfers`` bounds it, not the
    record path's ``max_transfers``; past it the request is refused before packing, naming that limit."""
    from dataclasses import replace

    from synth.errors import SynthError
    from synth.schedule import TransferTable
    from synth.synthesis.trees import tuning
    from synth.topology import generators as gen

    least = 16 * 15
    monkeypatch.setattr(tuning, "TUNING", replace(tuning.TUNING, large_ranks=8, max_transfers=least - 1))
    inst = Instance(gen.torus([4, 4]), Collective("allgather", 16), float(2**30), SynthOptions())
    schedule = trees_method.synthesize(inst)
    assert isinstance(schedule.transfers, TransferTable) and len(schedule.transfers) == least
    monkeypatch.setattr(tuning, "TUNING", replace(tuning.TUNING, large_ranks=8, max_table_transfers=least - 1))
    planned = []
    monkeypatch.setattr(trees_method, "plan_forest", lambda *a, **k: planned.append(a))
    with pytest.raises(SynthError, match=f"at least {least} transfers for allgather on 16 ranks, more than its "
                                         f"limit of {least - 1}"):
        trees_method.synthesize(Instance(gen.torus([4, 4]), Collective("allgather", 16), float(2**30),
                                         SynthOptions()))
    assert not planned


def test_a_repeated_forward_timing_reuses_the_winner_and_builds_the_same_transfers(monkeypatch) -> None:
    """timed_forward keeps the winning (priority, coalescing) of recent arguments: the search's repeat of a shape
    is not timed again, and building it times only the winner, with the transfers a fresh timing gives."""
    from synth.synthesis.trees import timed
    from synth.synthesis.trees.forest import plan_forest
    from synth.synthesis.trees.pipeline import forest_phases

    topology = degrade_topology(load_topology("dgx-a100-2node"),
                                FabricEdits(exclude_links=(("b0.nic3", "ib1"),))).topology
    coll = Collective("allreduce", 16, 64, 0, False)
    plans = [plan_forest(topology, roots, reverse=reverse, max_trees=4) for roots, reverse in forest_phases(coll)]
    chunk_bytes = coll.chunk_bytes(2**26)
    searched: list[tuple[int, int] | None] = []
    original = timed._forward_search

    def recording(*args):
        searched.append(args[-2])   # only: None for a full search
        return original(*args)

    monkeypatch.setattr(timed, "_forward_search", recording)
    timed._FORWARD_WINNERS.clear()
    first = timed.timed_forward(coll, plans, topology, 4, 2, chunk_bytes, False, 1)
    again = timed.timed_forward(coll, plans, topology, 4, 2, chunk_bytes, False, 1)
    built = timed.timed_forward(coll, plans, topology, 4, 2, chunk_bytes, True, 1)
    assert first is not None and again == first and built[0] == first[0]
    assert searched[0] is None and len(searched) == 2 and searched[1] is not None
    timed._FORWARD_WINNERS.clear()
    fresh = timed.timed_forward(coll, plans, topology, 4, 2, chunk_bytes, True, 1)
    assert fresh == built and len(built[1]) > 0

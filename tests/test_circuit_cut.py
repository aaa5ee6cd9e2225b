"""The allgather cut with circuit capacities from inside the cut (lower_bounds.circuit_box_cut): a valid bound
(no verified program beats it) that is tighter where slow NICs feed fast ones."""

from __future__ import annotations

import pytest

from synth.lower_bounds import allgather_cut, circuit_box_cut, compute_bounds, without_dead_ends
from synth.topology.families import fabric_family
from tests.schedule_check import programs_at_or_above_bound
from tests.schedule_check import slow_and_fast_boxes as _mixed

MiB = 2**20


def test_slow_nics_holding_fast_ones_tighten_the_cut():
    # the 2-rank fast box takes the 4-rank slow box's 4 pieces through its 2 NICs, held at the slow rate:
    # T >= 4 M / (2 x 10), where ForestColl's cut allows the fast NICs' 40 GB/s (4 M / 80) and the slow box's
    # own uplinks give 4 M / 40
    t = _mixed(10.0, 40.0)
    ratio, cut = circuit_box_cut(t)
    assert ratio == pytest.approx(4 / 20) and "all but box 4..5" in cut
    bounds = compute_bounds(t, "allgather", 64 * MiB)
    assert bounds.details["cut_bound_us"] == pytest.approx(64 * MiB / 6 * ratio / 1e3)
    # the same cut found on the route capacities, charged the IB route's α once (2 + 2 µs)
    assert bounds.bandwidth_bound_us == pytest.approx(64 * MiB / 6 * ratio / 1e3 + 4.0)
    # ForestColl's cut on the circuit capacities alone counts the fast NICs at 40 GB/s (on the route capacities the
    # bounds now use, every route through them is a slow box's, so it finds the same cut)
    assert allgather_cut(without_dead_ends(t.circuit_capacities())).ratio < ratio


@pytest.mark.parametrize("slow, fast, slow_ranks, fast_ranks", [(10.0, 40.0, 4, 2), (12.5, 50.0, 3, 2),
                                                                 (25.0, 50.0, 2, 2)])
@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_no_verified_program_beats_the_bound(slow, fast, slow_ranks, fast_ranks, collective):
    # brute force over the methods that run on these small fabrics: every verified program's simulated time is
    # at least the bound
    t = _mixed(slow, fast, slow_ranks, fast_ranks)
    methods = ("ring", "greedy", "trees", "direct", "hierarchical", "lp", "railblocks")
    assert len(programs_at_or_above_bound(t, collective, 64 * MiB, methods)) >= 3


def test_equal_boxes_keep_forestcolls_bound():
    family = {f.name: f for f in fabric_family()}
    for name in ("a100x4", "h100x3", "mi250x2-ib16"):
        t = family[name].build()
        bounds = compute_bounds(t, "allgather", 2**30)
        assert "circuit_cut" not in bounds.details, name

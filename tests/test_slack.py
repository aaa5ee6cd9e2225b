"""packing.slow_link_slack: capacities at the optimal rate that leave slow links the slack the rate does not need."""

from fractions import Fraction

import numpy as np
import pytest

from synth.synthesis import packing
from synth.synthesis.trees.forest import plan_forest
from synth.topology import generators as gen
from synth.topology.degrade import FabricEdits, degrade_topology
from synth.topology.families import dgx_a100_boxes, mi250_boxes
from synth.topology.io import load_topology


def _exact(topology):
    fabric = packing.integer_fabric(topology)
    weights = {r: 1 for r in range(topology.num_ranks)}
    ratio = packing.optimal_ratio(fabric, weights)
    k, caps, achieved = packing.choose_capacities(fabric, weights, ratio, 256)
    assert achieved == ratio
    return fabric, weights, k, caps


def _degraded_pair():
    return degrade_topology(load_topology("dgx-a100-2node"), FabricEdits(exclude_links=(("b0.nic3", "ib1"),))).topology


def _check_slack(fabric, weights, k, caps, max_trees=256):
    new_k, new_caps = packing.slow_link_slack(fabric, weights, k, caps, max_trees)
    m = new_k // k
    assert new_k % k == 0 and new_k <= max(k, max_trees)
    # the same rate: every rank still gets new_k trees per unit of weight within the new capacities
    assert packing.is_feasible(fabric, new_caps, weights, new_k)
    assert np.all(new_caps <= caps * m)
    fastest = fabric.units == fabric.units.max()
    assert np.array_equal(new_caps[fastest], caps[fastest] * m)
    return new_k, new_caps


def test_the_nic_links_into_a_box_that_lost_one_keep_the_slack():
    # the binding cut is rank 3's NVSwitch port (it has no NIC left); the seven NIC links into its box need only
    # 8 of 8.75 units of the rate between them. The full capacities let the packing fill all seven.
    topology = _degraded_pair()
    fabric, weights, k, caps = _exact(topology)
    new_k, new_caps = _check_slack(fabric, weights, k, caps)
    m = new_k // k
    into_box0 = [i for i, (a, b) in enumerate(fabric.arcs)
                 if str(topology.node_name(a)).startswith("ib") and str(topology.node_name(b)).startswith("b0.")]
    assert len(into_box0) == 7
    full = caps[into_box0[0]] * m
    assert all(new_caps[i] < full for i in into_box0)
    # what crosses: 8 roots' trees, new_k each; a unit less on every link would not carry them
    assert sum(new_caps[i] for i in into_box0) >= 8 * new_k
    assert not packing.is_feasible(fabric, np.where(np.isin(np.arange(len(caps)), into_box0), new_caps - 1,
                                                    new_caps), weights, new_k)


def test_the_forest_packed_on_them_loads_each_nic_link_below_the_rate():
    topology = _degraded_pair()
    forest = plan_forest(topology, tuple(range(16)))
    assert forest.ratio == forest.optimal
    nic_in = {arc: units for arc, units in forest.link_units().items()
              if str(topology.node_name(arc[0])).startswith("ib") and str(topology.node_name(arc[1])).startswith("b0.")}
    full = forest.ratio * forest.k * 1    # capacity of a 25 GB/s link (1 fabric unit) at the rate
    assert len(nic_in) == 7 and all(Fraction(units) < full for units in nic_in.values())
    assert sum(nic_in.values()) >= 8 * forest.k


@pytest.mark.parametrize("name", ["dgx-a100-2node", "dgx1", "mi250", "ndv2-2node", "dgx-h100-2node"])
def test_builtins_keep_the_rate(name):
    _check_slack(*_exact(load_topology(name)))


@pytest.mark.parametrize("make", [
    lambda: gen.random_regular(12, 3, 1), lambda: gen.random_regular(16, 4, 2), lambda: gen.random_regular(10, 3, 5),
    lambda: dgx_a100_boxes(3), lambda: mi250_boxes(2, 25.0, machines=False),
    lambda: degrade_topology(dgx_a100_boxes(3), FabricEdits(exclude_links=(("b1.nic5", "ib1"),))).topology,
])
def test_generated_fabrics_keep_the_rate_and_trim_only_below_the_fastest(make):
    _check_slack(*_exact(make()))


def test_a_fabric_with_one_bandwidth_is_left_alone():
    fabric, weights, k, caps = _exact(gen.torus([4, 4]))
    assert packing.slow_link_slack(fabric, weights, k, caps, 256) == (k, caps)


def test_plan_forest_says_whether_it_left_slack():
    topology = _degraded_pair()
    assert plan_forest(topology, tuple(range(16))).slack
    full = plan_forest(topology, tuple(range(16)), slack=False)
    assert not full.slack and full.k == 4    # the rate 5/4 at its own denominator
    # a fabric whose slow links are on the binding cut has none to leave
    assert not plan_forest(load_topology("dgx-a100-2node"), tuple(range(16))).slack


def test_trees_search_the_full_capacity_forests_too(monkeypatch):
    # slack is not always faster, so where it changed the forests the method also searches those on full capacities
    # and keeps the faster of the two
    import synth
    from synth.synthesis.trees import method

    searched = []
    original = method.run_pipeline

    def recording(*args, **kwargs):
        found = original(*args, **kwargs)
        searched.append((tuple(f.slack for f in found.plans), found.timed[1]))
        return found

    monkeypatch.setattr(method, "run_pipeline", recording)
    result = synth.synthesize(_degraded_pair(), "allgather", "16MiB", method="trees")
    assert ((True,), searched[0][1]) == searched[0] and searched[1][0] == (False,)
    assert result.schedule.predicted_time_us <= min(t for _, t in searched) * (1 + 1e-9)

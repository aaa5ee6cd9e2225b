"""Bounds ignore dead-end switches (``lower_bounds.without_dead_ends``): links that no transfer between two
distinct ranks can use (a NIC whose uplink is down) are not bandwidth into their rank."""

from dataclasses import replace

import pytest

import synth
from synth.lower_bounds import allreduce_bandwidth_us, compute_bounds, without_dead_ends
from synth.topology.builtin import builtin_names
from synth.topology.degrade import FabricEdits, degrade_topology
from synth.topology.generators import boxes_behind_nics
from synth.topology.model import Link, Topology

GIB = 2**30


def _nic_down(per_box: int = 4, boxes: int = 2) -> Topology:
    healthy = boxes_behind_nics(boxes, per_box, intra_bw=100, nic_bw=25)
    return degrade_topology(healthy, FabricEdits(exclude_links=(("b0.nic1", "ib0"),))).topology


def _without_node_links(topology: Topology, name: str) -> Topology:
    node = topology.node_id(name)
    return replace(topology, links=tuple(lk for lk in topology.links if node not in (lk.src, lk.dst)))


def test_a_nic_without_uplink_is_no_bandwidth_into_its_rank():
    degraded = _nic_down()
    pruned = without_dead_ends(degraded)
    nic = degraded.node_id("b0.nic1")
    assert all(nic not in (lk.src, lk.dst) for lk in pruned.links)
    assert len(pruned.links) == len(degraded.links) - 2   # rank 1 <-> its NIC, both ways
    # the bound is the bound of the fabric with that NIC's links taken out by hand
    by_hand = _without_node_links(degraded, "b0.nic1")
    assert compute_bounds(degraded, "allreduce", GIB).time_bound_us == pytest.approx(
        compute_bounds(by_hand, "allreduce", GIB).time_bound_us, rel=1e-12)
    # and tighter than counting the dead link (the traffic bounds divide by the ranks' in-bandwidth)
    counted, _ = allreduce_bandwidth_us(degraded.circuit_capacities(), GIB)
    assert compute_bounds(degraded, "allreduce", GIB).bandwidth_bound_us > counted * 1.001


def test_dead_ends_are_pruned_repeatedly():
    # rank 0 -> s0 -> s1 is a dead-end chain hanging off a two-rank fabric
    topology = Topology("chain", 2, (Link(0, 1, 10.0, 1.0), Link(1, 0, 10.0, 1.0), Link(0, 2, 5.0, 0.0),
                                     Link(2, 0, 5.0, 0.0), Link(2, 3, 5.0, 0.0), Link(3, 2, 5.0, 0.0)),
                        switches=("s0", "s1"))
    pruned = without_dead_ends(topology)
    assert [(lk.src, lk.dst) for lk in pruned.links] == [(0, 1), (1, 0)]
    bound = compute_bounds(topology, "allreduce", GIB).bandwidth_bound_us
    assert bound == pytest.approx(compute_bounds(pruned, "allreduce", GIB).bandwidth_bound_us)


@pytest.mark.parametrize("name", builtin_names())
def test_builtins_have_no_dead_ends(name):
    topology = synth.load_topology(name)
    assert without_dead_ends(topology) is topology


def test_no_program_beats_the_pruned_bound():
    degraded = _nic_down()
    for method in ("trees", "greedy", "ring"):
        result = synth.synthesize(degraded, "allreduce", "16MiB", method=method)
        assert result.time_us >= result.bound_us * (1 - 1e-9), method

"""Route capacities (synth.topology.routes.route_capacities): a switch link is capped at the widest rank-to-rank
*route* through it, so methods plan with what the simulator times where slow NICs feed fast ones."""

from __future__ import annotations

import pytest

from synth.pipeline import instance, synthesize
from synth.topology.families import fabric_family
from synth.topology.routes import rank_routes, route_capacities
from tests.schedule_check import slow_and_fast_boxes as _mixed

GiB = 2**30


def _bottlenecks(topology):
    bw = {(link.src, link.dst): link.bw for link in topology.links}
    return {pair: min(bw[arc] for arc in zip(path, path[1:])) for pair, path in rank_routes(topology).items()}


def test_fast_nics_that_only_reach_slow_ones_are_capped():
    t = _mixed(10.0, 40.0).circuit_capacities()
    capped = route_capacities(t)
    nic_links = [(old, new) for old, new in zip(t.links, capped.links) if old.bw == 40.0]
    assert nic_links, "the fast box's NIC links are there"
    for old, new in nic_links:
        # every route through them carries a slow box's piece: the fast box talks to itself over its NVSwitch
        assert new.bw == 10.0, (t.node_name(old.src), t.node_name(old.dst))
    assert all(new == old for old, new in zip(t.links, capped.links) if old.bw != 40.0)


@pytest.mark.parametrize("spec", [f for f in fabric_family() if f.ranks <= 32], ids=lambda f: f.name)
def test_no_route_changes_its_bottleneck(spec):
    t = spec.build().circuit_capacities()
    capped = route_capacities(t)
    assert _bottlenecks(capped) == _bottlenecks(t)
    assert all(new.bw <= old.bw for old, new in zip(t.links, capped.links))


def test_methods_plan_on_route_capacities():
    t = _mixed(12.5, 50.0, 3, 2)
    planned = instance(t, "allgather", GiB).topology
    assert min(link.bw for link in planned.links if link.bw != 100.0) == 12.5
    assert planned.num_ranks == t.num_ranks


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_slow_and_fast_boxes_reach_the_bound(collective):
    # planned on circuit capacities only, the forests counted the fast NICs at 40 GB/s and the default
    # synthesize gave 0.667 (allgather, greedy) and 0.332 (allreduce)
    result = synthesize(_mixed(10.0, 40.0), collective, GiB)
    assert result.bound_us / result.time_us >= 0.98

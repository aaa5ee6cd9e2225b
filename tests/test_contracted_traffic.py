"""The allreduce gossip count with one group kept as ranks (lower_bounds.contracted_traffic): the count it rests
on, checked by exhaustive search; its value where it binds; and no verified program beating it."""

from __future__ import annotations

import itertools

import pytest

from synth.errors import SynthError
from synth.lower_bounds import compute_bounds, contracted_traffic
from synth.pipeline import synthesize
from synth.topology import generators as gen
from synth.topology.families import fabric_family

MiB = 2**20


def _least_gossip_calls(nodes: int) -> int:
    """Fewest one-way calls (the caller's knowledge joins the callee's) after which every node knows every
    input, by breadth-first search over knowledge states."""
    everything = (1 << nodes) - 1
    start = tuple(1 << v for v in range(nodes))
    frontier, seen, calls = {start}, {start}, 0
    while True:
        if any(all(k == everything for k in state) for state in frontier):
            return calls
        step = set()
        for state in frontier:
            for caller, callee in itertools.permutations(range(nodes), 2):
                after = list(state)
                after[callee] |= state[caller]
                after = tuple(after)
                if after not in seen:
                    seen.add(after)
                    step.add(after)
        frontier, calls = step, calls + 1


@pytest.mark.parametrize("nodes", [2, 3, 4, 5])
def test_one_way_gossip_needs_two_n_minus_two_calls(nodes):
    # the count the bound charges per element (Harary & Schwenk), by exhaustive search
    assert _least_gossip_calls(nodes) == 2 * nodes - 2


def _thin_nic_boxes():
    """A 6-rank box whose NICs are thin against its switch, beside a 4-rank box with fatter NICs."""
    boxes = [gen.Box(6, "nvswitch", 15.0, 0.5, nic_bw=5.0), gen.Box(4, "nvswitch", 40.0, 0.5, nic_bw=10.0)]
    return gen.boxes_on_ib(boxes, 1, name="thin-nic-boxes")


def _kept_box_bound_us(topology, box, size_bytes):
    """2g·SIZE / (the box's ranks' in-links + links leaving the box's nodes), computed from the links; the box's
    nodes are its ranks and the switches named after it (``b0.nvswitch``, ``b0.nic3``)."""
    prefix = topology.node_name(topology.num_ranks).split(".")[0] if box[0] == 0 else None
    inside = set(box) | {s for s in range(topology.num_ranks, topology.num_nodes)
                         if topology.node_name(s).split(".")[0] == prefix}
    into_ranks = sum(link.bw for link in topology.links if link.dst in box)
    leaving = sum(link.bw for link in topology.links if link.src in inside and link.dst not in inside)
    return 2 * len(box) * size_bytes / (into_ranks + leaving) / 1e3


def test_thin_nics_make_the_kept_box_bind():
    t = _thin_nic_boxes()
    bounds = compute_bounds(t, "allreduce", 64 * MiB)
    parts = bounds.details["components_us"]
    # the 6-rank box kept, the other box one node: 12 calls per element over 6 x (15 + 5) + 6 x 5 GB/s
    # on the file's links; on the route capacities the bounds use (the other box's 10 GB/s NICs only reach the
    # kept box's 5 GB/s ones, so they count 5) over 140 GB/s, where the groups' traffic bound comes to the same
    assert contracted_traffic(t) == (12, pytest.approx(150.0))
    assert parts["contracted_traffic_us"] == pytest.approx(bounds.bandwidth_bound_us)
    assert bounds.bandwidth_bound_us == pytest.approx(12 * 64 * MiB / 140 / 1e3)
    others = [v for k, v in parts.items() if k not in ("contracted_traffic_us", "group_traffic_us")]
    assert max(others) < 0.95 * bounds.bandwidth_bound_us


def test_a100_box_beside_h100_box():
    # the family's mixed DGX A100 + DGX H100 fabric: the A100 box kept binds (RS + AG ownership cannot pass it)
    t = {f.name: f for f in fabric_family()}["mixed-a100-h100"].build()
    bounds = compute_bounds(t, "allreduce", 2**30)
    # on route capacities the groups' traffic bound comes to the same value (the H100 NICs count 25 GB/s)
    assert bounds.details["components_us"]["contracted_traffic_us"] == pytest.approx(bounds.bandwidth_bound_us)
    a100 = t.machines[0]   # box b0: 8 x 300 GB/s NVSwitch ports, 8 x 25 GB/s NICs
    assert sum(link.bw for link in t.links if link.dst == 0) == 325
    assert bounds.bandwidth_bound_us == pytest.approx(_kept_box_bound_us(t, a100, 2**30))
    assert bounds.bandwidth_bound_us > 1.05 * bounds.details["components_us"]["traffic_us"]


def test_in_network_switches_skip_it():
    t = {f.name: f for f in fabric_family()}["mixed-a100-h100"].build()
    assert "contracted_traffic_us" in compute_bounds(t, "allreduce", 2**30).details["components_us"]
    from synth.api import load_topology

    nvls = load_topology("dgx-h100-nvls")
    assert "contracted_traffic_us" not in compute_bounds(nvls, "allreduce", 2**30).details["components_us"]


def _verified_times(topology, methods) -> tuple[float, dict[str, float]]:
    """(the 64 MiB allreduce bound, the simulated time of each method's verified program), asserting that none is
    below the bound; methods that do not apply are left out."""
    bound = compute_bounds(topology, "allreduce", 64 * MiB).time_bound_us
    timed = {}
    for method in methods:
        try:
            result = synthesize(topology, "allreduce", 64 * MiB, method)   # lowered, verified, simulated
        except SynthError:
            continue
        timed[method] = result.time_us
        assert result.time_us >= bound * (1 - 1e-9), method
    return bound, timed


def test_no_verified_program_beats_it():
    # every method that runs on this small fabric: each verified program's simulated time is at least the bound
    _, timed = _verified_times(_thin_nic_boxes(), ("ring", "greedy", "trees", "lp", "multiring", "hierarchical",
                                                   "railblocks"))
    assert {"ring", "greedy", "trees"} <= set(timed)


SHARED_NIC_BOXES = """
name: shared-nic-boxes
ranks: 6
switches: [b0.nic, b1.nic, b2.nic, ib]
links:
- {src: 0, dst: 1, bw: 100, alpha: 0.5}
- {src: 2, dst: 3, bw: 100, alpha: 0.5}
- {src: 4, dst: 5, bw: 100, alpha: 0.5}
- {src: 0, dst: b0.nic, bw: 25, alpha: 0}
- {src: 1, dst: b0.nic, bw: 25, alpha: 0}
- {src: 2, dst: b1.nic, bw: 25, alpha: 0}
- {src: 3, dst: b1.nic, bw: 25, alpha: 0}
- {src: 4, dst: b2.nic, bw: 25, alpha: 0}
- {src: 5, dst: b2.nic, bw: 25, alpha: 0}
- {src: b0.nic, dst: ib, bw: 25, alpha: 1}
- {src: b1.nic, dst: ib, bw: 25, alpha: 1}
- {src: b2.nic, dst: ib, bw: 25, alpha: 1}
"""


def _shared_nic_boxes():
    """Three boxes of two GPUs (100 GB/s between them) whose one 25 GB/s NIC switch serves both GPUs at 25 GB/s
    each: the box's boundary is the NIC's uplink, not its two GPU links."""
    import yaml

    from synth.topology.io import parse_topology

    return parse_topology(yaml.safe_load(SHARED_NIC_BOXES), "shared-nic-boxes")


def test_a_nic_switch_private_to_a_box_joins_it():
    # the groups with each NIC switch in its box: 2(3 - 1) = 4 calls per element over 3 x 25 GB/s entering (or
    # leaving) the boxes; with the NIC switches left out the boxes' GPU links, 3 x 50 GB/s, halved it
    t = _shared_nic_boxes()
    bounds = compute_bounds(t, "allreduce", 64 * MiB)
    assert bounds.details["components_us"]["group_traffic_us"] == pytest.approx(4 * 64 * MiB / 75 / 1e3)
    assert bounds.bandwidth_bound_us == pytest.approx(4 * 64 * MiB / 75 / 1e3)


def test_no_verified_program_beats_the_shared_nic_bound():
    bound, timed = _verified_times(_shared_nic_boxes(), ("ring", "greedy", "trees", "lp", "multiring",
                                                         "hierarchical", "rsag", "auto"))
    assert {"ring", "greedy", "trees", "auto"} <= set(timed)
    # and the bound is met within 5 %: the boxes' uplinks are what limits every program
    assert min(timed.values()) <= bound * 1.05


def test_six_boxes_with_a_nic_per_two_gpus():
    # tests/fixtures/half-nics-48.yaml: each box's four NIC switches join it, so six groups exchange 10·SIZE over
    # 6 x 4 x 50 GB/s of NIC uplinks; left outside, the boxes' 8 x 50 GB/s of GPU links halved it (the pair cut,
    # SIZE over one box's 200 GB/s, bound the allreduce instead)
    from synth.topology.io import load_topology

    t = load_topology("tests/fixtures/half-nics-48.yaml")
    bounds = compute_bounds(t, "allreduce", 2**30)
    assert bounds.bandwidth_bound_us == pytest.approx(10 * 2**30 / 1200 / 1e3)
    assert bounds.details["components_us"]["pair_cut_us"] == pytest.approx(2**30 / 200 / 1e3)

"""A method's proven floor (``MethodSpec.floor_us``): multiring's, never beaten; auto runs a method whose floor
misses the bound after the tree methods and skips it once a verified program is as fast."""

from __future__ import annotations

import pytest

from synth.api import load_topology
from synth.collectives import Collective
from synth.pipeline import _bound_us, synthesize
from synth.synthesis import auto
from synth.synthesis.base import Instance, SynthOptions
from synth.synthesis.multiring import floor_us
from synth.topology import generators as gen


def _instance(topology, name: str, size: int) -> Instance:
    return Instance(topology, Collective(name, topology.num_ranks, 1, 0, False), float(size), SynthOptions())


def _fabric(fabric: str):
    if fabric == "rr":
        return gen.random_regular(10, 3, seed=4)
    if fabric == "leaf-spine":    # α on every hop: a route between leaves pays 4 of them
        return gen.leaf_spine(3, 4, 2, bw=25.0, alpha=3.0)
    if fabric == "ring-boxes":    # boxes of 4 on an xGMI-like ring, every rank on one IB switch (2 µs a hop)
        ring4 = ((0, 40, 0, 20), (40, 0, 20, 0), (0, 20, 0, 40), (20, 0, 40, 0))
        return gen.boxes_on_ib([gen.Box(4, ring4, intra_alpha=0.5, nics=0, nic_bw=10.0, ib_alpha=2.0)] * 3, 1)
    return load_topology(fabric)


@pytest.mark.parametrize("fabric, name", [("dgx-a100-2node", "allgather"), ("dgx-a100-2node", "allreduce"),
                                          ("ring-8", "reducescatter"), ("torus-4x4", "allgather"),
                                          ("hypercube-16", "allreduce"), ("rr", "allgather"),
                                          ("leaf-spine", "allgather"), ("leaf-spine", "allreduce"),
                                          ("ring-boxes", "allgather"), ("ring-boxes", "reducescatter")])
@pytest.mark.parametrize("size", [2**20, 2**26])
def test_no_multiring_program_beats_its_floor(fabric: str, name: str, size: int) -> None:
    topology = _fabric(fabric)
    result = synthesize(topology, name, size, "multiring")
    floor = floor_us(_instance(topology, name, size))
    assert floor is not None and result.time_us >= floor * (1 - 1e-9)
    # the floor is a lower bound of multiring only: at a bandwidth-bound size never below the collective's own bound
    bound = _bound_us(topology, Collective(name, topology.num_ranks, 1, 0, False), size)
    assert size < 2**26 or floor >= bound * (1 - 1e-9)


def test_multiring_runs_after_trees_where_rings_cannot_reach_the_bound() -> None:
    boxes = _instance(load_topology("dgx-a100-2node"), "allgather", 2**30)   # rings: 0.615 of the bound at best
    order = [c.method for c in auto.plan(boxes, _bound_us(boxes.topology, boxes.collective, 2**30))]
    assert order.index("multiring") > order.index("trees")
    torus = _instance(load_topology("torus-4x4"), "allgather", 2**30)     # rings reach the bound: first
    order = [c.method for c in auto.plan(torus, _bound_us(torus.topology, torus.collective, 2**30))]
    assert order.index("multiring") < order.index("trees")


def test_auto_skips_multiring_once_a_program_beats_its_floor() -> None:
    result = synthesize("dgx-a100-2node", "allgather", 2**26, "auto")
    row = next(r for r in result.tried if r["method"] == "multiring")
    assert "skipped" in row and "no multiring program beats" in row["skipped"]
    assert result.time_us < floor_us(_instance(load_topology("dgx-a100-2node"), "allgather", 2**26))


def test_the_floor_counts_the_least_alpha_of_a_route_through_each_cut_link() -> None:
    from synth.synthesis.multiring import _least_cuts, _route_alpha_floor

    topology = _fabric("leaf-spine")      # 3 leaves of 4 ranks, 2 spines, 3 µs a link
    per_link = {(link.src, link.dst): a for link, a in zip(topology.links, _route_alpha_floor(topology))}
    leaf, spine = topology.node_id("leaf0"), topology.node_id("spine0")
    assert per_link[(0, leaf)] == pytest.approx(6.0)        # rank -> leaf -> rank
    assert per_link[(leaf, spine)] == pytest.approx(12.0)   # rank -> leaf -> spine -> leaf -> rank
    # the weakest cut is one rank's 25 GB/s link; each of its N - 1 messages pays at least 6 µs there
    assert _least_cuts(topology) == [(25.0, pytest.approx(25.0 * 6.0 * 1e3))] * 2
    inst = _instance(topology, "allgather", 2**20)
    n = topology.num_ranks
    bandwidth_only = (n - 1) / n * 2**20 / 25e3
    assert floor_us(inst) == pytest.approx(bandwidth_only + (n - 1) * 6.0)

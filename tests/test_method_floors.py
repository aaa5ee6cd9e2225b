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


@pytest.mark.parametrize("fabric, name", [("dgx-a100-2node", "allgather"), ("dgx-a100-2node", "allreduce"),
                                          ("ring-8", "reducescatter"), ("torus-4x4", "allgather"),
                                          ("hypercube-16", "allreduce"), ("rr", "allgather")])
def test_no_multiring_program_beats_its_floor(fabric: str, name: str) -> None:
    topology = gen.random_regular(10, 3, seed=4) if fabric == "rr" else load_topology(fabric)
    size = 2**26
    result = synthesize(topology, name, size, "multiring")
    floor = floor_us(_instance(topology, name, size))
    assert floor is not None and result.time_us >= floor * (1 - 1e-9)
    # the floor is a lower bound of multiring only: never below the collective's own bound
    assert floor >= _bound_us(topology, Collective(name, topology.num_ranks, 1, 0, False), size) * (1 - 1e-9)


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

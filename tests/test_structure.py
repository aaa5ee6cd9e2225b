"""Boxes read from the fabric (synth.topology.structure): built-ins, generated boxes, box-free fabrics,
relabelled ranks, and box alignment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.synthesis.base import Instance
from synth.topology import generators as gen
from synth.topology.builtin import builtin_names
from synth.topology.io import load_topology
from synth.topology.model import Link, Topology
from synth.topology.structure import aligned_boxes, boxes_of, hint_consistent, infer_boxes


def relabel(topology: Topology, perm: list[int], machines: bool = True) -> Topology:
    """``topology`` with rank ``r`` renamed ``perm[r]`` (switches keep their ids)."""
    def to(node: int) -> int:
        return perm[node] if topology.is_rank(node) else node

    links = tuple(sorted((Link(to(x.src), to(x.dst), x.bw, x.alpha) for x in topology.links),
                         key=lambda x: (x.src, x.dst)))
    boxes = tuple(tuple(perm[r] for r in box) for box in topology.machines) if machines else ()
    return Topology(topology.name, topology.num_ranks, links, topology.switches, boxes, features=topology.features)


def without_machines(topology: Topology) -> Topology:
    return Topology(topology.name, topology.num_ranks, topology.links, topology.switches, (),
                    features=topology.features)


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_boxes_match_their_hint(name):
    t = load_topology(name)
    assert hint_consistent(t)
    boxes = infer_boxes(t)
    if len(t.machines) >= 2:
        assert boxes == tuple(sorted(tuple(sorted(m)) for m in t.machines))
    else:   # one box of every rank, or no hint: no box structure to use
        assert boxes == ()
    assert infer_boxes(without_machines(t)) == boxes == boxes_of(t)


def test_builtin_box_counts():
    assert [len(b) for b in infer_boxes(load_topology("mi250-2node"))] == [16, 16]
    assert [len(b) for b in infer_boxes(load_topology("dgx-a100-4node"))] == [8, 8, 8, 8]
    assert [len(b) for b in infer_boxes(load_topology("ndv2-2node"))] == [8, 8]
    for name in ("mi250", "dgx1", "dgx2", "dgx-a100", "leaf-spine-4x4"):
        assert infer_boxes(load_topology(name)) == ()


@pytest.mark.parametrize("kwargs", [
    dict(boxes=2, per_box=8),
    dict(boxes=3, per_box=4, intra="mesh"),
    dict(boxes=4, per_box=8, nics_per_box=0, ib_switches=2),
    dict(boxes=2, per_box=8, nics_per_box=2, ib_switches=2),
    dict(boxes=3, per_box=2, intra="mesh", intra_bw=25.0, nic_bw=25.0),   # equal bandwidths: α decides
    dict(boxes=5, per_box=4, intra_bw=25.0, nic_bw=25.0, gpu_nic_alpha=0.0),
    dict(boxes=2, per_box=4, intra=[[0, 50, 0, 25], [50, 0, 25, 0], [0, 25, 0, 50], [25, 0, 50, 0]]),
])
def test_generated_boxes_found(kwargs):
    t = gen.boxes_behind_nics(**kwargs)
    assert infer_boxes(without_machines(t)) == t.machines
    assert hint_consistent(t)


@pytest.mark.parametrize("t", [gen.torus([4, 4]), gen.torus([3, 3, 3]), gen.mesh([5, 5]), gen.hypercube(4),
                               gen.ring(8), gen.fully_connected(8), gen.star(8), gen.line(6)],
                         ids=lambda t: t.name)
def test_no_boxes_on_uniform_fabrics(t):
    assert infer_boxes(t) == ()


def test_inconsistent_hint_is_reported_and_ignored():
    t = load_topology("mi250-2node")
    wrong = Topology(t.name, t.num_ranks, t.links, t.switches, (tuple(range(0, 32, 2)), tuple(range(1, 32, 2))))
    assert not hint_consistent(wrong)
    assert boxes_of(wrong) == boxes_of(t)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["mi250-2node", "dgx-a100-2node", "ndv2-2node", "dgx-a100-4node", "torus-4x4"]),
       st.randoms(use_true_random=False))
def test_relabelled_ranks_relabel_boxes(name, rnd):
    t = load_topology(name)
    perm = list(range(t.num_ranks))
    rnd.shuffle(perm)
    moved = relabel(t, perm, machines=False)
    expect = tuple(sorted(tuple(sorted(perm[r] for r in box)) for box in infer_boxes(t)))
    assert infer_boxes(moved) == expect


def test_aligned_boxes_map_links_onto_links():
    t = load_topology("mi250-2node")
    assert aligned_boxes(t) == infer_boxes(t)   # the ascending order is already an isomorphism
    perm = list(range(16)) + [16 + (i * 5) % 16 for i in range(16)]   # scramble box 1
    moved = relabel(t, perm, machines=False)
    boxes = aligned_boxes(moved)
    assert boxes is not None and boxes[0] == tuple(range(16))
    to = dict(zip(boxes[0], boxes[1]))
    for link in moved.links:
        if link.src < 16 and link.dst < 16:
            twin = moved.link(to[link.src], to[link.dst])
            assert twin is not None and (twin.bw, twin.alpha) == (link.bw, link.alpha)
    assert aligned_boxes(load_topology("torus-4x4")) is None


WITH_MACHINES = [n for n in builtin_names() if load_topology(n).machines]
FAST_AUTO = {"dgx-a100", "dgx2"}   # the default method takes seconds here; tens of seconds on the others


@pytest.mark.parametrize("name", builtin_names())
def test_machines_hint_changes_no_plan_and_no_bound(name):
    from synth.collectives import Collective
    from synth.lower_bounds import compute_bounds
    from synth.synthesis import auto

    t = load_topology(name)
    bare = without_machines(t)
    for coll in ("allgather", "allreduce", "alltoall"):
        c = Collective(coll, t.num_ranks)
        assert auto.plan(Instance(t, c, 64 << 20)) == auto.plan(Instance(bare, c, 64 << 20))
    assert compute_bounds(t, "allgather", 64 << 20) == compute_bounds(bare, "allgather", 64 << 20)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST_AUTO else pytest.mark.slow)
                                  for n in WITH_MACHINES])
def test_machines_hint_changes_no_result(name):
    from synth.pipeline import synthesize

    t = load_topology(name)
    hinted, bare = (synthesize(x, "allgather", 64 << 20) for x in (t, without_machines(t)))
    assert hinted.bound_us == bare.bound_us
    assert bare.time_us == pytest.approx(hinted.time_us, rel=0.005)


def test_boxes_of_different_kinds_on_one_network_are_each_found():
    # two A100 boxes (25 GB/s NICs) and two H100 boxes (50 GB/s NICs) on one IB switch: the first split,
    # at 25 GB/s, leaves the H100 boxes together; their own 50 GB/s NIC links split them
    from synth.topology.families import fabric_family

    spec = next(f for f in fabric_family() if f.name == "mixed-a100x2-h100x2")
    topology = spec.build()
    assert infer_boxes(without_machines(topology)) == tuple(sorted(tuple(sorted(m)) for m in topology.machines))


def test_no_method_or_bound_reads_the_machines_hint():
    # methods and bounds read boxes from the graph (boxes_of), so the hint cannot change a result; only
    # presentation (plots, `synth topology show`) and the topology stage itself read `topology.machines`
    import ast
    from pathlib import Path

    import synth

    root = Path(synth.__file__).parent
    readers = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("topology/", "cli/")) or rel == "plots.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "machines" and isinstance(node.value, ast.Name)
                    and node.value.id in ("topology", "topo", "fabric", "t")):
                readers.append(f"{rel}:{node.lineno}")
    assert not readers, readers

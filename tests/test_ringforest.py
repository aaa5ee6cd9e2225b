"""Ring forests (synth.synthesis.ringforest): mi250-2node allgather, reducescatter, allreduce within 2 %."""

from dataclasses import replace

import pytest

from synth.collectives import Collective
from synth.lower_bounds import compute_bounds
from synth.program.lower import lower
from synth.program.msccl_xml import check_runtime_limits
from synth.schedule import Schedule
from synth.simulation import simulate
from synth.synthesis import ringforest
from synth.synthesis.base import SynthOptions
from synth.synthesis.trees.method import or_rings
from synth.topology.io import load_topology
from synth.verification import verify

GIB = 1 << 30


@pytest.fixture(scope="module")
def mi250_2node():
    return load_topology("mi250-2node")


@pytest.fixture(scope="module")
def forest(mi250_2node):
    found = ringforest.build(mi250_2node)
    assert found is not None
    return found


def test_every_tree_spans_both_machines_parents_first(mi250_2node, forest):
    n = mi250_2node.num_ranks
    for g in range(n):
        for ring in range(6):
            for variant in ("full", "late") + (("trunc",) if ring < 4 else ()):
                edges, own, direct = forest.tree(g, ring, variant)
                have = {g}
                for parent, child in edges:
                    assert parent in have and child not in have, (g, ring, variant, parent, child)
                    have.add(child)
                assert have == set(range(n))
                assert edges[own] == (g, forest.mirror(g))
                assert (direct is not None) == (variant == "trunc")


def test_rings_fill_every_pair_and_respect_link_capacities(mi250_2node, forest):
    # six 50 GB/s rings: a 2-unit cycle twice each way and a 1-unit cycle once each way
    cap = {(link.src, link.dst): link.bw for link in mi250_2node.links}
    used: dict[tuple[int, int], float] = {}
    for links in forest.links:
        for hop in links:
            used[hop] = used.get(hop, 0.0) + 50.0
    assert all(used[hop] <= cap[hop] for hop in used)
    entered = {p: 0 for p in range(len(forest.pairs))}
    pair_of = {g: p for p, pair in enumerate(forest.pairs) for g in pair}
    for links in forest.links:
        for _, dst in links:
            entered[pair_of[dst]] += 1
    assert set(entered.values()) == {6}      # 300 GB/s into every pair: its whole xGMI cut


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "allreduce"])
def test_mi250_2node_within_two_percent_of_the_bound(mi250_2node, forest, name):
    coll = Collective(name, mi250_2node.num_ranks)
    schedule = ringforest.schedule(mi250_2node, coll, GIB, 256)
    assert schedule is not None and schedule.collective.name == name
    bound = compute_bounds(mi250_2node, coll, GIB).time_bound_us
    # whole chunks per ring: the forest's busiest link stays within 0.5 % of the cut bound (per phase)
    phases = 2 if name == "allreduce" else 1
    assert bound <= phases * schedule.notes["ring_forest_busiest_link_us"] <= bound * 1.005
    program = lower(schedule, name="rings")
    assert verify(program, schedule.collective).ok
    check_runtime_limits(program)
    simulated = simulate(program, mi250_2node, GIB, record_events=False).time_us
    assert simulated == pytest.approx(schedule.predicted_time_us, rel=1e-6)
    assert bound / simulated >= 0.98       # 0.9813; the ForestColl forest's schedule: 0.952


def test_trees_offers_the_ring_forest_as_an_alternative(mi250_2node):
    # the forests' schedule stays first; the pipeline times both and keeps the faster
    coll = Collective("allgather", mi250_2node.num_ranks)
    slow = Schedule(Collective("allgather", mi250_2node.num_ranks, 1), mi250_2node.name, (), method="trees",
                    size_bytes=float(GIB), predicted_time_us=3183.7)
    both = or_rings(mi250_2node, coll, GIB, SynthOptions(), slow)
    assert both.predicted_time_us == 3183.7 and len(both.alternatives) == 1
    ring = both.alternatives[0]
    assert ring.notes.get("ring_forest") and ring.predicted_time_us < 3183.7
    # --max-trees asks for ForestColl trees: no ring forest then
    assert or_rings(mi250_2node, coll, GIB, SynthOptions(max_trees=16), slow) is slow


@pytest.mark.parametrize("name", ["mi250", "dgx-a100-2node", "torus-4x4", "ndv2-2node"])
def test_other_fabrics_get_no_ring_forest(name):
    assert ringforest.build(load_topology(name)) is None


def test_machines_that_differ_get_no_ring_forest(mi250_2node):
    # one xGMI link of the second machine at half its bandwidth: the mirror ranks no longer match
    links = [replace(link, bw=link.bw / 2) if (link.src, link.dst) == (16, 17) else link for link in mi250_2node.links]
    assert ringforest.build(replace(mi250_2node, links=tuple(links))) is None


def test_only_allgather_reducescatter_and_allreduce(mi250_2node, forest):
    for name in ("broadcast", "reduce", "alltoall"):
        coll = Collective(name, mi250_2node.num_ranks)
        assert ringforest.schedule(mi250_2node, coll, GIB, 256, forest) is None

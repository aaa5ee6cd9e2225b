"""Composed forests (synth.synthesis.trees.composed): rails between boxes + one box's forest copied into every
box. Where they apply, that every tree spans the fabric on the right routes, the rate they report, and that the
pipeline turns them into verified programs for allgather, reducescatter and allreduce."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from synth.lower_bounds import compute_bounds
from synth.synthesis import registry
from synth.synthesis.base import MethodSpec
from synth.synthesis.packing import integer_fabric
from synth.synthesis.trees.composed import composed_planner, rail_boxes
from synth.synthesis.trees.pipeline import schedule_from_plans
from synth.topology import generators as gen
from synth.topology.families import dgx_a100_boxes, without_machines
from synth.topology.routes import rank_routes

GiB = 2**30
RING4 = ((0, 40, 0, 20), (40, 0, 20, 0), (0, 20, 0, 40), (20, 0, 40, 0))


def _ring_boxes(boxes: int = 3, nic: float = 10.0):
    """``boxes`` boxes of 4 ranks on an xGMI-like ring (40/20 GB/s), every rank straight to one IB switch."""
    return gen.boxes_on_ib([gen.Box(4, RING4, intra_alpha=0.5, nics=0, nic_bw=nic, ib_alpha=2.0)] * boxes, 1,
                           name=f"ring-boxes-{boxes}")


def test_applies_to_switchless_boxes_on_rails_with_or_without_machines():
    t = _ring_boxes()
    found = rail_boxes(t)
    assert found is not None and len(found[0]) == 3 and found[1].num_ranks == 4
    assert rail_boxes(without_machines(t)) is not None   # boxes read from the graph
    assert rail_boxes(dgx_a100_boxes(2)) is None          # a switch inside the box: railblocks' and trees' case
    assert rail_boxes(gen.torus([4, 4])) is None          # no boxes


@pytest.mark.parametrize("reverse", [False, True])
def test_every_tree_spans_the_fabric_on_its_rail_and_box_edges(reverse):
    t = _ring_boxes()
    boxes, _ = rail_boxes(t)
    position = {r: (b, g) for b, box in enumerate(boxes) for g, r in enumerate(box)}
    forest = composed_planner(t)(tuple(range(t.num_ranks)), reverse)
    per_root = Counter()
    for tree in forest.trees:
        children = [v for _, v in tree.edges]
        assert sorted(children + [tree.root]) == list(range(t.num_ranks))   # a spanning arborescence
        assert set(tree.depth) == set(range(t.num_ranks))                  # parents come before children
        for (u, v), routes in zip(tree.edges, tree.routes):
            assert sum(units for _, units in routes) == tree.mult
            if position[u][0] != position[v][0]:      # a rail: same position, through the IB switch
                assert u == tree.root and position[u][1] == position[v][1] and routes[0][0] == (t.num_nodes - 1,)
            else:
                assert routes[0][0] == ()
        per_root[tree.root] += tree.mult
    assert set(per_root.values()) == {forest.k}


def test_rate_is_the_busiest_links_load_and_optimal_where_the_rails_bind():
    t = _ring_boxes(3, nic=10.0)
    forest = composed_planner(t)(tuple(range(t.num_ranks)), False)
    fabric = integer_fabric(t)
    index = {(link.src, link.dst): i for i, link in enumerate(t.links)}
    load = np.zeros(len(t.links))
    for tree in forest.trees:
        for (u, v), routes in zip(tree.edges, tree.routes):
            path = (u, *routes[0][0], v)
            for a, z in zip(path, path[1:]):
                load[index[(a, z)]] += tree.mult
    assert forest.ratio == Fraction(float((load / (fabric.units * forest.k)).max())).limit_denominator(10**6)
    # the rails' cut binds (2 pieces per 10 GB/s NIC) and a ring box carries 3 pieces per position in time
    assert forest.ratio == forest.optimal
    bound = compute_bounds(t, "allgather", GiB).details["cut_bound_us"]   # bytes only, as the forest's rate
    assert forest.bandwidth_time_us(GiB / t.num_ranks) == pytest.approx(bound, rel=1e-6)


@pytest.fixture
def composed_method():
    def run(inst):
        return schedule_from_plans(inst.topology, inst.collective, inst.size_bytes, inst.options,
                                   composed_planner(inst.topology), "composed")
    registry.register(MethodSpec(name="composed-test", run=run, collectives=frozenset({"allgather", "reducescatter",
                                                                                      "allreduce"}),
                                 description="test", kind="heuristic"))
    yield "composed-test"
    registry.unregister("composed-test")


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_the_pipeline_makes_verified_programs_near_the_bound(composed_method, collective):
    from synth.pipeline import synthesize

    t = _ring_boxes(3, nic=10.0)
    result = synthesize(t, collective, GiB, composed_method)   # lowered, verified, simulated
    assert result.bound_us <= result.time_us < 1.05 * result.bound_us


def test_chunks_of_an_allreduce_are_counted_once_with_composed_forests():
    # --chunks counts the whole buffer's chunks; the composed alternative used to divide them by N a second time
    # ("--chunks 2: an allreduce on trees needs a multiple of its 12 ranks", exit 2)
    import synth

    topology = _ring_boxes(3)
    assert composed_planner(topology, 256) is not None
    result = synth.synthesize(topology, "allreduce", "64MiB", method="trees", chunks=24)
    assert result.program.chunk_factor == 24
    assert result.time_us >= result.bound_us


@pytest.mark.parametrize("gain, searches", [(-1.0, 2), (1.0, 1)])
def test_a_search_polish_finds_misjudged_is_searched_again_batch_scored(monkeypatch, gain, searches):
    # schedule_from_plans' rescoring: where polish times the shape found much faster than the search scored it,
    # the search runs again scored by the rescoring coalescings, and both schedules go to the pipeline
    from dataclasses import replace

    from synth.collectives import Collective
    from synth.synthesis.base import SynthOptions
    from synth.synthesis.timing import Coalescing
    from synth.synthesis.trees import pipeline, tuning
    from synth.synthesis.trees.timed import SEARCH_SCORING

    scorings = []
    real = pipeline.run_pipeline

    def spy(*args, **kwargs):
        scorings.append(args[6] if len(args) > 6 else kwargs.get("scoring", SEARCH_SCORING))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "run_pipeline", spy)
    monkeypatch.setattr(tuning, "TUNING", replace(tuning.TUNING, rescore_gain=gain))
    t = _ring_boxes(3, nic=10.0)
    collective = Collective("allgather", t.num_ranks, 1, 0, False)
    planner = composed_planner(t)
    batched = (Coalescing(batch=True),)
    plain = schedule_from_plans(t, collective, GiB, SynthOptions(), planner, "composed")
    assert scorings == [SEARCH_SCORING]
    scorings.clear()
    both = schedule_from_plans(t, collective, GiB, SynthOptions(), planner, "composed", rescoring=batched)
    assert scorings == [SEARCH_SCORING, batched][:searches]
    # the first search's schedule stays first; the second one's come after it as alternatives
    assert both.transfers == plain.transfers
    assert len(both.alternatives) > len(plain.alternatives) if searches == 2 else both == plain


def test_network_share_lifts_the_rate_where_the_box_links_bind():
    """Where a box's own links are the cut (20 GB/s NICs beside a 40/20 GB/s ring box) the box forest may also
    use the routes out of the box and back (composed.box_with_network): a better rate, every edge on a route the
    runtime takes (a direct link, or the ranks' route through the IB switch)."""
    t = _ring_boxes(3, nic=20.0)
    roots = tuple(range(t.num_ranks))
    plain = composed_planner(t)(roots, False)
    for reverse in (False, True):
        netted = composed_planner(t, network=True)(roots, reverse)
        assert netted.ratio < plain.ratio and float(netted.optimal / netted.ratio) > 0.99
        fabric_topology = t.reversed() if reverse else t
        routes = rank_routes(fabric_topology)
        through_network = 0
        for tree in netted.trees:
            for (u, v), pool in zip(tree.edges, tree.routes):
                assert sum(units for _, units in pool) == tree.mult
                for hops, _ in pool:
                    assert (u, *hops, v) == tuple(routes[(u, v)])
                    through_network += bool(hops) and u // 4 == v // 4
        assert through_network > 0
    assert composed_planner(t)(roots, False) == plain   # the plain composition is unchanged


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_network_composition_makes_verified_programs(collective):
    from synth.pipeline import synthesize

    t = _ring_boxes(3, nic=20.0)

    def run(inst):
        return schedule_from_plans(inst.topology, inst.collective, inst.size_bytes, inst.options,
                                   composed_planner(inst.topology, network=True), "composed")

    registry.register(MethodSpec(name="netted-test", run=run, collectives=frozenset({collective}),
                                 description="test", kind="heuristic"))
    try:
        result = synthesize(t, collective, GiB, "netted-test")   # lowered, verified, simulated
    finally:
        registry.unregister("netted-test")
    assert result.bound_us <= result.time_us < 1.06 * result.bound_us


def test_trees_keeps_the_network_composition_where_it_is_faster():
    """Method trees on that fabric: its forests of the whole fabric simulate at 0.979 of the bound, the rails plus
    a box forest on the box's links alone lose rate, the composition with the network's share wins."""
    from synth.pipeline import synthesize

    result = synthesize(_ring_boxes(3, nic=20.0), "allgather", GiB, "trees")
    assert result.schedule.notes.get("composed_boxes") and result.bound_us / result.time_us >= 0.985

"""Messages merged on heavy routes (synth.synthesis.trees.jobs.merge_heavy_messages): which routes are heavy, what
is merged and what is kept single, that every merged job still waits for the data it sends, and that method trees
searches an allgather's kept forests that way too and the pipeline turns them into verified programs."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from synth.collectives import Collective
from synth.schedule import Transfer
from synth.synthesis import registry
from synth.synthesis.base import MethodSpec
from synth.synthesis.trees.forest import plan_forest
from synth.synthesis.trees.jobs import (
    heavy_alphas,
    heavy_link_ends_late,
    heavy_routes,
    merge_heavy_messages,
    phase_jobs,
)
from synth.synthesis.trees.pipeline import schedule_from_plans
from synth.topology import generators as gen
from synth.topology.model import Link, Topology

GiB = 2**30
RING4 = ((0, 40, 0, 20), (40, 0, 20, 0), (0, 20, 0, 40), (20, 0, 40, 0))


def _ring_boxes(boxes: int = 3, nic: float = 10.0):
    """``boxes`` boxes of 4 ranks on an xGMI-like ring (α 0.5 µs), every rank straight to one IB switch (2 µs a
    hop: a route through it pays 4 µs)."""
    return gen.boxes_on_ib([gen.Box(4, RING4, intra_alpha=0.5, nics=0, nic_bw=nic, ib_alpha=2.0)] * boxes, 1,
                           name=f"ring-boxes-{boxes}")


def _allgather_jobs(t, messages: int = 8):
    n = t.num_ranks
    forest = plan_forest(t, tuple(range(n)), max_trees=2)
    chunks = 8 * forest.k   # per root: a chunk id per (root, slot)
    return phase_jobs(Collective("allgather", n, chunks, 0, False), forest, 0, chunks, messages)


def _streams(jobs, connections):
    """(tree, edge, connection) -> its jobs in chunk order, for jobs on ``connections``."""
    out = defaultdict(list)
    for i, connection in enumerate(zip(jobs.src, jobs.dst, jobs.route)):
        if connection in connections:
            out[(*jobs.key[i][-2:], connection)].append(i)
    return {k: sorted(v, key=lambda i: jobs.msg[i][0]) for k, v in out.items()}


def test_routes_through_the_network_are_heavy():
    t = _ring_boxes()
    jobs = _allgather_jobs(t)
    heavy = heavy_routes(jobs, t, 2.0)
    connections = set(zip(jobs.src, jobs.dst, jobs.route))
    assert heavy and heavy == {c for c in connections if c[2]}        # exactly the switch routes (4 µs vs 0.5)
    assert heavy_routes(jobs, t, 9.0) == set()                         # 4 µs is 8 times 0.5, not 9


def _three_classes() -> Topology:
    """Rank 0 -> 1 direct (0.5 µs), 1 -> 2 through an NVSwitch-like switch (node 3, 1.4 µs), 0 -> 2 through an
    IB-like switch (node 4, 4 µs)."""
    links = (Link(0, 1, 100, 0.5), Link(1, 3, 300, 0.7), Link(3, 2, 300, 0.7), Link(0, 4, 25, 2.0),
             Link(4, 2, 25, 2.0))
    return Topology("three-classes", 3, links, switches=("nv", "ib"))


@pytest.mark.parametrize("ratio, heavy", [(2.0, {(0, 2, (4,)): 4.0}), (2.85, {(0, 2, (4,)): 4.0}), (3.0, {})])
def test_only_the_costliest_class_above_a_gap_is_heavy(ratio, heavy):
    # 4 / 1.4 = 2.86 and 1.4 / 0.5 = 2.8: the NVSwitch routes are never heavy beside the network's
    connections = [(0, 1, ()), (1, 2, (3,)), (0, 2, (4,))]
    assert heavy_alphas(_three_classes(), connections, ratio) == heavy


@pytest.mark.parametrize("end, late", [(100.0, True), (98.5, True), (97.9, False)])
def test_merging_is_tried_only_where_a_heavy_link_ends_late(end, late):
    # one 4 µs message on the IB route ends at ``end`` of a 100 µs schedule: merging could save half its α
    t = _three_classes()
    transfers = [Transfer(0.0, 100.0, 0, 0, 1), Transfer(10.0, 100.0, 1, 1, 2, route=(3,)),
                 Transfer(50.0, end, 2, 0, 2, route=(4,))]
    assert heavy_link_ends_late(t, transfers, 100.0, 2.0) is late


@pytest.mark.parametrize("keep", [(1, 3), (2, 2), (0, 0)])
def test_each_streams_body_is_merged_in_pairs(keep):
    t = _ring_boxes()
    jobs = _allgather_jobs(t)
    heavy = heavy_routes(jobs, t, 2.0)
    merged = merge_heavy_messages(jobs, t, keep, 2.0)
    before, after = _streams(jobs, heavy), _streams(merged, heavy)
    assert before.keys() == after.keys()
    for key, old in before.items():
        new = after[key]
        body = len(old) - keep[0] - keep[1]
        assert len(new) == len(old) - max(body, 0) // 2
        old_msgs = [jobs.msg[i] for i in old]
        new_msgs = [merged.msg[i] for i in new]
        assert new_msgs[:keep[0]] == old_msgs[:keep[0]]                       # the first ones stay single
        if keep[1]:
            assert new_msgs[-keep[1]:] == old_msgs[-keep[1]:]                 # so do the last ones
        assert [c for m in new_msgs for c in m] == [c for m in old_msgs for c in m]   # same chunks, in order
        for m in new_msgs:
            assert list(m) == list(range(m[0], m[0] + len(m)))                 # a merged message is one step
    light = [(jobs.src[i], jobs.dst[i], jobs.msg[i]) for i in range(len(jobs.msg))
             if (jobs.src[i], jobs.dst[i], jobs.route[i]) not in heavy]
    assert light == [(merged.src[i], merged.dst[i], merged.msg[i]) for i in range(len(merged.msg))
                     if (merged.src[i], merged.dst[i], merged.route[i]) not in heavy]


def test_every_merged_job_waits_for_what_it_sends():
    t = _ring_boxes()
    jobs = merge_heavy_messages(_allgather_jobs(t), t, (1, 3), 2.0)
    moved = Counter()
    for i, chunks in enumerate(jobs.msg):
        assert all(d < len(jobs.msg) and d != i for d in jobs.deps[i])
        delivered = {c for d in jobs.deps[i] if jobs.dst[d] == jobs.src[i] for c in jobs.msg[d]}
        for c in chunks:
            assert c in delivered or _holds_at_start(jobs, jobs.src[i], c)
            moved[(jobs.dst[i], c)] += 1
    assert set(moved.values()) == {1}                                   # every rank gets every chunk once


def _holds_at_start(jobs, rank, chunk) -> bool:
    """The root of a chunk's tree sends it without waiting: nothing delivers it to that rank."""
    return all(not (jobs.dst[j] == rank and chunk in jobs.msg[j]) for j in range(len(jobs.msg)))


@pytest.fixture
def merged_method():
    def run(inst):
        n = inst.topology.num_ranks
        plans = {(tuple(range(n)), False): plan_forest(inst.topology, tuple(range(n)), max_trees=2)}
        return schedule_from_plans(inst.topology, inst.collective, inst.size_bytes, inst.options,
                                   lambda roots, reverse: plans[(roots, reverse)], "merged", merge=(1, 3))
    registry.register(MethodSpec(name="merged-test", run=run, collectives=frozenset({"allgather"}),
                                 description="test", kind="heuristic"))
    yield "merged-test"
    registry.unregister("merged-test")


def test_the_pipeline_makes_verified_programs(merged_method):
    from synth.pipeline import synthesize

    result = synthesize(_ring_boxes(3, nic=10.0), "allgather", GiB, merged_method)   # lowered, verified, simulated
    assert result.bound_us <= result.time_us < 1.08 * result.bound_us


@pytest.mark.parametrize("collective, searched", [("allgather", True), ("reducescatter", False)])
def test_trees_searches_an_allgathers_kept_forests_with_merged_messages(monkeypatch, collective, searched):
    from synth.pipeline import synthesize
    from synth.synthesis.trees import method, tuning

    merges = []
    real = method.schedule_from_plans

    def spy(*args, **kwargs):
        merges.append(kwargs.get("merge"))
        return real(*args, **kwargs)

    monkeypatch.setattr(method, "schedule_from_plans", spy)
    result = synthesize(_ring_boxes(3, nic=10.0), collective, 64 * 2**20, "trees")
    assert (tuning.TUNING.heavy_keep in merges) == searched
    assert result.time_us >= result.bound_us

"""Spanning-tree packings, the strongest partition, the allreduce partition bound, and method ``spantree``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import synth.synthesis.spantree as spantree_module
from synth.collectives import Collective
from synth.errors import SynthError
from synth.lower_bounds import compute_bounds
from synth.pipeline import synthesize
from synth.synthesis.base import Instance, SynthOptions
from synth.synthesis.spantree import allreduce_jobs, apportion, message_sizes, stagger_offsets
from synth.synthesis.spantree import synthesize as spantree
from synth.topology.generators import mesh, random_regular, torus
from synth.topology.io import load_topology
from synth.topology.model import Link, Topology
from synth.treepack import pack_spanning_trees, partition_strength, rank_graph, strongest_partition, tree_height
from synth.verification import verify

GIB = 2**30


def _partitions(items: list[int]):
    """Every set partition of ``items`` (Bell(8) = 4140 for eight ranks)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for smaller in _partitions(rest):
        for k in range(len(smaller)):
            yield smaller[:k] + [[first, *smaller[k]]] + smaller[k + 1:]
        yield [[first], *smaller]


def _brute_strength(graph) -> float:
    best = float("inf")
    for parts in _partitions(list(range(graph.num_ranks))):
        labels = np.zeros(graph.num_ranks, dtype=int)
        for k, part in enumerate(parts):
            labels[part] = k
        best = min(best, partition_strength(graph, labels))
    return best


def _weighted(n: int, edges: list[tuple[int, int, float]], name: str = "g") -> Topology:
    links = []
    for u, v, bw in edges:
        links += [Link(u, v, bw, 0.5), Link(v, u, bw, 0.5)]
    return Topology(name, n, tuple(links))


def _is_spanning_tree(n: int, graph, tree: tuple[int, ...]) -> bool:
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(graph.edges[e] for e in tree)
    return len(tree) == n - 1 and nx.is_connected(g)


def _check_packing(topology: Topology):
    packing = pack_spanning_trees(topology)
    graph = packing.graph
    load = np.zeros(len(graph.edges))
    for tree, weight in zip(packing.trees, packing.weights, strict=True):
        assert _is_spanning_tree(topology.num_ranks, graph, tree)
        assert weight > 0
        load[list(tree)] += weight
    assert np.all(load <= graph.capacity * (1 + 1e-7))   # the packing fits every edge
    return packing


@pytest.mark.parametrize("seed", range(6))
def test_strength_is_the_brute_force_minimum_over_all_partitions(seed):
    """The LP's rate, the partition read off its prices and the least c(δP)/(|P|-1) over every partition agree
    (Tutte / Nash-Williams), so the partition bound of lower_bounds is the packing's time."""
    degree = 3 if seed % 2 else 4
    topology = random_regular(8, degree, seed, bws=(25.0, 50.0, 100.0))
    packing = _check_packing(topology)
    brute = _brute_strength(packing.graph)
    assert packing.optimal
    assert packing.strength == pytest.approx(brute, rel=1e-7)
    assert partition_strength(packing.graph, strongest_partition(packing)) == pytest.approx(brute, rel=1e-7)
    # the packing kept for scheduling gives up at most SHALLOW_SLACK of the rate for shallower trees
    assert packing.rate == pytest.approx(brute, rel=2e-3)


def test_strength_of_a_mesh_and_a_torus():
    # an R x C mesh of capacity b: all its edges over N - 1 (singletons are the strongest partition)
    assert pack_spanning_trees(mesh([4, 4], bw=50.0)).strength == pytest.approx(24 * 50.0 / 15)
    assert pack_spanning_trees(torus([4, 4], bw=50.0)).strength == pytest.approx(32 * 50.0 / 15)


def test_a_bridge_binds():
    # two triangles joined by one thin edge: the strongest partition is the two triangles
    edges = [(0, 1, 100.0), (1, 2, 100.0), (0, 2, 100.0), (3, 4, 100.0), (4, 5, 100.0), (3, 5, 100.0), (2, 3, 10.0)]
    packing = _check_packing(_weighted(6, edges))
    labels = strongest_partition(packing)
    assert len(set(labels.tolist())) == 2 and packing.strength == pytest.approx(10.0)


def test_the_partition_bound_tightens_allreduce_and_is_never_above_the_packing():
    topology = random_regular(32, 4, 2, bws=(25.0, 50.0, 100.0))
    bounds = compute_bounds(topology, "allreduce", GIB)
    parts = bounds.details["components_us"]
    packing = pack_spanning_trees(topology)
    # the packing's reduce + broadcast time: the bound cannot exceed what a schedule achieves in the fluid limit
    assert bounds.bandwidth_bound_us == pytest.approx(GIB / (packing.strength * 1e3), rel=1e-9)
    assert parts["group_traffic_us"] > parts["traffic_us"] * 1.05      # tighter than the singletons


def test_fabrics_with_switches_or_one_way_links_have_no_rank_graph():
    assert rank_graph(load_topology("dgx-a100-2node")) is None
    one_way = Topology("oneway", 3, (Link(0, 1, 10.0), Link(1, 2, 10.0), Link(2, 0, 10.0)))
    assert rank_graph(one_way) is None


def test_apportion_gives_every_chunk_and_follows_the_weights():
    packing = pack_spanning_trees(mesh([4, 4], bw=50.0))
    counts = apportion(packing, 256)
    assert sum(counts) == 256 and min(counts) >= 0
    share = np.array(packing.weights) / packing.rate * 256
    assert np.all(np.abs(np.array(counts) - share) <= 1.0 + 1e-9)


def _run(topology: Topology, method: str, size: float = GIB):
    """The pipeline's result, re-verified here with the MSCCL limits on (the pipeline verifies before it times)."""
    result = synthesize(topology, "allreduce", size, method=method)
    assert verify(result.program, msccl_limits=True).ok
    return result


@pytest.mark.parametrize("make,least", [
    (lambda: mesh([4, 4], bw=50.0), 0.85),
    (lambda: random_regular(16, 4, 1, bws=(25.0, 50.0, 100.0)), 0.85),
    (lambda: random_regular(16, 3, 2, bws=(25.0, 50.0, 100.0)), 0.85),
])
def test_spantree_allreduce_verifies_and_beats_reduce_scatter_plus_allgather(make, least):
    topology = make()
    result = _run(topology, "spantree")
    assert result.bound_us / result.time_us >= least
    assert result.time_us < _run(topology, "multiring").time_us


def test_stagger_offsets_order_the_trees_by_height():
    packing = pack_spanning_trees(mesh([4, 4], bw=50.0))
    heights = [tree_height(packing.graph, tree) for tree in packing.trees]
    assert len(set(heights)) > 1
    deep, shallow = stagger_offsets(packing, "deepest"), stagger_offsets(packing, "shallowest")
    k = len(packing.trees)
    assert sorted(deep) == sorted(shallow) == [j / k for j in range(k)]
    for a in range(k):
        for b in range(k):
            if heights[a] > heights[b]:
                assert deep[a] < deep[b] and shallow[a] > shallow[b]
    with pytest.raises(ValueError):
        stagger_offsets(packing, "sideways")


def test_staggered_jobs_hold_each_tree_back_by_its_share_of_one_message():
    packing = pack_spanning_trees(mesh([4, 4], bw=50.0))
    counts = apportion(packing, 256)
    offsets = stagger_offsets(packing, "deepest")
    plain, held = allreduce_jobs(packing, counts, 2), allreduce_jobs(packing, counts, 2, offsets)
    assert (plain.msg, plain.src, plain.dst, plain.deps) == (held.msg, held.src, held.dst, held.deps)
    tree_of_chunk = np.repeat(np.arange(len(counts)), counts)
    for i, chunk in enumerate(plain.msg):
        t = int(tree_of_chunk[chunk[0]])
        shift = held.key[i][0] - plain.key[i][0]
        assert shift == pytest.approx(offsets[t] / len(message_sizes(counts[t], 2)))
        assert held.key[i][1:] == plain.key[i][1:]


def test_spantree_keeps_a_staggered_stream_where_it_is_faster(monkeypatch):
    """On a 4x4 mesh the deepest-first stagger beats the trees' streams in step (14006 against 14056 µs)."""
    instance = Instance(mesh([4, 4], bw=50.0), Collective("allreduce", 16), GIB, SynthOptions())
    staggered = spantree(instance)
    monkeypatch.setattr(spantree_module, "STAGGERS", ())
    in_step = spantree(instance)
    assert staggered.notes["stagger"] == "deepest" and in_step.notes["stagger"] is None
    assert staggered.predicted_time_us < in_step.predicted_time_us * 0.999


def test_spantree_sends_coarse_chunks_where_links_pay_microseconds_of_alpha(monkeypatch):
    """A 24-rank 5-regular fuzz graph whose links pay 0.5, 2 or 5 µs a message: 256 chunks (a few large messages
    per tree) beat 1024 and 4096, which were all spantree timed (0.792 of the bound)."""
    topology = load_topology("tests/fixtures/alpha-heavy-24.yaml")
    instance = Instance(topology, Collective("allreduce", 24), GIB, SynthOptions(runtime_chunks=True))
    bound = compute_bounds(topology, "allreduce", GIB).time_bound_us
    coarse = spantree(instance)
    monkeypatch.setattr(spantree_module, "CHUNK_COUNTS", (1024, 4096))
    fine = spantree(instance)
    assert coarse.collective.chunk_factor == 256 and fine.collective.chunk_factor != 256
    assert bound / coarse.predicted_time_us >= 0.85 > bound / fine.predicted_time_us


def test_spantree_refuses_switches_and_other_collectives():
    with pytest.raises(SynthError, match="without switches"):
        spantree(Instance(load_topology("dgx-a100-2node"), Collective("allreduce", 16), GIB, SynthOptions()))
    with pytest.raises(SynthError, match="supports allreduce"):
        spantree(Instance(mesh([2, 2]), Collective("allgather", 4), GIB, SynthOptions()))


def test_spantree_honours_chunks():
    topology = mesh([3, 3], bw=50.0)
    schedule = spantree(Instance(topology, Collective("allreduce", 9), GIB, SynthOptions(chunks=64)))
    assert schedule.collective.chunk_factor == 64
    # every chunk is reduced over N-1 edges and broadcast back over them
    assert len(schedule.transfers) == 64 * 2 * 8


@settings(max_examples=8, deadline=None)
@given(n=st.integers(3, 9), extra=st.integers(0, 6), seed=st.integers(0, 10_000))
def test_spantree_programs_verify_on_random_graphs(n, extra, seed):
    """A random spanning tree plus random extra edges, random bandwidths: the program verifies."""
    rng = np.random.default_rng(seed)
    edges = {(int(rng.integers(0, v)), v) for v in range(1, n)}
    for _ in range(extra):
        u, v = sorted(rng.choice(n, size=2, replace=False).tolist())
        edges.add((u, v))
    topology = _weighted(n, [(u, v, float(rng.choice([10.0, 25.0, 50.0]))) for u, v in sorted(edges)])
    result = _run(topology, "spantree", 64 * 2**20)
    assert result.time_us >= result.bound_us * (1 - 1e-9)


def test_partitions_helper_counts_bell_numbers():
    assert sum(1 for _ in _partitions(list(range(5)))) == 52
    assert len({tuple(map(tuple, p)) for p in _partitions(list(range(4)))}) == 15

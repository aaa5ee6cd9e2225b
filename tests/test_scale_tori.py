"""Trees at scale on tori: torus recognition, translated trees and their slot timing, rebalanced BFS trees.

``synth.synthesis.scale`` builds, for a row-major torus, one balanced shortest-path tree of rank 0 and
its translates (every link of a class carries the same number of pieces) with a slot per edge shared by
every translate, so no link carries two transfers at once; other switchless fabrics get load-aware BFS
trees rebalanced by best response. Here: the claims of its docstrings, checked on small instances.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import replace

import numpy as np
import pytest

from synth.collectives import Collective
from synth.errors import SynthError
from synth.lower_bounds import compute_bounds
from synth.program.lower import lower
from synth.schedule import TransferTable
from synth.simulation import simulate
from synth.synthesis import scale, trees
from synth.synthesis.base import Instance, SynthOptions
from synth.topology import generators
from synth.topology.model import Link, Topology
from synth.verification import verify

SIZE = 2**30


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _renumbered(topo: Topology, perm: list[int]) -> Topology:
    assert sorted(perm) == list(range(topo.num_ranks))
    links = tuple(Link(perm[lk.src], perm[lk.dst], lk.bw, lk.alpha) for lk in topo.links)
    return Topology(name=f"{topo.name}-renumbered", num_ranks=topo.num_ranks, links=links)


def _translated_trees(topo: Topology, dims: tuple[int, ...], roots: tuple[int, ...]):
    """(trees, slots) of ``scale.translated_tree_arrays``, a tree as (root, edges, routes), as the other
    constructions of synth.synthesis.scale give them."""
    parents, children, slots = scale.translated_tree_arrays(topo, dims, roots)
    return [(r, list(zip(p.tolist(), c.tolist())), [()] * len(p)) for r, p, c in zip(roots, parents, children)], slots


def _affine(topo: Topology, a: int, b: int = 3) -> Topology:
    """Ranks renumbered ``i -> (a*i + b) mod N`` (a bijection for ``a`` coprime to ``N``)."""
    n = topo.num_ranks
    assert math.gcd(a, n) == 1
    return _renumbered(topo, [(a * i + b) % n for i in range(n)])


def _bfs_dist(topo: Topology, root: int) -> dict[int, int]:
    dist = {root: 0}
    queue = deque([root])
    while queue:
        u = queue.popleft()
        for lk in topo.out_links[u]:
            if lk.dst not in dist:
                dist[lk.dst] = dist[u] + 1
                queue.append(lk.dst)
    return dist


def _assert_shortest_path_spanning_tree(topo: Topology, root: int, edges: list[tuple[int, int]]) -> None:
    n = topo.num_ranks
    assert len(edges) == n - 1
    children = [v for _, v in edges]
    assert sorted(children) == sorted(set(range(n)) - {root})        # every non-root rank: one parent
    dist = _bfs_dist(topo, root)
    reached = {root}
    for u, v in edges:
        assert u in reached, f"tree of {root}: parent {u} of {v} appears after it"
        assert topo.link(u, v) is not None, f"tree of {root}: no link {u}->{v}"
        assert dist[v] == dist[u] + 1, f"tree of {root}: {u}->{v} is not on a shortest path"
        reached.add(v)


def _link_loads(topo: Topology, forest) -> Counter:
    """Pieces per directed link, counted straight from the trees' edges."""
    load: Counter = Counter()
    for _, edges, routes in forest:
        assert all(route == () for route in routes)                    # switchless: direct links
        load.update(edges)
    assert set(load) <= {(lk.src, lk.dst) for lk in topo.links}
    return load


def _edge_class(u: int, v: int, dims: tuple[int, ...]) -> tuple[int, int]:
    """(dimension, sign) of the torus step ``u -> v``, from row-major coordinates."""
    cu = np.array(np.unravel_index(u, dims))
    cv = np.array(np.unravel_index(v, dims))
    diff = (cv - cu) % np.array(dims)
    moved = np.nonzero(diff)[0]
    assert len(moved) == 1, f"{u}->{v} is not one torus step"
    k = int(moved[0])
    assert diff[k] in (1, dims[k] - 1)
    return k, 1 if diff[k] == 1 else -1


def _ideal(n: int, dims) -> int:
    """The per-link load of the cut bound: N-1 pieces into each rank over 2·d links, rounded up."""
    return math.ceil((n - 1) / (2 * len(dims)))


# ---------------------------------------------------------------------------------------------
# torus_dims / _ordered_factors
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dims", [[4, 4], [3, 5], [3, 3, 3], [4, 6], [6, 4], [5]])
def test_torus_dims_recognises_generated_tori(dims):
    assert scale.torus_dims(generators.torus(dims)) == tuple(dims)
    # one bandwidth and α, whatever they are
    assert scale.torus_dims(generators.torus(dims, bw=12.5, alpha=3.0)) == tuple(dims)


def _one_link_slower(topo: Topology) -> Topology:
    links = list(topo.links)
    links[5] = replace(links[5], bw=links[5].bw / 2)
    return replace(topo, links=tuple(links))


def _one_link_slower_alpha(topo: Topology) -> Topology:
    links = list(topo.links)
    links[-1] = replace(links[-1], alpha=links[-1].alpha + 1.0)
    return replace(topo, links=tuple(links))


@pytest.mark.parametrize("make", [
    pytest.param(lambda: generators.mesh([4, 4]), id="mesh-4x4"),
    pytest.param(lambda: generators.mesh([3, 3, 3]), id="mesh-3x3x3"),
    pytest.param(lambda: generators.hypercube(4), id="hypercube-16"),   # isomorphic to a 4x4 torus
    pytest.param(lambda: generators.hypercube(6), id="hypercube-64"),
    pytest.param(lambda: _one_link_slower(generators.torus([4, 4])), id="torus-one-bw-changed"),
    pytest.param(lambda: _one_link_slower_alpha(generators.torus([3, 5])), id="torus-one-alpha-changed"),
    pytest.param(lambda: _affine(generators.torus([6, 6]), 7), id="torus-6x6-affine-renumbered"),
    pytest.param(lambda: _renumbered(generators.torus([4, 4]),
                                     np.random.default_rng(1).permutation(16).tolist()), id="torus-4x4-shuffled"),
    pytest.param(lambda: generators.torus([2, 4]), id="torus-2x4"),
    pytest.param(lambda: generators.torus([4, 2]), id="torus-4x2"),
    pytest.param(lambda: generators.torus([2, 3, 3]), id="torus-2x3x3"),
    pytest.param(lambda: generators.torus([2, 2, 4]), id="torus-2x2x4"),
])
def test_torus_dims_rejects_other_fabrics(make):
    topo = make()
    if topo.name.endswith("-renumbered"):   # the renumbering really changed the link set
        grid = generators.torus([6, 6] if topo.num_ranks == 36 else [4, 4])
        assert {(lk.src, lk.dst) for lk in topo.links} != {(lk.src, lk.dst) for lk in grid.links}
    assert scale.torus_dims(topo) is None


def test_torus_dims_rejects_switch_fabrics_and_empty_fabrics():
    assert scale.torus_dims(generators.star(8)) is None
    assert scale.torus_dims(Topology(name="empty", num_ranks=4, links=())) is None


def test_ordered_factors_skip_size_two_dimensions():
    assert scale._ordered_factors(36, 2) == [(3, 12), (4, 9), (6, 6), (9, 4), (12, 3)]
    assert scale._ordered_factors(27, 3) == [(3, 3, 3)]
    assert scale._ordered_factors(8, 3) == []            # 2x2x2 is left to the general path
    assert scale._ordered_factors(16, 2) == [(4, 4)]     # not (2, 8) nor (8, 2)
    assert scale._ordered_factors(7, 1) == [(7,)]
    assert scale._ordered_factors(2, 1) == []


# ---------------------------------------------------------------------------------------------
# translated_tree_arrays
# ---------------------------------------------------------------------------------------------
TRANSLATED = [(8, 8), (4, 4, 4), (3, 5)]


@pytest.mark.parametrize("dims", TRANSLATED)
def test_translated_trees_are_shortest_path_spanning_trees(dims):
    topo = generators.torus(list(dims))
    n = topo.num_ranks
    forest, slots = _translated_trees(topo, dims, tuple(range(n)))
    assert [r for r, _, _ in forest] == list(range(n))
    assert len(slots) == n - 1
    for root, edges, routes in forest:
        assert routes == [()] * (n - 1)
        _assert_shortest_path_spanning_tree(topo, root, edges)
    # every tree is the translate of tree 0, edge for edge (that is what lets them share the slots)
    coords = np.array(np.unravel_index(np.arange(n), dims)).T
    for root, edges, _ in forest:
        for (u0, v0), (u, v) in zip(forest[0][1], edges):
            assert np.array_equal((coords[u] - coords[u0]) % dims, coords[root])
            assert np.array_equal((coords[v] - coords[v0]) % dims, coords[root])


@pytest.mark.parametrize("dims", TRANSLATED)
def test_translated_trees_meet_the_cut_bound_load(dims):
    topo = generators.torus(list(dims))
    n = topo.num_ranks
    forest, _ = _translated_trees(topo, dims, tuple(range(n)))
    load = _link_loads(topo, forest)
    ideal = _ideal(n, dims)
    assert max(load.values()) == ideal
    assert len(load) == len(topo.links)                              # every link is used ...
    assert min(load.values()) >= math.floor((n - 1) / (2 * len(dims)))   # ... and evenly
    # every link of a class carries the same load: the class count of tree 0
    per_class = Counter(_edge_class(u, v, dims) for u, v in forest[0][1])
    for (u, v), x in load.items():
        assert x == per_class[_edge_class(u, v, dims)]
    ratio, unit = scale.achieved_ratio(topo, forest, reverse=False)
    assert (ratio, unit) == (ideal, 50)                           # default 50 GB/s per link: one unit
    assert scale.achieved_ratio(topo, forest, reverse=True)[0] == ideal


@pytest.mark.parametrize("dims", TRANSLATED + [(6, 6), (32, 32)])
def test_translated_slots_are_contention_free(dims):
    topo = generators.torus(list(dims))
    n = topo.num_ranks
    roots = tuple(range(n)) if n <= 64 else tuple(range(0, n, 97))
    forest, slots = _translated_trees(topo, dims, roots)
    edges0 = forest[0][1]
    classes = [_edge_class(u, v, dims) for u, v in edges0]
    # distinct within a class
    by_class: dict = {}
    for slot, cls in zip(slots, classes):
        assert slot not in by_class.setdefault(cls, set()), f"class {cls} has two edges in slot {slot}"
        by_class[cls].add(slot)
    # after the parent edge
    edge_into = {v: i for i, (_, v) in enumerate(edges0)}
    for i, (u, _) in enumerate(edges0):
        if u in edge_into:
            assert slots[i] > slots[edge_into[u]]
        else:
            assert u == 0 and slots[i] >= 0
    # makespan: at least the busiest class, at most a little over the cut bound's load
    ideal = _ideal(n, dims)
    n_slots = max(slots) + 1
    assert max(Counter(classes).values()) <= n_slots <= ideal + 2
    # translation invariance: in any slot, no directed link is used by two transfers of any trees
    used: dict[int, set] = {}
    for _, edges, _ in forest:
        for slot, edge in zip(slots, edges):
            assert edge not in used.setdefault(slot, set()), f"slot {slot}: link {edge} used twice"
            used[slot].add(edge)


@pytest.mark.parametrize("dims", [(3, 3), (5, 5), (7, 3), (5, 9)])
def test_translated_trees_balance_small_odd_tori(dims):
    topo = generators.torus(list(dims))
    n = topo.num_ranks
    forest, _ = _translated_trees(topo, dims, tuple(range(n)))
    assert max(_link_loads(topo, forest).values()) == _ideal(n, dims)


# ---------------------------------------------------------------------------------------------
# the large path in trees (synth.synthesis.trees.forest)
# ---------------------------------------------------------------------------------------------
def test_large_forest_dispatch(monkeypatch):
    monkeypatch.setattr(trees.tuning, "TUNING", replace(trees.tuning.TUNING, large_ranks=8))
    topo = generators.torus([6, 6])
    roots = tuple(range(36))
    for reverse in (False, True):
        forest = trees.plan_forest(topo, roots, reverse=reverse)
        assert forest.slots is not None and len(forest.slots) == 35
        assert forest.k == 1 and len(forest.trees) == 36 and forest.reversed == reverse
        assert forest.ratio == forest.optimal == 9 and forest.unit_GBps == 50
        assert all(t.mult == 1 and len(t.edges) == 35 for t in forest.trees)
    # a renumbered torus is not recognised: rebalanced BFS trees, no slots, still at the cut bound's load
    other = _affine(topo, 7)
    forest = trees.plan_forest(other, roots)
    assert forest.slots is None
    assert forest.ratio == 9
    for tree in forest.trees:
        _assert_shortest_path_spanning_tree(other, tree.root, list(tree.edges))
    # at the default threshold a 36-rank torus takes the exact packing path (no slots)
    monkeypatch.setattr(trees.tuning, "TUNING", replace(trees.tuning.TUNING, large_ranks=256))
    assert trees.plan_forest(topo, roots).slots is None


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "allreduce"])
def test_slot_timing_is_contention_free_in_simulation(monkeypatch, name):
    monkeypatch.setattr(trees.tuning, "TUNING", replace(trees.tuning.TUNING, large_ranks=8))
    calls = []
    real_slot_phase = trees.timed._slot_phase

    def spy(*args):
        found = real_slot_phase(*args)
        calls.append(None if found is None else len(found[0]))
        return found

    monkeypatch.setattr(trees.timed, "_slot_phase", spy)
    topo = generators.torus([6, 6])
    n = topo.num_ranks
    assert trees.plan_forest(topo, tuple(range(n))).slots is not None
    schedule = trees.synthesize(Instance(topo, Collective(name, n), SIZE, SynthOptions()))
    phases = 2 if name == "allreduce" else 1
    assert schedule.notes["messages_per_tree"] == 1 and schedule.notes["trees_per_root"] == [1] * phases
    assert calls and all(c == n * (n - 1) for c in calls)   # one message per tree edge, slot-timed

    # the predicted makespan is exactly (slots) x (α + piece / bw) per phase: 9 slots on a 6x6 torus
    link = topo.links[0]
    slot_us = link.alpha + SIZE / n / (link.bw * 1e3)
    assert schedule.predicted_time_us == pytest.approx(phases * 9 * slot_us, rel=1e-9)

    program = lower(schedule)
    assert verify(program).ok
    sim = simulate(program, topo, SIZE, record_events=False)
    assert sim.time_us == pytest.approx(schedule.predicted_time_us, rel=1e-6)   # no contention anywhere

    if name == "allreduce":
        bound = (compute_bounds(topo, Collective("reducescatter", n), SIZE).time_bound_us
                 + compute_bounds(topo, Collective("allgather", n), SIZE).time_bound_us)
        assert bound / sim.time_us >= 0.95
    else:
        bound = compute_bounds(topo, schedule.collective, SIZE).time_bound_us
        assert bound / sim.time_us >= 0.96


# ---------------------------------------------------------------------------------------------
# balanced_bfs_trees
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    pytest.param(lambda: _affine(generators.torus([6, 6]), 7), id="torus-6x6-renumbered"),
    pytest.param(lambda: _affine(generators.torus([8, 8]), 5), id="torus-8x8-renumbered"),
    pytest.param(lambda: _affine(generators.torus([4, 4, 4]), 5), id="torus-4x4x4-renumbered"),
    pytest.param(lambda: generators.hypercube(6), id="hypercube-64"),
])
def test_balanced_bfs_trees_rebalancing(make):
    topo = make()
    assert scale.torus_dims(topo) is None                         # the general path, not the translates
    n = topo.num_ranks
    roots = tuple(range(n))
    greedy = scale.balanced_bfs_trees(topo, roots, passes=0)
    balanced = scale.balanced_bfs_trees(topo, roots, passes=3)
    for forest in (greedy, balanced):
        assert [r for r, _, _ in forest] == list(roots)
        for root, edges, _ in forest:
            _assert_shortest_path_spanning_tree(topo, root, edges)
    greedy_max = max(_link_loads(topo, greedy).values())
    balanced_max = max(_link_loads(topo, balanced).values())
    assert scale.achieved_ratio(topo, balanced, reverse=False)[0] == balanced_max
    average = n * (n - 1) / len(topo.links)        # vertex-transitive: the cut bound's load
    assert balanced_max <= 1.05 * math.ceil(average)
    assert balanced_max == math.ceil(average)       # measured: the best response reaches it here
    assert balanced_max < greedy_max                # the passes remove the greedy's excess


def test_balanced_bfs_trees_subset_of_roots_and_errors():
    topo = _affine(generators.torus([6, 6]), 5)
    roots = (4, 17, 30)
    forest = scale.balanced_bfs_trees(topo, roots)
    assert [r for r, _, _ in forest] == list(roots)
    for root, edges, _ in forest:
        _assert_shortest_path_spanning_tree(topo, root, edges)
    greedy = scale.balanced_bfs_trees(topo, roots, passes=0)
    assert max(_link_loads(topo, forest).values()) <= max(_link_loads(topo, greedy).values())
    with pytest.raises(SynthError, match="switchless"):
        scale.balanced_bfs_trees(generators.star(4), (0,))
    split = Topology(name="split", num_ranks=4, links=(Link(0, 1, 50.0), Link(1, 0, 50.0),
                                                       Link(2, 3, 50.0), Link(3, 2, 50.0)))
    with pytest.raises(SynthError, match="cannot reach"):
        scale.balanced_bfs_trees(split, (0, 2))


@pytest.mark.parametrize(("name", "chunks", "messages"), [("allgather", 1, 1), ("allgather", 3, 1),
                                                          ("reducescatter", 2, 1), ("allreduce", 1, 1),
                                                          ("allgather", 2, None)])
def test_slot_phase_table_is_the_job_timing(monkeypatch, name, chunks, messages):
    """The columns built for translated trees are exactly what the job path (phase_jobs, slot_schedule,
    phase_transfers) makes of them: the same transfers, in the same order, at the same times; and where a tree
    carries several messages the job path times the phase."""
    monkeypatch.setattr(trees.tuning, "TUNING", replace(trees.tuning.TUNING, large_ranks=8))
    topo = generators.torus([6, 6])
    n = topo.num_ranks
    coll = Collective(name, n, chunks)
    chunk_bytes = coll.chunk_bytes(SIZE)
    offset = 0.0
    for phase, (roots, reverse) in enumerate(trees.pipeline.forest_phases(coll)):
        forest = trees.plan_forest(topo, roots, reverse=reverse)
        assert forest.slots is not None
        found = trees.timed._slot_phase(coll, forest, phase, chunks, messages, 0, topo, chunk_bytes, offset, True)
        jobs = trees.jobs.phase_jobs(coll, forest, phase, chunks, messages)
        timed, makespan, _ = trees.timed._timed_phase(jobs, forest, topo, chunk_bytes, offset, coll.is_reduction,
                                                      channel=phase)
        if messages is None:    # a message per chunk: not one slot per edge
            assert found is None
            continue
        table, table_makespan = found
        assert isinstance(table, TransferTable) and len(table) == n * (n - 1) * chunks
        assert table_makespan == makespan and table == timed and list(table) == timed
        assert bool(table.reduce.any()) == (reverse and coll.is_reduction)
        assert (table.group >= 0).all() == (chunks > 1)
        offset += makespan


@pytest.mark.parametrize("dims", [(4, 4), (5, 3), (3, 3, 4)])
def test_the_ratio_of_translated_tree_arrays_is_that_of_their_trees(dims):
    """The array form the forest keeps gives the ratio its trees give, counted link by link."""
    topo = generators.torus(list(dims))
    roots = tuple(range(topo.num_ranks))
    parents, children, _ = scale.translated_tree_arrays(topo, dims, roots)
    trees_, _ = _translated_trees(topo, dims, roots)
    for reverse in (False, True):
        assert scale.direct_ratio(topo, parents, children, reverse) == scale.achieved_ratio(topo, trees_, reverse)


def test_pair_index_finds_links_like_a_dict_of_pairs():
    from synth.arrays import pair_index

    tails, heads = [0, 1, 2, 0, 3], [1, 2, 0, 1, 0]          # links 0 and 3 are parallel: the last one counts
    index = {(a, b): i for i, (a, b) in enumerate(zip(tails, heads))}
    queries = [(0, 1), (1, 2), (2, 0), (3, 0), (1, 0), (5, 1), (-1, 0), (0, 7)]
    found = pair_index(tails, heads, [q[0] for q in queries], [q[1] for q in queries]).tolist()
    assert found == [index.get(q, -1) for q in queries]
    assert pair_index([], [], [0], [1]).tolist() == [-1]

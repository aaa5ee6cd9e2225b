"""Ring packings: rate-optimal rings by cut, CP-SAT circuits and column generation."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from synth.synthesis.ringpack import best_rings, integral_rings, pack_rings, ring_rate_bound
from synth.topology.generators import torus
from synth.topology.io import load_topology


def _link_loads(topology, packing):
    """Per directed link, the GB/s the rings' routes put on it (hop by hop, switches included)."""
    from synth.topology.routes import rank_routes

    routes = rank_routes(topology)
    load: dict[tuple[int, int], float] = {}
    for order, rate in zip(packing.orders, packing.rates, strict=True):
        assert sorted(order) == list(range(topology.num_ranks))      # a ring visits every rank once
        for k, a in enumerate(order):
            path = routes[(a, order[(k + 1) % len(order)])]
            for u, v in zip(path[:-1], path[1:], strict=False):
                load[(u, v)] = load.get((u, v), 0.0) + rate
    return load


def _fits(topology, packing):
    bw = {(lk.src, lk.dst): lk.bw for lk in topology.links}
    return all(load <= bw[link] * (1 + 1e-9) for link, load in _link_loads(topology, packing).items())


@pytest.mark.parametrize("dims", [(4, 4), (8, 8), (3, 3, 3), (4, 6)])
def test_tori_decompose_into_edge_disjoint_rings_at_the_per_rank_rate(dims):
    topology = torus(dims, bw=50.0)
    packing = best_rings(topology)
    degree = 2 * len(dims)
    assert packing is not None and packing.optimal
    assert packing.rate == pytest.approx(50.0 * degree)     # every in-link of every rank is full
    assert len(packing.orders) == degree
    assert _fits(topology, packing)


def test_switch_boxes_reach_the_nic_cut():
    topology = load_topology("dgx-a100-2node").circuit_capacities()
    packing = best_rings(topology)
    assert ring_rate_bound(topology) == pytest.approx(200.0)    # 8 NICs of 25 GB/s between the boxes
    assert packing.rate == pytest.approx(200.0) and packing.optimal
    assert _fits(topology, packing)


def test_lp_never_exceeds_the_cut_and_integral_packing_fits():
    topology = load_topology("hypercube-16")
    lp = pack_rings(topology)
    assert lp.rate <= ring_rate_bound(topology) * (1 + 1e-9)
    assert _fits(topology, lp)
    packed = integral_rings(topology, lp.rate, 4)
    assert packed is not None and _fits(topology, packed)
    assert packed.rate == pytest.approx(200.0)


def test_an_impossible_rate_gives_no_integral_packing():
    topology = torus((4, 4), bw=50.0)
    assert integral_rings(topology, 250.0, 5) is None      # 5 rings cannot share 4 in-links of each rank


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_random_regular_graphs_give_fitting_rings_within_the_cut(seed):
    from synth.topology.generators import from_matrix

    rng = np.random.default_rng(seed)
    graph = nx.random_regular_graph(3, 10, seed=seed)
    assume(nx.is_connected(graph))    # seed 1028 gives two components: no fabric
    bw = np.zeros((10, 10))
    for a, b in graph.edges:
        bw[a, b] = bw[b, a] = float(rng.choice([1, 2, 4]))          # 25, 50 or 100 GB/s
    topology = from_matrix(bw.tolist(), bw_per_link=25.0, name=f"rr3-{seed}")
    packing = best_rings(topology)
    if packing is None:      # a cubic graph need not have a Hamiltonian cycle
        return
    assert _fits(topology, packing)
    assert packing.rate <= ring_rate_bound(topology) * (1 + 1e-9)
    assert best_rings(topology) == packing                     # deterministic


def test_both_ways_rings_are_circuits_and_their_reverses():
    topology = torus((4, 4, 4), bw=50.0)
    packing = integral_rings(topology, 300.0, 6, both_ways=True)
    assert packing is not None and _fits(topology, packing)
    reversed_orders = {tuple(reversed(o[1:])) for o in packing.orders}
    assert {o[1:] for o in packing.orders} == reversed_orders       # each ring runs with its reverse

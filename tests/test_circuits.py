"""Rounds of disjoint circuits (synth.synthesis.circuits) and the alltoall they schedule behind switches."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.synthesis.circuits import chains_of, circuit_rounds, edge_colouring, first_fit, ordered_schedule


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=60))
def test_edge_colouring_is_proper_with_max_degree_colours(edges):
    colours = edge_colouring(edges)
    assert len(colours) == len(edges)
    for side in (0, 1):
        seen = Counter((edge[side], c) for edge, c in zip(edges, colours))
        assert max(seen.values(), default=1) == 1          # no two edges of one colour meet at a node
    degree = max(Counter(e[0] for e in edges).most_common(1)[0][1] if edges else 0,
                 Counter(e[1] for e in edges).most_common(1)[0][1] if edges else 0)
    assert (max(colours) + 1 if colours else 0) == degree   # König: Δ colours


def test_edge_colouring_needs_the_alternating_path_swap():
    # first-fit would give (0,0) colour 0, (1,1) colour 0, (0,1) colour 1, then (1,0) needs a swap
    edges = [(0, 0), (1, 1), (0, 1), (1, 2), (2, 0), (2, 2)]
    colours = edge_colouring(edges)
    assert max(colours) + 1 == 2
    for side in (0, 1):
        assert len({(e[side], c) for e, c in zip(edges, colours)}) == len(edges)


def test_chains_follow_the_dependencies():
    deps = [(), (0,), (), (1,), (2,)]
    assert chains_of(deps) == [[0, 1, 3], [2, 4]]


def test_circuit_rounds_colour_bottlenecks_and_place_relays_around_them():
    # two paths: 0 -> relay -> switch hop (bottleneck, slow), and one direct switch hop
    links = [(10,), (1, 2, 3), (4, 5, 6)]
    switched = [False, True, True]
    duration = np.array([1.0, 5.0, 5.0])
    rounds = circuit_rounds([[0, 1], [2]], links, switched, duration, [(0,)] * 3)
    assert rounds[1] == 0 and rounds[0] == -1 and rounds[2] == 0   # different ports: one round


def test_circuit_rounds_beyond_a_crossbar_go_greedily_in_key_order():
    # a spine link (9) carries circuits between different sending and receiving ports: not bipartite
    links = [(1, 9, 3), (2, 9, 4), (5, 8, 6)]
    keys = [(0, 2), (0, 1), (0, 0)]
    rounds = circuit_rounds([[0], [1], [2]], links, [True] * 3, np.ones(3), keys)
    assert rounds == [1, 0, 0]            # job 1 comes first by key and takes round 0 on the spine


def test_first_fit_takes_the_first_round_free_on_every_link():
    assert first_fit([(1, 2), (2, 3), (3, 4), (1, 4), (5,)]) == [0, 1, 0, 1, 0]


def test_circuit_rounds_put_circuits_that_meet_at_a_port_in_different_rounds():
    links = [(1, 7, 3), (1, 7, 4), (2, 8, 3)]      # 0 and 1 share the sending port, 0 and 2 the receiving
    rounds = circuit_rounds([[0], [1], [2]], links, [True] * 3, np.ones(3), [(0,)] * 3)
    assert rounds[0] != rounds[1] and rounds[0] != rounds[2]
    assert max(rounds) == 1


def test_ordered_schedule_keeps_each_links_order_and_waits_for_inputs():
    keys = [(0, 1), (0, 0), (0, 2)]
    deps = [(), (), (0,)]
    links = [(0,), (0,), (1,)]
    order, start, end = ordered_schedule(keys, deps, links, np.array([2.0, 3.0, 1.0]), 2)
    assert order == [1, 0, 2]
    assert (start.tolist(), end.tolist()) == ([3.0, 0.0, 5.0], [5.0, 3.0, 6.0])


def test_lp_alltoall_runs_switch_traffic_in_rounds():
    """dgx-a100-2node: behind the IB switches the concurrent flow's paths in rounds of disjoint circuits
    come within 2 % of the bound at 1 GiB (list-scheduled: 0.838), and the kept program is the rounds
    one: verified, and simulated within 2 % of its plan (mi250-2node: tests/test_lp.py)."""
    from synth.pipeline import synthesize

    result = synthesize("dgx-a100-2node", "alltoall", 1 << 30, "lp")
    assert result.schedule.notes["priority"] == "rounds"
    assert result.bound_us / result.time_us >= 0.98
    assert result.time_us <= result.schedule.predicted_time_us * 1.02

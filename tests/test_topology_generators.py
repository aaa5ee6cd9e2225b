"""Parametric generators: structure, degrees, bandwidths, diameters, parameter errors."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from synth.errors import SynthError
from synth.topology import generators as gen
from synth.topology.io import hop_diameter, parse_topology, topology_to_dict


def undirected_pairs(t):
    return {(min(link.src, link.dst), max(link.src, link.dst)) for link in t.links}


def assert_symmetric(t):
    for link in t.links:
        back = t.link(link.dst, link.src)
        assert back is not None and back.bw == link.bw and back.alpha == link.alpha


def nx_diameter(t) -> int:
    lengths = dict(nx.all_pairs_shortest_path_length(t.to_networkx()))
    return max(lengths[a][b] for a in t.ranks for b in t.ranks)


def test_ring_line_fully_connected():
    r = gen.ring(8)
    assert undirected_pairs(r) == {(i, (i + 1) % 8) if i < 7 else (0, 7) for i in range(8)}
    assert_symmetric(r)
    assert {(link.bw, link.alpha) for link in r.links} == {(50.0, 0.5)}
    assert hop_diameter(r) == 4
    uni = gen.ring(5, bidirectional=False)
    assert {(link.src, link.dst) for link in uni.links} == {(i, (i + 1) % 5) for i in range(5)}
    assert hop_diameter(uni) == 4
    assert len(gen.ring(2).links) == 2  # one pair, not a doubled link
    assert gen.ring(2).link(0, 1).bw == 50
    ln = gen.line(5, 10, 1)
    assert undirected_pairs(ln) == {(i, i + 1) for i in range(4)} and hop_diameter(ln) == 4
    fc = gen.fully_connected(6, 3)
    assert undirected_pairs(fc) == set(itertools.combinations(range(6), 2)) and hop_diameter(fc) == 1


@pytest.mark.parametrize("dims", [[4], [4, 4], [3, 3, 3], [2, 3], [2, 2, 2, 2], [5, 1, 3]])
def test_torus_and_mesh_degrees_and_diameters(dims):
    t, m = gen.torus(dims), gen.mesh(dims)
    n = 1
    for d in dims:
        n *= d
    assert t.num_ranks == m.num_ranks == n
    assert_symmetric(t)
    # torus degree: 2 per dimension of size > 2, 1 for size 2, 0 for size 1
    degree = sum(2 if d > 2 else (1 if d == 2 else 0) for d in dims)
    assert all(len(t.out_links[r]) == degree for r in t.ranks)
    assert hop_diameter(t) == sum(d // 2 for d in dims) == nx_diameter(t)
    assert hop_diameter(m) == sum(d - 1 for d in dims) == nx_diameter(m)
    assert len(undirected_pairs(m)) == sum((d - 1) * n // d for d in dims)


def test_torus_row_major_numbering():
    t = gen.torus([3, 4])  # rank = 4 * row + col
    assert t.link(0, 1) and t.link(0, 4) and t.link(0, 3) and t.link(0, 8)
    assert t.link(0, 5) is None


def test_hypercube():
    h = gen.hypercube(4)
    assert h.num_ranks == 16 and all(len(h.out_links[r]) == 4 for r in h.ranks)
    assert all(bin(link.src ^ link.dst).count("1") == 1 for link in h.links)
    assert hop_diameter(h) == 4
    assert gen.hypercube(0).num_ranks == 1


def test_star_and_leaf_spine():
    s = gen.star(6, 100, 0.2, switch="nvs")
    assert s.switches == ("nvs",) and hop_diameter(s) == 2
    assert all(s.out_bw(r) == 100 and s.in_bw(r) == 100 for r in s.ranks)
    ls = gen.leaf_spine(4, 3, 2)
    assert ls.num_ranks == 12 and ls.switches == ("leaf0", "leaf1", "leaf2", "leaf3", "spine0", "spine1")
    assert ls.link(5, ls.node_id("leaf1")) is not None
    up = ls.link(ls.node_id("leaf0"), ls.node_id("spine1"))
    assert up.bw == 50 * 3 / 2  # non-blocking default
    assert hop_diameter(ls) == 4  # rank -> leaf -> spine -> leaf -> rank
    assert hop_diameter(gen.leaf_spine(1, 4, 0)) == 2
    assert gen.fat_tree is gen.leaf_spine


def test_boxes_behind_nics_nvswitch_rails():
    t = gen.boxes_behind_nics(2, 8, intra_bw=300, intra_alpha=0.7, nic_bw=25, ib_switches=2, ib_alpha=2)
    assert t.num_ranks == 16 and t.machines == (tuple(range(8)), tuple(range(8, 16)))
    assert len(t.switches) == 2 + 16 + 2
    for r in t.ranks:
        box, i = divmod(r, 8)
        nic = t.node_id(f"b{box}.nic{i}")
        assert t.link(r, nic).bw == 25 and t.link(r, nic).alpha == 0
        assert t.link(nic, t.node_id(f"ib{i % 2}")).alpha == 2
        assert t.link(r, t.node_id(f"b{box}.nvswitch")).bw == 300
    assert hop_diameter(t) == 6


def test_boxes_mesh_matrix_and_direct():
    t = gen.boxes_behind_nics(3, 4, intra="mesh", nics_per_box=0, nic_bw=16)
    ib = t.node_id("ib0")
    assert all(t.link(r, ib).bw == 16 for r in t.ranks)
    assert t.link(0, 3).bw == 50 and t.link(0, 4) is None
    matrix = [[0, 10, 0], [10, 0, 20], [0, 20, 0]]
    m = gen.boxes_behind_nics(2, 3, intra=matrix, nics_per_box=1)
    assert m.link(1, 2).bw == 20 and m.link(0, 2) is None and m.link(3, 4).bw == 10
    assert m.link(0, m.node_id("b0.nic0")) and m.link(2, m.node_id("b0.nic0"))


def test_from_matrix():
    t = gen.from_matrix([[0, 2], [2, 0]], 25, 0.7, name="pair")
    assert t.link(0, 1).bw == 50 and t.name == "pair"
    with pytest.raises(SynthError, match="symmetric"):
        gen.from_matrix([[0, 1], [2, 0]])


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: gen.ring(0), "ring size"),
        (lambda: gen.ring(4, bw=0), "bw must be a positive"),
        (lambda: gen.ring(4, alpha=-1), "alpha"),
        (lambda: gen.torus([]), "at least one dimension"),
        (lambda: gen.mesh([3, 0]), "each dimension"),
        (lambda: gen.hypercube(-1), "hypercube dimension"),
        (lambda: gen.leaf_spine(2, 2, 0), "spines"),
        (lambda: gen.boxes_behind_nics(2, 4, nics_per_box=6), "cannot exceed"),
        (lambda: gen.boxes_behind_nics(2, 4, nics_per_box=1, ib_switches=2), "isolated"),
        (lambda: gen.boxes_behind_nics(2, 4, intra="torus"), "intra-box fabric"),
        (lambda: gen.line(3, bw=float("inf")), "finite"),
    ],
)
def test_bad_parameters_raise_synth_error(call, needle):
    with pytest.raises(SynthError, match=needle):
        call()


@pytest.mark.parametrize(
    "topology",
    [gen.ring(7), gen.line(3), gen.fully_connected(5), gen.mesh([2, 3, 2]), gen.torus([3, 5]), gen.hypercube(3),
     gen.star(4), gen.leaf_spine(2, 3, 3), gen.boxes_behind_nics(2, 2, nics_per_box=0)],
    ids=lambda t: t.name,
)
def test_generated_topologies_are_canonical(topology):
    assert list(topology.links) == sorted(topology.links, key=lambda x: (x.src, x.dst))
    assert parse_topology(topology_to_dict(topology), "x") == topology

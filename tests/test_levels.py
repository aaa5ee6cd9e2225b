"""levels: a short allreduce, allgather or reducescatter by levels of route α (synth/synthesis/levels.py)."""

from __future__ import annotations

import pytest

from synth.errors import SynthError
from synth.pipeline import synthesize
from synth.synthesis.levels import alpha_levels, binomial_pairs
from synth.topology import generators as gen
from synth.topology.model import Link, Topology
from synth.topology.routes import rank_routes
from synth.verification import verify

KiB = 2**10


def _two_sites(haul_alpha: float = 500.0) -> Topology:
    """Two sites of two boxes of four ranks: ranks on a box switch (α 0.1), each also on its site's switch
    (α 1), the two site switches joined by one 100 GB/s link of ``haul_alpha``."""
    n = 16
    box = [n + b for b in range(4)]          # box switches 16..19
    site = [n + 4, n + 5]                    # site switches 20, 21
    links = []
    for r in range(n):
        links += [Link(r, box[r // 4], 300.0, 0.1), Link(r, site[r // 8], 50.0, 1.0)]
    links.append(Link(site[0], site[1], 100.0, haul_alpha))
    links += [Link(lk.dst, lk.src, lk.bw, lk.alpha) for lk in list(links)]
    return Topology("two-sites", n, tuple(links), ("box0", "box1", "box2", "box3", "site0", "site1"))


def test_clusters_nest_by_route_alpha():
    t = _two_sites()
    assert alpha_levels(t, rank_routes(t)) == (((0, 1, 2, 3), (4, 5, 6, 7)), ((8, 9, 10, 11), (12, 13, 14, 15)))
    # one switch: one level of single ranks
    star = gen.star(5)
    assert alpha_levels(star, rank_routes(star)) == (0, 1, 2, 3, 4)


def test_binomial_rounds():
    assert binomial_pairs(5) == [[(1, 0), (3, 2)], [(2, 0)], [(4, 0)]]
    assert binomial_pairs(1) == []


def test_the_costly_route_is_crossed_once_each_way():
    # a ring crosses the 500 µs link in three rounds, doubling and trees more often; reducing each site first
    # crosses it once each way, at the same time
    t = _two_sites()
    result = synthesize(t, "allreduce", 64 * KiB, "levels")
    assert verify(result.program).ok
    haul = [x for x in result.schedule.transfers if (x.src < 8) != (x.dst < 8)]
    assert len(haul) == 2 and {(x.src < 8) for x in haul} == {True, False}
    assert result.time_us < 520.0
    assert result.time_us < 0.5 * synthesize(t, "allreduce", 64 * KiB, "ring").time_us


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter"])
def test_auto_takes_it_where_it_is_fastest(collective):
    result = synthesize(_two_sites(), collective, 64 * KiB)
    assert result.method == "levels" and result.time_us < 520.0


def test_refusals():
    with pytest.raises(SynthError, match="'levels' does not support broadcast"):
        synthesize(_two_sites(), "broadcast", 64 * KiB, "levels")
    # a switchless ring of six: the binomial tree's leaders 2 -> 0 share no link
    with pytest.raises(SynthError, match="levels does not apply"):
        synthesize(gen.ring(6), "allreduce", 64 * KiB, "levels")


def test_leaders_are_ranks_the_other_clusters_can_reach():
    # rank 0 has lost its NIC: box 0's leader must be a GPU whose rail reaches box 1's leader (the lowest rank, the
    # first choice, shares no route with box 1)
    from synth.topology.degrade import FabricEdits, degrade_topology
    from synth.topology.io import load_topology

    t = degrade_topology(load_topology("dgx-a100-2node"), FabricEdits(exclude_links=(("b0.nic0", "ib0"),))).topology
    result = synthesize(t, "allreduce", 64 * KiB, "levels")
    assert verify(result.program).ok
    crossing = {(x.src, x.dst) for x in result.schedule.transfers if (x.src < 8) != (x.dst < 8)}
    assert crossing and all(0 not in pair for pair in crossing)


def test_a_reducescatter_is_the_allgathers_mirror_and_needs_a_reversible_fabric():
    t = _two_sites()
    gathered = synthesize(t, "allgather", 64 * KiB, "levels")
    scattered = synthesize(t, "reducescatter", 64 * KiB, "levels")
    assert verify(scattered.program).ok and scattered.time_us == pytest.approx(gathered.time_us, rel=0.02)
    one_way = Topology("one-way", 3, (Link(0, 3, 10.0, 1.0), Link(3, 1, 10.0, 1.0), Link(1, 3, 10.0, 1.0),
                                      Link(3, 2, 10.0, 1.0), Link(2, 3, 10.0, 1.0), Link(3, 0, 5.0, 1.0)), ("s",))
    with pytest.raises(SynthError, match="equal to its reverse"):
        synthesize(one_way, "reducescatter", 64 * KiB, "levels")

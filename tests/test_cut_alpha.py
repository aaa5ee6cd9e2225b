"""The cut bounds charged the α their links pay (synth.lower_bounds.cut_alpha_us, docs/cost-model.md): exact where
the optimum is known, the water filling by hand, and no verified program below them on generated fabrics."""

from __future__ import annotations

import numpy as np
import pytest

from synth.lower_bounds import compute_bounds, cut_alpha_us, route_alpha_floor
from synth.topology import generators as gen
from synth.topology.model import Link, Topology

GiB = 2**30
MiB = 2**20


def _pair(bw: float, alpha: float) -> Topology:
    return Topology("pair", 2, (Link(0, 1, bw, alpha), Link(1, 0, bw, alpha)), ())


@pytest.mark.parametrize("alpha", [0.5, 20.0])
def test_two_ranks_the_bound_is_the_optimum(alpha):
    # each rank sends its half once over the one link: α + M / b, which the ring's one message per link takes
    from synth.pipeline import synthesize

    t = _pair(10.0, alpha)
    bound = compute_bounds(t, "allgather", 64 * MiB)
    assert bound.details["cut_bound_us"] == pytest.approx(32 * MiB / 10e3)
    assert bound.time_bound_us == pytest.approx(alpha + 32 * MiB / 10e3)
    assert synthesize(t, "allgather", 64 * MiB, "ring").time_us == pytest.approx(bound.time_bound_us)


def test_the_floor_counts_every_hop_a_route_through_the_link_takes():
    # rank -> leaf (α 1) -> spine (α 5) -> leaf (α 5) -> rank (α 1): the uplink into the spine is held for 12 µs
    t = gen.leaf_spine(2, 2, 1, bw=10.0, alpha=1.0, uplink_bw=10.0, uplink_alpha=5.0)
    floor = route_alpha_floor(t)
    names = [(t.node_name(link.src), t.node_name(link.dst)) for link in t.links]
    assert floor[names.index(("leaf0", "spine0"))] == pytest.approx(12.0)
    assert floor[names.index((0, "leaf0"))] == pytest.approx(2.0)   # to the rank beside it: 1 + 1


def test_water_filling_over_links_of_different_alpha():
    # two links leave {0}: 0 -> 1 (α 1) and 0 -> 2 (α 100), 10 GB/s each. A demand the first link moves in less
    # than 99 µs never waits for the second: T >= 1 + D / b; a larger one fills both: T >= (D + b·1 + b·100) / 2b
    t = Topology("fork", 3, (Link(0, 1, 10.0, 1.0), Link(0, 2, 10.0, 100.0),
                             Link(1, 0, 10.0, 1.0), Link(2, 0, 10.0, 100.0)), ())
    mask = np.array([True, False, False])
    assert cut_alpha_us(t, mask, 0.5 * MiB) == pytest.approx(1 + 0.5 * MiB / 10e3)
    assert cut_alpha_us(t, mask, 64 * MiB) == pytest.approx((64 * MiB + 10e3 * 1 + 10e3 * 100) / 20e3)
    assert cut_alpha_us(t, np.array([True, True, True]), MiB) == 0.0   # nothing leaves


def _two_sites(haul_alpha: float) -> Topology:
    """Two switch domains of three ranks each, joined by one 25 GB/s link of ``haul_alpha`` µs."""
    links = [Link(r, 6 + r // 3, 100.0, 0.5) for r in range(6)] + [Link(6, 7, 25.0, haul_alpha)]
    return Topology("two-sites", 6, tuple(links + [Link(lk.dst, lk.src, lk.bw, lk.alpha) for lk in links]),
                    ("s0", "s1"))


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "broadcast", "scatter"])
def test_a_long_haul_cut_pays_its_alpha(collective):
    # every byte between the sites crosses the one link, held for its route's α: 0.5 + 500 + 0.5 µs
    bounds = compute_bounds(_two_sites(500.0), collective, GiB)
    assert bounds.bandwidth_bound_us == pytest.approx(bounds.details["cut_bound_us"] + 501.0)
    assert "α its links pay" in bounds.details["bandwidth_method"]


@pytest.mark.parametrize("make", [lambda: _two_sites(40.0), lambda: gen.leaf_spine(3, 2, 1, bw=25.0, alpha=3.0),
                                  lambda: gen.random_regular(8, 3, seed=5), lambda: gen.star(5, bw=20.0, alpha=8.0)])
@pytest.mark.parametrize("collective, size", [("allgather", MiB), ("reducescatter", 64 * MiB),
                                              ("broadcast", MiB), ("allgather", 64 * MiB)])
def test_no_verified_program_beats_the_charged_bounds(make, collective, size):
    # brute force over the methods that run here, at sizes where α is a large and a small part of the time
    from tests.schedule_check import programs_at_or_above_bound

    methods = ("ring", "trees", "greedy", "direct", "lp", "multiring", "rdh")
    assert len(programs_at_or_above_bound(make(), collective, size, methods)) >= 2


def test_the_phases_still_add_up_for_rsag():
    # rsag asks whether the allreduce bound is its phases' sum; the α each phase's cut pays is left out of that sum
    # (the allreduce's traffic terms count bytes only), so fabrics where they added up still do
    from synth.synthesis.rsag import bounds_add_up

    t = gen.torus([4, 4], bw=50.0, alpha=0.5)
    assert compute_bounds(t, "allgather", GiB).bandwidth_bound_us > compute_bounds(t, "allgather", GiB).details[
        "cut_bound_us"]
    assert bounds_add_up(t, float(GiB))

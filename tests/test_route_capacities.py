"""Route capacities (synth.topology.routes.route_capacities): a switch link is capped at the widest rank-to-rank
*route* through it, so methods plan with what the simulator times where slow NICs feed fast ones."""

from __future__ import annotations

import pytest

from synth.pipeline import instance, synthesize
from synth.topology.families import fabric_family
from synth.topology.routes import rank_routes, route_capacities
from tests.schedule_check import slow_and_fast_boxes as _mixed

GiB = 2**30


def _bottlenecks(topology):
    bw = {(link.src, link.dst): link.bw for link in topology.links}
    return {pair: min(bw[arc] for arc in zip(path, path[1:])) for pair, path in rank_routes(topology).items()}


def test_fast_nics_that_only_reach_slow_ones_are_capped():
    t = _mixed(10.0, 40.0).circuit_capacities()
    capped = route_capacities(t)
    nic_links = [(old, new) for old, new in zip(t.links, capped.links) if old.bw == 40.0]
    assert nic_links, "the fast box's NIC links are there"
    for old, new in nic_links:
        # every route through them carries a slow box's piece: the fast box talks to itself over its NVSwitch
        assert new.bw == 10.0, (t.node_name(old.src), t.node_name(old.dst))
    assert all(new == old for old, new in zip(t.links, capped.links) if old.bw != 40.0)


@pytest.mark.parametrize("spec", [f for f in fabric_family() if f.ranks <= 32], ids=lambda f: f.name)
def test_no_route_changes_its_bottleneck(spec):
    t = spec.build().circuit_capacities()
    capped = route_capacities(t)
    assert _bottlenecks(capped) == _bottlenecks(t)
    assert all(new.bw <= old.bw for old, new in zip(t.links, capped.links))


def test_methods_plan_on_route_capacities():
    t = _mixed(12.5, 50.0, 3, 2)
    planned = instance(t, "allgather", GiB).topology
    assert min(link.bw for link in planned.links if link.bw != 100.0) == 12.5
    assert planned.num_ranks == t.num_ranks


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_slow_and_fast_boxes_reach_the_bound(collective):
    # planned on circuit capacities only, the forests counted the fast NICs at 40 GB/s and the default
    # synthesize gave 0.667 (allgather, greedy) and 0.332 (allreduce)
    result = synthesize(_mixed(10.0, 40.0), collective, GiB)
    assert result.bound_us / result.time_us >= 0.98


def _switch_ring(boxes: int, per_box: int, port: float = 300.0, between: float = 50.0):
    """``boxes`` switches in a ring (``between`` GB/s each way), ``per_box`` ranks on each (``port`` GB/s)."""
    from synth.topology.model import Link, Topology

    n = boxes * per_box
    links = []
    for rank in range(n):
        links += [Link(rank, n + rank // per_box, port, 0.7), Link(n + rank // per_box, rank, port, 0.7)]
    for b in range(boxes):
        a, c = n + b, n + (b + 1) % boxes
        links += [Link(a, c, between, 3.0), Link(c, a, between, 3.0)]
    return Topology(f"switch-ring-{boxes}x{per_box}", n, tuple(links), switches=tuple(f"s{b}" for b in range(boxes)))


def test_bounds_count_the_circuits_a_rank_port_carries():
    # one rank per switch: every route from a rank leaves its switch over a 50 GB/s link, so its 300 GB/s port
    # moves 50 GB/s; the fluid cut counted both ring links into a rank's switch (3/4 SIZE at 100 GB/s)
    from synth.lower_bounds import compute_bounds

    t = _switch_ring(4, 1)
    bound = compute_bounds(t, "allgather", GiB).bandwidth_bound_us
    assert compute_bounds(t, "allgather", GiB).details["cut_bound_us"] == pytest.approx(0.75 * GiB / 50e3)
    assert compute_bounds(t.circuit_capacities(), "allgather", GiB).bandwidth_bound_us == pytest.approx(bound)
    # tight: a ring meets it; synthesize reports the bound `synth bounds` gives (it planned on route capacities
    # and reported 16106 us while `synth bounds` said 8053)
    result = synthesize(t, "allgather", GiB, "ring")
    assert bound / result.time_us >= 0.99
    assert result.bound_us == pytest.approx(compute_bounds(t, "allgather", GiB).time_bound_us)


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_no_verified_program_beats_the_route_capped_bound(collective):
    from synth.errors import SynthError
    from synth.lower_bounds import compute_bounds

    for t in (_switch_ring(4, 1), _switch_ring(3, 2)):
        bound = compute_bounds(t, collective, 64 * 2**20).time_bound_us
        timed = 0
        for method in ("ring", "greedy", "trees", "direct", "hierarchical", "multiring", "rdh", "lp"):
            try:
                result = synthesize(t, collective, 64 * 2**20, method)
            except SynthError:
                continue
            timed += 1
            assert result.time_us >= bound * (1 - 1e-9), (t.name, method)
        assert timed >= 4


@pytest.mark.parametrize("seed", [*range(40), 328, 669, 733])   # the last three fail on rank_routes' paths alone
def test_every_simulated_route_fits_the_bounds_capacities(seed):
    # the bounds' caps must not fall below any transfer the simulator can time: on random fabrics of ranks,
    # switches and rank-to-rank links (some pairs joined only across ranks), every path RuntimePaths gives a
    # send moves at its bottleneck on every link of the capped fabric
    import random

    from synth.topology.model import Link, Topology
    from synth.topology.routes import RuntimePaths

    rng = random.Random(seed)
    n, s = rng.randint(3, 7), rng.randint(1, 3)
    pairs = {(r, n + r % s) for r in range(n)}      # every rank on a switch or chained to one below
    pairs |= {(rng.randrange(n + s), rng.randrange(n + s)) for _ in range(rng.randint(2, 2 * n))}
    pairs |= {(n + w, n + (w + 1) % s) for w in range(s) if s > 1}
    if rng.random() < 0.5:                           # some ranks reach the switches only across another rank
        pairs = {(a, b) for a, b in pairs if a != 0 or b < n} | {(0, 1)}
    widths = (12.5, 25.0, 50.0, 100.0, 300.0)
    links = []
    for a, b in sorted(pairs):
        if a != b and not (a >= n and b >= n and s == 1):
            bw = rng.choice(widths)
            links += [Link(a, b, bw, 0.5), Link(b, a, bw if rng.random() < 0.7 else rng.choice(widths), 0.5)]
    merged = {(link.src, link.dst): link for link in links}
    t = Topology(f"random-{seed}", n, tuple(merged.values()), switches=tuple(f"w{w}" for w in range(s)))
    capped = route_capacities(t.circuit_capacities())
    cap = {(link.src, link.dst): link.bw for link in capped.links}
    bw = {(link.src, link.dst): link.bw for link in t.links}
    paths = RuntimePaths(t)
    for src in range(n):
        for dst in range(n):
            path = paths.path(src, dst)
            if path is None:
                continue
            arcs = list(zip(path, path[1:]))
            bottleneck = min(bw[arc] for arc in arcs)
            assert all(cap[arc] >= bottleneck for arc in arcs), (src, dst, path)



def _switch_with_pair_nics(n: int, port: float, nic: float):
    """``n`` GPUs on one switch at ``port`` GB/s (an NVLink domain), each pair ``2p, 2p+1`` also on a NIC it shares
    (``nic`` GB/s to either GPU and to one IB switch): the shape of a GB200 tray."""
    from synth.topology import generators as gen

    return gen.boxes_on_ib([gen.Box(n, "nvswitch", port, 0.5, nics=n // 2, nic_bw=nic, ib_alpha=1.0)], 1,
                           name=f"nvl{n}-pairnic-{port:g}-{nic:g}")


@pytest.mark.parametrize("n, port, nic", [(4, 900.0, 50.0), (8, 450.0, 100.0), (12, 900.0, 200.0)])
def test_links_on_no_route_are_left_out(n, port, nic):
    # every GPU sends to every other over the switch (two hops, like the NIC a pair shares, but wider), so no
    # send crosses a NIC: those links carry nothing and the allgather's per-rank cut is the switch port alone
    from synth.lower_bounds import compute_bounds

    t = _switch_with_pair_nics(n, port, nic)
    capped = route_capacities(t.circuit_capacities())
    assert {(link.src, link.dst) for link in capped.links} == {
        (link.src, link.dst) for link in t.links if "b0.nvswitch" in (t.node_name(link.src), t.node_name(link.dst))}
    assert rank_routes(capped) == rank_routes(t)
    bound = compute_bounds(t, "allgather", GiB).details["cut_bound_us"]
    assert bound == pytest.approx((n - 1) / n * GiB / (port * 1e3))   # the fluid cut counted port + nic


def test_no_program_beats_the_bound_without_the_unrouted_nics():
    from tests.schedule_check import programs_at_or_above_bound

    t = _switch_with_pair_nics(8, 450.0, 100.0)
    for collective in ("allgather", "allreduce"):
        timed = programs_at_or_above_bound(t, collective, 64 * 2**20, ("ring", "direct", "trees", "greedy", "rdh"))
        assert len(timed) >= 4


def test_the_tighter_bound_is_met():
    result = synthesize(_switch_with_pair_nics(8, 450.0, 100.0), "allgather", GiB)
    assert result.bound_us / result.time_us >= 0.98


def _spare_spine_fat_tree(seed: int):
    """Two or three leaves of one or two ranks under two to four spines of 25 or 50 GB/s: more spines than the
    destinations' digits pick, so some carry no send."""
    import random

    from synth.topology.model import Link, Topology

    rng = random.Random(seed)
    leaves, spines = rng.randint(2, 3), rng.randint(2, 4)
    sizes = [rng.randint(1, 2) for _ in range(leaves)]
    n = sum(sizes)
    links = []
    rank = 0
    for i, size in enumerate(sizes):
        for _ in range(size):
            links += [Link(rank, n + i, 100.0, 0.5), Link(n + i, rank, 100.0, 0.5)]
            rank += 1
        for s in range(spines):
            bw = rng.choice((25.0, 50.0))
            links += [Link(n + i, n + leaves + s, bw, 1.0), Link(n + leaves + s, n + i, bw, 1.0)]
    return Topology(f"fat-{seed}", n, tuple(links),
                    switches=tuple(f"leaf{i}" for i in range(leaves)) + tuple(f"spine{i}" for i in range(spines)))


def test_leaving_out_unrouted_links_keeps_every_path():
    # a spine no send takes is left out only where the destination-mod-k pick of every other path stays the same:
    # of these 30 fat trees some lose links, and some keep them because leaving them out would move a path
    from synth.topology.routes import _send_paths

    outcomes = []
    for seed in range(30):
        t = _spare_spine_fat_tree(seed)
        capped = route_capacities(t)
        paths = {(p[0], p[-1]): p for p in _send_paths(t)}
        assert {(p[0], p[-1]): p for p in _send_paths(capped)} == paths, seed
        used = {arc for p in paths.values() for arc in zip(p, p[1:])}
        kept = {(link.src, link.dst) for link in capped.links}
        assert used <= kept, seed
        outcomes.append("left out" if len(kept) < len(t.links) else "kept" if len(used) < len(t.links) else "all used")
    assert {"left out", "kept"} <= set(outcomes)

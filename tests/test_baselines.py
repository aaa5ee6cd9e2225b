"""Standard baselines (dbt, rdh, direct, hierarchical, nccl): every built-in topology they apply to
verifies, closed forms of the α-β predictions, non-powers of two, rails on multi-box fabrics."""

from __future__ import annotations

import pytest

from synth.collectives import Collective
from synth.errors import SynthError
from synth.lower_bounds import compute_bounds
from synth.program.lower import lower
from synth.simulation import simulate
from synth.synthesis import baselines as bl
from synth.synthesis.base import Instance, SynthOptions
from synth.synthesis.registry import METHODS
from synth.topology import generators as gen
from synth.topology.builtin import builtin_names
from synth.topology.io import load_topology, parse_topology
from synth.verification import verify
from tests.schedule_check import check_schedule

MiB = 2**20
BASELINES = ("dbt", "rdh", "direct", "hierarchical", "nccl")
# (method, topology) pairs where a reduction does not apply: the butterfly does not embed in these
# fabrics and partial sums are never relayed through ranks.
RDH_REDUCTIONS_DO_NOT_EMBED = {"ring-8", "mesh-5x5", "mi250", "torus-3x3x3"}


def run(method: str, topology, name: str, size: float = MiB, *, root: int = 0, inplace: bool = False,
        chunks: int | None = None):
    coll = Collective(name, topology.num_ranks, root=root, inplace=inplace)
    schedule = METHODS[method].run(Instance(topology, coll, size, SynthOptions(chunks=chunks)))
    if schedule.program is not None:   # in-network steps (NVLS): the method's own program, no transfers to lower
        program = schedule.program
        result = verify(program, schedule.collective, topology=topology)
        assert result.ok, result.errors[:3]
        return schedule, program, simulate(program, topology, size, record_events=False)
    check_schedule(schedule, topology)          # independent data-flow + link check
    program = lower(schedule)
    result = verify(program, schedule.collective)
    assert result.ok, result.errors[:3]
    sim = simulate(program, topology, size, record_events=False)
    assert sim.time_us > 0
    return schedule, program, sim


def _applies(method: str, topo_name: str, topology, collective: str) -> bool:
    if method == "hierarchical":
        return len(topology.machines) >= 2
    if method == "rdh" and collective != "allgather":
        return topo_name not in RDH_REDUCTIONS_DO_NOT_EMBED
    return True


@pytest.mark.parametrize("topo_name", builtin_names())
@pytest.mark.parametrize("method", BASELINES)
def test_baseline_verifies_on_builtin(method: str, topo_name: str) -> None:
    topology = load_topology(topo_name)
    names = sorted(METHODS[method].collectives)
    if method == "nccl":   # the other collectives are plain ``ring`` (tested in test_ring.py)
        names = ["allreduce", "alltoall"]
    for name in names:
        root = topology.num_ranks - 1 if name in ("broadcast", "reduce") else 0
        if _applies(method, topo_name, topology, name):
            schedule, _, _ = run(method, topology, name, root=root)
            assert schedule.collective.root == root
        else:
            with pytest.raises(SynthError, match="does not apply|needs a multi-box"):
                run(method, topology, name, root=root)


# ---- closed forms ---------------------------------------------------------------------------------
def test_rdh_closed_form_fully_connected_power_of_two() -> None:
    """log2(N) steps; allgather/reducescatter: log2 N·α + (N-1)/N·S/bw; allreduce twice that."""
    n, bw, alpha, size = 8, 50.0, 0.5, 4 * MiB
    topo = gen.fully_connected(n, bw=bw, alpha=alpha)
    one = 3 * alpha + (n - 1) / n * size / (bw * 1e3)
    for name, want in (("allgather", one), ("reducescatter", one), ("allreduce", 2 * one)):
        schedule, _, sim = run("rdh", topo, name, size, inplace=True)
        assert schedule.predicted_time_us == pytest.approx(want, rel=1e-9)
        assert sim.time_us == pytest.approx(want, rel=1e-9)
        # exactly log2 N rounds of partner exchanges per phase, every rank sending once per round
        phases = 2 if name == "allreduce" else 1
        assert len({t.group for t in schedule.transfers}) == phases * 3 * n


def test_rdh_non_power_of_two_runs_bruck_rounds() -> None:
    """N = 6: allgather, reducescatter and the halving allreduce run Bruck's 3 rounds (distances 1, 2, 4; the last
    carries 2 blocks), every rank receiving each other block once per phase."""
    from collections import Counter

    topo = gen.fully_connected(6)
    for name, phases in (("allgather", 1), ("reducescatter", 1), ("allreduce", 2)):
        schedule, _, sim = run("rdh", topo, name)
        assert schedule.notes["bruck_rounds"] == 3 and schedule.notes["extras"] == 0
        place = schedule.notes["placement"]
        hops = Counter((place.index(t.dst) - place.index(t.src)) % 6 for t in schedule.transfers)
        assert set(hops) == ({5, 4, 2} if name == "allgather" else {1, 2, 4} if name == "reducescatter"
                             else {1, 2, 4, 5})
        per_rank = Counter(t.dst for t in schedule.transfers)
        assert set(per_rank.values()) == {5 * phases}   # one chunk per block
        if name == "reducescatter":
            assert all(t.reduce for t in schedule.transfers)
    # odd sizes and a torus (relays) too
    run("rdh", gen.fully_connected(7), "allreduce")
    run("rdh", gen.fully_connected(5), "reducescatter", chunks=3)
    run("rdh", gen.torus([3, 3]), "allgather")


def test_rdh_doubling_allreduce_folds_extras() -> None:
    """N = 6, plain doubling (short messages): four core ranks run the butterfly, two extra ranks fold into core
    partners (placed next to them, so a core's pieces stay contiguous) and are unfolded."""
    topo = gen.star(6, bw=300, alpha=0.7)
    schedule, _, _ = run("rdh", topo, "allreduce", size=1024.0)
    assert schedule.notes["variant"] == "doubling"
    assert schedule.notes["core"] == 4 and schedule.notes["extras"] == 2
    place = schedule.notes["placement"]
    assert place == [0, 2, 4, 5, 1, 3]      # core i <-> extra 4+i are ranks 2i, 2i+1
    extras = {place[4], place[5]}
    extra_peers = {(t.src, t.dst) for t in schedule.transfers if extras & {t.src, t.dst}}
    assert extra_peers == {(1, 0), (0, 1), (3, 2), (2, 3)}
    assert all(t.reduce for t in schedule.transfers if t.src in extras)


def test_bruck_on_one_switch_of_72_ranks_reaches_the_bound() -> None:
    # a ring or tree packing sends 71 messages per rank (0.954 of the bound at 1 GiB); Bruck's rounds send 7
    topo = parse_topology({"name": "nvl72", "ranks": 72, "switches": ["nvs"],
                           "links": [{"src": r, "dst": "nvs", "bw": 900, "alpha": 0.4} for r in range(72)]})
    for name in ("allgather", "reducescatter", "allreduce"):
        schedule, _, sim = run("rdh", topo, name, size=2**30)
        bound = compute_bounds(topo, schedule.collective, 2**30).time_bound_us
        assert bound / sim.time_us >= 0.99, (name, bound / sim.time_us)


def test_rdh_embeds_butterfly_in_torus() -> None:
    """A 4x4 torus is a 4-cube: the butterfly's partners become neighbours after relabelling."""
    topo = load_topology("torus-4x4")
    schedule, _, _ = run("rdh", topo, "allreduce")
    assert all(topo.link(t.src, t.dst) is not None for t in schedule.transfers)


def test_dbt_closed_form_small_star() -> None:
    """One chunk per tree on a star; every hop crosses the switch: d = 2α + (S/2)/bw.

    broadcast/reduce on 3 ranks (root 0 on top of trees 0->2->1 and 0->1->2): the root's link
    serializes its two halves, then the last hop: 3d.
    allreduce on 2 ranks (trees rooted at 1 and at 0): up in parallel, down in parallel: 2d.
    allreduce on 3 ranks (tree A rooted at 1, tree B at 2, rank 0 a leaf of both): up, rank 0 sends
    its two halves over its one uplink (d, 2d), rank 2's tree-A half queues behind it at rank 1's
    port (2d), rank 1 then adds its tree-B half into root 2 (3d); down, root 1 sends to 0 and 2 over
    its one uplink (4d, 5d), root 2 sends to 0 (5d) and then to 1 (6d)."""
    bw, alpha, size = 100.0, 0.7, MiB
    d = 2 * alpha + size / 2 / (bw * 1e3)
    cases = (
        (3, "broadcast", 3 * d, [[-1, 2, 0], [-1, 0, 1]]),
        (3, "reduce", 3 * d, [[-1, 2, 0], [-1, 0, 1]]),
        (2, "allreduce", 2 * d, [[1, -1], [-1, 0]]),
        (3, "allreduce", 6 * d, [[1, -1, 1], [2, 2, -1]]),
    )
    # The simulator books into idle link gaps (backfilling): in the 3-rank allreduce, rank 1's tree-B
    # send 1->2 (ready at 0) takes switch->2's idle gap [0, d) instead of queueing behind 0->2 at [d, 2d),
    # which saves one d: 5d simulated against the method's own 6d plan. The other cases have no such gap.
    simulated = {(3, "allreduce"): 5 * d}
    for n, name, want, trees in cases:
        schedule, _, sim = run("dbt", gen.star(n, bw=bw, alpha=alpha), name, size, chunks=2)
        assert schedule.notes["trees"] == trees
        assert schedule.predicted_time_us == pytest.approx(want, rel=1e-9)
        assert sim.time_us == pytest.approx(simulated.get((n, name), want), rel=1e-9)


def test_double_binary_tree_is_complementary() -> None:
    for m in (3, 4, 7, 8, 15, 16):
        a, b = bl.double_binary_tree(m)
        assert a.count(-1) == 1 and b.count(-1) == 1
        interior_a = {p for p in a if p >= 0}
        interior_b = {p for p in b if p >= 0}
        assert len(interior_a & interior_b) <= 1, (m, a, b)
        for tree in (a, b):
            assert max(tree.count(p) for p in range(m)) <= 2


def test_dbt_pipelines_large_sizes_and_rooted() -> None:
    topo = load_topology("dgx-a100")
    small, _, _ = run("dbt", topo, "allreduce", 64 * 1024)
    large, _, _ = run("dbt", topo, "allreduce", 256 * MiB)
    assert large.collective.chunk_factor > small.collective.chunk_factor
    schedule, _, _ = run("dbt", topo, "broadcast", root=5)
    assert all(t.dst != 5 for t in schedule.transfers)


def test_direct_closed_form_and_relays() -> None:
    """Fully connected: all N(N-1) pieces move at once on distinct links: α + (S/N)/bw."""
    n, size = 8, 8 * MiB
    topo = gen.fully_connected(n, bw=50, alpha=0.5)
    schedule, _, sim = run("direct", topo, "alltoall", size)
    want = 0.5 + size / n / 50e3
    assert schedule.predicted_time_us == pytest.approx(want) and sim.time_us == pytest.approx(want)
    # a ring relays through ranks (every hop a real link, checked by check_schedule)
    schedule, _, _ = run("direct", gen.ring(6), "alltoall")
    assert len(schedule.transfers) > 6 * 5


def test_reductions_are_never_relayed() -> None:
    with pytest.raises(SynthError, match="does not apply"):
        run("rdh", gen.ring(8), "reducescatter")


def test_hierarchical_two_box_rails() -> None:
    """2 boxes of 4 behind NICs: inter-box transfers only between GPU g of each box (rail g)."""
    topo = gen.boxes_behind_nics(2, 4)
    boxes = [tuple(b) for b in topo.machines]
    rail = {r: g for box in boxes for g, r in enumerate(box)}
    box_of = {r: b for b, box in enumerate(boxes) for r in box}
    for name in ("allreduce", "allgather", "reducescatter"):
        schedule, _, sim = run("hierarchical", topo, name, 4 * MiB)
        cross = [t for t in schedule.transfers if box_of[t.src] != box_of[t.dst]]
        assert cross, name
        assert all(rail[t.src] == rail[t.dst] for t in cross), name
        ring, _, ring_sim = run("nccl", topo, name, 4 * MiB) if name != "allreduce" else (None, None, None)
        if ring_sim is not None:
            assert sim.time_us > 0 and ring_sim.time_us > 0
    with pytest.raises(SynthError, match="multi-box"):
        run("hierarchical", load_topology("dgx1"), "allreduce")


def test_nccl_picks_tree_small_ring_large() -> None:
    topo = load_topology("dgx2")
    small = bl.NCCL.run(Instance(topo, Collective("allreduce", 16), 4096, SynthOptions()))
    large = bl.NCCL.run(Instance(topo, Collective("allreduce", 16), 2**30, SynthOptions()))
    assert small.notes["nccl_algorithm"] == "dbt" and large.notes["nccl_algorithm"] == "ring"
    assert small.method == large.method == "nccl"
    a2a = bl.NCCL.run(Instance(topo, Collective("alltoall", 16), MiB, SynthOptions()))
    assert a2a.notes["nccl_algorithm"] == "direct"


def test_embed_respects_fixed_and_routes() -> None:
    topo = gen.ring(4)
    routes = bl.rank_routes(topo)
    # a 4-cycle 0-1-2-3-0 on logical nodes, with logical 0 pinned to rank 2
    place = bl.embed(routes, 4, [(0, 1), (1, 2), (2, 3), (3, 0)], fixed={0: 2})
    assert place is not None and place[0] == 2
    for a, b in [(0, 1), (1, 2), (2, 3), (3, 0)]:
        assert topo.link(place[a], place[b]) is not None
    # a star on logical nodes (one centre with 3 leaves) cannot embed in a 4-ring
    assert bl.embed(routes, 4, [(0, 1), (0, 2), (0, 3)]) is None


def test_dbt_multi_box_chains_cross_on_rails() -> None:
    """Boxed fabric: trees over boxes, chains inside; box-crossing edges join heads of one rail, and
    the two allreduce trees cross on different rails."""
    topo = load_topology("dgx-a100-2node")
    boxes = [tuple(b) for b in topo.machines]
    box_of = {r: b for b, box in enumerate(boxes) for r in box}
    local = {r: i for box in boxes for i, r in enumerate(box)}
    schedule, _, _ = run("dbt", topo, "allreduce", 64 * MiB)
    rails = []
    for tree in schedule.notes["trees"]:
        cross = [(c, p) for c, p in enumerate(tree) if p >= 0 and box_of[c] != box_of[p]]
        assert len(cross) == 1 and local[cross[0][0]] == local[cross[0][1]]
        rails.append(local[cross[0][0]])
        assert sum(1 for p in tree if p < 0) == 1
    assert rails[0] != rails[1]


def test_auto_tries_the_baselines() -> None:
    """``-m auto`` runs the baselines at latency-bound sizes and keeps the fastest verified program."""
    from synth.pipeline import synthesize

    res = synthesize(load_topology("dgx-a100"), "allreduce", 64 * 1024, "auto")
    tried = {row["method"]: row for row in res.tried}
    assert {"ring", "dbt", "rdh"} <= set(tried)
    assert res.time_us == pytest.approx(min(r["time_us"] for r in tried.values() if "time_us" in r))
    res = synthesize(load_topology("dgx-a100-2node"), "allgather", 256 * MiB, "auto")
    assert "hierarchical" in {row["method"] for row in res.tried}


def test_direct_inplace_alltoall_exchanges_pairs() -> None:
    """In place, round d exchanges the pairs r + q = d (mod N), so no slot is overwritten early."""
    schedule, _, _ = run("direct", load_topology("dgx-a100"), "alltoall", inplace=True)
    starts = {(t.src, t.dst): t.group for t in schedule.transfers}
    assert len(starts) == 8 * 7
    with pytest.raises(SynthError, match="in-place alltoall"):
        run("direct", gen.ring(6), "alltoall", inplace=True)


def test_dbt_multi_box_rooted_chains_start_at_root() -> None:
    """Rooted on a boxed fabric: both trees chain from the root, and boxes join on the root's rail."""
    topo = load_topology("dgx-a100-2node")
    schedule, _, _ = run("dbt", topo, "broadcast", root=3)
    for tree in schedule.notes["trees"]:
        assert tree[3] == -1 and tree[11] == 3      # rank 11 is GPU 3 of box 1 (the same rail)

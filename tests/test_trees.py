"""Method trees: exact cut-bound rates (hand-derived), packing invariants, verified programs."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from fractions import Fraction

import pytest

from synth.collectives import Collective
from synth.errors import SynthError
from synth.synthesis import timing, trees
from synth.synthesis.base import MAX_STEPS_PER_TB, MAX_XML_NODES, Instance, SynthOptions
from synth.synthesis.packing import integer_fabric, optimal_ratio
from synth.synthesis.trees import plan_forest, synthesize
from synth.topology.model import Link, Topology


def _bidir(n_ranks: int, edges, switches=(), name="t") -> Topology:
    links = []
    for a, b, bw in edges:
        links += [Link(a, b, bw, 0.5), Link(b, a, bw, 0.5)]
    return Topology(name, n_ranks, tuple(links), tuple(switches))


def ring(n: int, bw: float = 50) -> Topology:
    return _bidir(n, [(i, (i + 1) % n, bw) for i in range(n)], name=f"ring{n}")


def star(n: int, bw: float = 100) -> Topology:
    return _bidir(n, [(i, n, bw) for i in range(n)], switches=("sw",), name=f"star{n}")


def two_boxes() -> Topology:
    """Two boxes of 2 ranks: inside a box 100 GB/s, one 10 GB/s link between the boxes.

    Per-rank bound: each rank receives 3 pieces over 100 (+10) GB/s. Cut bound: the box {0,1}
    must receive 2 pieces over the single 10 GB/s link: T* = 2/10 per unit piece, far above the
    per-rank 3/110: the per-rank bound is wrong here.
    """
    return _bidir(4, [(0, 1, 100), (2, 3, 100), (1, 2, 10)], name="boxes")


def ratio_GBps(topology: Topology, roots) -> float:
    fabric = integer_fabric(topology)
    return float(optimal_ratio(fabric, {r: 1 for r in roots}) / fabric.unit_GBps)


def test_ring_rate_is_half_the_pieces_per_link():
    # allgather on a bidirectional ring: each rank receives N-1 pieces over 2 links of 50 GB/s
    assert ratio_GBps(ring(8), range(8)) == pytest.approx(7 / 100)


def test_per_rank_bound_is_wrong_on_two_boxes():
    per_rank = 3 / 110
    exact = ratio_GBps(two_boxes(), range(4))
    assert exact == pytest.approx(2 / 10)
    assert exact > per_rank * 5


def test_star_behind_switch_is_exact():
    # star: every rank has 100 GB/s in; N-1 pieces in -> T* = (N-1)/100; the switch is split away
    forest = plan_forest(star(6), tuple(range(6)))
    assert float(forest.ratio / forest.unit_GBps) == pytest.approx(5 / 100)
    assert forest.ratio == forest.optimal
    assert any(route for t in forest.trees for pieces in t.routes for route, _ in pieces)


def test_broadcast_rate_is_min_cut():
    # line 0-1-2 with 30 and 20 GB/s: broadcast from 0 is limited by the 20 GB/s link
    line = _bidir(3, [(0, 1, 30), (1, 2, 20)], name="line")
    assert ratio_GBps(line, [0]) == pytest.approx(1 / 20)


@pytest.mark.parametrize("topology", [ring(5), star(5), two_boxes()], ids=lambda t: t.name)
def test_forest_is_k_spanning_trees_per_root_within_capacity(topology):
    forest = plan_forest(topology, tuple(range(topology.num_ranks)))
    n = topology.num_ranks
    per_root = {r: 0 for r in range(n)}
    load: dict[tuple[int, int], int] = {}
    for tree in forest.trees:
        per_root[tree.root] += tree.mult
        assert len(tree.edges) == n - 1
        assert {c for _, c in tree.edges} | {tree.root} == set(range(n))
        for (parent, child), pieces in zip(tree.edges, tree.routes):
            assert sum(units for _, units in pieces) == tree.mult
            for route, units in pieces:
                nodes = (parent, *route, child)
                for a, b in zip(nodes, nodes[1:]):
                    load[(a, b)] = load.get((a, b), 0) + units
    assert set(per_root.values()) == {forest.k}
    fabric = integer_fabric(topology)
    for a, b, u in zip(fabric.tails.tolist(), fabric.heads.tolist(), fabric.units.tolist()):
        # each unit-tree carries 1/k of a piece: load/k <= bw * T*  (in fabric units)
        assert Fraction(load.get((a, b), 0), forest.k) <= u * forest.ratio


def _verified(topology, name, size=2**26, **opts):
    from synth.program.lower import lower
    from synth.simulation import simulate
    from synth.verification import verify

    schedule = synthesize(Instance(topology, Collective(name, topology.num_ranks), size, SynthOptions(**opts)))
    program = lower(schedule)
    result = verify(program)
    assert result.ok, result.errors[:3]
    return schedule, simulate(program, topology, size, record_events=False)


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce",
                                  "gather", "scatter"])
@pytest.mark.parametrize("topology", [ring(4), star(4), two_boxes()], ids=lambda t: t.name)
def test_every_collective_verifies(topology, name):
    _verified(topology, name)


def test_allgather_close_to_cut_bound_on_a_switch():
    topology = star(8)
    size = 2**30
    schedule, sim = _verified(topology, "allgather", size)
    bound_us = size / 8 * 7 / (100 * 1e3)
    assert bound_us / sim.time_us > 0.97
    assert schedule.predicted_time_us == pytest.approx(sim.time_us, rel=0.05)


def test_two_boxes_reach_the_cut_not_the_per_rank_bound():
    size = 2**28
    _, sim = _verified(two_boxes(), "allgather", size)
    cut_us = size / 4 * 2 / (10 * 1e3)
    assert cut_us / sim.time_us > 0.95
    assert sim.time_us >= cut_us * (1 - 1e-9)


def test_bad_options_raise():
    with pytest.raises(SynthError, match="--max-trees"):
        synthesize(Instance(ring(4), Collective("allgather", 4), 2**20, SynthOptions(max_trees=0)))
    with pytest.raises(SynthError, match="--chunks"):
        synthesize(Instance(ring(4), Collective("allgather", 4), 2**20, SynthOptions(chunks=100000)))
    with pytest.raises(SynthError, match="does not support"):
        synthesize(Instance(ring(4), Collective("alltoall", 4), 2**20, SynthOptions()))


def test_capped_trees_stay_feasible_and_close():
    # the 3-ring with 1 and 2 GB/s links has a fractional optimum; capping k keeps a valid packing
    topology = _bidir(3, [(0, 1, 1), (1, 2, 2), (2, 0, 3)], name="odd")
    exact = plan_forest(topology, (0, 1, 2))
    capped = plan_forest(topology, (0, 1, 2), max_trees=1)
    assert capped.k == 1 and capped.ratio >= exact.optimal
    _verified(topology, "allgather", 2**20, max_trees=1)


def _boxes(nb: int = 3, per: int = 4) -> Topology:
    """``nb`` boxes of ``per`` ranks on a box switch (100 GB/s), one NIC per rank (10 GB/s) to one
    IB switch: the shape of DGX pods, small."""
    n = nb * per
    switches = [f"b{b}" for b in range(nb)] + [f"nic{r}" for r in range(n)] + ["ib"]
    box_sw = {b: n + b for b in range(nb)}
    nic = {r: n + nb + r for r in range(n)}
    ib = n + nb + n
    edges = [(r, box_sw[r // per], 100) for r in range(n)] + [(r, nic[r], 10) for r in range(n)]
    edges += [(nic[r], ib, 10) for r in range(n)]
    links = []
    for a, b, bw in edges:
        links += [Link(a, b, bw, 0.5), Link(b, a, bw, 0.5)]
    machines = tuple(tuple(range(b * per, (b + 1) * per)) for b in range(nb))
    return Topology("boxes3", n, tuple(links), tuple(switches), machines)


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "allreduce"])
def test_large_scale_path_verifies(monkeypatch, name):
    import synth.synthesis.trees as trees_module

    # level_jobs 0: exercise the vectorised timing too
    monkeypatch.setattr(trees_module.tuning, "TUNING", replace(trees_module.tuning.TUNING, large_ranks=4, level_jobs=0))
    for topology in (_boxes(), _bidir(9, [(i, (i + 1) % 9, 50) for i in range(9)]
                                      + [(i, (i + 3) % 9, 50) for i in range(9)], name="circ9")):
        schedule, _ = _verified(topology, name, 2**24)
        assert schedule.notes["trees_per_root"][0] == 1


def test_box_trees_meet_the_box_cut():
    from synth.synthesis.scale import achieved_ratio, box_trees

    topology = _boxes()
    ratio, unit = achieved_ratio(topology, box_trees(topology, tuple(range(12))), False)
    # each box must receive the 8 remote pieces over its 4 NICs of 10 GB/s: 2 pieces per 10 GB/s
    assert float(ratio / unit) == pytest.approx(2 / 10)
    exact = plan_forest(topology, tuple(range(12)))
    assert float(exact.optimal / exact.unit_GBps) == pytest.approx(2 / 10)


def test_packing_keeps_trees_shallow():
    # dgx1 has diameter 2; growing one tree to completion before the next left the last trees
    # only leftover arcs (depth 5); growing all trees together keeps them within 4 hops
    from synth.topology.io import load_topology

    forest = plan_forest(load_topology("dgx1"), tuple(range(8)))
    assert max(max(t.depth.values()) for t in forest.trees) <= 4


def test_torus_allgather_within_one_percent_of_the_cut_bound():
    # critical-path-first link priority + shallow packing: every link busy to the end
    from synth.topology import generators

    topology = generators.torus([4, 4])
    size = 2**30
    schedule, sim = _verified(topology, "allgather", size)
    cut_us = size / 16 * 15 / (4 * 50 * 1e3)   # each rank receives 15 pieces over 4 links of 50 GB/s
    assert cut_us / sim.time_us > 0.99
    assert schedule.predicted_time_us == pytest.approx(sim.time_us, rel=1e-6)


def test_time_limit_is_a_safety_stop_not_a_shorter_search():
    # past --time-limit trees fails with one line; it never returns a less-searched (machine-dependent) program
    from synth.errors import TimeLimitReached

    with pytest.raises(TimeLimitReached, match="time limit"):
        _verified(ring(6), "allgather", 2**30, time_limit=0.0)
    schedule, _ = _verified(ring(6), "allgather", 2**30)
    assert schedule.notes["depth_trials"] >= 1
    again, _ = _verified(ring(6), "allgather", 2**30, time_limit=600.0)
    assert again.transfers == schedule.transfers


def test_dgx1_allreduce_within_one_percent_of_the_bound():
    # heterogeneous NVLink (25/50 GB/s): one chunk per message keeps α in proportion to each
    # link's bytes; both phases pipelined on their own channel match the simulator exactly
    from synth.lower_bounds import compute_bounds
    from synth.topology.io import load_topology

    topology = load_topology("dgx1")
    size = 2**30
    schedule, sim = _verified(topology, "allreduce", size)
    bound_us = compute_bounds(topology, schedule.collective, size).time_bound_us
    assert bound_us / sim.time_us > 0.99
    assert schedule.predicted_time_us == pytest.approx(sim.time_us, rel=1e-6)


def test_box_trees_bound_each_ranks_peers_and_meet_the_nic_cut():
    # 1024-rank A100 fabrics failed lowering: a rank sent to every remote box (> 127 depended-on
    # tbs). Per-rail binomial trees over boxes: <= ceil(log2 B) inter-box peers per direction + 1
    # intra-box peer, and still every NIC carries exactly B - 1 pieces (the box cut).
    from collections import defaultdict

    from synth.synthesis.scale import achieved_ratio, box_trees
    from synth.topology import generators

    nb, per = 20, 4
    topology = generators.boxes_behind_nics(nb, per, intra_bw=300, nic_bw=25, ib_switches=2)
    trees = box_trees(topology, tuple(range(nb * per)))
    sends, recvs = defaultdict(set), defaultdict(set)
    for root, edges, _ in trees:
        assert sorted(v for _, v in edges) == [v for v in range(nb * per) if v != root]
        for u, v in edges:
            sends[u].add(v)
            recvs[v].add(u)
    limit = (nb - 1).bit_length() + 1
    assert max(len(s) for s in sends.values()) <= limit
    assert max(len(s) for s in recvs.values()) <= limit
    ratio, unit = achieved_ratio(topology, trees, False)
    assert float(ratio / unit) == pytest.approx((nb - 1) / 25)


def test_overlapped_allreduce_beats_the_sum_of_its_phase_bounds_on_a_mesh(monkeypatch):
    # a mesh corner has 2 links: its reduction saturates its out-links while its in-links idle, so
    # releasing each piece's allgather as soon as its sum is complete beats RS-then-AG outright
    # (the forests planned on the full fabric; tests/test_split.py covers split capacities)
    from synth.lower_bounds import compute_bounds
    from synth.synthesis import trees
    from synth.topology import generators

    monkeypatch.setattr(trees.tuning, "TUNING", replace(trees.tuning.TUNING, split_gain=1.0))

    topology = generators.mesh([5, 5])
    size = 2**30
    schedule, sim = _verified(topology, "allreduce", size)
    phases_us = sum(compute_bounds(topology, Collective(name, 25), size).time_bound_us
                    for name in ("reducescatter", "allgather"))
    assert sim.time_us < 0.95 * phases_us
    assert schedule.predicted_time_us == pytest.approx(sim.time_us, rel=0.05)
    reductions = [t for t in schedule.transfers if t.reduce]
    gathers = [t for t in schedule.transfers if not t.reduce]
    assert min(t.start for t in gathers) < max(t.end for t in reductions)   # the phases overlap


def test_replicated_timing_of_box_trees_is_contention_free_and_beats_level_timing(monkeypatch):
    # box trees are translates (box shift, rail shift) of root 0's tree: timing root 0's tree with
    # one resource per kind of link and copying the times never overlaps two transfers on a link
    import synth.synthesis.trees as trees_module
    from synth.lower_bounds import compute_bounds
    from synth.topology import generators

    # level_jobs 0: the fallback at scale is the level timing
    monkeypatch.setattr(trees_module.tuning, "TUNING", replace(trees_module.tuning.TUNING, large_ranks=8, level_jobs=0))
    topology = generators.boxes_behind_nics(8, per_box=4, intra_bw=300, intra_alpha=0.7)
    forest = plan_forest(topology, tuple(range(32)))
    assert forest.replicated
    size = 2**30
    schedule, sim = _verified(topology, "allgather", size, chunks=1)   # one message per tree, as at scale
    assert schedule.predicted_time_us == pytest.approx(sim.time_us, rel=1e-6)
    bound_us = compute_bounds(topology, schedule.collective, size).time_bound_us
    monkeypatch.setattr(trees_module.timed, "replicated_schedule", lambda *args: None)
    _, level_sim = _verified(topology, "allgather", size, chunks=1)
    assert sim.time_us < level_sim.time_us
    assert bound_us / sim.time_us > 0.85


def test_split_connections_keep_the_planned_order_in_the_simulator():
    # a 3x3 mesh allreduce needs more than 64 steps on some connections: lowering cuts them into
    # blocks on extra channels; with round-robin channels a later channel's ready send overtook
    # (simulated 18916 us against 16965 planned), with blocks + one boundary dependency it cannot
    from synth.program.lower import lower
    from synth.topology import generators

    topology = generators.mesh([3, 3])
    schedule, sim = _verified(topology, "allreduce", 2**30)
    assert lower(schedule).nchannels > 2
    assert schedule.predicted_time_us == pytest.approx(sim.time_us, rel=1e-9)


@pytest.mark.parametrize(("name", "collective", "ratio", "any_chunks"), [
    ("dgx-h100-2node", "reducescatter", 0.98, False),   # forward-timed reduction, coalesced (0.964 mirrored only)
    ("dgx-h100-2node", "allgather", 0.98, False),       # ... its mirror (0.974 as a broadcast)
    # 13 trees and 64 chunks per root, which MSCCL runtimes run at 1 GiB: the forest planned on the
    # other orientation (0.9794 / 0.9768 with the first one), messages coalesced at α share 0.0035
    ("dgx-a100-2node", "allgather", 0.98, False),
    ("dgx-a100-2node", "reducescatter", 0.98, False),
    # tail-split messages (0.964 without), drained and batched when built (0.976 without, see _polish)
    ("dgx-a100-4node", "allgather", 0.98, False),
    ("dgx-a100-4node", "reducescatter", 0.98, False),
])
def test_multi_box_fabrics_near_the_cut_bound(name, collective, ratio, any_chunks):
    from synth.lower_bounds import compute_bounds
    from synth.topology.io import load_topology

    topology = load_topology(name)
    size = 2**30
    schedule, sim = _verified(topology, collective, size, runtime_chunks=not any_chunks)
    assert schedule.collective.runtime_divides(size) != any_chunks
    # switch links carry several connections, which the simulator serves in the order sends become
    # ready, not in the plan's: dgx-a100-2node allgather simulates 0.04 % slower than planned
    assert schedule.predicted_time_us == pytest.approx(sim.time_us, rel=1e-3)
    assert compute_bounds(topology, schedule.collective, size).time_bound_us / sim.time_us > ratio


def test_tail_halves_the_last_message_of_each_tree():
    from synth.synthesis.trees.messages import message_shapes

    sizes = [len(m) for m in message_shapes(list(range(32)), 2, tail=3)]
    assert sizes == [16, 8, 4, 2, 2]
    assert [c for m in message_shapes(list(range(32)), 2, tail=3) for c in m] == list(range(32))
    assert [len(m) for m in message_shapes(list(range(6)), 2, tail=4)] == [3, 1, 1, 1]   # stops at one chunk
    assert [len(m) for m in message_shapes(list(range(4)), None, tail=3)] == [1, 1, 1, 1]   # one chunk each: no tail


def test_halving_messages_take_half_of_what_is_left():
    from synth.synthesis.base import MAX_STEP_CHUNKS
    from synth.synthesis.trees.messages import message_shapes
    from synth.synthesis.trees.tuning import HALVING

    shape = message_shapes(list(range(64)), 8, tail=HALVING)   # the message count is ignored
    assert [len(m) for m in shape] == [32, 16, 8, 4, 2, 1, 1]
    assert [c for m in shape for c in m] == list(range(64))   # in order, each chunk once
    assert [len(m) for m in message_shapes(list(range(5)), None, tail=HALVING)] == [3, 1, 1]
    # never more than one MSCCL step: the first messages of a big tree are capped
    big = [len(m) for m in message_shapes(list(range(300)), None, tail=HALVING)]
    assert big[:3] == [MAX_STEP_CHUNKS] * 3 and sum(big) == 300 and big[-2:] == [1, 1]


def test_halving_shape_beats_tails_where_every_link_is_a_bottleneck():
    # mi250-2node at 16 trees per root: every link between die pairs is in a tight cut; halving
    # messages (few α, a one-chunk drain) are faster than the best tailed shape (P 8, L 3)
    from synth.lower_bounds import compute_bounds
    from synth.synthesis.trees.timed import timed_forests
    from synth.synthesis.trees.tuning import HALVING
    from synth.topology.io import load_topology

    topology = load_topology("mi250-2node")
    coll = Collective("allgather", 32)
    forest = plan_forest(topology, tuple(range(32)), max_trees=16)
    _, tailed, _ = timed_forests(topology, coll, [forest], 16 * 8 * 8, 8, 2**30, build=False, tail=3)
    _, halving, transfers = timed_forests(topology, coll, [forest], 16 * 64, 64, 2**30, tail=HALVING)
    assert halving < tailed * 0.995
    assert compute_bounds(topology, coll, 2**30).time_bound_us / halving > 0.94
    assert max(t.end for t in transfers) == pytest.approx(halving)


@pytest.mark.slow
def test_mi250_2node_allreduce_gets_the_halving_shape():
    # both forests at 16 trees per root in halving messages make 69.5k transfers: the depth search
    # must time them (REFINE_JOBS); they take 0.949 of the bound, the best shape below that limit 0.937;
    # polished with drained messages (_polish) 0.952, the allreduce target (0.95)
    from synth.lower_bounds import compute_bounds
    from synth.program.lower import lower
    from synth.simulation import simulate
    from synth.topology.io import load_topology
    from synth.verification import verify

    topology = load_topology("mi250-2node")
    schedule = synthesize(Instance(topology, Collective("allreduce", 32), 2**30, SynthOptions()))
    # its alternative, the ring forest (0.981), is tested in tests/test_ringforest.py; the composed box forests
    # (tests/test_composed.py) are a runner-up too, and so are polish's runner-up shapes (tests/test_polish.py)
    assert [s.notes.get("ring_forest") for s in schedule.alternatives
            if "composed_boxes" not in s.notes and "polish_runner_up" not in s.notes] == [True]
    assert schedule.notes["halving_messages"] and schedule.notes["trees_per_root"] == [16, 16]
    program = lower(schedule)
    assert verify(program).ok
    simulated = simulate(program, topology, 2**30, record_events=False).time_us
    assert simulated == pytest.approx(schedule.predicted_time_us, rel=1e-6)
    assert compute_bounds(topology, schedule.collective, 2**30).time_bound_us / simulated >= 0.95


def test_coalesced_reductions_simulate_as_planned():
    # reducescatter timed as a mirrored broadcast, coalesced: the simulator keeps the planned order
    from synth.lower_bounds import compute_bounds
    from synth.program.lower import lower
    from synth.simulation import simulate
    from synth.synthesis.trees.programs import forest_schedule
    from synth.synthesis.trees.timed import timed_forests
    from synth.synthesis.trees.tuning import HALVING
    from synth.topology.io import load_topology
    from synth.verification import verify

    topology = load_topology("mi250-2node")
    forest = plan_forest(topology, tuple(range(32)), reverse=True, max_trees=16)
    coll, planned, transfers = timed_forests(topology, Collective("reducescatter", 32), [forest], 16 * 64, 64, 2**30,
                                             tail=HALVING)
    program = lower(forest_schedule(topology, coll, transfers, planned, [forest], 2**30, "trees"))
    assert verify(program).ok
    simulated = simulate(program, topology, 2**30, record_events=False).time_us
    assert simulated == pytest.approx(planned, rel=1e-6)
    assert compute_bounds(topology, coll, 2**30).time_bound_us / simulated > 0.94   # 0.911 uncoalesced


def test_messages_longer_than_one_msccl_step_pay_alpha_per_step():
    from synth.synthesis.base import MAX_STEP_CHUNKS
    from synth.synthesis.timing import Jobs, route_costs

    topology = _bidir(2, [(0, 1, 50)])
    alpha = topology.links[0].alpha
    jobs = Jobs.empty()
    for count in (MAX_STEP_CHUNKS, MAX_STEP_CHUNKS + 1, 3 * MAX_STEP_CHUNKS):
        jobs.add(tuple(range(count)), 0, 1, (), False, (), (0,))
    costs = route_costs(jobs, topology, 1000.0)
    rate, duration = costs.route_rate, costs.duration
    steps = [d - count * 1000.0 / rate[0] for d, count in zip(duration, (71, 72, 213))]
    assert steps == pytest.approx([alpha, 2 * alpha, 3 * alpha])


def test_tails_are_searched_where_drain_costs_time():
    from synth.topology.io import load_topology

    topology = load_topology("dgx-a100-4node")
    schedule = synthesize(Instance(topology, Collective("allgather", topology.num_ranks), 2**30, SynthOptions()))
    # a shape that shrinks its last messages wins there: tails or halving (mirrored reduction, 48 chunks)
    assert schedule.notes["tail_splits"] > 0 or schedule.notes["halving_messages"]
    # ...and neither is tried where the plain pipeline is already within 1 % of the forest's bandwidth time
    ring8 = ring(8)
    plain = synthesize(Instance(ring8, Collective("allgather", 8), 2**30, SynthOptions()))
    assert plain.notes["tail_splits"] == 0 and not plain.notes["halving_messages"]


def test_tree_count_search_goes_past_a_slower_cap_where_the_rate_leaves_room():
    # dgx-a100-2node, 64 MB allgather: 13 trees 252 µs, 8 trees 257 µs (clearly slower), 4 trees 224 µs;
    # 4 trees' rate (a 3132 µs/GiB floor) is far below 252 µs-worth, so the search must not stop at 8
    from synth.synthesis.trees.pipeline import capped_floor_us
    from synth.topology.io import load_topology

    topology = load_topology("dgx-a100-2node")
    coll = Collective("allgather", 16)
    schedule = synthesize(Instance(topology, coll, 64e6, SynthOptions()))
    assert max(schedule.notes["trees_per_root"]) <= 4
    assert schedule.predicted_time_us < 230.0
    # the floors are the capped rates' bandwidth times, never below the cut bound's
    floors = [capped_floor_us(topology, coll, 2**30, cap) for cap in (16, 8, 4)]
    assert floors == sorted(floors) and floors[0] == pytest.approx(3097.3, abs=0.1)


def test_tree_count_search_goes_past_a_cap_that_is_barely_slower():
    # dgx-a100-2node, 1 KiB allgather: 8 trees per root time as the optimum's 13, 4 trees are 26 % faster;
    # stopping at the first cap that is not faster missed them (26.6 µs instead of 19.6)
    from synth.topology.io import load_topology

    topology = load_topology("dgx-a100-2node")
    schedule = synthesize(Instance(topology, Collective("allgather", 16), 1024, SynthOptions()))
    assert max(schedule.notes["trees_per_root"]) <= 4
    assert schedule.predicted_time_us < 20.0


def test_tree_count_search_reaches_one_or_two_trees_per_root():
    # three DGX H100 boxes, 64 MiB allgather: every NVSwitch message pays 1.4 µs of α, and a rank's in-port takes
    # one per tree delivering to it; 8 trees per root (the search's least cap was 4) 194.7 µs, 2 trees 169.1 µs
    from synth.topology.families import dgx_h100_boxes

    schedule = synthesize(Instance(dgx_h100_boxes(3), Collective("allgather", 24), 2**26, SynthOptions()))
    assert max(schedule.notes["trees_per_root"]) <= 2
    assert schedule.predicted_time_us < 175.0


def test_runtime_divides_counts_the_buffer_in_four_byte_elements():
    # msccl-executor-nccl selects a program only where nchunksperloop divides the element count
    assert Collective("allgather", 16, 32).runtime_divides(2**30)         # 512 per loop | 2^28
    assert not Collective("allgather", 16, 39).runtime_divides(2**30)     # 624 = 16 * 39
    assert Collective("allgather", 16, 40).runtime_divides(10**9)         # 640 | 2.5e8
    assert not Collective("allreduce", 8, 2**30).runtime_divides(2**30)   # 2^30 chunks > 2^28 elements
    assert not Collective("allgather", 2, 1).runtime_divides(6)           # 1.5 elements


def test_chunk_counts_are_ones_the_msccl_runtime_runs_at_size():
    # dgx-a100-2node: 13 trees per root, best at 39 chunks per root (624 per loop), which a 1 GiB
    # buffer (2^28 fp32) does not divide: the runtime would run NCCL's own algorithm instead
    from synth.topology.io import load_topology

    topology = load_topology("dgx-a100-2node")
    coll = Collective("allgather", topology.num_ranks)
    usable = synthesize(Instance(topology, coll, 2**30, SynthOptions()))
    anything = synthesize(Instance(topology, coll, 2**30, SynthOptions(runtime_chunks=False)))
    assert usable.collective.runtime_divides(2**30)
    assert not anything.collective.runtime_divides(2**30)
    assert usable.predicted_time_us < anything.predicted_time_us * 1.01
    fit = trees.messages.runtime_chunks(coll, 2**30)
    assert fit(39) == [32, 64] and fit(64) == [64, 32, 128] and fit(3) == [4, 2]
    assert trees.messages.runtime_chunks(Collective("allgather", 25), 2**30)(39) == [39]   # 25 never divides 2^28


def test_remainder_chunks_are_spread_over_the_links():
    # 8 chunks per root on dgx1's 6 trees per root: two trees of each root carry two; the extra
    # chunks go where the links are least loaded, never above what the largest remainder gives
    from synth.topology.io import load_topology

    forest = trees.plan_forest(load_topology("dgx1"), tuple(range(8)))
    assert forest.k == 6
    counts = trees.messages.balanced_split(forest, 8)
    for root in range(8):
        assert sum(trees.split_chunks(forest, root, 8)) == 8
    shares = [8 * t.mult / forest.k for t in forest.trees]
    assert all(math.floor(s) <= c <= math.ceil(s) for s, c in zip(shares, counts))

    def max_load(per_tree):
        load = defaultdict(int)
        for tree, c in zip(forest.trees, per_tree):
            for edge in tree.edges:
                load[edge] += c
        return max(load.values())

    by_remainder = []
    for root in range(8):
        idx = [i for i, t in enumerate(forest.trees) if t.root == root]
        base = {i: math.floor(shares[i]) for i in idx}
        for i in sorted(idx, key=lambda i: (-(shares[i] - base[i]), i))[:8 - sum(base.values())]:
            base[i] += 1
        by_remainder.append(base)
    merged = [next(b[i] for b in by_remainder if i in b) for i in range(len(forest.trees))]
    assert max_load(counts) <= max_load(merged)
    # exact: no choice
    assert trees.messages.balanced_split(forest, 12) == tuple(12 * t.mult // 6 for t in forest.trees)


def test_a_shape_moved_to_a_runtime_count_keeps_its_message_size():
    # 432 chunks per root (6 trees x 72 messages of one chunk) moved to 512: 85 messages per tree,
    # not 72 uneven ones of one or two chunks
    assert trees.messages.refit_messages(72, 512, 432, 0) == 85
    assert trees.messages.refit_messages(72, 432, 432, 0) == 72
    assert trees.messages.refit_messages(None, 512, 432, 0) is None
    halving = trees.messages.refit_messages(64, 1024, 1000, trees.tuning.HALVING)
    assert halving == 64 == trees.messages.refit_messages(64, 1024, 1000, 2)
    from synth.topology.io import load_topology

    topology = load_topology("dgx1")
    schedule, sim = _verified(topology, "broadcast", 2**30)
    assert schedule.collective.runtime_divides(2**30)
    assert schedule.predicted_time_us == pytest.approx(sim.time_us, rel=1e-6)
    from synth.lower_bounds import compute_bounds

    assert compute_bounds(topology, schedule.collective, 2**30).time_bound_us / sim.time_us > 0.93   # 0.912 uneven


def test_pipeline_depth_is_costed_at_the_chunk_count_the_runtime_runs():
    # 3 trees per root where only powers of two run: P = 1 means 3 chunks per root, which become 2, and one tree
    # of every root then carries nothing while the other two carry half the piece each. Costed at the count that
    # runs, P = 1 loses to P = 2 (4 chunks: 2, 1, 1). Where no depth search follows (128 MI250 ranks) the first
    # choice is the program: mi250x8-ib25 allgather 0.864 of the bound at 2 chunks per root, 0.919 at 8.
    from synth.synthesis.trees.depth import choose_chunks
    from synth.synthesis.trees.timed import timed_forests
    from synth.topology.io import load_topology

    topology = load_topology("mi250")
    n, size = topology.num_ranks, 2**24
    forest = trees.plan_forest(topology, tuple(range(n)), max_trees=3)
    assert forest.k == 3
    coll = Collective("allgather", n)

    def power_of_two_below(chunks: int) -> list[int]:
        return [1 << (chunks.bit_length() - 1)]

    chunks, messages = choose_chunks(topology, coll, [forest], size / n, None, power_of_two_below)
    assert all(c > 0 for c in trees.messages.balanced_split(forest, chunks))   # no tree idle
    chosen = timed_forests(topology, coll, [forest], chunks, messages, size, build=False)[1]
    idle_tree = timed_forests(topology, coll, [forest], 2, 1, size, build=False)[1]
    assert chosen < idle_tree * 0.8   # 70.2 against 97.8 us measured


def test_forests_of_the_other_orientation_only_where_routes_run_back_the_same_way():
    from synth.topology.io import load_topology
    from synth.topology.model import Link, Topology

    assert trees.pipeline.routes_symmetric(load_topology("dgx-a100-2node"))
    # two equal 4-hop paths between ranks 0 and 1 (0-s0-s1-s3-1, 0-s0-s2-s3-1): the tie in the middle goes by
    # destination, which picks 0-s0-s2-s3-1 one way and 1-s3-s1-s0-0 the other, so reduction routes are not
    # broadcast routes
    pairs = [(0, 2), (2, 3), (2, 4), (3, 5), (4, 5), (5, 1)]
    links = tuple(Link(a, b, 10.0, 1.0) for u, v in pairs for a, b in ((u, v), (v, u)))
    topology = Topology("two-paths", 2, links, ("s0", "s1", "s2", "s3"))
    assert trees.pipeline.is_symmetric(topology)
    assert not trees.pipeline.routes_symmetric(topology)


def test_ring_broadcast_pipelines_deeper_than_the_multi_root_grid():
    # Two path trees of depth 7 (one each way round ring-8, 50 GB/s, α 0.5 µs) carry 512 MiB each:
    # P messages per tree take (P + 6)(α + 512 MiB / (P · 50 GB/s)), least at P ≈ 359 with
    # 0.967 of the 10737 µs bound; PIPELINE_GRID's 128 messages give at best 0.955 (measured 0.9496)
    from synth.lower_bounds import compute_bounds
    from synth.program.lower import lower
    from synth.program.msccl_xml import check_runtime_limits

    topology = ring(8)
    size = 2**30
    schedule, sim = _verified(topology, "broadcast", size)
    # the search went past P = 128 per tree
    assert schedule.notes["chunks_per_root"] > trees.tuning.TUNING.max_chunks // 2
    bound_us = compute_bounds(topology, schedule.collective, size).time_bound_us
    assert bound_us / sim.time_us > 0.96
    check_runtime_limits(lower(schedule))


def test_deep_shapes_stop_at_a_relaying_ranks_xml_nodes():
    forest = plan_forest(ring(8), (0,))
    fits = [[MAX_STEPS_PER_TB * 2] * len(forest.trees)]     # 128 steps per edge: far below the limit
    deep = [[MAX_XML_NODES] * len(forest.trees)]             # a relay sends and receives this many
    assert trees.messages.xml_nodes([forest], fits) <= MAX_XML_NODES < trees.messages.xml_nodes([forest], deep)


def test_justify_repacks_what_a_list_schedule_left_idle():
    # Line 0 -> 1 -> 2 (one chunk: 10 µs a hop, no α). Rank 0 sends chunk a (for 1 only), then
    # chunk b, which 1 forwards to 2: 30 µs. Sending b first lets a's transfer overlap b's second
    # hop: 20 µs. The backward pass moves a to the end, the forward pass keeps that order.
    from synth.schedule import Transfer

    topology = Topology("line", 3, (Link(0, 1, 1.0), Link(1, 2, 1.0)))
    chunk_bytes = 10e3
    given = [Transfer(0.0, 10.0, 0, 0, 1), Transfer(10.0, 20.0, 1, 0, 1), Transfer(20.0, 30.0, 1, 1, 2)]
    makespan, transfers = timing.justify(given, topology, chunk_bytes, 30.0)
    assert makespan == pytest.approx(20.0)
    times = {(t.chunk, t.src): (t.start, t.end) for t in transfers}
    assert times == {(1, 0): (0.0, 10.0), (1, 1): (10.0, 20.0), (0, 0): (10.0, 20.0)}
    # nothing to gain: None, and the schedule stands
    assert timing.justify(sorted(transfers, key=lambda t: t.start), topology, chunk_bytes, 20.0) is None


def test_justified_scatter_runs_as_planned_nearer_the_bound():
    # ring-8 scatter from rank 0 on its two trees (--max-trees 2: no flow paths): the list schedule
    # alone reached 0.962 of the cut bound; justified 0.988
    from synth.lower_bounds import compute_bounds

    topology = ring(8)
    size = 2**30
    schedule, sim = _verified(topology, "scatter", size, max_trees=2)
    assert "paths" not in schedule.notes
    assert schedule.notes["justified"]
    assert sim.time_us == pytest.approx(schedule.predicted_time_us, rel=1e-9)
    bound_us = compute_bounds(topology, schedule.collective, size).time_bound_us
    assert bound_us / sim.time_us > 0.985


@pytest.mark.parametrize("name", ["scatter", "gather"])
def test_scatter_and_gather_ride_the_flow_paths_behind_switches(name):
    # dgx-a100-2node, root 0: the root's NVSwitch port and NIC (325 GB/s) bind; half the data must
    # also cross the other GPUs' NICs. On broadcast trees scatter reached 0.71 of the cut bound;
    # on the flow's paths 0.97 (gather 0.98), and the runtime's rule changes nothing (sim = plan)
    from synth.lower_bounds import compute_bounds
    from synth.topology.io import load_topology

    topology = load_topology("dgx-a100-2node")
    size = 2**30
    schedule, sim = _verified(topology, name, size)
    assert schedule.notes["paths"] >= topology.num_ranks - 1
    assert sim.time_us == pytest.approx(schedule.predicted_time_us, rel=1e-9)
    assert compute_bounds(topology, schedule.collective, size).time_bound_us / sim.time_us > 0.96


@pytest.mark.parametrize("root", [0, 3])
def test_scatter_as_the_mirror_of_a_gather(root):
    # dgx-h100-2node: pulling each rank's data from the root plans 2088.9 µs (0.964 of the bound);
    # the reversed fabric's gather, where every rank pushes its own data, mirrored in time and
    # re-timed forwards, plans 2058 and runs 0.969. The chunk ids move to the root's input slots.
    from synth.lower_bounds import compute_bounds
    from synth.program.lower import lower
    from synth.simulation import simulate
    from synth.topology.io import load_topology
    from synth.verification import verify

    topology = load_topology("dgx-h100-2node")
    size = 2**30
    coll = Collective("scatter", topology.num_ranks, root=root)
    schedule = synthesize(Instance(topology, coll, size, SynthOptions()))
    assert schedule.notes["mirrored_gather"]
    program = lower(schedule)
    assert verify(program).ok
    sim = simulate(program, topology, size, record_events=False)
    assert compute_bounds(topology, schedule.collective, size).time_bound_us / sim.time_us > 0.965

"""``-m auto``: the rule's candidate sets, best-of semantics, and the time budget."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

import synth.synthesis.auto as auto
from synth.collectives import Collective, runtime_divides
from synth.pipeline import synthesize
from synth.synthesis.base import Instance, MethodSpec, SynthOptions
from synth.synthesis.trees import method as trees_method
from synth.topology import generators as gen
from synth.topology.io import load_topology

KB, MiB, GiB = 1024, 2**20, 2**30


def _names(topology, coll: str, size: float, **kw) -> list[str]:
    return auto.candidates(Instance(topology, Collective(coll, topology.num_ranks, **kw), size))


def _plan(topology, coll: str, size: float, options: SynthOptions | None = None) -> list[auto.Candidate]:
    return auto.plan(Instance(topology, Collective(coll, topology.num_ranks), size, options or SynthOptions()))


# ---- the rule ----------------------------------------------------------------------------------------
def test_quickstart_dgx1_allgather_1gib_tries_ring_first_and_no_solver():
    assert _names(load_topology("dgx1"), "allgather", GiB) == ["ring", "multiring", "greedy", "trees", "mirror", "lp"]


def test_bandwidth_bound_switchless_allreduce_tries_spantree_and_leaves_trees_above_16_ranks():
    # dgx1 (8 ranks) and mi250 (16): trees still runs (0.996 there against spantree's 0.977); an 8x8 mesh and a
    # 32-rank random regular graph: spantree and multiring only, trees' reduce-scatter + allgather cannot pass
    # 0.75 of the traffic bound on the mesh and lost to spantree on every 32-rank graph of bench_fabrics
    assert [c.method for c in _plan(load_topology("dgx1"), "allreduce", GiB)][:5] == [
        "multiring", "spantree", "trees", "rsag", "lp"]   # the phases after trees on few ranks (auto._rsag)
    assert "trees" in [c.method for c in _plan(load_topology("mi250"), "allreduce", GiB)]
    for fabric in (gen.mesh([8, 8]), gen.random_regular(32, 3, 2)):
        plan = [c.method for c in _plan(fabric, "allreduce", GiB)]
        assert plan[:2] == ["multiring", "spantree"] and "trees" not in plan
    # behind switches spantree does not apply, and trees stays
    boxes = [c.method for c in _plan(load_topology("dgx-a100-4node"), "allreduce", GiB)]
    assert "spantree" not in boxes and "trees" in boxes
    # allgather on the mesh keeps trees
    assert "trees" in [c.method for c in _plan(gen.mesh([8, 8]), "allgather", GiB)]


def test_latency_bound_switchless_8_ranks_tries_baselines_pareto_and_milp():
    names = _names(load_topology("dgx1"), "allgather", KB)
    assert names == ["ring", "direct", "rdh", "nccl", "greedy", "trees", "pareto", "milp"]
    plan = _plan(load_topology("dgx1"), "allreduce", KB)
    assert [c.method for c in plan] == ["ring", "rdh", "dbt", "nccl", "greedy", "trees", "pareto", "milp"]
    limits = {c.method: c.limit_s for c in plan}
    assert limits["milp"] == 30.0 and limits["pareto"] == 10.0 and limits["ring"] is None


def test_switch_fabrics_get_no_pareto_no_lp_and_a_short_milp_limit_at_16_ranks():
    plan = _plan(load_topology("dgx-a100-2node"), "allgather", KB)
    names = [c.method for c in plan]
    assert "hierarchical" in names and "pareto" not in names and "lp" not in names
    assert {c.method: c.limit_s for c in plan}["milp"] == 5.0
    # 8 ranks behind one switch keep the long limit
    assert {c.method: c.limit_s for c in _plan(load_topology("dgx-a100"), "allgather", KB)}["milp"] == 30.0


def test_bandwidth_bound_allgather_uses_trees_not_milp():
    names = _names(load_topology("ndv2-2node"), "allgather", 64 * MiB)
    assert "trees" in names and "hierarchical" in names
    assert not {"milp", "lp", "pareto", "rdh", "direct"} & set(names)
    assert "lp" in _names(load_topology("mi250"), "allgather", 64 * MiB)       # switchless: lp won there


def test_alltoall_milp_at_any_size_and_no_chunk_variants():
    # milp with 2-4 chunks per piece ran until the wall clock stopped it (HiGHS nodes of seconds each): whether
    # it finished depended on the machine's load, so auto no longer tries it (module docstring)
    plan = _plan(load_topology("dgx1"), "alltoall", 64 * MiB)
    assert [(c.method, c.chunks) for c in plan] == [
        ("lp", None), ("ring", None), ("direct", None), ("greedy", None), ("milp", None)]
    # lp (the concurrent flow's paths) for bandwidth-bound alltoall up to 32 ranks, switches or not
    assert "lp" in _names(load_topology("dgx-a100-4node"), "alltoall", 64 * MiB)
    assert "lp" not in _names(load_topology("dgx1"), "alltoall", 16 * 1024)
    assert "lp" in _names(gen.torus([8, 8]), "alltoall", GiB)              # 64 ranks: one LP column per link
    assert "lp" in _names(gen.leaf_spine(8, 8, 2), "alltoall", GiB)        # too many for the LP: runtime routes
    # past 64 ranks behind switches, up to 128: direct and lp's runtime-route rounds, not greedy
    # (16 A100 boxes, 1 GiB: lp 0.988 of the bound, direct 0.934, greedy 0.68 in 70 s); ring as the fallback
    assert [c.method for c in _plan(gen.leaf_spine(16, 8, 2), "alltoall", GiB)] == ["lp", "direct", "ring"]
    boxes = gen.boxes_behind_nics(16, 8, intra_bw=300.0)
    assert [c.method for c in _plan(boxes, "alltoall", GiB)] == ["lp", "direct", "ring"]
    assert "greedy" in _names(boxes, "alltoall", KB)                          # latency-bound: as before
    # up to 512 ranks direct alone (32 boxes: lp 0.734, direct 0.914; greedy over 10 minutes)
    assert [c.method for c in _plan(gen.leaf_spine(32, 8, 2), "alltoall", GiB)] == ["direct", "ring"]
    assert [c.method for c in _plan(gen.leaf_spine(128, 8, 2), "alltoall", GiB)] == ["greedy", "ring"]
    assert "lp" not in _names(gen.torus([8, 16]), "alltoall", GiB)           # no switches: the LP is too large
    assert [c.method for c in _plan(load_topology("dgx2"), "alltoall", 64 * MiB)][-1] == "milp"
    assert sum(c.method == "milp" for c in _plan(load_topology("dgx2"), "alltoall", 64 * MiB)) == 1
    # the user's --chunks wins: no variants
    plan = _plan(load_topology("dgx1"), "alltoall", 64 * MiB, SynthOptions(chunks=2))
    assert sum(c.method == "milp" for c in plan) == 1
    # more than 16 ranks: no milp
    assert "milp" not in _names(load_topology("dgx-a100-4node"), "alltoall", 64 * MiB)


def test_large_scale_greedy_first_ring_only_as_a_fallback():
    t256 = gen.torus((16, 16))
    plan = _plan(t256, "allgather", KB)
    assert [c.method for c in plan] == ["rdh", "nccl", "greedy", "ring"]
    assert plan[-1].fallback and not plan[0].fallback
    # exact packing too slow; rings at the cut rate are tried first
    assert [c.method for c in _plan(t256, "allgather", GiB)] == ["multiring", "greedy", "ring"]
    assert [c.method for c in _plan(gen.torus((8, 16)), "allgather", GiB)] == ["multiring", "trees", "greedy", "ring"]
    t1024 = gen.torus((32, 32))
    assert [c.method for c in _plan(t1024, "allgather", GiB)] == ["trees", "ring"]
    assert [c.method for c in _plan(t1024, "alltoall", GiB)] == ["greedy", "ring"]
    assert [c.method for c in _plan(t1024, "allreduce", KB)] == ["greedy", "ring"]
    assert [c.method for c in _plan(t1024, "gather", GiB)] == ["trees", "greedy", "ring"]


def test_latency_bound_past_64_ranks_runs_the_baselines_before_greedy():
    # 72 ranks on a 2:1 leaf-spine, 64 KiB: greedy was the only candidate (774 µs), dbt takes 104 µs, levels (reduce
    # under each leaf first) 81 µs
    fabric = gen.leaf_spine(9, 8, 2, bw=25, alpha=1.0)
    names = _names(fabric, "allreduce", 64 * KB)
    assert names.index("rdh") < names.index("dbt") < names.index("nccl") < names.index("greedy")
    found = synthesize(fabric, "allreduce", 64 * KB)
    greedy = synthesize(fabric, "allreduce", 64 * KB, "greedy")
    assert found.method in ("rdh", "levels", "dbt", "nccl") and found.time_us < greedy.time_us / 2
    # behind leaf switches greedy then runs only where they made no program; on a torus it still runs
    assert next(c for c in _plan(fabric, "allreduce", 64 * KB) if c.method == "greedy").fallback
    assert not next(c for c in _plan(gen.torus((16, 16)), "allgather", KB) if c.method == "greedy").fallback
    assert "greedy" not in [t["method"] for t in found.tried if "time_us" in t]
    # past greedy's scale nothing changes
    assert "rdh" not in _names(gen.torus((32, 32)), "allreduce", KB)


def test_scale_trees_first_where_small_pieces_still_cost_many_alphas():
    # 64x32 torus, 1 GiB: 512 KiB pieces, under BANDWIDTH_PIECE, but 21 α on the 50 GB/s, 0.5 µs links
    t2048 = gen.torus((64, 32))
    inst = Instance(t2048, Collective("allgather", 2048), GiB)
    assert inst.latency_bound and inst.piece_alphas == pytest.approx(GiB / 2048 / 50e3 / 0.5)
    for coll in ("allgather", "reducescatter", "allreduce"):
        plan = _plan(t2048, coll, GiB)
        assert [c.method for c in plan] == ["trees", "greedy", "ring"], coll
        assert [c.fallback for c in plan] == [False, True, True]
    # the same ranks at 1 MiB (512 B pieces, 0.02 α): greedy first, as before
    plan = _plan(t2048, "allgather", MiB)
    assert [c.method for c in plan] == ["greedy", "ring"] and not plan[0].fallback
    # 1024 ranks at 64 MiB: 64 KiB pieces, 2.6 α, under SCALE_PIECE_ALPHAS
    assert [c.method for c in _plan(gen.torus((32, 32)), "allgather", 64 * MiB)] == ["greedy", "ring"]
    # behind switches, or on a mesh (balanced BFS trees, not translated ones), the rule does not apply
    assert not auto._scale_trees(Instance(gen.star(300), Collective("allgather", 300), GiB))
    plan = _plan(gen.mesh((64, 32)), "allgather", GiB)
    assert [c.method for c in plan] == ["greedy", "ring"] and not plan[0].fallback


def test_every_candidate_supports_the_collective():
    from synth.synthesis.registry import METHODS

    for coll in ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce", "gather", "scatter"):
        for size in (KB, 64 * MiB):
            names = _names(load_topology("dgx1"), coll, size)
            assert names and names[0] == "ring"
            assert all(coll in METHODS[n].collectives for n in names), (coll, names)


# ---- best of what it tried ---------------------------------------------------------------------------
@pytest.mark.parametrize("topology, coll, size", [
    (gen.ring(4), "allgather", 1000),
    (gen.fully_connected(4), "alltoall", 4 * MiB),
    (gen.star(4), "allreduce", 64 * KB),
])
def test_auto_is_never_slower_than_any_candidate_it_tried(topology, coll, size):
    res = synthesize(topology, coll, size, "auto")
    ran = [row for row in res.tried if "time_us" in row]
    assert len(ran) >= 2
    assert res.time_us == pytest.approx(min(row["time_us"] for row in ran))
    for row in ran:  # the same candidate alone, through the same pipeline
        alone = synthesize(topology, coll, size, row["method"], SynthOptions(chunks=row.get("chunks"),
                                                                              time_limit=10))
        assert res.time_us <= alone.time_us * (1 + 1e-9), (row, alone.time_us)
    assert res.bound_us is not None and res.time_us >= res.bound_us * (1 - 1e-9)


def test_auto_reaches_1_10_of_the_bound_on_dgx1_alltoall_64mib():
    """Issue 5 target, within auto's default budget (auto keeps lp's concurrent-flow paths at 8 chunks per
    piece, 1.016x, which MSCCL runtimes run on the 2^24-element buffer; milp with 4 chunks took 1.048x)."""
    res = synthesize(load_topology("dgx1"), "alltoall", 64 * MiB, "auto")
    assert res.time_us <= 1.10 * res.bound_us
    assert res.synthesis_s < 75


def _skipped_after_the_first_close_enough(res) -> list[str]:
    ran = [row for row in res.tried if "time_us" in row]
    first = next(i for i, row in enumerate(res.tried) if row["time_us"] <= 1.01 * res.bound_us)
    assert ran[-1] is res.tried[first]
    return [row["method"] for row in res.tried[first + 1:] if "skipped" in row]


def test_auto_stops_once_within_one_percent_of_the_bound():
    # bandwidth-bound: trees runs first and is within 1 % on dgx1 1 GiB, so the rest is skipped (the
    # ring is within 1 % too); by default every program kept is one the runtime runs at SIZE
    plan = [c.method for c in _plan(load_topology("dgx1"), "allgather", GiB)]
    for options in (SynthOptions(runtime_chunks=False), SynthOptions()):
        res = synthesize(load_topology("dgx1"), "allgather", GiB, "auto", options)
        assert res.time_us <= 1.01 * res.bound_us
        skipped = _skipped_after_the_first_close_enough(res)
        assert skipped and skipped == plan[len(plan) - len(skipped):]
    assert runtime_divides(res.program.nchunksperloop, GiB)


def test_auto_does_not_stop_at_a_program_the_runtime_would_not_run():
    # 2**28 + 3 elements is prime: no ring count divides it, so the ring within 1 % does not stop the plan
    size = GiB + 12
    res = synthesize(load_topology("dgx1"), "allgather", size, "auto")
    ring = next(row for row in res.tried if row["method"] == "ring")
    assert "time_us" in ring and ring["time_us"] <= 1.01 * res.bound_us
    assert not runtime_divides(res.program.nchunksperloop, size)
    assert "trees" in [row["method"] for row in res.tried if "time_us" in row]


# ---- the time budget ---------------------------------------------------------------------------------
def _sleeper(inst):
    """A method that uses all the time it is given (like a solver that runs to its limit)."""
    from synth.synthesis.ring import synthesize as ring

    assert inst.options.time_limit is not None
    time.sleep(inst.options.time_limit)
    return replace(ring(inst), method="sleeper")


@pytest.fixture
def sleeper(monkeypatch):
    import synth.synthesis.registry as registry

    real = registry.get_method
    spec = MethodSpec("sleeper", _sleeper, frozenset({"allgather"}), "sleeps for its time limit")
    monkeypatch.setattr(registry, "get_method", lambda name: spec if name == "sleeper" else real(name))
    monkeypatch.setattr(auto, "candidates", lambda *a: ["sleeper", "sleeper", "ring", "sleeper"])
    rules = auto.RULES

    def cap(seconds: float) -> None:  # the sleeper's own limit in the rule table
        monkeypatch.setattr(auto, "RULES", rules + (auto.Rule("sleeper", lambda i: True, seconds),))

    cap(0.6)
    return cap


def test_each_candidate_gets_its_own_limit(sleeper):
    # a candidate's work limit W is also a wall-clock safety stop of CLOCK_FACTOR * W seconds
    sleeper(0.03)
    t0 = time.perf_counter()
    res = synthesize(gen.ring(4), "allgather", 2**20, "auto", SynthOptions(time_limit=30))
    wall = time.perf_counter() - t0
    assert [row["method"] for row in res.tried] == ["sleeper", "sleeper", "ring", "sleeper"]
    assert all("time_us" in row for row in res.tried) and res.not_tried == []
    clock = auto.CLOCK_FACTOR * 0.03
    assert 3 * clock <= wall < 3 * clock + 10          # three sleeps of the candidate's clock, not 30 s each


def test_the_total_budget_is_respected_and_what_it_cut_is_listed(sleeper):
    sleeper(100.0)
    t0 = time.perf_counter()
    res = synthesize(gen.ring(4), "allgather", 2**20, "auto", SynthOptions(time_limit=1.5))
    wall = time.perf_counter() - t0
    rows = res.tried
    assert "time_us" in rows[0]                      # the first sleeper gets the whole 1.5 s
    assert all("--time-limit of 1.5 s ran out" in row.get("not_tried", "") for row in rows[1:]), rows
    assert [row["method"] for row in res.not_tried] == ["sleeper", "ring", "sleeper"]
    assert res.to_dict()["not_tried"] == res.not_tried
    assert wall < 1.5 + 5


def test_a_candidate_the_clock_stops_is_not_used(sleeper, monkeypatch):
    # a method cut short by the wall clock would give a machine-dependent program: it is listed as
    # not tried, never kept, and the plan goes on (its own clock) or stops (the user's --time-limit)
    import synth.synthesis.registry as registry
    from synth.errors import TimeLimitReached

    def stopped(inst):
        raise TimeLimitReached("sleeper: the time limit ran out before it finished; allow more time")

    spec = MethodSpec("sleeper", stopped, frozenset({"allgather"}), "always cut by the clock")
    real = registry.get_method
    monkeypatch.setattr(registry, "get_method", lambda name: spec if name == "sleeper" else real(name))
    res = synthesize(gen.ring(4), "allgather", 2**20, "auto")
    assert res.method == "ring"
    assert [row["method"] for row in res.not_tried] == ["sleeper", "sleeper", "sleeper"]
    assert all(row["reason"].startswith("stopped by the wall clock") for row in res.not_tried)


def test_with_no_program_yet_the_next_candidate_still_runs(sleeper, monkeypatch):
    monkeypatch.setattr(auto, "candidates", lambda *a: ["sleeper", "ring"])
    sleeper(100.0)
    import synth.synthesis.registry as registry

    def failing(inst):
        time.sleep(inst.options.time_limit)
        raise auto_error

    from synth.errors import SynthError

    auto_error = SynthError("no schedule within the limit")
    spec = MethodSpec("sleeper", failing, frozenset({"allgather"}), "fails after its limit")
    real = registry.get_method
    monkeypatch.setattr(registry, "get_method", lambda name: spec if name == "sleeper" else real(name))
    res = synthesize(gen.ring(4), "allgather", 2**20, "auto", SynthOptions(time_limit=1.0))
    assert res.method == "ring"
    assert "no schedule" in res.tried[0]["error"]


def test_candidate_options_work_clock_and_chunks():
    cand = auto.Candidate("milp", 30.0, chunks=3)
    opts = auto.candidate_options(SynthOptions(), cand, None)
    assert opts.work_limit == 30.0 and opts.time_limit == auto.CLOCK_FACTOR * 30.0 and opts.chunks == 3
    # the user's --time-limit caps the clock, never the work
    opts = auto.candidate_options(SynthOptions(time_limit=12), cand, 12.0)
    assert opts.work_limit == 30.0 and opts.time_limit == 12.0
    assert auto.candidate_options(SynthOptions(), auto.Candidate("ring"), None).time_limit is None
    assert auto.candidate_options(SynthOptions(), auto.Candidate("ring"), 7.0).time_limit == 7.0
    assert auto.candidate_options(SynthOptions(), auto.Candidate("ring"), 7.0).work_limit is None
    assert auto.candidate_options(SynthOptions(chunks=2), auto.Candidate("ring"), 7.0).chunks == 2
    assert auto.candidate_options(SynthOptions(), cand, auto.MIN_START_S / 2) is None
    assert auto.budget_s(SynthOptions()) is None
    assert auto.budget_s(SynthOptions(time_limit=5)) == 5.0


def test_bandwidth_bound_cases_run_the_tree_methods_first():
    # expected quality first: a --time-limit that runs out cuts the baselines, not the tree methods
    plan = [c.method for c in _plan(load_topology("dgx-a100-2node"), "allgather", 64 * MiB)]
    assert plan[0] in auto.TREE_METHODS and plan.index("trees") < plan.index("ring")
    plan = [c.method for c in _plan(load_topology("mi250"), "allgather", 64 * MiB)]
    assert plan[:3] == ["multiring", "trees", "mirror"]
    assert [c.method for c in _plan(load_topology("dgx1"), "allreduce", KB)][0] == "ring"   # latency-bound


def test_auto_says_what_keeping_a_runnable_program_costs(monkeypatch):
    # 6 ranks: no trees allreduce of equal pieces has a chunk count that divides a power-of-two buffer. Where the
    # ring the runtime runs is within RUNNABLE_LOSS of it, auto keeps the ring and names the faster program it
    # passed over; --any-chunks keeps that one. (multiring's rings come within 1 % of trees here, spantree picks a
    # runnable count of its own, and trees' pieces a unit apart run too (tests/test_ownership.py): all left out.)
    import synth.pipeline as pipeline

    plain = auto.candidates
    monkeypatch.setattr(auto, "candidates", lambda *a: [m for m in plain(*a) if m not in ("multiring", "spantree")])
    monkeypatch.setattr(trees_method, "runnable_forests", lambda *a: iter(()))
    monkeypatch.setattr(pipeline, "SPREAD_TRANSFERS", 0)   # nor their chunks spread (tests/test_spread_chunks.py)
    monkeypatch.setattr(pipeline, "RUNNABLE_LOSS", 1.0)
    topology = gen.torus([3, 2])
    kept = synthesize(topology, "allreduce", 64 * MiB)
    assert kept.method == "ring" and runtime_divides(kept.program.nchunksperloop, 64 * MiB)
    faster = min((row for row in kept.tried if "time_us" in row), key=lambda row: row["time_us"])
    assert faster["time_us"] < kept.time_us < faster["time_us"] * 2
    note = next(n for n in kept.notes if "--any-chunks" in n)
    assert note.startswith(f"a program of {faster['method']} took {faster['time_us']:.1f} us")
    fastest = synthesize(topology, "allreduce", 64 * MiB, options=SynthOptions(runtime_chunks=False))
    assert fastest.method == faster["method"] and fastest.time_us == pytest.approx(faster["time_us"], rel=1e-6)
    assert not any("--any-chunks" in n for n in fastest.notes)


def test_a_far_slower_runnable_program_is_no_answer(monkeypatch):
    # the same case at the default RUNNABLE_LOSS (25 %): the ring takes 1.5x the trees' time, so auto keeps
    # the trees and says that the runtimes would not run them at this SIZE, and what the ring takes
    import synth.pipeline as pipeline

    plain = auto.candidates
    monkeypatch.setattr(auto, "candidates", lambda *a: [m for m in plain(*a) if m not in ("multiring", "spantree")])
    monkeypatch.setattr(trees_method, "runnable_forests", lambda *a: iter(()))
    monkeypatch.setattr(pipeline, "SPREAD_TRANSFERS", 0)
    kept = synthesize(gen.torus([3, 2]), "allreduce", 64 * MiB)
    ring = next(row for row in kept.tried if row["method"] == "ring")
    assert ring["time_us"] > kept.time_us * (1 + pipeline.RUNNABLE_LOSS)
    assert not runtime_divides(kept.program.nchunksperloop, 64 * MiB)
    assert any(n.startswith(f"kept {kept.method} although") and "ring" in n for n in kept.notes)


def test_pipeline_times_a_methods_alternatives_and_keeps_the_fastest(monkeypatch):
    """A method may hand runner-ups it cannot rank (Schedule.alternatives): each is lowered, verified and
    simulated like its schedule, and the fastest is what the pipeline reports and writes."""
    import synth.synthesis.registry as registry
    from synth.synthesis.baselines import DIRECT
    from synth.synthesis.ring import METHOD as RING

    topology = load_topology("dgx1")
    collective = Collective("alltoall", 8)
    slow = RING.run(Instance(topology, collective, 64 * MiB, SynthOptions()))
    fast = DIRECT.run(Instance(topology, collective, 64 * MiB, SynthOptions()))
    ring_us = synthesize(topology, "alltoall", 64 * MiB, "ring").time_us
    direct_us = synthesize(topology, "alltoall", 64 * MiB, "direct").time_us
    assert direct_us < ring_us

    def proposing(*args) -> object:
        return replace(slow, alternatives=(fast,))

    spec = MethodSpec("proposer", proposing, frozenset({"alltoall"}), "a slow schedule and a faster runner-up")
    real = registry.get_method
    monkeypatch.setattr(registry, "get_method", lambda name: spec if name == "proposer" else real(name))
    result = synthesize(topology, "alltoall", 64 * MiB, "proposer")
    assert result.time_us == pytest.approx(direct_us)
    assert result.schedule.transfers == fast.transfers and result.schedule.alternatives == ()

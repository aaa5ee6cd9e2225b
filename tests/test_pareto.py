"""SCCL (chunks, steps, rounds) synthesis on CP-SAT: bounds, instances, the frontier, schedules, CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

import pytest
from click.testing import CliRunner

from synth.collectives import Collective
from synth.errors import SynthError
from synth.synthesis.pareto import (
    check_algorithm,
    explore,
    pareto_frontier,
    plan_for,
    predicted_time_us,
    rounds_per_chunk_lower_bound,
    solve_instance,
    steps_lower_bound,
)
from synth.synthesis.steps import bandwidth_unit, fabric
from synth.topology.generators import ring
from synth.topology.io import load_topology

# msccl-tools examples/dgx1_allgather.ipynb (solve_all_latency_bandwidth_tradeoffs on DGX1 Allgather,
# no monotonic assumption): every instance it tried, in order, and whether it was satisfiable.
SCCL_DGX1_ALLGATHER_TRIED = [
    (1, 2, 2, "sat"), (2, 2, 3, "sat"), (3, 2, 4, "unsat"), (3, 3, 4, "sat"), (4, 2, 5, "unsat"),
    (4, 3, 5, "sat"), (5, 2, 6, "unsat"), (5, 3, 6, "sat"), (6, 2, 7, "unsat"), (6, 3, 7, "sat"),
]
# ... and its Pareto-optimal algorithms after prune_pareto_optimal (msccl-tools SYNTHESIS.md, notebook).
SCCL_DGX1_ALLGATHER_FRONTIER = [(2, 2, 3), (6, 3, 7)]


@pytest.fixture(scope="module")
def dgx1():
    return load_topology("dgx1")


def _tried(exp):
    return [(t["chunks"], t["steps"], t["rounds"], t["status"]) for t in exp.tried]


def _problem(topology, name, chunks=1):
    _, phases = plan_for(Collective(name, topology.num_ranks), chunks)
    return phases[0][0]


# ---- units and bounds --------------------------------------------------------------------------------
def test_bandwidth_unit_recovers_nvlink_counts(dgx1):
    fab = fabric(dgx1)
    assert fab.unit_GBps == 25.0 and fab.exact
    assert sorted(set(fab.mult.tolist())) == [1, 2]
    # every DGX-1 GPU has 6 NVLinks out (rows of the msccl-tools matrix sum to 6)
    for u in range(8):
        assert sum(int(fab.mult[j]) for j in range(fab.vl.count) if fab.vl.src[j] == u) == 6
    unit, mult, exact = bandwidth_unit(__import__("numpy").array([300.0, 25.0, 12.5]))
    assert unit == 12.5 and mult.tolist() == [24, 2, 1] and exact


def test_lower_bounds(dgx1):
    assert steps_lower_bound(fabric(dgx1), _problem(dgx1, "allgather")) == 2
    assert rounds_per_chunk_lower_bound(fabric(dgx1), _problem(dgx1, "allgather")) == Fraction(7, 6)
    r4 = ring(4)
    assert steps_lower_bound(fabric(r4), _problem(r4, "allgather")) == 2
    assert rounds_per_chunk_lower_bound(fabric(r4), _problem(r4, "allgather")) == Fraction(3, 2)
    dgx2 = load_topology("dgx2")
    # NVSwitch: one chunk in and one out per GPU per round -> 15 rounds for 15 chunks, 1 step
    assert steps_lower_bound(fabric(dgx2), _problem(dgx2, "allgather")) == 1
    assert rounds_per_chunk_lower_bound(fabric(dgx2), _problem(dgx2, "allgather")) == 15
    # scatter: the root's 6 NVLinks carry 7 chunks
    assert rounds_per_chunk_lower_bound(fabric(dgx1), _problem(dgx1, "scatter")) == Fraction(7, 6)


def test_rounds_lp_keeps_to_its_time_limit(dgx1):
    # alltoall on 27 ranks: HiGHS needs minutes for this LP; unfinished, it bounds nothing
    torus = load_topology("torus-3x3x3")
    assert rounds_per_chunk_lower_bound(fabric(torus), _problem(torus, "alltoall"), time_limit=0.01) == 0
    assert rounds_per_chunk_lower_bound(fabric(dgx1), _problem(dgx1, "allgather"), time_limit=60) == Fraction(7, 6)


def test_cut_bound_closes_the_sccl_lp_hole():
    """Two DGX-1 boxes behind one 12.5 GB/s NIC each: 8 chunks must cross the NIC, so R/C >= 8. SCCL's
    LP lets ranks justify each other's copies and says much less; the cut bound gets 8."""
    from synth.synthesis.pareto import cut_rounds_per_chunk

    ndv2 = load_topology("ndv2-2node")
    fab = fabric(ndv2)
    assert fab.unit_GBps == 12.5
    assert rounds_per_chunk_lower_bound(fab, _problem(ndv2, "allgather")) < 2
    assert cut_rounds_per_chunk(ndv2, "allgather", 0, fab.unit_GBps) == 8
    assert explore(ndv2, "allgather", time_limit=1e-3).rounds_per_chunk_lb == 8
    dgx1 = load_topology("dgx1")
    assert cut_rounds_per_chunk(dgx1, "alltoall", 0, 25.0) == Fraction(8, 3)


# ---- instances -----------------------------------------------------------------------------------------
def test_instance_sat_unsat_and_independent_check(dgx1):
    fab = fabric(dgx1)
    status, algo = solve_instance(fab, _problem(dgx1, "allgather", 3), 2, 4, groups=3)
    assert status == "unsat" and algo is None
    problem = _problem(dgx1, "allgather", 2)
    status, algo = solve_instance(fab, problem, 2, 3, groups=2)
    assert status == "sat"
    assert sum(algo.rounds_per_step) == 3 and min(algo.rounds_per_step) >= 1
    check_algorithm(fab, problem, algo)
    with pytest.raises(SynthError, match="short of a destination"):
        check_algorithm(fab, problem, replace(algo, sends=algo.sends[:-1]))
    late = tuple((2 if s == 1 else 1, c, j) for s, c, j in algo.sends)   # swap the two steps
    with pytest.raises(SynthError, match="before it holds it"):
        check_algorithm(fab, problem, replace(algo, sends=late))
    with pytest.raises(SynthError, match="overloads"):
        check_algorithm(fab, problem, replace(algo, rounds_per_step=(1, 1), rounds=2))


# ---- frontiers -----------------------------------------------------------------------------------------
def test_ring4_allgather_frontier_by_hand():
    """Ring of 4, one unit per link: diameter 2; each rank receives 3C chunks over 2 links, so R/C >= 3/2.
    (1,2,2): send to both neighbours, then forward clockwise. (2,2,3): step 1 (1 round) sends sub-chunk a
    clockwise and b counter-clockwise; step 2 (2 rounds) each link carries the forwarded piece of the
    opposite rank plus the sender's other sub-chunk. Both bounds are met, so the frontier is one point."""
    exp = explore(ring(4), "allgather", max_chunks=4, time_limit=60)
    assert _tried(exp) == [(1, 2, 2, "sat"), (2, 2, 3, "sat")]
    assert [(p.chunks, p.steps, p.rounds) for p in exp.points] == [(2, 2, 3)]
    assert exp.bandwidth_optimal


def test_dgx1_allgather_first_points_match_sccl(dgx1):
    exp = explore(dgx1, "allgather", max_chunks=3, time_limit=120)
    assert _tried(exp) == SCCL_DGX1_ALLGATHER_TRIED[:4]
    assert [(p.chunks, p.steps, p.rounds) for p in exp.points] == [(2, 2, 3), (3, 3, 4)]
    assert exp.stopped == "reached max chunks 3" and not exp.bandwidth_optimal


@pytest.mark.slow
def test_dgx1_allgather_frontier_matches_sccl(dgx1):
    exp = explore(dgx1, "allgather", time_limit=300)
    assert _tried(exp) == SCCL_DGX1_ALLGATHER_TRIED
    assert [(p.chunks, p.steps, p.rounds) for p in exp.points] == SCCL_DGX1_ALLGATHER_FRONTIER
    assert exp.bandwidth_optimal and exp.points[-1].bandwidth_cost == Fraction(7, 6)


def test_exhaustive_pass_tries_what_sccl_skips():
    """Ring-8 broadcast: SCCL's pass stops chunk count 4 at R = 5 with S = 5; the exhaustive pass also
    asks whether 4 steps can reach a ratio below 2 (R = 6, 7 with C = 4: both infeasible)."""
    base = explore(ring(8), "broadcast", max_chunks=4)
    full = explore(ring(8), "broadcast", max_chunks=4, exhaustive=True)
    extra = [(t["chunks"], t["steps"], t["rounds"], t["status"]) for t in full.tried if t.get("pass")]
    assert extra == [(4, 4, 6, "unsat"), (4, 4, 7, "unsat")]
    assert [(p.chunks, p.steps, p.rounds) for p in full.points] == [(p.chunks, p.steps, p.rounds)
                                                                     for p in base.points] == [(2, 4, 4), (4, 5, 5)]


def test_dgx2_allgather_is_one_step(capsys):
    points = pareto_frontier(load_topology("dgx2"), "allgather", max_chunks=2, time_limit=120)
    assert [(p.chunks, p.steps, p.rounds) for p in points] == [(1, 1, 15)]


def test_time_limit_stops_cleanly_and_deterministically(dgx1):
    # the budget is CP-SAT deterministic time: the same tiny budget stops at the same frontier on any machine
    runs = [explore(dgx1, "allgather", time_limit=1e-3) for _ in range(2)]
    assert all(exp.stopped == "time limit" for exp in runs)
    assert [(p.chunks, p.steps, p.rounds) for p in runs[0].points] == [(p.chunks, p.steps, p.rounds)
                                                                     for p in runs[1].points]
    assert [t["status"] for t in runs[0].tried] == [t["status"] for t in runs[1].tried]
    with pytest.raises(SynthError, match="positive"):
        explore(dgx1, "allgather", time_limit=0)


def test_max_steps_below_bound_finds_nothing(dgx1):
    exp = explore(dgx1, "allgather", max_steps=1)
    assert exp.points == [] and "at least 2 steps" in exp.stopped
    with pytest.raises(SynthError):
        explore(dgx1, "allgather", max_chunks=0)


# ---- schedules lower and verify ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["allgather", "reducescatter", "allreduce", "broadcast", "gather"])
def test_frontier_schedules_lower_and_verify(dgx1, name):
    from synth.program.lower import lower
    from synth.simulation import simulate
    from synth.verification import verify

    size = 1 << 20
    exp = explore(dgx1, name, max_chunks=2, time_limit=120, size_bytes=size)
    assert exp.points
    for p in exp.points:
        program = lower(p.schedule)
        result = verify(program, p.schedule.collective)
        assert result.ok, result.errors[:3]
        steps = {t.group for t in p.schedule.transfers}
        assert len(steps) == p.steps
        sim = simulate(program, dgx1, size)
        # the method's α-β step model is what the simulator measures, up to merging details
        assert sim.time_us == pytest.approx(predicted_time_us(p, size), rel=0.2)
        if name in ("reducescatter", "allreduce"):
            assert any(t.reduce for t in p.schedule.transfers)


def test_pipeline_method(dgx1):
    from synth.pipeline import synthesize
    from synth.synthesis.base import SynthOptions

    res = synthesize(dgx1, "allgather", 1 << 20, "pareto", SynthOptions(time_limit=60, extra={"max_chunks": 2}))
    assert res.method == "pareto" and res.schedule.notes["steps"] == 2
    assert res.time_us == pytest.approx(res.predicted_time_us, rel=0.05)
    fixed = synthesize(dgx1, "allgather", 1 << 20, "pareto", SynthOptions(time_limit=60, chunks=3))
    assert fixed.collective.chunk_factor == 3 and fixed.schedule.notes["rounds"] == 4
    # allreduce --chunks counts buffer chunks (SCCL's C): 3 is not a multiple of the 8 owners, so only the
    # combining encoding takes it (tests/test_combining.py)


# ---- CLI -----------------------------------------------------------------------------------------------
def test_cli_json_and_table():
    from synth.cli import cli as main

    runner = CliRunner()
    out = runner.invoke(main, ["pareto", "-t", "dgx1", "-c", "allgather", "--max-chunks", "2", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert [(r["chunks"], r["steps"], r["rounds"]) for r in doc["frontier"]] == [(2, 2, 3)]
    row = doc["frontier"][0]
    assert row["bandwidth_cost"] == "3/2" and row["synthesis_s"] >= 0 and row["time_us"] > 0
    assert doc["steps_lower_bound"] == 2 and doc["rounds_per_chunk_lower_bound"] == "7/6"
    table = runner.invoke(main, ["pareto", "-t", "dgx1", "-c", "allgather", "--max-chunks", "1"])
    assert table.exit_code == 0 and "Pareto frontier" in table.output and "7/6" in table.output
    bad = runner.invoke(main, ["pareto", "-t", "dgx1", "-c", "allgather", "--max-steps", "0"])
    assert bad.exit_code == 2 and "max-steps" in bad.output


# ---- SCCL's published 2-step DGX-1 Allgather (msccl-tools examples/dgx1_allgather.ipynb, `algo.steps`) ----
# msccl-tools cannot be installed here (not on PyPI), so the algorithm is transcribed by hand from the
# notebook's printed output as (chunk, src, dst) per step; both steps use 1 round.
SCCL_DGX1_ALLGATHER_STEPS2 = [
    (1, [(0, 0, 1), (0, 0, 3), (0, 0, 4), (1, 1, 2), (1, 1, 3), (1, 1, 5), (2, 2, 1), (2, 2, 3), (2, 2, 6),
         (3, 3, 1), (3, 3, 2), (3, 3, 7), (4, 4, 0), (4, 4, 6), (4, 4, 7), (5, 5, 1), (5, 5, 7), (6, 6, 4),
         (6, 6, 5), (6, 6, 7), (7, 7, 3), (7, 7, 4)]),
    (1, [(0, 3, 2), (0, 4, 5), (0, 4, 6), (0, 4, 7), (1, 2, 0), (1, 2, 6), (1, 3, 7), (1, 5, 4), (2, 1, 0),
         (2, 6, 4), (2, 6, 5), (2, 6, 7), (3, 1, 5), (3, 2, 6), (3, 3, 0), (3, 7, 4), (4, 0, 1), (4, 0, 2),
         (4, 0, 3), (4, 7, 5), (5, 1, 0), (5, 1, 2), (5, 1, 3), (5, 5, 4), (5, 5, 6), (6, 4, 0), (6, 5, 1),
         (6, 6, 2), (6, 7, 3), (7, 3, 1), (7, 3, 2), (7, 4, 0), (7, 7, 5), (7, 7, 6)]),
]
FIXTURE = __import__("pathlib").Path(__file__).parent / "fixtures" / "sccl_dgx1_allgather_steps2.xml"


def _sccl_program(dgx1):
    from synth.program.lower import lower
    from synth.synthesis.pareto import algorithm_from_steps, to_schedule

    fab = fabric(dgx1)
    coll, phases = plan_for(Collective("allgather", 8), 1)
    algo = algorithm_from_steps(fab, phases[0][0], SCCL_DGX1_ALLGATHER_STEPS2)
    schedule = to_schedule(dgx1, fab, None, coll, phases, [algo], 1 << 20, (1, 2, 2))
    return algo, lower(schedule, name="sccl-dgx1-allgather-steps2")


def test_sccl_published_algorithm_satisfies_our_encoding(dgx1):
    """SCCL's own (1,2,2) solution passes our constraint checker (held-before-send, NVLink counts as
    per-round capacity, postcondition), and CP-SAT also decides (1,2,2) satisfiable."""
    algo, _ = _sccl_program(dgx1)
    assert (algo.chunks, algo.steps, algo.rounds) == (1, 2, 2)
    status, _ = solve_instance(fabric(dgx1), _problem(dgx1, "allgather"), 2, 2)
    assert status == "sat"
    bad = [(1, SCCL_DGX1_ALLGATHER_STEPS2[0][1] + [(0, 0, 7)]), SCCL_DGX1_ALLGATHER_STEPS2[1]]
    with pytest.raises(SynthError, match="not a link"):
        from synth.synthesis.pareto import algorithm_from_steps

        algorithm_from_steps(fabric(dgx1), _problem(dgx1, "allgather"), bad)


def test_sccl_fixture_xml_verifies(dgx1):
    """The fixture is SCCL's algorithm lowered once by our pipeline; it must verify, and every received
    chunk must arrive over a connection SCCL's algorithm uses for that chunk."""
    from synth.program.msccl_xml import program_from_xml
    from synth.simulation import simulate
    from synth.verification import verify

    program = program_from_xml(FIXTURE.read_text(), source=str(FIXTURE))
    result = verify(program, Collective("allgather", 8))
    assert result.ok, result.errors[:3]
    sccl = {(src, dst, c) for _, sends in SCCL_DGX1_ALLGATHER_STEPS2 for c, src, dst in sends}
    got = {(tb.recv, gpu.id, step.dstoff + k) for gpu in program.gpus for tb in gpu.threadblocks
           for step in tb.steps if step.type == "r" for k in range(step.cnt)}
    assert got == sccl
    # two synchronous steps of one chunk per NVLink: 2 x (alpha + 1 MiB / 8 / 25 GB/s) at most per link
    assert simulate(program, dgx1, 1 << 20).time_us <= 2 * (0.7 + (1 << 20) / 8 / 25e3) * 2 + 1e-6

"""The time-expanded MILP (TE-CCL): solver agreement, time-outs, milp <= greedy, verified programs."""

from __future__ import annotations

import pytest
from schedule_check import check_schedule, full, line, ring, star

from synth.collectives import COLLECTIVES, Collective
from synth.synthesis import greedy, milp
from synth.synthesis.base import SynthOptions

FORCE = {"milp_shortcut": False, "milp_warm_start": False}   # make every solver do the work


@pytest.mark.parametrize("topo,name,optimum_epochs", [
    (ring(4), "allgather", 2),
    (full(3), "alltoall", 1),
    (line(4), "alltoall", 4),
    (ring(5), "reducescatter", 2),
], ids=["ring4-allgather", "fc3-alltoall", "line4-alltoall", "ring5-reducescatter"])
def test_four_solvers_reach_the_same_optimum(topo, name, optimum_epochs):
    coll = Collective(name, topo.num_ranks)
    objectives = {}
    for solver in ("highs", "cbc", "cp-sat", "scip"):
        schedule = milp.synthesize(topo, coll, 1e6, SynthOptions(solver=solver, time_limit=60, extra=FORCE))
        notes = schedule.notes
        assert notes["status"] == "optimal", (solver, notes)
        assert notes["solver"] == solver
        assert "fallback" not in notes, notes
        assert notes["solver_gap"] == pytest.approx(0.0)
        assert notes["solver_bound_us"] == pytest.approx(notes["solver_objective_us"])
        tau = notes["phases"][name]["tau_us"]
        assert notes["solver_objective_us"] == pytest.approx(optimum_epochs * tau)
        check_schedule(schedule, topo)
        objectives[solver] = notes["solver_objective_us"]
    assert len({round(v, 9) for v in objectives.values()}) == 1, objectives


def test_milp_beats_greedy_on_ring8_alltoall():
    topo = ring(8)
    coll = Collective("alltoall", 8)
    g = greedy.synthesize(topo, coll, 1e6, SynthOptions())
    m = milp.synthesize(topo, coll, 1e6, SynthOptions(time_limit=60))
    check_schedule(m, topo)
    assert m.notes["status"] == "optimal"
    # link-load bound: 8 ranks x 16 chunk-hops over 16 links = 8 epochs of 3 µs, and the MILP meets it
    assert m.notes["phases"]["alltoall"]["lb_epochs"] == 8
    assert m.makespan == pytest.approx(8 * (0.5 + 1e6 / 8 / 50e3))
    assert m.makespan < g.makespan - 1


def test_time_limit_gives_feasible_with_gap():
    # 16 ranks behind one switch, latency-bound: the batching optimum (5 epochs) needs a real search
    topo = star(16, bw=125, alpha=0.35)
    schedule = milp.synthesize(topo, Collective("allgather", 16), 1e3, SynthOptions(time_limit=0.3))
    notes = schedule.notes
    assert notes["status"] == "feasible"
    assert notes["solver_gap"] > 0
    assert notes["solver_bound_us"] < notes["solver_objective_us"]
    assert schedule.transfers
    check_schedule(schedule, topo)


@pytest.mark.parametrize("topo,name,size", [
    (ring(6), "alltoall", 1e6), (line(5), "allgather", 1e3), (star(5), "broadcast", 1e6),
    (ring(4), "allreduce", 1e6), (full(4), "gather", 1e3),
])
def test_milp_is_never_slower_than_greedy(topo, name, size):
    coll = Collective(name, topo.num_ranks)
    g = greedy.synthesize(topo, coll, size, SynthOptions())
    m = milp.synthesize(topo, coll, size, SynthOptions(time_limit=30))
    check_schedule(m, topo)
    assert m.predicted_time_us <= g.predicted_time_us + 1e-9


def test_epoch_length_and_lower_bound_shortcut():
    topo = ring(8)
    schedule = milp.synthesize(topo, Collective("allgather", 8), 8e6, SynthOptions())
    phase = schedule.notes["phases"]["allgather"]
    assert phase["tau_us"] == pytest.approx(0.5 + 1e6 / 50e3)      # one chunk on the bottleneck link
    assert phase["lb_epochs"] == phase["horizon_epochs"] == 4          # distance 4 on a ring of 8
    assert phase["proved_by"] == "lower bound = warm start"
    assert schedule.notes["status"] == "optimal"


@pytest.mark.parametrize("name", COLLECTIVES)
def test_every_program_verifies(name):
    pipeline = pytest.importorskip("synth.pipeline")
    for topo in (ring(5), star(4)):
        result = pipeline.synthesize(topo, name, 1 << 20, "milp", SynthOptions(time_limit=20), root=1)
        assert result.status in ("optimal", "feasible")
        assert result.method == "milp"
        assert result.time_us > 0

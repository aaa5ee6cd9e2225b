"""The solver layer: every backend reaches the same optimum; statuses and gaps are honest."""

import numpy as np
import pytest

from synth.errors import SynthError, TimeLimitReached
from synth.solvers import NODES_PER_WORK_S, SOLVERS, Model, relative_gap, solve

MIP_SOLVERS = ["highs", "cbc", "pulp-highs", "scip", "cp-sat"]
LP_SOLVERS = ["highs", "cbc", "pulp-highs", "glop", "pdlp", "scip"]


def small_mip() -> Model:
    # max 5a + 4b + 3c  s.t.  2a+3b+c <= 5, 4a+b+2c <= 11, 3a+4b+2c <= 8, integers in [0, 10].
    # Enumerating by hand: (2, 0, 1) gives 13 and no integer point does better.
    model = Model("mip")
    x = model.add_vars(3, 0, 10, integer=True)
    model.add_rows([0, 0, 0, 1, 1, 1, 2, 2, 2], [0, 1, 2] * 3, [2, 3, 1, 4, 1, 2, 3, 4, 2], -np.inf, [5, 11, 8])
    model.set_objective(x, [5, 4, 3], sense="max")
    return model


@pytest.mark.parametrize("solver", MIP_SOLVERS)
def test_mip_backends_agree(solver):
    result = solve(small_mip(), solver, time_limit=30)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(13.0)
    assert result.gap == pytest.approx(0.0)
    assert list(np.round(result.values)) == [2, 0, 1]


@pytest.mark.parametrize("solver", LP_SOLVERS)
def test_lp_backends_agree(solver):
    # min 2x + 3y s.t. x + y >= 1, x - y <= 0.5: optimum at x=0.75, y=0.25 with value 2.25.
    model = Model("lp")
    y = model.add_vars(2, 0)
    model.add_row(y, [1, 1], lb=1)
    model.add_row(y, [1, -1], ub=0.5)
    model.set_objective(y, [2, 3])
    result = solve(model, solver)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(2.25, rel=1e-6)


@pytest.mark.parametrize("solver", ["highs", "cbc", "scip", "cp-sat"])
def test_infeasible_is_reported(solver):
    model = Model("infeasible")
    x = model.add_vars(1, 0, 1, integer=True)
    model.add_row(x, [1], lb=2)
    model.set_objective(x, [1])
    assert solve(model, solver, time_limit=10).status == "infeasible"


def test_lp_only_solver_rejects_mip():
    with pytest.raises(SynthError, match="LPs only"):
        solve(small_mip(), "glop")


def test_unknown_solver():
    with pytest.raises(SynthError, match="unknown solver"):
        solve(small_mip(), "gurobi")
    assert "highs" in SOLVERS


def _hard_knapsack() -> Model:
    # A random 0/1 knapsack-cover model large enough that a few nodes cannot prove optimality,
    # with a trivially feasible warm start, so an incumbent always exists.
    rng = np.random.default_rng(7)
    n, m = 150, 60
    model = Model("hard")
    x = model.add_binaries(n)
    rows = np.repeat(np.arange(m), n)
    cols = np.tile(x, m)
    vals = rng.integers(1, 100, size=m * n)
    model.add_rows(rows, cols, vals, lb=np.full(m, 1500.0), ub=np.inf)
    model.set_objective(x, rng.integers(1, 100, size=n))
    model.set_start(x, np.ones(n))
    return model


def test_work_limit_returns_the_same_incumbent_with_gap():
    # the deterministic budget (nodes) stops the search at the same place on any machine
    model = _hard_knapsack()
    results = [solve(model, "highs", work_limit=1 / NODES_PER_WORK_S) for _ in range(2)]
    result = results[0]
    assert result.status in ("feasible", "optimal")
    assert result.values is not None
    assert np.array_equal(results[0].values, results[1].values) and results[0].objective == results[1].objective
    if result.bound is not None:
        assert result.bound <= result.objective + 1e-6
        assert result.gap == pytest.approx(relative_gap(result.objective, result.bound))
    else:
        assert result.gap is None


def test_the_wall_clock_stops_a_solve_with_a_clear_error():
    # the wall clock is a safety stop: an incumbent it leaves would depend on the machine's speed
    with pytest.raises(TimeLimitReached, match=r"solver highs: the time limit \(0.001 s\) ran out"):
        solve(_hard_knapsack(), "highs", time_limit=0.001)


def test_cpsat_is_deterministic_on_its_work_limit():
    model = _hard_knapsack()
    first, second = (solve(model, "cp-sat", work_limit=0.05) for _ in range(2))
    assert first.values is not None and np.array_equal(first.values, second.values)


def test_cpsat_rejects_continuous():
    model = Model("c")
    x = model.add_vars(1, 0, 1)
    model.set_objective(x, [1])
    with pytest.raises(SynthError, match="all-integer"):
        solve(model, "cp-sat")


def test_relative_gap():
    assert relative_gap(10.0, 9.0) == pytest.approx(0.1)
    assert relative_gap(None, 1.0) is None


def test_highs_interior_point_reaches_the_simplex_optimum():
    model = Model("lp")
    y = model.add_vars(2, 0)
    model.add_row(y, [1, 1], lb=1)
    model.add_row(y, [1, -1], ub=0.5)
    model.set_objective(y, [2, 3])
    assert solve(model, "highs", lp_algorithm="ipm").objective == pytest.approx(2.25, rel=1e-7)
    with pytest.raises(SynthError, match="HiGHS option"):
        solve(model, "cbc", lp_algorithm="ipm")


def _transport_lp(n: int = 12) -> Model:
    # n x n transport problem, random costs: simplex needs many pivots, so a budget of one stops it
    rng = np.random.default_rng(3)
    model = Model("transport")
    x = model.add_vars(n * n, 0).reshape(n, n)
    for i in range(n):
        model.add_row(x[i], np.ones(n), lb=1, ub=1)
        model.add_row(x[:, i], np.ones(n), lb=1, ub=1)
    model.set_objective(x.ravel(), rng.integers(1, 100, size=n * n))
    return model


def test_a_simplex_budget_stops_an_lp_the_same_way_on_every_run():
    model = _transport_lp()
    stopped = [solve(model, "highs", lp_algorithm="simplex", simplex_iterations=1) for _ in range(2)]
    assert all(r.status == "no_solution" and "iteration" in r.message.lower() for r in stopped)
    full = solve(model, "highs", lp_algorithm="simplex")
    budgeted = solve(model, "highs", lp_algorithm="simplex", simplex_iterations=10_000)
    assert full.status == budgeted.status == "optimal"
    assert budgeted.objective == pytest.approx(full.objective)

"""The solver layer: one solver-independent linear model, mapped to open-source backends.

Models stay separate from solvers (as in PuLP and cvxpy): a formulation fills a :class:`Model`
(variables with bounds and integrality, sparse rows ``lb <= A x <= ub``, a linear objective and an
optional warm start) and :func:`solve` maps it to a backend, returning one :class:`SolveResult`.

Backends (docs/design.md lists their APIs and traps):
- ``highs``: highspy directly (the embedded default; returns its incumbent on a time-out);
- ``cbc``, ``pulp-highs``: through PuLP (CBC ships with PuLP, so it is the zero-install fallback);
- ``glop``, ``pdlp``, ``scip``: OR-Tools pywraplp;
- ``cp-sat``: OR-Tools CP-SAT (all-integer models; coefficients are scaled to integers).

The gap is always computed here from (incumbent, bound), since HiGHS and SCIP define it differently.

**Budgets.** ``work_limit`` is the deterministic budget ("work seconds"): CP-SAT's
``max_deterministic_time`` on a fixed worker count (one, or an interleaved deterministic search when
more threads are asked for; CP-SAT parameters docs: ``interleave_search``), and for branch and bound
(HiGHS, CBC, SCIP) ``NODES_PER_WORK_S`` nodes per unit. LPs run to the end, unless the caller gives
``simplex_iterations`` (HiGHS: its simplex and the simplex clean-up after interior point stop there, and
the solve ends with ``no_solution`` unless it holds a feasible point). ``time_limit`` is the
wall clock, a *safety stop* only: a solve it cuts short raises :class:`~synth.errors.TimeLimitReached`
instead of returning an incumbent that depends on the machine's speed. (HiGHS has no deterministic
bound on its root node: a MIP whose root outlasts the clock fails rather than return its root
incumbent.)
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from synth.errors import SynthError, TimeLimitReached

SOLVERS = ("highs", "cbc", "pulp-highs", "glop", "pdlp", "scip", "cp-sat")
LP_ONLY = frozenset({"glop", "pdlp"})
NODES_PER_WORK_S = 200   # branch-and-bound nodes per unit of work_limit (HiGHS, CBC, SCIP)
CLOCK_SHARE = 0.99       # a solve stopped this close to ``time_limit`` was stopped by the clock
INF = math.inf


@dataclass(frozen=True)
class SolveResult:
    status: str  # optimal | feasible | infeasible | unbounded | no_solution | error
    objective: float | None
    bound: float | None
    gap: float | None
    values: np.ndarray | None
    wall_s: float
    solver: str
    message: str = ""

    @property
    def has_solution(self) -> bool:
        return self.values is not None and self.status in ("optimal", "feasible")


class Model:
    """A linear or mixed-integer model: ``min/max c·x`` s.t. ``row_lb <= A x <= row_ub``, ``lb <= x <= ub``."""

    def __init__(self, name: str = "model") -> None:
        self.name = name
        self._lb: list[np.ndarray] = []
        self._ub: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self.num_vars = 0
        self._rows: list[np.ndarray] = []
        self._cols: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._row_lb: list[np.ndarray] = []
        self._row_ub: list[np.ndarray] = []
        self.num_rows = 0
        self.objective: dict[int, float] = {}
        self.objective_offset = 0.0
        self.sense = "min"
        self.start: dict[int, float] = {}

    # ---- building -------------------------------------------------------------------------
    def add_vars(self, n: int, lb: float = 0.0, ub: float = INF, integer: bool = False) -> np.ndarray:
        """Add ``n`` variables; returns their indices."""
        first = self.num_vars
        self._lb.append(np.full(n, lb, dtype=float))
        self._ub.append(np.full(n, ub, dtype=float))
        self._int.append(np.full(n, integer, dtype=bool))
        self.num_vars += n
        return np.arange(first, first + n)

    def add_var(self, lb: float = 0.0, ub: float = INF, integer: bool = False) -> int:
        return int(self.add_vars(1, lb, ub, integer)[0])

    def add_binaries(self, n: int) -> np.ndarray:
        return self.add_vars(n, 0.0, 1.0, True)

    def add_row(self, cols, vals, lb: float = -INF, ub: float = INF) -> int:
        """Add one row ``lb <= sum(vals[k] * x[cols[k]]) <= ub``."""
        cols = np.asarray(cols, dtype=np.int64)
        vals = np.broadcast_to(np.asarray(vals, dtype=float), cols.shape)
        return int(self.add_rows(np.zeros(len(cols), dtype=np.int64), cols, vals, [lb], [ub])[0])

    def add_rows(self, rows, cols, vals, lb, ub) -> np.ndarray:
        """Add rows in COO form: ``rows`` are local row numbers 0..m-1; ``lb``/``ub`` have length m."""
        lb = np.atleast_1d(np.asarray(lb, dtype=float))
        ub = np.atleast_1d(np.asarray(ub, dtype=float))
        count = max(len(lb), len(ub))
        lb = np.broadcast_to(lb, (count,)).copy()
        ub = np.broadcast_to(ub, (count,)).copy()
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        vals = np.broadcast_to(np.asarray(vals, dtype=float), rows.shape).copy()
        if len(cols) and (cols.min() < 0 or cols.max() >= self.num_vars):
            raise ValueError("row refers to an unknown variable")
        first = self.num_rows
        self._rows.append(rows + first)
        self._cols.append(cols)
        self._vals.append(vals)
        self._row_lb.append(lb)
        self._row_ub.append(ub)
        self.num_rows += count
        return np.arange(first, first + count)

    def set_objective(self, cols, vals, sense: str = "min", offset: float = 0.0) -> None:
        if sense not in ("min", "max"):
            raise ValueError("sense must be 'min' or 'max'")
        self.objective = {}
        for col, val in zip(np.atleast_1d(cols), np.broadcast_to(vals, np.shape(np.atleast_1d(cols)))):
            self.objective[int(col)] = self.objective.get(int(col), 0.0) + float(val)
        self.sense = sense
        self.objective_offset = offset

    def set_start(self, cols, vals) -> None:
        """A warm start (a full or partial assignment) for MIP backends that accept one."""
        self.start = {int(c): float(v) for c, v in zip(np.atleast_1d(cols), np.atleast_1d(vals))}

    # ---- views ----------------------------------------------------------------------------
    def bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _concat(self._lb, float), _concat(self._ub, float), _concat(self._int, bool)

    def row_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return _concat(self._row_lb, float), _concat(self._row_ub, float)

    def matrix(self):
        """The constraint matrix as scipy CSR (duplicates summed)."""
        from scipy.sparse import coo_matrix

        if self._rows:
            rows, cols, vals = (np.concatenate(x) for x in (self._rows, self._cols, self._vals))
        else:
            rows = cols = np.zeros(0, dtype=np.int64)
            vals = np.zeros(0)
        return coo_matrix((vals, (rows, cols)), shape=(self.num_rows, self.num_vars)).tocsr()

    def objective_vector(self) -> np.ndarray:
        c = np.zeros(self.num_vars)
        for col, val in self.objective.items():
            c[col] += val
        return c

    @property
    def is_mip(self) -> bool:
        return bool(any(part.any() for part in self._int))


def _concat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """|objective − bound| / |objective| (0 when both are 0); None when either is missing."""
    if objective is None or bound is None or not (math.isfinite(objective) and math.isfinite(bound)):
        return None
    if abs(objective) < 1e-12:
        return 0.0 if abs(bound) < 1e-9 else None
    return max(0.0, abs(objective - bound) / abs(objective))


@contextlib.contextmanager
def silence_fds():
    """Backends print banners at the C level (HiGHS does so even with output off); keep stdout clean."""
    saved = []
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            saved.append((fd, os.dup(fd)))
            os.dup2(null, fd)
        os.close(null)
    except OSError:  # no real fds (e.g. captured streams): nothing to silence
        pass
    try:
        yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


def solve(model: Model, solver: str = "highs", time_limit: float | None = None, gap: float | None = None,
          threads: int | None = None, verbose: bool = False, lp_algorithm: str | None = None,
          work_limit: float | None = None, simplex_iterations: int | None = None) -> SolveResult:
    """Solve ``model`` with ``solver`` (one of :data:`SOLVERS`) within the deterministic ``work_limit``;
    :class:`TimeLimitReached` when the wall-clock ``time_limit`` stops it first (module docstring).

    ``lp_algorithm`` (HiGHS only): ``"ipm"`` or ``"simplex"``; interior point + crossover is ~20x faster than
    simplex on large flow LPs such as the alltoall bound."""
    backends = {"highs": _solve_highs, "cbc": _solve_pulp, "pulp-highs": _solve_pulp, "glop": _solve_pywraplp,
                "pdlp": _solve_pywraplp, "scip": _solve_pywraplp, "cp-sat": _solve_cpsat}
    if solver not in backends:
        raise SynthError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if solver in LP_ONLY and model.is_mip:
        raise SynthError(f"solver {solver} solves LPs only; this model has integer variables "
                         "(use highs, cbc, scip or cp-sat)")
    started = time.perf_counter()
    context = contextlib.nullcontext() if verbose else silence_fds()
    if lp_algorithm is not None and (solver != "highs" or lp_algorithm not in ("ipm", "simplex")):
        raise SynthError(f"lp_algorithm {lp_algorithm!r} is a HiGHS option ('ipm' or 'simplex')")
    nodes = None if work_limit is None or not model.is_mip else max(1, round(work_limit * NODES_PER_WORK_S))
    with context:
        if solver == "highs":
            result = _solve_highs(model, solver, time_limit, gap, threads, verbose, lp_algorithm, nodes,
                                  simplex_iterations)
        elif solver == "cp-sat":
            result = _solve_cpsat(model, solver, time_limit, gap, threads, verbose, work_limit)
        else:
            result = backends[solver](model, solver, time_limit, gap, threads, verbose, nodes)
    status, objective, bound, values, message = result
    seconds = time.perf_counter() - started
    if status == "clock" or (time_limit is not None and status in ("feasible", "no_solution")
                             and solver not in ("highs", "cp-sat") and seconds >= CLOCK_SHARE * time_limit):
        raise TimeLimitReached(f"solver {solver}: the time limit ({time_limit:g} s) ran out before the solve "
                               "finished; allow more time")
    if objective is not None:
        objective += model.objective_offset
    if bound is not None:
        bound += model.objective_offset
    if status == "optimal" and bound is None:
        bound = objective
    return SolveResult(status, objective, bound, relative_gap(objective, bound), values, seconds, solver, message)


# ---- HiGHS (highspy) ---------------------------------------------------------------------------
def _solve_highs(model, solver, time_limit, gap, threads, verbose, lp_algorithm=None, nodes=None,
                 simplex_iterations=None):
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(verbose))
    if lp_algorithm is not None:
        h.setOptionValue("solver", lp_algorithm)
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    if nodes is not None:
        h.setOptionValue("mip_max_nodes", int(nodes))
    if simplex_iterations is not None:
        h.setOptionValue("simplex_iteration_limit", int(simplex_iterations))
    if gap is not None:
        h.setOptionValue("mip_rel_gap", float(gap))
    if threads:
        with contextlib.suppress(Exception):  # HiGHS fixes its thread pool once per process
            h.setOptionValue("threads", int(threads))
    lb, ub, integer = model.bounds()
    c = model.objective_vector()
    h.addVars(model.num_vars, lb, ub)
    if model.num_vars:
        h.changeColsCost(model.num_vars, np.arange(model.num_vars, dtype=np.int32), c)
    if integer.any():
        idx = np.flatnonzero(integer).astype(np.int32)
        h.changeColsIntegrality(len(idx), idx, np.full(len(idx), highspy.HighsVarType.kInteger))
    matrix = model.matrix()
    row_lb, row_ub = model.row_bounds()
    if model.num_rows:
        h.addRows(model.num_rows, row_lb, row_ub, matrix.nnz, matrix.indptr.astype(np.int32),
                  matrix.indices.astype(np.int32), matrix.data)
    if model.sense == "max":
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    if model.start and integer.any():
        start = np.clip(np.zeros(model.num_vars), lb, ub)
        for col, val in model.start.items():
            start[col] = val
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        with contextlib.suppress(Exception):
            h.setSolution(sol)
    h.run()
    ms = h.getModelStatus()
    info = h.getInfo()
    S = highspy.HighsModelStatus
    has_primal = info.primal_solution_status == 2  # kSolutionStatusFeasible
    values = np.asarray(h.getSolution().col_value, dtype=float) if has_primal else None
    objective = float(info.objective_function_value) if has_primal else None
    bound = None
    if integer.any():
        raw = float(info.mip_dual_bound)
        bound = raw if math.isfinite(raw) else None
    if ms == S.kOptimal:
        return "optimal", objective, bound if bound is not None else objective, values, ""
    if ms == S.kTimeLimit:
        return "clock", None, None, None, "time limit"
    if ms == S.kInfeasible:
        return "infeasible", None, None, None, "model is infeasible"
    if ms in (S.kUnbounded, S.kUnboundedOrInfeasible):
        return "unbounded", None, None, None, "model is unbounded or infeasible"
    if values is not None:
        return "feasible", objective, bound, values, h.modelStatusToString(ms)
    return "no_solution", None, bound, None, h.modelStatusToString(ms)


# ---- PuLP (CBC, HiGHS) --------------------------------------------------------------------------
def _pulp_problem(model):
    import pulp

    lb, ub, integer = model.bounds()
    prob = pulp.LpProblem(re.sub(r"\W", "_", model.name) or "model",
                          pulp.LpMinimize if model.sense == "min" else pulp.LpMaximize)
    xs = [pulp.LpVariable(f"x{k}", None if not math.isfinite(lb[k]) else lb[k],
                          None if not math.isfinite(ub[k]) else ub[k],
                          pulp.LpInteger if integer[k] else pulp.LpContinuous) for k in range(model.num_vars)]
    prob += pulp.LpAffineExpression([(xs[k], v) for k, v in model.objective.items()])
    matrix = model.matrix()
    row_lb, row_ub = model.row_bounds()
    for r in range(model.num_rows):
        start, end = matrix.indptr[r], matrix.indptr[r + 1]
        expr = pulp.LpAffineExpression([(xs[matrix.indices[k]], matrix.data[k]) for k in range(start, end)])
        if row_lb[r] == row_ub[r]:
            prob += expr == row_lb[r], f"r{r}"
            continue
        if math.isfinite(row_lb[r]):
            prob += expr >= row_lb[r], f"r{r}l"
        if math.isfinite(row_ub[r]):
            prob += expr <= row_ub[r], f"r{r}u"
    for col, val in model.start.items():
        xs[col].setInitialValue(val)
    return prob, xs


def _solve_pulp(model, solver, time_limit, gap, threads, verbose, nodes=None):
    import pulp

    prob, xs = _pulp_problem(model)
    log_path = None
    if solver == "cbc":
        log_fd, log_path = tempfile.mkstemp(suffix=".cbc.log")
        os.close(log_fd)
        backend = pulp.PULP_CBC_CMD(msg=verbose, timeLimit=time_limit, gapRel=gap, threads=threads,
                                    warmStart=bool(model.start), logPath=log_path,
                                    options=[] if nodes is None else [f"maxNodes {nodes}"])
    else:
        extra = {} if nodes is None else {"mip_max_nodes": nodes}
        backend = pulp.HiGHS(msg=verbose, timeLimit=time_limit, gapRel=gap, threads=threads, **extra)
    try:
        prob.solve(backend)
    except pulp.PulpSolverError as exc:
        return "error", None, None, None, str(exc)
    # PuLP's LpStatus says "Optimal" after a time-out; sol_status tells the truth (docs/design.md).
    sol_status = prob.sol_status
    values = None
    objective = None
    if sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        values = np.array([x.varValue if x.varValue is not None else 0.0 for x in xs], dtype=float)
        objective = float(model.objective_vector() @ values) if model.num_vars else 0.0
    bound = None
    if solver == "pulp-highs" and model.is_mip:
        with contextlib.suppress(Exception):
            raw = float(prob.solverModel.getInfo().mip_dual_bound)
            bound = raw if math.isfinite(raw) else None
    if solver == "cbc" and log_path:
        bound = _cbc_bound_from_log(log_path)
        os.unlink(log_path)
    if sol_status == pulp.LpSolutionOptimal:
        return "optimal", objective, objective, values, ""
    if sol_status == pulp.LpSolutionIntegerFeasible:
        return "feasible", objective, bound, values, "stopped before proving optimality"
    if sol_status == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
        return "infeasible", None, None, None, "model is infeasible"
    if sol_status == pulp.LpSolutionUnbounded:
        return "unbounded", None, None, None, "model is unbounded"
    return "no_solution", None, bound, None, pulp.LpStatus.get(prob.status, "no solution")


def _cbc_bound_from_log(path: str) -> float | None:
    """CBC reports its best bound only in its log ("best possible" / "Lower bound")."""
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    found = re.findall(r"best possible (-?[0-9.eE+]+)", text) or re.findall(r"Lower bound:\s*(-?[0-9.eE+]+)", text)
    return float(found[-1]) if found else None


# ---- OR-Tools pywraplp (GLOP, PDLP, SCIP) -------------------------------------------------------
def _solve_pywraplp(model, solver, time_limit, gap, threads, verbose, nodes=None):
    from ortools.linear_solver import pywraplp

    backend = pywraplp.Solver.CreateSolver({"glop": "GLOP", "pdlp": "PDLP", "scip": "SCIP"}[solver])
    if backend is None:
        return "error", None, None, None, f"OR-Tools has no {solver} backend here"
    if verbose:
        backend.EnableOutput()
    lb, ub, integer = model.bounds()
    big = backend.infinity()
    xs = [backend.IntVar(_fin(lb[k], big), _fin(ub[k], big), f"x{k}") if integer[k]
          else backend.NumVar(_fin(lb[k], big), _fin(ub[k], big), f"x{k}") for k in range(model.num_vars)]
    matrix = model.matrix()
    row_lb, row_ub = model.row_bounds()
    for r in range(model.num_rows):
        row = backend.RowConstraint(_fin(row_lb[r], big), _fin(row_ub[r], big), "")
        for k in range(matrix.indptr[r], matrix.indptr[r + 1]):
            row.SetCoefficient(xs[matrix.indices[k]], float(matrix.data[k]))
    objective = backend.Objective()
    for col, val in model.objective.items():
        objective.SetCoefficient(xs[col], val)
    objective.SetMinimization() if model.sense == "min" else objective.SetMaximization()
    if time_limit is not None:
        backend.SetTimeLimit(int(time_limit * 1000))
    if threads:
        backend.SetNumThreads(int(threads))
    if nodes is not None and solver == "scip":
        backend.SetSolverSpecificParametersAsString(f"limits/nodes = {nodes}\n")
    if model.start and solver == "scip":
        cols = sorted(model.start)
        backend.SetHint([xs[c] for c in cols], [model.start[c] for c in cols])
    params = pywraplp.MPSolverParameters()
    if gap is not None and model.is_mip:
        params.SetDoubleParam(pywraplp.MPSolverParameters.RELATIVE_MIP_GAP, float(gap))
    code = backend.Solve(params)
    values = None
    obj = None
    if code in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        values = np.array([x.solution_value() for x in xs], dtype=float)
        obj = float(objective.Value())
    # SCIP can answer NOT_SOLVED with bound 0: only trust the bound alongside a solution (docs/design.md).
    bound = float(objective.BestBound()) if values is not None and model.is_mip else None
    if code == pywraplp.Solver.OPTIMAL:
        return "optimal", obj, bound if bound is not None else obj, values, ""
    if code == pywraplp.Solver.FEASIBLE:
        return "feasible", obj, bound, values, "stopped before proving optimality"
    if code == pywraplp.Solver.INFEASIBLE:
        return "infeasible", None, None, None, "model is infeasible"
    if code == pywraplp.Solver.UNBOUNDED:
        return "unbounded", None, None, None, "model is unbounded"
    return "no_solution", None, None, None, f"{solver} returned status {code}"


def _fin(value: float, big: float) -> float:
    return value if math.isfinite(value) else (big if value > 0 else -big)


# ---- OR-Tools CP-SAT ---------------------------------------------------------------------------
def deterministic_search(parameters, time_limit: float | None, work_limit: float | None,
                         threads: int | None) -> None:
    """CP-SAT ``parameters`` for a search whose result depends on ``work_limit`` (deterministic time)
    only: one worker, or ``threads`` workers interleaved deterministically (``interleave_search``;
    parallel workers otherwise race); ``time_limit`` is the wall-clock safety stop."""
    workers = int(threads) if threads else 1
    parameters.num_workers = workers
    if workers > 1:
        parameters.interleave_search = True
    if work_limit is not None:
        parameters.max_deterministic_time = max(0.01, float(work_limit))
    if time_limit is not None:
        parameters.max_time_in_seconds = max(0.01, float(time_limit))


def cpsat_clock_stopped(engine, decided: bool, time_limit: float | None, work_limit: float | None) -> bool:
    """True when the wall clock, not the deterministic budget, ended an undecided CP-SAT search."""
    if decided or time_limit is None or engine.WallTime() < CLOCK_SHARE * time_limit:
        return False
    return work_limit is None or engine.DeterministicTime() < work_limit


_CPSAT_BIG = 2**40


def _integer_scale(values: np.ndarray, limit: int = 10**6) -> int:
    """Smallest power of ten that makes ``values`` integral (CP-SAT needs integer coefficients)."""
    scale = 1
    while scale <= limit:
        scaled = values * scale
        if np.allclose(scaled, np.round(scaled), rtol=0, atol=1e-9):
            return scale
        scale *= 10
    raise SynthError("cp-sat needs integral coefficients; this model's coefficients cannot be scaled to integers")


def _solve_cpsat(model, solver, time_limit, gap, threads, verbose, work_limit=None):
    from ortools.sat.python import cp_model

    lb, ub, integer = model.bounds()
    if not integer.all():
        raise SynthError("cp-sat solves all-integer models only; use highs, cbc or scip for this model")
    cp = cp_model.CpModel()
    xs = [cp.NewIntVar(int(max(lb[k], -_CPSAT_BIG)), int(min(ub[k], _CPSAT_BIG)), f"x{k}")
          for k in range(model.num_vars)]
    matrix = model.matrix()
    row_lb, row_ub = model.row_bounds()
    for r in range(model.num_rows):
        start, end = matrix.indptr[r], matrix.indptr[r + 1]
        coefs = matrix.data[start:end]
        scale = _integer_scale(coefs)
        expr = sum(int(round(c * scale)) * xs[i] for c, i in zip(coefs, matrix.indices[start:end]))
        lo = math.ceil(row_lb[r] * scale - 1e-9) if math.isfinite(row_lb[r]) else -_CPSAT_BIG * 64
        hi = math.floor(row_ub[r] * scale + 1e-9) if math.isfinite(row_ub[r]) else _CPSAT_BIG * 64
        cp.AddLinearConstraint(expr, lo, hi)
    cols = np.array(sorted(model.objective), dtype=np.int64)
    coefs = np.array([model.objective[c] for c in cols], dtype=float)
    obj_scale = _integer_scale(coefs) if len(cols) else 1
    if len(cols):
        expr = sum(int(round(c * obj_scale)) * xs[i] for c, i in zip(coefs, cols))
        cp.Minimize(expr) if model.sense == "min" else cp.Maximize(expr)
    for col, val in model.start.items():
        cp.AddHint(xs[col], int(round(val)))
    engine = cp_model.CpSolver()
    deterministic_search(engine.parameters, time_limit, work_limit, threads)
    if gap is not None:
        engine.parameters.relative_gap_limit = float(gap)
    engine.parameters.log_search_progress = bool(verbose)
    code = engine.Solve(cp)
    if cpsat_clock_stopped(engine, code in (cp_model.OPTIMAL, cp_model.INFEASIBLE), time_limit, work_limit):
        return "clock", None, None, None, "time limit"
    values = None
    obj = bound = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = np.array([engine.Value(x) for x in xs], dtype=float)
        obj = float(engine.ObjectiveValue()) / obj_scale
        bound = float(engine.BestObjectiveBound()) / obj_scale
    if code == cp_model.OPTIMAL:
        return "optimal", obj, obj, values, ""
    if code == cp_model.FEASIBLE:
        return "feasible", obj, bound, values, "stopped before proving optimality"
    if code == cp_model.INFEASIBLE:
        return "infeasible", None, None, None, "model is infeasible"
    if code == cp_model.MODEL_INVALID:
        return "error", None, None, None, "cp-sat rejected the model"
    return "no_solution", None, None, None, "cp-sat found no solution in time"

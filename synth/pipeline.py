"""The top-level driver: method -> Schedule -> lower -> verify -> simulate -> bound/gap.

Nothing leaves this module unverified: a method's schedule is lowered to a Program, the Program is
checked symbolically (:func:`synth.verification.verify`) and against the MSCCL runtime limits, and only
then timed by the α-β simulator (:func:`synth.simulation.simulate`), which gives the reported time.
The lower bound (:func:`synth.lower_bounds.compute_bounds`) gives ``gap = (time - bound) / time``.
Where a method chose its own chunk count and the program exceeds MSCCL's limits, the count is halved
until it fits (a note says so); a count the user pinned with ``--chunks`` is never changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from synth.collectives import RUNTIME_ELEMENT_BYTES, Collective, canonical_name, runtime_divides
from synth.errors import SynthError, TimeLimitReached
from synth.limits import check_rank_count, check_route_switches, check_transfer_count
from synth.program.ir import Program
from synth.runtime_limits import runtime_profile
from synth.runtimes import scratch_bytes
from synth.schedule import Schedule
from synth.solvers import SOLVERS
from synth.synthesis.base import SynthOptions
from synth.topology.model import Topology
from synth.topology.routes import longest_switch_route
from synth.units import algbw_GBps

if TYPE_CHECKING:
    from synth.simulation import SimResult


@dataclass(frozen=True)
class SynthesisResult:
    method: str
    solver: str | None
    status: str                   # optimal | feasible | heuristic
    time_us: float                # simulated (docs/cost-model.md)
    algbw_GBps: float
    busbw_GBps: float
    bound_us: float | None
    gap: float | None
    synthesis_s: float
    program: Program
    schedule: Schedule
    collective: Collective
    topology: str
    size_bytes: int
    predicted_time_us: float = 0.0
    # auto: one row per candidate {method, time_us | error | skipped | not_tried}
    tried: list[dict] = field(default_factory=list, compare=False)
    notes: list[str] = field(default_factory=list, compare=False)

    def to_dict(self, output: str | None = None) -> dict:
        """The ``synth synthesize --json`` keys of docs/cli.md, plus context."""
        return {
            "method": self.method,
            "solver": self.solver,
            "status": self.status,
            "time_us": self.time_us,
            "algbw_GBps": self.algbw_GBps,
            "busbw_GBps": self.busbw_GBps,
            "bound_us": self.bound_us,
            "gap": self.gap,
            "synthesis_s": self.synthesis_s,
            "output": output,
            "topology": self.topology,
            "collective": self.collective.name,
            "ranks": self.collective.num_ranks,
            "root": self.collective.root,
            "size_bytes": self.size_bytes,
            "chunks": self.collective.chunk_factor,
            "predicted_time_us": self.predicted_time_us,
            "tried": self.tried,
            "not_tried": self.not_tried,
            "notes": self.notes,
        }

    @property
    def not_tried(self) -> list[dict]:
        """auto: the candidates a wall-clock stop cut out, {method, reason} (their programs were not used)."""
        return [{"method": row["method"], "reason": row["not_tried"]} for row in self.tried if "not_tried" in row]


@dataclass(frozen=True)
class _Timed:
    """One verified, simulated program of a candidate method (the auto loop keeps the best)."""

    sim: SimResult
    schedule: Schedule
    program: Program
    status: str
    solver: str | None
    method: str


def _bound_us(topology: Topology, collective: Collective, size_bytes: float) -> float | None:
    try:
        from synth.lower_bounds import compute_bounds
    except ImportError:
        return None
    try:
        return float(compute_bounds(topology, collective, size_bytes).time_bound_us)
    except SynthError:
        return None


def _run_one(topology: Topology, collective: Collective, size_bytes: float, method: str,
             options: SynthOptions) -> tuple[list[tuple[Schedule, Program]], float, str, str | None]:
    """Run one method and lower + verify its result. Returns ([(schedule, program)], seconds, status, solver):
    the method's schedule first, then each of its ``alternatives`` that lowers within MSCCL's limits."""
    from synth.synthesis.registry import get_method

    spec = get_method(method)
    if collective.name not in spec.collectives:
        raise SynthError(f"method {spec.name!r} does not support {collective.name} "
                         f"(it supports {', '.join(sorted(spec.collectives))})")
    t0 = time.perf_counter()
    chosen = None     # the chunk count the method chose, where a smaller one had to be pinned to fit
    while True:
        schedule = _run_method(spec, topology, collective, size_bytes, options)
        try:
            lowered = [(schedule, _program(topology, collective, spec.name, schedule, options))]
            break
        except _DoesNotLower:
            # a count the method chose itself that MSCCL cannot hold: halve it until the program fits
            factor = schedule.collective.chunk_factor
            if (options.chunks is not None and chosen is None) or factor <= 1:
                raise
            chosen = chosen or factor
            options = replace(options, chunks=factor // 2)
    if chosen is not None:
        schedule = replace(schedule, notes={**schedule.notes, "chunks_chosen": chosen})
        lowered = [(schedule, lowered[0][1])]
    seconds = time.perf_counter() - t0
    for alternative in schedule.alternatives:
        alternative = replace(alternative, method=alternative.method or spec.name)
        try:
            lowered.append((alternative, _program(topology, collective, spec.name, alternative, options)))
        except _DoesNotLower:
            pass     # a runner-up that does not lower is no candidate; one that lowers wrong still raises
    status = str(schedule.notes.get("status") or ("heuristic" if spec.kind == "heuristic" else "feasible"))
    solver = schedule.notes.get("solver") or (None if spec.kind == "heuristic" else options.solver)
    return [(replace(s, alternatives=()), program) for s, program in lowered], seconds, status, solver


def _run_method(spec, topology: Topology, collective: Collective, size_bytes: float,
                options: SynthOptions) -> Schedule:
    """``spec``'s schedule, with its failures as one clear :class:`SynthError`."""
    try:
        schedule = spec.run(topology, collective, size_bytes, options)
    except SynthError:
        raise
    except MemoryError:
        raise SynthError(f"method {spec.name} ran out of memory; try fewer --chunks or a smaller instance") from None
    except Exception as exc:  # a method bug must still be one clear line
        raise SynthError(f"internal: method {spec.name} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(schedule, Schedule):
        raise SynthError(f"internal: method {spec.name} returned {type(schedule).__name__}, not a Schedule")
    check_transfer_count(len(schedule.transfers), f"method {spec.name}'s schedule has")
    return schedule if schedule.method else replace(schedule, method=spec.name)


class _DoesNotLower(SynthError):
    """Lowering refused the schedule, or its program exceeds an MSCCL limit (the other failures of
    :func:`_program` are a method's bugs, and raise for runner-ups too)."""


def _program(topology: Topology, collective: Collective, method: str, schedule: Schedule,
             options: SynthOptions) -> Program:
    """``schedule`` checked against the request, lowered, verified and held to MSCCL's limits."""
    from synth.program.lower import lower
    from synth.verification import verify

    coll = schedule.collective
    if (coll.name, coll.num_ranks, coll.root) != (collective.name, collective.num_ranks, collective.root):
        raise SynthError(f"internal: method {method} solved {coll.name} on {coll.num_ranks} ranks (root "
                         f"{coll.root}) instead of the requested {collective.name} on {collective.num_ranks}")
    if options.chunks is not None and coll.chunk_factor != options.chunks:
        raise SynthError(f"internal: method {method} ignored --chunks {options.chunks} "
                         f"(used {coll.chunk_factor})")
    name = f"{coll.name}-{method}-{topology.name}"
    try:
        program = lower(schedule, name=name)
    except SynthError as exc:
        raise _DoesNotLower(f"method {method}: {exc}") from None
    result = verify(program, coll)
    if not result.ok:
        first = result.errors[0] if result.errors else "unknown error"
        raise SynthError(f"internal: method {method} produced an invalid program: {first}")
    try:
        from synth.program.msccl_xml import check_runtime_limits
    except ImportError:  # pragma: no cover - formats stage always present in a release
        pass
    else:
        try:
            check_runtime_limits(program, runtime=options.runtime)
        except SynthError as exc:
            raise _DoesNotLower(f"method {method}: program exceeds an MSCCL limit: {exc}") from None
    return program


OPTIMAL_GAP = 1e-6
UNRUNNABLE_NOTE_SHARE = 0.01   # a faster program the runtime would not run is named when it saves more than this
RUNNABLE_LOSS = 0.25   # ... and kept instead where the best runnable one takes this much longer (48-rank allreduce:
# no count of 48 equal pieces divides a power-of-two buffer, and the best ring took 5x the trees' time)


def honest_status(status: str, gap: float | None) -> str:
    """docs/cli.md: ``optimal`` means provably optimal under the cost model, i.e. the simulated time meets the lower
    bound. A method's "optimal" inside its own restricted model (epochs, k-synchronous rounds) is not that proof,
    so it is reported as ``feasible`` unless the gap against the real bound closes."""
    if status == "optimal" and (gap is None or gap > OPTIMAL_GAP):
        return "feasible"
    return status


def _size_notes(program: Program, size_bytes: float) -> list[str]:
    """MSCCL runtimes use a program only when its chunk count divides the buffer (docs/design.md): say so."""
    loop = program.nchunksperloop or 1
    if runtime_divides(loop, size_bytes):
        return []
    return [f"SIZE {int(size_bytes)} B is not a multiple of the program's {loop} chunks per loop in "
            f"{RUNTIME_ELEMENT_BYTES}-byte elements; MSCCL runtimes use a program only where nchunksperloop divides "
            "the buffer's element count, so they will run their own algorithm at this SIZE"]


def synthesize(topology: Topology | str, collective_name: str, size_bytes: float, method: str = "auto",
               options: SynthOptions | None = None, root: int = 0, *, inplace: bool = False,
               progress: Callable[[str, float | None], None] | None = None) -> SynthesisResult:
    """Synthesize, verify and time ``collective_name`` of ``size_bytes`` (SIZE, docs/units.md) on ``topology``.

    ``method="auto"`` runs :func:`synth.synthesis.auto.plan` and keeps the fastest verified program; its
    budgets are deterministic work, and :func:`synth.synthesis.auto.budget_s` (``--time-limit``) is a
    wall-clock safety stop whose cuts are listed as ``not_tried``. Raises :class:`SynthError` when the method fails,
    times out without a schedule, or produces a program that does not verify.
    """
    from synth.program.fabric import fabric_of
    from synth.simulation import simulate

    if isinstance(topology, str):
        from synth.topology.io import load_topology

        topology = load_topology(topology)
    fabric = fabric_of(topology)   # the fabric as given, not the capped copy below (other content, same times)
    # methods plan on the rates transfers can reach; no transfer takes longer or shorter on it
    topology = topology.circuit_capacities()
    options = options or SynthOptions()
    if options.solver not in SOLVERS:
        raise SynthError(f"unknown solver {options.solver!r}; choose one of {', '.join(SOLVERS)}")
    if size_bytes <= 0:
        raise SynthError(f"size must be positive, got {size_bytes}")
    name = canonical_name(collective_name)
    collective = Collective(name, topology.num_ranks, options.chunks or 1, root=root, inplace=inplace)
    if topology.num_ranks < 2:
        raise SynthError(f"topology {topology.name!r} has {topology.num_ranks} rank; a collective needs at least 2")
    check_rank_count(topology.num_ranks, topology.name, "schedules")
    check_route_switches(longest_switch_route(topology), topology.name, topology.num_ranks)
    try:
        runtime_profile(options.runtime)
    except ValueError as exc:
        raise SynthError(str(exc)) from None
    budget_b = float(size_bytes) if options.max_scratch is None else float(options.max_scratch)
    check_transfer_count(collective.min_transfers, f"{name} on {topology.num_ranks} ranks"
                         + (f" with --chunks {options.chunks}" if options.chunks else "") + " needs at least")

    key = method.strip().lower()
    budget = None
    is_auto = key == "auto"
    if is_auto:
        from synth.synthesis import auto

        plan = auto.plan(topology, collective, size_bytes, options)
        if not plan:
            raise SynthError(f"no registered method supports {name}")
        budget = auto.budget_s(options)
    else:
        plan = [None]

    t0 = time.perf_counter()
    best: _Timed | None = None
    unrunnable: _Timed | None = None   # auto: the fastest program an MSCCL runtime would not run at SIZE
    roomy: _Timed | None = None        # auto: the fastest runnable program over the scratch budget
    tried: list[dict] = []
    stop_at = _bound_us(topology, collective, size_bytes) if is_auto else None
    clock_out = None    # auto: why --time-limit cut the plan short

    def rank(sim, program: Program) -> tuple[bool, bool, float]:
        # auto: programs an MSCCL runtime runs at SIZE first (see SynthOptions.runtime_chunks), then those
        # within the scratch budget (SynthOptions.max_scratch), then the fastest
        runs = not options.runtime_chunks or runtime_divides(program.nchunksperloop or 1, size_bytes)
        return not runs, scratch_bytes(program, size_bytes) > budget_b, sim.time_us

    for cand in plan:
        m, opts, row = key, options, {}
        if cand is not None:  # auto: the candidate's own limit and chunks, within the total budget
            m, row = cand.method, ({"chunks": cand.chunks} if cand.chunks is not None else {})
            if (best is not None and stop_at is not None and not any(rank(best.sim, best.program)[:2])
                    and auto.close_enough(best.sim.time_us, stop_at)):
                tried.append({"method": m, **row, "skipped": f"{best.method} is within {auto.CLOSE_ENOUGH:.0%} "
                              "of the lower bound"})
                continue
            if best is not None and cand.fallback:
                tried.append({"method": m, **row, "skipped": "fallback only"})
                continue
            left = None if budget is None else budget - (time.perf_counter() - t0)
            # with no program yet, the next candidate still runs (briefly) rather than failing outright
            if left is not None and best is None:
                left = max(left, auto.MIN_START_S)
            opts = None if clock_out is not None and best is not None else auto.candidate_options(options, cand, left)
            if opts is None:
                clock_out = clock_out or f"the --time-limit of {budget:g} s ran out before it started"
                tried.append({"method": m, **row, "not_tried": clock_out})
                continue
        if progress is not None:   # which method runs now, and the best verified gap so far
            progress(m, None if best is None or not stop_at else (best.sim.time_us - stop_at) / best.sim.time_us)
        try:
            lowered, seconds, status, solver = _run_one(topology, collective, size_bytes, m, opts)
            # the method's alternatives are timed as its schedule is, and the fastest kept
            timed = [(simulate(program, topology, size_bytes, record_events=False), schedule, program)
                     for schedule, program in lowered]
            sim, schedule, program = min(timed, key=lambda t: rank(t[0], t[2]))
        except TimeLimitReached as exc:
            if not is_auto:
                raise
            # a clock stopped it: its program would depend on the machine's speed, so none is used
            tried.append({"method": m, **row, "not_tried": f"stopped by the wall clock ({exc})"})
            if budget is not None and time.perf_counter() - t0 >= budget - auto.MIN_START_S:
                clock_out = f"the --time-limit of {budget:g} s ran out (at {m})"
            continue
        except SynthError as exc:
            if not is_auto:
                raise
            tried.append({"method": m, **row, "error": str(exc)})
            continue
        tried.append({"method": m, **row, "time_us": sim.time_us, "synthesis_s": seconds})
        ranked = rank(sim, program)
        if ranked[0] and (unrunnable is None or ranked[1:] < rank(unrunnable.sim, unrunnable.program)[1:]):
            unrunnable = _Timed(sim, schedule, program, status, solver, m)
        if not ranked[0] and ranked[1] and (roomy is None or sim.time_us < roomy.sim.time_us):
            roomy = _Timed(sim, schedule, program, status, solver, m)
        if best is None or ranked < rank(best.sim, best.program):
            best = _Timed(sim, schedule, program, status, solver, m)
    elapsed = time.perf_counter() - t0
    if best is None:
        detail = "; ".join(f"{row['method']}: {row.get('error') or row.get('not_tried')}" for row in tried)
        raise SynthError(f"auto: every method failed for {name} on {topology.name} ({detail})")
    # only a faster program the runtime would not run is worth naming (a slower one was no choice)
    passed_over = unrunnable if unrunnable is not None and unrunnable.sim.time_us < best.sim.time_us else None
    if (unrunnable is not None and rank(unrunnable.sim, unrunnable.program)[1] <= rank(best.sim, best.program)[1]
            and unrunnable.sim.time_us * (1 + RUNNABLE_LOSS) < best.sim.time_us):
        best, passed_over = unrunnable, best     # a runnable program this much slower is no answer
    sim, schedule, program, status, solver, m = best.sim, best.schedule, best.program, best.status, best.solver, \
        best.method
    bound = _bound_us(topology, schedule.collective, size_bytes)
    gap = (sim.time_us - bound) / sim.time_us if bound is not None and sim.time_us > 0 else None
    status = honest_status(status, gap)
    return SynthesisResult(
        method=m,
        solver=solver,
        status=status,
        time_us=sim.time_us,
        algbw_GBps=algbw_GBps(size_bytes, sim.time_us),
        busbw_GBps=algbw_GBps(size_bytes, sim.time_us) * schedule.collective.busbw_factor,
        bound_us=bound,
        gap=gap,
        synthesis_s=elapsed,
        program=program.with_(fabric=fabric),
        schedule=schedule,
        collective=schedule.collective,
        topology=topology.name,
        size_bytes=int(size_bytes),
        predicted_time_us=schedule.predicted_time_us,
        tried=tried,
        notes=(_size_notes(program, size_bytes) + _passed_over_note(passed_over, best)
               + _fitted_chunks_note(schedule)
               + _scratch_notes(best, roomy if is_auto else None, size_bytes, budget_b, is_auto)),
    )


SCRATCH_NOTE_SHARE = 0.01   # a faster program over the scratch budget is named when it saves more than this


def _scratch_notes(kept: _Timed, roomy: _Timed | None, size_bytes: float, budget: float, is_auto: bool) -> list[str]:
    """The scratch budget (``--max-scratch``, :func:`synth.runtimes.scratch_bytes`): a kept program over it
    (auto: only when no runnable one fits), or, under auto, a faster program passed over for it."""
    need = scratch_bytes(kept.program, size_bytes)
    ratio = f"{need / size_bytes:.2f}x the buffer"
    if need > budget:
        why = "no program the runtime runs at SIZE fits the scratch budget" if is_auto else "warning"
        return [f"{why}: {kept.method} needs {need:.0f} B of scratch per rank ({ratio}), over --max-scratch "
                f"({budget:.0f} B); the runtime allocates it per call"]
    if roomy is None or roomy.sim.time_us >= kept.sim.time_us * (1 - SCRATCH_NOTE_SHARE):
        return []
    other = scratch_bytes(roomy.program, size_bytes)
    return [f"{roomy.method} took {roomy.sim.time_us:.1f} us ({(kept.sim.time_us / roomy.sim.time_us - 1) * 100:.0f} % "
            f"faster) but needs {other:.0f} B of scratch per rank ({other / size_bytes:.2f}x the buffer), over "
            f"--max-scratch ({budget:.0f} B); a larger --max-scratch keeps it"]


def _fitted_chunks_note(schedule: Schedule) -> list[str]:
    chosen = schedule.notes.get("chunks_chosen")
    if chosen is None:
        return []
    return [f"{schedule.method} chose {chosen} chunks per piece, more than MSCCL's limits hold; "
            f"{schedule.collective.chunk_factor} fit"]


def _passed_over_note(passed_over: _Timed | None, kept: _Timed) -> list[str]:
    """auto keeps a program the runtime runs at SIZE over a faster one it would not run, unless the runnable
    one is ``RUNNABLE_LOSS`` slower: say what the choice costs where it is more than ``UNRUNNABLE_NOTE_SHARE``
    (dgx1 1 GiB allgather: 0.4 %, not worth a note)."""
    if passed_over is None or passed_over is kept:
        return []
    kept_us, other_us = kept.sim.time_us, passed_over.sim.time_us
    if other_us > kept_us:   # the faster program was kept although the runtime will not run it at SIZE
        loop = kept.program.nchunksperloop or 1
        return [f"kept {kept.method} although its {loop} chunks per loop do not divide SIZE, so MSCCL runtimes would "
                f"not run it at this SIZE: the best program they would run, {passed_over.method}, takes "
                f"{other_us:.1f} us ({other_us / kept_us:.1f}x)"]
    if other_us >= kept_us * (1 - UNRUNNABLE_NOTE_SHARE):
        return []
    loop = passed_over.program.nchunksperloop or 1
    return [f"{passed_over.method} took {other_us:.1f} us ({(kept_us / other_us - 1) * 100:.0f} % faster), but its "
            f"{loop} chunks per loop do not divide SIZE, so MSCCL runtimes would not run it; --any-chunks keeps the "
            "fastest program"]

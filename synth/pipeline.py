"""The top-level driver: request -> method -> Schedule -> lower -> verify -> simulate -> bound/gap -> status.

The request is one :class:`~synth.synthesis.base.Instance`, built and checked once by :func:`instance` and
passed to every method; its schedule and program carry the fabric's identity. The status is decided here only
(:func:`status_of`), from the method's kind and the gap; a method's run travels as a typed :class:`MethodRun`.
Nothing leaves this module unverified: a method's schedule is lowered to a Program, the Program is
checked symbolically (:func:`synth.verification.verify`) and against the MSCCL runtime limits, and only
then timed by the α-β simulator (:func:`synth.simulation.simulate`), which gives the reported time.
The lower bound (:func:`synth.lower_bounds.compute_bounds`) gives ``gap = (time - bound) / time``.
Where a method chose its own chunk count and the program exceeds MSCCL's limits, the count is halved
until it fits (a note says so); a count the user pinned with ``--chunks`` is never changed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from synth.collectives import RUNTIME_ELEMENT_BYTES, Collective, canonical_name, runtime_divides
from synth.errors import SynthError, TimeLimitReached
from synth.gcpause import full_collections_deferred
from synth.limits import check_rank_count, check_route_switches, check_transfer_count
from synth.program.ir import Program
from synth.runtime_limits import MAX_STEP_CHUNKS, MAX_STEPS_PER_TB, runtime_profile
from synth.runtimes import scratch_bytes
from synth.schedule import Schedule, spread_chunks, transfer_column
from synth.solvers import SOLVERS
from synth.synthesis.base import Instance, MethodSpec, SynthOptions
from synth.synthesis.railblocks import has_rail_boxes
from synth.topology.model import Topology
from synth.topology.routes import longest_switch_route, route_capacities
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
            # a warm start on an edited fabric whose forests were kept (docs/cli.md); absent otherwise
            **({"reused_trees": self.schedule.notes["reused_trees"]} if "reused_trees" in self.schedule.notes
               else {}),
        }

    @property
    def not_tried(self) -> list[dict]:
        """auto: the candidates a wall-clock stop cut out, {method, reason} (their programs were not used)."""
        return [{"method": row["method"], "reason": row["not_tried"]} for row in self.tried if "not_tried" in row]


@dataclass(frozen=True)
class MethodRun:
    """One method's run: its schedule and each of its ``alternatives`` that lowers within MSCCL's limits, with
    their programs (the method's schedule first), the seconds it took, and the facts the status is decided from."""

    method: str
    kind: str                      # MethodSpec.kind: heuristic | exact
    solver: str | None
    lowered: tuple[tuple[Schedule, Program], ...]
    seconds: float


class Rank(NamedTuple):
    """How ``auto`` orders verified programs: with ``SynthOptions.loads_only``, within an MSCCL runtime's limits
    first (else that field is False for all); runnable by the runtime at SIZE (within its limits, and see
    ``SynthOptions.runtime_chunks``); then within the scratch budget (``SynthOptions.max_scratch``), then the
    fastest (compared field by field, as a tuple)."""

    unloadable: bool
    unrunnable: bool
    over_scratch: bool
    time_us: float


@dataclass(frozen=True)
class _Timed:
    """One verified, simulated program of a candidate method (the auto loop keeps the best)."""

    sim: SimResult
    schedule: Schedule
    program: Program
    run: MethodRun
    rank: Rank

    @property
    def method(self) -> str:
        return self.run.method


def _bound_us(topology: Topology, collective: Collective, size_bytes: float) -> float | None:
    try:
        from synth.lower_bounds import compute_bounds
    except ImportError:
        return None
    try:
        return float(compute_bounds(topology, collective, size_bytes).time_bound_us)
    except SynthError:
        return None


def _run_one(inst: Instance, method: str) -> MethodRun:
    """Run one method on ``inst`` and lower + verify its schedule and each of its ``alternatives`` that lowers
    within MSCCL's limits."""
    from synth.synthesis.registry import get_method

    spec = get_method(method)
    collective = inst.collective
    if collective.name not in spec.collectives:
        raise SynthError(f"method {spec.name!r} does not support {collective.name} "
                         f"(it supports {', '.join(sorted(spec.collectives))})")
    t0 = time.perf_counter()
    schedule, programs, chosen, over_limits = _fitted(spec, inst)
    if chosen is not None:
        schedule = replace(schedule, notes={**schedule.notes, "chunks_chosen": chosen})
    if over_limits is not None:
        schedule = replace(schedule, notes={**schedule.notes, "over_limits": over_limits})
    lowered = [(schedule, program) for program in programs]
    seconds = time.perf_counter() - t0
    for alternative in schedule.alternatives:
        alternative = runnable_allreduce(inst, replace(alternative, method=alternative.method or spec.name,
                                                       fabric=inst.fabric))
        try:
            lowered += [(alternative, program) for program in _programs(inst, spec.name, alternative)]
        except _DoesNotLower:
            pass     # a runner-up that does not lower is no candidate; one that lowers wrong still raises
    solver = schedule.solver or (None if spec.kind == "heuristic" else inst.options.solver)
    return MethodRun(method=spec.name, kind=spec.kind, solver=solver, seconds=seconds,
                     lowered=tuple((replace(s, alternatives=()), program) for s, program in lowered))


def _fitted(spec: MethodSpec, inst: Instance) -> tuple[Schedule, list[Program], int | None, str | None]:
    """``spec``'s schedule for ``inst`` and its verified programs (:func:`_programs`), as (schedule, programs,
    chosen, over_limits).

    Where the program exceeds an MSCCL limit and the method chose its own chunk count, the count is halved
    until the program fits (``chosen``: the count first chosen). Where nothing smaller fits (one chunk, a
    pinned ``--chunks``, or a count the method refuses), the first verified program over the limit is kept
    and ``over_limits`` says which limit: its JSON program runs, and the XML export refuses it naming the limit
    and the rank (issue 31's "limits that say so")."""
    chosen = None
    over: tuple[Schedule, Program, str] | None = None
    first: tuple[Instance, Schedule, _DoesNotLower] | None = None   # the first schedule the lowering refused
    while True:
        try:
            planned = _run_method(spec, inst)
        except TimeLimitReached:
            raise
        except SynthError:
            if over is None and first is None:
                raise
            return _over_limits(spec.name, over, first)
        schedule = runnable_allreduce(inst, planned)
        try:
            return schedule, _programs(inst, spec.name, schedule), chosen, None
        except _DoesNotLower as exc:
            if over is None and exc.program is not None:
                over = (schedule, exc.program, str(exc))
            first = first or (inst, schedule, exc)
            factor = planned.collective.chunk_factor
            if (inst.options.chunks is not None and chosen is None) or factor <= 1:
                return _over_limits(spec.name, over, first)
            chosen = chosen or factor
            inst = inst.with_options(replace(inst.options, chunks=factor // 2))


SPREAD_COST = 0.04          # an allreduce whose loop no MSCCL runtime runs at SIZE is spread over a loop that does
# where no transfer then grows by more than this share (the least growth within SPREAD_TRANSFERS; 15 chunks: 1024,
# 1.07 %; 768 chunks: 8192, 3.1 %)
SPREAD_RANGE = 128          # ... loops of up to this many chunks per chunk tried
SPREAD_TRANSFERS = 1 << 19  # ... with at most this many transfers (a record each, lowered and verified)


def spread_growth(chunks: int, loop: int) -> float:
    """How much the largest run of :func:`synth.schedule.spread_chunks` outgrows ``loop / chunks``: a transfer's
    bytes grow by at most this factor."""
    return math.ceil(loop / chunks) * chunks / loop


def runnable_allreduce(inst: Instance, schedule: Schedule) -> Schedule:
    """An allreduce schedule whose chunks per loop do not divide the SIZE buffer's elements (no MSCCL runtime would
    run it: 15 ranks' equal pieces of a power-of-two buffer), spread over a loop that does
    (:func:`synth.schedule.spread_chunks`): of the loops up to ``SPREAD_RANGE`` chunks per chunk that keep within
    ``SPREAD_TRANSFERS`` transfers and keep the messages' MSCCL steps (``MAX_STEP_CHUNKS`` chunks each) within
    ``SPREAD_COST`` of their count, the one of least :func:`spread_growth`, the shortest of those, where that growth
    is at most ``1 + SPREAD_COST``. ``schedule`` itself where it divides, where ``--chunks`` or ``--any-chunks`` says
    otherwise, or where no loop qualifies."""
    coll, options, size = schedule.collective, inst.options, float(inst.size_bytes)
    if (coll.name != "allreduce" or options.chunks is not None or not options.runtime_chunks
            or schedule.program is not None or "nccl_algorithm" in schedule.notes   # NCCL's rings need no divisor
            or runtime_divides(coll.size_chunks, size)):
        return schedule
    elements, chunks = size / RUNTIME_ELEMENT_BYTES, coll.chunk_factor
    if elements != int(elements):
        return schedule
    most = min(SPREAD_RANGE * chunks, SPREAD_TRANSFERS * chunks // max(1, len(schedule.transfers)))
    if not any(int(elements) % d == 0 for d in range(chunks + 1, most + 1)):
        return schedule
    messages = _message_chunks(schedule)

    def steps(run: int) -> int:   # MSCCL steps the messages take once each chunk is ``run`` chunks
        return int(np.ceil(messages * run / MAX_STEP_CHUNKS).sum())

    # a run past MSCCL's step count splits a message into more steps, each an α: as costly as bytes at small SIZE
    loops = [d for d in range(chunks + 1, most + 1) if int(elements) % d == 0
             and steps(math.ceil(d / chunks)) <= steps(1) * (1 + SPREAD_COST)]
    if not loops:
        return schedule
    loop = min(loops, key=lambda d: (round(spread_growth(chunks, d), 12), d))
    if spread_growth(chunks, loop) > 1 + SPREAD_COST:
        return schedule
    return spread_chunks(schedule, loop)


def _message_chunks(schedule: Schedule) -> np.ndarray:
    """Chunks per message of ``schedule``: its transfers of one sender and message group, each ungrouped one
    alone."""
    src, group = transfer_column(schedule.transfers, "src"), transfer_column(schedule.transfers, "group")
    grouped = group >= 0
    _, counts = np.unique(np.stack([src[grouped], group[grouped]]), axis=1, return_counts=True)
    return np.concatenate([counts, np.ones(int((~grouped).sum()), dtype=np.int64)])


def _over_limits(method: str, over: tuple[Schedule, Program, str] | None,
                 first: tuple[Instance, Schedule, _DoesNotLower] | None) -> tuple[Schedule, list[Program], None, str]:
    """The program kept over an MSCCL limit: the first verified one, or else the first schedule lowered with
    threadblocks of any length (the lowering spreads a connection over at most 32 channels of 64 steps, an MSCCL
    limit the JSON program does not have); the first refusal when neither exists."""
    if over is not None:
        return over[0], [over[1]], None, over[2]
    assert first is not None
    inst, schedule, refusal = first   # the request as first made: later ones pinned halved chunk counts
    try:
        program = _program(inst, method, schedule, max_steps_per_tb=UNLIMITED_STEPS)
    except _DoesNotLower as exc:
        if exc.program is None:
            raise refusal from None
        program = exc.program
    return schedule, [program], None, str(refusal)


def _run_method(spec: MethodSpec, inst: Instance) -> Schedule:
    """``spec``'s schedule for ``inst``, carrying the fabric's identity, with its failures as one clear
    :class:`SynthError`."""
    try:
        schedule = spec.run(inst)
    except SynthError:
        raise
    except MemoryError:
        raise SynthError(f"method {spec.name} ran out of memory; try fewer --chunks or a smaller instance") from None
    except Exception as exc:  # a method bug must still be one clear line
        raise SynthError(f"internal: method {spec.name} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(schedule, Schedule):
        raise SynthError(f"internal: method {spec.name} returned {type(schedule).__name__}, not a Schedule")
    check_transfer_count(len(schedule.transfers), f"method {spec.name}'s schedule has")
    return replace(schedule, method=schedule.method or spec.name, fabric=inst.fabric)


class _DoesNotLower(SynthError):
    """Lowering refused the schedule, or its program exceeds an MSCCL limit (the other failures of
    :func:`_program` are a method's bugs, and raise for runner-ups too). ``program`` is the verified program
    where only a runtime limit refused it: the JSON program still runs (synth's executor and simulator have no
    such limits, docs/programs.md), so it stays a candidate that no MSCCL runtime loads."""

    def __init__(self, message: str, program: Program | None = None) -> None:
        super().__init__(message)
        self.program = program


UNLIMITED_STEPS = 1 << 30   # steps per threadblock when a program is lowered for its JSON form only


PACED_RANKS = 256   # up to this many ranks a schedule is also lowered with switch pacing (_programs)


def _programs(inst: Instance, method: str, schedule: Schedule) -> list[Program]:
    """:func:`_program`, and on fabrics with switches of up to :data:`PACED_RANKS` ranks also the program
    lowered with switch pacing (:func:`synth.program.lower.lower_variants`) where pacing adds an edge and that
    program holds to MSCCL's limits: the pipeline simulates both and keeps the faster (a reduction's sends
    through a switch, unpaced, can take the switch's links out of turn: mi250x4-ib16's composed
    reducescatter simulated at 4550.1 µs, 3403.1 paced; a send that may use a link's idle gap early, paced,
    cannot: dbt's 3-rank allreduce on a star, 5d unpaced against 6d). Past ``PACED_RANKS`` the second
    lowering, verification and simulation would cost more CPU and memory than the scale targets leave."""
    paced = bool(inst.topology.switches) and inst.topology.num_ranks <= PACED_RANKS
    first, *others = _lowered(inst, method, schedule, MAX_STEPS_PER_TB, paced)
    programs = [_checked(inst, method, schedule.collective, first)]
    for other in others:
        try:
            programs.append(_checked(inst, method, schedule.collective, other))
        except _DoesNotLower:
            pass     # pacing's nop steps can pass a limit the unpaced program kept within
    return programs


def _program(inst: Instance, method: str, schedule: Schedule, max_steps_per_tb: int = MAX_STEPS_PER_TB) -> Program:
    """``schedule`` checked against the request, lowered, verified and held to MSCCL's limits; the program
    records the fabric the schedule carries."""
    return _checked(inst, method, schedule.collective,
                    _lowered(inst, method, schedule, max_steps_per_tb, False)[0])


def _lowered(inst: Instance, method: str, schedule: Schedule, max_steps_per_tb: int, paced: bool) -> list[Program]:
    """``schedule`` checked against the request and lowered (:func:`synth.program.lower.lower_variants`), or the
    program a method built itself."""
    from synth.program.lower import lower_variants

    collective, options = inst.collective, inst.options
    coll = schedule.collective
    if (coll.name, coll.num_ranks, coll.root) != (collective.name, collective.num_ranks, collective.root):
        raise SynthError(f"internal: method {method} solved {coll.name} on {coll.num_ranks} ranks (root "
                         f"{coll.root}) instead of the requested {collective.name} on {collective.num_ranks}")
    if options.chunks is not None and coll.chunk_factor != options.chunks:
        raise SynthError(f"internal: method {method} ignored --chunks {options.chunks} "
                         f"(used {coll.chunk_factor})")
    name = f"{coll.name}-{method}-{inst.topology.name}"
    if schedule.program is not None:   # in-network steps: the method built the program (JSON only, no MSCCL XML)
        size = float(inst.size_bytes)
        return [schedule.program.with_(name=name, topology=inst.topology.name, size_bytes=size,
                                       chunk_bytes=coll.chunk_bytes(size), extra={"method": method},
                                       fabric=schedule.fabric)]
    try:
        programs = lower_variants(schedule, name=name, max_steps_per_tb=max_steps_per_tb, paced=paced)
    except SynthError as exc:
        raise _DoesNotLower(f"method {method}: {exc}") from None
    return [program.with_(fabric=schedule.fabric) for program in programs]


def _checked(inst: Instance, method: str, collective: Collective, program: Program) -> Program:
    """``program`` (of ``collective``) verified and held to MSCCL's limits (:class:`_DoesNotLower` where it
    passes one)."""
    from synth.verification import verify

    result = verify(program, collective, topology=inst.topology)
    if not result.ok:
        first = result.errors[0] if result.errors else "unknown error"
        raise SynthError(f"internal: method {method} produced an invalid program: {first}")
    if program.switches:   # no MSCCL runtime loads it: its XML export refuses (msccl_xml.switch_steps_problem)
        return program
    try:
        from synth.program.msccl_xml import check_runtime_limits
    except ImportError:  # pragma: no cover - formats stage always present in a release
        pass
    else:
        try:
            check_runtime_limits(program, runtime=inst.options.runtime)
        except SynthError as exc:
            raise _DoesNotLower(f"method {method}: program exceeds an MSCCL limit: {exc}", program) from None
    return program


OPTIMAL_GAP = 1e-6
UNRUNNABLE_NOTE_SHARE = 0.01   # a faster program the runtime would not run is named when it saves more than this
RUNNABLE_LOSS = 0.25   # ... and kept instead where the best runnable one takes this much longer (48-rank allreduce:
# no count of 48 equal pieces divides a power-of-two buffer, and the best ring took 5x the trees' time)


def status_of(kind: str, gap: float | None) -> str:
    """The one place a result's status is decided (docs/cli.md): ``heuristic`` for a heuristic method (its
    ``MethodSpec.kind``); for an exact one ``optimal`` only where the simulated time meets the lower bound (then no
    program is faster under the cost model: a method's "optimal" inside its own restricted model, epochs or
    k-synchronous rounds, is not that proof), else ``feasible``."""
    if kind == "heuristic":
        return "heuristic"
    return "optimal" if gap is not None and gap <= OPTIMAL_GAP else "feasible"


def _size_notes(program: Program, size_bytes: float) -> list[str]:
    """MSCCL runtimes use a program only when its chunk count divides the buffer (docs/design.md): say so."""
    loop = program.nchunksperloop or 1
    if runtime_divides(loop, size_bytes):
        return []
    return [f"SIZE {int(size_bytes)} B is not a multiple of the program's {loop} chunks per loop in "
            f"{RUNTIME_ELEMENT_BYTES}-byte elements; MSCCL runtimes use a program only where nchunksperloop divides "
            "the buffer's element count, so they will run their own algorithm at this SIZE"]


def check_root(topology: Topology, root: int) -> None:
    """``--root`` must be a rank of ``topology`` (the commands check it before other work, as :func:`instance`)."""
    if not 0 <= root < topology.num_ranks:
        raise SynthError(f"--root {root} is not a rank of {topology.name} (0..{topology.num_ranks - 1})")


def instance(topology: Topology, collective_name: str, size_bytes: float, options: SynthOptions | None = None,
             root: int = 0, *, inplace: bool = False) -> Instance:
    """The request as every method receives it, checked once: the solver and MSCCL runtime are known, SIZE is
    positive, the collective and root exist on ``topology``'s ranks, and the schedule fits the transfer limit.

    Methods plan on the rates transfers can reach (:meth:`Topology.circuit_capacities` refined by
    :func:`synth.topology.routes.route_capacities`: no transfer takes longer or shorter on it); the instance
    records the identity of the fabric as given (other content, same times)."""
    from synth.topology.identity import fabric_of

    fabric = fabric_of(topology)
    topology = route_capacities(topology.circuit_capacities())
    options = options or SynthOptions()
    if options.solver not in SOLVERS:
        raise SynthError(f"unknown solver {options.solver!r}; choose one of {', '.join(SOLVERS)}")
    if size_bytes <= 0:
        raise SynthError(f"size must be positive, got {size_bytes}")
    name = canonical_name(collective_name)
    check_root(topology, root)
    collective = Collective(name, topology.num_ranks, options.chunks or 1, root=root, inplace=inplace)
    if topology.num_ranks < 2:
        raise SynthError(f"topology {topology.name!r} has {topology.num_ranks} rank; a collective needs at least 2")
    check_rank_count(topology.num_ranks, topology.name, "schedules")
    check_route_switches(longest_switch_route(topology), topology.name, topology.num_ranks,
                         lambda: has_rail_boxes(topology))
    try:
        runtime_profile(options.runtime)
    except ValueError as exc:
        raise SynthError(str(exc)) from None
    check_transfer_count(collective.min_transfers, f"{name} on {topology.num_ranks} ranks"
                         + (f" with --chunks {options.chunks}" if options.chunks else "") + " needs at least")
    return Instance(topology, collective, size_bytes, options, fabric)


def synthesize(topology: Topology | str, collective_name: str, size_bytes: float, method: str = "auto",
               options: SynthOptions | None = None, root: int = 0, *, inplace: bool = False,
               progress: Callable[[str, float | None], None] | None = None) -> SynthesisResult:
    """Synthesize, verify and time ``collective_name`` of ``size_bytes`` (SIZE, docs/units.md) on ``topology``.

    ``method="auto"`` runs :func:`synth.synthesis.auto.plan` and keeps the fastest verified program; its
    budgets are deterministic work, and :func:`synth.synthesis.auto.budget_s` (``--time-limit``) is a
    wall-clock safety stop whose cuts are listed as ``not_tried``. Raises :class:`SynthError` when the method fails,
    times out without a schedule, or produces a program that does not verify.

    Python's full garbage collections are deferred meanwhile (:func:`synth.gcpause.full_collections_deferred`).
    """
    with full_collections_deferred():
        return _synthesize(topology, collective_name, size_bytes, method, options, root, inplace, progress)


def _synthesize(topology: Topology | str, collective_name: str, size_bytes: float, method: str,
                options: SynthOptions | None, root: int, inplace: bool,
                progress: Callable[[str, float | None], None] | None) -> SynthesisResult:
    """:func:`synthesize` itself."""
    from synth.simulation import simulate

    if isinstance(topology, str):
        from synth.topology.io import load_topology

        topology = load_topology(topology)
    inst = instance(topology, collective_name, size_bytes, options, root, inplace=inplace)
    topology, collective, options = inst.topology, inst.collective, inst.options
    name = collective.name
    budget_b = options.scratch_budget(size_bytes)

    key = method.strip().lower()
    budget = None
    is_auto = key == "auto"
    stop_at = _bound_us(topology, collective, size_bytes) if is_auto else None
    if is_auto:
        from synth.synthesis import auto

        plan = auto.plan(inst, stop_at)
        if not plan:
            raise SynthError(f"no registered method supports {name}")
        budget = auto.budget_s(options)
    else:
        plan = [None]

    t0 = time.perf_counter()
    best: _Timed | None = None
    unrunnable: _Timed | None = None   # auto: the fastest program an MSCCL runtime would not run at SIZE
    # auto: the fastest program over the scratch budget, by whether the runtime runs it at SIZE (True: it does not)
    roomy: dict[bool, _Timed] = {}
    tried: list[dict] = []
    clock_out = None    # auto: why --time-limit cut the plan short

    def rank(sim: SimResult, schedule: Schedule, program: Program) -> Rank:
        runs = not options.runtime_chunks or runtime_divides(program.nchunksperloop or 1, size_bytes)
        loads = "over_limits" not in schedule.notes
        return Rank(options.loads_only and not loads, not (runs and loads),
                    scratch_bytes(program, size_bytes) > budget_b, sim.time_us)

    for cand in plan:
        m, opts, row = key, options, {}
        if cand is not None:  # auto: the candidate's own limit and chunks, within the total budget
            m, row = cand.method, ({"chunks": cand.chunks} if cand.chunks is not None else {})
            # only a program the runtime runs within the scratch budget ends the plan or rules a candidate out
            settled = best is not None and not (best.rank.unrunnable or best.rank.over_scratch)
            if settled and stop_at is not None and auto.close_enough(best.sim.time_us, stop_at):
                tried.append({"method": m, **row, "skipped": f"{best.method} is within {auto.CLOSE_ENOUGH:.0%} "
                              "of the lower bound"})
                continue
            if best is not None and cand.fallback:
                tried.append({"method": m, **row, "skipped": "fallback only"})
                continue
            if settled and cand.floor_us is not None and best.sim.time_us <= cand.floor_us:
                tried.append({"method": m, **row, "skipped": f"no {m} program beats {cand.floor_us:.1f} us, and "
                              f"{best.method} takes {best.sim.time_us:.1f}"})
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
            run = _run_one(inst.with_options(opts), m)
            # the method's alternatives are timed as its schedule is, and the fastest kept
            timed = []
            for schedule, program in run.lowered:
                sim = simulate(program, topology, size_bytes, record_events=False)
                timed.append(_Timed(sim, schedule, program, run, rank(sim, schedule, program)))
            kept = min(timed, key=lambda t: t.rank)
            # the fastest program the runtime would not run, its alternatives included: a runnable one kept over it
            # must be within RUNNABLE_LOSS (a trees allreduce with pieces a unit apart, beside its equal pieces)
            fastest_off = min((t for t in timed if t.rank.unrunnable), key=lambda t: t.rank, default=None)
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
        tried.append({"method": m, **row, "time_us": kept.sim.time_us, "synthesis_s": run.seconds})
        if fastest_off is not None and (unrunnable is None or fastest_off.rank < unrunnable.rank):
            unrunnable = fastest_off
        over = roomy.get(kept.rank.unrunnable)
        if kept.rank.over_scratch and (over is None or kept.sim.time_us < over.sim.time_us):
            roomy[kept.rank.unrunnable] = kept
        if best is None or kept.rank < best.rank:
            best = kept
    elapsed = time.perf_counter() - t0
    if best is None:
        detail = "; ".join(f"{row['method']}: {row.get('error') or row.get('not_tried')}" for row in tried)
        raise SynthError(f"auto: every method failed for {name} on {topology.name} ({detail})")
    # only a faster program the runtime would not run is worth naming (a slower one was no choice)
    passed_over = unrunnable if unrunnable is not None and unrunnable.sim.time_us < best.sim.time_us else None
    if (unrunnable is not None and unrunnable.rank.over_scratch <= best.rank.over_scratch
            and unrunnable.rank.unloadable <= best.rank.unloadable
            and unrunnable.sim.time_us * (1 + RUNNABLE_LOSS) < best.sim.time_us):
        best, passed_over = unrunnable, best     # a runnable program this much slower is no answer
    sim, schedule, program = best.sim, best.schedule, best.program
    # the bound reads the collective's name, ranks and root, which _program holds the schedule to: auto's is reused
    bound = stop_at if stop_at is not None else _bound_us(topology, schedule.collective, size_bytes)
    gap = (sim.time_us - bound) / sim.time_us if bound is not None and sim.time_us > 0 else None
    return SynthesisResult(
        method=best.method,
        solver=best.schedule.solver or best.run.solver,    # a method's alternative may use another solver
        status=status_of(best.run.kind, gap),
        time_us=sim.time_us,
        algbw_GBps=algbw_GBps(size_bytes, sim.time_us),
        busbw_GBps=algbw_GBps(size_bytes, sim.time_us) * schedule.collective.busbw_factor,
        bound_us=bound,
        gap=gap,
        synthesis_s=elapsed,
        program=program,
        schedule=schedule,
        collective=schedule.collective,
        topology=topology.name,
        size_bytes=int(size_bytes),
        predicted_time_us=schedule.predicted_time_us,
        tried=tried,
        notes=(_size_notes(program, size_bytes) + _over_limits_note(schedule) + _passed_over_note(passed_over, best)
               + _fitted_chunks_note(schedule) + _host_only_note(topology, schedule.collective, size_bytes, program,
                                                                 sim.time_us, bound)
               + _scratch_notes(best, roomy.get(best.rank.unrunnable) if is_auto else None, size_bytes, budget_b,
                                is_auto)),
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


def _over_limits_note(schedule: Schedule) -> list[str]:
    why = schedule.notes.get("over_limits")
    if why is None:
        return []
    return [f"no MSCCL runtime loads this program ({why}); write it as a .json program, which synth's simulator "
            "and executor run"]


def _host_only_note(topology: Topology, collective: Collective, size_bytes: float, program: Program,
                    time_us: float, bound: float | None) -> list[str]:
    """On a fabric whose switches multicast or reduce, a program that uses none of them is held to a bound that
    counts them (``bound_us``): name the host-only bound it can reach (docs/cost-model.md, "In-network
    reduction"), where that is higher."""
    if bound is None or not topology.in_network_switches or program.switches:
        return []
    from synth.lower_bounds import compute_bounds

    host_only = compute_bounds(topology, collective, size_bytes).host_only_bound_us
    if host_only is None or host_only <= bound * (1 + 1e-9):
        return []
    return [f"the bound ({bound:.1f} us) counts the in-network switches, which this program does not use; against "
            f"the host-only bound ({host_only:.1f} us) it reaches {host_only / time_us:.3f}"]


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
        if "over_limits" in kept.schedule.notes:
            return [f"kept {kept.method} although its program exceeds an MSCCL runtime's limits (only its JSON "
                    f"program runs; the XML export refuses it): the best program the runtimes load, "
                    f"{passed_over.method}, takes {other_us:.1f} us ({other_us / kept_us:.1f}x)"]
        loop = kept.program.nchunksperloop or 1
        return [f"kept {kept.method} although its {loop} chunks per loop do not divide SIZE, so MSCCL runtimes would "
                f"not run it at this SIZE: the best program they would run, {passed_over.method}, takes "
                f"{other_us:.1f} us ({other_us / kept_us:.1f}x)"]
    if other_us >= kept_us * (1 - UNRUNNABLE_NOTE_SHARE):
        return []
    if "over_limits" in passed_over.schedule.notes:
        return [f"a program of {passed_over.method} took {other_us:.1f} us ({(kept_us / other_us - 1) * 100:.0f} % "
                f"faster), but it exceeds an MSCCL runtime's limits ({passed_over.schedule.notes['over_limits']})"]
    loop = passed_over.program.nchunksperloop or 1
    # "a program of": the method's row in ``tried`` may list another of its programs, one the runtimes run
    return [f"a program of {passed_over.method} took {other_us:.1f} us ({(kept_us / other_us - 1) * 100:.0f} % "
            f"faster), but its {loop} chunks per loop do not divide SIZE, so MSCCL runtimes would not run it; "
            "--any-chunks keeps the fastest program"]

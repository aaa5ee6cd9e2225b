"""Symbolic verification of a Program: does it compute its collective, and can it deadlock?

Model (MSCCL semantics, see :mod:`synth.program.ir`): each threadblock runs its steps in order; a
step may start once its dependency (``depid``/``deps``, same GPU) has completed. A send never waits
(asynchronous): it appends a snapshot of the data to the FIFO of connection (src rank, send peer,
channel), modelled as unbounded. A receive takes the head of the FIFO of connection (recv peer, this
rank, channel) and must match its ``cnt``. Execution is a worklist over threadblocks (a blocked
threadblock is woken only by the event it waits for), so the cost is linear in the number of steps.

Buffer slots hold the *set of contributions* they combine (SCCL/msccl-tools style symbolic values).
Every postcondition of :mod:`synth.collectives` combines contributions of one input slot, so a value
is encoded as ``(input slot, bitset of origin ranks)``; a reduction of overlapping sets (double
counting) or of different input slots is reported where it happens. At the end every output slot
must hold exactly its postcondition set.

Detected: bad structure (peers, channels, duplicate connections, dependency references, missing
``hasdep``), offsets out of range (after in-place aliasing), reads of slots holding no data, cnt
mismatches, messages never received, receives never matched, deadlock (with a wait-for cycle),
wrong results, and data races: two threadblocks of a rank touching one slot (one writing) with no
chain of program order, dependencies and messages between them (vector clocks over the executed
trace; skipped for programs above ``RACE_CHECK_BUDGET``). The symbolic values follow one legal
interleaving, which is the only one when there is no race.

The check is a sequence of passes over plain records, each in its own module, each returning a frozen
record (with its own capped error list) that the next passes read: :mod:`~synth.verification.layout`
(buffers and in-place aliasing), :mod:`~synth.verification.conditions` (precondition, intact input,
postcondition), :mod:`~synth.verification.structure` (threadblocks, connections, compiled steps),
:mod:`~synth.verification.execution` (the symbolic run, blocked threadblocks, unreceived messages) and
:mod:`~synth.verification.races`. Where the race check does not run (a large program, or ``races=False``),
:mod:`~synth.verification.dataflow` first tries the symbolic run as array operations, level by level over the
program's static step graph; it can only answer that the program verifies, and on anything else the worklist run
above decides and words the errors. :func:`verify` runs them in order and collects their errors. The per-step checks
run on numpy columns of the steps' fields (:mod:`synth.program.columns`: the ones the lowering built, else read
once by :func:`verify`); only a threadblock that fails one goes through the per-step code, which words the
messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice

from synth.collectives import Collective, canonical_name
from synth.errors import SynthError
from synth.gcpause import gc_paused
from synth.program.columns import StepColumns, program_columns
from synth.program.ir import Program, check_buffer_cap, collective_of
from synth.runtime_limits import EXECUTOR, runtime_profile
from synth.topology.model import Topology
from synth.verification.common import MAX_ERRORS, RACE_CHECK_BUDGET, Errors, merge_errors
from synth.verification.conditions import (
    expected_values,
    fill_inputs,
    input_writes,
    iter_expected_values,
    postcondition,
)
from synth.verification.dataflow import dataflow_verified
from synth.verification.execution import blocked, execute, leftovers
from synth.verification.layout import layout
from synth.verification.races import race_check
from synth.verification.structure import structure
from synth.verification.switches import EMPTY_PLAN, switch_plan, switch_structure

__all__ = ["MAX_ERRORS", "RACE_CHECK_BUDGET", "VerifyResult", "expected_values", "iter_expected_values",
           "resolve_collective", "run_passes", "verify"]


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    collective: str
    ranks: int
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "collective": self.collective, "ranks": self.ranks, "errors": list(self.errors)}


def resolve_collective(program: Program, collective: Collective | str | None = None) -> Collective:
    """The collective to check: given explicitly (name or object) or the one the program declares."""
    if collective is None:
        try:
            coll = collective_of(program, capped=False)
        except SynthError as exc:
            raise SynthError(f"program {program.name!r}: {exc} (pass the collective explicitly, e.g. -c allreduce)") \
                from None
        return check_buffer_cap(program, coll)
    if isinstance(collective, Collective):
        if collective.num_ranks != program.num_ranks:
            raise SynthError(f"collective has {collective.num_ranks} ranks but the program has {program.num_ranks}")
        return collective
    return collective_of(program.with_(collective=canonical_name(collective)))


def run_passes(program: Program, coll: Collective, max_errors: int = MAX_ERRORS, races: bool = True,
               keep_input: bool = True, topology: Topology | None = None,
               columns: StepColumns | None = None) -> list[Errors]:
    """Every verification pass, in order, on ``program`` as ``coll``; each pass's errors. ``topology``: the fabric
    its switch steps are checked against (default: the one the program embeds, if any). ``columns``: the program's
    :func:`~synth.program.columns.program_columns`, if already built."""
    lay = layout(program, coll)
    fill_inputs(coll, lay)
    found = [input_writes(program, coll, keep_input, max_errors, columns)]
    st = structure(program, lay, max_errors, columns)
    del columns     # compiled into st: the arrays need not outlive this (verify hands them over)
    found.append(st.errors)
    plan = EMPTY_PLAN
    if program.switches:
        if topology is None and program.fabric is not None:
            topology = program.fabric.topology
        sw_errors = switch_structure(program, st.tbs, topology, max_errors)
        found.append(sw_errors)
        if sw_errors:   # the run would only repeat them
            return found
        plan = switch_plan(program)
    if st.complete:
        traced = races and len(st.tbs) * program.num_steps() <= RACE_CHECK_BUDGET
        if not traced and dataflow_verified(program, coll, lay, st):
            return found    # ran to the end, every output as required (nothing for the remaining passes to say)
        ex = execute(program, st, traced, max_errors, plan)
        found += [ex.errors, blocked(st, ex, max_errors), leftovers(st, ex, max_errors),
                  race_check(lay, st, ex, max_errors), postcondition(coll, lay, st.tbs, max_errors)]
    return found


def verify(program: Program, collective: Collective | str | None = None, max_errors: int = MAX_ERRORS,
           races: bool = True, msccl_limits: bool = False, keep_input: bool = True,
           runtime: str | None = None, topology: Topology | None = None) -> VerifyResult:
    """Check that ``program`` implements ``collective`` (default: the one it declares) and cannot deadlock.

    Also checks the structure the MSCCL runtimes' loaders require (dense threadblock ids, channels, ...;
    :func:`synth.program.msccl_xml.runtime_limit_errors`) and, with ``msccl_limits`` (an XML program), their
    capacity limits too. A program that breaks them is reported without being executed, since the runtimes
    would not load it and its sizes may be unusable. An out-of-place program that writes its input buffer is
    an error unless ``keep_input`` is false (docs/programs.md, "Input buffer"). ``runtime`` (``msccl-executor``
    or ``msccl``) holds it to that runtime's limits and collectives (implies ``msccl_limits``). In-network steps
    (``program.switches``) are checked against ``topology``, or the fabric the program embeds (docs/programs.md,
    "Switch steps"); a program with them fails ``msccl_limits`` (MSCCL XML cannot express them). Raises
    SynthError only when the collective itself is unknown or inconsistent with the program.
    """
    from synth.program.msccl_xml import runtime_limit_errors, suspect_threadblocks

    coll = resolve_collective(program, collective)
    # every step's fields as arrays, once: the step checks of the limits, the input and the structure read them
    # (in a list that run_passes takes them from, so that they are freed once the structure is compiled)
    columns = [program_columns(program)]
    msccl = msccl_limits or runtime is not None
    profile = runtime_profile(runtime) if runtime is not None else EXECUTOR
    suspect = suspect_threadblocks(columns[0], program, msccl, profile) if columns[0] is not None else None
    limits = runtime_limit_errors(program, msccl=msccl, runtime=runtime, suspect=suspect)
    errors = [f"runtime limit: {e}" for e in islice(limits, max_errors)]
    if errors:
        return VerifyResult(ok=False, collective=coll.name, ranks=program.num_ranks, errors=errors)
    del limits
    with gc_paused():   # one symbolic value per chunk slot and step record, none in a cycle
        errors = merge_errors(run_passes(program, coll, max_errors, races, keep_input, topology, columns.pop()),
                              max_errors)
    return VerifyResult(ok=not errors, collective=coll.name, ranks=program.num_ranks, errors=errors)

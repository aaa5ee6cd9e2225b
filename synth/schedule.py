"""Schedule IR: chunk-level transfers produced by a synthesis method, before lowering.

A :class:`Transfer` moves one schedule chunk (see :mod:`synth.collectives`) from rank ``src`` to
rank ``dst``. ``reduce=True`` means the receiver combines the sender's current partial value of the
chunk into its own (reductions only); otherwise the receiver's copy is overwritten. ``route`` lists
the switches crossed, in order (empty for a direct link). ``start``/``end`` are the times (µs) the
method predicts; lowering uses them to order steps, the simulator recomputes real times.
A schedule carries the identity of the fabric it was made for (``fabric``), which its program records.
Transfers between the same pair with the same ``group`` are sent as one MSCCL step (``cnt`` > 1)
when their chunks are contiguous in the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from synth.collectives import Collective

if TYPE_CHECKING:
    from synth.program.ir import Program
    from synth.topology.identity import Fabric


class Transfer(NamedTuple):
    """One chunk moved (a named tuple: immutable, ordered by its fields, and cheap to build by the
    hundred thousand, as the ring's 64-rank schedules are; change one field with ``_replace``)."""

    start: float
    end: float
    chunk: int
    src: int
    dst: int
    reduce: bool = False
    route: tuple[int, ...] = ()
    channel: int = 0
    group: int = -1


@dataclass(frozen=True)
class Schedule:
    collective: Collective
    topology: str
    transfers: tuple[Transfer, ...]
    method: str = ""
    # Size the schedule was planned for (bytes); the predicted makespan in µs.
    size_bytes: float = 0.0
    predicted_time_us: float = 0.0
    # free-form figures of the method (never read by the pipeline: status and solver are typed)
    notes: dict = field(default_factory=dict, compare=False)
    # Runner-up schedules the method's own model cannot rank against this one (behind shared switch
    # links its plans and replays mispredict the runtime): the pipeline lowers, verifies and times
    # each one as it does this schedule, and keeps the fastest.
    alternatives: tuple[Schedule, ...] = field(default=(), compare=False, repr=False)
    # the solver an exact method used, where it is not ``SynthOptions.solver`` (pareto: CP-SAT)
    solver: str | None = None
    # the identity of the fabric it was made for (name, content hash, source: synth.topology.identity); the
    # pipeline sets it from the request (synth.synthesis.base.Instance), and the program written records it
    fabric: Fabric | None = field(default=None, compare=False, repr=False)
    # a program built by the method itself, for steps a Transfer cannot say (in-network reduction,
    # synth.synthesis.nvls): the pipeline verifies and times it instead of lowering ``transfers``
    program: Program | None = field(default=None, compare=False, repr=False)

    @property
    def makespan(self) -> float:
        return max((t.end for t in self.transfers), default=0.0)

    def by_start(self) -> list[Transfer]:
        return sorted(self.transfers)

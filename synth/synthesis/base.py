"""What every synthesis method shares: its options, its registry entry and the MSCCL limits its programs fit."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from synth.collectives import Collective
from synth.errors import TimeLimitReached

# the MSCCL runtime limits every method's programs must fit (re-exported for the methods)
from synth.runtime_limits import MAX_CHANNELS, MAX_STEP_CHUNKS, MAX_STEPS_PER_TB, MAX_XML_NODES  # noqa: F401
from synth.schedule import Schedule
from synth.topology.model import Topology


@dataclass(frozen=True)
class SynthOptions:
    solver: str = "highs"
    time_limit: float | None = None   # seconds of wall clock: a safety stop, never a budget (see deadline_of)
    # deterministic solver work ("work seconds"): CP-SAT deterministic time, branch-and-bound nodes
    # (synth.solvers.NODES_PER_WORK_S per unit); None: the method's own default. Results depend on it,
    # never on how fast the machine is.
    work_limit: float | None = None
    gap: float | None = None          # relative MIP gap at which to stop
    threads: int | None = None
    chunks: int | None = None         # chunks per rank piece (C); None lets the method choose
    seed: int = 0
    max_trees: int | None = None
    # chunk counts an MSCCL runtime runs at SIZE (nchunksperloop divides the buffer), where there are any
    runtime_chunks: bool = True
    # the MSCCL runtime the program is for (synth.runtime_limits.RUNTIMES): its limits hold every candidate
    runtime: str = "msccl-executor"
    # scratch budget per rank in bytes (synth.runtimes.scratch_bytes); None: the SIZE buffer; inf: none.
    # auto prefers programs within it; a method's program over it gets a note
    max_scratch: float | None = None
    extra: dict = field(default_factory=dict, compare=False)


def deadline_of(options: SynthOptions) -> float | None:
    """The ``time.monotonic()`` instant ``--time-limit`` ends, counted from now (None: no limit).

    ``--time-limit`` is the user's wall-clock *safety stop*: a method that passes it fails with
    :func:`time_limit_error` rather than return a different (shorter-searched) program, so the same
    options give the same program on an idle and on a loaded machine, or an error."""
    return None if options.time_limit is None else time.monotonic() + options.time_limit


def time_limit_error(method: str, limit: float, unfinished: str) -> TimeLimitReached:
    """The one message of a method whose ``--time-limit`` ran out before it finished (exit 2)."""
    return TimeLimitReached(f"{method}: the time limit ({limit:g} s) ran out before {unfinished}; allow more time")


def check_deadline(deadline: float | None, method: str, unfinished: str) -> None:
    """Raise :class:`TimeLimitReached` once ``deadline`` (from :func:`deadline_of`) has passed: methods call it
    between steps instead of skipping the rest, so a loaded machine gets the same program or an error."""
    if deadline is not None and time.monotonic() > deadline:
        raise TimeLimitReached(f"{method}: the time limit ran out before {unfinished}; allow more time")


MethodFn = Callable[[Topology, Collective, float, SynthOptions], Schedule]


BANDWIDTH_PIECE = 1e6        # bytes per rank from which a case counts as bandwidth-bound


@dataclass(frozen=True)
class Instance:
    """What an ``auto`` rule looks at: the fabric's size and shape, the collective and the piece size."""

    ranks: int
    switches: bool
    boxes: int
    collective: str
    piece_bytes: float

    @property
    def bandwidth_bound(self) -> bool:
        return self.piece_bytes >= BANDWIDTH_PIECE

    @property
    def latency_bound(self) -> bool:
        return not self.bandwidth_bound


@dataclass(frozen=True)
class AutoRule:
    """When ``auto`` tries a method (``when`` holds and the method supports the collective), and its own
    deterministic work limit (``limit_s``: solver work seconds, or a function of the instance; None for
    methods without a solver)."""

    when: Callable[[Instance], bool]
    limit_s: float | Callable[[Instance], float] | None = None


@dataclass(frozen=True)
class MethodSpec:
    """A synthesis method: its name, entry point, the collectives it serves, and optionally its own ``auto``
    rule (a method registered with :func:`synth.synthesis.registry.register` and an ``auto`` rule is tried
    by ``auto`` with no other edit)."""

    name: str
    run: MethodFn
    collectives: frozenset[str]
    description: str
    # "heuristic" methods report status heuristic; exact ones report the solver's status.
    kind: str = "heuristic"
    auto: AutoRule | None = None

"""What every synthesis method shares: its options, its registry entry and the MSCCL limits its programs fit."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

from synth.collectives import Collective
from synth.errors import SynthError, TimeLimitReached

# the MSCCL runtime limits every method's programs must fit (re-exported for the methods)
from synth.runtime_limits import MAX_CHANNELS, MAX_STEP_CHUNKS, MAX_STEPS_PER_TB, MAX_XML_NODES  # noqa: F401
from synth.schedule import Schedule
from synth.topology.identity import Fabric
from synth.topology.model import Topology
from synth.topology.structure import boxes_of


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
    # the program is written as MSCCL XML (synthesize's .xml output, tune): auto keeps a program no MSCCL runtime
    # loads (over its limits; only its JSON form runs) only where none loads
    loads_only: bool = False
    extra: dict = field(default_factory=dict, compare=False)
    # the healthy fabric the topology is an edited copy of (--exclude-link/--degrade, the same ranks): methods
    # that can reuse its solution warm-start from it (trees: synth.synthesis.trees.forest.plan_forest)
    healthy: Topology | None = field(default=None, compare=False, repr=False)

    def scratch_budget(self, size_bytes: float) -> float:
        """``max_scratch`` in bytes per rank: the SIZE buffer where none was given (inf: no budget)."""
        return float(size_bytes) if self.max_scratch is None else float(self.max_scratch)


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


BANDWIDTH_PIECE = 1e6        # bytes per rank from which a case counts as bandwidth-bound


@dataclass(frozen=True)
class Instance:
    """One synthesis request, as every method receives it: the topology it plans on, the collective (its ranks,
    root, in-place flag and requested chunk factor), SIZE in bytes (docs/units.md), the options, and the identity
    of the fabric as the user gave it (:mod:`synth.topology.identity`), which the schedule carries.

    The pipeline builds and checks it once (:func:`synth.pipeline.instance`); the invariants every method relies on
    are held here, so no method checks them again. ``auto`` rules (:class:`AutoRule`) read its shape: ``ranks``,
    ``switches``, ``boxes``, ``piece_bytes``, ``bandwidth_bound``."""

    topology: Topology
    collective: Collective
    size_bytes: float
    options: SynthOptions = field(default_factory=SynthOptions)
    fabric: Fabric | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        n = self.topology.num_ranks
        if self.collective.num_ranks != n:
            raise SynthError(f"collective has {self.collective.num_ranks} ranks but topology {self.topology.name!r} "
                             f"has {n}")
        if self.options.chunks is not None and self.options.chunks < 1:
            raise SynthError("--chunks must be at least 1")
        if self.options.max_trees is not None and self.options.max_trees < 1:
            raise SynthError("--max-trees must be at least 1")

    def with_options(self, options: SynthOptions) -> Instance:
        """The same request under other options (an ``auto`` candidate's limits, a smaller chunk count)."""
        return replace(self, options=options)

    # ---- the shape ``auto`` rules look at ----------------------------------------------------------------
    @property
    def ranks(self) -> int:
        return self.topology.num_ranks

    @property
    def switches(self) -> bool:
        return bool(self.topology.switches)

    @cached_property
    def boxes(self) -> int:
        return len(boxes_of(self.topology))

    @property
    def piece_bytes(self) -> float:
        """The bytes one rank contributes: SIZE / N, but SIZE for broadcast and reduce (one buffer)."""
        per_rank = self.collective.name not in ("broadcast", "reduce")
        return self.size_bytes / self.ranks if per_rank else float(self.size_bytes)

    @property
    def bandwidth_bound(self) -> bool:
        return self.piece_bytes >= BANDWIDTH_PIECE

    @property
    def latency_bound(self) -> bool:
        return not self.bandwidth_bound

    @cached_property
    def piece_alphas(self) -> float:
        """One rank's piece moved over the fabric's widest rank-to-rank link, in that link's α: the piece's
        ``bytes / bw`` over ``α`` (docs/cost-model.md), the most over the links of the widest bandwidth (inf
        where one has α = 0, 0 without links). Large fabrics cut SIZE into small pieces, yet each piece can
        still cost many α: a 64×64 torus at 1 GiB moves 256 KiB pieces, 10.5 α on its 50 GB/s links."""
        ranks = self.ranks
        links = [link for link in self.topology.links if link.src < ranks and link.dst < ranks]
        if not links:
            return 0.0
        widest = max(link.bw for link in links)
        alpha = min(link.alpha for link in links if link.bw == widest)
        return math.inf if alpha <= 0 else self.piece_bytes / (widest * 1e3) / alpha

    @cached_property
    def torus_dims(self) -> tuple[int, ...] | None:
        """The torus the fabric's links form (:func:`synth.synthesis.scale.torus_dims`), read once per request:
        the check builds a torus per factorisation of N (0.5 s at 4096 ranks), and auto's rules ask it twice."""
        from synth.synthesis.scale import torus_dims

        return torus_dims(self.topology)


MethodFn = Callable[[Instance], Schedule]


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
    # a time (µs) no program of the method beats on the instance, where it is cheap to prove (None: not known);
    # ``auto`` runs a method whose floor misses its early stop after the others and skips it once a verified
    # program is as fast
    floor_us: Callable[[Instance], float | None] | None = None
    # methods this one stands in for: where ``auto`` plans it, they run only if nothing before them produced a
    # program (rsag runs trees itself, for the phases of an allreduce)
    supersedes: frozenset[str] = frozenset()

"""What every synthesis method shares: its options, its registry entry and the MSCCL limits its programs fit."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule
from synth.topology.model import Topology

# MSCCL runtime limits every method's programs must fit (msccl-executor-nccl; the exporter checks them again)
MAX_CHANNELS = 32        # channels
MAX_STEPS_PER_TB = 64    # steps per threadblock
MAX_STEP_CHUNKS = 71     # chunks one step moves (cnt < 72)
MAX_XML_NODES = 4096     # XML nodes per rank: the algo, the gpus, the rank's threadblocks and steps


@dataclass(frozen=True)
class SynthOptions:
    solver: str = "highs"
    time_limit: float | None = None   # seconds
    gap: float | None = None          # relative MIP gap at which to stop
    threads: int | None = None
    chunks: int | None = None         # chunks per rank piece (C); None lets the method choose
    seed: int = 0
    max_trees: int | None = None
    # chunk counts an MSCCL runtime runs at SIZE (nchunksperloop divides the buffer), where there are any
    runtime_chunks: bool = True
    extra: dict = field(default_factory=dict, compare=False)


def deadline_of(options: SynthOptions) -> float | None:
    """The ``time.monotonic()`` instant ``--time-limit`` ends, counted from now (None: no limit)."""
    return None if options.time_limit is None else time.monotonic() + options.time_limit


def time_limit_error(method: str, limit: float, unfinished: str) -> SynthError:
    """The one message of a heuristic whose ``--time-limit`` ran out before it had any schedule (exit 2)."""
    return SynthError(f"{method}: the time limit ({limit:g} s) ran out before {unfinished}; allow more time")


MethodFn = Callable[[Topology, Collective, float, SynthOptions], Schedule]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    run: MethodFn
    collectives: frozenset[str]
    description: str
    # "heuristic" methods report status heuristic; exact ones report the solver's status.
    kind: str = "heuristic"

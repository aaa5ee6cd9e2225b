"""What every synthesis method shares: its options, its registry entry and the MSCCL limits its programs fit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from synth.collectives import Collective
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


MethodFn = Callable[[Topology, Collective, float, SynthOptions], Schedule]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    run: MethodFn
    collectives: frozenset[str]
    description: str
    # "heuristic" methods report status heuristic; exact ones report the solver's status.
    kind: str = "heuristic"

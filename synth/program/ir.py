"""Program IR: exactly what MSCCL XML carries, plus synth metadata.

Step semantics (MSCCL): ``s`` send ``src``; ``r`` receive into ``dst``; ``rcs`` receive into ``dst``
and forward; ``rrs`` receive, reduce with the local ``src`` operand, forward (not stored);
``rrc`` receive, reduce with local ``src``, store into ``dst``; ``rrcs`` = rrc then forward;
``cpy`` local copy ``src`` -> ``dst``; ``re`` local reduce ``dst = dst + src``; ``nop`` only waits.
Sends go to the threadblock's ``send`` peer and receives come from its ``recv`` peer on channel
``chan``; a connection (src rank, dst rank, chan) is FIFO. ``depid``/``deps`` name one step
(threadblock id, step index) of the same GPU that must finish first; ``hasdep`` marks steps that
others depend on. Offsets and ``cnt`` count chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from operator import attrgetter

import numpy as np

from synth.topology.identity import Fabric  # noqa: F401  (a program records its fabric: re-exported)

STEP_TYPES = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")
SENDS = frozenset({"s", "rcs", "rrs", "rrcs"})
RECEIVES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
REDUCES = frozenset({"rrs", "rrc", "rrcs", "re"})
BUFFERS = ("i", "o", "s")
# Which local operands each step type uses (src is the LOCAL operand of rrs/rrc/rrcs).
READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})


@dataclass(frozen=True, slots=True)   # slots: a 64x64 torus program holds millions of Steps
class Step:
    type: str
    srcbuf: str = "i"
    srcoff: int = 0
    dstbuf: str = "i"
    dstoff: int = 0
    cnt: int = 1
    depid: int = -1
    deps: int = -1
    hasdep: bool = False

    @property
    def sends(self) -> bool:
        return self.type in SENDS

    @property
    def receives(self) -> bool:
        return self.type in RECEIVES


@dataclass(frozen=True)
class Threadblock:
    id: int
    send: int = -1
    recv: int = -1
    chan: int = 0
    steps: tuple[Step, ...] = ()


@dataclass(frozen=True)
class Gpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    threadblocks: tuple[Threadblock, ...] = ()

    def chunks(self, buffer: str) -> int:
        return {"i": self.i_chunks, "o": self.o_chunks, "s": self.s_chunks}[buffer]


SWITCH_OPS = ("reduce", "multicast")


@dataclass(frozen=True)
class SwitchOp:
    """One in-network operation of a switch (JSON program version 2 only; docs/programs.md).

    ``reduce``: takes the next message from every rank of ``srcs`` on connection (rank, switch, ``chan``),
    sums them element-wise and sends the sum to every rank of ``dsts``. ``multicast``: ``srcs`` is one
    rank; its next message goes to every rank of ``dsts``. Messages are ``cnt`` chunks. Ranks take part
    with ordinary ``s``/``r`` steps on a threadblock whose peer is the switch (peer id ``num_ranks + k``
    for ``program.switches[k]``). An op runs once all its messages have arrived; on each connection the
    k-th message is matched with the k-th op (in list order) that names that rank.
    """

    type: str
    srcs: tuple[int, ...]
    dsts: tuple[int, ...]
    cnt: int = 1
    chan: int = 0


def switch_op_problem(op: SwitchOp, num_ranks: int) -> str | None:
    """Why one switch op is malformed (None when it is not): type, members (distinct ranks), cnt, chan."""
    if op.type not in SWITCH_OPS:
        return f"unknown op type {op.type!r} (expected one of {', '.join(SWITCH_OPS)})"
    for role, members in (("srcs", op.srcs), ("dsts", op.dsts)):
        if not members:
            return f"{role} is empty"
        bad = [m for m in members if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < num_ranks]
        if bad:
            return f"{role} member {bad[0]!r} is not a rank (0..{num_ranks - 1})"
        if len(set(members)) != len(members):
            return f"{role} names a rank twice ({list(members)})"
    if op.type == "multicast" and len(op.srcs) != 1:
        return f"a multicast has one src, not {len(op.srcs)}"
    if isinstance(op.cnt, bool) or not isinstance(op.cnt, int) or op.cnt < 1:
        return f"cnt={op.cnt!r} must be at least 1"
    if isinstance(op.chan, bool) or not isinstance(op.chan, int) or op.chan < 0:
        return f"chan={op.chan!r} must be a channel (int >= 0)"
    return None


@dataclass(frozen=True)
class SwitchProgram:
    """The operations one switch of the fabric (by name) performs, in order."""

    name: str
    ops: tuple[SwitchOp, ...] = ()


@dataclass(frozen=True)
class StepColumns:
    """The steps of threadblocks ``0 .. len(start) - 2`` back to back, as numpy columns (built by
    :mod:`synth.program.columns`): threadblock ``g`` has steps ``start[g]:start[g + 1]``. ``kind`` is the step
    type's ``synth.program.columns.KIND`` code (``NO_KIND`` otherwise), ``srcbuf``/``dstbuf`` the ``BUFFER_CODE``
    (``NO_BUFFER`` otherwise); ``deps`` is read only where ``depid`` is not -1 (-1 elsewhere). ``hasdep`` is read
    from ``steps``, the Step objects in the same order, where the lowering gave no column for it. ``of``: the
    ``gpus`` tuple of the Program the columns describe."""

    start: np.ndarray     # int64, one more than there are threadblocks
    kind: np.ndarray      # int8
    srcbuf: np.ndarray    # int8
    srcoff: np.ndarray    # int64 (int32 where the lowering built them)
    dstbuf: np.ndarray    # int8
    dstoff: np.ndarray    # int64 (likewise)
    cnt: np.ndarray       # int64 (likewise)
    depid: np.ndarray     # int64 (likewise)
    deps: np.ndarray      # int64 (likewise)
    steps: list | None = None
    hasdep_column: np.ndarray | None = None    # bool
    of: tuple | None = field(default=None, compare=False, repr=False)

    @property
    def tb_of(self) -> np.ndarray:
        """The threadblock of every step."""
        return np.repeat(np.arange(len(self.start) - 1), np.diff(self.start))

    def hasdep(self, positions: np.ndarray) -> np.ndarray:
        """``hasdep`` of the steps at flat ``positions`` (bool array)."""
        if self.hasdep_column is not None:
            return self.hasdep_column[positions]
        flags = map(bool, map(attrgetter("hasdep"), map(self.steps.__getitem__, positions.tolist())))
        return np.fromiter(flags, np.bool_, len(positions))


@dataclass(frozen=True)
class Program:
    name: str
    collective: str
    num_ranks: int
    gpus: tuple[Gpu, ...]
    inplace: bool = False
    proto: str = "Simple"
    nchannels: int = 1
    nchunksperloop: int = 1
    root: int = 0
    min_bytes: int = 0
    max_bytes: int = 0
    # synth metadata (JSON program only; absent for foreign XML)
    topology: str | None = None
    chunk_factor: int | None = None
    size_bytes: float | None = None
    chunk_bytes: float | None = None
    predicted_time_us: float | None = None
    # in-network steps (NVLS/SHARP); a program with any cannot be written as MSCCL XML
    switches: tuple[SwitchProgram, ...] = ()
    # not compared: the same steps are the same program wherever they came from
    fabric: Fabric | None = field(default=None, compare=False)
    extra: dict = field(default_factory=dict, compare=False)
    # the steps as numpy columns where the lowering built them; read through synth.program.columns.program_columns,
    # which uses them only while they describe these gpus (not compared, not written)
    columns: StepColumns | None = field(default=None, compare=False, repr=False)

    def with_(self, **changes) -> Program:
        return replace(self, **changes)

    def switch_peer(self, peer: int) -> SwitchProgram | None:
        """The switch program a threadblock peer id names (``num_ranks + k``), or None for a rank peer."""
        k = peer - self.num_ranks
        return self.switches[k] if 0 <= k < len(self.switches) else None

    def num_steps(self) -> int:
        return sum(len(tb.steps) for gpu in self.gpus for tb in gpu.threadblocks)


def infer_chunk_factor(program: Program) -> int:
    """The chunks per rank piece (C) implied by the buffer sizes, for programs without metadata: the buffer
    of N pieces (the input where the collective's shape ``scatters``, the output where it ``gathers``) has
    N·C chunks, the other C."""
    from synth.collectives import canonical_name

    if program.chunk_factor:
        return program.chunk_factor
    n = program.num_ranks
    big = max((max(g.i_chunks, g.o_chunks) for g in program.gpus), default=0)
    small_i = max((g.i_chunks for g in program.gpus), default=0)
    small_o = max((g.o_chunks for g in program.gpus), default=0)
    shape = canonical_name(program.collective).shape
    if shape.gathers and shape.scatters:
        factor = big // n
    elif shape.gathers:
        factor = small_o // n if small_o else small_i
    elif shape.scatters:
        factor = small_i // n if small_i else small_o
    else:  # one buffer of C chunks
        factor = max(small_i, small_o)
    return max(1, factor)


def collective_of(program: Program, capped: bool = True):
    """The :class:`~synth.collectives.Collective` a program claims to implement (``capped``: checked by
    :func:`check_buffer_cap`)."""
    from synth.collectives import Collective

    coll = Collective(program.collective, program.num_ranks, infer_chunk_factor(program),
                      root=program.root, inplace=program.inplace)
    return check_buffer_cap(program, coll) if capped else coll


def check_buffer_cap(program: Program, coll):
    """``coll`` if its buffers fit the readers' cap; a recorded chunk_factor (JSON ``chunk_factor``, an SCCL
    instance's ``chunks``) of 2**31 made the verifier size its buffers past any memory."""
    from synth.errors import SynthError
    from synth.runtime_limits import MAX_PARSE_BUFFER_CHUNKS

    if coll.size_chunks > MAX_PARSE_BUFFER_CHUNKS:
        raise SynthError(f"program {program.name!r}: {coll.chunk_factor} chunks per piece make {coll.name} on "
                         f"{coll.num_ranks} ranks need {coll.size_chunks} chunks in a buffer, past the reader's cap "
                         f"of {MAX_PARSE_BUFFER_CHUNKS}")
    return coll

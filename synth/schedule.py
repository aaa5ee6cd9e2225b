"""Schedule IR: chunk-level transfers produced by a synthesis method, before lowering.

A :class:`Transfer` moves one schedule chunk (see :mod:`synth.collectives`) from rank ``src`` to
rank ``dst``. ``reduce=True`` means the receiver combines the sender's current partial value of the
chunk into its own (reductions only); otherwise the receiver's copy is overwritten. ``route`` lists
the switches crossed, in order (empty for a direct link). ``start``/``end`` are the times (µs) the
method predicts; lowering uses them to order steps, the simulator recomputes real times.
A schedule carries the identity of the fabric it was made for (``fabric``), which its program records.
Transfers between the same pair with the same ``group`` are sent as one MSCCL step (``cnt`` > 1)
when their chunks are contiguous in the buffer.

A method whose schedule runs to millions of transfers gives them as a :class:`TransferTable`: the same
records as numpy columns (a 64×64 torus allgather moves 16.8 M chunks; a Transfer record with its numbers
costs about 300 B, a table row 42 B).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

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


#: The fields a :class:`TransferTable` holds as columns (every Transfer field but ``route``).
TABLE_FIELDS = ("start", "end", "chunk", "src", "dst", "reduce", "channel", "group")
_TABLE_DTYPES = (np.float64, np.float64, np.int64, np.int64, np.int64, np.bool_, np.int64, np.int64)


def time_mirrored(transfers: Iterable[Transfer], makespan: float, reduce: bool,
                  channel: int | None = None) -> list[Transfer]:
    """``transfers`` run backwards in time and direction: ``[s, e]`` becomes ``[makespan − e, makespan − s]``,
    sender and receiver swap, the route reverses. A broadcast's transfers become a reduction's (``reduce``) and a
    reduction's a broadcast's: on a fabric whose links have reverse twins of the same bandwidth and α every link
    is held as long, and where a rank forwarded a chunk after receiving it, the mirrored partial sum reaches it
    before it sends its own on. ``channel``: every transfer on it (None: each keeps its own)."""
    return [Transfer(makespan - t.end, makespan - t.start, t.chunk, t.dst, t.src, reduce, t.route[::-1],
                     t.channel if channel is None else channel, t.group) for t in transfers]


@dataclass(eq=False)
class TransferTable(Sequence):
    """Transfers on direct links (``route`` empty) as one numpy column per field, in schedule order.

    It reads as a sequence of :class:`Transfer` (``len``, indexing, iteration make the records on demand) and
    equals any sequence of the same records, so a consumer that needs records gets them; the lowering reads the
    columns. Columns are not copied: do not change them after building the table (a schedule holding it is
    frozen, its columns are not)."""

    start: np.ndarray
    end: np.ndarray
    chunk: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    reduce: np.ndarray
    channel: np.ndarray
    group: np.ndarray

    @classmethod
    def of(cls, **columns) -> TransferTable:
        """A table of the given columns (``TABLE_FIELDS``, all of one length; ``reduce``, ``channel`` and ``group``
        may be scalars: False, 0 and -1 when absent)."""
        length = len(columns["start"])
        defaults = {"reduce": False, "channel": 0, "group": -1}
        arrays = []
        for name, dtype in zip(TABLE_FIELDS, _TABLE_DTYPES, strict=True):
            value = np.asarray(columns.get(name, defaults.get(name)), dtype=dtype)
            arrays.append(np.full(length, value, dtype=dtype) if value.ndim == 0 else value)
        if any(len(a) != length for a in arrays):
            raise ValueError("TransferTable columns differ in length")
        return cls(*arrays)

    @classmethod
    def concatenate(cls, tables: Sequence[TransferTable]) -> TransferTable:
        return cls(*(np.concatenate([getattr(t, name) for t in tables]) for name in TABLE_FIELDS))

    def columns(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, name) for name in TABLE_FIELDS)

    def taken(self, order: np.ndarray) -> TransferTable:
        """The rows in ``order`` (an index array or a boolean mask)."""
        return TransferTable(*(column[order] for column in self.columns()))

    def sorted_by_time(self) -> TransferTable:
        """Rows by (start, end), ties in their present order (``sorted`` with that key, on records)."""
        return self.taken(np.lexsort((self.end, self.start)))

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.taken(index)
        start, end, chunk, src, dst, reduce, channel, group = (column[index].item() for column in self.columns())
        return Transfer(start, end, chunk, src, dst, reduce, (), channel, group)

    def __iter__(self) -> Iterator[Transfer]:
        for start, end, chunk, src, dst, reduce, channel, group in zip(*(c.tolist() for c in self.columns())):
            yield Transfer(start, end, chunk, src, dst, reduce, (), channel, group)

    def __eq__(self, other) -> bool:
        if isinstance(other, TransferTable):
            return all(np.array_equal(a, b) for a, b in zip(self.columns(), other.columns()))
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None     # mutable columns


@dataclass(frozen=True)
class Schedule:
    collective: Collective
    topology: str
    transfers: tuple[Transfer, ...] | TransferTable
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
        if isinstance(self.transfers, TransferTable):
            return float(self.transfers.end.max(initial=0.0))
        return max((t.end for t in self.transfers), default=0.0)

    def by_start(self) -> list[Transfer]:
        return sorted(self.transfers)


def transfer_column(transfers: Sequence[Transfer] | TransferTable, name: str) -> np.ndarray:
    """One integer field (``TABLE_FIELDS``: chunk, src, dst, channel, group) of ``transfers`` as an array: the
    table's own column, or read off the records."""
    if isinstance(transfers, TransferTable):
        return getattr(transfers, name)
    return np.fromiter((getattr(t, name) for t in transfers), np.int64, len(transfers))


def spread_chunks(schedule: Schedule, loop: int) -> Schedule:
    """An allreduce ``schedule`` of ``L`` chunks per loop run on ``loop`` (> L) chunks: chunk ``c`` becomes the run
    ``[⌊c·loop/L⌋, ⌊(c+1)·loop/L⌋)``, and each transfer of ``c`` one transfer per chunk of its run, at the same
    times, in one message (its group, or a group of its own). An allreduce's chunks are independent (every
    rank ends with every chunk's sum, whoever holds it in between), so the program computes the same collective;
    a run is ``loop / L`` chunks to within one, so a transfer's bytes grow by at most one chunk of the new loop.
    Why: MSCCL runtimes run a program only where its loop divides the buffer's elements, which no count of 15 or
    24 equal pieces does for a power-of-two buffer."""
    chunks = schedule.collective.chunk_factor
    if schedule.collective.name != "allreduce" or loop <= chunks:
        raise ValueError("spread_chunks spreads an allreduce over more chunks")
    edges = np.arange(chunks + 1, dtype=np.int64) * loop // chunks
    transfers = schedule.transfers
    table = transfers if isinstance(transfers, TransferTable) else None
    chunk, group = transfer_column(transfers, "chunk"), transfer_column(transfers, "group")
    first, count = edges[chunk], edges[chunk + 1] - edges[chunk]
    # a transfer without a message group gets its own, after every group the schedule uses
    own = np.where(group >= 0, group, int(group.max(initial=-1)) + 1 + np.arange(len(group)))
    row = np.repeat(np.arange(len(chunk)), count)
    new_chunk = first[row] + np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)
    if table is not None:
        spread = table.taken(row)
        spread = TransferTable(spread.start, spread.end, new_chunk, spread.src, spread.dst, spread.reduce,
                               spread.channel, own[row])
    else:
        spread = tuple(transfers[i]._replace(chunk=int(c), group=int(g))
                       for i, c, g in zip(row.tolist(), new_chunk.tolist(), own[row].tolist()))
    return replace(schedule, collective=replace(schedule.collective, chunk_factor=loop), transfers=spread,
                   notes={**schedule.notes, "spread_chunks": [chunks, loop]})

"""Collectives as chunk-level pre- and postconditions (in the manner of msccl-tools / SCCL).

Each rank has an input buffer ``i`` and an output buffer ``o`` of ``input_chunks`` and
``output_chunks`` chunks (uniform across ranks; only the slots named by the postcondition matter).
A *contribution* is one rank's input slot, identified by ``origin * input_chunks + slot``.
The precondition is: input slot ``s`` of rank ``r`` holds contribution ``(r, s)``.
The postcondition maps each output slot that matters to the exact set of contributions it must
combine (one element for copy collectives, N for reductions).

Schedule-level chunk ids (see :mod:`synth.schedule`):
- copy collectives (allgather, alltoall, broadcast, gather, scatter): the contribution id;
- reductions (reducescatter, allreduce, reduce): the input slot index, shared by all ranks,
  whose partial sums are combined.

In-place programs alias one buffer onto a window of the other (MSCCL semantics):
allgather/gather: ``i`` is ``o[r*C : (r+1)*C]``; reducescatter/scatter: ``o`` is ``i[r*C : (r+1)*C]``;
the others: ``o`` is ``i``.

One definition: :class:`CollectiveKind` names the collectives and its :class:`Shape` (five flags) says what
each does; every query below derives from it. Lowering, verification and the greedy methods ask the
vectorised queries (numpy arrays over ranks and chunks: :meth:`Collective.destination_slot`,
:meth:`~Collective.destinations`, :meth:`~Collective.postcondition_arrays`, :meth:`~Collective.initial_chunk`,
...). :attr:`Collective.postcondition`, spelled out slot by slot, is the test oracle they are checked against.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from synth.errors import SynthError


class CollectiveKind(enum.StrEnum):
    """The eight collectives. A ``str`` enum: members compare, hash, format and serialise as their names."""

    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"
    ALLTOALL = "alltoall"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"

    @property
    def shape(self) -> Shape:
        """What this collective does (:class:`Shape`)."""
        return _SHAPES[self]


class Shape(NamedTuple):
    """What a collective does, in five flags: the one definition every pre/postcondition query derives from.

    ``reduces``: an output chunk combines every rank's contribution of one input slot (else it copies one);
    ``scatters``: the input holds N pieces, piece r for rank r (N·C input chunks, else C);
    ``gathers``: the output holds N pieces, piece q from rank q (N·C output chunks, else C);
    ``from_root``: only the root's input counts; ``to_root``: only the root's output counts."""

    reduces: bool = False
    scatters: bool = False
    gathers: bool = False
    from_root: bool = False
    to_root: bool = False


_K = CollectiveKind
_SHAPES: dict[CollectiveKind, Shape] = {
    _K.ALLGATHER: Shape(gathers=True),
    _K.REDUCESCATTER: Shape(reduces=True, scatters=True),
    _K.ALLREDUCE: Shape(reduces=True),
    _K.ALLTOALL: Shape(scatters=True, gathers=True),
    _K.BROADCAST: Shape(from_root=True),
    _K.REDUCE: Shape(reduces=True, to_root=True),
    _K.GATHER: Shape(gathers=True, to_root=True),
    _K.SCATTER: Shape(scatters=True, from_root=True),
}
COLLECTIVES: tuple[CollectiveKind, ...] = tuple(CollectiveKind)
REDUCING = frozenset(k for k in COLLECTIVES if k.shape.reduces)
ROOTED = frozenset(k for k in COLLECTIVES if k.shape.from_root or k.shape.to_root)
# where a postcondition slot combines every rank's contribution (reductions), its origin is this
ALL_ORIGINS = -1
# MSCCL runtimes count a buffer in elements; fp32 here, so 1- and 2-byte types divide as well
RUNTIME_ELEMENT_BYTES = 4
# MSCCL `coll` attribute spellings accepted on import.
COLL_ALIASES = {"reduce_scatter": _K.REDUCESCATTER, "all_reduce": _K.ALLREDUCE, "all_gather": _K.ALLGATHER,
                "all_to_all": _K.ALLTOALL, "alltoall": _K.ALLTOALL}


def runtime_divides(loop_chunks: int, size_bytes: float) -> bool:
    """MSCCL runtimes run a program on a buffer only when the buffer's element count is a multiple of its
    ``nchunksperloop`` (msccl-executor-nccl's algorithm selection, docs/programs.md); elements of
    :data:`RUNTIME_ELEMENT_BYTES`."""
    elements = size_bytes / RUNTIME_ELEMENT_BYTES
    return elements == int(elements) and int(elements) % loop_chunks == 0


def canonical_name(name: str) -> CollectiveKind:
    """The collective a name (any case, or an MSCCL ``coll`` spelling) denotes; SynthError if none."""
    key = name.strip().lower()
    key = COLL_ALIASES.get(key, key)
    if key not in COLLECTIVES:
        raise SynthError(f"unknown collective {name!r}; expected one of {', '.join(COLLECTIVES)}")
    return CollectiveKind(key)


class Postcondition(NamedTuple):
    """The postcondition as arrays, one entry per (rank, output slot) that matters, by rank then slot: the
    slot must hold input slot ``input_slot`` of rank ``origin`` (of every rank where :data:`ALL_ORIGINS`)."""

    rank: np.ndarray
    slot: np.ndarray
    input_slot: np.ndarray
    origin: np.ndarray


@dataclass(frozen=True)
class Collective:
    """A collective on ``num_ranks`` ranks with ``chunk_factor`` (C) chunks per rank piece. ``name`` may be
    given as any spelling :func:`canonical_name` accepts; it is stored as the :class:`CollectiveKind`."""

    name: CollectiveKind
    num_ranks: int
    chunk_factor: int = 1
    root: int = 0
    inplace: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", canonical_name(self.name))
        if self.num_ranks < 1:
            raise SynthError("a collective needs at least one rank")
        if self.chunk_factor < 1:
            raise SynthError("chunk factor must be at least 1")
        if not 0 <= self.root < self.num_ranks:
            raise SynthError(f"root {self.root} is not a rank (0..{self.num_ranks - 1})")
        if self.name not in ROOTED:   # a root means nothing there; every method plans with 0
            object.__setattr__(self, "root", 0)

    # ---- shapes -----------------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        """What the collective does (:attr:`CollectiveKind.shape`)."""
        return self.name.shape

    @property
    def is_reduction(self) -> bool:
        return self.shape.reduces

    @property
    def is_rooted(self) -> bool:
        return self.name in ROOTED

    @property
    def input_chunks(self) -> int:
        return self.num_ranks * self.chunk_factor if self.shape.scatters else self.chunk_factor

    @property
    def output_chunks(self) -> int:
        return self.num_ranks * self.chunk_factor if self.shape.gathers else self.chunk_factor

    @property
    def size_chunks(self) -> int:
        """How many chunks the SIZE (docs/units.md) covers (the nccl-tests buffer convention)."""
        return max(self.input_chunks, self.output_chunks)

    @property
    def min_transfers(self) -> int:
        """The fewest chunk transfers any schedule of this chunking needs: every chunk a rank must end with and
        does not start with arrives by at least one transfer; an allreduce chunk needs 2(N-1) (one-way gossip,
        Harary & Schwenk 1974, as in :func:`synth.lower_bounds.allreduce_bandwidth_us`)."""
        n, c = self.num_ranks, self.chunk_factor
        if self.name == _K.ALLREDUCE:
            return 2 * (n - 1) * c
        if self.shape.from_root or self.shape.to_root:
            return (n - 1) * c
        return n * (n - 1) * c

    def chunk_bytes(self, size_bytes: float) -> float:
        return size_bytes / self.size_chunks

    def runtime_divides(self, size_bytes: float) -> bool:
        """Would an MSCCL runtime run a program of this chunking on a SIZE buffer (:func:`runtime_divides`)?"""
        return runtime_divides(self.size_chunks, size_bytes)

    @property
    def busbw_factor(self) -> float:
        n = self.num_ranks
        if self.name == _K.ALLREDUCE:
            return 2 * (n - 1) / n
        if self.name in (_K.ALLGATHER, _K.REDUCESCATTER, _K.ALLTOALL):
            return (n - 1) / n
        return 1.0

    def contribution(self, origin: int, slot: int) -> int:
        return origin * self.input_chunks + slot

    def split_contribution(self, contribution):
        """(origin rank, input slot) of a contribution id; elementwise on arrays."""
        return divmod(contribution, self.input_chunks)

    # ---- aliasing for in-place programs ----------------------------------------------------
    def alias(self, rank: int, buffer: str) -> tuple[str, int] | None:
        """Where ``buffer`` of ``rank`` lives when the program is in place: (target buffer, base offset).
        The smaller buffer is the rank's piece of the N-piece one; equal sizes share one buffer (``o`` is ``i``)."""
        if not self.inplace:
            return None
        shape = self.shape
        if shape.gathers and not shape.scatters:
            return ("o", rank * self.chunk_factor) if buffer == "i" else None
        if shape.scatters and not shape.gathers:
            return ("i", rank * self.chunk_factor) if buffer == "o" else None
        return ("i", 0) if buffer == "o" else None

    # ---- pre/postconditions ----------------------------------------------------------------
    @cached_property
    def precondition(self) -> dict[tuple[int, int], int]:
        """(rank, input slot) -> contribution it holds at start. Rooted collectives with a single
        source only count the root's input (others' inputs are unused but harmless)."""
        return {(r, s): self.contribution(r, s) for r in self.source_ranks for s in range(self.input_chunks)}

    @property
    def source_ranks(self) -> tuple[int, ...]:
        """The ranks whose whole input the precondition counts: rank r holds contribution (r, s) in input slot s
        (the root alone for broadcast and scatter)."""
        return (self.root,) if self.shape.from_root else tuple(range(self.num_ranks))

    @cached_property
    def postcondition(self) -> dict[tuple[int, int], frozenset[int]]:
        """(rank, output slot) -> the exact set of contributions that slot must hold at the end.

        Spelled out per collective, slot by slot, and kept as the test oracle of the vectorised queries
        below (which derive from :class:`Shape`); it builds O(N²·C) sets, so nothing else uses it."""
        n, c, root = self.num_ranks, self.chunk_factor, self.root
        contrib = self.contribution
        post: dict[tuple[int, int], frozenset[int]] = {}
        if self.name == _K.ALLGATHER:
            for r in range(n):
                for q in range(n):
                    for k in range(c):
                        post[(r, q * c + k)] = frozenset({contrib(q, k)})
        elif self.name == _K.ALLTOALL:
            for r in range(n):
                for q in range(n):
                    for k in range(c):
                        post[(r, q * c + k)] = frozenset({contrib(q, r * c + k)})
        elif self.name == _K.BROADCAST:
            for r in range(n):
                for k in range(c):
                    post[(r, k)] = frozenset({contrib(root, k)})
        elif self.name == _K.GATHER:
            for q in range(n):
                for k in range(c):
                    post[(root, q * c + k)] = frozenset({contrib(q, k)})
        elif self.name == _K.SCATTER:
            for r in range(n):
                for k in range(c):
                    post[(r, k)] = frozenset({contrib(root, r * c + k)})
        elif self.name == _K.ALLREDUCE:
            for r in range(n):
                for k in range(c):
                    post[(r, k)] = frozenset(contrib(q, k) for q in range(n))
        elif self.name == _K.REDUCE:
            for k in range(c):
                post[(root, k)] = frozenset(contrib(q, k) for q in range(n))
        elif self.name == _K.REDUCESCATTER:
            for r in range(n):
                for k in range(c):
                    post[(r, k)] = frozenset(contrib(q, r * c + k) for q in range(n))
        return post

    # ---- schedule-level chunks, vectorised ---------------------------------------------------
    @property
    def chunk_space(self) -> int:
        """Size of the schedule-chunk id space: the ids are a subset of ``range(chunk_space)``."""
        return self.input_chunks if self.is_reduction else self.num_ranks * self.input_chunks

    def is_schedule_chunk(self, chunk: np.ndarray) -> np.ndarray:
        """Mask of the ids in :attr:`schedule_chunks`: every input slot of a reduction, every contribution
        of a source rank for a copy collective (each is wanted somewhere)."""
        chunk = np.asarray(chunk, dtype=np.int64)
        ok = (chunk >= 0) & (chunk < self.chunk_space)
        if self.shape.from_root:
            ok &= chunk // self.input_chunks == self.root
        return ok

    @cached_property
    def schedule_chunks(self) -> tuple[int, ...]:
        """The chunk ids a Schedule moves (see module docstring)."""
        return tuple(self._chunk_ids().tolist())

    def _chunk_ids(self) -> np.ndarray:
        return np.flatnonzero(self.is_schedule_chunk(np.arange(self.chunk_space)))

    def chunk_origin(self, chunk: np.ndarray) -> np.ndarray:
        """The rank whose input holds ``chunk`` at the start; :data:`ALL_ORIGINS` for a reduction's chunk,
        which every rank holds a part of."""
        chunk = np.asarray(chunk, dtype=np.int64)
        if self.is_reduction:
            return np.full(chunk.shape, ALL_ORIGINS, dtype=np.int64)
        return chunk // self.input_chunks

    def chunk_input_slot(self, chunk: np.ndarray) -> np.ndarray:
        """The input slot ``chunk`` starts in (on its origin, or on every rank for a reduction)."""
        chunk = np.asarray(chunk, dtype=np.int64)
        return chunk if self.is_reduction else chunk % self.input_chunks

    def initial_chunk(self, rank: np.ndarray, input_slot: np.ndarray) -> np.ndarray:
        """The precondition as schedule chunks: the chunk input slot ``input_slot`` of ``rank`` holds at
        the start, -1 where it holds none (a slot out of range, or a rank that is no source)."""
        rank = np.asarray(rank, dtype=np.int64)
        input_slot = np.asarray(input_slot, dtype=np.int64)
        held = (input_slot >= 0) & (input_slot < self.input_chunks)
        if self.shape.from_root:
            held &= rank == self.root
        chunk = input_slot if self.is_reduction else rank * self.input_chunks + input_slot
        return np.where(held, chunk, -1)

    def destination_slot(self, rank: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """Output slot where ``chunk``'s final value must be on ``rank`` (-1: nowhere), for arrays of
        (rank, schedule chunk). Input slot s is piece s // C, part s % C, when the input ``scatters`` (the
        piece names the rank it is for), else part s; the output slot is part k of the origin's piece
        when the output ``gathers``, else k."""
        c = self.chunk_factor
        rank = np.asarray(rank, dtype=np.int64)
        chunk = np.asarray(chunk, dtype=np.int64)
        shape = self.shape
        wanted = np.ones(np.broadcast_shapes(rank.shape, chunk.shape), dtype=bool)
        part = self.chunk_input_slot(chunk)
        if shape.scatters:
            piece, part = np.divmod(part, c)
            wanted &= piece == rank
        if shape.to_root:
            wanted &= rank == self.root
        slot = self.chunk_origin(chunk) * c + part if shape.gathers else part
        return np.where(wanted, slot, -1)

    def destinations(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every (chunk, rank, output slot) of the postcondition, ordered by chunk then rank."""
        chunks = self._chunk_ids()
        n, shape = self.num_ranks, self.shape
        if shape.to_root:
            ranks = np.full(len(chunks), self.root, dtype=np.int64)
        elif shape.scatters:    # the piece of the input slot names its one destination
            ranks = self.chunk_input_slot(chunks) // self.chunk_factor
        else:
            chunks, ranks = np.repeat(chunks, n), np.tile(np.arange(n), len(chunks))
        return chunks, ranks, self.destination_slot(ranks, chunks)

    def postcondition_arrays(self) -> Postcondition:
        """:attr:`postcondition` as arrays (:class:`Postcondition`), from :meth:`destinations`."""
        chunks, ranks, slots = self.destinations()
        order = np.lexsort((slots, ranks))
        chunks = chunks[order]
        return Postcondition(ranks[order], slots[order], self.chunk_input_slot(chunks), self.chunk_origin(chunks))

    def chunk_sources(self, chunk: int) -> tuple[int, ...]:
        """Ranks that hold (a part of) ``chunk`` at the start."""
        if self.is_reduction:
            return tuple(range(self.num_ranks))
        return (int(self.chunk_origin(chunk)),)

    def chunk_destinations(self, chunk: int) -> dict[int, int]:
        """rank -> output slot where the final value of ``chunk`` must end up."""
        return dict(self._destinations.get(chunk, {}))

    @cached_property
    def _destinations(self) -> dict[int, dict[int, int]]:
        """:meth:`chunk_destinations` for every chunk, from one pass over :meth:`destinations`."""
        out: dict[int, dict[int, int]] = defaultdict(dict)
        for chunk, rank, slot in zip(*(a.tolist() for a in self.destinations()), strict=True):
            out[chunk][rank] = slot
        return dict(out)

    def reversed_pair(self) -> CollectiveKind | None:
        """The collective whose schedule, reversed in time and direction, implements this one."""
        return _REVERSED.get(self.name)


_REVERSED = {_K.REDUCESCATTER: _K.ALLGATHER, _K.REDUCE: _K.BROADCAST, _K.GATHER: _K.SCATTER,
             _K.ALLGATHER: _K.REDUCESCATTER, _K.BROADCAST: _K.REDUCE, _K.SCATTER: _K.GATHER}

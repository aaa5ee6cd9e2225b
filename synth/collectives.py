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
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

from synth.errors import SynthError

COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce", "gather", "scatter")
REDUCING = frozenset({"reducescatter", "allreduce", "reduce"})
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})
# MSCCL runtimes count a buffer in elements; fp32 here, so 1- and 2-byte types divide as well
RUNTIME_ELEMENT_BYTES = 4
# MSCCL `coll` attribute spellings accepted on import.
COLL_ALIASES = {"reduce_scatter": "reducescatter", "all_reduce": "allreduce", "all_gather": "allgather",
                "all_to_all": "alltoall", "alltoall": "alltoall"}


def runtime_divides(loop_chunks: int, size_bytes: float) -> bool:
    """MSCCL runtimes run a program on a buffer only when the buffer's element count is a multiple of its
    ``nchunksperloop`` (msccl-executor-nccl's algorithm selection, docs/programs.md); elements of
    :data:`RUNTIME_ELEMENT_BYTES`."""
    elements = size_bytes / RUNTIME_ELEMENT_BYTES
    return elements == int(elements) and int(elements) % loop_chunks == 0


def canonical_name(name: str) -> str:
    key = name.strip().lower()
    key = COLL_ALIASES.get(key, key)
    if key not in COLLECTIVES:
        raise SynthError(f"unknown collective {name!r}; expected one of {', '.join(COLLECTIVES)}")
    return key


@dataclass(frozen=True)
class Collective:
    """A collective on ``num_ranks`` ranks with ``chunk_factor`` (C) chunks per rank piece."""

    name: str
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
    def is_reduction(self) -> bool:
        return self.name in REDUCING

    @property
    def is_rooted(self) -> bool:
        return self.name in ROOTED

    @property
    def input_chunks(self) -> int:
        n, c = self.num_ranks, self.chunk_factor
        return n * c if self.name in ("reducescatter", "alltoall", "scatter") else c

    @property
    def output_chunks(self) -> int:
        n, c = self.num_ranks, self.chunk_factor
        return n * c if self.name in ("allgather", "alltoall", "gather") else c

    @property
    def size_chunks(self) -> int:
        """How many chunks the SIZE (docs/units.md) covers (the nccl-tests buffer convention)."""
        n, c = self.num_ranks, self.chunk_factor
        if self.name in ("allgather", "reducescatter", "alltoall", "gather", "scatter"):
            return n * c
        return c

    @property
    def min_transfers(self) -> int:
        """The fewest chunk transfers any schedule of this chunking needs: every chunk a rank must end with and
        does not start with arrives by at least one transfer; an allreduce chunk needs 2(N-1) (one-way gossip,
        Harary & Schwenk 1974, as in :func:`synth.lower_bounds.allreduce_bandwidth_us`)."""
        n, c = self.num_ranks, self.chunk_factor
        if self.name in ("allgather", "reducescatter", "alltoall"):
            return n * (n - 1) * c
        if self.name == "allreduce":
            return 2 * (n - 1) * c
        return (n - 1) * c

    def chunk_bytes(self, size_bytes: float) -> float:
        return size_bytes / self.size_chunks

    def runtime_divides(self, size_bytes: float) -> bool:
        """Would an MSCCL runtime run a program of this chunking on a SIZE buffer (:func:`runtime_divides`)?"""
        return runtime_divides(self.size_chunks, size_bytes)

    @property
    def busbw_factor(self) -> float:
        n = self.num_ranks
        if self.name == "allreduce":
            return 2 * (n - 1) / n
        if self.name in ("allgather", "reducescatter", "alltoall"):
            return (n - 1) / n
        return 1.0

    def contribution(self, origin: int, slot: int) -> int:
        return origin * self.input_chunks + slot

    def split_contribution(self, contribution: int) -> tuple[int, int]:
        return divmod(contribution, self.input_chunks)

    # ---- aliasing for in-place programs ----------------------------------------------------
    def alias(self, rank: int, buffer: str) -> tuple[str, int] | None:
        """Where ``buffer`` of ``rank`` lives when the program is in place: (target buffer, base offset)."""
        if not self.inplace:
            return None
        c = self.chunk_factor
        if self.name in ("allgather", "gather") and buffer == "i":
            return ("o", rank * c)
        if self.name in ("reducescatter", "scatter") and buffer == "o":
            return ("i", rank * c)
        if self.name in ("allreduce", "alltoall", "broadcast", "reduce") and buffer == "o":
            return ("i", 0)
        return None

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
        return (self.root,) if self.name in ("broadcast", "scatter") else tuple(range(self.num_ranks))

    @cached_property
    def postcondition(self) -> dict[tuple[int, int], frozenset[int]]:
        """(rank, output slot) -> the exact set of contributions that slot must hold at the end."""
        n, c, root = self.num_ranks, self.chunk_factor, self.root
        contrib = self.contribution
        post: dict[tuple[int, int], frozenset[int]] = {}
        if self.name == "allgather":
            for r in range(n):
                for q in range(n):
                    for k in range(c):
                        post[(r, q * c + k)] = frozenset({contrib(q, k)})
        elif self.name == "alltoall":
            for r in range(n):
                for q in range(n):
                    for k in range(c):
                        post[(r, q * c + k)] = frozenset({contrib(q, r * c + k)})
        elif self.name == "broadcast":
            for r in range(n):
                for k in range(c):
                    post[(r, k)] = frozenset({contrib(root, k)})
        elif self.name == "gather":
            for q in range(n):
                for k in range(c):
                    post[(root, q * c + k)] = frozenset({contrib(q, k)})
        elif self.name == "scatter":
            for r in range(n):
                for k in range(c):
                    post[(r, k)] = frozenset({contrib(root, r * c + k)})
        elif self.name == "allreduce":
            for r in range(n):
                for k in range(c):
                    post[(r, k)] = frozenset(contrib(q, k) for q in range(n))
        elif self.name == "reduce":
            for k in range(c):
                post[(root, k)] = frozenset(contrib(q, k) for q in range(n))
        elif self.name == "reducescatter":
            for r in range(n):
                for k in range(c):
                    post[(r, k)] = frozenset(contrib(q, r * c + k) for q in range(n))
        return post

    # ---- schedule-level chunks -------------------------------------------------------------
    @cached_property
    def schedule_chunks(self) -> tuple[int, ...]:
        """The chunk ids a Schedule moves (see module docstring)."""
        if self.is_reduction:
            return tuple(range(self.input_chunks))
        return tuple(sorted(set(self.precondition.values()) & self._needed_contributions))

    @cached_property
    def _needed_contributions(self) -> frozenset[int]:
        return frozenset(x for s in self.postcondition.values() for x in s)

    def chunk_sources(self, chunk: int) -> tuple[int, ...]:
        """Ranks that hold (a part of) ``chunk`` at the start."""
        if self.is_reduction:
            return tuple(range(self.num_ranks))
        return (self.split_contribution(chunk)[0],)

    def chunk_destinations(self, chunk: int) -> dict[int, int]:
        """rank -> output slot where the final value of ``chunk`` must end up."""
        return dict(self._destinations.get(chunk, {}))

    @cached_property
    def _destinations(self) -> dict[int, dict[int, int]]:
        """:meth:`chunk_destinations` for every chunk, from one pass over the postcondition (asking
        chunk by chunk walked it once per chunk: 6 minutes for a 256-rank alltoall)."""
        out: dict[int, dict[int, int]] = defaultdict(dict)
        for (r, slot), contribs in self.postcondition.items():
            if self.is_reduction:
                out[self.split_contribution(next(iter(contribs)))[1]][r] = slot
            else:
                for chunk in contribs:
                    out[chunk][r] = slot
        return dict(out)

    def reversed_pair(self) -> str | None:
        """The collective whose schedule, reversed in time and direction, implements this one."""
        return {"reducescatter": "allgather", "reduce": "broadcast", "gather": "scatter",
                "allgather": "reducescatter", "broadcast": "reduce", "scatter": "gather"}.get(self.name)

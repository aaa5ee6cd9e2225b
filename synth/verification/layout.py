"""Verification pass 1, the memory layout: each rank's physical buffers and the views (``i``, ``o``, ``s``)
steps address, in-place aliasing mapping one buffer onto a window of the other."""

from __future__ import annotations

from dataclasses import dataclass

from synth.collectives import Collective
from synth.program.ir import Program


@dataclass(frozen=True)
class Layout:
    """Per rank, buffer name -> (physical slots, last writer per slot, base, chunks in the view).

    The slot lists are the symbolic memory: :func:`~synth.verification.conditions.fill_inputs` fills the
    inputs, :func:`~synth.verification.execution.execute` runs the steps on them and the postcondition
    reads the outputs (the one state the passes share, as a machine's memory is)."""

    views: tuple[dict, ...]
    aliased: frozenset[tuple[int, str]]   # (rank, buffer) views that alias the other buffer
    phys_names: dict[int, str]            # id(physical slot list) -> its buffer name, for race messages


def layout(program: Program, coll: Collective) -> Layout:
    """Physical buffers per rank; in-place aliasing maps one buffer onto a window of the other."""
    views_per_rank: list[dict] = []
    aliased: set[tuple[int, str]] = set()
    phys_names: dict[int, str] = {}
    for gpu in program.gpus:
        declared = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}
        views, needed = rank_views(coll, gpu.id, declared, aliased)
        phys = {b: [None] * needed[b] for b in ("i", "o", "s")}
        for b, arr in phys.items():
            phys_names[id(arr)] = b
        writers = {b: [None] * needed[b] for b in phys}
        views_per_rank.append({buf: (phys[t], writers[t], base, limit) for buf, (t, base, limit) in views.items()})
    return Layout(tuple(views_per_rank), frozenset(aliased), phys_names)


def rank_views(coll: Collective, r: int, declared: dict[str, int],
               aliased: set[tuple[int, str]]) -> tuple[dict, dict[str, int]]:
    """Rank ``r``'s buffer views (physical buffer, base, chunks) and the physical buffers' sizes; the aliased
    views are added to ``aliased``."""
    c = coll
    needed = {"i": max(declared["i"], c.input_chunks), "o": max(declared["o"], c.output_chunks),
              "s": declared["s"]}
    views = {}
    for buf in ("i", "o", "s"):
        alias = c.alias(r, buf) if buf != "s" else None
        if alias is None:
            views[buf] = (buf, 0, declared[buf])
        else:
            target, base = alias
            aliased.add((r, buf))
            window = c.input_chunks if buf == "i" else c.output_chunks
            views[buf] = (target, base, window)
            needed[target] = max(needed[target], base + window)
    return views, needed

"""Message shapes and chunk counts of method trees: how a root's chunks split over its trees and
into messages (plain, tailed, halving), the chunk counts MSCCL runtimes run, and MSCCL step limits.
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict
from dataclasses import replace
from fractions import Fraction

import numpy as np

from synth.collectives import Collective
from synth.errors import SynthError
from synth.synthesis.base import MAX_CHANNELS, MAX_STEP_CHUNKS, MAX_STEPS_PER_TB, SynthOptions
from synth.synthesis.trees import tuning
from synth.synthesis.trees.forest import Forest
from synth.synthesis.trees.tuning import HALVING


# ---------------------------------------------------------------------------------------------
# chunk counts: the cost model
# ---------------------------------------------------------------------------------------------
def any_chunks(chunks: int) -> list[int]:
    """The ``fit`` of ``--any-chunks``: every count is fine."""
    return [chunks]


def split_chunks(forest: Forest, root: int, count: int) -> list[int]:
    """Chunks per distinct tree of ``root`` when every root of ``forest`` has ``count`` chunks per unit of
    weight (:func:`balanced_split`; others' trees 0)."""
    key = (id(forest), count)
    if key not in _SPLITS or _SPLITS[key][0]() is not forest:
        if len(_SPLITS) > 64:
            _SPLITS.clear()
        _SPLITS[key] = (weakref.ref(forest), balanced_split(forest, count))
    return [c if t.root == root else 0 for t, c in zip(forest.trees, _SPLITS[key][1])]


# by identity (hashing a forest walks it), and weakly: a 2048-rank torus forest holds 4 million edges, which
# must not outlive its synthesis
_SPLITS: dict[tuple[int, int], tuple[weakref.ref, tuple[int, ...]]] = {}


def balanced_split(forest: Forest, count: int) -> tuple[int, ...]:
    """Chunks per distinct tree, every root's ``count`` shared in proportion to multiplicity: a tree
    of multiplicity ``m`` gets ``⌊count·m/k⌋`` or one more. Who gets one more is chosen root by root
    so that the links stay level (greedy, least-loaded tree first, then the larger remainder)
    rather than by remainder alone, which would hand the extra chunk of every root to trees
    crossing the same links (dgx1 at 8 chunks per root, 6 trees each). With root weights
    (:attr:`Forest.weights`) ``count`` is per unit of weight: root ``r`` shares ``count·w_r`` over its ``k·w_r``
    trees."""
    shares = [Fraction(count * t.mult, forest.k) for t in forest.trees]
    counts = [math.floor(x) for x in shares]
    if counts == shares:
        return tuple(counts)
    links = [{(a, b) for (parent, child), routes in zip(t.edges, t.routes)
              for nodes in [(parent, *routes[0][0], child)] for a, b in zip(nodes, nodes[1:])}
             for t in forest.trees]
    load: dict[tuple[int, int], int] = defaultdict(int)
    for t, c in enumerate(counts):
        for link in links[t]:
            load[link] += c
    by_root: dict[int, list[int]] = defaultdict(list)
    for t, tree in enumerate(forest.trees):
        by_root[tree.root].append(t)
    for root in sorted(by_root):
        trees = [t for t in by_root[root] if shares[t] > counts[t]]
        for _ in range(count * forest.weight(root) - sum(counts[t] for t in by_root[root])):
            pick = min(trees, key=lambda t: (max(load[link] for link in links[t]), counts[t] - shares[t], t))
            trees.remove(pick)
            counts[pick] += 1
            for link in links[pick]:
                load[link] += 1
    return tuple(counts)


def pair_loads(plans: list[Forest], messages: list[list[int]]) -> dict[tuple[int, int], int]:
    """Messages per directed rank pair, all phases together, when every edge of tree ``t`` of
    ``plans[f]`` carries ``messages[f][t]`` (a reduction's edges run child -> parent)."""
    load: dict[tuple[int, int], int] = defaultdict(int)
    for forest, counts in zip(plans, messages):
        for tree, count in zip(forest.trees, counts):
            for parent, child in tree.edges:
                load[(child, parent) if forest.reversed else (parent, child)] += count
    return load


def busiest_pair_load(plans: list[Forest], messages: list[list[int]]) -> int:
    """Most messages one directed rank pair carries (:func:`pair_loads`)."""
    return max(pair_loads(plans, messages).values(), default=0)


def xml_nodes(plans: list[Forest], messages: list[list[int]]) -> float:
    """XML nodes of the busiest rank when tree ``t`` of ``plans[f]`` sends ``messages[f][t]`` per edge
    (:func:`busiest_rank_xml` of :func:`pair_loads`)."""
    return busiest_rank_xml(pair_loads(plans, messages), plans[0].num_ranks)


def busiest_rank_xml(steps: dict[tuple, int], n: int) -> float:
    """XML nodes of the busiest of ``n`` ranks, with ``steps`` keyed by (sender, receiver, ...): a step per
    message sent or received, × ``TUNING.step_margin`` for nops, plus the algo, gpu and (at most
    ``4 · MAX_CHANNELS``) threadblock nodes."""
    per_rank: dict[int, int] = defaultdict(int)
    for (src, dst, *_), count in steps.items():
        per_rank[src] += count
        per_rank[dst] += count
    return max(per_rank.values(), default=0) * tuning.TUNING.step_margin + 1 + n + 4 * MAX_CHANNELS


def refit_messages(messages: int | None, chunks: int, shape_chunks: int, tail: int) -> int | None:
    """Messages per tree at ``chunks`` per root for a plain shape of ``shape_chunks`` (:func:`runtime_chunks`):
    as many more or fewer as keep each message the shape's number of chunks (uneven messages pipeline
    worse: dgx1 broadcast at 512 for 432 chunks per root, 72 messages per tree 0.912, 85 messages 0.938).
    Tailed and halving shapes keep their count (their last messages are cut anyway; dgx-a100-4node
    allgather 0.976 kept, 0.974 refitted)."""
    if messages is None or tail != 0 or chunks == shape_chunks:
        return messages
    return max(1, round(messages * chunks / shape_chunks))


def shape_chunk_count(k: int, p: int, tail: int) -> int:
    """Chunks per root of a message shape (see :func:`refine_depth`)."""
    return k * p if tail == HALVING else k * p * 2 ** tail


def tree_messages(plans: list[Forest], chunks: int, messages: int | None, tail: int = 0) -> list[list[int]]:
    """Messages per tree edge, per forest and tree, with ``chunks`` per root and ``messages`` per tree
    (or one chunk per message; ``tail``: :func:`message_shapes`); a tree of multiplicity ``m`` carries
    ``chunks · m / k`` chunks."""
    return [[_message_count(max(1, -(-chunks * t.mult // f.k)), messages, tail) for t in f.trees] for f in plans]


def job_estimate(plans: list[Forest], chunks: int, messages: int | None, tail: int = 0) -> int:
    """Transfers of a schedule (:func:`tree_messages` on every tree edge)."""
    return sum(len(t.edges) * m for f, counts in zip(plans, tree_messages(plans, chunks, messages, tail))
               for t, m in zip(f.trees, counts))


def _message_count(tree_chunks: int, parts: int | None, tail: int) -> int:
    """How many messages :func:`message_shapes` cuts a tree's ``tree_chunks`` chunks into (at most)."""
    if tail == HALVING:
        return len(message_shapes(list(range(tree_chunks)), None, HALVING))
    return parts + max(tail, 0) if parts else tree_chunks


def owner_units(plans: list[Forest]) -> int | None:
    """Units of ownership of an allreduce's weighted forests (:attr:`Forest.weights`), None for one per rank."""
    weights = plans[0].weights if plans else None
    return None if weights is None else sum(weights)


def root_piece_bytes(name: str, n: int, size_bytes: float, owners: int | None = None) -> float:
    """Bytes each tree root broadcasts / collects (docs/units.md); with ``owners`` units of allreduce
    ownership (:func:`owner_units`), bytes per unit."""
    if name == "allreduce" and owners is not None:
        return size_bytes / owners
    if name in ("allgather", "reducescatter", "allreduce"):
        return size_bytes / n
    if name in ("scatter", "gather"):
        return size_bytes * (n - 1) / n   # their trees carry the N-1 pieces of the other ranks
    if name == "alltoall":
        return size_bytes / n   # the alltoall flow's unit: one rank's piece for one peer (plan_alltoall_paths)
    return size_bytes


def loop_chunk_factor(name: str, n: int, chunks: int, owners: int | None = None) -> int:
    """Collective chunk factor from chunks per root piece (per unit of ``owners``, :func:`owner_units`)."""
    if name == "allreduce":
        return (owners or n) * chunks
    return chunks


def runtime_chunks(collective: Collective, size_bytes: float, upper: int = 2 * tuning.TUNING.max_tail_chunks,
                   owners: int | None = None):
    """``fit(C)``: the chunk counts per root piece near ``C`` at which an MSCCL runtime runs the program
    on the SIZE buffer (:meth:`Collective.runtime_divides`; the runtime silently runs its own algorithm
    otherwise: dgx-a100-2node 1 GiB allgather, 39 chunks per root, 624 per loop), nearest first
    (log scale, within a factor 2); ``[C]`` where there is none."""
    name, n = collective.name, collective.num_ranks
    usable = [c for c in range(1, upper + 1)
              if replace(collective, chunk_factor=loop_chunk_factor(name, n, c, owners)).runtime_divides(size_bytes)]

    def fit(chunks: int) -> list[int]:
        near = sorted((c for c in usable if chunks <= 2 * c and c <= 2 * chunks),
                      key=lambda c: (abs(math.log(c / chunks)), c))
        return near or [chunks]
    return fit


def chunk_fit(collective: Collective, size_bytes: float, options: SynthOptions, owners: int | None = None):
    """The ``fit`` the options ask for: ``--chunks C`` (every count becomes ``C``), :func:`runtime_chunks`,
    or any count (``--any-chunks``); ``owners``: :func:`owner_units` of the forests."""
    if options.chunks is not None:
        return lambda _chunks: [options.chunks]
    return runtime_chunks(collective, size_bytes, owners=owners) if options.runtime_chunks else any_chunks


def requested_messages(plans: list[Forest], chunks: int, messages: int, limit: int) -> int:
    """At most ``messages`` per tree at ``chunks`` per root, as many as MSCCL's ``limit`` steps per
    connection allow (messages of up to ``MAX_STEP_CHUNKS`` chunks); a ``--chunks`` error where none do."""
    fewest = [[-(-c // MAX_STEP_CHUNKS) for c in counts] for counts in tree_messages(plans, chunks, None)]
    steps = busiest_pair_load(plans, fewest)
    if steps > limit:
        raise SynthError(f"--chunks {chunks} needs {steps} steps on one connection even with MSCCL's largest "
                         f"steps ({MAX_STEP_CHUNKS} chunks), more than its {MAX_CHANNELS} channels x "
                         f"{MAX_STEPS_PER_TB} steps; use fewer --chunks")
    while messages > 1 and busiest_pair_load(plans, tree_messages(plans, chunks, messages)) > limit:
        messages = max(1, messages * 3 // 4)
    return messages


def message_shapes(chunk_ids: list[int], parts: int | None, tail: int = 0) -> list[tuple[int, ...]]:
    """``chunk_ids`` cut into ``parts`` equal messages (None: one chunk each), the last of them then
    halved ``tail`` times (sizes ..., g, g/2, g/4, ..., 1, 1 chunks). Large messages keep α low
    mid-pipeline; a geometric tail shortens the drain, where the last message crosses every level of
    the tree (the classic pipelined-broadcast trade-off, Träff & Ripke, "Optimal broadcast for fully
    connected processor-node networks", JPDC 2008, with message sizes that shrink at the end).

    ``tail == HALVING``: every message takes half of the chunks left (at most one MSCCL step), so
    sizes shrink geometrically over the whole pipeline, ``parts`` aside: few messages (α) and a
    one-chunk drain. Where every link is a bottleneck (mi250-2node) this beats equal messages."""
    if tail == HALVING:
        shape, pos = [], 0
        while pos < len(chunk_ids):
            left = len(chunk_ids) - pos
            take = 1 if left <= 2 else min(MAX_STEP_CHUNKS, (left + 1) // 2)
            shape.append(tuple(int(c) for c in chunk_ids[pos:pos + take]))
            pos += take
        return shape
    if parts is None:
        return [(c,) for c in chunk_ids]
    body = [tuple(part.tolist()) for part in np.array_split(np.array(chunk_ids), min(parts, len(chunk_ids)))]
    last = body.pop()
    for _ in range(tail):
        if len(last) < 2:
            break
        half = len(last) // 2
        body.append(last[:half])
        last = last[half:]
    body.append(last)
    return body

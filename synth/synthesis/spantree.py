"""``spantree``: allreduce as a pipelined reduction and broadcast over a rate-optimal packing of spanning trees.

Each spanning tree ``T`` of :func:`synth.treepack.pack_spanning_trees` (weight ``x_T`` GB/s) takes a share of
the buffer's chunks in proportion to ``x_T``. A chunk is reduced up ``T`` toward the tree's centre (a rank
sends once it has the sums of all its children) and the full sum is broadcast back down the same edges:
every edge of ``T`` carries the chunk once each way, so the packing moves ``SIZE`` in
``SIZE / Σ_T x_T`` plus the pipeline's fill and drain (Blink, Wang et al., MLSys 2020, §3, packs spanning
trees for the same reason). ``Σ_T x_T`` is the fabric's strength (Tutte / Nash-Williams), and the allreduce
traffic bound on the packing's partition (:func:`synth.lower_bounds.group_traffic`) is exactly
``SIZE / Σ_T x_T``: the method's bandwidth term is the bound's, on meshes and irregular graphs where
reduce-scatter + allgather cannot reach it (its equal shares cost 2·(N-1)/N·SIZE per rank regardless of
degree: 0.67 of the bound on an 8x8 mesh).

A tree's chunks travel in messages (one MSCCL step each) of :func:`message_sizes`: as small as MSCCL's
4096 XML nodes per rank allow (:func:`message_size_for`), since the pipeline's fill and drain grow with the
message and the tree's height, with a half-size first and last message. The messages go through
:func:`synth.synthesis.timing.list_schedule` (oldest data first on every link, then the longest path still
ahead) and the result is compacted by :func:`synth.synthesis.timing.justify`. One more trial sends a chunk per
message and lets a backlogged link merge what is queued for it (``coalesce``), which keeps the fill's messages
small without a fixed size; where it fits it wins on some irregular graphs. The chunk counts tried are
runtime-runnable (:func:`synth.synthesis.trees.messages.runtime_chunks`); the fastest timing is kept.
Switchless fabrics only: behind a switch a tree edge would share links with others that the packing does
not see.

The trees' streams start in step: the ``i``-th message of every tree has the same stage, so the links near the
leaves take all trees' first messages before any second one, and every tree's last message climbs and comes
back down at the end. The fastest trial is therefore timed twice more with the trees' streams staggered by a
fraction of one message (:func:`stagger_offsets`): the deepest trees first, whose chunks have the longest way
(critical path first, as the list schedule breaks its ties), and the shallowest first; the fastest of the three is
kept. Measured at 1 GiB: torus-4x4x8 7512.0 -> 7346.7 µs, mesh-4x4x8 10639.7 -> 10263.7, rr3-32-s1
16420.9 -> 16318.1; where the unstaggered one is faster it stays.

What remains between the program and the bound is the pipeline: every chunk climbs a tree's height and
comes back down, ``2h`` hops of a message each, against the busiest link's few hundred messages (mesh-8x8,
1 GiB: 0.914 of the bound; 16-rank tori: 0.97, where ``trees``' reduce-scatter + allgather reaches 0.998).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule, Transfer
from synth.synthesis.base import (
    MAX_CHANNELS,
    MAX_STEPS_PER_TB,
    MAX_XML_NODES,
    Instance,
    MethodSpec,
    check_deadline,
    deadline_of,
)
from synth.synthesis.timing import Jobs, connection_steps, justify, list_schedule, message_groups
from synth.synthesis.trees.messages import busiest_rank_xml, chunk_fit
from synth.topology.model import Topology
from synth.treepack import TreePacking, centred, depths, pack_spanning_trees, tree_height

SUPPORTED = frozenset({"allreduce"})
CHUNK_COUNTS = (256, 1024, 4096)   # chunk counts timed (each made runtime-runnable), each at the least message
# size; 256 where links pay several µs of α a message (tests/fixtures/alpha-heavy-24.yaml: 0.792 -> 0.857)
COALESCED_CHUNKS = 512        # ... and this one with a chunk per message, coalesced (rr4-32-s1: 0.908 against 0.896)
MAX_MESSAGE = 64              # chunks one message may carry (one MSCCL step: cnt < 72)
MAX_TRANSFERS = 600_000       # chunk transfers of a larger count than the first (lowering and verifying them)
STAGGERS = ("deepest", "shallowest")   # stream orders timed on the fastest trial (stagger_offsets)


def apportion(packing: TreePacking, chunks: int) -> list[int]:
    """Chunks per tree: ``⌊chunks · x_T / Σx⌋``, and the rest one at a time to the tree whose busiest edge
    stays the least loaded relative to its capacity (ties: the larger remainder, then the earlier tree), so
    that rounding does not pile extra chunks on shared edges."""
    weights = np.array(packing.weights)
    share = chunks * weights / weights.sum()
    counts = np.floor(share).astype(int)
    load = np.zeros(len(packing.graph.edges))
    for tree, count in zip(packing.trees, counts.tolist()):
        load[list(tree)] += count
    capacity = packing.graph.capacity
    for _ in range(chunks - int(counts.sum())):
        worst = [float(((load[list(tree)] + 1) / capacity[list(tree)]).max()) for tree in packing.trees]
        t = min(range(len(worst)), key=lambda j: (worst[j], -(share[j] - counts[j]), j))
        counts[t] += 1
        load[list(packing.trees[t])] += 1
    return counts.tolist()


def message_sizes(count: int, size: int) -> list[int]:
    """Chunks per message of a tree's ``count`` chunks: ``size`` each, but the first and the last message half
    that, so that the first data reaches the links far from the leaves, and the last leaves the links near
    them, in half a message's time (pipeline fill and drain; mesh-8x8 at the same step count: 0.88 -> 0.92
    of the bound, where further halvings cost more steps than they save)."""
    if size == 1 or count <= size:
        return [size] * (count // size) + ([count % size] if count % size else [])
    half = size // 2
    middle = count - 2 * half
    full, rest = divmod(middle, size)
    return [half] + [size] * full + ([rest] if rest else []) + [half]


def busiest_xml(packing: TreePacking, counts: list[int], size: int) -> tuple[float, int]:
    """(XML nodes of the busiest rank as :func:`busiest_rank_xml` counts them, steps of the busiest connection)
    of the messages of :func:`message_sizes`: a tree edge carries each of its tree's messages once each way."""
    n = packing.graph.num_ranks
    per_edge = np.zeros(len(packing.graph.edges))
    for tree, count in zip(packing.trees, counts, strict=True):
        per_edge[list(tree)] += len(message_sizes(count, size)) if count else 0
    ends = np.array(packing.graph.edges, dtype=np.int64)
    steps = {}
    for e, (u, v) in enumerate(ends.tolist()):
        steps[(u, v)] = steps[(v, u)] = int(per_edge[e])
    return busiest_rank_xml(steps, n), int(per_edge.max(initial=0))


def message_size_for(packing: TreePacking, counts: list[int]) -> int | None:
    """The least message size (chunks, up to MAX_MESSAGE) whose steps fit MSCCL's limits, or None."""
    for size in range(1, MAX_MESSAGE + 1):
        nodes, steps = busiest_xml(packing, counts, size)
        if nodes <= MAX_XML_NODES and steps <= MAX_CHANNELS * MAX_STEPS_PER_TB:
            return size
    return None


def stagger_offsets(packing: TreePacking, order: str) -> list[float]:
    """Per tree, the share of one of its messages by which its stream is held back: ``k / K`` for the ``k``-th
    of the ``K`` trees in ``order``, ``deepest`` (height at the centre, descending, then packing order) or
    ``shallowest`` (the reverse)."""
    heights = [tree_height(packing.graph, tree) for tree in packing.trees]
    ranked = sorted(range(len(heights)), key=lambda t: (-heights[t], t))
    if order == "shallowest":
        ranked.reverse()
    elif order != "deepest":
        raise ValueError(f"unknown stagger order {order!r}")
    offsets = [0.0] * len(heights)
    for k, t in enumerate(ranked):
        offsets[t] = k / len(heights)
    return offsets


def allreduce_jobs(packing: TreePacking, counts: list[int], size: int = 1,
                   offsets: list[float] | None = None) -> Jobs:
    """One job per chunk per tree edge and direction: up toward the root (reducing, after the chunk's sums
    from the sender's children) and back down (after the parent has the full sum). Chunks of a tree are
    contiguous; a job's key is (the chunk's place in its tree's stream, as a fraction, plus the tree's
    ``offsets`` share of one message, then the longest path still ahead of it), so every link serves the
    oldest chunks first and, among them, the deepest."""
    jobs = Jobs.empty()
    base = 0
    for t, (tree, count) in enumerate(zip(packing.trees, counts, strict=True)):
        if count == 0:
            continue
        root, order, parent = centred(packing.graph, tree)
        children: dict[int, list[int]] = defaultdict(list)
        for v in order[1:]:
            children[parent[v]].append(v)
        depth = depths(order, parent)
        height = max(depth.values())
        first = base
        messages = message_sizes(count, size)
        held = offsets[t] / len(messages) if offsets is not None else 0.0
        for sizes in messages:
            chunk = tuple(range(first, first + sizes))
            stage = (first - base) / count + held
            first += sizes
            up: dict[int, int] = {}
            for v in reversed(order[1:]):
                ahead = depth[v] - 1 + height
                up[v] = jobs.add(chunk, v, parent[v], (), True, tuple(up[c] for c in children[v]), (stage, -ahead))
            down: dict[int, int] = {}
            at_root = tuple(up[c] for c in children[root])
            for v in order[1:]:
                deps = at_root if parent[v] == root else (down[parent[v]],)
                down[v] = jobs.add(chunk, parent[v], v, (), False, deps, (stage, depth[v] - height - 1))
        base += count
    return jobs


def fits_runtime(jobs: Jobs, heads: list[int], n: int) -> bool:
    """Do the coalesced messages fit MSCCL's steps per connection and XML nodes per rank?"""
    steps = connection_steps(jobs, heads)
    return (max(steps.values(), default=0) <= MAX_CHANNELS * MAX_STEPS_PER_TB
            and busiest_rank_xml(steps, n) <= MAX_XML_NODES)


def timed_allreduce(topology: Topology, packing: TreePacking, collective: Collective, size_bytes: float,
                    counts: list[int], size: int, coalesce: bool = False,
                    offsets: list[float] | None = None) -> tuple[float, list[Transfer]] | None:
    """The list-scheduled, justified transfers of the allreduce of ``counts`` chunks per tree in messages of
    :func:`message_sizes` (makespan, transfers), or None where the messages do not fit MSCCL's limits. With
    ``coalesce``, a link also merges the contiguous messages queued for it into one step
    (:func:`synth.synthesis.timing.list_schedule`): messages grow only where a link has a backlog.
    ``offsets``: the trees' streams staggered (:func:`stagger_offsets`)."""
    jobs = allreduce_jobs(packing, counts, size, offsets)
    chunk_bytes = collective.chunk_bytes(size_bytes)
    order, start, end = list_schedule(jobs, topology, chunk_bytes, coalesce=coalesce)
    if not fits_runtime(jobs, jobs.head, topology.num_ranks):
        return None
    groups = message_groups(jobs, jobs.head)
    starts, ends = start.tolist(), end.tolist()
    transfers = [Transfer(starts[i], ends[i], chunk, jobs.src[i], jobs.dst[i], jobs.reduce[i], (), 0, groups[i])
                 for i in order for chunk in jobs.msg[i]]
    makespan = float(end.max())
    # the list schedule leaves links idle where a tree's next chunk is still climbing: repack (mesh-8x8 at
    # 512 chunks: 0.80 -> 0.87 of the bound)
    justified = justify(transfers, topology, chunk_bytes, makespan)
    return justified if justified is not None else (makespan, transfers)


def synthesize(inst: Instance) -> Schedule:
    """Allreduce over the spanning-tree packing (module docstring)."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    n = topology.num_ranks
    if collective.name not in SUPPORTED:
        raise SynthError(f"spantree does not support {collective.name}; it supports allreduce")
    packing = pack_spanning_trees(topology)
    if packing is None:
        raise SynthError(f"spantree needs a connected fabric without switches; {topology.name!r} has "
                         f"{'switches' if topology.switches else 'ranks it cannot join both ways'}")
    deadline = deadline_of(options)
    fit = chunk_fit(collective, size_bytes, options)
    wanted = [options.chunks] if options.chunks is not None else CHUNK_COUNTS
    best: tuple[float, list[Transfer], Collective] | None = None
    fastest: tuple[list[int], int, bool] | None = None     # the best trial's counts, message size, coalesce
    # (chunks, coalesce): one chunk per message merged where links have a backlog, then fixed message sizes
    trials = ([(fit(COALESCED_CHUNKS)[0], True)] if options.chunks is None else []) + [
        (fit(c)[0], False) for c in wanted]
    for chunks, coalesce in dict.fromkeys(trials):
        if chunks * 2 * (n - 1) > MAX_TRANSFERS and best is not None:
            break
        counts = apportion(packing, chunks)
        size = 1 if coalesce else message_size_for(packing, counts)
        if size is None:
            continue
        check_deadline(deadline, "spantree", "timing the tree allreduce")
        coll = Collective("allreduce", n, chunks, inplace=collective.inplace)
        timed = timed_allreduce(topology, packing, coll, size_bytes, counts, size, coalesce)
        if timed is not None and (best is None or timed[0] < best[0] * (1 - 1e-9)):
            best, fastest = (*timed, coll), (counts, size, coalesce)
    if best is None or fastest is None:
        raise SynthError(f"spantree: no chunk count fits MSCCL's limits on {topology.name!r}")
    stagger = None
    for order in STAGGERS if len(packing.trees) > 1 else ():
        check_deadline(deadline, "spantree", "timing the staggered tree allreduce")
        counts, size, coalesce = fastest
        timed = timed_allreduce(topology, packing, best[2], size_bytes, counts, size, coalesce,
                                stagger_offsets(packing, order))
        if timed is not None and timed[0] < best[0] * (1 - 1e-9):
            best, stagger = (*timed, best[2]), order
    makespan, transfers, coll = best
    return Schedule(coll, topology.name, tuple(transfers), method="spantree", size_bytes=float(size_bytes),
                    predicted_time_us=makespan,
                    notes={"trees": len(packing.trees), "tree_rate_GBps": round(packing.rate, 6),
                           "packing_optimal": packing.optimal, "stagger": stagger})


METHOD = MethodSpec(
    name="spantree",
    run=synthesize,
    collectives=SUPPORTED,
    description="allreduce: pipelined reduce + broadcast over a rate-optimal spanning-tree packing (switchless)",
)

__all__ = ["METHOD", "apportion", "allreduce_jobs", "stagger_offsets", "synthesize", "timed_allreduce"]

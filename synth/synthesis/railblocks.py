"""``railblocks``: allgather, reducescatter and allreduce on boxes joined by NIC rails, with one network message
per contiguous block of a box's pieces.

Boxes are read from the graph (:func:`synth.topology.structure.aligned_boxes`): equal boxes whose ranks reach
each other inside the box (a crossbar such as NVSwitch: no route between two ranks of a box leaves it), and
rails: rank ``g`` of every box reaches rank ``g`` of every other box by a switch-only route (its NIC). On such a
fabric the network term of an allgather is every box receiving the other ``K − 1`` boxes' pieces through its
``G`` NICs. A tree per rank sends each piece as its own network message: with 128 DGX A100 boxes a NIC then
carries 127 messages, each paying the IB route's α (4 µs) against 42 µs of bytes (1 GiB), which is where the
trees' 0.908 of the bound at 1024 ranks goes. Pieces of consecutive ranks are contiguous in the buffer (docs/
programs.md), so a box's pieces can cross the network together:

- **Inside the source box** every rank sends its piece to every other rank of its box (one message each).
- **On the rails** box ``b`` sends its ``G`` pieces to box ``b + d`` (``d = 1 .. K − 1``). The ``(K − 1)·G``
  items ``(d, j)`` (piece of position ``j`` for box ``b + d``), in order of ``d`` then ``j``, are cut into ``G``
  runs of ``K − 1`` consecutive items, run ``g`` on rail ``g``: every NIC sends and receives ``K − 1`` pieces
  (the network cut's share), in one message per destination box its run touches, about ``(K − 1)/G + 1``
  messages instead of ``K − 1``. Every box uses the same pattern shifted by its index, so at each step the
  rails' senders reach distinct receivers.
- **Inside the destination box** the rail's receiver forwards each message to the other ranks of its box.

A reducescatter runs the same moves backwards: the ranks of box ``b + d`` send their contributions to the
pieces of box ``b`` to the rail holder, which sums them and sends one partial sum per run over its rail; the
source-side holder adds the partial sums that reached it to its own contribution and sends each piece's sum
to the piece's rank. An allreduce is that reducescatter followed by the allgather of the reduced pieces
(Patarasuk & Yuan's two phases, each a piece's moves depending on its sum being complete).

Messages: a rail message is cut to about ``α / ALPHA_SHARE`` of bytes time on its route (so α is about 2.5 %
of it) from pieces in about ``MESSAGE_CHUNKS`` chunks, so a receiver starts forwarding after part of a block,
and each rail's last message is halved ``TAIL`` times, so the last forwards inside the box are short
(the shrinking tail of a pipelined broadcast, Träff & Ripke, JPDC 2008). Inside a box the holders forward in a
rotated order (holder ``g`` to ``g + 1, g + 2, …``), so at a time they reach distinct ranks.

Time (α-β, docs/cost-model.md): a NIC moves ``(K − 1)`` pieces, so the network term is the bound's box cut,
plus the route α of its messages, plus the box's own first exchange and last forward. The pipeline simulates
the program; ``synth bounds`` gives the ratio. 1 GiB on DGX A100 boxes (25 GB/s NICs, IB α 2 µs a hop):
17 boxes allgather / reducescatter / allreduce 0.925 / 0.921 / 0.936; 64 boxes allgather 0.949 (trees 0.945);
128 boxes 0.948 / 0.909 / 0.936 (trees 0.908 / 0.908 / 0.908), in 31 / 29 / 60 s of CPU through the pipeline.
Below about 64 boxes ``trees`` is faster (33 boxes: 0.957 against 0.937). Construction is linear in the
moves, deterministic, no solver.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule
from synth.synthesis.base import Instance, MethodSpec
from synth.synthesis.baselines import Plan, routes_cost
from synth.synthesis.leafring import LazyRoutes
from synth.topology.model import Topology
from synth.topology.structure import aligned_boxes

SUPPORTED = frozenset({"allgather", "reducescatter", "allreduce"})
BOX, RAIL, FORWARD = 0, 1, 2     # channels (and list-schedule levels) of the three moves
ALPHA_SHARE = 0.025              # a rail message's route α is about this share of its bytes' time ...
MESSAGE_CHUNKS = 8               # ... and it is cut from pieces in about this many chunks
TAIL = 3                         # a rail's last message halved this many times (short drain)

Boxes = tuple[tuple[int, ...], ...]


def rail_boxes(topology: Topology, routes: LazyRoutes) -> Boxes | None:
    """Aligned boxes (>= 2) with crossbar insides and rails (module docstring), or None."""
    boxes = aligned_boxes(topology)
    if boxes is None or len(boxes[0]) < 2:
        return None
    box_of = {r: b for b, box in enumerate(boxes) for r in box}
    # a switch reached from two boxes belongs to the network: no route inside a box may cross it
    shared: dict[int, set[int]] = defaultdict(set)
    for lk in topology.links:
        for x, y in ((lk.src, lk.dst), (lk.dst, lk.src)):
            if topology.is_switch(x) and topology.is_rank(y):
                shared[x].add(box_of[y])
    network = {x for x, owners in shared.items() if len(owners) > 1}
    for box in boxes:
        for a in box:
            for c in box:
                if a == c:
                    continue
                path = routes.get((a, c))
                if path is None or network.intersection(path):
                    return None
    width = len(boxes[0])
    for g in range(width):
        for a in boxes:
            for c in boxes:
                if a is not c and (a[g], c[g]) not in routes:
                    return None
    return boxes


def rail_runs(num_boxes: int, width: int) -> list[list[tuple[int, tuple[int, ...]]]]:
    """Per rail ``g``: its messages as (box offset ``d``, positions ``j`` of the pieces), in order (module
    docstring): the items ``(d, j)`` in order of ``d`` then ``j`` cut into ``width`` runs of ``num_boxes − 1``."""
    per = num_boxes - 1
    items = [(d, j) for d in range(1, num_boxes) for j in range(width)]
    runs: list[list[tuple[int, tuple[int, ...]]]] = []
    for g in range(width):
        messages: list[tuple[int, list[int]]] = []
        for d, j in items[g * per:(g + 1) * per]:
            if messages and messages[-1][0] == d:
                messages[-1][1].append(j)
            else:
                messages.append((d, [j]))
        runs.append([(d, tuple(js)) for d, js in messages])
    return runs


def _tailed(parts: list[tuple], tail: int) -> list[tuple]:
    """A rail's parts ``(d, js, first, count)`` with its last part halved ``tail`` times (sizes ..., g/2, g/4,
    ..., as in :func:`synth.synthesis.trees.messages.message_shapes`): the last message a holder forwards
    inside its box is short, so the drain is."""
    if not parts or tail <= 0:
        return parts
    d, js, first, count = parts[-1]
    out = parts[:-1]
    for _ in range(tail):
        if count < 2:
            break
        half = count // 2
        out.append((d, js, first, half))
        first, count = first + half, count - half
    out.append((d, js, first, count))
    return out


def railblocks_schedule(topology: Topology, collective: Collective, size_bytes: float, options,
                        boxes: Boxes, routes: LazyRoutes, chunks: int = 1, most: int | None = None,
                        tail: int = 0) -> Schedule:
    """The schedule of the module docstring with ``chunks`` chunks per piece, rail messages of at most ``most``
    chunks (None: a run's whole block per destination box)."""
    name, n = collective.name, topology.num_ranks
    k, width = len(boxes), len(boxes[0])
    factor = n * chunks if name == "allreduce" else chunks
    coll = Collective(name, n, factor, root=collective.root, inplace=collective.inplace)
    plan = Plan(topology, coll, size_bytes, "railblocks", options, routes=routes)
    runs = rail_runs(k, width)

    def piece(r: int) -> list[int]:
        """The chunks of rank ``r``'s piece: its contribution (allgather) or the slots it owns."""
        if name == "allgather":
            return [coll.contribution(r, s) for s in range(chunks)]
        return list(range(r * chunks, (r + 1) * chunks))

    def pieces(b: int, js: Sequence[int]) -> list[int]:
        return [c for j in js for c in piece(boxes[b][j])]

    ready: dict[int, list[int]] = {}    # allreduce: rank -> moves that complete its piece's sum
    limit = most or chunks * width * k   # None: a run's whole block per destination box
    if name in ("reducescatter", "allreduce"):
        ready = _reduce_scatter(plan, boxes, runs, pieces, piece, limit, tail)
    if name in ("allgather", "allreduce"):
        _allgather(plan, boxes, runs, pieces, piece, ready, limit, tail)
    return plan.schedule("railblocks", size_bytes, {"boxes": k, "box_ranks": width,
                                                    "rail_messages": max(len(r) for r in runs)})


def _allgather(plan: Plan, boxes: Boxes, runs, pieces, piece, ready: dict[int, list[int]], most: int,
               tail: int = 0) -> None:
    k, width = len(boxes), len(boxes[0])
    base = 3 if ready else 0           # an allreduce's allgather ranks after its reduce-scatter
    held: dict[tuple[int, int], list[int]] = {}   # (holder rank, piece rank) -> moves delivering it
    # each holder gets first the pieces its first rail messages carry (a piece it never sends comes last)
    need = [{j: pos for pos, j in enumerate(dict.fromkeys(j for _, js in messages for j in js))} for messages in runs]
    for box in boxes:
        for j2, other in enumerate(box):
            for j, r in sorted(enumerate(box), key=lambda item: need[j2].get(item[0], width)):
                if j2 != j:
                    level = base + BOX + need[j2].get(j, width) / (width + 1)
                    held[(other, r)] = plan.send(level, r, other, piece(r), channel=BOX, deps=ready.get(r, ()))
    # key order = time order: step i of every rail and box together (every box runs the same pattern shifted,
    # so a step's senders reach distinct receivers; KeyOrderTimer never lets a later key overtake)
    for g, d, js, first, count in _steps(runs, pieces, most, tail):
        for b, box in enumerate(boxes):
            holder, target = box[g], boxes[(b + d) % k]
            owner = {c: box[j] for j in js for c in piece(box[j])}
            part = pieces(b, js)[first:first + count]
            sources = sorted({owner[c] for c in part})
            deps = [m for r in sources if r != holder for m in held[(holder, r)]] + \
                   [m for r in sources if r == holder for m in ready.get(holder, ())]
            arrived = plan.send(base + RAIL, holder, target[g], part, channel=RAIL, deps=deps)
            for shift in range(1, width):   # rotated: the holders of a box forward to distinct ranks at a time
                plan.send(base + FORWARD, target[g], target[(g + shift) % width], part, channel=FORWARD, deps=arrived)


def _steps(runs, pieces, most: int, tail: int = 0):
    """(rail g, box offset d, positions js, first, count) of every rail message, step by step: the i-th of every
    rail before the (i+1)-th of any; a message carries ``count`` chunks of ``pieces(b, js)`` from ``first``
    (``pieces(0, js)`` sizes them; all boxes alike)."""
    per_rail = []
    for messages in runs:
        parts = [(d, js, i, min(most, len(pieces(0, js)) - i)) for d, js in messages
                 for i in range(0, len(pieces(0, js)), most)]
        per_rail.append(_tailed(parts, tail))
    for step in range(max(map(len, per_rail), default=0)):
        for g, parts in enumerate(per_rail):
            if step < len(parts):
                yield (g, *parts[step])


def _reduce_scatter(plan: Plan, boxes: Boxes, runs, pieces, piece, most: int, tail: int = 0) -> dict[int, list[int]]:
    """The allgather's moves backwards with sums (module docstring); returns rank -> the moves completing
    its piece's sum there."""
    k, width = len(boxes), len(boxes[0])
    into_holder: dict[int, list[int]] = defaultdict(list)      # source-side holder -> partial sums received
    for g, d, js, first, count in _steps(runs, pieces, most, tail):
        for b, box in enumerate(boxes):
            target = boxes[(b + d) % k]
            part = pieces(b, js)[first:first + count]
            gathered = [m for shift in range(1, width)   # rotated, as the allgather's forwards
                        for m in plan.send(0, target[(g - shift) % width], target[g], part, reduce=True,
                                           channel=FORWARD)]
            into_holder[box[g]] += plan.send(1, target[g], box[g], part, reduce=True, channel=RAIL, deps=gathered)
    ready: dict[int, list[int]] = defaultdict(list)
    for box in boxes:
        for j, r in enumerate(box):
            for j2, other in enumerate(box):
                if j2 != j:
                    ready[r] += plan.send(2, other, r, piece(r), reduce=True, channel=BOX,
                                          deps=into_holder[other])
            ready[r] += into_holder[r]
    return ready


def synthesize(inst: Instance) -> Schedule:
    """:func:`railblocks_schedule` where the fabric has rail boxes; SynthError otherwise."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    routes = LazyRoutes(topology)
    boxes = rail_boxes(topology, routes)
    if boxes is None:
        raise SynthError(f"railblocks does not apply to {topology.name!r}: it needs equal boxes with switch insides "
                         "whose rank g reaches rank g of every other box (NIC rails)")
    chunks, most = _message_shape(topology, size_bytes, boxes, routes, options.chunks)
    return railblocks_schedule(topology, collective, size_bytes, options, boxes, routes, chunks, most, TAIL)


def _message_shape(topology: Topology, size_bytes: float, boxes: Boxes, routes: LazyRoutes,
                   chunks: int | None) -> tuple[int, int]:
    """(chunks per piece, chunks per rail message): rail messages of about ``α / ALPHA_SHARE`` of bytes time on
    the slowest rail route (α a small share of each), cut from pieces in ``MESSAGE_CHUNKS`` chunks each, so
    forwards inside a box start on part of a message's worth; ``--chunks`` fixes the first."""
    slowest, alpha = routes_cost(topology, routes, zip(boxes[0], boxes[1]))
    message_bytes = slowest * 1e3 * max(alpha, 1e-3) / ALPHA_SHARE
    piece_bytes = size_bytes / topology.num_ranks
    if chunks is None:
        wanted = piece_bytes * MESSAGE_CHUNKS / message_bytes
        chunks = 1 << max(0, math.floor(math.log2(max(wanted, 1.0))))
    chunk_bytes = piece_bytes / chunks
    return chunks, max(1, round(message_bytes / chunk_bytes))


METHOD = MethodSpec(
    name="railblocks",
    run=synthesize,
    collectives=SUPPORTED,
    description="boxes on NIC rails: one network message per contiguous block of a box's pieces",
)

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

- **Own pieces** (few boxes): rail ``g`` instead carries the piece of position ``g`` itself to every other box
  (:func:`own_runs`): also ``K − 1`` pieces per NIC, no exchange inside the box before the rails start, but
  one message per piece and destination box, so only where a piece is long against the route's α.

- **Groups** (many boxes): one stage gives each NIC about ``(K − 1)/G`` destination boxes, a threadblock each,
  and past what MSCCL can order (``MAX_DEPENDED_TB``; 512 DGX A100 boxes: 65 per NIC) the rails race. There the
  ``K = A·B`` boxes form ``A`` groups of ``B`` consecutive boxes (:func:`group_count`) and the allgather runs in two
  stages (:func:`_grouped_allgather`): the blocks inside each group as above, then each group's block of ``B·G``
  pieces, contiguous in the buffer, from box ``c`` of its group to box ``c`` of every other group, cut into ``G``
  runs the same way. Each NIC still moves ``K − 1`` pieces, the network cut's share, from about ``(B − 1)/G +
  (A − 1)/G`` boxes: a two-level allgather over a ``B × A`` grid of boxes, each level the block exchange. A
  group's pieces go out starting with the sender's own box and then those the first stage brings first, and a
  rail's run starts on its own box's pieces, so the second stage does not wait for the first. A reducescatter
  runs the two stages backwards (:func:`_grouped_reduce_scatter`), an allreduce both.

A reducescatter runs the same moves backwards: the ranks of box ``b + d`` send their contributions to the
pieces of box ``b`` to the rail holder, which sums them and sends one partial sum per run over its rail; the
source-side holder adds the partial sums that reached it to its own contribution and sends each piece's sum
to the piece's rank. An allreduce is that reducescatter followed by the allgather of the reduced pieces
(Patarasuk & Yuan's two phases, each a piece's moves depending on its sum being complete).

Messages: a rail message is cut to about ``α / ALPHA_SHARE`` of bytes time on its route (so α is about 2.5 %
of it) from pieces in about ``MESSAGE_CHUNKS`` chunks, and towards the end of each rail's stream the messages
shrink geometrically (:func:`_ramped`) by a factor no smaller than the share ``ρ`` of its rail time that
forwarding a message inside the box takes, so each forward ends before the next message has arrived and the
drain after the rail's last byte is one chunk's forward (the shrinking tail of a pipelined broadcast, Träff &
Ripke, JPDC 2008, spread over the stream). A reduction's rails run the stream backwards (short messages first:
its first gather inside the box is short). Inside a box the holders forward round by round (round ``s``: holder
``g`` to ``g + s``), so a round's holders reach distinct ranks, and the plan's list schedule (every link in key
order) is then the simulator's time of the program.

Time (α-β, docs/cost-model.md): a NIC moves ``(K − 1)`` pieces, so the network term is the bound's box cut,
plus the route α of its messages, plus the box's own first exchange and last forward. The method builds the
block shape and, where they apply, two own-piece shapes, and keeps the fastest plan; the pipeline simulates
the program and ``synth bounds`` gives the ratio. 1 GiB on DGX A100 boxes (25 GB/s NICs, IB α 2 µs a hop),
allgather: 3 boxes 0.977, 8 boxes 0.982 (trees 0.978), 17 boxes 0.978, 33 boxes 0.968 (trees 0.957), 64 boxes
0.952 (trees 0.945), 128 boxes 0.951 / reducescatter 0.937 / allreduce 0.955 (trees 0.908 at 1024 ranks).
Past ``MAX_DEPENDED_TB`` threadblocks that others depend on per rank (MSCCL numbers them in an int8) the rails'
order cannot be kept and they race: own pieces are not tried there, and the blocks fall apart at 512 boxes
(4096 ranks: 64 destination boxes per NIC; 0.48). Construction is linear in the moves, deterministic, no
solver.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from synth.collectives import Collective
from synth.errors import SynthError
from synth.limits import check_transfer_count
from synth.runtime_limits import MAX_DEPENDED_TB, MAX_STEP_CHUNKS
from synth.schedule import Schedule
from synth.synthesis.base import Instance, MethodSpec
from synth.synthesis.baselines import Plan, routes_cost
from synth.topology.model import Topology
from synth.topology.routes import LazyRoutes
from synth.topology.structure import aligned_boxes, rails_join

SUPPORTED = frozenset({"allgather", "reducescatter", "allreduce"})
BOX, RAIL, FORWARD = 0, 1, 2     # channels (and list-schedule levels) of the three moves
ALPHA_SHARE = 0.025              # a rail message's route α is about this share of its bytes' time ...
MESSAGE_CHUNKS = 8               # ... and it is cut from pieces in about this many chunks
OWN_PIECE_ALPHAS = 16            # own-piece shapes only where a piece takes this many rail α or more ...
OWN_CHUNK_ALPHAS = (4, 8, 16, 32)   # ... in chunks of about these many α of rail time (and half the first)
RAMP_MARGIN, RAMP_MOST = 1.2, 0.85   # the ramp's factor: this much above the forward's share ρ, at most this

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
    return boxes if rails_join(boxes, routes) else None


@functools.lru_cache(maxsize=2)
def _routed_rail_boxes(topology: Topology) -> tuple[Boxes | None, LazyRoutes]:
    """(:func:`rail_boxes`, the routes it read): auto asks before the method plans, and at 1024 ranks the
    routes of every rank pair took 3 s to find each time."""
    routes = LazyRoutes(topology)
    return rail_boxes(topology, routes), routes


def has_rail_boxes(topology: Topology) -> bool:
    """Whether railblocks applies to ``topology`` (:func:`rail_boxes`); auto asks before planning."""
    return _routed_rail_boxes(topology)[0] is not None


def rail_runs(num_boxes: int, width: int, rails: int | None = None) -> list[list[tuple[int, tuple[int, ...]]]]:
    """Per rail ``g``: its messages as (box offset ``d``, positions ``j`` of the pieces), in order (module
    docstring): the items ``(d, j)`` (``j < width``) in order of ``d`` then ``j`` cut into ``rails`` runs
    (``width`` by default) of ``(num_boxes − 1)·width / rails`` items each."""
    rails = rails or width
    per = (num_boxes - 1) * width // rails
    items = [(d, j) for d in range(1, num_boxes) for j in range(width)]
    runs: list[list[tuple[int, tuple[int, ...]]]] = []
    for g in range(rails):
        messages: list[tuple[int, list[int]]] = []
        for d, j in items[g * per:(g + 1) * per]:
            if messages and messages[-1][0] == d:
                messages[-1][1].append(j)
            else:
                messages.append((d, [j]))
        runs.append([(d, tuple(js)) for d, js in messages])
    return runs


def own_runs(num_boxes: int, width: int) -> list[list[tuple[int, tuple[int, ...]]]]:
    """Per rail ``g``: the piece of position ``g`` to every other box, ``d = 1 .. num_boxes − 1``. Like
    :func:`rail_runs` every NIC carries ``num_boxes − 1`` pieces, but its own rank's: no exchange inside the
    box before the rails start, one message (or more) per destination box."""
    return [[(d, (g,)) for d in range(1, num_boxes)] for g in range(width)]


def _ramped(blocks: list[tuple[int, tuple[int, ...], int]], most: int, keep: float) -> list[tuple]:
    """A rail's blocks ``(d, js, chunks)`` cut into parts ``(d, js, first, count)`` whose sizes shrink
    geometrically towards the end of the rail's stream: from the last message (one chunk) backwards each
    message is ``1 / keep`` times the next, up to ``most``. A holder forwards a message while the next one
    arrives; where forwarding a message inside the box takes ``ρ`` of its rail time, sizes shrinking by
    ``keep ≥ ρ`` let the forwards keep up, so the box's drain after the rail's last byte is one chunk's
    forward, not a whole block's (the shrinking tail of Träff & Ripke, JPDC 2008, spread over the stream). A
    block's first part is what is left of it (it may be shorter than the next: merging the two was measured
    slower, 8 A100 boxes 0.956 against 0.982)."""
    out: list[tuple] = []
    size = 1.0 if keep > 0 else float(most)   # keep 0: no ramp, every message ``most`` chunks
    for d, js, chunks in reversed(blocks):
        end = chunks
        while end > 0:
            count = min(end, max(1, min(most, int(size))))
            out.append((d, js, end - count, count))
            end -= count
            size = min(float(most), max(size + 1, size / keep)) if keep > 0 else size
    return out[::-1]


@dataclass(frozen=True)
class RailShape:
    """How the rails' messages are cut: ``chunks`` per piece, at most ``most`` chunks per rail message (None: a
    run's whole block per destination box), each rail's stream shrinking by ``ramp`` towards its end
    (:func:`_ramped`); ``own``: rail ``g`` carries the pieces of position ``g`` only (:func:`own_runs`), else the
    blocks of :func:`rail_runs`."""
    chunks: int = 1
    most: int | None = None
    ramp: float = 0.5
    own: bool = False
    groups: int = 1


def railblocks_schedule(topology: Topology, collective: Collective, size_bytes: float, options,
                        boxes: Boxes, routes: LazyRoutes, shape: RailShape = RailShape()) -> Schedule:
    """The schedule of the module docstring with the rail messages of ``shape``."""
    chunks, most = shape.chunks, shape.most
    name, n = collective.name, topology.num_ranks
    k, width = len(boxes), len(boxes[0])
    factor = n * chunks if name == "allreduce" else chunks
    coll = Collective(name, n, factor, root=collective.root, inplace=collective.inplace)
    plan = Plan(topology, coll, size_bytes, "railblocks", options, routes=routes)
    runs = own_runs(k, width) if shape.own else rail_runs(k, width)

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
        if shape.groups > 1:
            ready = _grouped_reduce_scatter(plan, boxes, piece, limit, shape)
        else:
            ready = _reduce_scatter(plan, boxes, runs, pieces, piece, limit, shape)
    if name in ("allgather", "allreduce"):
        if shape.groups > 1:
            _grouped_allgather(plan, boxes, piece, ready, limit, shape)
        else:
            _allgather(plan, boxes, runs, pieces, piece, ready, limit, shape)
    return plan.schedule("railblocks", size_bytes, {"boxes": k, "box_ranks": width,
                                                    "rail_messages": max(len(r) for r in runs),
                                                    "own_pieces": shape.own, "groups": shape.groups})


def _box_exchange(plan: Plan, boxes: Boxes, runs, piece, ready: dict[int, list[int]],
                  base: float) -> dict[tuple[int, int], list[int]]:
    """Every rank's piece to every other rank of its box (one message each); returns (holder rank, piece rank) ->
    the moves delivering it. Each holder gets first the pieces its first rail messages carry (a piece it never
    sends comes last) and, among pieces needed alike, rotated (round s: position j to j + s), so a round's
    senders reach distinct receivers."""
    width = len(boxes[0])
    held: dict[tuple[int, int], list[int]] = {}
    need = [{j: pos for pos, j in enumerate(dict.fromkeys(j for _, js in messages for j in js))} for messages in runs]
    for box in boxes:
        for j2, other in enumerate(box):
            for j, r in enumerate(box):
                if j2 != j:
                    order = need[j2].get(j, width) * width + (j2 - j) % width
                    level = base + BOX + order / ((width + 1) * width)
                    held[(other, r)] = plan.send(level, r, other, piece(r), channel=BOX, deps=ready.get(r, ()))
    return held


def _rail_stage(plan: Plan, boxes: Boxes, runs, pieces, most: int, ramp: float, base: float, target_box,
                deps_of) -> list[tuple[int, list[int], list[list[int]]]]:
    """The rail messages of ``runs`` and their forwards inside the destination box: box ``b``'s rank ``g`` sends
    ``pieces(b, js)`` (a run's message, cut by :func:`_steps`) to rank ``g`` of box ``target_box(b, d)``, after
    ``deps_of(b, holder, part)``, and that rank forwards it to the other ranks of its box. Key order = time
    order: step i of every rail and box together (every box runs the same pattern shifted, so a step's senders
    reach distinct receivers; KeyOrderTimer never lets a later key overtake), the step's forwards round by round
    (shift s: holder g to g + s) so a round's holders reach distinct ranks. Returns per message (destination box,
    its chunks, the moves delivering them to each position of that box)."""
    width = len(boxes[0])
    arrivals: list[tuple[int, list[int], list[list[int]]]] = []
    for messages in _steps(runs, pieces, most, ramp):
        forwards = []   # (shift, g, target, part, arrived, delivered)
        for g, d, js, first, count in messages:
            for b, box in enumerate(boxes):
                holder, t = box[g], target_box(b, d)
                target = boxes[t]
                part = pieces(b, js)[first:first + count]
                arrived = plan.send(base + RAIL, holder, target[g], part, channel=RAIL,
                                    deps=deps_of(b, holder, part))
                delivered: list[list[int]] = [[] for _ in range(width)]
                delivered[g] = arrived
                arrivals.append((t, part, delivered))
                forwards += [(shift, g, target, part, arrived, delivered) for shift in range(1, width)]
        for shift, g, target, part, arrived, delivered in sorted(forwards, key=lambda f: f[:2]):
            delivered[(g + shift) % width] = plan.send(base + FORWARD, target[g], target[(g + shift) % width], part,
                                                       channel=FORWARD, deps=arrived)
    return arrivals


def _held_deps(held: dict[tuple[int, int], list[int]], ready: dict[int, list[int]], owner: dict[int, int]):
    """``deps_of(b, holder, part)`` for :func:`_rail_stage`: the moves that gave ``holder`` the pieces of ``part``
    inside its box (:func:`_box_exchange`), or completed its own piece's sum (``ready``, an allreduce)."""
    def deps_of(b: int, holder: int, part: list[int]) -> list[int]:
        sources = sorted({owner[c] for c in part})
        return ([m for r in sources if r != holder for m in held[(holder, r)]]
                + [m for r in sources if r == holder for m in ready.get(holder, ())])
    return deps_of


def _allgather(plan: Plan, boxes: Boxes, runs, pieces, piece, ready: dict[int, list[int]], most: int,
               shape: RailShape) -> None:
    k = len(boxes)
    base = 3 if ready else 0           # an allreduce's allgather ranks after its reduce-scatter
    held = _box_exchange(plan, boxes, runs, piece, ready, base)
    owner = {c: r for box in boxes for r in box for c in piece(r)}
    _rail_stage(plan, boxes, runs, pieces, most, shape.ramp, base, lambda b, d: (b + d) % k,
                _held_deps(held, ready, owner))


class _Groups:
    """The two stages' runs and moves over ``groups`` groups of ``B`` consecutive boxes (module docstring,
    "Groups"): ``inner`` (:func:`rail_runs` of ``B`` boxes) carries the blocks inside each group, ``outer``
    (:func:`rail_runs` of the groups, ``B·G`` pieces wide, on ``G`` rails) each group's whole block, contiguous in
    the buffer, between box ``c`` of two groups. A group block's units are counted from the sender's own box
    down (unit u: the piece ``G·c + G − 1 − u`` of the group, c the sender's box: its own pieces, then those the
    first stage brings first), contiguous downwards; a block where a rail's run starts is rotated to start there,
    so every rail starts on pieces its box holds."""

    def __init__(self, boxes: Boxes, groups: int, piece) -> None:
        self.boxes, self.piece = boxes, piece
        self.width = width = len(boxes[0])
        self.per = per = len(boxes) // groups
        self.groups = groups
        self.span = span = per * width
        self.inner = rail_runs(per, width)
        cut = rail_runs(groups, span, rails=width)
        rotation: dict[int, int] = {}
        for run in cut:
            d, units = run[0]
            rotation.setdefault(d, units[0])
        self.outer = [[(d, tuple((u - rotation.get(d, 0)) % span for u in units)) for d, units in run]
                      for run in cut]

    def inner_target(self, b: int, d: int) -> int:
        return b - b % self.per + (b % self.per + d) % self.per

    def outer_target(self, b: int, d: int) -> int:
        return (b // self.per + d) % self.groups * self.per + b % self.per

    def inner_pieces(self, b: int, js: Sequence[int]) -> list[int]:
        return [c for j in js for c in self.piece(self.boxes[b][j])]

    def group_pieces(self, b: int, units: Sequence[int]) -> list[int]:
        first, own, width = b - b % self.per, b % self.per, self.width
        found = []
        for u in units:
            index = (own * width + width - 1 - u) % self.span
            found += self.piece(self.boxes[first + index // width][index % width])
        return found


def _grouped_allgather(plan: Plan, boxes: Boxes, piece, ready: dict[int, list[int]], most: int,
                       shape: RailShape) -> None:
    """The allgather in two stages (:class:`_Groups`): the blocks inside each group, then each group's whole
    block to box ``c`` of every other group from box ``c`` of its own. A box receives ``B − 1`` and then
    ``(A − 1)·B`` pieces per NIC, ``K − 1`` in all as in one stage, from about ``(B − 1)/G + (A − 1)/G + 2``
    boxes per NIC instead of ``(K − 1)/G + 1``."""
    k = len(boxes)
    grouped = _Groups(boxes, shape.groups, piece)
    base = 5 if ready else 0           # an allreduce's allgather ranks after its reduce-scatter
    held = _box_exchange(plan, boxes, grouped.inner, piece, ready, base)
    owner = {c: r for box in boxes for r in box for c in piece(r)}
    own_deps = _held_deps(held, ready, owner)
    # the first stage's stream needs no ramp: the second follows it on every rail
    arrivals = _rail_stage(plan, boxes, grouped.inner, grouped.inner_pieces, most, 0.0, base, grouped.inner_target,
                           own_deps)
    arrived_at: list[dict[int, int]] = [{} for _ in range(k)]   # box -> chunk -> index in arrivals
    for index, (t, part, _) in enumerate(arrivals):
        for c in part:
            arrived_at[t][c] = index

    def outer_deps(b: int, holder: int, part: list[int]) -> list[int]:
        g = boxes[b].index(holder)
        local = [c for c in part if c not in arrived_at[b]]
        found = sorted({arrived_at[b][c] for c in part if c in arrived_at[b]})
        return own_deps(b, holder, local) + [m for index in found for m in arrivals[index][2][g]]

    _rail_stage(plan, boxes, grouped.outer, grouped.group_pieces, most, shape.ramp, base + 3, grouped.outer_target,
                outer_deps)


class _Sums:
    """Reduction moves into each rank by chunk range: (rank) -> [(first chunk, last chunk, moves)]. A part that wraps
    around its group block is held as its whole range: an extra dependency at worst, never a missing one."""

    def __init__(self) -> None:
        self.into: dict[int, list[tuple[int, int, list[int]]]] = defaultdict(list)

    def add(self, rank: int, part: Sequence[int], moves: list[int]) -> None:
        self.into[rank].append((min(part), max(part), moves))

    def before(self, rank: int, part: Sequence[int]) -> list[int]:
        """The moves that added to any of ``part``'s chunks at ``rank``: a send of its sum waits for them."""
        low, high = min(part), max(part)
        return [m for first, last, moves in self.into.get(rank, ()) if first <= high and low <= last for m in moves]


def _grouped_reduce_scatter(plan: Plan, boxes: Boxes, piece, most: int, shape: RailShape) -> dict[int, list[int]]:
    """The grouped allgather's moves backwards with sums (the time mirror, as :func:`_reduce_scatter` of one
    stage): each group's block is first summed across groups (box ``c`` of every other group gathers its
    partial sums inside its box and sends one per run over its rail to box ``c`` of the group), then inside each
    group, each holder's sum carrying what the first stage brought it, then to the pieces' ranks. Returns rank
    -> the moves completing its piece's sum there."""
    grouped = _Groups(boxes, shape.groups, piece)
    sums = _Sums()

    def record(b: int, g: int, part: list[int], moved: list[int]) -> None:
        sums.add(boxes[b][g], part, moved)

    _sum_stage(plan, boxes, grouped.outer, grouped.group_pieces, most, shape.ramp, 0, grouped.outer_target,
               sums.before, record)
    _sum_stage(plan, boxes, grouped.inner, grouped.inner_pieces, most, 0.0, 2, grouped.inner_target, sums.before,
               record)
    return _sums_to_owners(plan, boxes, piece, 4, lambda other, r: sums.before(other, piece(r)))


def _steps(runs, pieces, most: int, ramp: float, reverse: bool = False):
    """The rail messages step by step, each step a list of (rail g, box offset d, positions js, first, count): the
    i-th message of every rail before the (i+1)-th of any; a message carries ``count`` chunks of
    ``pieces(b, js)`` from ``first`` (``pieces(0, js)`` sizes them; all boxes alike); ``reverse``: each rail's
    stream backwards."""
    per_rail = [_ramped([(d, js, len(pieces(0, js))) for d, js in messages], most, ramp)[::-1 if reverse else 1]
                for messages in runs]
    for step in range(max(map(len, per_rail), default=0)):
        yield [(g, *parts[step]) for g, parts in enumerate(per_rail) if step < len(parts)]


def _sum_stage(plan: Plan, boxes: Boxes, runs, pieces, most: int, ramp: float, base: int, target_box, waits,
               record) -> None:
    """The rail messages of ``runs`` backwards with sums, each rail's stream in reverse order (the time mirror of
    :func:`_rail_stage`: its short messages first, so the first gather inside the box is short): for the message
    box ``b`` would send box ``target_box(b, d)``, the ranks of that box send their sums of its chunks to the
    holder ``g``, round by round (shift s: holder g gathers from g − s, so a round's senders reach distinct
    holders), and the holder sends one partial sum over its rail to rank ``g`` of box ``b``. A rank's send of a
    sum waits for ``waits(rank, part)``, the sums that reached it for those chunks; ``record(b, g, part, moved)``
    hears of each rail sum."""
    width = len(boxes[0])
    for messages in _steps(runs, pieces, most, ramp, reverse=True):
        moves = [(g, b, boxes[target_box(b, d)], pieces(b, js)[first:first + count])
                 for g, d, js, first, count in messages for b in range(len(boxes))]
        gathered: dict[int, list[int]] = defaultdict(list)
        for shift in range(1, width):
            for i, (g, _, target, part) in enumerate(moves):
                sender = target[(g - shift) % width]
                gathered[i] += plan.send(base, sender, target[g], part, reduce=True, channel=FORWARD,
                                         deps=waits(sender, part))
        for i, (g, b, target, part) in enumerate(moves):
            moved = plan.send(base + 1, target[g], boxes[b][g], part, reduce=True, channel=RAIL,
                              deps=gathered[i] + waits(target[g], part))
            record(b, g, part, moved)


def _sums_to_owners(plan: Plan, boxes: Boxes, piece, level: int, summed) -> dict[int, list[int]]:
    """Each rank's piece summed from the other ranks of its box, round by round (shift s: position j to j + s, as
    the gathers): rank ``other`` sends its sum of ``r``'s piece after ``summed(other, r)``, the rail sums of it
    that reached ``other``. Returns rank -> the moves completing its piece's sum there."""
    width = len(boxes[0])
    ready: dict[int, list[int]] = defaultdict(list)
    for j, shift in ((j, s) for s in range(1, width) for j in range(width)):
        for box in boxes:
            other, r = box[j], box[(j + shift) % width]
            ready[r] += plan.send(level, other, r, piece(r), reduce=True, channel=BOX, deps=summed(other, r))
    for r in range(plan.coll.num_ranks):
        ready[r] += summed(r, r)
    return ready


def _reduce_scatter(plan: Plan, boxes: Boxes, runs, pieces, piece, most: int,
                    shape: RailShape) -> dict[int, list[int]]:
    """The allgather's moves backwards with sums (module docstring; :func:`_sum_stage`), then each piece's sum to
    its rank; returns rank -> the moves completing its piece's sum there. In one stage no rank sends a sum of
    chunks that a rail brought it, so no send waits for one."""
    k = len(boxes)
    owner = {c: r for box in boxes for r in box for c in piece(r)}
    into: dict[tuple[int, int], list[int]] = defaultdict(list)   # (source-side holder, piece rank) -> partial sums

    def record(b: int, g: int, part: list[int], moved: list[int]) -> None:
        for r in sorted({owner[c] for c in part}):
            into[(boxes[b][g], r)] += moved

    _sum_stage(plan, boxes, runs, pieces, most, shape.ramp, 0, lambda b, d: (b + d) % k, lambda rank, part: [],
               record)
    return _sums_to_owners(plan, boxes, piece, 2, lambda other, r: into[(other, r)])


def synthesize(inst: Instance) -> Schedule:
    """:func:`railblocks_schedule` where the fabric has rail boxes (SynthError otherwise): the block shape, and
    where a piece is long against the rail's α the own-piece shapes (:func:`own_shapes`); the one the
    list schedule times fastest (its time is the simulator's: the plan fixes every link's order)."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    boxes, routes = _routed_rail_boxes(topology)
    if boxes is None:
        raise SynthError(f"railblocks does not apply to {topology.name!r}: it needs equal boxes with switch insides "
                         "whose rank g reaches rank g of every other box (NIC rails)")
    rail = routes_cost(topology, routes, zip(boxes[0], boxes[1]))   # (slowest bw, largest α) of the rail routes
    piece_bytes = size_bytes / topology.num_ranks
    chunks, most = _message_shape(piece_bytes, rail, options.chunks)
    # every rank receives every other rank's piece once per phase: refuse before planning past synth's limit
    # (512 DGX A100 boxes: an allreduce would move 33.5 M chunks)
    n = topology.num_ranks
    check_transfer_count(n * (n - 1) * chunks * (2 if collective.name == "allreduce" else 1),
                         f"railblocks' {collective.name} on {n} ranks would have")
    keep = ramp_keep(topology, boxes, routes, rail[0])
    k, width = len(boxes), len(boxes[0])
    # two stages only where one cannot be kept in order (a racing single stage is still a verified program):
    # elsewhere their plans were faster but they did not simulate faster (12 boxes: 0.947 against 0.950)
    groups = None
    if not _orderable(_partners(rail_runs(k, width)), width):
        groups = group_count(k, width)
    shapes = [RailShape(chunks, most, keep, groups=groups or 1)]
    shapes += own_shapes(piece_bytes, k, width, rail, options.chunks, keep)
    found = [railblocks_schedule(topology, collective, size_bytes, options, boxes, routes, shape) for shape in shapes]
    return min(found, key=lambda schedule: schedule.predicted_time_us)   # a tie keeps the earlier shape


def _partners(runs) -> int:
    """The most destination boxes one rail's run reaches (a threadblock each, sending and receiving alike)."""
    return max((len(messages) for messages in runs), default=0)


def _orderable(partners: int, width: int) -> bool:
    """Whether a rank's rail threadblocks (``partners`` sending and as many receiving) and its box's ``width − 1``
    forwards can all be ordered: MSCCL numbers at most ``MAX_DEPENDED_TB`` threadblocks that others depend on,
    and past it the rails race (512 DGX A100 boxes in one stage: 65 boxes per NIC, 0.49 of the bound)."""
    return 2 * partners + width <= MAX_DEPENDED_TB


def group_count(num_boxes: int, width: int) -> int | None:
    """Groups ``A`` of ``B = K / A`` consecutive boxes for :func:`_grouped_allgather` (both at least 2), None where
    ``K`` has no such factorisation whose two stages can be ordered (:func:`_orderable`). Preferred: ``A > G``,
    where each rail's second-stage run starts in a group block of its own and so on pieces its box holds (24 boxes
    of 8 in 6 groups: a rail waited 92 µs for the first stage); then the fewest boxes per NIC over both stages,
    about ``(B − 1)/G + (A − 1)/G``; then fewer boxes per group (a shorter first stage)."""
    best: tuple[tuple[bool, int, int], int] | None = None
    for groups in range(2, num_boxes // 2 + 1):
        if num_boxes % groups:
            continue
        per = num_boxes // groups
        partners = _partners(rail_runs(per, width)) + _partners(rail_runs(groups, per * width, rails=width))
        key = (groups <= width, partners, per)
        if _orderable(partners, width) and (best is None or key < best[0]):
            best = (key, groups)
    return best[1] if best is not None else None


def ramp_keep(topology: Topology, boxes: Boxes, routes: LazyRoutes, rail_bw: float) -> float:
    """The factor by which a rail's messages shrink towards its stream's end (:func:`_ramped`): forwarding a
    message to the box's ``G − 1`` other ranks takes ``ρ = (G − 1)·bw_rail / bw_box`` of its rail time, so
    ``min(RAMP_MOST, max(1/2, RAMP_MARGIN·ρ))``."""
    box_bw, _ = routes_cost(topology, routes, [(boxes[0][0], boxes[0][1])])
    return min(RAMP_MOST, max(0.5, RAMP_MARGIN * (len(boxes[0]) - 1) * rail_bw / box_bw))


def own_shapes(piece_bytes: float, num_boxes: int, width: int, rail: tuple[float, float], chunks: int | None,
               keep: float) -> list[RailShape]:
    """Own-piece shapes (:func:`own_runs`) whose stream ramps down by ``keep`` (:func:`_ramped`), at the chunk
    counts that cut a chunk of about each of ``OWN_CHUNK_ALPHAS`` route α of rail time, and twice the first
    (``--chunks`` fixes it). Finer chunks drain the box faster after the rails' last byte, coarser ones pay
    fewer α on the rails; which wins depends on the number of boxes and the rail's speed against the box's
    (1 GiB, 25 GB/s A100 rails: 2 boxes 0.950 at 4 α, 0.971 at 32 α; 8 boxes 0.982 at 4 α, 0.975 at 32 α),
    and each shape's plan is the simulator's time, so the caller keeps the fastest. None where a whole piece
    takes less than ``OWN_PIECE_ALPHAS`` α on its rail (one message per piece and destination box would pay too
    much α: the blocks are for many boxes), nor where a rank's rail threadblocks could not all be ordered
    (``2·(K − 1) + G > MAX_DEPENDED_TB``). ``rail``: the rail routes' (slowest bw, largest α)."""
    rail_bw, rail_alpha = rail
    piece_us = piece_bytes / (rail_bw * 1e3)
    # a rank's rail sends (one threadblock per destination box) are kept in the plan's order by dependencies
    # between their threadblocks, and so are its forwards of what its rail receives: MSCCL numbers at most
    # MAX_DEPENDED_TB threadblocks that others depend on, and past it the rails race (64 boxes: 0.57)
    if piece_us < OWN_PIECE_ALPHAS * max(rail_alpha, 1e-3) or 2 * (num_boxes - 1) + width > MAX_DEPENDED_TB:
        return []
    if chunks is not None:
        counts = [chunks]
    else:
        cut = [1 << max(0, math.floor(math.log2(max(piece_us / (alphas * max(rail_alpha, 1e-3)), 1.0))))
               for alphas in OWN_CHUNK_ALPHAS]
        # the first two as before, so a tie keeps their program (the caller keeps the earlier of equal plans)
        counts = list(dict.fromkeys([cut[0], 2 * cut[0], *cut[1:]]))
    # a message holds at most MAX_STEP_CHUNKS chunks (one MSCCL step): a longer one would be lowered as two steps,
    # each with its α, which the plan would not have counted
    return [RailShape(c, min(c, MAX_STEP_CHUNKS), keep, own=True) for c in counts]


def _message_shape(piece_bytes: float, rail: tuple[float, float], chunks: int | None) -> tuple[int, int]:
    """(chunks per piece, chunks per rail message): rail messages of about ``α / ALPHA_SHARE`` of bytes time on
    the slowest rail route (``rail``: its bw and the largest α; α a small share of each), cut from pieces in
    ``MESSAGE_CHUNKS`` chunks each, so forwards inside a box start on part of a message's worth; ``--chunks``
    fixes the first."""
    slowest, alpha = rail
    message_bytes = slowest * 1e3 * max(alpha, 1e-3) / ALPHA_SHARE
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

"""``leafring``: two-level rings on a fabric whose ranks sit behind leaf switches (leaf-spine, fat tree).

A ring through all N ranks pays N-1 sequential steps per link, each with the α of its route, whatever its
order: on a 1024-rank leaf-spine (1 µs per hop, a rank-to-rank route 2 or 4 hops) that is 2-4 ms of α
against the 21.5 ms bandwidth term of a 1 GiB allgather, so no ring reaches 0.95 of the bound there. Rings
along the two dimensions of a rank grid (the 2D-torus allreduce of Mikami et al., "Massively Distributed SGD:
ImageNet/ResNet-50 Training in a Flash", arXiv 1811.05233; the boxed version is ``hierarchical``) move the
same bytes in (L-1) + (p-1) steps for L leaves of p ranks:

- the ranks are cut into blocks of L consecutive ranks (block j: ranks jL .. jL+L-1, a contiguous piece of
  every buffer, so one block moves as one MSCCL step); in leaf i, block j is held by the rank at position
  (j + i) mod p (``members``), so the L holders of a block sit in different leaves at different positions;
- allgather: every rank sends its piece to one holder of its block (a "transpose", one piece per rank; piece
  b of block j goes to leaf (b + c_j) mod L, the shift c_j spreading these sends over the uplinks,
  :func:`slot_leaves`), the L holders of each block run a ring allgather of its pieces across
  the leaves (L-1 steps of one piece), then every leaf runs a ring allgather of its p blocks (p-1 steps of
  L pieces). A rank sends (L-1) + (p-1)·L = N-1 pieces plus the transpose's one: the per-rank bound
  (N-1)/N·SIZE/B plus 1/N. A rank whose own piece is in a block it is passed receives it back with the rest:
  leaving it out would split the block's message and let the rings fall out of step (8x4 leaf-spine 1 GiB
  allgather 0.794 of the bound against 0.967);
- reducescatter: the reverse (leaf ring reduce-scatter of blocks to their holders, ring reduce-scatter of each
  block across its holders, then each sum copied to its rank);
- allreduce: reduce-scatter then allgather (Patarasuk & Yuan) over N chunks, each chunk staying with its
  holder in between (no transposes): 2·(N-1)/N·SIZE/B, the traffic bound; with more chunks (a multiple W of
  N) in W waves of N, wave w one leaf ring behind wave w-1, so that one wave's across-leaf phase overlaps
  another's leaf rings (offered on oversubscribed fabrics, :func:`synthesize`).

**Block rings** (:func:`blockring_schedule`), the other way round: blocks of ``g`` consecutive rank-slots, each
held inside one leaf, ring inside their leaf first (``g − 1`` steps of one piece), then ``g`` rings of whole
blocks cross the leaves (``N/g − 1`` steps of ``g`` pieces), so only ``g`` ranks per leaf send out of it at a
time. Where every rank crossing at once oversubscribes the uplinks (2:1 leaf-spines: 0.81-0.92 of the bound
for the rings above) this keeps the per-rank bound, in ``g + N/g − 2`` steps of α. :func:`synthesize` plans
both shapes, every ``g`` of :func:`block_sizes`, and keeps the fastest plan.

Cross-leaf traffic is only the single pieces of the holders' rings, and the holders of one leaf send to p
different positions of the next, so under destination-mod-k fat-tree routing (docs/cost-model.md, Routes)
the leaf's uplinks each carry p / spines of them: a 2:1 oversubscribed leaf-spine only slows that small
phase. Construction is linear in the transfers (no solver), deterministic. Times come from the baselines'
α-β list schedule (:class:`synth.synthesis.baselines.Plan`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from synth.collectives import Collective
from synth.errors import SynthError
from synth.runtime_limits import MAX_STEPS_PER_TB
from synth.schedule import Schedule
from synth.synthesis.base import Instance, MethodSpec
from synth.topology.model import Topology
from synth.topology.routes import LazyRoutes

SUPPORTED = frozenset({"allgather", "reducescatter", "allreduce"})
TRANSPOSE, RAIL, LEAF, RAIL_AG, LEAF_AG = 0, 1, 2, 3, 4      # channels
OVERSUBSCRIBED_WAVES = 2             # allreduce waves tried beside one where a leaf's uplinks are oversubscribed ...
WAVES_MAX_RANKS = 256                # ... up to this many ranks (synthesize's docstring)
ALTERNATIVES = 1                     # runners-up by planned time that the pipeline also simulates


def leaf_groups(topology: Topology) -> tuple[tuple[int, ...], ...]:
    """The ranks grouped by their leaf switch, groups in order of their lowest rank, or ``()``.

    A fabric has leaf groups when every rank's only out-link and only in-link join it to one switch (its
    leaf), there are at least 2 leaves, and every leaf holds the same number (>= 2) of ranks."""
    n = topology.num_ranks
    out: dict[int, list[int]] = defaultdict(list)
    into: dict[int, list[int]] = defaultdict(list)
    for lk in topology.links:
        if lk.src < n:
            out[lk.src].append(lk.dst)
        if lk.dst < n:
            into[lk.dst].append(lk.src)
    leaf_of: dict[int, int] = {}
    for r in range(n):
        if len(out[r]) != 1 or into[r] != out[r] or not topology.is_switch(out[r][0]):
            return ()
        leaf_of[r] = out[r][0]
    groups: dict[int, list[int]] = defaultdict(list)
    for r in range(n):
        groups[leaf_of[r]].append(r)
    found = sorted(tuple(g) for g in groups.values())
    if len(found) < 2 or len({len(g) for g in found}) != 1 or len(found[0]) < 2:
        return ()
    return tuple(found)


def members(groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """``members[j][i]``: the rank of leaf i that holds block j, the one at position (j + i) mod p."""
    leaves, p = len(groups), len(groups[0])
    return [[groups[i][(j + i) % p] for i in range(leaves)] for j in range(p)]


def slot_leaves(hold: Sequence[Sequence[int]], routes: Mapping[tuple[int, int], tuple[int, ...]]) -> list[int]:
    """Per block j, the shift ``c_j``: rank-slot jL+b is gathered from / reduced to block j's holder in leaf
    (b + c_j) mod L, a bijection, so every holder ends one slot of its block's ring.

    The shift balances the transpose (slot's rank <-> its holder): blocks in order, each takes the shift that
    leaves the fewest slots with their own rank (such a holder would start its across-leaf ring at once, on
    the link another rank's transpose into it needs: the simulator then runs the two the other way round
    and the whole schedule one step later, 8x8 allgather 0.967 against 0.982), then whose routes (both ways)
    raise the most-loaded link least, then the least growth of the summed squared link loads, then the
    smallest shift. Under destination-mod-k routing the plain shift 0 sends every copy out of a leaf through
    one uplink when L is a multiple of the spine count (8x8 leaf-spine reducescatter 0.897 of the bound
    against 0.982)."""
    leaves = len(hold[0])
    load: dict[tuple[int, int], int] = defaultdict(int)
    shifts = []
    for j, row in enumerate(hold):
        best: tuple | None = None
        for c in range(leaves):
            links: dict[tuple[int, int], int] = defaultdict(int)
            for b in range(leaves):
                q, h = j * leaves + b, row[(b + c) % leaves]
                if q != h:
                    for a, z in ((q, h), (h, q)):
                        path = routes[(a, z)]
                        for link in zip(path, path[1:]):
                            links[link] += 1
            selfheld = sum(row[(b + c) % leaves] == j * leaves + b for b in range(leaves))
            key = (selfheld, max((load[k] + v for k, v in links.items()), default=0),
                   sum(v * (2 * load[k] + v) for k, v in links.items()), c)
            if best is None or key < best[0]:
                best = (key, c, links)
        assert best is not None
        for k, v in best[2].items():
            load[k] += v
        shifts.append(best[1])
    return shifts


def _ring(order: Sequence[int], start: int, hops: int) -> list[tuple[int, int]]:
    """The (src, dst) pairs of ``hops`` steps around ``order`` from position ``start``."""
    k = len(order)
    return [(order[(start + t) % k], order[(start + t + 1) % k]) for t in range(hops)]


def _planned(topology: Topology, collective: Collective, size_bytes: float, options):
    """(collective with its chunk factor, chunks per rank-slot, the plan, ``send``) for the rings of this module:
    one chunk per piece for allgather / reducescatter and one per rank for allreduce unless ``options.chunks``
    says a multiple of that (another count is refused); ``send(level, a, b, ids, reduce, channel)`` plans a
    move after the moves that delivered (or, reducing, added to) its chunks at ``a``."""
    from synth.synthesis.baselines import Plan

    name, n = collective.name, topology.num_ranks
    unit = n if name == "allreduce" else 1
    chunks = options.chunks if options.chunks is not None else unit
    if chunks % unit:
        raise SynthError(f"leafring {name} needs a multiple of {unit} chunks, got {chunks}")
    coll = Collective(name, n, chunks, root=collective.root, inplace=collective.inplace)
    plan = Plan(topology, coll, size_bytes, "leafring", options, routes=LazyRoutes(topology))
    into: dict[tuple[int, int], list[int]] = defaultdict(list)   # (rank, chunk) -> moves delivering it

    def send(level: float, a: int, b: int, ids: Sequence[int], reduce: bool, channel: int) -> None:
        deps = sorted({d for c in ids for d in into[(a, c)]})
        moves = plan.send(level, a, b, ids, reduce, channel, deps)
        for c in ids:
            into[(b, c)] = into[(b, c)] + moves if reduce else list(moves)

    return coll, chunks // unit, plan, send


def leafring_schedule(topology: Topology, collective: Collective, size_bytes: float, options,
                      groups: Sequence[Sequence[int]]) -> Schedule:
    """The two-level ring schedule of the module docstring over leaf ``groups`` (one chunk per piece for
    allgather / reducescatter, one per rank for allreduce, unless ``options.chunks`` says more: a multiple of
    that, which an allreduce runs in waves of N chunks and the others send together; another count is
    refused)."""
    name, n = collective.name, topology.num_ranks
    leaves, p = len(groups), len(groups[0])
    # per: chunks per block position (allreduce's chunk x of rank-slot q is q*per + x)
    coll, per, plan, send = _planned(topology, collective, size_bytes, options)
    C = coll.chunk_factor
    hold = members(groups)
    pos = {r: (i, k) for i, g in enumerate(groups) for k, r in enumerate(g)}
    shift = slot_leaves(hold, plan.routes) if name != "allreduce" else [0] * p

    def leaf_of_slot(j: int, b: int) -> int:
        return (b + shift[j]) % leaves

    def slot_ids(q: int, w: int = 0) -> list[int]:
        """The chunks of rank-slot q: its piece (allgather), its output slots (reducescatter), its share of
        the buffer in wave w (allreduce: chunk w·N + q)."""
        if name == "allgather":
            return [coll.contribution(q, k) for k in range(C)]
        if name == "allreduce":
            return [w * n + q]
        return [q * per + k for k in range(per)]

    def block_ids(j: int, w: int = 0) -> list[int]:
        return [c for q in range(j * leaves, (j + 1) * leaves) for c in slot_ids(q, w)]

    def leaf_ring(level: int, j: int, i: int, reduce: bool, w: int = 0) -> None:
        """Ring allgather (from) / reduce-scatter (to) block j's holder in leaf i around leaf i."""
        group, start = groups[i], pos[hold[j][i]][1]
        steps = _ring(group, start + 1, p - 1) if reduce else _ring(group, start, p - 1)
        for t, (a, b) in enumerate(steps):
            send(level + t, a, b, block_ids(j, w), reduce, LEAF)

    def rail_ring(level: int, j: int, b: int, reduce: bool, w: int = 0) -> None:
        """Ring allgather (from) / reduce-scatter (to) rank-slot jL+b's holder in leaf ``leaf_of_slot(j, b)``
        across block j's holders."""
        start = leaf_of_slot(j, b)
        steps = _ring(hold[j], start + 1, leaves - 1) if reduce else _ring(hold[j], start, leaves - 1)
        for t, (a, c) in enumerate(steps):
            send(level + t, a, c, slot_ids(j * leaves + b, w), reduce, RAIL)

    if name == "allreduce":
        for w in range(per):
            base = w * (p - 1)   # wave w starts one leaf ring after wave w-1
            for i in range(leaves):
                for j in range(p):
                    leaf_ring(base, j, i, True, w)
            for j in range(p):
                for b in range(leaves):
                    rail_ring(base + p - 1, j, b, True, w)
            for j in range(p):
                for b in range(leaves):
                    rail_ring(base + p + leaves - 2, j, b, False, w)
            for i in range(leaves):
                for j in range(p):
                    leaf_ring(base + p + 2 * leaves - 3, j, i, False, w)
        return plan.schedule("leafring", size_bytes, {"leaves": leaves, "per_leaf": p, "waves": per})
    if name == "reducescatter":
        for i in range(leaves):
            for j in range(p):
                leaf_ring(0, j, i, True)
        for j in range(p):
            for b in range(leaves):
                rail_ring(p - 1, j, b, True)
        for j in range(p):
            for b in range(leaves):
                q, h = j * leaves + b, hold[j][leaf_of_slot(j, b)]
                if h != q:
                    send(p + leaves - 2, h, q, slot_ids(q), False, TRANSPOSE)
    if name == "allgather":
        for j in range(p):
            for b in range(leaves):
                q, h = j * leaves + b, hold[j][leaf_of_slot(j, b)]
                if h != q:
                    send(0, q, h, slot_ids(q), False, TRANSPOSE)
        for j in range(p):
            for b in range(leaves):
                rail_ring(1, j, b, False)
        for i in range(leaves):
            for j in range(p):
                leaf_ring(leaves, j, i, False)
    return plan.schedule("leafring", size_bytes, {"leaves": leaves, "per_leaf": p})


def block_holders(groups: Sequence[Sequence[int]], g: int) -> list[tuple[int, ...]]:
    """Per block ``B`` (rank-slots ``B·g .. B·g + g − 1``) its ``g`` holders, all in one leaf: leaf ``i`` holds
    blocks ``i·p/g ..`` by its ranks in order, so on a fabric numbered leaf by leaf every rank holds its own slot
    and the ring of blocks (in this order) leaves a leaf once."""
    p = len(groups[0])
    return [tuple(group[m * g:(m + 1) * g]) for group in groups for m in range(p // g)]


def block_sizes(topology: Topology, groups: Sequence[Sequence[int]]) -> list[int]:
    """The block sizes ``g`` :func:`synthesize` plans block rings with: the divisors of the leaf size from 2 whose
    rings stay within MSCCL's steps per threadblock and whose ``g`` ranks per leaf sending out at once fit the
    leaf's links to other switches at their own links' rate (a larger ``g`` has every crossing step wait on
    shared uplinks: 0.53 of the bound on 2:1 leaf-spines)."""
    p, n = len(groups[0]), len(groups) * len(groups[0])
    fits = min(_leaf_bandwidth(topology, group)[0] / min(topology.out_links[r][0].bw for r in group)
               for group in groups)
    return [g for g in range(2, p + 1) if p % g == 0 and n // g - 1 <= MAX_STEPS_PER_TB and g <= fits * (1 + 1e-9)]


def blockring_schedule(topology: Topology, collective: Collective, size_bytes: float, options,
                       groups: Sequence[Sequence[int]], g: int) -> Schedule:
    """Leaf-first two-level rings over blocks of ``g`` consecutive rank-slots (the module docstring's variant
    for leaves whose uplinks cannot take every rank crossing at once).

    Allgather: each slot's piece goes to its holder (:func:`block_holders`; none moves where ranks are numbered
    leaf by leaf), the ``g`` holders of each block run a ring allgather of its pieces (``g − 1`` steps of one
    piece, inside a leaf), then ``g`` rings, ring ``k`` through holder ``k`` of every block in block order, run a
    ring allgather of whole blocks (``N/g − 1`` steps of ``g`` pieces, contiguous in the buffer: one message
    each). A rank sends ``(g − 1) + (N/g − 1)·g = N − 1`` pieces, the per-rank bound, in ``g + N/g − 2`` steps
    of α, and only ``g`` ranks per leaf send out of it at a time (the rings' arcs from a leaf's last block to
    the next leaf's first). Reducescatter runs it backwards (block rings reducing, then the holders' rings,
    then each sum to its rank); allreduce runs the reducescatter then the allgather on ``N`` slots owned by
    their holders (Patarasuk & Yuan's two phases, no transposes). This is the 2-D ring of Mikami et al.
    (arXiv 1811.05233) on a ``g × N/g`` grid whose first dimension stays inside leaves."""
    name = collective.name
    coll, per, plan, send = _planned(topology, collective, size_bytes, options)
    hold = block_holders(groups, g)
    blocks = len(hold)

    def slot_ids(q: int) -> list[int]:
        if name == "allgather":
            return [coll.contribution(q, k) for k in range(per)]
        return [q * per + k for k in range(per)]

    def inner(level: int, reduce: bool, channel: int) -> None:
        for b, holders in enumerate(hold):
            for k in range(g):
                for t, (u, v) in enumerate(_ring(holders, k + 1 if reduce else k, g - 1)):
                    send(level + t, u, v, slot_ids(b * g + k), reduce, channel)

    def outer(level: int, reduce: bool, channel: int) -> None:
        for k in range(g):
            ring = [holders[k] for holders in hold]
            for b in range(blocks):
                ids = [c for q in range(b * g, (b + 1) * g) for c in slot_ids(q)]
                for t, (u, v) in enumerate(_ring(ring, b + 1 if reduce else b, blocks - 1)):
                    send(level + t, u, v, ids, reduce, channel)

    def transposes(level: int, to_holder: bool) -> None:
        for b, holders in enumerate(hold):
            for k, h in enumerate(holders):
                q = b * g + k
                if h != q:
                    src, dst = (q, h) if to_holder else (h, q)
                    send(level, src, dst, slot_ids(q), False, TRANSPOSE)

    if name in ("reducescatter", "allreduce"):
        outer(0, True, RAIL)
        inner(blocks - 1, True, LEAF)
    if name == "reducescatter":
        transposes(blocks + g - 2, False)
    elif name == "allreduce":
        inner(blocks + g - 2, False, LEAF_AG)
        outer(blocks + 2 * g - 3, False, RAIL_AG)
    else:
        transposes(0, True)
        inner(1, False, LEAF)
        outer(g, False, RAIL)
    return plan.schedule("leafring", size_bytes, {"leaves": len(groups), "per_leaf": len(groups[0]),
                                                   "block": g})


def _leaf_bandwidth(topology: Topology, group: Sequence[int]) -> tuple[float, float]:
    """(GB/s from the leaf of ``group`` to other switches, GB/s from it down to its ranks)."""
    n = topology.num_ranks
    leaf = topology.out_links[group[0]][0].dst
    up = sum(lk.bw for lk in topology.out_links[leaf] if lk.dst >= n)
    return up, sum(lk.bw for lk in topology.out_links[leaf] if lk.dst < n)


def oversubscribed(topology: Topology, groups: Sequence[Sequence[int]]) -> bool:
    """Whether some leaf's links to other switches carry less than the links down to its ranks."""
    return any(up < down - 1e-9 for up, down in (_leaf_bandwidth(topology, group) for group in groups))


def synthesize(inst: Instance) -> Schedule:
    """The fastest plan of :func:`leafring_schedule` and :func:`blockring_schedule` (every block size of
    :func:`block_sizes`) over :func:`leaf_groups`, with the runner-up as an alternative the pipeline also
    simulates; SynthError where the fabric has none. Every plan is a list schedule in key order, linear in
    its moves, so this costs a few times one plan (leafspine-32x32, 1024 ranks: 29 s of CPU against 12 s for
    the classic rings alone; 2:1 there 0.955 -> 0.987 of the bound).

    An allreduce on an oversubscribed fabric (:func:`oversubscribed`) whose chunk count the user left open
    also offers the schedule in ``OVERSUBSCRIBED_WAVES`` waves (N chunks each, wave w one leaf ring behind
    wave w-1) as an alternative the pipeline times: there one wave's across-leaf phase, slowed by the shared
    uplinks, overlaps the other's leaf rings, which use no uplink (leafspine-16x16-2to1 1 GiB allreduce 0.938
    -> 0.961 of the bound, 8x8-2to1 0.897 -> 0.943; on 1:1 fabrics one wave is best, 8x8 0.998 against 0.996).
    Up to ``WAVES_MAX_RANKS`` ranks: at 1024 (32x32-2to1) the second schedule took the run from 18 to 58 s of
    CPU and 1.9 to 4.0 GB of peak RSS for 0.957 -> 0.963."""
    topology, collective, options = inst.topology, inst.collective, inst.options
    groups = leaf_groups(topology)
    if not groups:
        raise SynthError(f"leafring does not apply to {topology.name!r}: its ranks are not behind leaf switches "
                         "(one switch link per rank, 2 or more leaves of equal size)")
    candidates = [leafring_schedule(topology, collective, inst.size_bytes, options, groups)]
    candidates += [blockring_schedule(topology, collective, inst.size_bytes, options, groups, g)
                   for g in block_sizes(topology, groups)]
    ranked = sorted(candidates, key=lambda s: s.predicted_time_us)   # stable: ties keep the order above
    alternatives = ranked[1:1 + ALTERNATIVES]
    if (collective.name == "allreduce" and options.chunks is None and topology.num_ranks <= WAVES_MAX_RANKS
            and oversubscribed(topology, groups)):
        # planned slower than one wave, simulated faster: the simulator, not the plan, judges the waves
        waves = replace(options, chunks=OVERSUBSCRIBED_WAVES * topology.num_ranks)
        alternatives.append(leafring_schedule(topology, collective, inst.size_bytes, waves, groups))
    return replace(ranked[0], alternatives=tuple(alternatives))


METHOD = MethodSpec(
    name="leafring",
    run=synthesize,
    collectives=SUPPORTED,
    description="two-level rings on leaf-switch fabrics: across leaves by rank blocks, then within each leaf",
)

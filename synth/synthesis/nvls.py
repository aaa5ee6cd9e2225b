"""``nvls``: collectives reduced inside the network, by a switch that sums (NVSwitch NVLS multimem,
InfiniBand SHARP; issue 35, docs/programs.md "Switch steps").

The programs use a program's ``switches`` (:class:`~synth.program.ir.SwitchOp`) and are built here directly:
the schedule IR (rank-to-rank transfers) has no in-network steps, so the schedule carries its program ready-made
(``Schedule.program``) and the pipeline verifies and times it as any other. One switch ``X`` that reduces and has
a link to and from every rank ("the reducing switch") is used; each rank runs one threadblock whose send and recv
peer is ``X`` (channel 0).

- **allreduce** (reduce-to-switch then multicast, pipelined): the buffer is cut into ``C`` chunks; every rank
  sends chunk ``j`` to ``X``, whose op ``j`` is ``reduce(srcs = all ranks, dsts = all ranks)``: the sum goes back
  to every rank. Each rank sends SIZE and receives SIZE once, the NVLS bound (one send and one receive of SIZE per
  rank). The simulator's switch is cut-through (docs/cost-model.md): with one link ``bw`` and ``α`` each way
  ``T(C) ≈ (C + 1)·α + SIZE/bw``, so one chunk is best on one switch (dgx-h100-nvls 1 GiB: 2387.5 µs against the
  bound's 2386.1); pipelines across boxes (the rail chain) still want several. The count is the fastest
  *simulated* one among a few around a store-and-forward estimate ``C* = sqrt(SIZE / (α·bw))``, widened while an
  end of the range wins (deterministic).
- **reducescatter** (in-switch reduce to the owner): op (k, q) is ``reduce(srcs = all ranks but q, dsts = [q])``
  on chunk ``k`` of piece ``q``; the owner adds its own piece as it receives the sum (``rrc``). Each rank sends
  (N-1)/N·SIZE and receives SIZE/N.
- **NCCL's NVLS allreduce** (:func:`nccl_nvls_program`, the ``nccl`` baseline where NCCL would use NVLS): a
  reduce-scatter by ``multimem.ld_reduce`` then an allgather by ``multimem.st``: chunk ``j`` belongs to rank
  ``j mod N``; op ``reduce(srcs = all, dsts = [owner])`` (channel 0) then ``multicast(srcs = [owner], dsts = the
  others)`` (channel 1), the owner forwarding each reduced piece as it arrives. Each rank sends (1 + 1/N)·SIZE.

- **Multi-box allreduce** (NCCL's NVLS+tree, :func:`boxes_program`), where no one switch reaches every rank but
  every box (the ranks linked to and from one switch that reduces and multicasts) has its own, the boxes are
  equal and together hold every rank: chunk ``j`` belongs to local index ``g = j mod L`` (L ranks a box). In each
  box a reduce op sums chunk ``j`` to its owner; the owners of ``j`` in the B boxes (a rail) allreduce it along a
  chain over the host routes (reduce up to box 0's owner, ``rrs`` on the way, then broadcast down, ``rcs``); each
  owner then multicasts the total to its box. Per rank: SIZE to the switch, SIZE/L up and down the chain,
  SIZE/L multicast, SIZE back: the inter-box traffic is SIZE/L per rank, as in NCCL's NVLS+tree.

  Where a switch that reduces is linked to every rank besides (SHARP on an InfiniBand switch the ranks reach
  directly), the rail's owners reduce there instead of along the chain (``reduce(rail -> rail)``), and the
  single-switch program on it is simulated too: the fastest is kept.

SHARP behind NIC switch nodes (ranks that reach the IB switch only through a NIC node) is not used: an op's
members need a link to the switch (docs/programs.md). Reducescatter needs one switch linked to every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from synth.collectives import Collective, runtime_divides
from synth.errors import SynthError
from synth.program.ir import Gpu, Program, Step, SwitchOp, SwitchProgram, Threadblock
from synth.schedule import Schedule
from synth.synthesis.base import Instance, MethodSpec
from synth.topology.model import Topology

MAX_CHUNKS = 4096        # the largest chunk count the search considers


def reducing_switch(topology: Topology, multicast: bool = False) -> int | None:
    """The first reducing switch (node id; with ``multicast``, one that also multicasts) linked to and from
    every rank, or None."""
    for node in topology.reducing_switches:
        if multicast and not topology.switch_features(node).multicast:
            continue
        if all(topology.link(r, node) is not None and topology.link(node, r) is not None for r in topology.ranks):
            return node
    return None


def box_switches(topology: Topology) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    """(switch node, its ranks) per box for the multi-box composition (module docstring), ordered by first rank;
    None unless at least two switches that reduce and multicast each link a box of ranks both ways and the boxes
    are disjoint, of equal size, and cover every rank."""
    boxes = []
    for node in topology.reducing_switches:
        if not topology.switch_features(node).multicast:
            continue
        members = tuple(r for r in topology.ranks
                        if topology.link(r, node) is not None and topology.link(node, r) is not None)
        if 0 < len(members) < topology.num_ranks:   # one linked to every rank is no box (it may join them)
            boxes.append((node, members))
    boxes.sort(key=lambda box: box[1])
    covered = [r for _, members in boxes for r in members]
    if len(boxes) < 2 or sorted(covered) != list(topology.ranks) or len({len(m) for _, m in boxes}) != 1:
        return None
    return tuple(boxes)


def named_boxes(boxes: tuple[tuple[int, tuple[int, ...]], ...],
                topology: Topology) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """:func:`box_switches` with each switch by its name (what a program's switch steps name)."""
    return tuple((str(topology.node_name(sw)), members) for sw, members in boxes)


def not_applicable(topology: Topology, collective: str, multicast: bool = False) -> str | None:
    """Why ``nvls`` does not apply (None when it does)."""
    if topology.num_ranks < 2:
        return "nvls needs at least 2 ranks"
    if not topology.reducing_switches:
        return (f"nvls does not apply to {topology.name}: no switch declares in-network reduction "
                "(reduce: true, docs/topology.md)")
    if reducing_switch(topology, multicast) is not None or (collective == "allreduce" and box_switches(topology)):
        return None
    need = "reduces and multicasts" if multicast else "reduces"
    boxes = " (nor, for allreduce, equal boxes that each have one that reduces and multicasts)" \
        if collective == "allreduce" else ""
    return (f"nvls does not apply to {topology.name}: no switch that {need} has a link to and from every "
            f"rank{boxes} for {collective}")


def _tb(send: int, steps: list[Step]) -> Threadblock:
    return Threadblock(id=0, send=send, recv=send, chan=0, steps=tuple(steps))


def _program(name: str, coll: Collective, gpus: list[Gpu], switch: str, ops: list[SwitchOp],
             nchannels: int = 1) -> Program:
    return Program(name=name, collective=str(coll.name), num_ranks=coll.num_ranks, gpus=tuple(gpus),
                   nchannels=nchannels,
                   inplace=coll.inplace, nchunksperloop=coll.size_chunks, chunk_factor=coll.chunk_factor,
                   switches=(SwitchProgram(switch, tuple(ops)),))


def allreduce_program(n: int, chunks: int, switch: str, inplace: bool = False) -> Program:
    """Pipelined reduce-to-switch + multicast allreduce (module docstring): op j = reduce(all -> all) of chunk j."""
    coll = Collective("allreduce", n, chunks, inplace=inplace)
    everyone = tuple(range(n))
    ops = [SwitchOp("reduce", everyone, everyone, 1, 0) for _ in range(chunks)]
    gpus = []
    for r in range(n):
        steps = [Step("s", "i", j, "i", j) for j in range(chunks)]
        steps += [Step("r", "o", 0, "o", j) for j in range(chunks)]
        gpus.append(Gpu(r, chunks, chunks, 0, (_tb(n, steps),)))
    return _program(f"allreduce-nvls-{n}x{chunks}", coll, gpus, switch, ops)


def reducescatter_program(n: int, chunks: int, switch: str, inplace: bool = False) -> Program:
    """In-switch reducescatter (module docstring): op (k, q) = reduce(all but q -> [q]) of chunk k of piece q."""
    coll = Collective("reducescatter", n, chunks, inplace=inplace)
    order = [(k, q) for k in range(chunks) for q in range(n)]
    ops = [SwitchOp("reduce", tuple(r for r in range(n) if r != q), (q,), 1, 0) for _, q in order]
    gpus = []
    for r in range(n):
        steps = [Step("s", "i", q * chunks + k, "i", q * chunks + k) for k, q in order if q != r]
        steps += [Step("rrc", "i", r * chunks + k, "o", k) for k in range(chunks)]
        gpus.append(Gpu(r, n * chunks, chunks, 0, (_tb(n, steps),)))
    return _program(f"reducescatter-nvls-{n}x{chunks}", coll, gpus, switch, ops)


def nccl_nvls_program(n: int, chunks: int, switch: str, inplace: bool = False) -> Program:
    """NCCL's NVLS allreduce (module docstring): per chunk j, reduce(all -> [j mod N]) then multicast from j mod N
    to the others. ``chunks`` must be a multiple of N."""
    if chunks % n:
        raise SynthError(f"NCCL's NVLS allreduce shards the buffer over the {n} ranks: {chunks} chunks is not a "
                         f"multiple of {n}")
    coll = Collective("allreduce", n, chunks, inplace=inplace)
    everyone = tuple(range(n))
    ops = [SwitchOp("reduce", everyone, (j % n,), 1, 0) for j in range(chunks)]
    ops += [SwitchOp("multicast", (j % n,), tuple(r for r in range(n) if r != j % n), 1, 1) for j in range(chunks)]
    gpus = []
    for r in range(n):
        own = [j for j in range(chunks) if j % n == r]
        # tb 0 sends the input (channel 0), tb 1 receives the reduced shard, tb 2 multicasts each piece of it as
        # soon as it is in (channel 1, after tb 1's step), tb 3 receives the other shards
        tbs = (Threadblock(0, n, -1, 0, tuple(Step("s", "i", j, "i", j) for j in range(chunks))),
               Threadblock(1, -1, n, 0, tuple(Step("r", "o", 0, "o", j, hasdep=True) for j in own)),
               Threadblock(2, n, -1, 1, tuple(Step("s", "o", j, "o", 0, depid=1, deps=k)
                                              for k, j in enumerate(own))),
               Threadblock(3, -1, n, 1, tuple(Step("r", "o", 0, "o", j) for j in range(chunks) if j % n != r)))
        gpus.append(Gpu(r, chunks, chunks, 0, tbs))
    return _program(f"allreduce-nccl-nvls-{n}x{chunks}", coll, gpus, switch, ops, nchannels=2)


def boxes_program(boxes: tuple[tuple[str, tuple[int, ...]], ...], n: int, chunks: int,
                  inplace: bool = False, cross: str | None = None) -> Program:
    """Multi-box allreduce (module docstring): ``boxes`` are (switch name, its ranks) in box order; ``chunks``
    a multiple of the box size L. Switch ``k`` of the program is box ``k``'s (peer ``n + k``). With ``cross``
    (a switch that reduces, linked to every rank: SHARP) the rail's owners reduce chunk ``j`` there
    (op ``reduce(rail -> rail)``, peer ``n + B``) instead of along the chain."""
    size = len(boxes[0][1])
    if chunks % size:
        raise SynthError(f"the multi-box allreduce gives each of a box's {size} ranks a shard: {chunks} chunks is "
                         f"not a multiple of {size}")
    coll = Collective("allreduce", n, chunks, inplace=inplace)
    switches, gpus = [], {}
    for b, (name, members) in enumerate(boxes):
        owner_of = {j: members[j % size] for j in range(chunks)}
        ops = [SwitchOp("reduce", members, (owner_of[j],), 1, 0) for j in range(chunks)]
        ops += [SwitchOp("multicast", (owner_of[j],), tuple(r for r in members if r != owner_of[j]), 1, 1)
                for j in range(chunks)]
        switches.append(SwitchProgram(name, tuple(ops)))
        for g, r in enumerate(members):
            if cross is None:
                gpus[r] = _box_rank(n + b, b, g, [box[1] for box in boxes], r, chunks)
            else:
                gpus[r] = _sharp_rank(n + b, n + len(boxes), g, size, r, chunks)
    if cross is not None:
        rails = [tuple(box[1][j % size] for box in boxes) for j in range(chunks)]
        switches.append(SwitchProgram(cross, tuple(SwitchOp("reduce", rail, rail, 1, 0) for rail in rails)))
    return Program(name=f"allreduce-nvls-boxes-{n}x{chunks}", collective="allreduce", num_ranks=n,
                   gpus=tuple(gpus[r] for r in range(n)), inplace=inplace, nchannels=2,
                   nchunksperloop=coll.size_chunks, chunk_factor=chunks, switches=tuple(switches))


def _box_rank(switch: int, b: int, g: int, boxes: list[tuple[int, ...]], r: int, chunks: int) -> Gpu:
    """Rank ``r``, local index ``g`` of box ``b``: tb 0 sends its input to the box switch (channel 0), tb 1
    receives its shards' box sums, tb 2 runs the chain up (towards box 0), tb 3 down, tb 4 multicasts the totals
    (channel 1, each after its chunk's last chain step), tb 5 receives the other shards' totals."""
    size, last = len(boxes[0]), len(boxes) - 1
    own = [j for j in range(chunks) if j % size == g]
    up_peer = boxes[b - 1][g] if b > 0 else -1        # towards box 0
    down_peer = boxes[b + 1][g] if b < last else -1   # away from box 0
    box_sum = [Step("r", "o", 0, "o", j, hasdep=True) for j in own]
    if b == 0:   # the chain's head: adds the rail's sum to its own, then sends the total down
        up = [Step("rrc", "o", j, "o", j, depid=1, deps=k, hasdep=True) for k, j in enumerate(own)]
        down = [Step("s", "o", j, "o", 0, depid=2, deps=k) for k, j in enumerate(own)]
        done = 2
    elif b < last:   # the chain's middle: adds its box sum on the way up, keeps and forwards the total down
        up = [Step("rrs", "o", j, "o", 0, depid=1, deps=k) for k, j in enumerate(own)]
        down = [Step("rcs", "o", 0, "o", j, hasdep=True) for j in own]
        done = 3
    else:   # the chain's tail: sends its box sum up, receives the total
        up = [Step("s", "o", j, "o", 0, depid=1, deps=k) for k, j in enumerate(own)]
        down = [Step("r", "o", 0, "o", j, hasdep=True) for j in own]
        done = 3
    if b == 0 and last == 0:   # one box: no chain
        up, down, done = [], [], 1
    tbs = [Threadblock(0, switch, -1, 0, tuple(Step("s", "i", j, "i", j) for j in range(chunks))),
           Threadblock(1, -1, switch, 0, tuple(box_sum))]
    if up:
        tbs.append(Threadblock(2, up_peer, down_peer, 0, tuple(up)))
        tbs.append(Threadblock(3, down_peer, up_peer, 1, tuple(down)))
    tid = len(tbs)
    tbs.append(Threadblock(tid, switch, -1, 1, tuple(Step("s", "o", j, "o", 0, depid=done, deps=k)
                                                     for k, j in enumerate(own))))
    tbs.append(Threadblock(tid + 1, -1, switch, 1, tuple(Step("r", "o", 0, "o", j)
                                                         for j in range(chunks) if j % size != g)))
    return Gpu(r, chunks, chunks, 0, tuple(tbs))


def _sharp_rank(switch: int, cross: int, g: int, size: int, r: int, chunks: int) -> Gpu:
    """Rank ``r``, local index ``g``, with a SHARP switch between the boxes: as :func:`_box_rank`, but tb 2 sends
    each box sum of its shards to the cross switch (after its box sum) and tb 3 receives the rail's totals, which
    tb 4 multicasts in the box as each arrives."""
    own = [j for j in range(chunks) if j % size == g]
    tbs = (Threadblock(0, switch, -1, 0, tuple(Step("s", "i", j, "i", j) for j in range(chunks))),
           Threadblock(1, -1, switch, 0, tuple(Step("r", "o", 0, "o", j, hasdep=True) for j in own)),
           Threadblock(2, cross, -1, 0, tuple(Step("s", "o", j, "o", 0, depid=1, deps=k) for k, j in enumerate(own))),
           Threadblock(3, -1, cross, 0, tuple(Step("r", "o", 0, "o", j, hasdep=True) for j in own)),
           Threadblock(4, switch, -1, 1, tuple(Step("s", "o", j, "o", 0, depid=3, deps=k) for k, j in enumerate(own))),
           Threadblock(5, -1, switch, 1, tuple(Step("r", "o", 0, "o", j) for j in range(chunks) if j % size != g)))
    return Gpu(r, chunks, chunks, 0, tbs)


BUILDERS = {"allreduce": allreduce_program, "reducescatter": reducescatter_program}


def _candidates(topology: Topology, node: int, size_bytes: float, step: int, per_chunk: int,
                runtime_chunks: bool) -> list[int]:
    """Chunk counts to simulate: multiples of ``step`` around the minimiser of the pipeline's α-β time with the
    slowest rank<->switch link's α and bw. A rank sends ``m = per_chunk - 1`` (reducescatter: N-1, the owner's
    piece stays) or 1 (allreduce) messages per count and the last op's result, SIZE/(per_chunk·C), trails:
    ``T(C) ≈ m·C·α + SIZE/(per_chunk·C·bw) + const``, so ``C* = sqrt(SIZE / (per_chunk·m·α·bw))``, which is
    ``sqrt(SIZE/(α·bw))`` for allreduce (module docstring). With ``runtime_chunks`` each is moved to the nearest
    count whose ``per_chunk``·C chunks divide the SIZE buffer (an MSCCL runtime's rule, kept for the same
    buffers) where one lies within a factor 2."""
    links = [topology.link(r, node) for r in topology.ranks] + [topology.link(node, r) for r in topology.ranks]
    alpha = max(link.alpha for link in links if link is not None)
    bw = min(link.bw for link in links if link is not None) * 1e3   # bytes per µs
    top = max(1, MAX_CHUNKS // step)
    messages = max(1, per_chunk - 1)
    star = math.sqrt(size_bytes / (per_chunk * messages * alpha * bw)) / step if alpha > 0 else top
    raw = {max(1, min(top, round(star * f))) for f in (0.5, 0.71, 0.85, 1.0, 1.2, 1.41, 2.0)}
    if runtime_chunks:
        raw = {_dividing(c, top, lambda k: runtime_divides(per_chunk * k * step, size_bytes)) for c in raw}
    return sorted(c * step for c in raw)


def _dividing(c: int, top: int, divides) -> int:
    """The count nearest ``c`` (within a factor 2, at most ``top``; the smaller on ties) that ``divides``, else c."""
    for d in range(0, c + 1):
        for k in (c - d, c + d):
            if 1 <= k <= top and c / 2 <= k <= 2 * c and divides(k):
                return k
    return c


def best_program(inst: Instance, build: Callable[[int], Program], node: int, step: int = 1,
                 tag: str = "nvls") -> tuple[Program, float, dict]:
    """The fastest simulated program ``build(chunks)`` over the candidate chunk counts (or ``--chunks``), with
    the links of switch ``node`` as the model's, doubling (halving) past the largest (smallest) count while that
    end is the fastest (the model's link need not be the bottleneck, e.g. NICs between boxes): (program,
    simulated µs, notes). Ties go to the fewer chunks. Deterministic: simulated times only."""
    from synth.simulation import simulate

    topology, coll = inst.topology, inst.collective
    pinned = inst.options.chunks
    if pinned is not None:
        counts = [pinned]
    else:
        per_chunk = coll.size_chunks // coll.chunk_factor   # chunks per count: N for reducescatter, else 1
        counts = _candidates(topology, node, inst.size_bytes, step, per_chunk, inst.options.runtime_chunks)
    best = None
    timed: dict[int, float] = {}
    todo = list(counts)
    while todo:
        c = todo.pop(0)
        program = build(c)
        t = simulate(program, topology, inst.size_bytes, record_events=False).time_us
        timed[c] = t
        if best is None or t < best[1] or (t == best[1] and c < best[2]):
            best = (program, t, c)
        if not todo and pinned is None:   # the best at an end of the range: go on past it while it improves
            low, high = min(timed), max(timed)
            if best[2] == high and 2 * high <= MAX_CHUNKS and len(timed) > 1:
                todo.append(2 * high)
            elif best[2] == low and low // 2 >= step and (low // 2) % step == 0 and len(timed) > 1:
                todo.append(low // 2)
    program, t, c = best
    return program, t, {"switches": [sw.name for sw in program.switches],
                        "chunks_tried": {str(k): v for k, v in sorted(timed.items())}, "chunks": c, "algorithm": tag}


def schedule_of(inst: Instance, program: Program, time_us: float, method: str, notes: dict) -> Schedule:
    """A schedule that carries its ready-made program (no rank-to-rank transfers: the steps are in-network)."""
    coll = replace(inst.collective, chunk_factor=program.chunk_factor or 1)
    return Schedule(coll, inst.topology.name, (), method=method, size_bytes=inst.size_bytes,
                    predicted_time_us=time_us, notes=notes, program=program.with_(predicted_time_us=time_us))


def synthesize(inst: Instance) -> Schedule:
    """The in-network program of ``inst``'s collective on its reducing switch (module docstring)."""
    name = str(inst.collective.name)
    reason = not_applicable(inst.topology, name)
    if reason is not None:
        raise SynthError(reason)
    if name not in BUILDERS:   # pragma: no cover - guarded by the MethodSpec
        raise SynthError(f"nvls does not support {name}")
    topology, n, inplace = inst.topology, inst.topology.num_ranks, inst.collective.inplace
    node = reducing_switch(topology)
    boxes = box_switches(topology) if name == "allreduce" else None
    found = []   # (time, program, notes) of each shape that applies; the fastest simulated is kept
    if node is not None:
        switch = str(topology.node_name(node))
        found.append(best_program(inst, lambda c: BUILDERS[name](n, c, switch, inplace), node)[::-1])
    if boxes is not None:   # allreduce over boxes, each with its own switch, joined by SHARP or rail chains
        named = named_boxes(boxes, topology)
        cross = None if node is None else str(topology.node_name(node))
        found.append(best_program(inst, lambda c: boxes_program(named, n, c, inplace, cross), boxes[0][0],
                                  step=len(named[0][1]),
                                  tag="nvls-boxes-sharp" if cross else "nvls-boxes-chain")[::-1])
    notes, t, program = min(found, key=lambda f: f[1])
    if len(found) > 1:
        notes = {**notes, "shapes_tried": {f[0]["algorithm"]: f[1] for f in found}}
    return schedule_of(inst, program, t, "nvls", notes)


def nccl_nvls(inst: Instance) -> Schedule | None:
    """NCCL's NVLS allreduce on ``inst``: on one switch that reduces and multicasts for every rank,
    :func:`nccl_nvls_program`; over boxes that each have one, NVLS in the box and the rail chain between boxes
    (:func:`boxes_program`, NCCL's NVLS_TREE, whose tree over two boxes is this chain; over more it is a double
    binary tree, which this chain stands in for). None where neither applies, or not an allreduce."""
    topology, n, inplace = inst.topology, inst.topology.num_ranks, inst.collective.inplace
    if str(inst.collective.name) != "allreduce" or n < 2:
        return None
    node = reducing_switch(topology, multicast=True)
    if node is not None:
        if inst.options.chunks is not None and inst.options.chunks % n:
            return None
        switch = str(topology.node_name(node))
        program, t, notes = best_program(inst, lambda c: nccl_nvls_program(n, c, switch, inplace), node, step=n,
                                         tag="nccl-nvls")
        return schedule_of(inst, program, t, "nccl", notes)
    boxes = box_switches(topology)
    if boxes is None or (inst.options.chunks is not None and inst.options.chunks % len(boxes[0][1])):
        return None
    named = named_boxes(boxes, topology)
    program, t, notes = best_program(inst, lambda c: boxes_program(named, n, c, inplace), boxes[0][0],
                                     step=len(named[0][1]), tag="nccl-nvls-tree")
    return schedule_of(inst, program, t, "nccl", notes)


METHOD = MethodSpec("nvls", synthesize, frozenset(BUILDERS),
                    "in-network reduction (NVLS/SHARP): pipelined reduce-to-switch + multicast allreduce (one switch, "
                    "or one per box and rail chains), in-switch reducescatter")

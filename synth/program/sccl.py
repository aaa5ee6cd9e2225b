"""Import an SCCL algorithm: the ``.msccl.json`` msccl-tools writes for an ``Algorithm`` (docs/programs.md).

An algorithm is a list of synchronous steps, each a set of sends ``[addr, src, dst]``: in that step rank
``dst`` gets the chunk at address ``addr`` that ``src`` held when the step began. ``input_map`` and
``output_map`` name, per rank, the addresses its input and output buffers hold; an address in neither
lives in scratch. Addresses of a rank's buffer are its sorted map, so slot ``k`` of ``i`` holds the
``k``-th smallest input address (msccl-tools' own XML export lays them out the same way). When the
collective is *combining* (several of its chunks share one address: reduce, allreduce, reduce-scatter),
a chunk arriving at a rank that already holds that address is reduced into it; otherwise a second
arrival is a redundant copy and lands in a scratch slot of its own.

The lowering gives every rank one threadblock per peer and direction on channel 0, in the order of the
steps, and orders what the steps' synchrony ordered with dependencies: a send waits for the receive
that brought its data, a receive waits for the reads and the write of the slot it writes (extra
dependencies become ``nop`` steps). Sends of one step on one link whose slots are contiguous at both
ends become one step. The input buffer is never written: a reduction accumulates in the output slot
(or a scratch slot on a relaying rank), its first operand read from ``i``. A rank whose output address
it already holds in its input copies it at the start.

The collective comes from the algorithm's collective name (``Allgather(n=8)`` -> allgather; rooted ones
take their root from the chunks' pre/postcondition); one synth does not know (Scan, multi-root) is
``custom`` and needs ``-c``. The embedded topology becomes the program's fabric
(:mod:`synth.topology.msccl_tools`), so ``simulate`` needs no ``-t``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from synth.collectives import ROOTED, CollectiveKind
from synth.errors import SynthError
from synth.program.ir import Fabric, Gpu, Program, Step, Threadblock

#: msccl-tools collective name prefix -> synth collective (``build_collective`` names, e.g. ``Reduce(n=8,root=0)``).
SCCL_COLLECTIVES = {"Allgather": CollectiveKind.ALLGATHER, "Allreduce": CollectiveKind.ALLREDUCE,
                    "Alltoall": CollectiveKind.ALLTOALL, "ReduceScatter": CollectiveKind.REDUCESCATTER,
                    "Broadcast": CollectiveKind.BROADCAST, "Reduce": CollectiveKind.REDUCE,
                    "Gather": CollectiveKind.GATHER, "Scatter": CollectiveKind.SCATTER}
#: Most sends one algorithm may have here (a guard against hostile files; SCCL's are far smaller).
MAX_SENDS = 1_000_000
MAX_RANKS = 4096


def is_sccl_algorithm(doc: Any) -> bool:
    """Is ``doc`` a decoded msccl-tools object (``msccl_type`` present)? Algorithms load; others are refused."""
    return isinstance(doc, dict) and "msccl_type" in doc


def _fail(source: str, problem: str) -> SynthError:
    return SynthError(f"{source}: SCCL algorithm: {problem}")


def _int(value: Any, what: str, source: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise _fail(source, f"{what} must be an integer {bound}, got {value!r}")
    return value


def _address_map(doc: Any, key: str, n: int, source: str) -> dict[int, list[int]]:
    raw = doc.get(key)
    if not isinstance(raw, dict):
        raise _fail(source, f"'{key}' must be an object rank -> [addresses]")
    out: dict[int, list[int]] = {}
    for rank_text, addrs in raw.items():
        try:
            rank = int(rank_text)
        except ValueError:
            raise _fail(source, f"'{key}' key {rank_text!r} is not a rank") from None
        _int(rank, f"'{key}' rank", source, 0, n - 1)
        if not isinstance(addrs, list):
            raise _fail(source, f"'{key}'[{rank}] must be a list of addresses")
        out[rank] = sorted({_int(a, f"'{key}'[{rank}] address", source) for a in addrs})
    return out


def _check_map_addresses(doc: Any, chunks: int, maps: dict[str, dict[int, list[int]]], source: str) -> None:
    """Every address of the input and output maps is one of the collective's chunks, cut into the instance's
    ``chunks`` pieces as msccl-tools' ``chunk_up`` does (address ``a`` becomes ``a·chunks + k``, ``k < chunks``): a
    map naming any other address describes a buffer no rank fills."""
    addresses = {_int(c.get("addr"), "collective chunk addr", source, 0) for c in doc["collective"]["chunks"]}
    for key, mapping in maps.items():
        for rank, addrs in mapping.items():
            stray = [a for a in addrs if a // chunks not in addresses]
            if stray:
                raise _fail(source, f"'{key}'[{rank}] names address {stray[0]}, which is no chunk of the collective "
                                    f"(its chunks' addresses times instance.chunks = {chunks}, plus 0 .. {chunks - 1})")


def _collective(doc: Any, source: str) -> tuple[str, int, int, bool]:
    """(synth collective or ``custom``, root, ranks, combining) of the algorithm's collective object."""
    coll = doc.get("collective")
    if not (isinstance(coll, dict) and coll.get("msccl_type") == "collective"):
        raise _fail(source, "'collective' must be an msccl-tools collective object")
    n = _int(coll.get("nodes"), "collective.nodes", source, 1, MAX_RANKS)
    chunks = coll.get("chunks")
    if not isinstance(chunks, list) or not chunks or not all(isinstance(c, dict) for c in chunks):
        raise _fail(source, "collective.chunks must be a non-empty list of chunk objects")
    addrs = [c.get("addr") for c in chunks]
    combining = len(set(map(str, addrs))) < len(addrs)
    name = str(coll.get("name", ""))
    synth_name = SCCL_COLLECTIVES.get(name.split("(", 1)[0], "custom")
    root = 0
    if synth_name in ROOTED:
        # the root is the one rank of a chunk's precondition where only the root's input counts, else of its
        # postcondition
        where = "pre" if CollectiveKind(synth_name).shape.from_root else "post"
        side = chunks[0].get(where)
        if not (isinstance(side, list) and len(side) == 1):
            raise _fail(source, f"{name}: chunk 0's {where}condition must name the one root")
        root = _int(side[0], "root", source, 0, n - 1)
    return synth_name, root, n, combining


@dataclass(eq=False)   # compared and hashed by identity: dependencies are sets of ops
class _Op:
    """One step of the program before threadblock step numbers exist."""

    rank: int
    tb: tuple[str, int]          # ("send", peer), ("recv", peer) or ("copy", -1)
    type: str
    srcbuf: str = "i"
    srcoff: int = 0
    dstbuf: str = "o"
    dstoff: int = 0
    cnt: int = 1
    deps: list[_Op] = field(default_factory=list)
    depended: bool = False


class _Lowering:
    """State of one algorithm's lowering (module docstring)."""

    def __init__(self, n: int, inputs: dict[int, list[int]], outputs: dict[int, list[int]], combining: bool):
        self.combining = combining
        self.input_slot = {r: {a: k for k, a in enumerate(inputs.get(r, []))} for r in range(n)}
        self.output_slot = {r: {a: k for k, a in enumerate(outputs.get(r, []))} for r in range(n)}
        self.scratch: dict[int, dict[object, int]] = {r: {} for r in range(n)}
        self.at: dict[int, dict[int, tuple[str, int]]] = {r: {a: ("i", k) for a, k in self.input_slot[r].items()}
                                                           for r in range(n)}
        self.writer: dict[tuple[int, str, int], _Op] = {}
        self.readers: dict[tuple[int, str, int], list[_Op]] = defaultdict(list)
        self.ops: list[_Op] = []

    def scratch_slot(self, rank: int, key: object) -> tuple[str, int]:
        slots = self.scratch[rank]
        if key not in slots:
            slots[key] = len(slots)
        return "s", slots[key]

    def home(self, rank: int, addr: int) -> tuple[str, int]:
        """Where ``rank`` keeps the value of ``addr`` it computes or receives (never ``i``)."""
        if addr in self.output_slot[rank]:
            return "o", self.output_slot[rank][addr]
        return self.scratch_slot(rank, addr)

    def add(self, op: _Op, reads: list[tuple[str, int]], writes: list[tuple[str, int]]) -> _Op:
        """Record ``op``, its dependencies on earlier writers (and, for writes, readers) of its slots."""
        deps: list[_Op] = []
        for buf, off in reads:
            for k in range(op.cnt):
                w = self.writer.get((op.rank, buf, off + k))
                if w is not None:
                    deps.append(w)
        for buf, off in writes:
            for k in range(op.cnt):
                key = (op.rank, buf, off + k)
                if key in self.writer:
                    deps.append(self.writer[key])
                deps.extend(self.readers.pop(key, []))
                self.writer[key] = op
        for buf, off in reads:
            for k in range(op.cnt):
                self.readers[(op.rank, buf, off + k)].append(op)
        # ops of the same threadblock are ordered by it already
        op.deps = [d for d in dict.fromkeys(deps) if d.tb != op.tb]
        self.ops.append(op)
        return op


def _sends(doc: Any, n: int, source: str) -> list[list[tuple[int, int, int]]]:
    steps = doc.get("steps")
    if not isinstance(steps, list):
        raise _fail(source, "'steps' must be a list of step objects")
    out, total = [], 0
    for k, step in enumerate(steps):
        if not (isinstance(step, dict) and isinstance(step.get("sends"), list)):
            raise _fail(source, f"steps[{k}] must be a step object with a 'sends' list")
        sends = []
        for j, send in enumerate(step["sends"]):
            if not (isinstance(send, list) and len(send) == 3):
                raise _fail(source, f"steps[{k}].sends[{j}] must be [addr, src, dst]")
            addr = _int(send[0], f"steps[{k}].sends[{j}] addr", source)
            src = _int(send[1], f"steps[{k}].sends[{j}] src", source, 0, n - 1)
            dst = _int(send[2], f"steps[{k}].sends[{j}] dst", source, 0, n - 1)
            if src == dst:
                raise _fail(source, f"steps[{k}].sends[{j}] sends from rank {src} to itself")
            sends.append((addr, src, dst))
        total += len(sends)
        if total > MAX_SENDS:
            raise _fail(source, f"more than {MAX_SENDS} sends")
        out.append(sorted(sends))
    return out


def _runs(items: list[tuple]) -> list[list[tuple]]:
    """Group one link's (srcbuf, srcoff, dstbuf, dstoff, type, operand) transfers, sorted, into runs of plain
    receives (``r``) contiguous at both ends: each run is one message."""
    runs: list[list[tuple]] = []
    for item in sorted(items, key=lambda t: (t[0], t[1], t[2], t[3])):
        if runs:
            last = runs[-1][-1]
            if (item[0], item[2]) == (last[0], last[2]) and item[1] == last[1] + 1 and item[3] == last[3] + 1 \
                    and item[4] == last[4] == "r":
                runs[-1].append(item)
                continue
        runs.append([item])
    return runs


def _lower(low: _Lowering, steps: list[list[tuple[int, int, int]]], source: str) -> None:
    for k, sends in enumerate(steps):
        # low.at stays what each rank held when the step began (sends read that); arrivals wait in `landed`
        landed: dict[tuple[int, int], tuple[str, int]] = {}
        by_link: dict[tuple[int, int], list[tuple]] = defaultdict(list)
        arrivals: dict[tuple[int, int], int] = defaultdict(int)
        for addr, src, dst in sends:
            if addr not in low.at[src]:
                raise _fail(source, f"step {k + 1} sends address {addr} from rank {src}, which does not hold it then")
            sbuf, soff = low.at[src][addr]
            held = landed.get((dst, addr), low.at[dst].get(addr))
            if held is None:
                (dbuf, doff), kind, operand = low.home(dst, addr), "r", None
            elif low.combining:
                (dbuf, doff), kind, operand = low.home(dst, addr), "rrc", held
            else:   # a copy the rank already has: keep the message apart from the data
                arrivals[(dst, addr)] += 1
                (dbuf, doff), kind, operand = low.scratch_slot(dst, ("dup", addr, k, arrivals[(dst, addr)])), "r", None
            landed[(dst, addr)] = (dbuf, doff)
            by_link[(src, dst)].append((sbuf, soff, dbuf, doff, kind, operand))
        pairs = []
        for (src, dst), items in sorted(by_link.items()):
            for run in (_runs(items) if not low.combining else [[item] for item in items]):
                sbuf, soff, dbuf, doff, kind, operand = run[0]
                low.add(_Op(src, ("send", dst), "s", sbuf, soff, dbuf, doff, len(run)), [(sbuf, soff)], [])
                pairs.append((dst, src, run))
        for dst, src, run in pairs:  # receives after every send of the step: sends read the old values
            sbuf, soff, dbuf, doff, kind, operand = run[0]
            if kind == "rrc":
                obuf, ooff = operand
                low.add(_Op(dst, ("recv", src), "rrc", obuf, ooff, dbuf, doff, 1), [(obuf, ooff)], [(dbuf, doff)])
            else:
                low.add(_Op(dst, ("recv", src), "r", sbuf, soff, dbuf, doff, len(run)), [], [(dbuf, doff)])
        for (rank, addr), slot in landed.items():
            low.at[rank][addr] = slot


def _finish_outputs(low: _Lowering, n: int) -> None:
    """Copy into ``o`` every output address a rank holds only in ``i`` (its own piece, an unreduced value)."""
    for r in range(n):
        for addr, slot in sorted(low.output_slot[r].items(), key=lambda item: item[1]):
            buf, off = low.at[r].get(addr, (None, -1))
            if buf == "i":
                low.add(_Op(r, ("copy", -1), "cpy", "i", off, "o", slot, 1), [("i", off)], [("o", slot)])


def _threadblocks(low: _Lowering, n: int) -> list[tuple[Threadblock, ...]]:
    """Number each rank's threadblocks (send peers, then receive peers, then copies) and their steps (``nop``
    steps carry dependencies past the first), then write the steps."""
    order = {"send": 0, "recv": 1, "copy": 2}
    per_rank: dict[int, dict[tuple[str, int], list[_Op]]] = {r: defaultdict(list) for r in range(n)}
    for op in low.ops:
        per_rank[op.rank][op.tb].append(op)
    tb_id: dict[tuple[int, tuple[str, int]], int] = {}
    index: dict[int, int] = {}
    for r in range(n):
        for t, key in enumerate(sorted(per_rank[r], key=lambda key: (order[key[0]], key[1]))):
            tb_id[(r, key)] = t
            position = 0
            for op in per_rank[r][key]:
                position += max(0, len(op.deps) - 1)
                index[id(op)] = position
                position += 1
                for dep in op.deps:
                    dep.depended = True
    result = []
    for r in range(n):
        tbs = []
        for key in sorted(per_rank[r], key=lambda key: tb_id[(r, key)]):
            steps: list[Step] = []
            for op in per_rank[r][key]:
                links = [(tb_id[(r, d.tb)], index[id(d)]) for d in op.deps]
                for depid, deps in links[1:]:
                    steps.append(Step("nop", "i", 0, "o", 0, 0, depid, deps, False))
                depid, deps = links[0] if links else (-1, -1)
                steps.append(Step(op.type, op.srcbuf, op.srcoff, op.dstbuf, op.dstoff, op.cnt, depid, deps,
                                  op.depended))
            kind, peer = key
            tbs.append(Threadblock(id=tb_id[(r, key)], send=peer if kind == "send" else -1,
                                   recv=peer if kind == "recv" else -1, chan=0, steps=tuple(steps)))
        result.append(tuple(tbs))
    return result


def program_from_sccl(doc: Any, source: str = "<sccl>") -> Program:
    """The synth :class:`Program` of a decoded SCCL algorithm (module docstring); SynthError naming the problem."""
    kind = doc.get("msccl_type") if isinstance(doc, dict) else None
    if kind != "algorithm":
        raise SynthError(f"{source}: an msccl-tools {kind!r} object, not an algorithm (an msccl-tools topology is "
                         "read with -t FILE or synth topology import)")
    synth_name, root, n, combining = _collective(doc, source)
    instance = doc.get("instance")
    if not isinstance(instance, dict):
        raise _fail(source, "'instance' must be an msccl-tools instance object")
    if instance.get("pipeline") is not None:
        raise _fail(source, f"pipelined instances (pipeline={instance.get('pipeline')!r}) are not supported, as in "
                            "msccl-tools' own XML export")
    chunks = _int(instance.get("chunks", 1), "instance.chunks", source, 1)
    inputs = _address_map(doc, "input_map", n, source)
    outputs = _address_map(doc, "output_map", n, source)
    _check_map_addresses(doc, chunks, {"input_map": inputs, "output_map": outputs}, source)
    low = _Lowering(n, inputs, outputs, combining)
    _lower(low, _sends(doc, n, source), source)
    _finish_outputs(low, n)
    tbs = _threadblocks(low, n)
    gpus = tuple(Gpu(id=r, i_chunks=len(inputs.get(r, [])), o_chunks=len(outputs.get(r, [])),
                     s_chunks=len(low.scratch[r]), threadblocks=tbs[r]) for r in range(n))
    fabric, topo_name = _fabric(doc.get("topology"), n, source)
    name = doc.get("name")
    return Program(
        name=name if isinstance(name, str) and name else "sccl", collective=synth_name, num_ranks=n, gpus=gpus,
        root=root, nchannels=1, nchunksperloop=max((max(g.i_chunks, g.o_chunks) for g in gpus), default=1) or 1,
        topology=topo_name, chunk_factor=chunks, fabric=fabric,
        extra={"imported_from": "msccl-tools SCCL algorithm", "sccl_steps": len(doc["steps"]),
               "sccl_instance": {k: v for k, v in instance.items() if k != "msccl_type"}},
    )


def _fabric(topology: Any, n: int, source: str) -> tuple[Fabric | None, str | None]:
    """The program's fabric: the algorithm's embedded topology at the import defaults (None if it has none)."""
    from synth.topology.importers import topology_from_msccl
    from synth.topology.msccl_tools import is_msccl_object

    if not is_msccl_object(topology, "topology"):
        return None, None
    topo = topology_from_msccl(topology, f"{source}: topology")
    if topo.num_ranks != n:
        raise _fail(source, f"its topology has {topo.num_ranks} GPUs but its collective {n} ranks")
    return Fabric(name=topo.name, sha256=topo.sha256, source="generated", topology=topo), topo.name

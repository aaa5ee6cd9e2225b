"""Read an msccl-tools (SCCL) topology: the JSON its ``MSCCLEncoder`` writes for a ``Topology``.

The object (docs/topology.md, "msccl-tools topologies") is ``{"msccl_type": "topology", "name": str,
"links": [[int]], "switches": [[srcs, dsts, bw, name]]}``. ``links[dst][src]`` is the number of
link units from ``src`` to ``dst`` (msccl-tools ``Topology.link``); its DGX-1 counts NVLinks (2 or 1
per pair) and its DGX A100 puts 12 between every pair, the NVLinks each GPU has into the NVSwitches.
A switch ``(srcs, dsts, bw, name)`` caps the units all of ``srcs`` send to all of ``dsts`` per round.

The counts become a :class:`~synth.topology.importers.BoxFabric` of NVLinks, so rates, alphas, the
NVSwitch reading of an all-equal matrix and ``--set`` overrides are those of every other import. Switch
constraints are read only in the one shape a crossbar has (each GPU's traffic out to all the others and in
from all the others, capped alike, as msccl-tools' ``HubAndSpoke``): the GPU then links to one NVSwitch at
that many units. Any other constraint cannot be expressed as links and is refused.
"""

from __future__ import annotations

import json
import math
from typing import Any

from synth.errors import SynthError

MSCCL_TYPE = "topology"
#: Most GPUs an msccl-tools topology may have here (the other importers' limit).
MAX_GPUS = 4096


def is_msccl_object(doc: Any, kind: str | None = None) -> bool:
    """Is ``doc`` a decoded msccl-tools object (of ``msccl_type`` ``kind``, when given)?"""
    return isinstance(doc, dict) and "msccl_type" in doc and (kind is None or doc.get("msccl_type") == kind)


def looks_like_msccl_topology(text: str) -> bool:
    """Cheap content test for format detection: JSON that names ``"msccl_type": "topology"`` at its top."""
    head = text.lstrip()
    if not head.startswith("{"):
        return False
    try:
        return is_msccl_object(json.loads(text), MSCCL_TYPE)
    except (ValueError, RecursionError):
        return False


def _count(value: Any, where: str, source: str) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
            or value != int(value)):
        raise SynthError(f"{source}: {where} must be a non-negative whole number, got {value!r}")
    return int(value)


def link_counts(doc: Any, source: str = "msccl-tools topology") -> tuple[str, list[list[int]], list[int]]:
    """(name, symmetric GPU-GPU unit counts ``counts[i][j]``, units per GPU into a crossbar switch) of a
    decoded msccl-tools topology; SynthError naming the first problem."""
    if not is_msccl_object(doc, MSCCL_TYPE):
        raise SynthError(f"{source}: not an msccl-tools topology (expected \"msccl_type\": \"topology\")")
    name, links, switches = doc.get("name"), doc.get("links"), doc.get("switches", [])
    if not isinstance(name, str) or not name:
        raise SynthError(f"{source}: 'name' must be a non-empty string")
    if not isinstance(links, list) or not links or not all(isinstance(row, list) for row in links):
        raise SynthError(f"{source}: 'links' must be a square matrix (a list of rows)")
    n = len(links)
    if n > MAX_GPUS:
        raise SynthError(f"{source}: {n} GPUs; the limit is {MAX_GPUS}")
    if any(len(row) != n for row in links):
        raise SynthError(f"{source}: 'links' must be {n} x {n}, a row has {next(len(r) for r in links if len(r) != n)}")
    counts = [[_count(links[dst][src], f"links[{dst}][{src}]", source) for dst in range(n)] for src in range(n)]
    for i in range(n):
        if counts[i][i]:
            raise SynthError(f"{source}: links[{i}][{i}] = {counts[i][i]}: a GPU has no link to itself")
        for j in range(i + 1, n):
            if counts[i][j] != counts[j][i]:
                raise SynthError(f"{source}: links are not symmetric ({i}->{j} has {counts[i][j]} units, {j}->{i} "
                                 f"{counts[j][i]}); synth imports only symmetric msccl-tools topologies")
    switch_units = _crossbar(switches, n, source)
    if any(switch_units):
        counts = [[0] * n for _ in range(n)]   # the crossbar carries all GPU-GPU traffic
    return name, counts, switch_units


def _crossbar(switches: Any, n: int, source: str) -> list[int]:
    """Units per GPU into one crossbar, from switch constraints in the hub-and-spoke shape (all zero: none)."""
    if not isinstance(switches, list):
        raise SynthError(f"{source}: 'switches' must be a list of [srcs, dsts, bw, name]")
    if not switches:
        return [0] * n
    out: dict[int, int] = {}
    into: dict[int, int] = {}
    for k, entry in enumerate(switches):
        if not (isinstance(entry, list) and len(entry) == 4 and all(isinstance(x, list) for x in entry[:2])):
            raise SynthError(f"{source}: switches[{k}] must be [srcs, dsts, bw, name]")
        srcs, dsts, bw = entry[0], entry[1], _count(entry[2], f"switches[{k}] bw", source)
        if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < n for x in srcs + dsts):
            raise SynthError(f"{source}: switches[{k}] names a GPU outside 0..{n - 1}")
        if len(srcs) == 1 and sorted(dsts) == [r for r in range(n) if r != srcs[0]]:
            out[srcs[0]] = bw
        elif len(dsts) == 1 and sorted(srcs) == [r for r in range(n) if r != dsts[0]]:
            into[dsts[0]] = bw
        else:
            raise SynthError(f"{source}: switches[{k}] ({entry[3]!r}) caps {len(srcs)} GPU(s) to {len(dsts)}; synth "
                             "reads only per-GPU caps to and from all the others (a crossbar, msccl-tools HubAndSpoke)")
    for r in range(n):
        if out.get(r) != into.get(r) or r not in out:
            raise SynthError(f"{source}: GPU {r} needs one switch cap out to all others and an equal one in from all "
                             f"others (out {out.get(r)}, in {into.get(r)}); synth reads only that crossbar shape")
    return [out[r] for r in range(n)]

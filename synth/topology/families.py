"""Named hardware boxes and a seeded, public family of generated fabrics (benchmarks/bench_fabrics.py).

Every builder returns a validated :class:`Topology` (the generators' checks). The box numbers are the
built-ins' (docs/topology.md, built-ins, ``topologies/make_reference.py``), so that
``mi250_boxes(2, 16)``, ``dgx_a100_boxes(2)`` and ``dgx_h100_boxes(2)`` have the links of
``mi250-2node``, ``dgx-a100-2node`` and ``dgx-h100-2node``:

- MI250: 16 GCDs; xGMI link count (the matrix below, as ``topologies/mi250.yaml``) x 50 GB/s per link per
  direction (AMD CDNA 2 architecture white paper: an Infinity Fabric link is 100 GB/s peak, both
  directions together); alpha 0.5 us (assumed, as the built-in ``mi250``); every GCD straight to one IB
  switch at the given NIC rate (docs/topology.md: 16 GB/s for mi250-2node), IB alpha 2 us (assumed, as
  dgx-a100-2node).
- DGX A100: 8 A100 on an NVSwitch at 300 GB/s each way (NVIDIA DGX A100 system architecture white paper:
  600 GB/s NVLink per GPU, both directions), alpha 0.7 us; one 25 GB/s NIC per GPU (ConnectX-6 HDR
  200 Gb/s), NIC i on IB switch ``ib{i % 2}``, alpha 2 us on IB (docs/topology.md, built-ins).
- DGX H100: 8 H100 on an NVSwitch at 450 GB/s each way (NVIDIA DGX H100: 900 GB/s NVLink per GPU, both
  directions), alpha 0.7 us (assumed, as A100); 8 x 50 GB/s NICs (ConnectX-7 NDR 400 Gb/s), alpha 1 us
  on IB (docs/topology.md, built-ins).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from synth.errors import SynthError
from synth.topology import generators as gen
from synth.topology.checks import check_topology
from synth.topology.model import Topology

# xGMI link count between the 16 GCDs of an AMD MI250 box (4 = the two GCDs of one package; 7 links per
# GCD), as in topologies/mi250.yaml.
MI250_XGMI: tuple[tuple[int, ...], ...] = (
    (0, 4, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0),
    (4, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0),
    (0, 0, 0, 4, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0),
    (0, 0, 4, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0),
    (2, 0, 0, 0, 0, 4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    (0, 1, 0, 0, 4, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
    (0, 0, 1, 0, 1, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0),
    (0, 0, 0, 2, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    (1, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 2, 0, 0, 0),
    (0, 1, 1, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 1, 0, 0),
    (0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 1, 0),
    (0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 2),
    (0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 4, 1, 0),
    (0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 4, 0, 1, 1),
    (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 4),
    (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 4, 0),
)
XGMI_GBPS = 50.0      # per xGMI link per direction
MI250_ALPHA = 0.5     # xGMI alpha, assumed (the built-in mi250's)
MI250_IB_ALPHA = 2.0  # assumed, as dgx-a100-2node
A100_NVSWITCH_GBPS, A100_NIC_GBPS, A100_IB_ALPHA = 300.0, 25.0, 2.0
H100_NVSWITCH_GBPS, H100_NIC_GBPS, H100_IB_ALPHA = 450.0, 50.0, 1.0
NVSWITCH_ALPHA = 0.7
DGX_IB_SWITCHES = 2   # NIC i on ib{i % 2}, as the built-in dgx-*-2node

MI250_IB_GBPS = (12.5, 16.0, 25.0, 50.0)
BOX_COUNTS = (2, 3, 4, 8)
LEAF_SPINE_SHAPES = ((4, 4), (4, 8), (8, 8), (8, 16))  # (leaves, ranks per leaf)
LEAF_SPINE_GBPS, LEAF_SPINE_ALPHA = 50.0, 1.0          # NDR 400 Gb/s ports, IB alpha as DGX H100
GRID_SHAPES = ((4, 4), (8, 8), (16, 16), (4, 4, 4), (4, 4, 8), (4, 8, 8))
REGULAR_DEGREES, REGULAR_SIZES, REGULAR_SEEDS = (3, 4), (8, 16, 32), (1, 2)
REGULAR_GBPS = (25.0, 50.0, 100.0)


def mi250_box(ib_bw: float) -> gen.Box:
    """One MI250 box: 16 GCDs on the xGMI matrix, every GCD straight to the IB switch at ``ib_bw``."""
    matrix = tuple(tuple(count * XGMI_GBPS for count in row) for row in MI250_XGMI)
    return gen.Box(16, matrix, intra_alpha=MI250_ALPHA, nics=0, nic_bw=ib_bw, ib_alpha=MI250_IB_ALPHA)


def dgx_a100_box() -> gen.Box:
    """One DGX A100: 8 GPUs on an NVSwitch, one NIC per GPU (GPU<->NIC alpha 0: IB alpha on NIC<->IB)."""
    return gen.Box(8, "nvswitch", A100_NVSWITCH_GBPS, NVSWITCH_ALPHA, nics=8, gpu_nic_bw=A100_NIC_GBPS,
                   nic_bw=A100_NIC_GBPS, ib_alpha=A100_IB_ALPHA)


def dgx_h100_box() -> gen.Box:
    """One DGX H100: 8 GPUs on an NVSwitch, one NIC per GPU (GPU<->NIC alpha 0: IB alpha on NIC<->IB)."""
    return gen.Box(8, "nvswitch", H100_NVSWITCH_GBPS, NVSWITCH_ALPHA, nics=8, gpu_nic_bw=H100_NIC_GBPS,
                   nic_bw=H100_NIC_GBPS, ib_alpha=H100_IB_ALPHA)


def mi250_boxes(boxes: int, ib_bw: float = 16.0, *, machines: bool = True, name: str | None = None) -> Topology:
    """``boxes`` MI250 boxes, every GCD on one IB switch ``ib0`` at ``ib_bw`` GB/s (module docstring)."""
    return gen.boxes_on_ib(
        [mi250_box(ib_bw)] * boxes, 1, name=name or f"mi250x{boxes}-ib{ib_bw:g}", machines=machines,
        description=(f"{boxes} x MI250 (xGMI link count x {XGMI_GBPS:g} GB/s, alpha {MI250_ALPHA:g} us assumed); "
                     f"every GCD <-> one IB switch ib0 at {ib_bw:g} GB/s, IB alpha {MI250_IB_ALPHA:g} us (assumed); "
                     "docs/topology.md, synth.topology.families"),
    )


def dgx_a100_boxes(boxes: int, *, machines: bool = True, name: str | None = None) -> Topology:
    """``boxes`` DGX A100 on IB switches ``ib0``, ``ib1`` (NIC i on ``ib{i % 2}``; module docstring)."""
    return gen.boxes_on_ib(
        [dgx_a100_box()] * boxes, DGX_IB_SWITCHES, name=name or f"a100x{boxes}", machines=machines,
        description=(f"{boxes} x DGX A100: 8 GPUs <-> NVSwitch {A100_NVSWITCH_GBPS:g} GB/s alpha {NVSWITCH_ALPHA:g} "
                     f"us; one {A100_NIC_GBPS:g} GB/s NIC per GPU, NIC i <-> ib<i % 2>, alpha {A100_IB_ALPHA:g} us "
                     "on IB (docs/topology.md, synth.topology.families)"),
    )


def dgx_h100_boxes(boxes: int, *, machines: bool = True, name: str | None = None) -> Topology:
    """``boxes`` DGX H100 on IB switches ``ib0``, ``ib1`` (NIC i on ``ib{i % 2}``; module docstring)."""
    return gen.boxes_on_ib(
        [dgx_h100_box()] * boxes, DGX_IB_SWITCHES, name=name or f"h100x{boxes}", machines=machines,
        description=(f"{boxes} x DGX H100: 8 GPUs <-> NVSwitch {H100_NVSWITCH_GBPS:g} GB/s alpha {NVSWITCH_ALPHA:g} "
                     f"us (assumed); one {H100_NIC_GBPS:g} GB/s NIC per GPU, NIC i <-> ib<i % 2>, alpha "
                     f"{H100_IB_ALPHA:g} us on IB (docs/topology.md, synth.topology.families)"),
    )


# Mixed fabrics: box kinds by name, all boxes on ONE IB switch ib0. MI250 GCDs at 25 GB/s, the A100's NIC rate.
MIXED_BOXES: dict[str, Callable[[], gen.Box]] = {
    "mi250": lambda: mi250_box(A100_NIC_GBPS),
    "a100": dgx_a100_box,
    "h100": dgx_h100_box,
}
MIXED_FABRICS: tuple[tuple[str, ...], ...] = (("mi250", "a100"), ("a100", "h100"), ("a100", "a100", "h100", "h100"),
                                              ("mi250", "h100"))


def mixed_name(kinds: Sequence[str]) -> str:
    """``mixed-a100x2-h100x2``: runs of equal kinds, in order (``x1`` left out)."""
    runs = [(kind, len(list(group))) for kind, group in itertools.groupby(kinds)]
    return "mixed-" + "-".join(kind if count == 1 else f"{kind}x{count}" for kind, count in runs)


def mixed_boxes(kinds: Sequence[str], *, machines: bool = True, name: str | None = None) -> Topology:
    """Boxes of the given kinds (``mi250``, ``a100``, ``h100``; :data:`MIXED_BOXES`) on one IB switch ib0."""
    unknown = [k for k in kinds if k not in MIXED_BOXES]
    if unknown or not kinds:
        raise SynthError(f"mixed boxes: unknown kind(s) {unknown} (known: {', '.join(MIXED_BOXES)})")
    return gen.boxes_on_ib(
        [MIXED_BOXES[k]() for k in kinds], 1, name=name or mixed_name(kinds), machines=machines,
        description=(f"boxes {', '.join(kinds)} on one IB switch ib0; MI250 GCDs at {A100_NIC_GBPS:g} GB/s, "
                     "A100/H100 NICs at their rates (docs/topology.md, synth.topology.families)"),
    )


def oversubscribed_leaf_spine(leaves: int, per_leaf: int, oversubscription: int, bw: float = LEAF_SPINE_GBPS,
                              alpha: float = LEAF_SPINE_ALPHA, *, name: str | None = None) -> Topology:
    """Leaf-spine with ``per_leaf / oversubscription`` spines, every link ``bw`` GB/s.

    Under the circuits of docs/cost-model.md an uplink carries one transfer at a time at most ``bw``, so a leaf's uplink
    capacity is ``spines * bw`` against ``per_leaf * bw`` down: oversubscription ``per_leaf / spines``
    (1 = non-blocking).
    """
    if oversubscription < 1 or per_leaf % oversubscription:
        raise SynthError(f"oversubscription {oversubscription} must be >= 1 and divide ranks per leaf {per_leaf}")
    spines = per_leaf // oversubscription
    return gen.leaf_spine(leaves, per_leaf, spines, bw, alpha, uplink_bw=bw,
                          name=name or f"leafspine-{leaves}x{per_leaf}-{oversubscription}to1")


def without_machines(topology: Topology, suffix: str = "-nomachines") -> Topology:
    """The same links with no ``machines`` key (methods that use boxes must find them themselves)."""
    return check_topology(replace(topology, name=topology.name + suffix, machines=(),
                                  description=topology.description + " (no machines key)"))


@dataclass(frozen=True)
class FabricSpec:
    """One member of the family: its name, rank count, kind and a builder (built on demand)."""

    name: str
    ranks: int
    kind: str
    build: Callable[[], Topology]


def _box_pair(out: list[FabricSpec], kind: str, ranks: int, name: str,
              builder: Callable[..., Topology]) -> None:
    """Add ``name`` (with machines) and ``name-nomachines`` (same links, no machines key)."""
    out.append(FabricSpec(name, ranks, kind, functools.partial(builder, machines=True, name=name)))
    out.append(FabricSpec(f"{name}-nomachines", ranks, kind,
                          functools.partial(builder, machines=False, name=f"{name}-nomachines")))


def fabric_family() -> list[FabricSpec]:
    """The public family, in a fixed order (names are stable: the bench and its CSVs key on them).

    MI250 boxes x {2,3,4,8} at per-GCD IB {12.5,16,25,50} GB/s; DGX A100 and H100 x {2,3,4,8}; mixed boxes
    (:data:`MIXED_FABRICS`), each with and without the machines key; leaf-spine 1:1 and 2:1
    (:data:`LEAF_SPINE_SHAPES`); 2-D and 3-D tori and meshes (:data:`GRID_SHAPES`, generator defaults
    50 GB/s 0.5 us, docs/topology.md); connected random 3- and 4-regular graphs of 8-32 ranks, seeds 1 and 2,
    links 25/50/100 GB/s.
    """
    out: list[FabricSpec] = []
    for boxes in BOX_COUNTS:
        for ib in MI250_IB_GBPS:
            _box_pair(out, "mi250", 16 * boxes, f"mi250x{boxes}-ib{ib:g}",
                      functools.partial(mi250_boxes, boxes, ib))
    for boxes in BOX_COUNTS:
        _box_pair(out, "a100", 8 * boxes, f"a100x{boxes}", functools.partial(dgx_a100_boxes, boxes))
    for boxes in BOX_COUNTS:
        _box_pair(out, "h100", 8 * boxes, f"h100x{boxes}", functools.partial(dgx_h100_boxes, boxes))
    for kinds in MIXED_FABRICS:
        ranks = sum(MIXED_BOXES[k]().per_box for k in kinds)
        _box_pair(out, "mixed", ranks, mixed_name(kinds), functools.partial(mixed_boxes, kinds))
    for leaves, per_leaf in LEAF_SPINE_SHAPES:
        for over in (1, 2):
            name = f"leafspine-{leaves}x{per_leaf}-{over}to1"
            out.append(FabricSpec(name, leaves * per_leaf, "leafspine",
                                  functools.partial(oversubscribed_leaf_spine, leaves, per_leaf, over, name=name)))
    for kind, build in (("torus", gen.torus), ("mesh", gen.mesh)):
        for dims in GRID_SHAPES:
            name = f"{kind}-{'x'.join(map(str, dims))}"
            ranks = functools.reduce(lambda a, b: a * b, dims, 1)
            out.append(FabricSpec(name, ranks, kind, functools.partial(build, list(dims), name=name)))
    for degree in REGULAR_DEGREES:
        for n in REGULAR_SIZES:
            for seed in REGULAR_SEEDS:
                name = f"rr{degree}-{n}-s{seed}"
                out.append(FabricSpec(name, n, "random-regular",
                                      functools.partial(gen.random_regular, n, degree, seed, REGULAR_GBPS, name=name)))
    return out

"""Regenerate the reference topologies in this directory (docs/topology.md, "Names and built-ins").

    python topologies/make_reference.py          # rewrite every reference file
    python topologies/make_reference.py --check  # exit 1 if a file differs from what this script builds

Every number comes from the built-ins table of docs/topology.md or from the link matrices below; each file's
``description`` says which. Where that table gives no value, the description says "assumed".
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from synth.topology import generators as gen
from synth.topology.checks import with_switch_features
from synth.topology.io import dump_topology
from synth.topology.model import SwitchFeatures, Topology

HERE = Path(__file__).resolve().parent

# NVLink count between V100 GPUs i and j of a DGX-1 (hybrid cube-mesh; rows sum to 6). Copied from
# the msccl-tools DGX-1 matrix as given in ../shared/fixtures/topologies/dgx1_nvlink.json.
DGX1_NVLINKS = [
    [0, 2, 1, 1, 2, 0, 0, 0],
    [2, 0, 1, 2, 0, 1, 0, 0],
    [1, 1, 0, 2, 0, 0, 2, 0],
    [1, 2, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 2, 1, 1],
    [0, 1, 0, 0, 2, 0, 1, 2],
    [0, 0, 2, 0, 1, 1, 0, 2],
    [0, 0, 0, 1, 1, 2, 2, 0],
]
NVLINK_V100_GBPS = 25.0  # per NVLink per direction (docs/topology.md)

# xGMI link count between the 16 GCDs of an AMD MI250 box (4 = the two GCDs of one package; 7 links
# per GCD). From ../shared/fixtures/topologies/mi250_xgmi.json.
MI250_XGMI = [
    [0, 4, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
    [4, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0],
    [0, 0, 0, 4, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0],
    [0, 0, 4, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0],
    [2, 0, 0, 0, 0, 4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [0, 1, 0, 0, 4, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
    [0, 0, 1, 0, 1, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 2, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 2, 0, 0, 0],
    [0, 1, 1, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 1, 0, 0],
    [0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 1, 0],
    [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 2],
    [0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 4, 1, 0],
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 4, 0, 1, 1],
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 4],
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 4, 0],
]
XGMI_GBPS = 50.0  # per xGMI link per direction (docs/topology.md)
MI250_ALPHA = 0.5  # not in docs/topology.md: the generators' default (assumed)


def _scaled(matrix: list[list[int]], per_link: float) -> list[list[float]]:
    return [[count * per_link for count in row] for row in matrix]


def _a100_nodes(boxes: int) -> Topology:
    return gen.boxes_behind_nics(
        boxes, 8, intra="nvswitch", intra_bw=300, intra_alpha=0.7, nics_per_box=8,
        gpu_nic_bw=25, gpu_nic_alpha=0.0, nic_bw=25, ib_switches=2, ib_alpha=2.0,
        name=f"dgx-a100-{boxes}node",
        description=(
            f"{boxes} x DGX A100 (docs/topology.md): per box 8 A100 <-> NVSwitch b<k>.nvswitch at 300 GB/s each way, "
            "alpha 0.7 us; per GPU i a NIC node b<k>.nic<i>, GPU<->NIC 25 GB/s (alpha 0: the IB alpha is "
            "charged on the NIC<->IB hops), NIC<->IB switch ib<i % 2> 25 GB/s, alpha 2 us on IB."
        ),
    )


# In-network reduction (docs/topology.md, "In-network reduction"). Assumed: the links' alpha already covers the
# switch's own latency (reduce_alpha 0), and the reduction engine is never the bottleneck (no reduce_bw).
NVLS = SwitchFeatures(reduce=True, multicast=True)
SHARP = SwitchFeatures(reduce=True, multicast=True)
IN_NETWORK_NOTE = ("Assumed: reduce_alpha 0 (the links' alpha covers the switch) and no reduce_bw (the reduction "
                   "engine is not the bottleneck).")


def _h100_2node() -> Topology:
    return gen.boxes_behind_nics(
        2, 8, intra="nvswitch", intra_bw=450, intra_alpha=0.7, nics_per_box=8, gpu_nic_bw=50,
        gpu_nic_alpha=0.0, nic_bw=50, ib_switches=2, ib_alpha=1.0, name="dgx-h100-2node",
        description=(
            "2 x DGX H100: per box 8 H100 <-> NVSwitch at 450 GB/s each way; 8 x 50 GB/s NICs per box, "
            "alpha 1 us on IB (docs/topology.md). Assumed as for dgx-a100-2node: NVSwitch alpha 0.7 us, GPU i <-> "
            "NIC b<k>.nic<i> 50 GB/s alpha 0, NIC <-> IB switch ib<i % 2>."
        ),
    )


def _in_network() -> list[Topology]:
    """``dgx-h100-nvls`` and ``dgx-h100-2node-sharp``: the H100 fabrics with NVLS on the NVSwitches and
    SHARP on the IB switches."""
    nvls = gen.star(
        8, 450, 0.7, switch="nvswitch", name="dgx-h100-nvls", machines=[list(range(8))],
        description=("NVIDIA DGX H100 with NVLS: 8 H100 <-> one NVSwitch at 450 GB/s each way, alpha 0.7 us "
                     "(docs/topology.md); the NVSwitch reduces and multicasts in the network (NVLS multimem). "
                     + IN_NETWORK_NOTE),
    )
    two = _h100_2node()
    sharp = replace(two, name="dgx-h100-2node-sharp", description=(
        "dgx-h100-2node (2 x DGX H100, 450 GB/s NVSwitch per box, 8 x 50 GB/s NICs per box, alpha 1 us on IB; "
        "docs/topology.md) with in-network reduction: each box's NVSwitch reduces and multicasts (NVLS), and "
        "the IB switches ib0, ib1 reduce and send the result back down (SHARP). " + IN_NETWORK_NOTE))
    features = {name: NVLS for name in two.switches if name.endswith("nvswitch")}
    features.update({name: SHARP for name in two.switches if name.startswith("ib")})
    return [with_switch_features(nvls, {"nvswitch": NVLS}), with_switch_features(sharp, features)]


def reference_topologies() -> dict[str, Topology]:
    """Every reference topology, by name (the file is ``<name>.yaml``)."""
    box8 = [list(range(8))]
    out = [
        gen.from_matrix(
            DGX1_NVLINKS, NVLINK_V100_GBPS, 0.7, name="dgx1", machines=box8,
            description=(
                "NVIDIA DGX-1 (8 V100, hybrid cube-mesh). Link i<->j = NVLink count from the msccl-tools "
                "DGX-1 matrix (rows sum to 6) x 25 GB/s per NVLink per direction; alpha 0.7 us (docs/topology.md)."
            ),
        ),
        gen.boxes_behind_nics(
            2, 8, intra=_scaled(DGX1_NVLINKS, NVLINK_V100_GBPS), intra_alpha=0.7, nics_per_box=1,
            gpu_nic_bw=12.5, gpu_nic_alpha=0.0, nic_bw=12.5, ib_switches=1, ib_alpha=2.6, name="ndv2-2node",
            description=(
                "2 x Azure NDv2 (each a dgx1: NVLink count x 25 GB/s, alpha 0.7 us) + one 12.5 GB/s NIC per "
                "box b<k>.nic0 to IB switch ib0, alpha 2.6 us on the NIC<->IB links (docs/topology.md). GPU<->NIC "
                "links 12.5 GB/s (assumed: the NIC is the bottleneck), alpha 0."
            ),
        ),
        gen.star(
            16, 125, 0.35, switch="nvswitch", name="dgx2", machines=[list(range(16))],
            description="NVIDIA DGX-2: 16 V100 <-> NVSwitch at 125 GB/s each way, alpha 0.35 us (docs/topology.md).",
        ),
        gen.star(
            8, 300, 0.7, switch="nvswitch", name="dgx-a100", machines=box8,
            description="NVIDIA DGX A100: 8 A100 <-> one NVSwitch at 300 GB/s each way, alpha 0.7 us "
                        "(docs/topology.md).",
        ),
        gen.star(
            8, 450, 0.7, switch="nvswitch", name="dgx-h100", machines=box8,
            description="NVIDIA DGX H100: 8 H100 <-> one NVSwitch at 450 GB/s each way, alpha 0.7 us (one box of "
                        "dgx-h100-2node; docs/topology.md).",
        ),
        _a100_nodes(2),
        _a100_nodes(4),
        _h100_2node(),
        *_in_network(),
        gen.from_matrix(
            MI250_XGMI, XGMI_GBPS, MI250_ALPHA, name="mi250", machines=[list(range(16))],
            description=(
                "AMD MI250 box: 16 GCDs; link i<->j = xGMI link count (../shared/fixtures/topologies/"
                "mi250_xgmi.json) x 50 GB/s per direction (docs/topology.md); alpha 0.5 us (assumed)."
            ),
        ),
        gen.boxes_behind_nics(
            2, 16, intra=_scaled(MI250_XGMI, XGMI_GBPS), intra_alpha=MI250_ALPHA, nics_per_box=0,
            nic_bw=16, ib_switches=1, ib_alpha=2.0, name="mi250-2node",
            description=(
                "2 x mi250 (xGMI link count x 50 GB/s, alpha 0.5 us assumed); every GCD <-> one IB switch ib0 "
                "at 16 GB/s (docs/topology.md); IB alpha 2 us (assumed, as dgx-a100-2node)."
            ),
        ),
        gen.torus([4, 4], name="torus-4x4"),
        gen.torus([3, 3, 3], name="torus-3x3x3"),
        gen.mesh([5, 5], name="mesh-5x5"),
        gen.hypercube(4, name="hypercube-16"),
        gen.ring(8, name="ring-8"),
        gen.fully_connected(8, name="fully-connected-8"),
        gen.leaf_spine(4, 4, 2, name="leaf-spine-4x4"),
    ]
    # The generator families say where their numbers come from.
    out = [t if "docs/topology.md" in t.description else replace(t, description=t.description + " (generator defaults, "
           "docs/topology.md)") for t in out]
    return {t.name: t for t in out}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, topology in reference_topologies().items():
        path = HERE / f"{name}.yaml"
        text = dump_topology(topology)
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            from synth.fileio import atomic_write_text

            atomic_write_text(path, text)
            print(f"wrote {path.name}: {topology.num_ranks} ranks, {len(topology.switches)} switches, "
                  f"{len(topology.links)} directed links")
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

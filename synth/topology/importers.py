"""Import a machine's own description: ``nvidia-smi topo -m``, ``rocm-smi --showtopo`` and NCCL's topology dump.

Three parsers read text into one :class:`BoxFabric` (what the source says of one box: GPU-GPU link
counts, NVSwitch links, PCIe distances, NICs); :func:`build_topology` then turns a box into a validated
:class:`Topology`, with ``nodes`` boxes joined by IB switches. Pure functions over plain data; every
failure is a one-line :class:`SynthError`. docs/topology.md, "Importing a machine", is the user's guide.

Bandwidths (GB/s per direction) and alphas (µs) the sources do not print come from :data:`NVLINK_GBPS`,
:data:`PCIE_GBPS` and the ``DEFAULT_*`` values below, each with its source; every one can be overridden
(:class:`ImportParams`, ``synth topology import --set KEY=VALUE``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from synth.errors import SynthError
from synth.topology.checks import check_topology, merge_links
from synth.topology.model import Topology
from synth.topology.msccl_tools import link_counts, looks_like_msccl_topology

FORMATS = ("nvidia-smi", "rocm-smi", "nccl-xml", "msccl-tools")

# --- documented per-generation tables (one place) ------------------------------------------------------------

#: GB/s per NVLink per direction, by NVLink generation. NVLink1 (P100): 20 GB/s per link per direction, 4 links
#: (NVIDIA Tesla P100 white paper). NVLink2 (V100): 25 GB/s, 6 links, 300 GB/s per GPU both directions (NVIDIA
#: Tesla V100 white paper). NVLink3 (A100): 25 GB/s, 12 links, 600 GB/s both directions (NVIDIA A100 Tensor Core
#: GPU architecture white paper). NVLink4 (H100): 25 GB/s, 18 links, 900 GB/s both directions (NVIDIA H100 Tensor
#: Core GPU architecture white paper). NVLink5 (B200): 50 GB/s, 18 links, 1.8 TB/s both directions (NVIDIA
#: Blackwell architecture technical brief).
NVLINK_GBPS: dict[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
#: Most NVLinks any GPU of the table has (H100, B200: 18). A GPU whose NVLink counts to its peers add up to more
#: cannot have that many links of its own: they are its links to an NVSwitch, shown once per peer.
MAX_NVLINKS_PER_GPU = 18
#: GB/s per xGMI (Infinity Fabric) link per direction: 50 (AMD CDNA 2 white paper, 100 GB/s per link both
#: directions; the built-in mi250's value, synth.topology.families.XGMI_GBPS).
XGMI_GBPS = 50.0
#: x16 PCIe GB/s per direction by generation, rounded (PCI-SIG: 8, 16, 32 GT/s per lane with 128b/130b coding for
#: gen 3-5; 2.5 and 5 GT/s with 8b/10b for gen 1-2).
PCIE_GBPS: dict[int, float] = {1: 4.0, 2: 8.0, 3: 16.0, 4: 32.0, 5: 64.0}
#: PCIe generation by link speed in GT/s per lane (NCCL's topology dump prints ``link_speed="16.0 GT/s PCIe"``).
PCIE_GEN_BY_GTS: dict[float, int] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5}
#: InfiniBand port rates in GB/s per direction: EDR 100 Gb/s, HDR 200 Gb/s, NDR 400 Gb/s (InfiniBand Trade
#: Association roadmap); DGX-1 has EDR, DGX A100 HDR (ConnectX-6), DGX H100 NDR (ConnectX-7).
IB_GBPS: dict[str, float] = {"EDR": 12.5, "HDR": 25.0, "NDR": 50.0}

#: NVLink and NVSwitch alpha, µs (DESIGN.md; the built-in dgx1 and dgx-a100).
DEFAULT_NVLINK_ALPHA = 0.7
#: xGMI alpha, µs (assumed, the built-in mi250's).
DEFAULT_XGMI_ALPHA = 0.5
#: PCIe alpha per hop, µs (assumed).
DEFAULT_PCIE_ALPHA = 1.0
#: IB alpha on NIC <-> IB switch links, µs: 2 at EDR/HDR (the built-in dgx-a100-2node), 1 at NDR and faster
#: (dgx-h100-2node). GPU <-> NIC links have alpha 0, as in those built-ins: the IB alpha is charged on the IB hop.
DEFAULT_IB_ALPHA_SLOW, DEFAULT_IB_ALPHA_FAST = 2.0, 1.0
#: NIC rate when the source does not print one (nvidia-smi, rocm-smi): by the GPU generation its NVLink count
#: shows (NVLink2 boxes shipped EDR, NVLink3 HDR, NVLink4 NDR); HDR otherwise.
DEFAULT_NIC_BY_NVLINK: dict[int, float] = {2: IB_GBPS["EDR"], 3: IB_GBPS["HDR"], 4: IB_GBPS["NDR"], 5: IB_GBPS["NDR"]}
DEFAULT_NIC_GBPS = IB_GBPS["HDR"]

#: PCIe distances, nearest first (``nvidia-smi topo -m`` legend; NVML's nvmlGpuTopologyLevel_t).
PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_LEVEL_RANK = {level: k for k, level in enumerate(PCIE_LEVELS)}
MAX_GPUS = 4096
MAX_NICS = 4096
#: Most NVLinks between two GPUs (or from a GPU to the NVSwitches) an import accepts: NVLink 5 has 18 a GPU.
MAX_PAIR_LINKS = 64


@dataclass(frozen=True)
class BoxFabric:
    """What a source says of one box (GPUs are ranks ``0..gpus-1`` in the source's order).

    ``links[i][j]``: direct NVLink/xGMI link count between GPUs i and j (symmetric, zero diagonal).
    ``switch_links[i]``: GPU i's links into an NVSwitch fabric (all 0: no switch). ``pcie[i][j]``: PCIe
    distance (:data:`PCIE_LEVELS`; ``""`` where the source does not say, e.g. an NVLinked pair in nvidia-smi).
    ``nics``: the NICs used, in order of first use, with their GB/s when the source prints it (else None);
    ``gpu_nic[i]``: GPU i's NIC (index into ``nics``) or -1. ``link_gbps``/``pcie_gbps``: per-link rates the
    source implies (None: use the defaults). ``generation``: NVLink generation (0: unknown or none).
    """

    fmt: str
    kind: str  # "nvlink" or "xgmi"
    links: tuple[tuple[int, ...], ...]
    switch_links: tuple[int, ...]
    pcie: tuple[tuple[str, ...], ...]
    nics: tuple[tuple[str, float | None], ...] = ()
    gpu_nic: tuple[int, ...] = ()
    link_gbps: float | None = None
    pcie_gbps: float | None = None
    generation: int = 0
    notes: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return len(self.links)


@dataclass(frozen=True)
class ImportParams:
    """Overrides (None: the default for the source; module docstring). GB/s per direction, alphas in µs."""

    link_bw: float | None = None     # per NVLink or xGMI link
    link_alpha: float | None = None  # NVLink, NVSwitch or xGMI
    pcie_bw: float | None = None     # per PCIe hop (x16 of the generation)
    pcie_alpha: float | None = None
    nic_bw: float | None = None      # GPU <-> NIC and NIC <-> IB switch
    ib_alpha: float | None = None    # NIC <-> IB switch


PARAM_KEYS = tuple(f.name for f in fields(ImportParams))


def parse_settings(items: Sequence[str]) -> ImportParams:
    """``KEY=VALUE`` strings (keys of :class:`ImportParams`, ``-`` or ``_``) into overrides; bw > 0, alpha >= 0."""
    values: dict[str, float] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in PARAM_KEYS:
            raise SynthError(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(PARAM_KEYS)}")
        try:
            value = float(text)
        except ValueError:
            raise SynthError(f"--set {item!r}: {text!r} is not a number") from None
        low_ok = value >= 0 if key.endswith("alpha") else value > 0
        if not (low_ok and math.isfinite(value)):
            raise SynthError(f"--set {item!r}: {'alpha must be >= 0' if key.endswith('alpha') else 'bw must be > 0'}"
                             " and finite")
        values[key] = value
    return ImportParams(**values)


# --- format detection ---------------------------------------------------------------------------------------


def detect_format(text: str) -> str:
    """``nccl-xml`` (a ``<system`` element), ``rocm-smi`` (its banner or "between two GPUs" tables),
    ``nvidia-smi`` (a matrix header starting with GPU0) or ``msccl-tools`` (its topology JSON); SynthError
    otherwise."""
    if looks_like_msccl_topology(text):
        return "msccl-tools"
    if re.search(r"<\s*system[\s>]", text):
        return "nccl-xml"
    if "ROCm System Management Interface" in text or re.search(r"between two GPUs", text):
        return "rocm-smi"
    if re.search(r"^\s*GPU0\b", text, re.MULTILINE) and re.search(r"^\s*GPU0\s+X\b", text, re.MULTILINE):
        return "nvidia-smi"
    raise SynthError("cannot tell the format (expected nvidia-smi topo -m, rocm-smi --showtopo, an NCCL "
                     "topology XML or an msccl-tools topology JSON); pass --format")


def parse(text: str, fmt: str | None = None) -> BoxFabric:
    """The box a text describes; ``fmt`` one of :data:`FORMATS` or None to detect it."""
    fmt = fmt or detect_format(text)
    if fmt == "nvidia-smi":
        return parse_nvidia_smi(text)
    if fmt == "rocm-smi":
        return parse_rocm_smi(text)
    if fmt == "nccl-xml":
        return parse_nccl_xml(text)
    if fmt == "msccl-tools":
        return parse_msccl_topology(text)
    raise SynthError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")


# --- shared helpers -----------------------------------------------------------------------------------------


def _symmetric(matrix: Sequence[Sequence[object]], what: str) -> None:
    n = len(matrix)
    for i in range(n):
        for j in range(i + 1, n):
            if matrix[i][j] != matrix[j][i]:
                raise SynthError(f"{what}: GPU{i}-GPU{j} is {matrix[i][j]!r} but GPU{j}-GPU{i} is {matrix[j][i]!r}")


def switch_or_mesh(counts: list[list[int]]) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Split NV# counts into direct links and NVSwitch links.

    Behind NVSwitches nvidia-smi shows every pair with all of a GPU's links (NV12 on DGX A100, NV18 on DGX
    H100). So when every pair of n >= 2 GPUs has the same count k and ``k * (n - 1)`` exceeds
    :data:`MAX_NVLINKS_PER_GPU` (no GPU has that many links), the GPUs each have k links into one switch.
    """
    n = len(counts)
    values = {counts[i][j] for i in range(n) for j in range(n) if i != j}
    if n >= 2 and len(values) == 1 and (k := values.pop()) > 0 and k * (n - 1) > MAX_NVLINKS_PER_GPU:
        return tuple(tuple(0 for _ in range(n)) for _ in range(n)), tuple(k for _ in range(n))
    return tuple(tuple(row) for row in counts), tuple(0 for _ in range(n))


def nvlink_generation(links: Sequence[Sequence[int]], switch_links: Sequence[int]) -> int:
    """NVLink generation from a GPU's link count (most links of any GPU): > 12 NVLink4, > 6 NVLink3, else 2
    (NVLink1's 4-link P100 cannot be told from a V100 with 4 links: override ``link_bw`` for P100)."""
    most = max([sum(row) for row in links] + list(switch_links) + [0])
    if most == 0:
        return 0
    return 4 if most > 12 else 3 if most > 6 else 2


def _assign_nics(levels: Sequence[Sequence[str]], names: Sequence[str]) -> tuple[list[int], list[int]]:
    """One NIC per GPU by PCIe affinity: (NICs used, in order of first use; per GPU its position there or -1).

    Candidates: NICs at PIX or PXB from some GPU (behind the same PCIe switch); if none, those at PHB or NODE.
    NICs at SYS from every GPU (storage or management ports on another socket) are left out. GPU i takes, of the
    candidates, the nearest, then the least used, then the first in the source: so a NIC is shared only when the
    GPUs outnumber the NICs near them (DGX-1: two GPUs per NIC).
    """
    n_gpus, n_nics = len(levels), len(names)
    best = [min((_LEVEL_RANK.get(levels[g][j], len(PCIE_LEVELS)) for g in range(n_gpus)), default=99)
            for j in range(n_nics)]
    candidates = [j for j in range(n_nics) if best[j] <= _LEVEL_RANK["PXB"]]
    if not candidates:
        candidates = [j for j in range(n_nics) if best[j] <= _LEVEL_RANK["NODE"]]
    used = [0] * n_nics
    order: list[int] = []
    gpu_nic: list[int] = []
    for g in range(n_gpus):
        if not candidates:
            gpu_nic.append(-1)
            continue
        j = min(candidates, key=lambda c: (_LEVEL_RANK.get(levels[g][c], len(PCIE_LEVELS)), used[c], c))
        used[j] += 1
        if j not in order:
            order.append(j)
        gpu_nic.append(order.index(j))
    return order, gpu_nic


# --- nvidia-smi topo -m -------------------------------------------------------------------------------------

_CELL = re.compile(r"X|NV[0-9]+|SYS|SOC|NODE|PHB|PXB|PIX")
_NAME_RUN = re.compile(r"(?:GPU[0-9]+|NIC[0-9]+)+")


def _split_cells(tokens: Sequence[str]) -> list[str]:
    """Cells of a matrix row; copy-pasted tab output sometimes glues two (``NODENODE``)."""
    out: list[str] = []
    for token in tokens:
        parts = _CELL.findall(token)
        if parts and "".join(parts) == token:
            out.extend(parts)
        else:
            out.append(token)
    return out


def parse_nvidia_smi(text: str) -> BoxFabric:
    """``nvidia-smi topo -m``: the GPU x (GPU, NIC) matrix and the ``NIC Legend``.

    A cell is ``X`` (self), ``NV#`` (# bonded NVLinks) or a PCIe distance (:data:`PCIE_LEVELS`; ``SOC`` is the
    old name of ``SYS``). NIC columns are any other column names (``NIC0``, ``mlx5_0``); the legend maps
    ``NICk`` to its device name.
    """
    lines = text.splitlines()
    header_at = next((k for k, line in enumerate(lines) if re.match(r"\s*GPU0\b", line)
                      and not re.match(r"\s*GPU0\s+X\b", line)), None)
    if header_at is None:
        raise SynthError("nvidia-smi: no matrix header (a line starting with GPU0 GPU1 ...)")
    columns: list[str] = []
    for token in lines[header_at].split():
        if token in ("CPU", "NUMA", "GPU"):  # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"
            break
        columns.extend(_NAME_RUN.findall(token) if _NAME_RUN.fullmatch(token) else [token])
    gpu_cols = [c for c in columns if re.fullmatch(r"GPU[0-9]+", c)]
    nic_cols = [c for c in columns if not re.fullmatch(r"GPU[0-9]+", c)]
    if gpu_cols != [f"GPU{k}" for k in range(len(gpu_cols))] or columns[:len(gpu_cols)] != gpu_cols:
        raise SynthError(f"nvidia-smi: the header must list GPU0, GPU1, ... first, got {' '.join(columns[:8])}")
    if len(gpu_cols) > MAX_GPUS or len(nic_cols) > MAX_NICS:
        raise SynthError(f"nvidia-smi: {len(gpu_cols)} GPUs and {len(nic_cols)} NICs; the limit is {MAX_GPUS}")
    rows: dict[str, list[str]] = {}
    for line in lines[header_at + 1:]:
        tokens = line.split()
        if not tokens or not re.fullmatch(r"GPU[0-9]+", tokens[0]):
            continue
        cells = _split_cells(tokens[1:])[:len(columns)]
        if len(cells) < len(columns) or any(not _CELL.fullmatch(c) for c in cells):
            raise SynthError(f"nvidia-smi: row {tokens[0]}: expected {len(columns)} cells of X, NV#, PIX, PXB, PHB, "
                             f"NODE or SYS, got {' '.join(tokens[1:len(columns) + 1])!r}")
        rows[tokens[0]] = ["SYS" if c == "SOC" else c for c in cells]
    missing = [g for g in gpu_cols if g not in rows]
    if missing:
        raise SynthError(f"nvidia-smi: no row for {missing[0]} ({len(gpu_cols)} GPU columns)")
    n = len(gpu_cols)
    matrix = [rows[g] for g in gpu_cols]
    for i in range(n):
        if matrix[i][i] != "X":
            raise SynthError(f"nvidia-smi: GPU{i} against itself is {matrix[i][i]!r}, not X")
    gpu_part = [[matrix[i][j] for j in range(n)] for i in range(n)]
    _symmetric(gpu_part, "nvidia-smi")
    counts = [[int(c[2:]) if c.startswith("NV") else 0 for c in row] for row in gpu_part]
    for i, row in enumerate(counts):
        if max(row) > MAX_PAIR_LINKS:
            j = row.index(max(row))
            raise SynthError(f"nvidia-smi: GPU{i}-GPU{j} is {gpu_part[i][j]!r}: more than {MAX_PAIR_LINKS} NVLinks")
    pcie = tuple(tuple(c if c in _LEVEL_RANK else "" for c in row) for row in gpu_part)
    links, switch_links = switch_or_mesh(counts)
    legend = dict(re.findall(r"^\s*(NIC[0-9]+)\s*:\s*(\S+)\s*$", text, re.MULTILINE))
    names = [legend.get(c, c) for c in nic_cols]
    nic_levels = [[matrix[i][n + j] for j in range(len(nic_cols))] for i in range(n)]
    if any(c == "X" or c.startswith("NV") for row in nic_levels for c in row):
        raise SynthError("nvidia-smi: a GPU-NIC cell must be a PCIe distance (PIX, PXB, PHB, NODE, SYS)")
    order, gpu_nic = _assign_nics(nic_levels, names)
    return BoxFabric("nvidia-smi", "nvlink", links, switch_links, pcie,
                     tuple((names[j], None) for j in order), tuple(gpu_nic),
                     generation=nvlink_generation(links, switch_links))


# --- rocm-smi --showtopo ------------------------------------------------------------------------------------

#: KFD weight of one xGMI hop (amdkfd kfd_crat.c, KFD_CRAT_XGMI_WEIGHT; ROCm's amd-smi docs: "each physical xGMI
#: hop contributes 15 to the weight"). A weight of 15 is a direct link.
XGMI_HOP_WEIGHT = 15
#: rocm-smi --shownodesbw prints min-max bandwidth in MB/s; the max is the link count x the per-link rate
#: (amdgpu_xgmi_get_num_links x lanes x lane rate), 50000 MB/s per MI200 xGMI link.
XGMI_MBPS_PER_LINK = 50000


def _rocm_sections(text: str) -> dict[str, list[str]]:
    """Lines of each ``==== Title ====`` section, by lower-case title."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        title = re.fullmatch(r"\s*=+\s*(.*?)\s*=+\s*", line)
        if title is not None:
            current = sections.setdefault(title.group(1).lower(), []) if title.group(1) else None
            continue
        if current is not None:
            current.append(line)
    return sections


def _rocm_matrix(lines: Sequence[str], what: str) -> list[list[str]]:
    header = next((line.split() for line in lines
                   if line.split() and all(re.fullmatch(r"GPU[0-9]+", t) for t in line.split())), None)
    if header is None:
        raise SynthError(f"rocm-smi: {what}: no GPU0 GPU1 ... header")
    n = len(header)
    if header != [f"GPU{k}" for k in range(n)] or n > MAX_GPUS:
        raise SynthError(f"rocm-smi: {what}: the header must be GPU0 GPU1 ... (at most {MAX_GPUS})")
    rows: dict[int, list[str]] = {}
    for line in lines:
        tokens = line.split()
        if len(tokens) == n + 1 and re.fullmatch(r"GPU[0-9]+", tokens[0]):
            rows[int(tokens[0][3:])] = tokens[1:]
    if sorted(rows) != list(range(n)):
        raise SynthError(f"rocm-smi: {what}: expected rows GPU0..GPU{n - 1} with {n} values each")
    return [rows[k] for k in range(n)]


def parse_rocm_smi(text: str) -> BoxFabric:
    """``rocm-smi --showtopo`` (weight, hops, link type and NUMA tables; rocm_smi.py showHwTopology), optionally with
    ``--shownodesbw`` (the ``Bandwidth`` table, min-max MB/s).

    An XGMI pair of weight 15 (one xGMI hop) is a direct link; heavier XGMI pairs route through other GCDs and get
    no link. The link count is the Bandwidth table's max over :data:`XGMI_MBPS_PER_LINK`; without that table every
    direct pair is one link (``--showtopo`` alone does not print counts). PCIE pairs go through the host: GPUs on
    one NUMA node meet at its host bridge (PHB), others across sockets (SYS).
    """
    sections = _rocm_sections(text)
    if "link type between two gpus" not in sections:
        raise SynthError("rocm-smi: no 'Link Type between two GPUs' table (run rocm-smi --showtopo)")
    types = _rocm_matrix(sections["link type between two gpus"], "link type")
    n = len(types)
    weights = (_rocm_matrix(sections["weight between two gpus"], "weight")
               if "weight between two gpus" in sections else None)
    bandwidth = _rocm_matrix(sections["bandwidth"], "bandwidth") if "bandwidth" in sections else None
    for what, matrix in (("weight", weights), ("bandwidth", bandwidth)):
        if matrix is not None and len(matrix) != n:
            raise SynthError(f"rocm-smi: the {what} table has {len(matrix)} GPUs, the link type table {n}")
    _symmetric(types, "rocm-smi link type")
    counts = [[0] * n for _ in range(n)]
    pcie = [[""] * n for _ in range(n)]
    numa = {int(g): int(v) for g, v in re.findall(r"GPU\[([0-9]+)\]\s*:\s*\(Topology\) Numa Node:\s*(-?[0-9]+)", text)}
    notes: list[str] = []
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            kind = types[i][j].upper()
            if kind == "XGMI":
                counts[i][j] = _xgmi_count(i, j, weights, bandwidth)
            elif kind == "PCIE":
                pcie[i][j] = "PHB" if numa.get(i, -1) == numa.get(j, -2) else "SYS"
            else:
                raise SynthError(f"rocm-smi: GPU{i}-GPU{j} link type {types[i][j]!r} (expected XGMI or PCIE)")
    _symmetric(counts, "rocm-smi xGMI link count")
    if bandwidth is None and any(any(row) for row in counts):
        notes.append("xGMI link counts not in the source (add rocm-smi --shownodesbw): one link per direct pair")
    return BoxFabric("rocm-smi", "xgmi", tuple(map(tuple, counts)), tuple(0 for _ in range(n)),
                     tuple(map(tuple, pcie)), notes=tuple(notes))


def _xgmi_count(i: int, j: int, weights: list[list[str]] | None, bandwidth: list[list[str]] | None) -> int:
    """xGMI links between GPUs i and j (0: not directly linked); see :func:`parse_rocm_smi`."""
    direct = True
    if weights is not None:
        try:
            weight = int(weights[i][j])
        except ValueError:
            raise SynthError(f"rocm-smi: weight GPU{i}-GPU{j} {weights[i][j]!r} is not an integer") from None
        direct = weight == XGMI_HOP_WEIGHT
    if bandwidth is None:
        return 1 if direct else 0
    match = re.fullmatch(r"([0-9]+)-([0-9]+)", bandwidth[i][j])
    if match is None:
        raise SynthError(f"rocm-smi: bandwidth GPU{i}-GPU{j} {bandwidth[i][j]!r} is not min-max")
    top = int(match.group(2))
    if weights is None:
        direct = top > 0
    if not direct:
        return 0
    links, rest = divmod(top, XGMI_MBPS_PER_LINK)   # integers: a 400-digit max does not fit a float
    if links < 1 or rest:
        raise SynthError(f"rocm-smi: bandwidth GPU{i}-GPU{j} max {top} MB/s is not a whole number of "
                         f"{XGMI_MBPS_PER_LINK} MB/s xGMI links")
    if links > MAX_PAIR_LINKS:
        raise SynthError(f"rocm-smi: bandwidth GPU{i}-GPU{j} max {top} MB/s is more than {MAX_PAIR_LINKS} xGMI links")
    return links


# --- NCCL topology dump (NCCL_TOPO_DUMP_FILE) ---------------------------------------------------------------

_GPU_CLASS = ("0x030000", "0x030200")
_NVSWITCH_CLASS = "0x068000"


def parse_nccl_xml(text: str) -> BoxFabric:
    """NCCL's topology XML: ``<system><cpu><pci busid=...>...<gpu dev rank sm><nvlink target count tclass/>``,
    ``<nic><net name speed/></nic>``.

    GPUs in ``rank`` order. An nvlink whose ``tclass`` is 0x068000 goes to an NVSwitch (its ``count`` links add to
    the GPU's switch links); one to a GPU of the file is a direct link; others (a GPU not in the dump, a POWER9
    CPU) are left out. NVLink generation from ``sm`` (60: NVLink1, 70: 2, 80: 3, 90: 4, 100: 5); PCIe rate from the
    GPU's ``link_speed``/``link_width``; each ``<net>`` is one NIC, ``speed`` in Mb/s. PCIe distance of two devices
    from their nearest common element: the same parent ``<pci>`` PIX, a deeper ``<pci>`` PXB, a ``<cpu>`` PHB, the
    ``<system>`` SYS.
    """
    import xml.etree.ElementTree as ET

    if re.search(r"<!\s*(DOCTYPE|ENTITY)", text, re.IGNORECASE):
        raise SynthError("nccl-xml: DOCTYPE and ENTITY declarations are not accepted")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise SynthError(f"nccl-xml: not well-formed XML ({exc})") from None
    if root.tag != "system":
        raise SynthError(f"nccl-xml: the root element is <{root.tag}>, expected <system>")
    hosts = {cpu.get("host_hash") for cpu in root.iter("cpu") if cpu.get("host_hash")}
    if len(hosts) > 1:
        raise SynthError(f"nccl-xml: {len(hosts)} hosts in one dump; import one host's file")
    gpus: list[tuple[int, list, ET.Element]] = []   # (rank, ancestors, gpu element)
    nets: list[tuple[str, float | None, list]] = []  # (name, GB/s, ancestors)

    def walk(node: ET.Element, path: list) -> None:
        for child in node:
            if child.tag == "gpu":
                try:
                    rank = int(child.get("rank", child.get("dev", "")))
                except ValueError:
                    raise SynthError(f"nccl-xml: <gpu> with rank {child.get('rank')!r} dev {child.get('dev')!r}"
                                     ) from None
                gpus.append((rank, path + [node], child))
            elif child.tag == "nic":
                for net in child.iter("net"):
                    nets.append((net.get("name", f"net{len(nets)}"), _mbps_to_gbps(net.get("speed")), path + [node]))
            else:
                walk(child, path + [node])

    walk(root, [])
    if not gpus:
        raise SynthError("nccl-xml: no <gpu> element")
    if len(gpus) > MAX_GPUS or len(nets) > MAX_NICS:
        raise SynthError(f"nccl-xml: more than {MAX_GPUS} GPUs or NICs")
    gpus.sort(key=lambda g: g[0])
    ranks = [g[0] for g in gpus]
    if ranks != list(range(len(gpus))):
        raise SynthError(f"nccl-xml: GPU ranks must be 0..{len(gpus) - 1}, got {ranks[:8]}")
    busid = {(g[1][-1].get("busid") or "").lower(): k for k, g in enumerate(gpus)}
    n = len(gpus)
    counts = [[0] * n for _ in range(n)]
    to_switch = [0] * n
    for i, (_, _, element) in enumerate(gpus):
        for link in element.iter("nvlink"):
            try:
                count = int(link.get("count", "1"))
            except ValueError:
                raise SynthError(f"nccl-xml: GPU {i}: nvlink count {link.get('count')!r}") from None
            if count < 0 or count > MAX_PAIR_LINKS:
                raise SynthError(f"nccl-xml: GPU {i}: nvlink count {count} out of range")
            target = (link.get("target") or "").lower()
            if link.get("tclass") == _NVSWITCH_CLASS:
                to_switch[i] += count
            elif link.get("tclass") in _GPU_CLASS and target in busid and busid[target] != i:
                counts[i][busid[target]] += count
    _symmetric(counts, "nccl-xml nvlink count")
    pcie = [[_xml_distance(gpus[i][1], gpus[j][1]) if i != j else "" for j in range(n)] for i in range(n)]
    nic_levels = [[_xml_distance(gpus[i][1], net[2]) for net in nets] for i in range(n)]
    order, gpu_nic = _assign_nics(nic_levels, [net[0] for net in nets])
    sms = set()
    for rank, _, element in gpus:
        try:
            sms.add(int(element.get("sm", "0") or 0))
        except ValueError:
            raise SynthError(f"nccl-xml: GPU {rank}: sm {element.get('sm')!r} is not an integer") from None
    generation = _generation_from_sm(min(sms)) if any(map(any, counts)) or any(to_switch) else 0
    return BoxFabric("nccl-xml", "nvlink", tuple(map(tuple, counts)), tuple(to_switch), tuple(map(tuple, pcie)),
                     tuple((nets[j][0], nets[j][1]) for j in order), tuple(gpu_nic),
                     link_gbps=NVLINK_GBPS.get(generation), pcie_gbps=_pcie_gbps(gpus[0][1][-1]),
                     generation=generation)


def _mbps_to_gbps(speed: str | None) -> float | None:
    try:
        value = float(speed) / 8000 if speed is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 and math.isfinite(value) else None


def _generation_from_sm(sm: int) -> int:
    return 5 if sm >= 100 else 4 if sm >= 90 else 3 if sm >= 80 else 2 if sm >= 70 else 1 if sm >= 60 else 0


def _pcie_gbps(pci) -> float | None:
    """x16 rate of the generation in ``link_speed`` times ``link_width / 16`` (None if not given)."""
    match = re.match(r"\s*([0-9.]+)\s*GT/s", pci.get("link_speed") or "")
    if match is None:
        return None
    try:
        gen = PCIE_GEN_BY_GTS.get(float(match.group(1)))
    except ValueError:   # "2.5.0 GT/s"
        return None
    try:
        width = int(pci.get("link_width") or 16)
    except ValueError:
        width = 16
    return PCIE_GBPS[gen] * min(max(width, 1), 16) / 16 if gen else None


def _xml_distance(a: list, b: list) -> str:
    """PCIe distance between two devices given their ancestor lists (root first, the device's own <pci> last)."""
    common = 0
    while common < min(len(a), len(b)) and a[common] is b[common]:
        common += 1
    lca = a[common - 1] if common else None
    if lca is None or lca.tag == "system":
        return "SYS"
    if lca.tag == "cpu":
        return "PHB"
    return "PIX" if common == len(a) - 1 and common == len(b) - 1 else "PXB"


# --- building the topology ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    """The rates and alphas a build uses (defaults filled in; module docstring)."""

    link_bw: float
    link_alpha: float
    pcie_bw: float
    pcie_alpha: float
    nic_bw: float
    ib_alpha: float
    nic_from_source: bool


def resolve(box: BoxFabric, params: ImportParams) -> Resolved:
    """Fill the overrides the user left out from the source and the tables."""
    if box.kind == "xgmi":
        link_bw, link_alpha = box.link_gbps or XGMI_GBPS, DEFAULT_XGMI_ALPHA
    else:
        link_bw, link_alpha = box.link_gbps or NVLINK_GBPS[3], DEFAULT_NVLINK_ALPHA
    source_nic = [bw for _, bw in box.nics if bw is not None]
    nic_bw = params.nic_bw or (min(source_nic) if source_nic else
                               DEFAULT_NIC_BY_NVLINK.get(box.generation, DEFAULT_NIC_GBPS))
    ib_alpha = DEFAULT_IB_ALPHA_FAST if nic_bw >= IB_GBPS["NDR"] else DEFAULT_IB_ALPHA_SLOW
    return Resolved(
        link_bw=params.link_bw or link_bw,
        link_alpha=link_alpha if params.link_alpha is None else params.link_alpha,
        pcie_bw=params.pcie_bw or box.pcie_gbps or PCIE_GBPS[4],
        pcie_alpha=DEFAULT_PCIE_ALPHA if params.pcie_alpha is None else params.pcie_alpha,
        nic_bw=nic_bw,
        ib_alpha=ib_alpha if params.ib_alpha is None else params.ib_alpha,
        nic_from_source=bool(source_nic) and params.nic_bw is None,
    )


def _groups(n: int, pairs: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Connected components of ``0..n-1`` under ``pairs`` (union-find), each sorted, in order of their first member."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        parent[find(a)] = find(b)
    groups: dict[int, list[int]] = {}
    for x in range(n):
        groups.setdefault(find(x), []).append(x)
    return sorted(groups.values())


def _pcie_tree(pcie: Sequence[Sequence[str]]) -> list[tuple[int | str, str]]:
    """Edges (child, switch) of the PCIe tree the distance matrix implies, nearest level first.

    At each level L of :data:`PCIE_LEVELS` the GPUs within distance L form groups (SYS: all); a group whose members
    hang off two or more different nodes so far gets a switch ``<l><k>`` (``pix0``, ``phb1``, ``sys0``) that those
    nodes link to. Pairs of unknown distance ("" for NVLinked pairs) meet at the top.
    """
    n = len(pcie)
    current: list[int | str] = list(range(n))
    edges: list[tuple[int | str, str]] = []
    for li, level in enumerate(PCIE_LEVELS):
        near = set(PCIE_LEVELS[:li + 1])
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if level == "SYS" or pcie[i][j] in near]
        count = 0
        for members in _groups(n, pairs):
            heads = list(dict.fromkeys(current[m] for m in members))
            if len(heads) < 2:
                continue
            switch = f"{level.lower()}{count}"
            count += 1
            edges.extend((head, switch) for head in heads)
            for m in members:
                current[m] = switch
    return edges


def build_topology(box: BoxFabric, params: ImportParams = ImportParams(), *, nodes: int = 1, ib_switches: int = 1,
                   name: str = "imported", source: str = "") -> Topology:
    """The validated topology of ``nodes`` copies of ``box`` (ranks box after box; ``machines`` one per box).

    In a box: direct NVLink/xGMI pairs at ``count x link_bw``; NVSwitch GPUs each to switch ``nvswitch`` at
    ``switch_links x link_bw``; the PCIe tree (:func:`_pcie_tree`, ``pcie_bw`` per hop) only when NVLink/xGMI
    leave some GPUs unconnected (NCCL does not route GPU-GPU traffic over PCIe where NVLink joins every GPU).
    With ``nodes > 1``: GPU i to its NIC ``b<k>.nic<j>`` at ``nic_bw`` alpha 0, NIC j to IB switch
    ``ib<j % ib_switches>`` at ``nic_bw`` with ``ib_alpha``; a box without NICs links each GPU i to
    ``ib<i % ib_switches>`` (as the built-in mi250-2node). Box switch names get a ``b<k>.`` prefix when
    ``nodes > 1`` (the built-ins' names). One box has no NIC nodes (they would lead nowhere).
    """
    if nodes < 1 or nodes > 4096:
        raise SynthError(f"--nodes must be 1..4096, got {nodes}")
    if ib_switches < 1 or ib_switches > max(1, len(box.nics) or box.gpus):
        raise SynthError(f"--ib-switches must be 1..{max(1, len(box.nics) or box.gpus)} (one per NIC at most), "
                         f"got {ib_switches}")
    if box.gpus * nodes > 1_000_000:
        raise SynthError(f"{box.gpus * nodes} ranks; the limit is 1000000")
    rates = resolve(box, params)
    n = box.gpus
    direct = [(i, j) for i in range(n) for j in range(i + 1, n) if box.links[i][j]]
    switched = [i for i in range(n) if box.switch_links[i]]
    joined = direct + [(i, switched[0]) for i in switched]
    with_pcie = len(_groups(n, joined)) > 1
    tree = _pcie_tree(box.pcie) if with_pcie else []
    switches: list[str] = []
    ids: dict[str, int] = {}
    entries: list[tuple[int, int, float, float, bool]] = []
    total = n * nodes

    def node(name_: str) -> int:
        if name_ not in ids:
            ids[name_] = total + len(switches)
            switches.append(name_)
        return ids[name_]

    uplinks: list[tuple[int, int]] = []  # (NIC or GPU node, uplink index)
    for k in range(nodes):
        base, prefix = k * n, (f"b{k}." if nodes > 1 else "")
        for i, j in direct:
            entries.append((base + i, base + j, box.links[i][j] * rates.link_bw, rates.link_alpha, False))
        for i in switched:
            entries.append((base + i, node(prefix + "nvswitch"), box.switch_links[i] * rates.link_bw,
                            rates.link_alpha, False))
        for child, parent in tree:
            a = base + child if isinstance(child, int) else node(prefix + child)
            entries.append((a, node(prefix + parent), rates.pcie_bw, rates.pcie_alpha, False))
        if nodes == 1:
            continue
        if box.nics:
            for i in range(n):
                if box.gpu_nic[i] >= 0:
                    entries.append((base + i, node(f"{prefix}nic{box.gpu_nic[i]}"), rates.nic_bw, 0.0, False))
        uplinks += [(node(f"{prefix}nic{j}"), j) for j in range(len(box.nics))] if box.nics else \
            [(base + i, i) for i in range(n)]
    for a, j in uplinks:  # IB switches after every box's nodes, as in the built-ins
        entries.append((a, node(f"ib{j % ib_switches}"), rates.nic_bw, rates.ib_alpha, False))
    if nodes > 1 and box.nics and min(box.gpu_nic) < 0:
        raise SynthError("some GPUs have no NIC near them; multi-node fabrics need every GPU to reach a NIC")

    def fail(index: int, problem: str) -> SynthError:
        return SynthError(f"{name}: imported link {index}: {problem}")

    topology = Topology(name=name, num_ranks=total, links=merge_links(entries, fail), switches=tuple(switches),
                        machines=tuple(tuple(range(k * n, (k + 1) * n)) for k in range(nodes)),
                        description=describe(box, rates, nodes, ib_switches, with_pcie, source))
    return check_topology(topology, name)


def describe(box: BoxFabric, rates: Resolved, nodes: int, ib_switches: int, with_pcie: bool, source: str) -> str:
    """One paragraph: where the fabric came from and every rate it assumed."""
    kind = "xGMI" if box.kind == "xgmi" else (f"NVLink{box.generation}" if box.generation else "NVLink")
    parts = [f"Imported from {source or box.fmt} ({box.fmt}): {box.gpus} GPUs"]
    if any(map(any, box.links)):
        parts.append(f"direct {kind} links x {rates.link_bw:g} GB/s per link, alpha {rates.link_alpha:g} us")
    if any(box.switch_links):
        parts.append(f"NVSwitch: {max(box.switch_links)} {kind} links per GPU x {rates.link_bw:g} GB/s, "
                     f"alpha {rates.link_alpha:g} us")
    if with_pcie:
        parts.append(f"PCIe tree {rates.pcie_bw:g} GB/s per hop, alpha {rates.pcie_alpha:g} us")
    nic_note = "from the source" if rates.nic_from_source else "default"
    plural = "s" if len(box.nics) != 1 else ""
    parts.append(f"{len(box.nics)} NIC{plural} ({', '.join(name for name, _ in box.nics[:8])}"
                 f"{', ...' if len(box.nics) > 8 else ''}) at {rates.nic_bw:g} GB/s ({nic_note})"
                 if box.nics else "no NICs in the source")
    if nodes > 1:
        parts.append(f"{nodes} nodes on {ib_switches} IB switch(es), IB alpha {rates.ib_alpha:g} us")
    parts.extend(box.notes)
    parts.append("rates: synth.topology.importers, docs/topology.md")
    return "; ".join(parts) + "."


def import_topology(text: str, fmt: str | None = None, params: ImportParams = ImportParams(), *, nodes: int = 1,
                    ib_switches: int = 1, name: str = "imported", source: str = "") -> tuple[BoxFabric, Topology]:
    """Parse ``text`` (format ``fmt`` or detected) and build the topology (:func:`build_topology`)."""
    box = parse(text, fmt)
    if box.gpus < 1:
        raise SynthError("no GPUs in the source")
    return box, build_topology(box, params, nodes=nodes, ib_switches=ib_switches, name=name, source=source)


# --- msccl-tools topology JSON (parsed by synth.topology.msccl_tools) ---------------------------------------


def parse_msccl_topology(text: str) -> BoxFabric:
    """The :class:`~synth.topology.importers.BoxFabric` of msccl-tools topology JSON text."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SynthError(f"msccl-tools topology: not valid JSON ({exc})") from None
    except RecursionError:
        raise SynthError("msccl-tools topology: not valid JSON (nested too deeply)") from None
    return msccl_box(doc)


def msccl_box(doc: Any, source: str = "msccl-tools topology") -> BoxFabric:
    """The :class:`~synth.topology.importers.BoxFabric` of a decoded msccl-tools topology."""
    name, counts, switch_units = link_counts(doc, source)
    n = len(counts)
    if any(switch_units):
        links, switch_links = tuple(tuple(row) for row in counts), tuple(switch_units)
    else:
        links, switch_links = switch_or_mesh(counts)
    return BoxFabric("msccl-tools", "nvlink", links, switch_links, tuple(("",) * n for _ in range(n)),
                     generation=nvlink_generation(links, switch_links),
                     notes=(f"msccl-tools topology {name!r}: one link unit = one NVLink",))


def topology_from_msccl(doc: Any, source: str = "msccl-tools topology", name: str | None = None) -> Topology:
    """A validated synth :class:`~synth.topology.model.Topology` of a decoded msccl-tools topology, at the
    import defaults (docs/topology.md): ``-t FILE`` and an SCCL algorithm's embedded topology use this."""
    box = msccl_box(doc, source)
    return replace(build_topology(box, name=name or _legal_name(doc["name"]), source=source), source=source)


def _legal_name(name: str) -> str:
    """msccl-tools names such as ``HubAndSpoke(n=4)`` as a synth topology name (letters, digits, . _ -)."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "msccl-tools"

"""Parametric topology families (pure functions returning canonical, validated Topology objects).

Every link is bidirectional unless stated (one link in each direction, ``bw`` GB/s each way).
Defaults: 50 GB/s and 0.5 µs per link (docs/topology.md, built-ins).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from synth.errors import SynthError
from synth.topology.checks import check_topology, merge_links
from synth.topology.model import Topology

DEFAULT_BW = 50.0
DEFAULT_ALPHA = 0.5

Node = int | str

#: Most ranks, and most switches, in a generated topology (the file schema's ranks maximum).
MAX_NODES = 1_000_000
#: Most link entries a generator may add (fully-connected 1414 is about this): past it the file would be
#: larger than synth reads back (32 MiB of JSON, docs/topology.md), so fail before building it.
MAX_LINK_ENTRIES = 1_000_000


class _Builder:
    """Collects (src, dst, bw, alpha, directed) entries by node name, then merges them canonically."""

    def __init__(self, num_ranks: int, switches: Sequence[str] = ()) -> None:
        if num_ranks > MAX_NODES or len(switches) > MAX_NODES:
            raise SynthError(f"{num_ranks} ranks and {len(switches)} switches: the limit is {MAX_NODES} of each")
        self.num_ranks = num_ranks
        self.switches = list(switches)     # appended to: a tuple rebuilt per switch was quadratic
        self._ids = {name: num_ranks + k for k, name in enumerate(self.switches)}
        self._entries: list[tuple[int, int, float, float, bool]] = []

    def add_switch(self, name: str) -> str:
        if name not in self._ids:
            if len(self.switches) >= MAX_NODES:
                raise SynthError(f"more than {MAX_NODES:,} switches: the limit of a generated topology")
            self._ids[name] = self.num_ranks + len(self.switches)
            self.switches.append(name)
        return name

    def _id(self, node: Node) -> int:
        return node if isinstance(node, int) else self._ids[node]

    def link(self, a: Node, b: Node, bw: float, alpha: float, directed: bool = False) -> None:
        if len(self._entries) >= MAX_LINK_ENTRIES:
            raise SynthError(f"more than {MAX_LINK_ENTRIES:,} links; generate a smaller topology")
        self._entries.append((self._id(a), self._id(b), float(bw), float(alpha), directed))

    def build(self, name: str, description: str = "", machines: Sequence[Sequence[int]] = ()) -> Topology:
        def fail(index: int, problem: str) -> SynthError:
            return SynthError(f"{name}: generated link {index}: {problem}")

        topology = Topology(
            name=name,
            num_ranks=self.num_ranks,
            links=merge_links(self._entries, fail),
            switches=tuple(self.switches),
            machines=tuple(tuple(int(r) for r in m) for m in machines),
            description=description,
        )
        return check_topology(topology, name)


def _check(bw: float, alpha: float, what: str = "") -> None:
    if not (bw > 0 and bw != float("inf")):
        raise SynthError(f"{what}bw must be a positive finite number (GB/s), got {bw}")
    if not (alpha >= 0 and alpha != float("inf")):
        raise SynthError(f"{what}alpha must be a finite number >= 0 (µs), got {alpha}")


def _check_count(value: int, what: str, minimum: int = 1, maximum: int = MAX_NODES) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise SynthError(f"{what} must be an integer >= {minimum}, got {value}")
    if value > maximum:
        raise SynthError(f"{what} must be at most {maximum}, got {value}")
    return int(value)


def _fmt(x: float) -> str:
    return f"{x:g}"


def ring(n: int, bw: float = DEFAULT_BW, alpha: float = DEFAULT_ALPHA, *, bidirectional: bool = True,
         name: str | None = None) -> Topology:
    """Ranks 0..n-1 in a ring: i <-> i+1 mod n (one-way i -> i+1 if not ``bidirectional``)."""
    n = _check_count(n, "ring size")
    _check(bw, alpha)
    b = _Builder(n)
    pairs = {(i, (i + 1) % n) for i in range(n) if n > 1}
    if bidirectional:  # n == 2: the two "ring" links are the same pair, add it once
        pairs = {(min(p), max(p)) for p in pairs}
    for i, j in sorted(pairs):
        b.link(i, j, bw, alpha, directed=not bidirectional)
    kind = "bidirectional" if bidirectional else "unidirectional"
    return b.build(name or f"ring-{n}", f"{kind} ring of {n} ranks, {_fmt(bw)} GB/s, {_fmt(alpha)} us per link")


def line(n: int, bw: float = DEFAULT_BW, alpha: float = DEFAULT_ALPHA, *, name: str | None = None) -> Topology:
    """Ranks 0..n-1 on a path: i <-> i+1."""
    n = _check_count(n, "line size")
    _check(bw, alpha)
    b = _Builder(n)
    for i in range(n - 1):
        b.link(i, i + 1, bw, alpha)
    return b.build(name or f"line-{n}", f"line of {n} ranks, {_fmt(bw)} GB/s, {_fmt(alpha)} us per link")


def fully_connected(n: int, bw: float = DEFAULT_BW, alpha: float = DEFAULT_ALPHA, *,
                    name: str | None = None) -> Topology:
    """Every pair of ranks has its own link."""
    n = _check_count(n, "rank count")
    _check(bw, alpha)
    b = _Builder(n)
    for i, j in itertools.combinations(range(n), 2):
        b.link(i, j, bw, alpha)
    return b.build(name or f"fully-connected-{n}",
                   f"fully connected {n} ranks, {_fmt(bw)} GB/s, {_fmt(alpha)} us per pair")


def _grid(dims: Sequence[int], wrap: bool, bw: float, alpha: float, name: str | None) -> Topology:
    dims = tuple(_check_count(d, "each dimension") for d in dims)
    if not dims:
        raise SynthError("a mesh or torus needs at least one dimension")
    _check(bw, alpha)
    n = 1
    for d in dims:
        n *= d
    if n > 1_000_000:
        raise SynthError(f"{'x'.join(map(str, dims))} has {n} ranks; the limit is 1000000")
    strides = [1] * len(dims)  # rank = sum(coord[k] * strides[k]), last dimension fastest
    for k in range(len(dims) - 2, -1, -1):
        strides[k] = strides[k + 1] * dims[k + 1]
    b = _Builder(n)
    pairs: set[tuple[int, int]] = set()
    for coord in itertools.product(*(range(d) for d in dims)):
        rank = sum(c * s for c, s in zip(coord, strides, strict=True))
        for k, d in enumerate(dims):
            if coord[k] + 1 < d:
                pairs.add((rank, rank + strides[k]))
            elif wrap and d > 2:  # wrap-around; for d == 2 it is the same pair as the mesh link
                pairs.add((rank - coord[k] * strides[k], rank))
    for i, j in sorted(pairs):
        b.link(i, j, bw, alpha)
    kind = "torus" if wrap else "mesh"
    shape = "x".join(map(str, dims))
    return b.build(
        name or f"{kind}-{shape}",
        f"{len(dims)}-D {kind} {shape} (rank = row-major coordinates), {_fmt(bw)} GB/s, {_fmt(alpha)} us per link",
    )


def mesh(dims: Sequence[int], bw: float = DEFAULT_BW, alpha: float = DEFAULT_ALPHA, *,
         name: str | None = None) -> Topology:
    """N-dimensional mesh: neighbours differ by one in one coordinate (row-major rank numbering)."""
    return _grid(dims, False, bw, alpha, name)


def torus(dims: Sequence[int], bw: float = DEFAULT_BW, alpha: float = DEFAULT_ALPHA, *,
          name: str | None = None) -> Topology:
    """N-dimensional torus: a mesh plus wrap-around links (a size-2 dimension has one link per pair)."""
    return _grid(dims, True, bw, alpha, name)


def hypercube(dim: int, bw: float = DEFAULT_BW, alpha: float = DEFAULT_ALPHA, *,
              name: str | None = None) -> Topology:
    """2**dim ranks; i <-> i XOR 2**k for every bit k."""
    dim = _check_count(dim, "hypercube dimension", minimum=0)
    if dim > 20:
        raise SynthError(f"hypercube dimension {dim} is too large (limit 20)")
    _check(bw, alpha)
    n = 1 << dim
    b = _Builder(n)
    for i in range(n):
        for k in range(dim):
            j = i ^ (1 << k)
            if i < j:
                b.link(i, j, bw, alpha)
    return b.build(name or f"hypercube-{n}",
                   f"{dim}-D hypercube of {n} ranks, {_fmt(bw)} GB/s, {_fmt(alpha)} us per link")


def star(n: int, bw: float = DEFAULT_BW, alpha: float = DEFAULT_ALPHA, *, switch: str = "switch",
         name: str | None = None, machines: Sequence[Sequence[int]] | None = None,
         description: str | None = None) -> Topology:
    """n ranks, each with one link to a single switch (an NVSwitch box, a crossbar)."""
    n = _check_count(n, "rank count")
    _check(bw, alpha)
    b = _Builder(n, [switch])
    for i in range(n):
        b.link(i, switch, bw, alpha)
    text = description or f"{n} ranks on one switch {switch!r}, {_fmt(bw)} GB/s, {_fmt(alpha)} us per link"
    return b.build(name or f"star-{n}", text, machines or ())


def leaf_spine(leaves: int, per_leaf: int, spines: int = 1, bw: float = DEFAULT_BW, alpha: float = DEFAULT_ALPHA,
               *, uplink_bw: float | None = None, uplink_alpha: float | None = None,
               name: str | None = None) -> Topology:
    """Two-level fat tree: ``per_leaf`` ranks under each leaf switch, every leaf linked to every spine.

    Rank r sits under ``leaf{r // per_leaf}``. Rank<->leaf links use (bw, alpha); leaf<->spine links
    use (uplink_bw, uplink_alpha), by default ``bw * per_leaf / spines`` (a non-blocking tree) and alpha.
    Under the circuits of docs/cost-model.md an uplink carries one transfer at a time, at most ``bw``
    (:meth:`Topology.circuit_capacities`), so leaves talk to each other at full rate only with
    ``spines >= per_leaf``.
    """
    leaves = _check_count(leaves, "leaves")
    per_leaf = _check_count(per_leaf, "ranks per leaf")
    spines = _check_count(spines, "spines", minimum=0 if leaves == 1 else 1)
    _check(bw, alpha)
    if uplink_bw is not None:
        up_bw = uplink_bw
    else:
        up_bw = bw * per_leaf / spines if spines else bw
    up_alpha = alpha if uplink_alpha is None else uplink_alpha
    _check(up_bw, up_alpha, "uplink ")
    b = _Builder(leaves * per_leaf)
    for leaf in range(leaves):
        b.add_switch(f"leaf{leaf}")
    for spine in range(spines):
        b.add_switch(f"spine{spine}")
    for r in range(leaves * per_leaf):
        b.link(r, f"leaf{r // per_leaf}", bw, alpha)
    for leaf in range(leaves):
        for spine in range(spines):
            b.link(f"leaf{leaf}", f"spine{spine}", up_bw, up_alpha)
    return b.build(
        name or f"leaf-spine-{leaves}x{per_leaf}",
        f"leaf-spine: {leaves} leaves x {per_leaf} ranks, {spines} spines; rank-leaf {_fmt(bw)} GB/s "
        f"{_fmt(alpha)} us, leaf-spine {_fmt(up_bw)} GB/s {_fmt(up_alpha)} us",
    )


fat_tree = leaf_spine


def from_matrix(matrix: Sequence[Sequence[float]], bw_per_link: float = DEFAULT_BW, alpha: float = DEFAULT_ALPHA,
                *, name: str = "matrix", description: str = "", machines: Sequence[Sequence[int]] | None = None
                ) -> Topology:
    """Ranks i <-> j with ``matrix[i][j] * bw_per_link`` GB/s each way (``matrix``: symmetric link counts)."""
    n = len(matrix)
    _check(bw_per_link, alpha)
    if n < 1 or any(len(row) != n for row in matrix):
        raise SynthError(f"{name}: the link matrix must be square and non-empty")
    b = _Builder(n)
    for i, j in itertools.product(range(n), repeat=2):
        if matrix[i][j] != matrix[j][i] or matrix[i][j] < 0 or (i == j and matrix[i][j]):
            raise SynthError(f"{name}: the link matrix must be symmetric, >= 0, zero diagonal (entry {i},{j})")
        if i < j and matrix[i][j]:
            b.link(i, j, matrix[i][j] * bw_per_link, alpha)
    return b.build(name, description, machines or ())


@dataclass(frozen=True)
class Box:
    """One box of a multi-box fabric (:func:`boxes_on_ib`): ``per_box`` ranks and how they reach IB.

    ``intra``: ``"nvswitch"`` (every rank <-> switch ``b{k}.nvswitch`` at intra_bw), ``"mesh"`` (every
    rank pair at intra_bw) or a per_box x per_box symmetric matrix of GB/s per direction (0 = no link),
    all with intra_alpha. ``nics``: NIC nodes per box (switches ``b{k}.nic{j}``; None = one per rank);
    rank i uses NIC ``i * nics // per_box`` over gpu_nic_bw (None = nic_bw) and gpu_nic_alpha, and NIC j
    links to IB switch ``ib{j % ib_switches}`` at nic_bw with ib_alpha. ``nics=0`` links rank i
    straight to ``ib{i % ib_switches}`` at nic_bw with ib_alpha.
    """

    per_box: int
    intra: str | tuple[tuple[float, ...], ...] = "nvswitch"
    intra_bw: float = DEFAULT_BW
    intra_alpha: float = DEFAULT_ALPHA
    nics: int | None = None
    gpu_nic_bw: float | None = None
    gpu_nic_alpha: float = 0.0
    nic_bw: float = 25.0
    ib_alpha: float = 2.0


def _checked_box(box: Box, ib_switches: int) -> Box:
    """``box`` with counts resolved (nics, gpu_nic_bw) and a tuple matrix; raises SynthError if invalid."""
    per_box = _check_count(box.per_box, "ranks per box")
    nics = per_box if box.nics is None else _check_count(box.nics, "NICs per box", minimum=0)
    _check(box.intra_bw, box.intra_alpha, "intra-box ")
    _check(box.nic_bw, box.ib_alpha, "NIC ")
    g_bw = box.nic_bw if box.gpu_nic_bw is None else box.gpu_nic_bw
    _check(g_bw, box.gpu_nic_alpha, "GPU-NIC ")
    if nics > per_box:
        raise SynthError(f"NICs per box ({nics}) cannot exceed ranks per box ({per_box})")
    if ib_switches > (nics or per_box):
        raise SynthError(f"{ib_switches} IB switches but only {nics or per_box} uplinks per box: "
                         "some IB switch would be isolated")
    intra: str | tuple[tuple[float, ...], ...]
    if isinstance(box.intra, str):
        if box.intra not in ("nvswitch", "mesh"):
            raise SynthError(f"intra-box fabric must be 'nvswitch', 'mesh' or a matrix, got {box.intra!r}")
        intra = box.intra
    else:
        intra = tuple(tuple(float(x) for x in row) for row in box.intra)
        if len(intra) != per_box or any(len(row) != per_box for row in intra):
            raise SynthError(f"the intra-box matrix must be {per_box}x{per_box}")
        for i, j in itertools.product(range(per_box), repeat=2):
            if intra[i][j] != intra[j][i] or intra[i][j] < 0 or (i == j and intra[i][j]):
                raise SynthError(f"the intra-box matrix must be symmetric, >= 0, zero diagonal (entry {i},{j})")
    return replace(box, per_box=per_box, intra=intra, nics=nics, gpu_nic_bw=g_bw)


def boxes_on_ib(boxes: Sequence[Box], ib_switches: int = 1, *, name: str = "boxes", description: str = "",
                machines: bool = True) -> Topology:
    """Boxes (possibly of different kinds) on shared IB switches ``ib0..ib{ib_switches-1}``.

    Ranks are numbered box after box: box k holds ranks ``sum(per_box of boxes < k) + i``. Each box is
    wired as its :class:`Box` says, with node names ``b{k}.nvswitch`` and ``b{k}.nic{j}``. With
    ``machines`` the topology lists one machine per box (the ``machines`` key of docs/topology.md), otherwise none.
    """
    ib_switches = _check_count(ib_switches, "IB switches")
    if not boxes:
        raise SynthError("boxes_on_ib needs at least one box")
    checked: dict[int, Box] = {}    # a box repeated (the CLI's --boxes N) is checked once
    specs = [checked.get(id(box)) or checked.setdefault(id(box), _checked_box(box, ib_switches)) for box in boxes]
    total = sum(spec.per_box for spec in specs)
    b = _Builder(total)
    uplinks: list[tuple[Node, int, float, float]] = []  # (NIC or rank, IB switch, bw, alpha): linked once ib* exist
    ranges: list[range] = []
    base = 0
    for k, spec in enumerate(specs):
        per_box, nics = spec.per_box, spec.nics
        assert nics is not None and spec.gpu_nic_bw is not None  # resolved by _checked_box
        if spec.intra == "nvswitch":
            sw = b.add_switch(f"b{k}.nvswitch")
            for i in range(per_box):
                b.link(base + i, sw, spec.intra_bw, spec.intra_alpha)
        elif spec.intra == "mesh":
            for i, j in itertools.combinations(range(per_box), 2):
                b.link(base + i, base + j, spec.intra_bw, spec.intra_alpha)
        else:
            for i, j in itertools.combinations(range(per_box), 2):
                if spec.intra[i][j] > 0:
                    b.link(base + i, base + j, spec.intra[i][j], spec.intra_alpha)
        for j in range(nics):
            uplinks.append((b.add_switch(f"b{k}.nic{j}"), j % ib_switches, spec.nic_bw, spec.ib_alpha))
        for i in range(per_box):
            if nics:
                b.link(base + i, f"b{k}.nic{i * nics // per_box}", spec.gpu_nic_bw, spec.gpu_nic_alpha)
            else:
                uplinks.append((base + i, i % ib_switches, spec.nic_bw, spec.ib_alpha))
        ranges.append(range(base, base + per_box))
        base += per_box
    for j in range(ib_switches):
        b.add_switch(f"ib{j}")
    for node, j, bw, alpha in uplinks:
        b.link(node, f"ib{j}", bw, alpha)
    return b.build(name, description, ranges if machines else ())


def boxes_behind_nics(
    boxes: int,
    per_box: int = 8,
    *,
    intra: str | Sequence[Sequence[float]] = "nvswitch",
    intra_bw: float = DEFAULT_BW,
    intra_alpha: float = DEFAULT_ALPHA,
    nics_per_box: int | None = None,
    gpu_nic_bw: float | None = None,
    gpu_nic_alpha: float = 0.0,
    nic_bw: float = 25.0,
    ib_switches: int = 1,
    ib_alpha: float = 2.0,
    name: str | None = None,
    description: str | None = None,
) -> Topology:
    """Multi-node boxes: ``boxes`` x ``per_box`` ranks; rank ``b*per_box + i`` is GPU i of box b.

    Intra-box fabric: ``"nvswitch"`` (every GPU <-> switch ``b{b}.nvswitch`` at intra_bw),
    ``"mesh"`` (every GPU pair at intra_bw), or a per_box x per_box symmetric matrix of GB/s per
    direction (0 = no link), all with intra_alpha.
    NICs: ``nics_per_box`` NIC nodes (switches ``b{b}.nic{j}``, default one per GPU); GPU i uses NIC
    ``i * nics_per_box // per_box`` over gpu_nic_bw (default nic_bw) and gpu_nic_alpha; NIC j
    links to IB switch ``ib{j % ib_switches}`` at nic_bw with ib_alpha. ``nics_per_box=0`` links
    GPU i straight to ``ib{i % ib_switches}`` at nic_bw with ib_alpha. (Identical boxes of
    :func:`boxes_on_ib`.)
    """
    boxes = _check_count(boxes, "boxes")
    matrix = intra if isinstance(intra, str) else tuple(tuple(float(x) for x in row) for row in intra)
    box = _checked_box(Box(per_box, matrix, intra_bw, intra_alpha, nics_per_box, gpu_nic_bw, gpu_nic_alpha,
                           nic_bw, ib_alpha), _check_count(ib_switches, "IB switches"))
    fabric = intra if isinstance(intra, str) else "matrix"
    text = description or (
        f"{boxes} boxes x {box.per_box} ranks; intra-box {fabric} {_fmt(intra_bw)} GB/s {_fmt(intra_alpha)} us; "
        f"{box.nics} NICs per box (GPU-NIC {_fmt(box.gpu_nic_bw)} GB/s {_fmt(gpu_nic_alpha)} us), "
        f"NIC-IB {_fmt(nic_bw)} GB/s {_fmt(ib_alpha)} us, {ib_switches} IB switches"
    )
    return boxes_on_ib([box] * boxes, ib_switches, name=name or f"boxes-{boxes}x{box.per_box}", description=text)


def random_regular(n: int, degree: int, seed: int, bws: Sequence[float] = (25.0, 50.0, 100.0),
                   alpha: float = DEFAULT_ALPHA, *, name: str | None = None) -> Topology:
    """A connected random ``degree``-regular graph on ``n`` ranks, each edge one link per direction.

    ``random.Random(seed)`` draws a networkx seed for :func:`networkx.random_regular_graph` (the
    pairing model of Steger and Wormald, 1999) until the graph is connected, then one bandwidth per
    edge from ``bws`` (both directions alike), edges taken in sorted order. Same arguments, same
    topology.
    """
    import networkx as nx

    n = _check_count(n, "rank count", minimum=2)
    degree = _check_count(degree, "degree")
    if degree >= n or (n * degree) % 2:
        raise SynthError(f"no {degree}-regular graph on {n} ranks (need degree < n and n * degree even)")
    if not bws:
        raise SynthError("random_regular needs at least one bandwidth")
    for bw in bws:
        _check(bw, alpha)
    rng = random.Random(seed)
    for _ in range(1000):  # a random 3+-regular graph is connected with high probability (Bollobás)
        graph = nx.random_regular_graph(degree, n, seed=rng.randrange(2**32))
        if nx.is_connected(graph):
            break
    else:
        raise SynthError(f"no connected {degree}-regular graph on {n} ranks found (seed {seed})")
    b = _Builder(n)
    choices = tuple(float(bw) for bw in bws)
    for i, j in sorted((min(e), max(e)) for e in graph.edges):
        b.link(i, j, rng.choice(choices), alpha)
    return b.build(
        name or f"rr{degree}-{n}-s{seed}",
        f"random connected {degree}-regular graph on {n} ranks (networkx.random_regular_graph, seed {seed}); "
        f"each edge {'/'.join(_fmt(x) for x in choices)} GB/s (drawn with the seed), {_fmt(alpha)} us per link",
    )

"""Exact max-flow / min-cut helpers for the bounds (integer capacities, OR-Tools SimpleMaxFlow).

Bandwidths are scaled to integers once (:func:`integer_bandwidths`) so that every feasibility test of
the cut bounds is decided in exact integer arithmetic; no float tolerance enters a bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from synth.topology.model import Topology

# Keep products P * Q * bw_int well inside int64 (OR-Tools max-flow capacities are int64).
_MAX_SCALE = 10**6


@dataclass(frozen=True)
class IntegerBandwidth:
    """Per-link bandwidth as integers: ``bw[e] == ints[e] / scale`` (exact when ``exact``)."""

    ints: np.ndarray
    scale: float
    exact: bool


def integer_bandwidths(bw: np.ndarray) -> IntegerBandwidth:
    """Scale GB/s values to integers: exact when every value is a fraction with a small common
    denominator (12.5, 25, 0.1, 1/3 ...); otherwise rounded to 1e-9 relative (``exact=False``)."""
    if len(bw) == 0:
        return IntegerBandwidth(np.zeros(0, dtype=np.int64), 1.0, True)
    fracs = [Fraction(float(b)).limit_denominator(1000) for b in bw]
    if all(abs(float(f) - float(b)) <= 1e-12 * float(b) for f, b in zip(fracs, bw)):
        den = 1
        for f in fracs:
            den = den * f.denominator // math.gcd(den, f.denominator)
        if den <= _MAX_SCALE:
            ints = np.array([f.numerator * (den // f.denominator) for f in fracs], dtype=np.int64)
            g = int(np.gcd.reduce(ints))
            return IntegerBandwidth(ints // g, den / g, True)
    scale = 2.0**30 / float(np.max(bw))
    ints = np.maximum(1, np.round(np.asarray(bw) * scale)).astype(np.int64)
    return IntegerBandwidth(ints, scale, False)


def max_flow(num_nodes: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray,
             source: int, sink: int) -> tuple[int, np.ndarray]:
    """Max-flow value from ``source`` to ``sink`` and the source side of a minimum cut (bool mask)."""
    from ortools.graph.python import max_flow as mf

    solver = mf.SimpleMaxFlow()
    solver.add_arcs_with_capacity(tails.astype(np.int32), heads.astype(np.int32), caps.astype(np.int64))
    return _solve(solver, num_nodes, source, sink)


class FlowNetwork:
    """A fixed arc set on which many (source, sink) max-flows are solved (capacities fixed)."""

    def __init__(self, num_nodes: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray) -> None:
        from ortools.graph.python import max_flow as mf

        self.num_nodes = num_nodes
        self.solver = mf.SimpleMaxFlow()
        if len(tails):
            self.solver.add_arcs_with_capacity(tails.astype(np.int32), heads.astype(np.int32),
                                               caps.astype(np.int64))
        self.solves = 0

    def flow(self, source: int, sink: int) -> tuple[int, np.ndarray]:
        self.solves += 1
        return _solve(self.solver, self.num_nodes, source, sink)


def _solve(solver, num_nodes: int, source: int, sink: int) -> tuple[int, np.ndarray]:
    from ortools.graph.python import max_flow as mf

    status = solver.solve(source, sink)
    if status != mf.SimpleMaxFlow.OPTIMAL:
        raise RuntimeError(f"max-flow failed with status {status} (capacity overflow?)")
    mask = np.zeros(num_nodes, dtype=bool)
    side = solver.get_source_side_min_cut()
    if len(side):
        mask[np.asarray(side, dtype=np.int64)] = True
    return int(solver.optimal_flow()), mask


def cut_out(topology: Topology, mask: np.ndarray, weights: np.ndarray | None = None) -> float | int:
    """Total weight (default: bandwidth) of the links leaving the node set ``mask``."""
    src, dst, bw, _ = topology.arrays
    w = bw if weights is None else weights
    leaving = mask[src] & ~mask[dst]
    total = w[leaving].sum()
    return int(total) if np.issubdtype(np.asarray(w).dtype, np.integer) else float(total)


def describe_cut(topology: Topology, mask: np.ndarray) -> str:
    """Human-readable node set: compressed rank ranges plus switch names."""
    ranks = [int(v) for v in np.flatnonzero(mask[: topology.num_ranks])]
    switches = [topology.node_name(int(v)) for v in np.flatnonzero(mask[topology.num_ranks:]) + topology.num_ranks]
    parts = _ranges(ranks)
    text = f"ranks {{{parts}}}" if parts else "no ranks"
    if switches:
        shown = ", ".join(str(s) for s in switches[:6]) + (", ..." if len(switches) > 6 else "")
        text += f" + {len(switches)} switch(es) {{{shown}}}"
    return text


def _ranges(values: list[int]) -> str:
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    if len(out) > 8:
        out = out[:8] + ["..."]
    return ",".join(out)


# ---- symmetry: orbits of ranks, proven by explicit automorphisms --------------------------------
_U64 = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (vectorised, wrap-around arithmetic): a cheap hash for colour refinement."""
    x = np.asarray(x, dtype=_U64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
        return x ^ (x >> _U64(31))


def _dense(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Dense labels 0..k-1 for rows of the key columns, ordered lexicographically (canonical)."""
    order = np.lexsort(keys[::-1])
    change = np.zeros(len(order), dtype=bool)
    for col in keys:
        s = col[order]
        change[1:] |= s[1:] != s[:-1]
    labels = np.empty(len(order), dtype=np.int64)
    labels[order] = np.cumsum(change)
    return labels


def _refine(colors: np.ndarray, src: np.ndarray, dst: np.ndarray, wcls: np.ndarray) -> np.ndarray:
    """Colour refinement (1-WL) on a directed edge-labelled graph until the partition is stable.

    Only guides the automorphism search: two nodes with different final colours are never swapped by
    an automorphism (up to hash collisions, which can only merge colours, never split an orbit), and
    every candidate map is verified exactly afterwards."""
    n = len(colors)
    k = int(colors.max()) + 1
    with np.errstate(over="ignore"):
        while True:
            c = colors.astype(_U64)
            h_out = _mix(c[dst] * _U64(0x100000001B3) + wcls)
            h_in = _mix(c[src] * _U64(0x100000001B3) + wcls + _U64(0x9E3779B97F4A7C15))
            s_out = np.zeros(n, dtype=_U64)
            s_in = np.zeros(n, dtype=_U64)
            np.add.at(s_out, src, h_out)
            np.add.at(s_in, dst, h_in)
            new = _dense((colors, s_out, s_in))
            k2 = int(new.max()) + 1
            if k2 == k:
                return colors
            colors, k = new, k2


class _AutSearch:
    """Individualise-and-refine search for an automorphism mapping rank r to rank w.

    Runs refinement on the disjoint union G ⊔ G with r (first copy) and w (second copy) given the
    same fresh colour, so colours are comparable across copies; branches on the first non-singleton
    cell; a discrete partition gives a candidate bijection, accepted only if it maps the edge set
    (with bandwidths) onto itself and ranks onto ranks."""

    def __init__(self, base: np.ndarray, src: np.ndarray, dst: np.ndarray, wcls: np.ndarray,
                 bw: np.ndarray, budget: int) -> None:
        self.n = n = len(base)
        self.base = np.concatenate([base, base])
        self.src2 = np.concatenate([src, src + n])
        self.dst2 = np.concatenate([dst, dst + n])
        self.w2 = np.concatenate([wcls, wcls]).astype(_U64)
        self.src, self.dst, self.bw = src, dst, bw
        key = src * n + dst
        order = np.argsort(key)
        self.key_sorted, self.bw_sorted = key[order], bw[order]
        self.budget = budget
        self.deadline = math.inf

    def find(self, r: int, w: int) -> np.ndarray | None:
        colors = self.base.copy()
        fresh = int(colors.max()) + 1
        colors[r] = fresh
        colors[self.n + w] = fresh
        return self._search(colors)

    def _search(self, colors: np.ndarray) -> np.ndarray | None:
        if self.budget <= 0 or time.perf_counter() > self.deadline:
            self.budget = 0
            return None
        self.budget -= 1
        n = self.n
        colors = _refine(colors, self.src2, self.dst2, self.w2)
        ca, cb = colors[:n], colors[n:]
        k = int(colors.max()) + 1
        cnt_a = np.bincount(ca, minlength=k)
        if not np.array_equal(cnt_a, np.bincount(cb, minlength=k)):
            return None
        if cnt_a.max() <= 1:
            pos_b = np.empty(k, dtype=np.int64)
            pos_b[cb] = np.arange(n)
            perm = pos_b[ca]
            return perm if self._is_automorphism(perm) else None
        multi = np.flatnonzero(cnt_a > 1)
        cell = int(multi[np.argmin(cnt_a[multi])])
        x = int(np.flatnonzero(ca == cell)[0])
        cands = np.flatnonzero(cb == cell)
        # Try the successor of x first: on symmetric-group cells (ranks under one switch) this
        # yields one long cycle instead of a transposition, so few automorphisms merge a cell.
        cands = np.concatenate([cands[cands > x], cands[cands <= x]])
        for y in cands:
            c2 = colors.copy()
            fresh = k
            c2[x] = fresh
            c2[n + int(y)] = fresh
            found = self._search(c2)
            if found is not None:
                return found
            if self.budget <= 0:
                return None
        return None

    def _is_automorphism(self, perm: np.ndarray) -> bool:
        key = perm[self.src] * self.n + perm[self.dst]
        order = np.argsort(key)
        return bool(np.array_equal(key[order], self.key_sorted) and np.array_equal(self.bw[order], self.bw_sorted))


def _twin_classes(topology: Topology, fixed: tuple[int, ...]) -> np.ndarray:
    """Class id per node: nodes of the same kind with identical in- and out-neighbourhoods
    (neighbour, bandwidth). Swapping two such "false twins" is always an automorphism."""
    out: list[list[tuple[int, float]]] = [[] for _ in range(topology.num_nodes)]
    inc: list[list[tuple[int, float]]] = [[] for _ in range(topology.num_nodes)]
    for link in topology.links:
        out[link.src].append((link.dst, link.bw))
        inc[link.dst].append((link.src, link.bw))
    ids: dict[tuple, int] = {}
    cls = np.empty(topology.num_nodes, dtype=np.int64)
    for v in range(topology.num_nodes):
        key = ("fixed", v) if v in fixed else (topology.is_switch(v), tuple(sorted(out[v])), tuple(sorted(inc[v])))
        cls[v] = ids.setdefault(key, len(ids))
    return cls


def rank_orbits(topology: Topology, fixed: tuple[int, ...] = (), *, budget: int = 400,
                time_limit_s: float = 3.0) -> list[list[int]]:
    """Partition the ranks into groups that are *proven* to lie in one orbit of the automorphism
    group of the fabric (maps ranks to ranks, switches to switches, links to links of equal
    bandwidth) that fixes every node in ``fixed``.

    Proof by construction: two ranks are merged only through an automorphism found and verified
    explicitly; groups are the connected components of all found permutations, i.e. orbits of the
    group they generate (a subgroup), so a group never mixes two true orbits. When the search runs
    out of ``budget`` (refinement calls) or time, ranks stay apart, which is always safe: callers then
    just test more ranks. On vertex-transitive fabrics (torus, ring, hypercube, fully connected, a
    star) a handful of automorphisms merges all ranks into one group.

    False twins (same in/out neighbours and bandwidths, e.g. the ranks under one leaf switch, or the
    spines of a leaf-spine) are merged first and the search runs on the quotient graph (one node per
    twin class, coloured by class size): an automorphism of the quotient that preserves class sizes
    lifts to the fabric by mapping each class onto its image in any order.
    """
    n = topology.num_ranks
    src, dst, bw, _ = topology.arrays
    cls = _twin_classes(topology, fixed)
    k = int(cls.max()) + 1
    size = np.bincount(cls, minlength=k)
    # quotient graph (false twins have no links between them, and links between two classes are
    # all present with one bandwidth, so deduplicating keeps exactly the quotient's links)
    qe = np.unique(np.stack([cls[src], cls[dst], np.unique(bw, return_inverse=True)[1]], axis=1), axis=0)
    _, first = np.unique(cls, return_index=True)
    qbw = np.unique(bw)[qe[:, 2]]
    kind = np.array([0 if v < n else 1 for v in first], dtype=np.int64)
    init = _dense((kind, size.astype(np.int64)))
    fixed_q = tuple(int(cls[f]) for f in fixed)
    for i, f in enumerate(fixed_q):
        init[f] = int(init.max()) + 1 + i
    init = _dense((init,))
    rank_classes = sorted({int(cls[v]) for v in range(n) if v not in fixed})
    parent = _orbit_search(k, qe[:, 0], qe[:, 1], qbw, init, rank_classes, budget, time_limit_s)
    out: dict[int, list[int]] = {}
    for v in range(n):
        root = int(cls[v])
        while parent[root] != root:
            root = int(parent[root])
        out.setdefault(root, []).append(v)
    return list(out.values())


def _orbit_search(nodes: int, src: np.ndarray, dst: np.ndarray, bw: np.ndarray, init: np.ndarray,
                  candidates: list[int], budget: int, time_limit_s: float) -> np.ndarray:
    """Union-find forest over nodes whose components are orbits of found automorphisms."""
    _, wcls = np.unique(bw, return_inverse=True)
    base = _refine(init, src, dst, wcls.astype(_U64))
    search = _AutSearch(base, src, dst, wcls, bw, budget)
    deadline = time.perf_counter() + time_limit_s
    search.deadline = deadline
    parent = np.arange(nodes)

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    reps: dict[int, list[int]] = {}
    for v in candidates:
        group = reps.setdefault(int(base[v]), [])
        if any(find(v) == find(r) for r in group):
            continue
        merged = False
        for r in group[:4]:
            if search.budget <= 0 or time.perf_counter() > deadline:
                break
            perm = search.find(r, v)
            if perm is not None:
                for a in range(nodes):
                    ra, rb = find(a), find(int(perm[a]))
                    if ra != rb:
                        parent[rb] = ra
                merged = True
                break
        if not merged:
            group.append(v)
    for a in range(nodes):
        parent[a] = find(a)
    return parent

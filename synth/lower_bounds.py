"""Exact lower bounds on collective completion time under the α-β cost model of docs/cost-model.md.

Every bound here is a *lower* bound: no schedule that obeys the cost model (links full duplex, one
transfer at a time per link direction, switches forward but never store or reduce) can finish
faster. ``time_bound = max(bandwidth_bound, latency_bound)`` (never their sum). A fabric whose file
declares in-network switches (docs/topology.md, "In-network reduction": NVLS, SHARP) gets the bounds that
stay valid when those switches reduce and multicast (:func:`allreduce_bandwidth_us`,
:func:`latency_bound_us`), and :func:`compute_bounds` reports the host-only bound beside them.

Notation: N ranks, R the rank set, V all nodes (ranks and switches), b_e the bandwidth of directed
link e (GB/s), B⁺(S) the total bandwidth of links leaving the node set S, B⁻(S) entering it,
M = SIZE/N (one rank's piece, with SIZE the nccl-tests buffer size of docs/units.md). Times are in µs:
``bytes / (GB/s * 1e3)``.

Bandwidth bounds (one function per family, each documented where it is computed):
- allgather: the ForestColl cut bound, computed exactly (:func:`allgather_cut_ratio`), and the receptions of a
  group of ranks charged at the routes into it (:func:`synth.circuit_bounds.reception_ratio`);
- reducescatter: the same on the reversed graph;
- broadcast / reduce: SIZE / min_v λ(root, v) (λ = max-flow value), reversed for reduce;
- scatter / gather: the rooted cut bound with per-destination demands (:func:`scatter_cut_ratio`);
- allreduce: max(RS cut, AG cut, SIZE/λ_min, 2(N-1)·SIZE / Σ_v B(v), the same traffic bound on
  groups of ranks, 2(g-1)·SIZE / Σ_G B(G), and on one group kept as ranks beside contracted ones)
  (:func:`allreduce_bandwidth_us`, :func:`group_traffic`, :func:`contracted_traffic`);
- alltoall: maximum concurrent multicommodity flow LP (exact for fractional routing), with a
  labelled weaker fallback above :data:`ALLTOALL_LP_MAX_VARS`.
Each cut bound of the first four families is also charged the α its links pay at least once
(:func:`cut_alpha_us`): a link that carries bytes out of the cut holds a transfer for its route's α as well.
Latency bounds: :func:`latency_bound_us`.

:func:`compute_bounds` works on :meth:`Topology.circuit_capacities`: a switch link is capped at the
widest rank-to-rank path through it, the most any transfer holding it can move (the circuits of docs/cost-model.md), so
a 200 GB/s leaf uplink under 50 GB/s rank links counts 50. It then caps each link at the widest *route* through it,
over every path the simulator times a send on (:func:`synth.topology.routes.route_capacities`, as the methods do):
a rank whose switch port carries only 50 GB/s circuits counts 50 there. Every transfer takes as long on the capped
fabric as on the file's, so the bounds stay valid and tighten where switch links outrun their routes.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from synth.circuit_bounds import LP_MARGIN, charged_gossip, reception_ratio
from synth.collectives import Collective
from synth.errors import SynthError
from synth.flows import (
    FlowNetwork,
    cut_out,
    describe_cut,
    integer_bandwidths,
    rank_orbits,
)
from synth.limits import check_rank_count
from synth.topology.model import Topology, widest_paths
from synth.topology.routes import route_capacities
from synth.topology.structure import boxes_of
from synth.units import algbw_GBps

# Above this many LP columns (sources x links) alltoall falls back to a weaker closed-form bound.
ALLTOALL_LP_MAX_VARS = 40_000
SWEEP_VECTORS = 3          # ... where its fallback sweeps the cuts along this many Laplacian eigenvectors
PARTITION_RANKS = 128      # the allreduce traffic bound tries the strongest partition up to this many ranks
SWEEP_MAX_NODES = 3000     # ... up to this many nodes (a dense eigensolve: about 2 s at 2176 nodes)


def _us(nbytes: float, bw_GBps: float) -> float:
    """Time in µs to move ``nbytes`` at ``bw_GBps`` (1 GB/s = 1e3 bytes/µs)."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (bw_GBps * 1e3) if bw_GBps > 0 else math.inf


@dataclass(frozen=True)
class Bounds:
    """Lower bounds (µs) for one (topology, collective, size). ``details`` explains where they come from."""

    topology: str
    collective: str
    num_ranks: int
    size_bytes: float
    root: int | None
    bandwidth_bound_us: float
    latency_bound_us: float
    time_bound_us: float
    algbw_bound_GBps: float
    details: dict = field(default_factory=dict, compare=False)
    #: Where the fabric has in-network switches: the bound of the same fabric with plain switches (host-only
    #: schedules); ``time_bound_us`` is then the in-network bound. None on a fabric without them.
    host_only_bound_us: float | None = None

    @property
    def binding(self) -> str:
        return "bandwidth" if self.bandwidth_bound_us >= self.latency_bound_us else "latency"

    def as_dict(self) -> dict:
        return {
            "topology": self.topology,
            "collective": self.collective,
            "ranks": self.num_ranks,
            "size_bytes": self.size_bytes,
            "root": self.root,
            "bandwidth_bound_us": self.bandwidth_bound_us,
            "latency_bound_us": self.latency_bound_us,
            "time_bound_us": self.time_bound_us,
            "algbw_bound_GBps": self.algbw_bound_GBps,
            "binding": self.binding,
            **({} if self.host_only_bound_us is None else {
                "in_network_bound_us": self.time_bound_us,
                "host_only_bound_us": self.host_only_bound_us}),
            "details": self.details,
        }


# ---- the allgather cut bound (ForestColl) -------------------------------------------------------
@dataclass(frozen=True)
class CutResult:
    """The optimal cut of a ratio bound: ``ratio = numer / B⁺(cut)`` in 1/(GB/s)."""

    ratio: float
    exact_ratio: Fraction | None  # ratio in (GB/s)^-1 as an exact fraction when bandwidths allowed it
    cut: frozenset[int]
    ranks_counted: int  # the numerator: |S ∩ R| (allgather) or |R \\ S| (scatter)
    cut_bw: float  # B⁺(S) in GB/s
    flows: int  # max-flow computations spent
    orbits: int  # distinct ranks tested (after symmetry)


def allgather_cut_ratio(topology: Topology, *, use_symmetry: bool | None = None) -> tuple[float, frozenset[int]]:
    """``max over S of |S ∩ R| / B⁺(S)`` (S may hold switches and must leave out ≥ 1 rank), and the
    maximising S as a set of node ids. Allgather then needs ``T ≥ (SIZE/N) · ratio``.

    See :func:`allgather_cut` for the method; this is the short form used by the trees method.
    """
    res = allgather_cut(topology, use_symmetry=use_symmetry)
    return res.ratio, res.cut


def allgather_rate(topology: Topology) -> float:
    """The optimal per-rank broadcast rate of allgather, GB/s: ``1 / allgather_cut_ratio``."""
    ratio, _ = allgather_cut_ratio(topology)
    return 1.0 / ratio if ratio > 0 else math.inf


@functools.lru_cache(maxsize=64)  # pure in a frozen (hashable) Topology; the pipeline asks often
def allgather_cut(topology: Topology, *, use_symmetry: bool | None = None) -> CutResult:
    """Exact ForestColl allgather cut bound (Zhao et al., "ForestColl", arXiv 2402.06787, §4–5).

    Bound: every rank's piece (M bytes) must leave any node set S that holds the rank but misses some
    other rank, so ``T ≥ M · max_S |S ∩ R| / B⁺(S)``; ForestColl proves it achievable by packing
    spanning out-trees (Edmonds' branching theorem), so it is *the* allgather optimum for
    bandwidth-bound sizes.

    Computation (ForestColl's auxiliary graph, solved by Dinkelbach/Newton iteration instead of
    their binary search so the answer is exact): add a super source s with an arc s→u of capacity y
    to every rank u. For a rank v, a minimum s–v cut is ``min over S∌v of y·|R \\ S| + B⁺(S)``, so
    ``maxflow(s, v) ≥ N·y`` for every rank v  ⟺  ``B⁺(S) ≥ y·|S ∩ R|`` for every valid S  ⟺
    ``y ≤ y* = min_S B⁺(S)/|S ∩ R|``. Start from the best of a few obvious cuts
    (V∖{v}, {u}, machines) as y = P/Q, test each rank with integer capacities (links Q·b_e,
    source arcs P, so the comparison is exact); a failing test yields a cut S with a strictly smaller
    ratio, which becomes the new y. Feasibility is monotone in y, so ranks that passed stay passed;
    the loop ends when every rank passes, and then y = y* exactly.

    Symmetry: ranks in the same orbit of the automorphism group (bandwidth-preserving, mapping
    ranks to ranks) have the same min-cut function, so one test per orbit suffices
    (:func:`synth.flows.rank_orbits` finds orbits it can *prove* by exhibiting automorphisms).
    """
    n = topology.num_ranks
    if n < 2:
        return CutResult(0.0, Fraction(0), frozenset(), 0, 0.0, 0, 0)
    ib = integer_bandwidths(topology.arrays[2])
    src, dst, _, _ = topology.arrays
    nodes = topology.num_nodes
    s = nodes  # super source

    best_p, best_q, best_mask = _allgather_start(topology, ib.ints)
    if best_p == 0:
        raise SynthError(f"topology {topology.name!r}: some rank has no incoming or outgoing link")
    reps = _test_order(topology, ib.ints, use_symmetry, fixed=())
    flows = 0
    net = None
    net_pq: tuple[int, int] | None = None
    i = 0
    while i < len(reps):
        v = reps[i]
        if net is None or net_pq != (best_p, best_q):
            tails = np.concatenate([src, np.full(n, s)])
            heads = np.concatenate([dst, np.arange(n)])
            caps = np.concatenate([ib.ints * best_q, np.full(n, best_p, dtype=np.int64)])
            net = FlowNetwork(nodes + 1, tails, heads, caps)
            net_pq = (best_p, best_q)
        value, side = net.flow(s, v)
        flows += 1
        if value >= n * best_p:
            i += 1
            continue
        mask = side[:nodes]
        p = cut_out(topology, mask, ib.ints)
        q = int(mask[:n].sum())
        if q == 0 or p * best_q >= best_p * q:  # cannot happen for an exact min cut
            raise RuntimeError("allgather cut search did not improve; max-flow inconsistency")
        g = math.gcd(p, q)
        best_p, best_q, best_mask = p // g, q // g, mask.copy()
    ratio_exact = Fraction(best_q, best_p) * Fraction(ib.scale).limit_denominator(10**12) if ib.exact else None
    bw_cut = cut_out(topology, best_mask)
    k = int(best_mask[:n].sum())
    return CutResult(k / bw_cut, ratio_exact, frozenset(int(x) for x in np.flatnonzero(best_mask)), k, bw_cut,
                     flows, len(reps))


@functools.lru_cache(maxsize=64)
def route_alpha_floor(topology: Topology) -> np.ndarray:
    """Per directed link ``e = (x, y)``: the least α a transfer holding ``e`` pays, ``a_in(x) + α_e + a_out(y)``,
    with ``a_in(x)`` the α-shortest path from any rank to ``x`` and ``a_out(y)`` from ``y`` to any rank (0 at a
    rank). A transfer from rank u to rank v routed through ``e`` pays the α of every hop of its route
    (docs/cost-model.md), and its route's hops before and after ``e`` are paths from u to x and from y to v, so
    it pays at least this. Paths through any node count (a foreign program's route may pass ranks), which can
    only lower the floor."""
    from scipy.sparse.csgraph import dijkstra

    src, dst, _, alpha = topology.arrays
    graph, ranks = _alpha_graph(topology), np.arange(topology.num_ranks)
    into = dijkstra(graph, indices=ranks, min_only=True)              # from the nearest rank
    out_of = dijkstra(graph.T.tocsr(), indices=ranks, min_only=True)  # to the nearest rank
    return into[src] + alpha + out_of[dst]


def cut_alpha_us(topology: Topology, mask: np.ndarray, demand_bytes: float) -> float:
    """Time bound of ``demand_bytes`` that must leave the node set ``mask``, counting the α its links pay.

    Bound: let L be the links leaving the set, ``b_e`` their bandwidths and ``a_e`` their
    :func:`route_alpha_floor`. A link that carries ``d_e > 0`` of those bytes holds a transfer for at least
    ``a_e + d_e / b_e`` (its route's α, once at least, and its bytes at no more than ``b_e``, docs/cost-model.md;
    transfers on a link run one at a time), so in a program of makespan T, ``d_e ≤ b_e · (T − a_e)⁺`` on every
    link of L (also where ``d_e = 0``). The bytes cross on L, ``Σ d_e ≥ D``, hence ``D ≤ g(T) = Σ_e b_e (T −
    a_e)⁺`` and ``T ≥ t*``, the root of ``g(t) = D`` (water filling: the least over prefixes of L sorted by
    ``a_e`` of ``(D + Σ b_e a_e) / Σ b_e``; each prefix's line lies below g, and the prefix active at t* meets
    it there). With equal α on every link of the cut it is the cut bound ``D / B⁺`` plus that α, the one α any
    link of the cut pays once. 0 where no link leaves the set."""
    src, dst, bw, _ = topology.arrays
    leaving = mask[src] & ~mask[dst] & (bw > 0)
    if not leaving.any():
        return 0.0
    floor = route_alpha_floor(topology)[leaving]
    order = np.argsort(floor, kind="stable")
    rates = bw[leaving][order] * 1e3   # bytes per µs
    paid = np.cumsum(rates * floor[order])
    return float(((demand_bytes + paid) / np.cumsum(rates)).min())


def _mask_of(topology: Topology, nodes: frozenset[int]) -> np.ndarray:
    mask = np.zeros(topology.num_nodes, dtype=bool)
    if nodes:
        mask[list(nodes)] = True
    return mask


def circuit_box_cut(topology: Topology) -> tuple[float, str]:
    """``max over S of |S ∩ R| / Σ_{e leaving S} c_S(e)`` over the box cuts below, with each cut link's
    capacity what a transfer *from inside S* can move on it: ``c_S(e) = min(b_e, W_S(tail e), W(head e))``,
    ``W_S(x)`` the widest bottleneck of a path from a rank of S to ``x`` and ``W(y)`` from ``y`` to any rank.
    Allgather then needs ``T ≥ (SIZE/N) · ratio`` (reducescatter: the same on the reversed fabric). Returns
    (ratio, the cut's description), ``(0.0, "")`` where no box cut applies.

    Proof (circuits of docs/cost-model.md: a transfer moves at its route's smallest bandwidth and holds every
    link of its route for its whole duration; one transfer at a time per link direction). Let S hold a rank and
    miss one. Every piece of a rank in S must reach a rank outside S, so some transfer carries it out of S a
    first time; before that the piece is only on ranks of S, so that transfer starts at a rank of S, and its
    route leaves S on some link e. Its rate is at most its route's bottleneck, at most ``c_S(e)``, so it holds
    e for at least ``bytes / c_S(e)``. Transfers on e run one at a time, so in time T link e carries at most
    ``T · c_S(e)`` bytes of such first crossings, and ``T · Σ_e c_S(e) ≥ |S ∩ R| · SIZE/N``. With
    ``c_S(e) = b_e`` this is ForestColl's cut bound (:func:`allgather_cut`); :meth:`Topology.circuit_capacities`
    caps every link by the widest path from *any* rank, which a slower part of the fabric cannot use: 16 GB/s
    MI250 NICs feeding 50 GB/s H100 NICs hold them at 16 GB/s, so the H100 box takes the MI250 box's pieces at
    most at ``8 × 16`` GB/s, not ``8 × 50``. Paths may pass ranks (a foreign program's route may), so W is
    never below a route's true bottleneck.

    Cuts tried (any S gives a valid bound): for every box B (:func:`synth.topology.structure.boxes_of`), P(B) =
    its ranks and the switches adjacent to ranks of B only (its NVSwitch, its NICs), and ``V ∖ P(B)``. Not on
    fabrics with in-network switches (a switch there starts transfers too)."""
    if topology.in_network_switches:
        return 0.0, ""
    boxes = boxes_of(topology)
    if len(boxes) < 2:
        return 0.0, ""
    n, nodes = topology.num_ranks, topology.num_nodes
    ranks_of: list[set[int]] = [set() for _ in range(nodes)]
    for link in topology.links:
        for a, b in ((link.src, link.dst), (link.dst, link.src)):
            if topology.is_switch(a) and b < n:
                ranks_of[a].add(b)
    out_width = widest_paths(topology, range(n), incoming=False)
    best, where = 0.0, ""
    for box in boxes:
        members = set(box)
        private = {x for x in range(n, nodes) if ranks_of[x] and ranks_of[x] <= members}
        inside = members | private
        for mask, label in ((inside, "box"), (set(range(nodes)) - inside, "all but box")):
            width = widest_paths(topology, [r for r in range(n) if r in mask], incoming=True)
            capacity = sum(min(link.bw, width[link.src], out_width[link.dst]) for link in topology.links
                           if link.src in mask and link.dst not in mask)
            counted = sum(1 for r in range(n) if r in mask)
            if capacity > 0 and 0 < counted < n and counted / capacity > best:
                best, where = counted / capacity, f"{label} {box[0]}..{box[-1]} (circuit capacities from inside)"
    return best, where


def _allgather_start(topology: Topology, ints: np.ndarray) -> tuple[int, int, np.ndarray]:
    """The best of the obvious cuts V∖{v} (the per-rank bound), {u}, machines and their complements."""
    n, nodes = topology.num_ranks, topology.num_nodes
    src, dst, _, _ = topology.arrays
    in_int = np.bincount(dst, weights=ints, minlength=nodes).astype(np.int64)
    out_int = np.bincount(src, weights=ints, minlength=nodes).astype(np.int64)
    candidates: list[tuple[int, int, np.ndarray]] = []
    v = int(np.argmin(in_int[:n]))
    mask = np.ones(nodes, dtype=bool)
    mask[v] = False
    candidates.append((int(in_int[v]), n - 1, mask))
    u = int(np.argmin(out_int[:n]))
    mask = np.zeros(nodes, dtype=bool)
    mask[u] = True
    candidates.append((int(out_int[u]), 1, mask))
    for machine in boxes_of(topology):
        if 0 < len(machine) < n:
            mask = np.zeros(nodes, dtype=bool)
            mask[list(machine)] = True
            candidates.append((cut_out(topology, mask, ints), len(machine), mask))
            comp = ~mask
            candidates.append((cut_out(topology, comp, ints), n - len(machine), comp))
    best = candidates[0]
    for cand in candidates[1:]:
        if cand[0] * best[1] < best[0] * cand[1]:
            best = cand
    g = math.gcd(best[0], best[1])
    return best[0] // g, best[1] // g, best[2]


def _test_order(topology: Topology, ints: np.ndarray, use_symmetry: bool | None,
                fixed: tuple[int, ...]) -> list[int]:
    """Ranks to test: one per proven orbit (when symmetry is used), weakest in-bandwidth first."""
    n = topology.num_ranks
    if use_symmetry is None:
        # Orbit detection costs a few refinements (tens of ms at 1024 ranks) and saves N max-flows.
        use_symmetry = n >= 16 and n > len(fixed) + 1
    if use_symmetry:
        # Spend on the orbit search at most half of what testing every rank would cost (timed
        # with one max-flow), so symmetry never makes a bound much slower (0.25 s at least, enough for
        # a 32x32 torus).
        src, dst, _, _ = topology.arrays
        a, b = (0, 1) if 0 not in fixed else (1, 0)
        started = time.perf_counter()
        FlowNetwork(topology.num_nodes, src, dst, ints).flow(a, b)
        limit = min(3.0, max(0.25, 0.5 * n * (time.perf_counter() - started)))
        groups = rank_orbits(topology, fixed=fixed, time_limit_s=limit)
        reps = [min(g) for g in groups if not set(g) & set(fixed)]
    else:
        reps = [v for v in range(n) if v not in fixed]
    in_int = np.bincount(topology.arrays[1], weights=ints, minlength=topology.num_nodes)
    return sorted(reps, key=lambda v: (in_int[v], v))


# ---- rooted bounds --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def rooted_min_cut(topology: Topology, root: int, *, use_symmetry: bool | None = None) -> tuple[float, int]:
    """``min over ranks v ≠ root of λ(root, v)`` in GB/s (λ = max-flow value), and the minimising v.

    Broadcast bound (the rooted cut bound; Edmonds 1973 makes it the rate achievable by packing
    out-trees from the root when all nodes can replicate): every rank needs all SIZE bytes, which
    must cross every cut separating it from the root, so ``T ≥ SIZE / min_v λ(root, v)``.
    One max-flow per rank, or per orbit of the automorphisms fixing the root.
    """
    n = topology.num_ranks
    if n < 2:
        return math.inf, root
    ib = integer_bandwidths(topology.arrays[2])
    src, dst, _, _ = topology.arrays
    net = FlowNetwork(topology.num_nodes, src, dst, ib.ints)
    best, arg = None, root
    for v in _test_order(topology, ib.ints, use_symmetry, fixed=(root,)):
        value, _ = net.flow(root, v)
        if best is None or value < best:
            best, arg = value, v
    return best / ib.scale, arg


def rooted_cut_side(topology: Topology, root: int, v: int) -> np.ndarray:
    """The source side (node mask) of a minimum ``root``–``v`` cut: every byte ``v`` needs from ``root``
    leaves it."""
    ib = integer_bandwidths(topology.arrays[2])
    src, dst, _, _ = topology.arrays
    _, side = FlowNetwork(topology.num_nodes, src, dst, ib.ints).flow(root, v)
    return np.asarray(side[:topology.num_nodes], dtype=bool)


def min_pair_cut(topology: Topology) -> float:
    """``λ_min = min over ordered rank pairs (u, v) of λ(u, v)`` in GB/s: every cut separating two ranks
    leaves a set that holds rank 0 or one that does not, so ``λ_min = min(min_v λ(0, v), min_u λ(u, 0))``
    (the rooted cut on the fabric and on its reverse; max-flow min-cut)."""
    return float(min(rooted_min_cut(topology, 0)[0], rooted_min_cut(topology.reversed(), 0)[0]))


@functools.lru_cache(maxsize=64)
def scatter_cut(topology: Topology, root: int) -> CutResult:
    """Exact scatter cut bound: ``T ≥ M · max over S ∋ root (S misses ≥ 1 rank) of |R ∖ S| / B⁺(S)``.

    Every rank outside S needs its own M bytes from the root, all of which cross out of S. All data
    comes from one source, so the demands form a single-commodity flow (root → super sink t, arcs
    v→t of capacity y·M per rank v ≠ root); by max-flow/min-cut the bound is exact for fractional
    routing (the flow decomposes into root→v paths). Solved exactly like :func:`allgather_cut`:
    Dinkelbach on y = P/Q with integer capacities (links Q·b_e, v→t arcs P) and the test
    ``maxflow(root, t) ≥ (N-1)·P``; a failing test gives a cut with a smaller B⁺(S)/|R∖S|.
    """
    n, nodes = topology.num_ranks, topology.num_nodes
    if n < 2:
        return CutResult(0.0, Fraction(0), frozenset(), 0, 0.0, 0, 0)
    ib = integer_bandwidths(topology.arrays[2])
    src, dst, _, _ = topology.arrays
    t = nodes
    others = np.array([v for v in range(n) if v != root], dtype=np.int64)
    in_int = np.bincount(dst, weights=ib.ints, minlength=nodes).astype(np.int64)
    # start: S = V ∖ {v} (ratio B_in(v)/1) or S = {root} (ratio B_out(root)/(N-1))
    v = int(others[np.argmin(in_int[others])])
    best_p, best_q = int(in_int[v]), 1
    best_mask = np.ones(nodes, dtype=bool)
    best_mask[v] = False
    root_mask = np.zeros(nodes, dtype=bool)
    root_mask[root] = True
    p0 = cut_out(topology, root_mask, ib.ints)
    if p0 * best_q < best_p * (n - 1):
        best_p, best_q, best_mask = p0, n - 1, root_mask
    if best_p == 0:
        raise SynthError(f"topology {topology.name!r}: rank {v} cannot be reached")
    flows = 0
    while True:
        g = math.gcd(best_p, best_q)
        best_p, best_q = best_p // g, best_q // g
        tails = np.concatenate([src, others])
        heads = np.concatenate([dst, np.full(len(others), t)])
        caps = np.concatenate([ib.ints * best_q, np.full(len(others), best_p, dtype=np.int64)])
        value, side = FlowNetwork(nodes + 1, tails, heads, caps).flow(root, t)
        flows += 1
        if value >= (n - 1) * best_p:
            break
        mask = side[:nodes]
        p = cut_out(topology, mask, ib.ints)
        q = int((~mask[:n]).sum())
        if q == 0 or p * best_q >= best_p * q:
            raise RuntimeError("scatter cut search did not improve; max-flow inconsistency")
        best_p, best_q, best_mask = p, q, mask.copy()
    bw_cut = cut_out(topology, best_mask)
    k = int((~best_mask[:n]).sum())
    exact = Fraction(best_q, best_p) * Fraction(ib.scale).limit_denominator(10**12) if ib.exact else None
    return CutResult(k / bw_cut, exact, frozenset(int(x) for x in np.flatnonzero(best_mask)), k, bw_cut, flows, 1)


# ---- alltoall -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def alltoall_lp_ratio(topology: Topology) -> tuple[float, str]:
    """Maximum concurrent multicommodity flow (Shahrokhi & Matula 1990; the TE-CCL alltoall LP
    relaxation, SIGCOMM'24 §4): every ordered rank pair (u, v) carries one unit; minimise T subject
    to flow conservation and ``Σ load_e ≤ b_e · T``. Commodities with a common source aggregate into
    one single-source flow (supply N-1 at u, demand 1 at every other rank) without loss, so the LP
    has N·|E| + 1 columns. Returns (T* in units of (data per pair)/(GB/s), "lp"); exact for
    fractional routing. Multiply by M bytes for the bound.
    """
    from scipy.sparse import coo_matrix

    n, nodes = topology.num_ranks, topology.num_nodes
    src, dst, bw, _ = topology.arrays
    m = len(src)
    f = np.arange(n * m)
    t = n * m
    u_idx = np.repeat(np.arange(n), m)
    e_idx = np.tile(np.arange(m), n)
    # rows 0 .. n*nodes-1: conservation (out - in = supply); rows n*nodes + e: capacity
    rows = np.concatenate([u_idx * nodes + src[e_idx], u_idx * nodes + dst[e_idx], n * nodes + e_idx,
                           n * nodes + np.arange(m)])
    cols = np.concatenate([f, f, f, np.full(m, t)])
    vals = np.concatenate([np.ones(n * m), -np.ones(n * m), np.ones(n * m), -bw])
    supply = np.zeros((n, nodes))
    supply[:, :n] = -1.0
    supply[np.arange(n), np.arange(n)] = n - 1
    row_lb = np.concatenate([supply.ravel(), np.full(m, -np.inf)])
    row_ub = np.concatenate([supply.ravel(), np.zeros(m)])
    matrix = coo_matrix((vals, (rows, cols)), shape=(n * nodes + m, n * m + 1)).tocsr()
    cost = np.zeros(n * m + 1)
    cost[t] = 1.0
    value = _solve_lp(cost, matrix, row_lb, row_ub)
    return value, "lp"


def _solve_lp(cost: np.ndarray, matrix, row_lb: np.ndarray, row_ub: np.ndarray) -> float:
    """min cost·x, row_lb ≤ A x ≤ row_ub, x ≥ 0, through the solver layer with HiGHS' interior point
    method (+ crossover: on these flow LPs it is ~20x faster than simplex)."""
    from synth.solvers import Model, solve

    model = Model("alltoall-bound")
    model.add_vars(len(cost), 0.0)
    coo = matrix.tocoo()
    model.add_rows(coo.row, coo.col, coo.data, row_lb, row_ub)
    nonzero = np.flatnonzero(cost)
    model.set_objective(nonzero, cost[nonzero])
    result = solve(model, "highs", lp_algorithm="ipm")
    if result.status != "optimal":
        raise SynthError(f"alltoall LP bound: HiGHS returned {result.status} ({result.message})")
    return float(result.objective)


def alltoall_fallback_ratio(topology: Topology) -> tuple[float, str]:
    """Weaker alltoall bound for large N (NOT exact; labelled ``dual-bound`` in details).

    LP duality for concurrent flow: for any link lengths ℓ ≥ 0, ``T ≥ Σ_{u≠v} dist_ℓ(u,v) / Σ_e ℓ_e b_e``
    (units of one pair's data). We take the best of ℓ = 1 (hops) and ℓ = 1/b_e, of the per-rank
    bounds (N-1)/B_out(u), (N-1)/B_in(v), and of the same cut on groups of ranks (these, and the
    spectral sweep cuts of :func:`_sweep_cut_ratio`): the ``g`` ranks
    of a node set S send ``g·(N-g)`` units out of it and receive as many, so
    ``T ≥ g·(N-g) / min(B⁺(S), B⁻(S))`` (the sparsest-cut bound of concurrent flow, Leighton & Rao,
    J. ACM 46(6), 1999, §1; S from :func:`_rank_groups`: a box behind its NVSwitch, whose NICs
    carry every byte it sends to other boxes, or a leaf switch with its ranks). On edge-transitive
    fabrics with equal bandwidths (torus with equal sides, hypercube, ring) uniform ℓ is
    dual-optimal, so there it equals the LP.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    n, nodes = topology.num_ranks, topology.num_nodes
    src, dst, bw, _ = topology.arrays
    best = 0.0
    for length in (np.ones_like(bw), 1.0 / bw):
        graph = csr_matrix((length, (src, dst)), shape=(nodes, nodes))
        dist = shortest_path(graph, method="D", indices=np.arange(n))[:, :n]
        best = max(best, float(dist.sum()) / float((length * bw).sum()))
    b_out = np.bincount(src, weights=bw, minlength=nodes)[:n]
    b_in = np.bincount(dst, weights=bw, minlength=nodes)[:n]
    best = max(best, (n - 1) / float(b_out.min()), (n - 1) / float(b_in.min()))
    for group in _rank_groups(topology):
        best = max(best, _group_cut(int(group[:n].sum()), n, float(bw[group[src] & ~group[dst]].sum()),
                                    float(bw[~group[src] & group[dst]].sum())))
    return max(best, _sweep_cut_ratio(topology)), "dual-bound"


def _group_cut(g: int, n: int, leaving: float, entering: float) -> float:
    """``g·(N-g) / min(B⁺(S), B⁻(S))`` for a node set S holding ``g`` of the ``N`` ranks (0 where S holds
    none or all of them, or nothing crosses)."""
    capacity = min(leaving, entering)
    return g * (n - g) / capacity if 0 < g < n and capacity > 1e-12 else 0.0


def _sweep_cut_ratio(topology: Topology, vectors: int = SWEEP_VECTORS) -> float:
    """The best ``g·(N-g) / min(B⁺(S), B⁻(S))`` over spectral sweep cuts: the nodes sorted by each
    of the first ``vectors`` non-trivial eigenvectors of the bandwidth-weighted Laplacian, S every
    prefix (Fiedler, "Algebraic connectivity of graphs", Czech. Math. J. 1973; the sweep of
    Spielman & Teng, "Spectral partitioning works", FOCS 1996). It finds a grid's bisection, which
    the hop-length dual misses where sides differ (8x16 torus: 3.84 -> 5.12 pair units per GB/s,
    the LP's value on a 4x16 mesh). 0 above ``SWEEP_MAX_NODES`` nodes (a dense eigensolve)."""
    n, nodes = topology.num_ranks, topology.num_nodes
    if nodes > SWEEP_MAX_NODES or nodes < 3:
        return 0.0
    src, dst, bw, _ = topology.arrays
    weight = np.zeros((nodes, nodes))
    np.add.at(weight, (src, dst), bw)
    weight += weight.T
    _, basis = np.linalg.eigh(np.diag(weight.sum(axis=1)) - weight)
    out_links = [np.flatnonzero(src == v) for v in range(nodes)]
    in_links = [np.flatnonzero(dst == v) for v in range(nodes)]
    best = 0.0
    for column in range(1, min(vectors, nodes - 1) + 1):
        inside = np.zeros(nodes, dtype=bool)
        leaving = entering = 0.0
        g = 0
        for v in np.argsort(basis[:, column], kind="stable")[:-1]:
            outs, ins = out_links[v], in_links[v]
            # v's links to the outside now cross the cut; its links from inside S no longer do
            leaving += float(bw[outs[~inside[dst[outs]]]].sum()) - float(bw[ins[inside[src[ins]]]].sum())
            entering += float(bw[ins[~inside[src[ins]]]].sum()) - float(bw[outs[inside[dst[outs]]]].sum())
            inside[v] = True
            g += int(v < n)
            best = max(best, _group_cut(g, n, leaving, entering))
    return best


def _rank_groups(topology: Topology):
    """Node sets (boolean masks) whose cuts :func:`alltoall_fallback_ratio` tries: every component
    of :func:`_bandwidth_components` that holds a rank, and every switch with the ranks linked to
    it (a leaf switch and the ranks under it, whose uplinks carry all they exchange with the rest)."""
    n, nodes = topology.num_ranks, topology.num_nodes
    src, dst, _, _ = topology.arrays
    for label, has_rank in _bandwidth_components(topology):
        for component in np.flatnonzero(has_rank):
            yield label == component
    for switch in range(n, nodes):
        group = np.zeros(nodes, dtype=bool)
        group[src[(dst == switch) & (src < n)]] = True
        group[dst[(src == switch) & (dst < n)]] = True
        group[switch] = True
        yield group


# ---- allreduce ------------------------------------------------------------------------------------
def in_network_nodes(topology: Topology) -> np.ndarray:
    """Node ids of the switches that reduce or multicast in the network (docs/topology.md)."""
    return np.array(topology.in_network_switches, dtype=np.int64)


def allreduce_bandwidth_us(topology: Topology, size_bytes: float) -> tuple[float, dict]:
    """Allreduce bandwidth bound = max of the valid bounds below. On a fabric of forwarding switches
    (docs/cost-model.md) all five hold:

    1. reducescatter cut bound (an allreduce output contains a reduce-scatter output);
    2. allgather cut bound (each rank's input must influence every other rank);
    3. ``SIZE / λ_min`` with ``λ_min = min over ordered rank pairs of λ(u, v)``: ranks outside a cut S
       need the full sums, which depend on S's inputs, so SIZE bytes of information must leave S.
       By fixing rank 0, ``λ_min = min(min_v λ(0, v), min_u λ(u, 0))`` (either 0 ∈ S or not);
    4. the message-count bound of Patarasuk & Yuan (JPDC 69(2), 2009, §3), in its heterogeneous
       form: every element needs ≥ 2(N-1) rank-to-rank element transfers (one-way gossip needs
       2N-2 calls, Harary & Schwenk 1974), each leaving a rank through one of its out-links, so
       ``T ≥ 2(N-1)·SIZE / min(Σ_v B_out(v), Σ_v B_in(v))``. With equal ranks this is the familiar
       per-rank 2(N-1)/N·SIZE/B. The literal per-rank form with min_v B(v) is NOT valid on
       heterogeneous fabrics (a fat hub rank lets thin ranks send only SIZE), so it is not used;
    5. bound 4 on groups of ranks (:func:`group_traffic`);
    6. bound 4 on one group's ranks beside contracted groups (:func:`contracted_traffic`);
    7. bound 4 with the calls between groups charged at the routes into their receivers' groups
       (:func:`synth.circuit_bounds.charged_gossip`: a leaf's ports under narrower uplinks).

    **In-network reduction** (switches with ``reduce`` or ``multicast``, docs/topology.md; NVIDIA NVLS on
    NVSwitch 3, InfiniBand SHARP: Graham et al., "Scalable Hierarchical Aggregation Protocol (SHArP)",
    COMHPC 2016, §3; Klenk et al., "An In-Network Architecture for Accelerating Shared-Memory
    Multiprocessor Collectives", ISCA 2020, §3-4). Bounds 1-3 are information arguments, so they hold
    whatever the switches compute: for a node set S holding a rank and leaving one out, the ranks
    outside S need the element-wise sum of S's inputs (SIZE bytes that S's complement cannot know), so
    ``T >= SIZE / B⁺(S)``, and symmetrically ``T >= SIZE / B⁻(S)``; the cut bounds 1 and 2 count, the
    same way, pieces that must cross. With S = {r} and S = V ∖ {r} bound 3 gives the rank cut
    ``T >= SIZE / min(B_out(r), B_in(r))`` for every rank r: each rank sends every element of its input
    into the network at least once and receives every element of the result at least once. That is
    what NVLS achieves on one NVSwitch (each rank sends SIZE to the switch, which reduces, and receives
    SIZE by multicast): about half of bound 4's ``2(N-1)/N · SIZE / B``. Bound 4 counts rank-to-rank
    calls of one-way gossip, which a switch that combines or copies messages voids, so it is dropped;
    bound 5 stays for a partition whose groups each hold their in-network switches (a box's NVSwitch),
    since between groups the network then only forwards and each crossing is still one call from one
    group to one other (a copy sent on k links out of a group is k crossings); a partition with an
    in-network switch outside every group (a SHARP IB switch between boxes) is skipped. Hence on such
    a fabric ``T >= max(RS cut, AG cut, SIZE/λ_min, group traffic over partitions that contain every
    in-network switch)``. The reduction engine's own ``reduce_alpha``/``reduce_bw`` are left out: a
    schedule need not use the switch, so the bound may not charge it.
    """
    n = topology.num_ranks
    m = size_bytes / n
    ag = allgather_cut(topology)
    rs = allgather_cut(topology.reversed())
    lam = min_pair_cut(topology)
    src, dst, bw, _ = topology.arrays
    ranks_out = float(bw[src < n].sum())
    ranks_in = float(bw[dst < n].sum())
    parts = {
        "reducescatter_cut_us": _us(m * max(rs.ratio, circuit_box_cut(topology.reversed())[0]), 1.0),
        "allgather_cut_us": _us(m * max(ag.ratio, circuit_box_cut(topology)[0]), 1.0),
        "pair_cut_us": _us(size_bytes, lam),
    }
    if not topology.in_network_switches:   # gossip calls: void where a switch combines or copies
        parts["traffic_us"] = _us(2 * (n - 1) * size_bytes, min(ranks_out, ranks_in))
    groups, crossing = group_traffic(topology)
    if groups >= 2:
        parts["group_traffic_us"] = _us(2 * (groups - 1) * size_bytes, crossing)
    if not topology.in_network_switches:   # a reception from a combining switch is no call of one node
        calls, capacity = contracted_traffic(topology)
        if calls:
            parts["contracted_traffic_us"] = _us(calls * size_bytes, capacity)
        charged = charged_gossip(topology, _charged_partitions(topology))
        if charged > 0:
            parts["charged_traffic_us"] = _us(charged * size_bytes, 1.0)
    best = max(parts, key=parts.get)
    return parts[best], {"components_us": parts, "binding_component": best,
                         "allgather_cut": describe_cut_set(topology, ag.cut)}


@functools.lru_cache(maxsize=64)
def group_traffic(topology: Topology) -> tuple[int, float]:
    """The traffic bound of Patarasuk & Yuan (JPDC 69(2), 2009, §3) on groups of ranks: (g, B) with
    ``T ≥ 2(g-1)·SIZE / B`` for allreduce, the tightest over the partitions tried; (0, 0) if none
    has two groups.

    Contract each group G (ranks, with the switches that only they reach) into one node. An
    allreduce of the ranks is then an allreduce of the g groups, each of which must end with every
    input, and transfers inside a group are free. One-way gossip among g nodes needs 2(g-1) calls
    (Harary & Schwenk 1974), so every element crosses between groups at least 2(g-1) times, each
    crossing on a link leaving its group and on one entering the next:
    ``B = min(Σ_G B⁺(G), Σ_G B⁻(G))`` over links that join a group to a node outside it.

    Any partition gives a valid bound. Tried: for each distinct bandwidth b, the connected
    components of the links of bandwidth ≥ b (the dies of an MI250 card joined at 200 GB/s, a DGX
    box behind its NVSwitch); components without a rank belong to no group, and once more with those linked to
    one group only merged into it (:func:`_with_private_switches`: a NIC switch two GPUs share). Singletons are
    bound 4 of :func:`allreduce_bandwidth_us`. On a switchless fabric of at most ``PARTITION_RANKS``
    ranks, also the partition of least ``c(δ(P)) / (|P| - 1)`` read off the spanning-tree packing LP
    (:func:`synth.treepack.strongest_partition`). With symmetric links ``B = 2·c(δ(P))``, so that
    partition's bound is ``SIZE / strength``: exactly the time of the packing's reduce + broadcast, which
    therefore is the best bandwidth term any allreduce has there (Tutte / Nash-Williams, 1961; checked
    against every partition of small graphs in tests/test_treepack.py).

    Where the fabric has in-network switches (docs/topology.md), only partitions whose groups hold every
    one of them count (:func:`allreduce_bandwidth_us`).
    """
    src, dst, bw, _ = topology.arrays
    inside = in_network_nodes(topology)
    best = (0, 0.0, 0.0)   # (g, B, 2(g-1)/B)
    for label, has_rank in _allreduce_partitions(topology):
        if len(inside) and not has_rank[label[inside]].all():
            continue   # an in-network switch between groups may combine or copy what crosses
        groups = int(has_rank.sum())
        crossing = label[src] != label[dst]
        leaving = float(bw[crossing & has_rank[label[src]]].sum())
        entering = float(bw[crossing & has_rank[label[dst]]].sum())
        capacity = min(leaving, entering)
        if capacity > 0 and 2 * (groups - 1) / capacity > best[2]:
            best = (groups, capacity, 2 * (groups - 1) / capacity)
    return best[0], best[1]


@functools.lru_cache(maxsize=64)
def contracted_traffic(topology: Topology) -> tuple[int, float]:
    """The gossip count of :func:`group_traffic` with one group kept as its ranks: (c, B) with
    ``T ≥ c·SIZE / B`` for allreduce, the tightest over the candidates below; (0, 0) if there is none.

    Proof. Take a group G of g ranks, and contract every other group of a partition of the remaining
    ranks into one node each (the groups that hold a rank; each group takes the switches that only its
    ranks reach, other switches stay outside every group). Fix one element: the transfers that carry it
    (a partial sum or the result) are one-way calls, and between the n' = g + (other groups) nodes they
    form a one-way gossip (every node ends knowing every input), so there are at least 2n' − 2 of them
    (Harary & Schwenk 1974; :func:`group_traffic` uses the same count on groups alone and
    :func:`allreduce_bandwidth_us` on single ranks). Calls inside a contracted group are free. Charge each
    remaining call to its receiver: a call into a rank r of G uses one of r's in-links, a call into a
    contracted group H enters H's nodes from outside on a link entering H. Summed over the elements,
    ``(2n' − 2)·SIZE ≤ T · (Σ_{r∈G} B⁻(r) + Σ_H B⁻(H))``; charging each call to its sender instead gives the
    same with out-links. A schedule may split, combine or relay data any way it likes; it still makes these
    calls for every element, so the bound holds for every program under docs/cost-model.md (no switch
    combines or copies: fabrics with in-network switches are skipped by the caller).

    With G every rank this is bound 4 of :func:`allreduce_bandwidth_us`; with no rank kept, the group
    bound. Keeping one box whose NICs are thin against its inner links is tighter than both: a DGX A100
    box (8 × 300 GB/s NVSwitch ports, 8 × 25 GB/s NICs) beside any other boxes gives, with the rest as one
    node, ``16·SIZE / (8·325 + 200)``, 6135.7 µs at 1 GiB, where RS + AG's ownership needs 14 calls per
    element inside the box and the cut alone counts 2·SIZE / 400.

    Candidates: for each partition of :func:`_allreduce_partitions`, each group kept, with the rest contracted as
    one node and with the other groups contracted one by one. ``tests/test_contracted_traffic.py`` checks the
    gossip count by exhaustive search on small node sets and that no verified program of several methods beats
    the bound.
    """
    n = topology.num_ranks
    src, dst, bw, _ = topology.arrays
    rank_in = np.bincount(dst[dst < n], weights=bw[dst < n], minlength=n)
    rank_out = np.bincount(src[src < n], weights=bw[src < n], minlength=n)
    best = (0, 0.0, 0.0)   # (calls, capacity, calls / capacity)

    def consider(calls: int, capacity: float) -> None:
        nonlocal best
        if calls > 0 and capacity > 0 and calls / capacity > best[2] * (1 + 1e-12):
            best = (calls, capacity, calls / capacity)

    for label, has_rank in _allreduce_partitions(topology):
        groups = np.flatnonzero(has_rank)
        if len(groups) < 2:
            continue
        crossing = label[src] != label[dst]
        entering = np.bincount(label[dst][crossing], weights=bw[crossing], minlength=len(has_rank))
        leaving = np.bincount(label[src][crossing], weights=bw[crossing], minlength=len(has_rank))
        rank_label = label[:n]
        kept_in = np.bincount(rank_label, weights=rank_in, minlength=len(has_rank))
        kept_out = np.bincount(rank_label, weights=rank_out, minlength=len(has_rank))
        size = np.bincount(rank_label, minlength=len(has_rank))
        for g in groups:
            # the rest as one node: 2g calls, into it only across G's boundary
            consider(2 * int(size[g]), float(kept_in[g] + leaving[g]))
            consider(2 * int(size[g]), float(kept_out[g] + entering[g]))
            if len(groups) > 2:   # the other groups one by one
                calls = 2 * (int(size[g]) + len(groups) - 1) - 2
                consider(calls, float(kept_in[g] + entering[groups].sum() - entering[g]))
                consider(calls, float(kept_out[g] + leaving[groups].sum() - leaving[g]))
    return best[0], best[1]


def _strongest_partition(topology: Topology):
    """The partition of :func:`synth.treepack.strongest_partition` as (label per rank, all True), on a
    switchless fabric of at most ``PARTITION_RANKS`` ranks (its packing LP grows with the edges)."""
    from synth.treepack import pack_spanning_trees, strongest_partition

    if topology.switches or topology.num_ranks > PARTITION_RANKS:
        return
    packing = pack_spanning_trees(topology)
    if packing is not None:
        labels = strongest_partition(packing)
        yield labels, np.ones(int(labels.max()) + 1, dtype=bool)


def _allreduce_partitions(topology: Topology):
    """The partitions :func:`group_traffic` and :func:`contracted_traffic` try: :func:`_bandwidth_components`, each
    also with its private switches absorbed (:func:`_with_private_switches`, where that changes it), and
    :func:`_strongest_partition`."""
    for label, has_rank in _bandwidth_components(topology):
        yield label, has_rank
        absorbed = _with_private_switches(topology, label, has_rank)
        if absorbed is not None:
            yield absorbed, has_rank
    yield from _strongest_partition(topology)


def _with_private_switches(topology: Topology, label: np.ndarray, has_rank: np.ndarray) -> np.ndarray | None:
    """``label`` with every component that holds no rank, and is linked to exactly one component that does,
    merged into that one (a NIC switch between a box's GPUs and the network: its uplink, not the GPUs' links to
    it, is then the box's boundary); None where no component merges.

    Any partition of the nodes gives the traffic bounds (a send into a group crosses a link entering it, each
    link enters at most one group, and sends inside a group are free: :func:`group_traffic`), so this one is a
    candidate beside the unmerged one; it is tighter where the switch's uplink is thinner than its links into
    the group (two GPUs per 50 GB/s NIC: the box's 4 uplinks instead of its 8 GPU links)."""
    src, dst, _, _ = topology.arrays
    crossing = label[src] != label[dst]
    pairs = np.unique(np.stack([label[src][crossing], label[dst][crossing]], axis=1), axis=0)
    merged = label.copy()
    changed = False
    for component in np.flatnonzero(~has_rank):
        neighbours = np.unique(np.concatenate([pairs[pairs[:, 0] == component, 1], pairs[pairs[:, 1] == component, 0]]))
        with_ranks = neighbours[has_rank[neighbours]]
        if len(with_ranks) == 1:
            merged[label == component] = with_ranks[0]
            changed = True
    return merged if changed else None


def _bandwidth_components(topology: Topology):
    """For each distinct bandwidth b, widest first: (component label per node, whether each label
    holds a rank) of the links of bandwidth ≥ b, where at least two components hold ranks."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n, nodes = topology.num_ranks, topology.num_nodes
    src, dst, bw, _ = topology.arrays
    for level in np.unique(bw)[::-1]:
        keep = bw >= level
        graph = coo_matrix((np.ones(int(keep.sum())), (src[keep], dst[keep])), shape=(nodes, nodes))
        _, label = connected_components(graph, directed=True, connection="weak")
        has_rank = np.zeros(nodes, dtype=bool)
        has_rank[label[:n]] = True
        if int(has_rank.sum()) >= 2:
            yield label, has_rank


@functools.lru_cache(maxsize=64)
def _charged_groups(topology: Topology) -> tuple[tuple[int, ...], ...]:
    """Rank groups the reception bound tries (:func:`synth.circuit_bounds.reception_ratio`): the boxes, then the
    groups of :func:`_allreduce_partitions`, each with its complement, distinct, in that order."""
    n = topology.num_ranks
    found: dict[tuple[int, ...], None] = {}
    masks = []
    for box in boxes_of(topology):
        mask = np.zeros(n, dtype=bool)
        mask[list(box)] = True
        masks.append(mask)
    for label, _ in _allreduce_partitions(topology):
        masks += [label[:n] == value for value in np.unique(label[:n])]
    for mask in masks:
        for side in (mask, ~mask):
            if 1 < int(mask.sum()) < n and 0 < int(side.sum()) < n:
                found.setdefault(tuple(int(r) for r in np.flatnonzero(side)))
    return tuple(found)


@functools.lru_cache(maxsize=64)
def _charged_partitions(topology: Topology) -> tuple[tuple[int, ...], ...]:
    """Partitions of the ranks the charged gossip bound tries (:func:`synth.circuit_bounds.charged_gossip`), a group
    label per rank: the boxes (every other rank alone), then :func:`_allreduce_partitions`."""
    n = topology.num_ranks
    labels: dict[tuple[int, ...], None] = {}
    boxes = boxes_of(topology)
    if boxes:
        label = np.arange(n) + n
        for i, box in enumerate(boxes):
            label[list(box)] = i
        labels[tuple(int(x) for x in np.unique(label, return_inverse=True)[1])] = None
    for label, _ in _allreduce_partitions(topology):
        labels.setdefault(tuple(int(x) for x in np.unique(label[:n], return_inverse=True)[1]))
    return tuple(labels)


def describe_cut_set(topology: Topology, cut: frozenset[int]) -> str:
    mask = np.zeros(topology.num_nodes, dtype=bool)
    if cut:
        mask[list(cut)] = True
    return describe_cut(topology, mask)


# ---- latency --------------------------------------------------------------------------------------
def _alpha_graph(topology: Topology):  # noqa: ANN202 (a scipy csr_matrix)
    """The links as a sparse matrix of their α (an α of 0 stays an explicit entry, which csgraph takes as an
    edge)."""
    from scipy.sparse import csr_matrix

    src, dst, _, alpha = topology.arrays
    return csr_matrix((alpha, (src, dst)), shape=(topology.num_nodes, topology.num_nodes))


def _alpha_distances(topology: Topology) -> np.ndarray:
    """All-pairs α-weighted shortest path lengths between ranks (N×N, µs)."""
    from scipy.sparse.csgraph import dijkstra

    n = topology.num_ranks
    return dijkstra(_alpha_graph(topology), indices=np.arange(n))[:, :n]


def _rounds(n: int, degree: int) -> int:
    """⌈log_{degree+1} n⌉ computed in integers."""
    if degree <= 0 or n <= 1:
        return 0
    k, reach = 0, 1
    while reach < n:
        reach *= degree + 1
        k += 1
    return k


def latency_bound_us(topology: Topology, collective: Collective) -> tuple[float, dict]:
    """Latency lower bound: max(shortest-path bound, port-round bound).

    Shortest path: data from u reaches v no sooner than the α-weighted shortest u→v path (every hop
    of a route pays its α, docs/cost-model.md). Over the pairs that must communicate: all ordered rank pairs for
    the all-to-all-dependent collectives; root→v for broadcast/scatter; u→root for reduce/gather.

    Port rounds (the round argument of SCCL, Cai et al. PPoPP'21 §3, with the port model of TACCL,
    Shah et al. NSDI'23, and TE-CCL, Liu et al. SIGCOMM'24, where a rank's link into a switch is a
    link of its own). A rank's *ports* are its out-links (a link to a switch counts once: whatever
    the switch then fans out to, that port carries one transfer at a time, docs/cost-model.md rule 3);
    D = the most ports of any rank. Every rank-to-rank transfer lasts at least
    a = min_{u≠v} dist_α(u, v), the smallest α-weighted rank-to-rank distance: behind a switch the full
    rank→switch→rank α of both hops (dgx-a100: 2 × 0.7 = 1.4 µs), since a circuit pays every hop's α
    (rule 4) and a switch holds no data between them.

    Claim: spreading one rank's data to all N ranks takes ``T ≥ ⌈log_{D+1} N⌉ · a``.
    Proof: let f(t) be the most ranks holding anything derived from that data by time t; f(t) = 1 for
    t < a. A rank that first holds it in (t−a, t] got it by a transfer that finished there, so
    started by t−a, from a rank that held it by t−a. Each of that sender's ports is serialized and
    each transfer on it lasts ≥ a, so each port finishes at most one transfer in a window of length
    a: f(t) ≤ f(t−a) + D·f(t−a) = (D+1)·f(t−a), hence f(t) ≤ (D+1)^⌊t/a⌋ and f(T) ≥ N needs
    ⌊T/a⌋ ≥ ⌈log_{D+1} N⌉. The mirrored argument over in-ports (D = the most in-links of a rank)
    bounds how fast one rank can depend on N inputs (a reduction chain, or all-gathered pieces).
    We apply the out-form to collectives where one rank's data must reach all ranks (allgather,
    alltoall, allreduce, reducescatter, broadcast, scatter) and the in-form where a rank must depend
    on all ranks (all of those except broadcast/scatter, plus reduce/gather).

    Tightness behind one switch (N a power of two, one port per rank): recursive doubling meets it up
    to the bytes' serialization, log2 N rounds of one port transfer each (allgather 1 KB on dgx-a100:
    bound 4.2 µs, recursive doubling 4.203 µs; allreduce by plain recursive doubling 4.21 µs). It is
    not a sum with the bandwidth bound (``time_bound = max``), so at sizes where both matter it is loose.

    In-network switches (docs/topology.md) void the round argument: one transfer into a switch that
    multicasts (or reduces and sends the sum to several ranks) informs many ranks at once, and one
    message out of a reducing switch depends on many inputs (NVLS allreduce on one NVSwitch takes one
    rank -> switch -> rank path). So the out-form is dropped where a switch multicasts or reduces, the
    in-form where one reduces; the shortest-path bound holds as it is.
    """
    n = topology.num_ranks
    if n < 2:
        return 0.0, {"latency_method": "single rank"}
    dist = _alpha_distances(topology)
    root = collective.root
    shape = collective.shape
    if shape.from_root:
        sp = float(dist[root].max())
    elif shape.to_root:
        sp = float(dist[:, root].max())
    else:
        sp = float(dist.max())
    off = dist[~np.eye(n, dtype=bool)]
    a = float(off.min())
    src, dst, _, _ = topology.arrays
    d_out = int(np.bincount(src, minlength=topology.num_nodes)[:n].max())
    d_in = int(np.bincount(dst, minlength=topology.num_nodes)[:n].max())
    copies = bool(topology.in_network_switches)
    combines = any(f.reduce for _, f in topology.features)
    rounds = 0
    if not shape.to_root and not copies:
        rounds = max(rounds, _rounds(n, d_out))
    if not shape.from_root and not combines:
        rounds = max(rounds, _rounds(n, d_in))
    port = rounds * a
    out = {"shortest_path_us": sp, "port_rounds": rounds, "port_round_alpha_us": a, "port_bound_us": port,
           "latency_method": "shortest-path" if sp >= port else "port-rounds"}
    if copies:
        out["port_rounds_note"] = ("in-network switches: out-form dropped" if not combines
                                   else "in-network switches: out- and in-form dropped")
    return max(sp, port), out


def clear_caches() -> None:
    """Forget memoised cut/flow results (benchmarks time cold runs)."""
    for fn in (allgather_cut, rooted_min_cut, scatter_cut, alltoall_lp_ratio):
        fn.cache_clear()


# ---- the entry point ------------------------------------------------------------------------------
def without_dead_ends(topology: Topology) -> Topology:
    """``topology`` without the links of dead-end switches: a switch joined (either way) to at most one other
    node, repeatedly (a NIC whose only uplink is down).

    Proof that every bound computed on the result holds on ``topology``: a transfer's route between two
    distinct ranks is a simple path (docs/cost-model.md: the shortest route), and a simple path cannot pass
    through a switch whose links all lead to one node, since it would enter and leave by that node. Removing
    such a switch's links removes links no program's transfer uses (and then, repeatedly, the next dead end),
    so every program runs on the result in the same time. Without this, such a link counts as bandwidth into
    its rank (rank 3 of dgx-a100-2node with ``--exclude-link b0.nic3:ib1``: the allreduce traffic bound
    divides by 25 GB/s that only ever carries rank 3's own data back to it).
    """
    n = topology.num_ranks
    links = list(topology.links)
    while True:
        peers: dict[int, set[int]] = {}
        for link in links:
            peers.setdefault(link.src, set()).add(link.dst)
            peers.setdefault(link.dst, set()).add(link.src)
        dead = {node for node, near in peers.items() if node >= n and len(near - {node}) <= 1}
        if not dead:
            break
        links = [link for link in links if link.src not in dead and link.dst not in dead]
    return topology if len(links) == len(topology.links) else replace(topology, links=tuple(links))


def _with_cut_alpha(topology: Topology, mask: np.ndarray, demand_bytes: float, bw_us: float, method: str,
                    details: dict) -> tuple[float, str]:
    """(bound, method) after the cut ``mask`` is charged the α its links pay (:func:`cut_alpha_us`), where that is
    higher than ``bw_us``; ``details`` gets ``cut_alpha_us`` and the bound without it, ``cut_bound_us``. Not with
    in-network switches (a switch there starts transfers of its own: multicast copies and sums)."""
    if topology.in_network_switches:
        return bw_us, method
    charged = cut_alpha_us(topology, mask, demand_bytes)
    details.update(cut_bound_us=bw_us, cut_alpha_us=charged)
    if charged > bw_us:
        return charged, method + ", with the α its links pay"
    return bw_us, method


def compute_bounds(topology: Topology, collective: Collective | str, size_bytes: float, *,
                   root: int | None = None) -> Bounds:
    """Lower bounds for ``collective`` of ``size_bytes`` (SIZE, docs/units.md) on ``topology``.

    Where the fabric has in-network switches the bounds are those valid with them (the module docstring)
    and ``host_only_bound_us`` is the time bound of the same fabric with plain switches."""
    if isinstance(collective, str):
        collective = Collective(collective, topology.num_ranks, root=root or 0)
    if collective.num_ranks != topology.num_ranks:
        raise SynthError(f"collective has {collective.num_ranks} ranks but topology {topology.name!r} has "
                         f"{topology.num_ranks}")
    if size_bytes <= 0:
        raise SynthError(f"size must be positive, got {size_bytes}")
    check_rank_count(topology.num_ranks, topology.name, "bounds")
    host_only = None
    if topology.features:   # the same fabric with plain switches: what host-only schedules can reach
        host_only = compute_bounds(replace(topology, features=()), collective, size_bytes).time_bound_us
    topology = without_dead_ends(route_capacities(topology.circuit_capacities()))
    n = topology.num_ranks
    name = collective.name
    r = collective.root
    m = size_bytes / n
    details: dict = {}
    if n == 1:
        bw_us, lat_us = 0.0, 0.0
        details["bandwidth_method"] = "single rank"
    elif name in ("allgather", "reducescatter"):
        topo = topology if name == "allgather" else topology.reversed()
        res = allgather_cut(topo)
        bw_us = _us(m * res.ratio, 1.0)
        circuit_ratio, circuit_cut = circuit_box_cut(topo)
        reception, receivers = reception_ratio(topo, _charged_groups(topology))
        if reception <= max(res.ratio, circuit_ratio) * (1 + LP_MARGIN):
            reception = 0.0
        b_in = np.bincount(topo.arrays[1], weights=topo.arrays[2], minlength=topo.num_nodes)[:n]
        method = "allgather cut (ForestColl)"
        if max(circuit_ratio, reception) > res.ratio:
            bw_us = _us(m * max(circuit_ratio, reception), 1.0)
            details.update(forestcoll_cut_us=_us(m * res.ratio, 1.0))
            if circuit_ratio >= reception:
                method = "allgather cut with circuit capacities from inside the cut"
                details.update(circuit_cut=circuit_cut)
            else:
                method = "receptions of a group, charged at the routes into it"
                details.update(reception_group=describe_cut_set(topo, frozenset(receivers)))
        method += " on reversed graph" if name == "reducescatter" else ""
        bw_us, method = _with_cut_alpha(topo, _mask_of(topo, res.cut), m * res.ranks_counted, bw_us, method,
                                        details)
        details.update(
            bandwidth_method=method,
            cut=describe_cut_set(topo, res.cut), cut_ranks=res.ranks_counted, cut_bw_GBps=res.cut_bw,
            per_rank_bound_us=_us((n - 1) * m, float(b_in.min())), per_rank_rank=int(np.argmin(b_in)),
            maxflows=res.flows, ranks_tested=res.orbits,
        )
    elif name in ("broadcast", "reduce"):
        topo = topology if name == "broadcast" else topology.reversed()
        lam, v = rooted_min_cut(topo, r)
        bw_us, method = _with_cut_alpha(topo, rooted_cut_side(topo, r, v), size_bytes, _us(size_bytes, lam),
                                        "rooted min cut" + (" (reversed)" if name == "reduce" else ""), details)
        details.update(bandwidth_method=method,
                       min_cut_GBps=lam, min_cut_rank=v)
    elif name in ("scatter", "gather"):
        topo = topology if name == "scatter" else topology.reversed()
        res = scatter_cut(topo, r)
        bw_us, method = _with_cut_alpha(topo, _mask_of(topo, res.cut), m * res.ranks_counted,
                                        _us(m * res.ratio, 1.0),
                                        "rooted demand cut" + (" (reversed)" if name == "gather" else ""), details)
        details.update(bandwidth_method=method,
                       cut=describe_cut_set(topo, res.cut), cut_ranks=res.ranks_counted,
                       cut_bw_GBps=res.cut_bw, maxflows=res.flows)
    elif name == "allreduce":
        bw_us, extra = allreduce_bandwidth_us(topology, size_bytes)
        method = ("max(RS cut, AG cut, pair cut, group traffic), in-network reduction" if topology.features
                  else "max(RS cut, AG cut, pair cut, traffic, group traffic, charged traffic)")
        details.update(bandwidth_method=method, **extra)
    elif name == "alltoall":
        cols = n * len(topology.links)
        if cols <= ALLTOALL_LP_MAX_VARS:
            ratio, method = alltoall_lp_ratio(topology)
        else:
            ratio, method = alltoall_fallback_ratio(topology)
        bw_us = _us(m * ratio, 1.0)
        details.update(bandwidth_method="concurrent-flow LP (exact, fractional routing)" if method == "lp"
                       else "concurrent-flow dual bound (weaker than the LP; N too large)",
                       alltoall_method=method)
    else:  # pragma: no cover - Collective validates names
        raise SynthError(f"no bound for collective {name!r}")
    if n > 1:
        lat_us, lat_details = latency_bound_us(topology, collective)
        details.update(lat_details)
    time_us = max(bw_us, lat_us)
    if host_only is not None:
        details["in_network"] = {"switches": [name_ for name_, f in topology.features if not f.plain],
                                 "host_only_bound_us": host_only, "in_network_bound_us": time_us}
    return Bounds(topology.name, name, n, size_bytes, r if collective.is_rooted else None, bw_us, lat_us,
                  time_us, algbw_GBps(size_bytes, time_us), details, host_only_bound_us=host_only)

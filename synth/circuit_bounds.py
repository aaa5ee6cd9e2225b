"""Lower bounds that charge a rank's own link for the narrow routes that reach it (circuits, docs/cost-model.md).

Under the cost model a transfer moves at its route's smallest bandwidth and holds every link of its route for its
whole duration, one transfer at a time per link direction. A 50 GB/s rank port behind a leaf whose uplinks carry
33 GB/s is held for ``bytes / 33`` by every transfer that comes over a spine, so it receives from other leaves at
two thirds of its speed. The cut bounds (ForestColl's, and :func:`synth.lower_bounds.circuit_box_cut`) see the
leaf's uplinks, which have room; what binds is the ports, which must take every piece, some of them slowly. The
bounds here count that: how many bytes a group of ranks must receive, how many of them must come from outside
the group (over routes no wider than the fabric lets outsiders reach the group's links), and how long each holds
the rank link it arrives on.

Notation as in :mod:`synth.lower_bounds`: N ranks, ``M = SIZE / N``; for a group ``G`` of ranks, ``in(G)`` the
links whose head is a rank of G, ``c_e`` the (route-capped) bandwidth of link e, and ``w_e = min(c_e, W_G(tail e))``
with ``W_G(x)`` the widest bottleneck of any path from a rank outside G to node x (paths may pass any node, so a
foreign program's route through ranks is covered). Every transfer into a rank of G ends on one link ``e ∈ in(G)``,
holds it for at least ``bytes / c_e``, and if it starts outside G for at least ``bytes / w_e``. So with ``r_e`` the
bytes of other transfers and ``y_e`` those of transfers from outside G that end on e, in time T::

    r_e / c_e + y_e / w_e ≤ T                 for every e ∈ in(G).

The group LPs below minimise T under that and what the collective forces the group to receive. Any group gives a
valid bound; :func:`synth.lower_bounds.compute_bounds` passes the boxes the methods see and the groups of the
allreduce bound's partitions, with their complements. Fabrics with in-network switches are skipped (a switch
there starts transfers of its own).
"""

from __future__ import annotations

import functools

import numpy as np

from synth.topology.model import Topology, widest_paths

MAX_GROUPS = 64       # group LPs per bound at most (boxes and partition groups first), each a small HiGHS solve
MAX_RANKS = 1024      # ... and none past this many ranks (a widest-path search per group)
LP_MARGIN = 1e-9      # an LP optimum is above another bound only past this share (HiGHS' tolerances: a group LP that
# meets the per-rank cut exactly may come out 1e-16 above it, which is no tighter bound)


def _applies(topology: Topology) -> bool:
    """Fabrics the bounds are tried on: with switches (without, every link into a rank starts at a rank, and only
    a route through ranks could be narrower), none of them in-network, ``2..MAX_RANKS`` ranks."""
    return bool(topology.switches) and not topology.in_network_switches and 2 <= topology.num_ranks <= MAX_RANKS


def _widths_from_outside(topology: Topology, group: np.ndarray) -> np.ndarray:
    """``W_G(x)`` of the module docstring for every node x: the widest path from a rank outside ``group``."""
    outside = [r for r in range(topology.num_ranks) if not group[r]]
    return np.asarray(widest_paths(topology, outside, incoming=True), dtype=float)


def _charged_lp(capacity: np.ndarray, width: np.ndarray, demands: list[tuple[np.ndarray, np.ndarray, float]]) -> float:
    """min T over variables ``(T, r, y)`` of links of bandwidths ``capacity`` and widths from outside ``width``:
    ``r_e / c_e + y_e / w_e ≤ T`` per link (``y_e = 0`` where no outside rank reaches e), and each demand
    ``(links of r, links of y, b)``: ``Σ r + Σ y ≥ b`` over those links. 0 where HiGHS reports no optimum (a bound
    of 0 claims nothing)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    k = len(capacity)
    width = np.minimum(capacity, width)
    reachable = np.flatnonzero(width > 0)
    rows = [np.arange(k), np.arange(k), reachable]
    cols = [np.zeros(k, dtype=np.int64), 1 + np.arange(k), 1 + k + reachable]
    values = [-np.ones(k), 1.0 / capacity, 1.0 / width[reachable]]
    bounds = [0.0] * k
    for i, (r_links, y_links, total) in enumerate(demands):
        rows += [np.full(len(r_links), k + i), np.full(len(y_links), k + i)]
        cols += [1 + r_links, 1 + k + y_links]
        values += [-np.ones(len(r_links)), -np.ones(len(y_links))]
        bounds.append(-total)
    a_ub = coo_matrix((np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(k + len(demands), 1 + 2 * k)).tocsr()
    upper = np.full(1 + 2 * k, np.inf)
    upper[1 + k:][width <= 0] = 0.0
    cost = np.zeros(1 + 2 * k)
    cost[0] = 1.0
    result = linprog(cost, A_ub=a_ub, b_ub=np.array(bounds), bounds=np.stack([np.zeros(1 + 2 * k), upper], axis=1),
                     method="highs")
    return float(result.fun) if result.status == 0 else 0.0


def reception_ratio_of_group(topology: Topology, group: np.ndarray) -> float:
    """Allgather: ``T ≥ M · ratio`` for the group of ranks ``group`` (a boolean mask over the ranks).

    Proof. Every rank v of G ends with the N − 1 pieces it did not start with, each of M bytes, so the
    transfers into v carry at least ``(N − 1)·M`` bytes. The ``N − |G|`` pieces of ranks outside G are on no
    rank of G at the start, so each of their bytes first reaches G in a transfer from a rank outside G:
    ``Σ y ≥ (N − |G|)·M``. With the link rows of the module docstring, T is at least the optimum of

        min T  s.t.  r_e / c_e + y_e / w_e ≤ T (e ∈ in(G)),  Σ_{e into v} (r_e + y_e) ≥ (N − 1)·M (v ∈ G),
                     Σ_e y_e ≥ (N − |G|)·M,  r, y ≥ 0,

    solved here with ``M = 1`` (so the optimum is in pieces per GB/s, as :func:`synth.lower_bounds.
    allgather_cut_ratio`). With ``w = c`` it is the per-rank bound ``(N − 1)·M / B⁻(v)`` of the slowest rank of G;
    it exceeds it where every way into G is narrower than the ranks' links (a leaf of 50 GB/s ports under 33 GB/s
    uplinks: 16.06 against 14 piece times per port, three ports and 12 pieces from other leaves). A
    reduce-scatter is the same on the reversed fabric (its sends charged at the sender's links)."""
    n = topology.num_ranks
    src, dst, bw, _ = topology.arrays
    members = np.flatnonzero(group)
    in_links = np.flatnonzero((dst < n) & group[np.minimum(dst, n - 1)])
    if len(members) in (0, n) or len(in_links) == 0:
        return 0.0
    widths = np.minimum(bw[in_links], _widths_from_outside(topology, group)[src[in_links]])
    if not (widths < bw[in_links]).any():
        return 0.0   # no route in is narrower than its link: the per-rank cut, which ForestColl's bound has
    # the LP depends only on each rank's links (c, w) and the counts: equal boxes pose one LP
    per_rank = tuple(sorted(tuple(sorted(zip(bw[in_links][dst[in_links] == v].tolist(),
                                             widths[dst[in_links] == v].tolist()))) for v in members))
    return _reception_lp(n, per_rank)


@functools.lru_cache(maxsize=256)
def _reception_lp(n: int, per_rank: tuple[tuple[tuple[float, float], ...], ...]) -> float:
    """The LP of :func:`reception_ratio_of_group` for a group whose ranks have the links ``(c_e, w_e)`` of
    ``per_rank`` among ``n`` ranks."""
    links = [link for rank in per_rank for link in rank]
    owner = np.repeat(np.arange(len(per_rank)), [len(rank) for rank in per_rank])
    every = np.arange(len(links))
    demands = [(every[owner == v], every[owner == v], n - 1.0) for v in range(len(per_rank))]
    demands.append((every[:0], every, n - float(len(per_rank))))
    capacity, width = (np.array(column, dtype=float) for column in zip(*links))
    return _charged_lp(capacity, width, demands)


@functools.lru_cache(maxsize=64)
def reception_ratio(topology: Topology, groups: tuple[tuple[int, ...], ...]) -> tuple[float, tuple[int, ...]]:
    """(the largest :func:`reception_ratio_of_group` over ``groups``, that group's ranks); ``(0.0, ())`` where none
    applies. Allgather needs ``T ≥ M · ratio`` on ``topology`` (route-capped, as :func:`synth.lower_bounds.
    compute_bounds` passes it, with the boxes and the allreduce partitions' groups and their complements)."""
    if not _applies(topology):
        return 0.0, ()
    best: tuple[float, tuple[int, ...]] = (0.0, ())
    for ranks in groups[:MAX_GROUPS]:
        group = np.zeros(topology.num_ranks, dtype=bool)
        group[list(ranks)] = True
        ratio = reception_ratio_of_group(topology, group)
        if ratio > best[0] * (1 + 1e-12):
            best = (ratio, ranks)
    return best


def charged_gossip_of_partition(topology: Topology, rank_label: np.ndarray) -> float:
    """Allreduce: ``T ≥ SIZE · value`` for the partition of the ranks into groups by ``rank_label``.

    Proof. Fix one element. The transfers that carry it (an input, a partial sum or the result) from rank to
    rank form a one-way gossip among the N ranks: at least ``2N − 2`` calls (Harary & Schwenk 1974, as in
    :func:`synth.lower_bounds.allreduce_bandwidth_us` bound 4). Contracting each of the g groups to a node turns
    the calls between groups into a gossip among g nodes: at least ``2g − 2`` of them cross between groups. Every
    rank receives at least one (its result depends on the others' inputs), and so does every group from outside
    it. Each call ends on a link into its receiver; a call between groups ends on ``e ∈ in(H)`` of the receiver's
    group H and, starting outside H, holds e for at least ``bytes / w_e`` (``w_e`` relative to H). Summed over the
    elements, T is at least the optimum of

        min T  s.t.  r_e / c_e + y_e / w_e ≤ T (every link e into a rank),  Σ_e (r_e + y_e) ≥ (2N − 2)·SIZE,
                     Σ_e y_e ≥ (2g − 2)·SIZE,  Σ_{e into v} (r_e + y_e) ≥ SIZE (each rank v),
                     Σ_{e ∈ in(H)} y_e ≥ SIZE (each group H),  r, y ≥ 0,

    solved with ``SIZE = 1``. With ``w = c`` it is the receivers' side of the traffic bound
    ``2(N − 1)·SIZE / Σ_v B⁻(v)``; it is higher where the calls between groups must come in over routes narrower
    than the ranks' links (leaves of 50 GB/s ports under 33 GB/s uplinks: each of the ``2g − 2`` crossings takes
    1.5 of a port's time per byte). Charging each call to its sender instead is the same LP on the reversed
    fabric."""
    n = topology.num_ranks
    _, dst, _, _ = topology.arrays
    in_links = np.flatnonzero(dst < n)
    groups = np.unique(rank_label)
    if len(groups) < 2 or len(in_links) == 0:
        return 0.0
    k = len(in_links)
    receiver_group = rank_label[dst[in_links]]
    widths = np.zeros((len(groups), topology.num_nodes))
    for i, value in enumerate(groups):
        widths[i] = _widths_from_outside(topology, rank_label == value)
    src, _, bw, _ = topology.arrays
    # a link's calls from outside are charged relative to its receiver's group
    tails = widths[np.searchsorted(groups, receiver_group), src[in_links]]
    if not (tails < bw[in_links]).any():
        return 0.0   # nothing charged: the traffic bound of synth.lower_bounds
    every, none = np.arange(k), np.arange(0)
    receiver = dst[in_links]
    demands = [(every, every, 2.0 * n - 2.0), (none, every, 2.0 * len(groups) - 2.0)]
    demands += [(every[receiver == v], every[receiver == v], 1.0) for v in range(n)]
    demands += [(none, every[receiver_group == value], 1.0) for value in groups]
    return _charged_lp(bw[in_links].astype(float), tails, demands)


@functools.lru_cache(maxsize=64)
def charged_gossip(topology: Topology, labels: tuple[tuple[int, ...], ...]) -> float:
    """The largest :func:`charged_gossip_of_partition` over the partitions ``labels`` (a group label per rank each),
    receivers' and senders' side (0 where none applies): allreduce needs ``T ≥ SIZE · value``. Not with in-network
    switches (a combining switch voids the call count)."""
    if not _applies(topology):
        return 0.0
    reverse = topology.reversed()
    best = 0.0
    for label in labels[:MAX_GROUPS]:
        ranks = np.asarray(label, dtype=np.int64)
        best = max(best, charged_gossip_of_partition(topology, ranks), charged_gossip_of_partition(reverse, ranks))
    return best

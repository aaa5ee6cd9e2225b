"""SCCL's step model shared by ``pareto`` and ``combining``: a fabric as virtual links with bandwidth
multiplicities of one unit, a solved algorithm (sends per step), and the α-β duration of its steps.

Cai et al., "Synthesizing optimal collective algorithms", PPoPP'21, §3 (bandwidth units, steps and rounds);
the step timing is docs/cost-model.md's α-β model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.synthesis.greedy import VirtualLinks, hop_distances, virtual_links
from synth.topology.model import Topology

_MAX_MULTIPLICITY = 64     # largest b_e accepted for an exact bandwidth unit


# ---- fabric: relative link bandwidths -----------------------------------------------------------
@dataclass(frozen=True)
class Fabric:
    """Virtual links over a topology plus each physical link's multiplicity ``b_e`` of ``unit_GBps``."""

    vl: VirtualLinks
    mult: np.ndarray           # (num physical links,) int, b_e
    unit_GBps: float
    exact: bool                # False when bandwidths are not multiples of one unit (b_e rounded down)
    dist: np.ndarray           # (N, N) hop distances over virtual links


def bandwidth_unit(bws: np.ndarray) -> tuple[float, np.ndarray, bool]:
    """The largest ``unit`` (GB/s) dividing every bandwidth, with ``b_e = bw_e / unit``.

    Tries ``min(bw) / k`` for k = 1..16; if none divides all bandwidths into multiplicities of at most
    ``_MAX_MULTIPLICITY``, falls back to ``unit = min(bw)`` and ``b_e = max(1, floor(bw_e / unit))``
    (a conservative model, flagged ``exact=False``)."""
    low = float(bws.min())
    for k in range(1, 17):
        unit = low / k
        ratio = bws / unit
        mult = np.rint(ratio)
        if np.all(np.abs(ratio - mult) <= 1e-6 * ratio) and mult.max() <= _MAX_MULTIPLICITY:
            return unit, mult.astype(np.int64), True
    return low, np.maximum(1, np.floor(bws / low + 1e-9)).astype(np.int64), False


def direct_first_links(topology: Topology) -> VirtualLinks:
    """One virtual link per ordered rank pair: the direct link where there is one (as SCCL and the
    simulator use it), else the switch route of :func:`synth.synthesis.greedy.virtual_links`."""
    vl = virtual_links(topology)
    index = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    alpha, bw, phys = vl.alpha.copy(), vl.bw.copy(), vl.phys.copy()
    routes = list(vl.route)
    for j, (u, v) in enumerate(zip(vl.src.tolist(), vl.dst.tolist())):
        link = topology.link(u, v)
        if link is not None and routes[j]:
            alpha[j], bw[j], routes[j] = link.alpha, link.bw, ()
            phys[j] = -1
            phys[j, 0] = index[(u, v)]
    return VirtualLinks(vl.src, vl.dst, alpha, bw, tuple(routes), phys, vl.num_phys)


def fabric(topology: Topology) -> Fabric:
    vl = direct_first_links(topology)
    _, _, bw, _ = topology.arrays
    unit, mult, exact = bandwidth_unit(np.asarray(bw, dtype=float))
    return Fabric(vl, mult, unit, exact, hop_distances(vl, topology.num_ranks))


@dataclass(frozen=True)
class Algorithm:
    """A solved instance: per step its rounds, and the sends ``(step 1..S, problem chunk, virtual link)``."""

    chunks: int
    steps: int
    rounds: int
    rounds_per_step: tuple[int, ...]
    sends: tuple[tuple[int, int, int], ...]
    solve_s: float


def step_terms(fab: Fabric, algo: Algorithm, chunk_ids: tuple[int, ...]) -> list[list[tuple[float, float]]]:
    """Per step, one ``(a, b)`` per physical link used: the link is busy ``a + b · chunk_bytes`` µs.

    α-β model of docs/cost-model.md: the sends of one virtual link in a step go as one transfer per run of contiguous
    chunk ids (lowering merges those into one MSCCL step), each paying the route's α, and every
    transfer holds each physical link of its route, so ``a = Σ α`` and ``b = Σ chunks / bw``. A step
    lasts as long as its busiest link: ``max (a + b · chunk_bytes)``, which is at most SCCL's
    ``α + r_s · chunk_bytes / bw_unit`` when each link sends one transfer per step."""
    per: dict[tuple[int, int], list[int]] = {}
    for s, c, j in algo.sends:
        per.setdefault((s, j), []).append(chunk_ids[c])
    load: dict[tuple[int, int], list[float]] = {}
    for (s, j), ids in per.items():
        ids.sort()
        runs = 1 + sum(1 for x, y in zip(ids, ids[1:]) if y != x + 1)
        a = runs * float(fab.vl.alpha[j])
        b = len(ids) / (float(fab.vl.bw[j]) * 1e3)
        for e in fab.vl.phys[j]:
            if e >= 0:
                acc = load.setdefault((s, int(e)), [0.0, 0.0])
                acc[0] += a
                acc[1] += b
    out: list[list[tuple[float, float]]] = [[] for _ in range(algo.steps)]
    for (s, _e), (a, b) in sorted(load.items()):
        if (a, b) not in out[s - 1]:
            out[s - 1].append((a, b))
    return out


def step_duration(terms: list[tuple[float, float]], chunk_bytes: float) -> float:
    return max((a + b * chunk_bytes for a, b in terms), default=0.0)



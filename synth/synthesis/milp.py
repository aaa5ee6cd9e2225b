"""Exact time-expanded MILP (TE-CCL, Liu et al., SIGCOMM'24; TACCL, Shah et al., NSDI'23).

Time is cut into epochs of length τ. The model decides which chunk crosses which rank-to-rank
*virtual link* in which epoch; a chunk sent in epoch k is usable at its receiver from epoch k+1.

**Epoch length.** Let ``b`` be the chunk size, and for virtual link j let α_j be the sum of the hop
α's and bw_j the smallest hop bandwidth. We allow one transfer per physical link per epoch carrying
up to m_j chunks (one α, a multi-chunk step, docs/cost-model.md). We pick a batch size m0 (1 when bandwidth-bound;
when latency-bound, the most chunks whose serialization fits in 25% of the smallest α) and set

    τ = max_j (α_j + m0 · b / bw_j),   m_j = floor((τ − α_j) · bw_j / b)   (≥ m0 ≥ 1),

so every transfer the model allows fits in its epoch under the α-β cost model (decoded start kτ,
end kτ + α_j + (chunks) · b / bw_j). ``options.extra['tau_us']`` overrides τ.

**Switches.** Switches hold no buffers, so a route rank -> switch(es) -> rank is modelled as one
virtual link with the path's Σα and min bw (:func:`synth.synthesis.greedy.virtual_links`); what
enters a switch leaves it in the same epoch. Capacity is enforced on every *physical* link of the
route: at most one virtual link that uses physical link l is active per epoch.

**Port model** (``options.extra['milp_ports']``: ``auto`` (default) = on behind switches when latency-bound,
``on``, ``off``; :func:`port_model_on`). A rank's switch port is a physical link like any other, so
the capacity rows below already serialize its transfers, but one epoch transfer may batch m_j chunks
for one α only if they are one run of consecutive chunk ids: an MSCCL step moves contiguous chunks
(docs/cost-model.md rule 2), and scattered ones become several port transfers, each paying the full
rank→switch→rank α. Without this the model counts one α where the program pays several (dgx-a100, 1 KB
allgather: 3 epochs in the model, 8.4 µs after decoding, 2× recursive doubling). With it,
:func:`_one_run` adds the rows, the warm starts are re-placed to obey them (:func:`port_replay`) and
recursive doubling (:func:`butterfly`) joins them as a warm start; where it meets the epoch lower bound
(N a power of two, one port per rank: log2 N epochs) it is optimal in the model without a solve.
Chunk-id runs are the program's steps in place, for allreduce, and out of place for the copy collectives
(lowering sends an origin's own piece from its output copy when a message mixes it with relayed ones);
out-of-place reducescatter, reduce and gather, whose partial sums then sit in several buffers, keep the
model without the port rows.

**Variables** (all binary; pruned, see below):
x[c,j,k] chunk c crosses virtual link j in epoch k; y[j,k] link j is active in epoch k;
h[c,r,k] rank r holds c at the start of epoch k (k = 0..K); done[k] every postcondition holds at
the start of epoch k.

**Constraints.**
- store-and-forward: x[c,j,k] ≤ h[c,src_j,k] (a chunk sent in epoch k is held at its start);
- arrival and free copy at ranks: h[c,r,k+1] ≤ h[c,r,k] + Σ_{j into r} x[c,j,k]; h monotone;
- batching: Σ_c x[c,j,k] ≤ m_j · y[j,k]; physical capacity: Σ_{j ∋ l} y[j,k] ≤ 1;
- completion: done[k] ≤ h[c,d,k] for every destination d of c; h[c,d,K] = 1.

**Objective.** min Σ_{k<K} (1 − done[k]) = the number of epochs until every postcondition holds.

**Sizing.** The horizon K is the better of two warm starts replayed into epochs: the α-β greedy
(TACOS) plan, and an epoch-level batching greedy (which finds recursive-doubling-like schedules when
latency-bound); it is passed to the solver with ``Model.set_start``. x[c,j,k] exists only if
k ≥ earliest(c, src_j) (hop distance from the chunk's sources) and k + 1 + dist(dst_j, nearest
destination of c) ≤ K; h[c,r,k] only for k ≥ earliest(c, r). By default
(``options.extra['milp_routes']`` = shortest; ``all`` is exact, ``auto`` prunes above
``ROUTE_PRUNE_ABOVE`` send variables) single-destination chunks (alltoall, gather, scatter) only
move along shortest paths, which makes "optimal" mean optimal among shortest-path routings (the
result's notes say which).
Combinatorial lower bounds fix done[k] = 0 below them, which tightens the LP and proves optimality
in the epoch model outright when a warm start meets them: the largest earliest arrival; per rank, chunks needed over
chunks its in-links can bring per epoch, and chunks only it holds over what its out-links carry;
total chunk-hops over the chunk-hops all ranks' out-links carry per epoch; and holders of a chunk
growing at most (1 + d)-fold per epoch (d = most physical out-links of a rank).
No symmetry-breaking constraints are added (the warm start and bounds did more in our tests).

**Continuous time.** The epoch solution is compacted (each batch starts when its chunks are at the
sender and its links are free, in epoch order; a batch is sent as runs of consecutive chunk ids,
one α each, since an MSCCL step moves contiguous chunks). If the α-β greedy plan is still faster
(the epoch grid rounds every transfer up to τ, which loses on heterogeneous links), it is returned
instead and ``notes['phases'][...]['kept']`` says so; the solver figures in the notes always refer
to the epoch model.

**Status.** Optimality in the epoch model (one chunk size C, one τ, transfers aligned to the
grid) is not optimality under the α-β cost model of docs/cost-model.md: a finer chunking or off-grid timing can be
faster. The result's ``status`` is decided by the pipeline (:func:`synth.pipeline.status_of`): ``optimal`` only
where the simulated time meets the lower bound of :func:`synth.lower_bounds.compute_bounds`, else ``feasible``.
What the solver proved about the epoch model is kept in ``notes['model_status']`` (and per phase in
``notes['phases'][...]['model_status']``).

**Reductions** (reducescatter, reduce) use the reverse-graph trick: the copy problem is solved on
the reversed topology and the schedule is reversed in time with reducing sends (each rank sends its
partial after all partials routed through it arrived). Allreduce = that reduce-scatter followed by
an allgather, each solved optimally in its own MILP (optimal for the decomposition, not jointly).
Allreduce also gets a *direct combining* candidate (partial sums exchanged and combined in synchronous
steps, SCCL's combining encoding: :mod:`synth.synthesis.combining`, with a quarter of the work limit on top
of the two phases' halves, so an allreduce may spend 1.25 times it); the
method returns the one its α-β model predicts faster with the other as an alternative, and the pipeline
times both (``options.extra['milp_combining'] = False`` leaves only the composed one).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from synth.arrays import unique_values
from synth.collectives import COLLECTIVES
from synth.errors import SynthError
from synth.schedule import Schedule, Transfer
from synth.synthesis.base import Instance, MethodSpec, SynthOptions
from synth.synthesis.greedy import (
    CopyProblem,
    Plan,
    VirtualLinks,
    allreduce_owners,
    best_greedy,
    check_supported,
    copy_problem,
    dest_distance,
    effective_collective,
    hop_distances,
    plan_transfers,
    virtual_links,
)

if TYPE_CHECKING:
    from synth.solvers import Model

# options.extra["milp_routes"]: "shortest" (default) restricts single-destination chunks (alltoall,
# gather, scatter) to shortest paths; "all" is the exact model; "auto" prunes only above this many
# send variables. Measured: ring-8 alltoall 1 MB, both reach the same 8 epochs, shortest 2.5k
# variables / 1 s, all 7k variables / 42 s.
ROUTE_PRUNE_ABOVE = 5_000
# Used when SynthOptions.time_limit is None, so `-m milp` never runs for hours (seconds, all phases): the
# wall-clock safety stop (a solve it cuts short fails; synth.solvers).
DEFAULT_TIME_LIMIT_S = 120.0
# Used when SynthOptions.work_limit is None: the deterministic budget, all phases (synth.solvers work units).
DEFAULT_WORK_S = 60.0


# ---- epochs ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Epochs:
    tau: float              # µs
    batch: np.ndarray       # (V,) m_j: chunks per transfer per epoch
    m0: int


def choose_epochs(vl: VirtualLinks, chunk_bytes: float, num_chunks: int, tau: float | None = None,
                  max_batch: int | None = None) -> Epochs:
    """τ and m_j as in the module docstring (m0 at most ``max_batch``, default ``num_chunks``)."""
    ser = chunk_bytes / (vl.bw * 1e3)          # µs per chunk on each virtual link
    if tau is None:
        fit = math.floor(0.25 * float(vl.alpha.min()) / float(ser.max()) + 1e-9)
        m0 = int(max(1, min(max_batch or num_chunks, fit)))
        tau = float((vl.alpha + m0 * ser).max())
    else:
        m0 = 1
        if tau < float((vl.alpha + ser).max()) - 1e-12:
            raise SynthError(f"tau {tau} µs is shorter than one chunk on the slowest link "
                             f"({float((vl.alpha + ser).max()):.4g} µs)")
    batch = np.maximum(1, np.floor((tau - vl.alpha) / ser + 1e-9)).astype(np.int64)
    return Epochs(float(tau), np.minimum(batch, max(1, num_chunks)), m0)


# ---- warm start: a plan replayed into epochs -------------------------------------------------------
def replay(vl: VirtualLinks, problem: CopyProblem, plan: Plan, ep: Epochs,
           dd: np.ndarray) -> list[tuple[int, int, int]]:
    """Greedy transfers (in start order) placed in the earliest epoch that respects holding and
    capacity: returns sends (chunk, virtual link, epoch)."""
    n = problem.num_ranks
    arrive = np.full((problem.num_chunks, n), np.iinfo(np.int64).max, dtype=np.int64)
    for c, s in enumerate(problem.sources):
        arrive[c, list(s)] = 0
    load: dict[tuple[int, int], int] = {}
    phys_used: set[tuple[int, int]] = set()
    sends = []
    for i in np.argsort(plan.starts, kind="stable"):
        c, j = int(plan.chunks[i]), int(plan.links[i])
        u, v = int(vl.src[j]), int(vl.dst[j])
        k = int(arrive[c, u])
        if arrive[c, v] <= k + 1:
            continue
        hops = [int(p) for p in vl.phys[j] if p >= 0]
        while True:
            used = load.get((j, k), 0)
            if 0 < used < ep.batch[j] or (used == 0 and not any((p, k) in phys_used for p in hops)):
                break
            k += 1
        if arrive[c, v] <= k + 1:
            continue
        load[(j, k)] = load.get((j, k), 0) + 1
        phys_used.update((p, k) for p in hops)
        arrive[c, v] = k + 1
        sends.append((c, j, k))
    horizon = _finish_epoch(problem, arrive)
    # drop sends that cannot lead to a destination by the horizon (the model prunes them)
    return [(c, j, k) for c, j, k in sends if k + 1 + dd[c, vl.dst[j]] <= horizon]


def epoch_greedy(vl: VirtualLinks, problem: CopyProblem, ep: Epochs, dd: np.ndarray, seed: int = 0,
                 max_epochs: int = 10_000) -> list[tuple[int, int, int]]:
    """A batching greedy in the epoch model (the α-β greedy sends one chunk per transfer, which
    cannot find recursive-doubling-like schedules when latency-bound): each epoch, virtual links are
    taken in order of how many useful chunks they could carry (most first, seeded tie-break), each
    carrying up to m_j of them, at most one transfer per physical link."""
    rng = np.random.default_rng(seed)
    hold, need = problem.matrices()
    n = problem.num_ranks
    sparse = np.array([0 < len(d) and len(d) + len(s) < n for d, s in zip(problem.dests, problem.sources)])
    big = np.iinfo(np.int64).max
    sends = []
    for k in range(max_epochs):
        if not need.any():
            return sends
        best = np.where(hold, dd, big).min(axis=1)
        useful = need | (sparse[:, None] & (dd < best[:, None]) & ~hold)
        ok = hold[:, vl.src] & useful[:, vl.dst]          # chunks x virtual links
        count = np.minimum(ok.sum(axis=0), ep.batch)
        order = np.lexsort((rng.random(vl.count), -count))
        used: set[int] = set()
        arriving = np.zeros_like(hold)
        relayed: set[tuple[int, int]] = set()
        prio = need.sum(axis=1) * 2.0 + np.minimum(best, n) + rng.random(problem.num_chunks) * 0.5
        for j in order:
            if count[j] == 0:
                break
            hops = [int(p) for p in vl.phys[j] if p >= 0]
            if any(p in used for p in hops):
                continue
            v = int(vl.dst[j])
            cand = np.flatnonzero(ok[:, j] & ~arriving[:, v])
            picks = []
            for c in cand[np.argsort(-prio[cand], kind="stable")]:
                if not need[c, v] and (c, int(dd[c, v])) in relayed:
                    continue
                picks.append(int(c))
                if len(picks) == ep.batch[j]:
                    break
            if not picks:
                continue
            used.update(hops)
            for c in picks:
                arriving[c, v] = True
                if not need[c, v]:
                    relayed.add((c, int(dd[c, v])))
                sends.append((c, int(j), k))
        if not arriving.any():
            raise SynthError("milp: epoch greedy made no progress; some destination is unreachable")
        hold |= arriving
        need &= ~arriving
    raise SynthError("milp: epoch greedy did not finish")


def run_batches(problem: CopyProblem, sends: list[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    """The sends of each (link, epoch) batch cut into runs of consecutive chunk ids, in (epoch, link,
    first id) order: the transfers an MSCCL lowering makes of them (docs/cost-model.md rule 2)."""
    ids = problem.chunk_ids
    batches: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for c, j, k in sends:
        batches.setdefault((k, j), []).append((c, j, k))
    out = []
    for key in sorted(batches):
        run: list[tuple[int, int, int]] = []
        for send in sorted(batches[key], key=lambda t: ids[t[0]]):
            if run and ids[send[0]] != ids[run[-1][0]] + 1:
                out.append(run)
                run = []
            run.append(send)
        out.append(run)
    return out


def port_replay(vl: VirtualLinks, problem: CopyProblem,
                sends: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Port model: re-place an epoch schedule so that every (link, epoch) batch is one run of
    consecutive chunk ids. Runs keep their order; each goes to the earliest epoch, not before its
    own, in which its sender holds all its chunks and no physical link of its route is taken."""
    n = problem.num_ranks
    big = np.iinfo(np.int64).max
    arrive = np.full((problem.num_chunks, n), big, dtype=np.int64)
    for c, src in enumerate(problem.sources):
        arrive[c, list(src)] = 0
    taken: set[tuple[int, int]] = set()
    out = []
    for run in run_batches(problem, sends):
        j = run[0][1]
        u, v = int(vl.src[j]), int(vl.dst[j])
        live = [c for c, _j, _k in run if arrive[c, v] == big]
        if not live:
            continue
        hops = [int(p) for p in vl.phys[j] if p >= 0]
        k = max([run[0][2]] + [int(arrive[c, u]) for c in live])
        while any((p, k) in taken for p in hops):
            k += 1
        taken.update((p, k) for p in hops)
        for c in live:
            arrive[c, v] = k + 1
            out.append((c, j, k))
    return out


def butterfly(vl: VirtualLinks, problem: CopyProblem, ep: Epochs) -> list[tuple[int, int, int]] | None:
    """Recursive doubling in the epoch model (the port model's warm start): in epoch s rank i sends
    every chunk it holds to i XOR 2^s (Thakur, Rabenseifner & Gropp, IJHPCA 2005, allgather by
    recursive doubling). Applies to N a power of two where every chunk has one source and must reach
    every rank, every pair (i, i XOR 2^s) has a virtual link and every batch is one run of
    consecutive chunk ids within m_j; None otherwise."""
    n = problem.num_ranks
    if n < 2 or n & (n - 1):
        return None
    if any(len(src) != 1 or len(set(src) | set(dst)) != n for src, dst in zip(problem.sources, problem.dests)):
        return None
    link = {(int(a), int(b)): j for j, (a, b) in enumerate(zip(vl.src.tolist(), vl.dst.tolist()))}
    hold = [{c for c, src in enumerate(problem.sources) if src[0] == r} for r in range(n)]
    ids = problem.chunk_ids
    sends = []
    for k in range(n.bit_length() - 1):
        for i in range(n):
            p = i ^ (1 << k)
            j = link.get((i, p))
            if j is None:
                return None
            batch = sorted((c for c in hold[i] if c not in hold[p]), key=lambda c: ids[c])
            if len(batch) > ep.batch[j] or any(ids[b] != ids[a] + 1 for a, b in zip(batch, batch[1:])):
                return None
            sends += [(c, j, k) for c in batch]
        hold = [hold[i] | hold[i ^ (1 << k)] for i in range(n)]
    return sends


def _finish_epoch(problem: CopyProblem, arrive: np.ndarray) -> int:
    last = 0
    for c, dests in enumerate(problem.dests):
        if dests:
            last = max(last, int(arrive[c, list(dests)].max()))
    return last


def lower_bound_epochs(vl: VirtualLinks, problem: CopyProblem, ep: Epochs, dist: np.ndarray) -> int:
    """max(earliest arrival of any chunk at any destination, per-rank needed chunks / chunks its
    in-links can bring per epoch, per-rank chunks only it holds / chunks its out-links can carry)."""
    n = problem.num_ranks
    lb = 0
    need = np.zeros(n, dtype=np.int64)
    for s, d in zip(problem.sources, problem.dests):
        if d:
            lb = max(lb, int(dist[np.ix_(list(s), list(d))].min(axis=0).max()))
            need[list(d)] += 1
    # per physical link into r: the most chunks one transfer on it may carry toward r
    cap_in = np.zeros(n, dtype=np.int64)
    cap_out = np.zeros(n, dtype=np.int64)
    first = np.array([row[row >= 0][0] for row in vl.phys])
    last = np.array([row[row >= 0][-1] for row in vl.phys])
    for r in range(n):
        into = np.flatnonzero(vl.dst == r)
        per_link: dict[int, int] = {}
        for j in into:
            per_link[int(last[j])] = max(per_link.get(int(last[j]), 0), int(ep.batch[j]))
        cap_in[r] = sum(per_link.values())
        out = np.flatnonzero(vl.src == r)
        per_link = {}
        for j in out:
            per_link[int(first[j])] = max(per_link.get(int(first[j]), 0), int(ep.batch[j]))
        cap_out[r] = sum(per_link.values())
    with np.errstate(divide="ignore", invalid="ignore"):
        lb = max(lb, int(np.max(np.ceil(need / np.maximum(cap_in, 1)))))
    # a rank that is the only source of chunks must push each of them out at least once
    only = np.zeros(n, dtype=np.int64)
    for s, d in zip(problem.sources, problem.dests):
        if len(s) == 1 and d:
            only[s[0]] += 1
    lb = max(lb, int(np.max(np.ceil(only / np.maximum(cap_out, 1)))))
    # link load: every chunk-hop needs one virtual-link transfer, which holds its first physical
    # link; per epoch at most sum_r cap_out[r] chunk-hops move (single-destination chunks need
    # dist(source, dest) hops, multi-destination ones one arrival per destination)
    hops_needed = 0
    for s, d in zip(problem.sources, problem.dests):
        if len(d) == 1:
            hops_needed += int(dist[list(s), d[0]].min())
        else:
            hops_needed += len(d)
    lb = max(lb, math.ceil(hops_needed / max(1, int(cap_out.sum())) - 1e-9))
    # holders of a chunk grow at most (1 + d)-fold per epoch, d = most physical out-links of a rank
    firsts = [len(set(first[vl.src == r].tolist())) for r in range(n)]
    grow = 1 + max(firsts)
    for s, d in zip(problem.sources, problem.dests):
        if d:
            total = len(set(s) | set(d))
            lb = max(lb, math.ceil(math.log(total / len(s)) / math.log(grow) - 1e-9))
    return lb


# ---- the model -------------------------------------------------------------------------------------
@dataclass
class Built:
    model: object
    x_keys: np.ndarray      # (nx, 3): chunk, link, epoch
    x_col: np.ndarray
    horizon: int
    lb: int
    num_binaries: int


def build_model(vl: VirtualLinks, problem: CopyProblem, ep: Epochs, horizon: int, lb: int,
                dist: np.ndarray, dd: np.ndarray, start: list[tuple[int, int, int]] | None = None,
                shortest: bool = True, ports: bool = False, integral_runs: bool = False) -> Built:
    """The time-expanded MILP of the module docstring (TE-CCL, Liu et al., SIGCOMM'24) as a
    :class:`synth.solvers.Model`: the pruned binaries x, h, y, done, then one constraint family per
    step below (each step's docstring gives its rows), the objective min Σ_{k<K} (1 − done[k]), and
    the warm start. ``ports``: the port model's one-run rows (:func:`_one_run`), their run starts binary where
    ``integral_runs`` (CP-SAT takes integer columns only; with binary sends the least run start is 0 or 1, so
    the optimum is the same)."""
    from synth.solvers import Model

    K = horizon
    reach = _reach(problem, dist, dd, K)
    model = Model("te-milp")
    x_keys = _send_keys(vl, reach, dd, K, shortest)
    x_col = model.add_binaries(len(x_keys))
    h_idx = _add_holds(model, reach, dd, K, shortest)
    _must_hold_at_horizon(model, reach, h_idx, K)
    jk, y_col, x_y = _add_link_epochs(model, x_keys, K)
    done = _add_done(model, K, lb)
    v = _Vars(x_keys, x_col, h_idx, jk, y_col, x_y, done)
    rows = _Rows()
    _store_and_forward(rows, vl, v)
    _arrival_and_holding(rows, vl, v)
    _batching(rows, ep, v, K)
    _physical_capacity(rows, vl, v, K)
    _completion(model, rows, reach, v, K, lb)
    runs = _one_run(model, rows, problem, v, integral_runs) if ports else None
    rows.add_to(model)
    model.set_objective(done, -1.0, "min", offset=float(K))
    if start is not None:
        _warm_start(model, vl, problem, reach, v, K, start, runs)
    return Built(model, x_keys, x_col, K, lb, model.num_vars)


@dataclass(frozen=True)
class _Reach:
    """Where each chunk starts, must end, and how soon it can be held anywhere (the model's pruning)."""

    src_set: np.ndarray     # (nc, n): rank is a source of the chunk
    earliest: np.ndarray    # (nc, n): first epoch the rank can hold the chunk (hops from its nearest source)
    dest_mask: np.ndarray   # (nc, n): rank is a destination of the chunk
    single: np.ndarray      # (nc,): the chunk has one destination
    total: np.ndarray       # (nc,): hops from the chunk's nearest source to its nearest destination


def _reach(problem: CopyProblem, dist: np.ndarray, dd: np.ndarray, horizon: int) -> _Reach:
    """Sources, destinations and earliest holding epochs of every chunk, from the hop distances."""
    nc, n = problem.num_chunks, problem.num_ranks
    src_set = np.zeros((nc, n), dtype=bool)
    for c, s in enumerate(problem.sources):
        src_set[c, list(s)] = True
    earliest = np.full((nc, n), horizon + 1, dtype=np.int64)
    for c, s in enumerate(problem.sources):
        earliest[c] = dist[list(s)].min(axis=0)
    earliest[src_set] = 0
    dest_mask = np.zeros((nc, n), dtype=bool)
    for c, d in enumerate(problem.dests):
        dest_mask[c, list(d)] = True
    single = np.array([len(d) == 1 for d in problem.dests])
    total = np.array([dd[c, list(s)].min() for c, s in enumerate(problem.sources)])
    return _Reach(src_set, earliest, dest_mask, single, total)


def _send_keys(vl: VirtualLinks, reach: _Reach, dd: np.ndarray, horizon: int, shortest: bool) -> np.ndarray:
    """(chunk, link, epoch) of every x[c, j, k]: k in [earliest(c, u), K − 1 − dd(c, v)], v not a source of c."""
    cs, js, ks = [], [], []
    for j in range(vl.count):
        u, v = int(vl.src[j]), int(vl.dst[j])
        lo = reach.earliest[:, u]
        hi = horizon - 1 - dd[:, v]
        ok = (~reach.src_set[:, v]) & (lo <= hi)
        if shortest:
            # single-destination chunks only move along shortest paths toward their destination
            # (the sender on a shortest source-destination path, the receiver one hop closer)
            ok &= ~reach.single | ((dd[:, v] == dd[:, u] - 1) & (reach.earliest[:, u] + dd[:, u] == reach.total))
        for c in np.flatnonzero(ok):
            span = np.arange(lo[c], hi[c] + 1)
            cs.append(np.full(len(span), c))
            js.append(np.full(len(span), j))
            ks.append(span)
    if cs:
        return np.stack([np.concatenate(cs), np.concatenate(js), np.concatenate(ks)], axis=1)
    return np.zeros((0, 3), dtype=np.int64)


def _add_holds(model: Model, reach: _Reach, dd: np.ndarray, horizon: int, shortest: bool) -> np.ndarray:
    """Add h[c, r, k] for non-sources, k in [earliest, K]; returns the (nc, n, K+1) column table (-1: none)."""
    nc, n = reach.src_set.shape
    h_idx = np.full((nc, n, horizon + 1), -1, dtype=np.int64)
    mask = (~reach.src_set)[:, :, None] & (np.arange(horizon + 1)[None, None, :] >= reach.earliest[:, :, None])
    if shortest:   # single-destination chunks are only ever held on their shortest paths
        off_path = reach.single[:, None] & (reach.earliest + dd != reach.total[:, None])
        mask &= ~off_path[:, :, None]
    count = int(mask.sum())
    h_cols = model.add_binaries(count)
    h_idx[mask] = h_cols
    return h_idx


def _must_hold_at_horizon(model: Model, reach: _Reach, h_idx: np.ndarray, horizon: int) -> None:
    """Rows h[c, d, K] = 1 for every destination d of c."""
    ends = h_idx[:, :, horizon][reach.dest_mask]
    if (ends < 0).any():
        raise SynthError("milp horizon is shorter than the earliest arrival (internal error)")
    model.add_rows(np.arange(len(ends)), ends, 1.0, np.ones(len(ends)), np.ones(len(ends)))


def _add_link_epochs(model: Model, x_keys: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Add y[j, k] for the (j, k) pairs that carry some x: (their keys j(K+1)+k, columns, y of each x)."""
    nx = len(x_keys)
    jk = unique_values(x_keys[:, 1] * (horizon + 1) + x_keys[:, 2]) if nx else np.zeros(0, dtype=np.int64)
    y_col = model.add_binaries(len(jk))
    x_y = np.searchsorted(jk, x_keys[:, 1] * (horizon + 1) + x_keys[:, 2])
    return jk, y_col, x_y


def _add_done(model: Model, horizon: int, lb: int) -> np.ndarray:
    """Add done[k], k = 0..K-1, with done[k] = 0 fixed below the lower bound ``lb``."""
    done = model.add_binaries(horizon)
    if lb > 0:
        fixed = done[: min(lb, horizon)]
        model.add_rows(np.arange(len(fixed)), fixed, 1.0, np.zeros(len(fixed)), np.zeros(len(fixed)))
    return done


@dataclass(frozen=True)
class _Vars:
    """The model's columns: x by (chunk, link, epoch) key, h by table, y by (link, epoch) key, done."""

    x_keys: np.ndarray      # (nx, 3): chunk, link, epoch
    x_col: np.ndarray
    h_idx: np.ndarray       # (nc, n, K+1): column of h[c, r, k], -1 where pruned
    jk: np.ndarray          # sorted keys j(K+1)+k of the y variables
    y_col: np.ndarray
    x_y: np.ndarray         # per x: index of its y in jk
    done: np.ndarray


class _Rows:
    """Constraint rows in COO form, gathered across families and added to the model in one call."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.count = 0

    def add(self, cols: np.ndarray, vals: np.ndarray, row_ids: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Rows numbered 0..len(lo)-1 locally: entry i puts ``vals[i]`` at ``cols[i]`` of row ``row_ids[i]``."""
        self.rows.append(row_ids + self.count)
        self.cols.append(cols)
        self.vals.append(vals)
        self.lo.append(lo)
        self.hi.append(hi)
        self.count += len(lo)

    def add_to(self, model: Model) -> None:
        """Add the gathered rows to ``model``."""
        model.add_rows(np.concatenate(self.rows), np.concatenate(self.cols), np.concatenate(self.vals),
                       np.concatenate(self.lo), np.concatenate(self.hi))


def _store_and_forward(rows: _Rows, vl: VirtualLinks, v: _Vars) -> None:
    """x[c, j, k] − h[c, src_j, k] ≤ 0 where src_j holds c by h (a source always holds it)."""
    nx = len(v.x_keys)
    u_of = vl.src[v.x_keys[:, 1]]
    hu = v.h_idx[v.x_keys[:, 0], u_of, v.x_keys[:, 2]] if nx else np.zeros(0, dtype=np.int64)
    sel = np.flatnonzero(hu >= 0)
    m = len(sel)
    rows.add(np.concatenate([v.x_col[sel], hu[sel]]), np.concatenate([np.ones(m), -np.ones(m)]),
             np.concatenate([np.arange(m), np.arange(m)]), np.full(m, -math.inf), np.zeros(m))


def _arrival_and_holding(rows: _Rows, vl: VirtualLinks, v: _Vars) -> None:
    """h[c,r,k+1] − h[c,r,k] − Σ_{j into r} x[c,j,k] ≤ 0 for every h[c,r,k+1]; then h monotone:
    h[c,r,k] − h[c,r,k+1] ≤ 0."""
    h_idx, x_keys = v.h_idx, v.x_keys
    cc, vv, kk = np.nonzero(h_idx[:, :, 1:] >= 0)
    k1 = kk + 1
    a_rows = np.arange(len(cc))
    row_of = np.full(h_idx.shape, -1, dtype=np.int64)
    row_of[cc, vv, k1] = a_rows
    prev = h_idx[cc, vv, kk]
    has_prev = prev >= 0
    v_of = vl.dst[x_keys[:, 1]]
    xr = row_of[x_keys[:, 0], v_of, x_keys[:, 2] + 1] if len(x_keys) else np.zeros(0, dtype=np.int64)
    xs = np.flatnonzero(xr >= 0)
    rows.add(np.concatenate([h_idx[cc, vv, k1], prev[has_prev], v.x_col[xs]]),
             np.concatenate([np.ones(len(cc)), -np.ones(int(has_prev.sum())), -np.ones(len(xs))]),
             np.concatenate([a_rows, a_rows[has_prev], xr[xs]]), np.full(len(cc), -math.inf), np.zeros(len(cc)))
    hp = np.flatnonzero(has_prev)
    mm = len(hp)
    rows.add(np.concatenate([prev[hp], h_idx[cc[hp], vv[hp], k1[hp]]]), np.concatenate([np.ones(mm), -np.ones(mm)]),
             np.concatenate([np.arange(mm), np.arange(mm)]), np.full(mm, -math.inf), np.zeros(mm))


def _batching(rows: _Rows, ep: Epochs, v: _Vars, horizon: int) -> None:
    """Σ_c x[c,j,k] − m_j · y[j,k] ≤ 0: one transfer of at most m_j chunks per link and epoch."""
    ny = len(v.jk)
    y_link = v.jk // (horizon + 1)
    rows.add(np.concatenate([v.x_col, v.y_col]),
             np.concatenate([np.ones(len(v.x_col)), -ep.batch[y_link].astype(float)]),
             np.concatenate([v.x_y, np.arange(ny)]), np.full(ny, -math.inf), np.zeros(ny))


def _physical_capacity(rows: _Rows, vl: VirtualLinks, v: _Vars, horizon: int) -> None:
    """Σ_{j uses l} y[j,k] ≤ 1 for every physical link l and epoch k."""
    y_link = v.jk // (horizon + 1)
    y_epoch = v.jk % (horizon + 1)
    hops = vl.phys[y_link]
    yy, hh = np.nonzero(hops >= 0)
    key = hops[yy, hh] * (horizon + 1) + y_epoch[yy]
    ukey, inv = np.unique(key, return_inverse=True)
    rows.add(v.y_col[yy], np.ones(len(yy)), inv, np.full(len(ukey), -math.inf), np.ones(len(ukey)))


def _completion(model: Model, rows: _Rows, reach: _Reach, v: _Vars, horizon: int, lb: int) -> None:
    """done[k] − h[c,d,k] ≤ 0 for every destination d of c, k ≥ lb (done[k] = 0 where some h[c,d,k] is
    pruned, added to the model at once); then done monotone: done[k] − done[k+1] ≤ 0."""
    done = v.done
    dc, dv = np.nonzero(reach.dest_mask)
    for k in range(min(lb, horizon), horizon):
        hk = v.h_idx[dc, dv, k]
        if (hk < 0).any():
            model.add_row([done[k]], [1.0], 0.0, 0.0)
            continue
        md = len(hk)
        rows.add(np.concatenate([np.full(md, done[k]), hk]), np.concatenate([np.ones(md), -np.ones(md)]),
                 np.concatenate([np.arange(md), np.arange(md)]), np.full(md, -math.inf), np.zeros(md))
    if horizon > 1:
        m = horizon - 1
        rows.add(np.concatenate([done[:-1], done[1:]]), np.concatenate([np.ones(m), -np.ones(m)]),
                 np.concatenate([np.arange(m), np.arange(m)]), np.full(m, -math.inf), np.zeros(m))


def _one_run(model: Model, rows: _Rows, problem: CopyProblem, v: _Vars,
             integral: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Port model: a (link, epoch) batch is one contiguous run of chunk ids, so it pays one α.

    The epoch model lets a virtual link carry up to m_j chunks per epoch for one α, but an MSCCL step
    moves contiguous chunks only (docs/cost-model.md rule 2), so a batch of scattered chunks becomes
    several transfers that serialize on the rank's switch port, each paying the full route α (the
    continuous-time decoder, :func:`compact`, charges exactly that). With r[c,j,k] ∈ [0, 1] marking
    "c starts a run" (c' = the chunk whose id is id(c) − 1):

        r[c,j,k] ≥ x[c,j,k] − x[c',j,k]   (r ≥ x where c' has no send variable),
        Σ_c r[c,j,k] ≤ y[j,k],

    a batch with two runs has two starts and is infeasible; one run needs Σ r = 1. Returns the r
    columns and, per send, the index of its predecessor's send (−1: none), for the warm start."""
    x_keys = v.x_keys
    nx = len(x_keys)
    index = {(int(c), int(j), int(k)): i for i, (c, j, k) in enumerate(x_keys.tolist())}
    by_id = {int(cid): c for c, cid in enumerate(problem.chunk_ids)}
    pred_chunk = np.array([by_id.get(int(cid) - 1, -1) for cid in problem.chunk_ids], dtype=np.int64)
    pred = np.array([index.get((int(pred_chunk[c]), j, k), -1) if pred_chunk[c] >= 0 else -1
                     for c, j, k in x_keys.tolist()], dtype=np.int64)
    r_col = model.add_vars(nx, 0.0, 1.0, integer=integral)
    has = np.flatnonzero(pred >= 0)
    ids = np.arange(nx)
    rows.add(np.concatenate([v.x_col, r_col, v.x_col[pred[has]]]),
             np.concatenate([np.ones(nx), -np.ones(nx), -np.ones(len(has))]),
             np.concatenate([ids, ids, has]), np.full(nx, -math.inf), np.zeros(nx))
    ny = len(v.jk)
    rows.add(np.concatenate([r_col, v.y_col]), np.concatenate([np.ones(nx), -np.ones(ny)]),
             np.concatenate([v.x_y, np.arange(ny)]), np.full(ny, -math.inf), np.zeros(ny))
    return r_col, pred


def _warm_start(model: Model, vl: VirtualLinks, problem: CopyProblem, reach: _Reach, v: _Vars, horizon: int,
                start: list[tuple[int, int, int]], runs: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Give the solver ``start`` (sends (chunk, link, epoch)) as x, y, the h it implies, done and (port
    model) the run starts; nothing when a send lies outside the pruned model."""
    nc, n = reach.src_set.shape
    values = np.zeros(model.num_vars)
    arrive = np.full((nc, n), horizon + 1, dtype=np.int64)
    arrive[reach.src_set] = 0
    lookup = {tuple(key): i for i, key in enumerate(v.x_keys.tolist())}
    if any((c, j, k) not in lookup for c, j, k in start):
        return
    for c, j, k in start:
        values[v.x_col[lookup[(c, j, k)]]] = 1.0
        values[v.y_col[np.searchsorted(v.jk, j * (horizon + 1) + k)]] = 1.0
        r = int(vl.dst[j])
        arrive[c, r] = min(arrive[c, r], k + 1)
    live = v.h_idx >= 0
    held = np.arange(horizon + 1)[None, None, :] >= arrive[:, :, None]
    values[v.h_idx[live & held]] = 1.0
    finish = _finish_epoch(problem, arrive)
    values[v.done[finish:]] = 1.0
    if runs is not None:
        r_col, pred = runs
        x = values[v.x_col]
        values[r_col] = np.maximum(0.0, x - np.where(pred >= 0, x[np.maximum(pred, 0)], 0.0))
    model.set_start(np.arange(model.num_vars), values)


# ---- decoding --------------------------------------------------------------------------------------
def clean_sends(vl: VirtualLinks, problem: CopyProblem,
                sends: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Keep first arrivals from ranks that hold the chunk, then drop sends that feed no destination."""
    n = problem.num_ranks
    arrive = np.full((problem.num_chunks, n), np.iinfo(np.int64).max, dtype=np.int64)
    for c, s in enumerate(problem.sources):
        arrive[c, list(s)] = 0
    kept = []
    for c, j, k in sorted(sends, key=lambda s: (s[2], s[0], s[1])):
        u, v = int(vl.src[j]), int(vl.dst[j])
        if arrive[c, u] > k:
            raise SynthError(f"milp decode: chunk {c} sent from rank {u} in epoch {k} before it arrived")
        if arrive[c, v] <= k + 1:
            continue
        arrive[c, v] = k + 1
        kept.append((c, j, k))
    for c, dests in enumerate(problem.dests):
        if dests and (arrive[c, list(dests)] == np.iinfo(np.int64).max).any():
            raise SynthError(f"milp decode: chunk {c} misses a destination")
    dest = [set(d) for d in problem.dests]
    needed: set[tuple[int, int]] = set()     # (chunk, rank) whose copy feeds a destination
    out = []
    for c, j, k in reversed(kept):
        v = int(vl.dst[j])
        if v in dest[c] or (c, v) in needed:
            needed.add((c, int(vl.src[j])))
            out.append((c, j, k))
    return out[::-1]


def sends_to_plan(vl: VirtualLinks, ep: Epochs, chunk_bytes: float,
                  sends: list[tuple[int, int, int]]) -> tuple[Plan, np.ndarray]:
    """Epoch sends -> timed plan: every (link, epoch) batch is one transfer starting at kτ."""
    if not sends:
        empty = np.zeros(0, dtype=np.int64)
        return Plan(np.zeros(0), np.zeros(0), empty, empty), empty
    arr = np.asarray(sends, dtype=np.int64)
    key = arr[:, 1] * (1 << 32) + arr[:, 2]
    ukey, group, count = np.unique(key, return_inverse=True, return_counts=True)
    j, k = arr[:, 1], arr[:, 2]
    starts = k * ep.tau
    ends = starts + vl.alpha[j] + count[group] * chunk_bytes / (vl.bw[j] * 1e3)
    return Plan(starts.astype(float), ends, arr[:, 0], j), group


def compact(vl: VirtualLinks, problem: CopyProblem, plan: Plan, groups: np.ndarray,
            chunk_bytes: float) -> tuple[Plan, np.ndarray]:
    """Continuous-time schedule of an epoch plan, never later than the epoch grid: batches keep
    their epoch order, and each starts once its chunks are at the sender and its physical links are
    free. A batch is sent as runs of consecutive chunk ids (one MSCCL step with cnt > 1 each, one α
    each), serialized on the link; returns the plan and a group id per run."""
    if not len(plan.starts):
        return plan, groups
    n = problem.num_ranks
    ids = np.asarray(problem.chunk_ids)
    avail = np.full((problem.num_chunks, n), np.inf)
    for c, s in enumerate(problem.sources):
        avail[c, list(s)] = 0.0
    busy = np.zeros(vl.num_phys + 1)
    starts = np.zeros(len(plan.starts))
    ends = np.zeros(len(plan.starts))
    run_of = np.zeros(len(plan.starts), dtype=np.int64)
    members: dict[int, list[int]] = {}
    for i in np.lexsort((groups, plan.starts)):
        members.setdefault(int(groups[i]), []).append(int(i))
    runs = 0
    for idx in members.values():
        j = int(plan.links[idx[0]])
        u, v = int(vl.src[j]), int(vl.dst[j])
        hops = vl.phys[j][vl.phys[j] >= 0]
        t = max(max(float(avail[plan.chunks[i], u]) for i in idx), float(busy[hops].max()))
        idx.sort(key=lambda i: ids[plan.chunks[i]])
        pieces: list[list[int]] = []
        for i in idx:
            if pieces and ids[plan.chunks[i]] == ids[plan.chunks[pieces[-1][-1]]] + 1:
                pieces[-1].append(i)
            else:
                pieces.append([i])
        for piece in pieces:
            end = t + float(vl.alpha[j]) + len(piece) * chunk_bytes / (float(vl.bw[j]) * 1e3)
            for i in piece:
                starts[i], ends[i], run_of[i] = t, end, runs
                avail[plan.chunks[i], v] = min(avail[plan.chunks[i], v], end)
            runs += 1
            t = end
        busy[hops] = t
    return Plan(starts, ends, plan.chunks, plan.links), run_of


# ---- one phase -------------------------------------------------------------------------------------
@dataclass
class PhaseResult:
    plan: Plan
    groups: np.ndarray
    status: str             # in the epoch model: optimal (proved there) | feasible
    objective_us: float
    bound_us: float | None
    gap: float | None
    notes: dict


def port_model_on(options: SynthOptions, switched: bool, ep: Epochs) -> bool:
    """Whether the port model (:func:`_one_run`, :func:`port_replay`, :func:`butterfly`) is used:
    ``options.extra['milp_ports']`` = ``on`` / ``off``, or ``auto`` (default): on a fabric with
    switches when latency-bound (the epoch batches several chunks, m0 > 1), where one α per port
    transfer decides the time; elsewhere the model is as before."""
    mode = str(options.extra.get("milp_ports", "auto"))
    if mode not in ("auto", "on", "off"):
        raise SynthError(f"milp_ports must be auto, on or off, got {mode!r}")
    return mode == "on" or (mode == "auto" and switched and ep.m0 > 1)


def solve_phase(vl: VirtualLinks, problem: CopyProblem, chunk_bytes: float, options: SynthOptions,
                time_limit: float | None, work_limit: float | None = None, switched: bool = False) -> PhaseResult:
    from synth.solvers import solve

    t0 = time.perf_counter()
    dist = hop_distances(vl, problem.num_ranks)
    dd = dest_distance(problem, dist)
    greedy = best_greedy(vl, problem, chunk_bytes, options.seed, int(options.extra.get("greedy_tries", 4)), dist)
    ep = choose_epochs(vl, chunk_bytes, problem.num_chunks, options.extra.get("tau_us"),
                       max_batch=problem.num_ranks)
    ports = port_model_on(options, switched, ep)
    warm = clean_sends(vl, problem, replay(vl, problem, greedy, ep, dd))
    batched = clean_sends(vl, problem, epoch_greedy(vl, problem, ep, dd, options.seed))
    if ports:   # every warm start obeys one run per batch; recursive doubling joins them
        warm = clean_sends(vl, problem, port_replay(vl, problem, warm))
        batched = clean_sends(vl, problem, port_replay(vl, problem, batched))
    if _epochs_of(vl, problem, batched) < _epochs_of(vl, problem, warm):
        warm = batched
    doubling = butterfly(vl, problem, ep) if ports else None
    if doubling is not None and _epochs_of(vl, problem, doubling) < _epochs_of(vl, problem, warm):
        warm = clean_sends(vl, problem, doubling)
    warm_sends = warm
    horizon = max(1, _epochs_of(vl, problem, warm_sends))
    lb = min(lower_bound_epochs(vl, problem, ep, dist), horizon)
    notes = {"tau_us": ep.tau, "epoch_batch": ep.m0, "horizon_epochs": horizon, "lb_epochs": lb,
             "greedy_time_us": greedy.makespan, "warm_start_us": horizon * ep.tau,
             "switch_model": "rank-to-rank virtual links over switch routes (path α sum, min bw); "
                             "every physical hop carries one transfer per epoch"
                             + ("; port model: one run of consecutive chunks per transfer" if ports else "")}
    if lb >= horizon and options.extra.get("milp_shortcut", True):
        # the greedy schedule meets the lower bound: optimal without a solver call
        plan, groups = sends_to_plan(vl, ep, chunk_bytes, warm_sends)
        plan, groups = _prefer_faster(vl, problem, plan, groups, greedy, chunk_bytes, notes)
        # optimal in the EPOCH model only; the method's status is decided against the cost-model bound
        notes.update(model_vars=0, model_rows=0, solve_s=0.0, proved_by="lower bound = warm start")
        return PhaseResult(plan, groups, "optimal", horizon * ep.tau, lb * ep.tau, 0.0, notes)
    use_start = bool(options.extra.get("milp_warm_start", True))
    routes = options.extra.get("milp_routes", "shortest")
    shortest = routes == "shortest" or (routes == "auto" and _count_sends(vl, problem, horizon, dist, dd)
                                        > ROUTE_PRUNE_ABOVE)
    notes["routes"] = ("single-destination chunks on shortest paths only" if shortest else "all routes")
    built = build_model(vl, problem, ep, horizon, lb, dist, dd, start=warm if use_start else None,
                        shortest=shortest, ports=ports, integral_runs=options.solver == "cp-sat")
    notes["warm_start"] = bool(built.model.start)
    notes.update(model_vars=built.model.num_vars, model_rows=built.model.num_rows,
                 build_s=time.perf_counter() - t0)
    result = solve(built.model, options.solver, time_limit=time_limit, gap=options.gap, threads=options.threads,
                   work_limit=work_limit)
    notes["solve_s"] = result.wall_s
    bound_epochs = lb
    if result.bound is not None and math.isfinite(result.bound):
        bound_epochs = max(lb, math.ceil(result.bound - 1e-6))
    sends = warm_sends
    status = "feasible"
    if result.has_solution:
        chosen = built.x_keys[result.values[built.x_col] > 0.5]
        try:
            decoded = clean_sends(vl, problem, [tuple(map(int, s)) for s in chosen])
            if _epochs_of(vl, problem, decoded) <= horizon:
                sends = decoded
                status = result.status
        except SynthError as exc:
            notes["fallback"] = f"solver solution rejected ({exc}); warm start kept"
    else:
        notes["fallback"] = f"solver returned {result.status} ({result.message}); greedy warm start kept"
    epochs = _epochs_of(vl, problem, sends)
    if status == "optimal":
        bound_epochs = epochs
    plan, groups = sends_to_plan(vl, ep, chunk_bytes, sends)
    plan, groups = _prefer_faster(vl, problem, plan, groups, greedy, chunk_bytes, notes)
    gap = max(0.0, (epochs - bound_epochs) / epochs) if epochs else 0.0
    if gap <= 1e-9 and status == "feasible":
        status = "optimal"
    return PhaseResult(plan, groups, status, epochs * ep.tau, bound_epochs * ep.tau, gap, notes)


def _prefer_faster(vl: VirtualLinks, problem: CopyProblem, plan: Plan, groups: np.ndarray, greedy: Plan,
                   chunk_bytes: float, notes: dict) -> tuple[Plan, np.ndarray]:
    """Compact the epoch schedule in continuous time; keep the greedy plan if that is still faster
    (the epoch grid rounds every transfer up to τ, which can lose on heterogeneous links)."""
    plan, groups = compact(vl, problem, plan, groups, chunk_bytes)
    notes["epoch_schedule_us"] = plan.makespan
    if greedy.makespan < plan.makespan - 1e-9:
        notes["kept"] = "greedy schedule (faster in continuous time than the epoch-model optimum)"
        return greedy, np.arange(len(greedy.starts))
    return plan, groups


def _count_sends(vl: VirtualLinks, problem: CopyProblem, horizon: int, dist: np.ndarray, dd: np.ndarray) -> int:
    """How many x[c, j, k] variables the model has with all routes (the sizing rule's input)."""
    nc, n = problem.num_chunks, problem.num_ranks
    src_set = np.zeros((nc, n), dtype=bool)
    for c, s in enumerate(problem.sources):
        src_set[c, list(s)] = True
    earliest = np.stack([dist[list(s)].min(axis=0) for s in problem.sources])
    earliest[src_set] = 0
    lo = earliest[:, vl.src]
    hi = horizon - 1 - dd[:, vl.dst]
    span = np.where(~src_set[:, vl.dst], np.maximum(0, hi - lo + 1), 0)
    return int(span.sum())


def _epochs_of(vl: VirtualLinks, problem: CopyProblem, sends: list[tuple[int, int, int]]) -> int:
    return 1 + max((k for _c, _j, k in sends), default=-1)


# ---- options and status ----------------------------------------------------------------------------
def check_solver(solver: str) -> None:
    """Refuse, before any work, a solver :func:`synth.solvers.solve` does not know or one that solves
    LPs only (the time-expanded model is a MILP). Checked up front because the lower-bound shortcut
    may skip the solver call entirely."""
    from synth.solvers import LP_ONLY, SOLVERS

    if solver not in SOLVERS:
        raise SynthError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if solver in LP_ONLY:
        mip = ", ".join(s for s in SOLVERS if s not in LP_ONLY)
        raise SynthError(f"solver {solver} solves LPs only and cannot solve the milp method's integer model; "
                         f"choose one of {mip}")



# ---- the method ------------------------------------------------------------------------------------
def synthesize(inst: Instance) -> Schedule:
    """Time-expanded MILP schedule (see the module docstring); notes carry the solver's status,
    objective, bound and gap (in µs of the epoch model)."""
    topology, collective, size_bytes, options = inst.topology, inst.collective, inst.size_bytes, inst.options
    t0 = time.perf_counter()
    check_solver(options.solver)
    coll = effective_collective(collective, options)
    check_supported(coll)
    chunk_bytes = coll.chunk_bytes(size_bytes)
    if options.time_limit is None:
        options = replace(options, time_limit=DEFAULT_TIME_LIMIT_S)
    if options.work_limit is None:
        options = replace(options, work_limit=DEFAULT_WORK_S)
    phases: list[tuple[str, PhaseResult]] = []
    transfers: list[Transfer] = []
    if coll.num_ranks > 1:
        if coll.name == "allreduce":
            problem = allreduce_owners(coll)
            limit = None if options.time_limit is None else options.time_limit / 2
            work = options.work_limit / 2
            rvl = virtual_links(topology.reversed())
            switched = bool(topology.switches)
            rs = solve_phase(rvl, problem, chunk_bytes, options, limit, work, switched)
            transfers += plan_transfers(rvl, problem, rs.plan, reverse=True, groups=rs.groups)
            vl = virtual_links(topology)
            ag = solve_phase(vl, problem, chunk_bytes, options, limit, work, switched)
            transfers += plan_transfers(vl, problem, ag.plan, reverse=False, offset=rs.plan.makespan,
                                        groups=ag.groups, group_base=len(rs.groups) and int(rs.groups.max()) + 1)
            phases = [("reducescatter", rs), ("allgather", ag)]
        else:
            problem, reverse = copy_problem(coll)
            vl = virtual_links(topology.reversed() if reverse else topology)
            # out of place, a reduction keeps partial sums in several buffers (lowering, docs/programs.md),
            # so chunk-id runs are not the program's steps: no port model there (dgx-a100 1 KB
            # reducescatter: 11.2 µs with it, 9.8 without)
            res = solve_phase(vl, problem, chunk_bytes, options, options.time_limit, options.work_limit,
                              bool(topology.switches) and (coll.inplace or not reverse))
            transfers += plan_transfers(vl, problem, res.plan, reverse=reverse, groups=res.groups)
            phases = [(coll.name, res)]
    transfers.sort(key=lambda t: (t.start, t.end, t.chunk, t.src, t.dst))
    makespan = max((t.end for t in transfers), default=0.0)
    combined = _combining(inst, options) if coll.name == "allreduce" and coll.num_ranks > 1 else None
    statuses = [p.status for _, p in phases]
    model_optimal = all(s == "optimal" for s in statuses)
    objective = sum(p.objective_us for _, p in phases)
    bounds = [p.bound_us for _, p in phases]
    bound = sum(bounds) if bounds and all(b is not None for b in bounds) else None
    gap = None if phases else 0.0
    if bound is not None and objective > 0:
        gap = max(0.0, (objective - bound) / objective)
    taus = ", ".join(f"{p.notes['tau_us']:.6g}" for _, p in phases)
    notes = {"time_limit_s": options.time_limit,
             "work_limit": options.work_limit,
             "model_status": (f"{'optimal' if model_optimal else 'feasible'} in the time-expanded model "
                              f"(C={coll.chunk_factor}, tau={taus} us"
                              + (", each phase separately" if len(phases) > 1 else "") + ")"),
             "solver_objective_us": objective,
             "solver_bound_us": bound, "solver_gap": gap, "synthesis_s": time.perf_counter() - t0,
             "phases": {name: {"model_status": p.status, **p.notes} for name, p in phases}}
    if coll.name == "allreduce":
        notes["decomposition"] = "reducescatter then allgather, each solved exactly"
    if any("fallback" in p.notes for _, p in phases):
        notes["fallback"] = "; ".join(p.notes["fallback"] for _, p in phases if "fallback" in p.notes)
    composed = Schedule(coll, topology.name, tuple(transfers), method="milp", size_bytes=float(size_bytes),
                        predicted_time_us=makespan, notes=notes)
    if combined is None:
        return composed
    composed = replace(composed, solver=options.solver)     # the combining one is CP-SAT's
    # both are candidates: the pipeline times each and keeps the faster (synth.pipeline, alternatives)
    first, second = sorted((combined, composed), key=lambda sc: sc.predicted_time_us)
    return replace(first, alternatives=(second,))


def _combining(inst: Instance, options: SynthOptions) -> Schedule | None:
    """Allreduce's direct combining candidate (:mod:`synth.synthesis.combining`), or None where it does not apply
    (``options.extra['milp_combining']`` false, an instance too large for it, or no solution in its budget). It gets
    a quarter of the work limit (the composed phases keep their halves) and keeps ``--chunks`` as its C (buffer
    chunks), else tries :data:`synth.synthesis.combining.DEFAULT_CHUNK_COUNTS`."""
    from synth.synthesis import combining

    if not options.extra.get("milp_combining", True):
        return None
    work = None if options.work_limit is None else options.work_limit / 4
    sched = combining.best_schedule(inst.topology, inst.collective, inst.size_bytes, chunks=options.chunks,
                                    work_limit=work, threads=options.threads, seed=options.seed, method="milp",
                                    time_limit=options.time_limit)
    if sched is None:
        return None
    sched.notes["decomposition"] = "none: direct combining (partial sums exchanged and combined)"
    return sched


METHOD = MethodSpec(
    name="milp",
    run=synthesize,
    collectives=frozenset(COLLECTIVES),
    description="exact time-expanded MILP (TE-CCL): epochs, store-and-forward, greedy warm start, solver gap",
    kind="exact",
)

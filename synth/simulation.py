"""Contention-aware discrete-event simulation of a Program under the α-β cost model of docs/cost-model.md.

Cost model (docs/cost-model.md):

- a transfer of ``b`` bytes over one link costs ``alpha + b / bw`` (bw in GB/s = 1e3 bytes/µs);
  a step with ``cnt`` > 1 moves ``cnt`` contiguous chunks as one transfer and pays one α;
- a link direction carries one transfer at a time. Transfers are placed one by one in the order
  they became ready (ties: the order they became ready in the simulation, which is deterministic);
  a transfer ready at t is booked at the earliest s >= t at which every link of its route is free
  over all of [s, s + duration) given the bookings already made (gap-aware, "backfilling": a
  later-ready short transfer may use an idle gap before a booking that an earlier transfer made
  further in the future, e.g. one that waits for the busy second hop of its route). A booking is
  never moved once made, so the earlier-ready transfer keeps its place;
- FIFO per connection (src rank, dst rank, chan): a message never starts before the message booked
  before it on the same connection started. Both use the same route and so cannot overlap, so
  messages on a connection go out one after another in the order they became ready (with one
  threadblock per connection, as MSCCL requires, this already follows from step order);
- a send between ranks that share no link takes the switch-only path of
  :mod:`synth.topology.routes` (fewest hops, then the widest, then smallest summed α; equal-cost paths spread by
  destination, as fat-tree routing does). When no such path exists (a foreign program on a sparse
  topology) the shortest path may cross other ranks, which only forward (ties spread the same way).
  A routed transfer pays every hop's α plus ``b`` / (the smallest bw on the route), and holds every
  link of the route for its whole duration (circuit-style, docs/cost-model.md), so it starts when all of
  them are free;
- local steps (``cpy``, ``re``, ``nop``) take no time: the model prices communication only;
- in-network steps (a program's ``switches``, docs/programs.md "Switch steps"): a rank's message to a
  switch uses the rank->switch link (α + bytes/bw, booked as any transfer). A ``reduce`` then uses the
  switch's reduction engine for ``reduce_alpha + bytes / reduce_bw`` (:class:`~synth.topology.model.SwitchFeatures`;
  the engine is a resource that serves one op at a time, booked like a link); then it sends one message to
  each dst over the switch->dst link (each booked as any transfer, FIFO per connection (switch, dst, chan)).
  A ``multicast`` is the same without the engine. The switch works cut-through, as a routed transfer
  does (it holds its whole route at once): a stage inside the switch (engine, sends to the dsts) may
  start once the first bytes of every message it takes have arrived (the message's start + its α), and
  it never ends before the last bytes have arrived plus its own α (its start is held back until
  ``last arrival - bytes / its bw``). NVSwitch NVLS and SHARP reduce packets in flight in the same way.

Step semantics (see :mod:`synth.program.ir`): each threadblock runs its steps in order; a step is
ready when the previous step of its threadblock and its dependency (``depid``/``deps``) have
finished. A send's transfer starts once the step is ready and its links are free; the send step
finishes when the data has arrived (so the threadblock's next step waits for it). A receive
completes at max(its ready time, arrival of the matching message); the k-th send on a connection
(src rank, dst rank, chan) is matched with the k-th receive on it (FIFO; when several
threadblocks share a connection, which MSCCL forbids, steps are numbered threadblock by
threadblock). For ``rcs``/``rrs``/``rrcs`` the forward send becomes ready when the receive has
completed and the step finishes when the forwarded data has arrived. There is no rendezvous: a
sender does not wait for its receiver.

Implementation: steps are flattened into integer lists. Finishing a step eagerly releases the
steps that wait on it (a counter per step); only transfers go through the event heap, keyed by the
time they became ready. Heap pops are therefore in non-decreasing ready time, which is the
placement order above, and each transfer costs one push and one pop. Each link keeps its bookings
as a flat sorted list [s0, e0, s1, e1, ...] with back-to-back bookings merged (see :func:`_fit`);
a transfer whose route is idle from its ready time on (the common case) just starts, otherwise a
bisection per link finds the first gap that fits on every link. Since nothing is booked before
the current time, bookings that end by then are dropped once a list grows past a few entries, so
memory is bounded by the bookings still in the future.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

import numpy as np

from synth.errors import SynthError
from synth.gcpause import gc_paused
from synth.program.columns import StepColumns, kind_flags, peerless_steps, program_columns
from synth.program.ir import Program, Threadblock, collective_of
from synth.topology.model import Topology
from synth.topology.routes import RuntimePaths
from synth.units import DEFAULT_SIZE, algbw_GBps

# One recorded transfer: (rank, threadblock id, step index, start µs, end µs, route as "a->b" names).
Event = tuple[int, int, int, float, float, tuple[str, ...]]


@dataclass(frozen=True)
class SimResult:
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    transfers: int
    link_utilization: dict[str, float]
    events: list[Event] = field(default_factory=list, compare=False, repr=False)
    size_bytes: float = 0.0
    chunk_bytes: float = 0.0

    def to_dict(self) -> dict:
        """The ``synth simulate --json`` keys of docs/cli.md (events are left out: they can be huge)."""
        return {
            "time_us": self.time_us,
            "algbw_GBps": self.algbw_GBps,
            "busbw_GBps": self.busbw_GBps,
            "transfers": self.transfers,
            "link_utilization": dict(self.link_utilization),
            "size_bytes": self.size_bytes,
            "chunk_bytes": self.chunk_bytes,
        }


@dataclass(frozen=True)
class LinkAccount:
    """Where one link's time went in a simulated run (µs): ``busy`` holding transfers (a transfer holds every
    link of its route for its route's ``Σα`` plus its bytes' time, docs/cost-model.md), of which ``alpha`` is the
    route α of its ``messages``; idle ``head`` before the first, ``gaps`` between and ``tail`` after the last (to
    the makespan). ``head + busy + gaps + tail`` is the makespan."""

    link: str
    messages: int
    busy: float
    alpha: float
    head: float
    gaps: float
    tail: float

    def to_dict(self) -> dict:
        """The ``synth simulate --links --json`` keys of docs/cli.md."""
        return {"link": self.link, "messages": self.messages, "busy_us": self.busy, "alpha_us": self.alpha,
                "head_us": self.head, "gaps_us": self.gaps, "tail_us": self.tail}


def link_accounts(result: SimResult, topology: Topology) -> list[LinkAccount]:
    """:class:`LinkAccount` of every link ``result``'s events use, the link that ends last first (ties by name).

    For a link on a binding cut the bound asks ``busy − alpha`` to equal the bound and the idle times to be
    zero: what is left is α (fewer, larger messages), fill and drain (``head``, ``tail``) or stalls
    (``gaps``). Needs the events (:func:`simulate` with ``record_events``); in-network reduction engines are
    not links and are left out."""
    alpha = {f"{topology.node_name(link.src)}->{topology.node_name(link.dst)}": link.alpha
             for link in topology.links}
    spans: dict[str, list[tuple[float, float]]] = {}
    held_alpha: dict[str, float] = {}
    for *_, start, end, route in result.events:
        held = sum(alpha.get(hop, 0.0) for hop in route)
        for hop in route:
            if hop in alpha:
                spans.setdefault(hop, []).append((start, end))
                held_alpha[hop] = held_alpha.get(hop, 0.0) + held
    accounts = []
    for link, intervals in spans.items():
        intervals.sort()
        gaps, reach = 0.0, intervals[0][1]
        for start, end in intervals[1:]:
            gaps += max(0.0, start - reach)
            reach = max(reach, end)
        accounts.append(LinkAccount(link, len(intervals), sum(end - start for start, end in intervals),
                                    held_alpha[link], intervals[0][0], gaps, result.time_us - reach))
    return sorted(accounts, key=lambda account: (account.tail, account.link))


# ---- sizes -----------------------------------------------------------------------------------------
def resolve_sizes(
    program: Program, size_bytes: float | None, chunk_bytes: float | None
) -> tuple[float, float]:
    """(SIZE, chunk bytes) under the SIZE conventions of docs/units.md: chunk = SIZE / collective.size_chunks.

    An explicit ``chunk_bytes`` wins for the chunk; with neither argument, a synth program's own
    ``chunk_bytes``/``size_bytes`` metadata is used, else the default of 1 GiB (docs/units.md).
    """
    size_chunks = collective_of(program).size_chunks
    for name, value in (("size", size_bytes), ("chunk size", chunk_bytes)):
        if value is not None and not value > 0:
            raise SynthError(f"{name} must be positive, got {value}")
    if chunk_bytes is not None:
        size = float(size_bytes) if size_bytes is not None else chunk_bytes * size_chunks
        return size, float(chunk_bytes)
    if size_bytes is not None:
        return float(size_bytes), size_bytes / size_chunks
    if program.chunk_bytes:
        chunk = float(program.chunk_bytes)
        return (float(program.size_bytes) if program.size_bytes else chunk * size_chunks), chunk
    size = float(program.size_bytes) if program.size_bytes else float(DEFAULT_SIZE)
    return size, size / size_chunks


# ---- routing ---------------------------------------------------------------------------------------
# A route: (link ids in order, summed α in µs, bottleneck bw in bytes/µs).
Route = tuple[tuple[int, ...], float, float]


class Router:
    """Shortest routes between ranks as tuples of link ids (see module docstring for the order).

    Per source rank, computed lazily and cached: the equal-cost switch-only paths of
    :mod:`synth.topology.routes`, and only where a destination has none, those across ranks.
    A route record is (link ids, summed α, bottleneck bw); a direct link always wins (one hop).
    """

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.link_ids = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
        self.alpha = [link.alpha for link in topology.links]
        self.bw = [link.bw * 1e3 for link in topology.links]  # bytes per µs
        self.paths = RuntimePaths(topology)

    def route(self, src: int, dst: int) -> Route:
        """(link ids, summed α in µs, bottleneck bw in bytes/µs) from rank ``src`` to rank ``dst``."""
        path = self.paths.path(src, dst)
        if path is None:
            raise SynthError(f"topology {self.topology.name!r} has no path from rank {src} to rank {dst}")
        links = tuple(self.link_ids[pair] for pair in zip(path, path[1:]))
        return links, sum(self.alpha[i] for i in links), min(self.bw[i] for i in links)

    def link_name(self, lid: int) -> str:
        link = self.topology.links[lid]
        return f"{self.topology.node_name(link.src)}->{self.topology.node_name(link.dst)}"


# ---- link reservations -----------------------------------------------------------------------------
_PRUNE_AT = 16  # flat-list length past which a link's finished bookings are dropped (see _book)

def _fit(bounds: list[float], s: float, dur: float) -> tuple[float, int]:
    """Earliest start ``>= s`` of a free span of length ``dur`` on one link, and the index at which
    the booking [start, start + dur) goes into ``bounds``.

    ``bounds`` is the link's bookings flattened as [s0, e0, s1, e1, ...]: the intervals are disjoint
    and sorted, so the flat list is non-decreasing and one bisection finds whether ``s`` falls
    inside a booking (odd insertion point) or inside a gap (even).
    """
    p = bisect_right(bounds, s)
    if p & 1:  # s is inside booking p // 2: the earliest candidate is its end
        s = bounds[p]
        p += 1
    n = len(bounds)
    while p < n and s + dur > bounds[p]:  # does not fit before the next booking: try after it
        s = bounds[p + 1]
        p += 2
    return s, p


def _insert(bounds: list[float], p: int, start: float, end: float) -> None:
    """Put booking [start, end) at index ``p`` of ``bounds`` (as found by :func:`_fit`), merged with
    a booking that ends exactly at ``start`` or starts exactly at ``end``: back-to-back bookings
    become one interval, so a saturated link is a single entry and the gap walk skips it at once."""
    joins_prev = p > 0 and bounds[p - 1] == start
    joins_next = p < len(bounds) and bounds[p] == end
    if joins_prev:
        if joins_next:
            del bounds[p - 1:p + 1]
        else:
            bounds[p - 1] = end
    elif joins_next:
        bounds[p] = start
    else:
        bounds[p:p] = (start, end)


def _book(booked: list[list[float]], link_free: list[float], links: tuple[int, ...], now: float,
          not_before: float, dur: float) -> tuple[float, float]:
    """Book [start, start + dur) on every link of ``links`` at the earliest ``start >= max(now,
    not_before)`` at which all of them are free (gap-aware: a booking may go before later ones).

    ``now`` is the current simulation time: no later booking can start before it, so bookings that
    end by ``now`` can be dropped; that is done once a list has grown past a few entries, which
    bounds each list by the bookings still in the future plus a constant.
    """
    start = now if now >= not_before else not_before
    lists = [booked[lid] for lid in links]
    for bounds in lists:
        if len(bounds) > _PRUNE_AT:
            q = bisect_right(bounds, now) & ~1
            if q:
                del bounds[:q]
    if len(lists) == 1:
        bounds = lists[0]
        start, p = _fit(bounds, start, dur)
        end = start + dur
        _insert(bounds, p, start, end)
        if end > link_free[links[0]]:
            link_free[links[0]] = end
        return start, end
    # Visit the links round-robin, raising start to each one's earliest fit, until every link in a
    # row has accepted the same start (the fit on one link is _fit, inlined: this is the hot path).
    k = len(lists)
    places = [0] * k
    i = accepted = 0
    while accepted < k:
        bounds = lists[i]
        p = bisect_right(bounds, start)
        n = len(bounds)
        if p & 1:  # start is inside a booking: try its end
            s = bounds[p]
            p += 1
        elif p < n and start + dur > bounds[p]:  # inside a gap too short: try the next booking's end
            s = bounds[p + 1]
            p += 2
        else:  # free over [start, start + dur)
            accepted += 1
            places[i] = p
            i = i + 1 if i + 1 < k else 0
            continue
        while p < n and s + dur > bounds[p]:
            s = bounds[p + 1]
            p += 2
        start = s
        accepted = 1
        places[i] = p
        i = i + 1 if i + 1 < k else 0
    end = start + dur
    for i in range(k):  # _insert, inlined
        bounds, p = lists[i], places[i]
        if p and bounds[p - 1] == start:
            if p < len(bounds) and bounds[p] == end:
                del bounds[p - 1:p + 1]
            else:
                bounds[p - 1] = end
        elif p < len(bounds) and bounds[p] == end:
            bounds[p] = start
        else:
            bounds[p:p] = (start, end)
        lid = links[i]
        if end > link_free[lid]:
            link_free[lid] = end
    return start, end


# ---- simulation ------------------------------------------------------------------------------------
def simulate(
    program: Program,
    topology: Topology,
    size_bytes: float | None = None,
    chunk_bytes: float | None = None,
    *,
    record_events: bool = True,
) -> SimResult:
    """Simulate ``program`` on ``topology``; see the module docstring for the model.

    Raises :class:`SynthError` when the program does not fit the topology, when a connection's
    sends and receives do not pair up, or when the program deadlocks.
    """
    # The run allocates millions of small containers while the program's own objects stay alive;
    # cyclic GC passes over all of them would dominate the run time (nothing here forms cycles).
    with gc_paused():
        return _simulate(program, topology, size_bytes, chunk_bytes, record_events)


def _simulate(program: Program, topology: Topology, size_bytes: float | None, chunk_bytes: float | None,
              record_events: bool) -> SimResult:
    """The steps of :func:`simulate`: check, flatten, link dependencies and messages, run, summarize."""
    if program.num_ranks != topology.num_ranks:
        raise SynthError(f"program {program.name!r} has {program.num_ranks} ranks but topology "
                         f"{topology.name!r} has {topology.num_ranks}")
    coll = collective_of(program)
    size, chunk = resolve_sizes(program, size_bytes, chunk_bytes)
    router = Router(topology)
    flat = _flatten(program, router)
    graph = _link_steps(program, flat)
    run = _run_events(graph, len(topology.links) + len(flat.engines), chunk, record_events)
    _check_finished(program, flat, run.fin)
    makespan = max(run.fin, default=0.0)
    algbw = algbw_GBps(size, makespan)
    utilization, events = _link_report(router, flat, run, makespan)
    return SimResult(
        time_us=makespan,
        algbw_GBps=algbw,
        busbw_GBps=algbw * coll.busbw_factor,
        transfers=sum(len(v) for key, v in flat.sends_on.items() if key not in flat.engine_conns),
        link_utilization=utilization,
        events=events,
        size_bytes=size,
        chunk_bytes=chunk,
    )


@dataclass
class _Flat:
    """The program's steps as flat lists (built by :func:`_flatten`); step g is the g-th in program order, the
    rank steps first (threadblock k's are ``start[k]:start[k + 1]``), then the switches' steps."""

    nxt: list[int] = field(default_factory=list)  # next step of the threadblock, -1 after its last
    need: list[int] = field(default_factory=list)  # prerequisites: previous step, message, dependency
    send_route: list[int] = field(default_factory=list)  # index into routes, -1 when the step does not send
    cnt: list[int] = field(default_factory=list)
    start: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    tb_rank: list[int] = field(default_factory=list)  # per threadblock: its rank and id
    tb_id: list[int] = field(default_factory=list)
    switch_owner: list[tuple[int, int, int]] = field(default_factory=list)  # per switch step: (node, -1 - k, op)
    routes: list[Route] = field(default_factory=list)
    route_index: dict[tuple[int, int], int] = field(default_factory=dict)  # (src, dst) -> index into routes
    sends_on: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)  # (src, dst, chan) -> steps
    recvs_on: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)
    revdep: list[list[int] | None] = field(default_factory=list)  # per step: the steps depending on it, or None
    engines: list[str] = field(default_factory=list)  # reduction engines, booked as links after the real ones
    engine_conns: set[tuple[int, int, int]] = field(default_factory=set)  # their pseudo connections (not counted)
    fanout: dict[int, list[int]] = field(default_factory=dict)  # switch op gate step -> its sends to the dsts
    cut_through: set[int] = field(default_factory=set)  # switch-internal receive steps (engine, gate)

    def owner(self, g: int) -> tuple[int, int, int]:
        """(rank, tb id, step index) of rank step ``g``; (switch node, -1 - k, op index) of a switch step."""
        rank_steps = int(self.start[-1])
        if g >= rank_steps:
            return self.switch_owner[g - rank_steps]
        k = int(np.searchsorted(self.start, g, side="right")) - 1
        return self.tb_rank[k], self.tb_id[k], g - int(self.start[k])


def _flatten(program: Program, router: Router) -> _Flat:
    """Number every step of ``program`` in program order and record what each one waits for and sends: the
    rank steps from the program's step columns (:func:`synth.program.columns.program_columns`), then the
    switch ops."""
    cols = program_columns(program)
    if cols is None:
        raise SynthError(f"program {program.name!r} has a step field that is not an integer or is out of range "
                         "(synth verify names it)")
    flat = _Flat(start=cols.start)
    sends, receives, _, _ = kind_flags(cols.kind)
    tb_of = cols.tb_of
    tbs = _threadblocks(program, flat)
    bad = np.flatnonzero(peerless_steps(cols, [tb for _, tb in tbs]))
    first_bad = int(bad[0]) if len(bad) else None
    start = cols.start.tolist()
    send_steps, recv_steps = np.flatnonzero(sends), np.flatnonzero(receives)
    send_at = np.searchsorted(send_steps, cols.start).tolist()
    recv_at = np.searchsorted(recv_steps, cols.start).tolist()
    send_steps, recv_steps = send_steps.tolist(), recv_steps.tolist()
    route_of_tb = np.full(len(tbs) + 1, -1, dtype=np.int64)     # the extra entry: steps that do not send
    tb_start: dict[tuple[int, int], int] = {}
    for k, (rank, tb) in enumerate(tbs):
        if first_bad is not None and first_bad < start[k]:   # a step of an earlier threadblock is wrong
            break
        if (rank, tb.id) in tb_start:
            raise SynthError(f"program {program.name!r}: rank {rank} has two threadblocks "
                             f"with id {tb.id}")
        tb_start[(rank, tb.id)] = k
        route_of_tb[k] = _send_route(program, router, flat, rank, tb)
        # connection step lists (one is created for a threadblock without the peer too: it matches nothing)
        flat.sends_on.setdefault((rank, _peer_node(program, router, tb.send), tb.chan), []).extend(
            send_steps[send_at[k]:send_at[k + 1]])
        flat.recvs_on.setdefault((_peer_node(program, router, tb.recv), rank, tb.chan), []).extend(
            recv_steps[recv_at[k]:recv_at[k + 1]])
    if first_bad is not None:
        rank, tb_id, i = flat.owner(first_bad)
        tb = tbs[int(tb_of[first_bad])][1]
        typ = tb.steps[i].type
        if sends[first_bad] and tb.send < 0:
            raise SynthError(f"program {program.name!r}: rank {rank} tb {tb_id} step {i} "
                             f"({typ}) sends but the threadblock has no send peer")
        raise SynthError(f"program {program.name!r}: rank {rank} tb {tb_id} step {i} "
                         f"({typ}) receives but the threadblock has no recv peer")
    n = len(cols.kind)
    nonempty = np.diff(cols.start) > 0
    nxt = np.arange(1, n + 1, dtype=np.int64)
    nxt[cols.start[1:][nonempty] - 1] = -1
    has_dep = cols.depid >= 0
    first_of_tb = np.zeros(n, dtype=bool)
    first_of_tb[cols.start[:-1][nonempty]] = True
    flat.nxt = nxt.tolist()
    flat.need = ((~first_of_tb).astype(np.int64) + receives + has_dep).tolist()
    flat.send_route = np.where(sends, route_of_tb[:-1][tb_of], -1).tolist()
    flat.cnt = cols.cnt.tolist()
    flat.revdep = _reverse_deps(program, flat, tb_start, cols, np.flatnonzero(has_dep), tb_of)
    if program.switches:
        _flatten_switches(program, router, flat)
    return flat


def _threadblocks(program: Program, flat: _Flat) -> list[tuple[int, Threadblock]]:
    """Every (rank, threadblock) in program order, recorded in ``flat``; a gpu id that is no rank is an error."""
    tbs = []
    for gpu in program.gpus:
        rank = gpu.id
        if not 0 <= rank < program.num_ranks:
            raise SynthError(f"program {program.name!r}: gpu id {rank} is not a rank")
        for tb in gpu.threadblocks:
            tbs.append((rank, tb))
            flat.tb_rank.append(rank)
            flat.tb_id.append(tb.id)
    return tbs


def _switch_node(program: Program, router: Router, k: int) -> int:
    """The fabric node of ``program.switches[k]`` (by name), or SynthError."""
    name = program.switches[k].name
    topology = router.topology
    if name not in topology.switches:
        raise SynthError(f"program {program.name!r}: switch {name!r} is not a switch of topology {topology.name!r}")
    return topology.node_id(name)


def _direct_route(program: Program, router: Router, flat: _Flat, src: int, dst: int) -> int:
    """Index in ``flat.routes`` of the one-link route between a rank and a switch (SynthError without a link)."""
    ridx = flat.route_index.get((src, dst), -1)
    if ridx < 0:
        lid = router.link_ids.get((src, dst))
        if lid is None:
            topo = router.topology
            raise SynthError(f"program {program.name!r}: topology {topo.name!r} has no link "
                             f"{topo.node_name(src)}->{topo.node_name(dst)} for an in-network step")
        ridx = flat.route_index[(src, dst)] = len(flat.routes)
        flat.routes.append(((lid,), router.alpha[lid], router.bw[lid]))
    return ridx


def _flatten_switches(program: Program, router: Router, flat: _Flat) -> None:
    """Append every switch op as steps (after all rank steps, so a program without switches is unchanged).

    Per op: a gate step that waits for its messages (one per src; it is the "receive" of each connection
    (src, switch node, chan) in op order), for a reduce with a cost first an engine step (a transfer on the
    switch's engine pseudo-link, its own pseudo connection), then one send step per dst (connection
    (switch node, dst, chan), in op order) released by the gate.
    """
    n = program.num_ranks
    num_links = len(router.topology.links)
    for k, sw in enumerate(program.switches):
        node = _switch_node(program, router, k)
        features = router.topology.switch_features(node)
        engine = -1
        if features.reduce and (features.reduce_alpha > 0 or features.reduce_bw != float("inf")):
            engine = len(flat.routes)
            flat.routes.append(((num_links + len(flat.engines),), float(features.reduce_alpha),
                                features.reduce_bw * 1e3))
            flat.engines.append(f"{sw.name}(reduce)")
        engine_key = (node, node, -1 - k)
        for j, op in enumerate(sw.ops):
            if op.type == "reduce" and not features.reduce or op.type == "multicast" and not features.multicast:
                raise SynthError(f"program {program.name!r}: switch {sw.name!r} op {j} is a {op.type} but the "
                                 f"topology does not declare {op.type} on it")
            for m in (*op.srcs, *op.dsts):
                if not 0 <= m < n:
                    raise SynthError(f"program {program.name!r}: switch {sw.name!r} op {j} names {m}, not a rank")
            first = len(flat.nxt)   # the step the srcs' messages go to
            flat.cut_through.add(first)
            if op.type == "reduce" and engine >= 0:   # engine step, then the gate it "sends" to
                flat.cut_through.add(first + 1)
                flat.engine_conns.add(engine_key)
                flat.sends_on.setdefault(engine_key, []).append(first)
                flat.recvs_on.setdefault(engine_key, []).append(first + 1)
                _append(flat, (node, -1 - k, j), len(op.srcs), engine, op.cnt)
                _append(flat, (node, -1 - k, j), 1, -1, op.cnt)
            else:
                _append(flat, (node, -1 - k, j), len(op.srcs), -1, op.cnt)
            gate = len(flat.nxt) - 1
            for src in op.srcs:
                flat.recvs_on.setdefault((src, node, op.chan), []).append(first)
            fan = flat.fanout[gate] = []
            for dst in op.dsts:
                fan.append(len(flat.nxt))
                flat.sends_on.setdefault((node, dst, op.chan), []).append(len(flat.nxt))
                _append(flat, (node, -1 - k, j), 1, _direct_route(program, router, flat, node, dst), op.cnt)


def _append(flat: _Flat, owner: tuple[int, int, int], need: int, route: int, cnt: int) -> None:
    """One switch step: it ends no threadblock (``nxt`` -1) and waits for ``need`` prerequisites."""
    flat.switch_owner.append(owner)
    flat.revdep.append(None)
    flat.nxt.append(-1)
    flat.need.append(need)
    flat.send_route.append(route)
    flat.cnt.append(cnt)


def _send_route(program: Program, router: Router, flat: _Flat, rank: int, tb: Threadblock) -> int:
    """Index in ``flat.routes`` of the route from ``rank`` to ``tb``'s send peer (-1 when it has none)."""
    if tb.send < 0:
        return -1
    if program.switch_peer(tb.send) is not None:
        return _direct_route(program, router, flat, rank, _switch_node(program, router, tb.send - program.num_ranks))
    if tb.send == rank or not 0 <= tb.send < program.num_ranks:
        raise SynthError(f"program {program.name!r}: rank {rank} tb {tb.id} sends to "
                         f"invalid peer {tb.send}")
    ridx = flat.route_index.get((rank, tb.send), -1)
    if ridx < 0:
        ridx = flat.route_index[(rank, tb.send)] = len(flat.routes)
        flat.routes.append(router.route(rank, tb.send))
    return ridx


def _peer_node(program: Program, router: Router, peer: int) -> int:
    """The fabric node a threadblock peer names: a rank itself, ``num_ranks + k`` the node of ``switches[k]``."""
    if peer < program.num_ranks or not program.switches:
        return peer
    k = peer - program.num_ranks
    return _switch_node(program, router, k) if k < len(program.switches) else peer


def _reverse_deps(program: Program, flat: _Flat, tb_start: dict[tuple[int, int], int], cols: StepColumns,
                  dependents: np.ndarray, tb_of: np.ndarray) -> list[list[int] | None]:
    """Per rank step, the steps that depend on it (``depid``/``deps``, in program order), or None; a missing
    target is an error (the first dependent's)."""
    revdep: list[list[int] | None] = [None] * int(cols.start[-1])
    if not len(dependents):
        return revdep
    lengths = np.diff(cols.start)
    ranks = np.asarray(flat.tb_rank, dtype=np.int64)[tb_of[dependents]]
    depid = cols.depid[dependents]
    span = int(depid.max()) + 1     # depid >= 0 here; (rank, depid) as one key where it fits
    if span * program.num_ranks < 2**62:
        keys, inverse = np.unique(ranks * span + depid, return_inverse=True)
        pairs = zip(*divmod(keys, span))
    else:
        found, inverse = np.unique(np.stack([ranks, depid], axis=1), axis=0, return_inverse=True)
        pairs = map(tuple, found.tolist())
    target_tb = np.array([tb_start.get((int(r), int(i)), -1) for r, i in pairs], dtype=np.int64)[inverse.ravel()]
    deps = cols.deps[dependents]
    bad = (target_tb < 0) | (deps < 0) | (deps >= np.where(target_tb >= 0, lengths[target_tb], 0))
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        r, t, s = flat.owner(int(dependents[at]))
        raise SynthError(f"program {program.name!r}: rank {r} tb {t} step {s} depends on missing "
                         f"step (tb {int(depid[at])}, step {int(deps[at])})")
    target = cols.start[target_tb] + deps
    order = np.argsort(target, kind="stable")     # dependents stay in program order
    target, waiting = target[order], dependents[order].tolist()
    edges = np.flatnonzero(np.diff(target)) + 1
    lo = [0, *edges.tolist()]
    hi = [*edges.tolist(), len(waiting)]
    for x, a, b in zip(target[lo].tolist(), lo, hi, strict=True):
        revdep[x] = waiting[a:b]
    return revdep


def _switch_gates(flat: _Flat) -> list[list[int] | None]:
    """``flat.revdep`` with each switch op's gate releasing its sends to the dsts."""
    revdep = flat.revdep
    for gate, fan in flat.fanout.items():
        revdep[gate] = fan
    return revdep


def _match_connections(program: Program, flat: _Flat) -> tuple[list[int], list[int]]:
    """(connection index of each send step, the receive step each send step is matched with: k-th with k-th)."""
    for key in flat.sends_on.keys() | flat.recvs_on.keys():
        s_list, r_list = flat.sends_on.get(key, []), flat.recvs_on.get(key, [])
        if len(s_list) != len(r_list):
            src, dst, chan = key
            raise SynthError(f"program {program.name!r}: connection {src}->{dst} chan {chan} has "
                             f"{len(s_list)} sends but {len(r_list)} receives")
    total = len(flat.nxt)
    lengths = [len(s_list) for s_list in flat.sends_on.values()]
    sends = np.fromiter(chain.from_iterable(flat.sends_on.values()), np.int64, sum(lengths))
    receives = np.fromiter(chain.from_iterable(flat.recvs_on.get(key, ()) for key in flat.sends_on), np.int64,
                           len(sends))
    # a message's receive takes what its send moves (MSCCL's runtimes hang or read garbage otherwise)
    cnt = np.asarray(flat.cnt, dtype=np.int64)
    unequal = np.flatnonzero(cnt[sends] != cnt[receives])
    if unequal.size:
        send, receive = int(sends[unequal[0]]), int(receives[unequal[0]])
        raise SynthError(f"program {program.name!r}: {_step_label(program, flat.owner(send))} sends {cnt[send]} "
                         f"chunks but its receive, {_step_label(program, flat.owner(receive))}, takes {cnt[receive]} "
                         f"({unequal.size} such message{'s' if unequal.size > 1 else ''}); synth verify names them")
    conn_of = np.zeros(total, dtype=np.int64)  # send step -> index of its connection (for the FIFO rule)
    conn_of[sends] = np.repeat(np.arange(len(lengths)), lengths)
    matched = np.full(total, -1, dtype=np.int64)  # send step -> its receive step: k-th with k-th
    matched[sends] = receives
    return conn_of.tolist(), matched.tolist()


class _Graph(NamedTuple):
    """The steps as the event loop reads them (built by :func:`_link_steps`; lists indexed by step)."""

    nxt: list[int]  # next step of the threadblock, -1 after its last
    need: list[int]  # prerequisites: previous step, message, dependency
    cnt: list[int]  # chunks the step moves
    send_route: list[int]  # route of the step's transfer, -1 when it does not send
    matched: list[int]  # send step -> its receive step
    conn_of: list[int]  # send step -> its connection (for the FIFO rule)
    revdep: list[list[int] | None]  # steps that depend on this one
    num_conns: int
    route_links: list[tuple[int, ...]]  # per route: its link ids, summed α (µs), bottleneck bw (bytes/µs)
    route_alpha: list[float]
    route_bw: list[float]
    cut_through: frozenset[int]  # receive steps inside a switch: messages count from their first bytes


def _link_steps(program: Program, flat: _Flat) -> _Graph:
    """Resolve the flattened steps' dependencies and pair their messages into the event loop's graph."""
    revdep = _switch_gates(flat)
    conn_of, matched = _match_connections(program, flat)
    return _Graph(flat.nxt, flat.need, flat.cnt, flat.send_route, matched, conn_of, revdep, len(flat.sends_on),
                  [r[0] for r in flat.routes], [r[1] for r in flat.routes], [r[2] for r in flat.routes],
                  frozenset(flat.cut_through))


@dataclass(frozen=True)
class _Run:
    """What the event loop produced."""

    fin: list[float]  # per step: when it finished (-1 if it never ran)
    starts: list[float] | None  # per send step: when its transfer started (when events are recorded)
    order: list[int]  # send steps in the order their transfers were placed (when events are recorded)
    link_busy: list[float]  # per link: µs booked on it


def _run_events(graph: _Graph, num_links: int, chunk: float, record_events: bool) -> _Run:
    """Run the steps in dependency order, placing each transfer on its route (module docstring)."""
    (nxt, need, cnt, send_route, matched, conn_of, revdep, num_conns, route_links, route_alpha, route_bw,
     cut_through) = graph
    need = list(need)  # counted down as prerequisites finish
    # cut-through switch stages: when the last bytes of their input arrive (0: none); a stage's send starts no
    # earlier than that minus its own data time, so it never ends before its input has all arrived
    tail: dict[int, float] = {}
    ready, fin = [0.0] * len(nxt), [-1.0] * len(nxt)
    starts: list[float] | None = [0.0] * len(nxt) if record_events else None
    link_free, link_busy = [0.0] * num_links, [0.0] * num_links  # per link: end of its last booking, µs booked
    booked: list[list[float]] = [[] for _ in range(num_links)]  # see _book
    conn_start = [0.0] * num_conns  # start of the last booked message on each connection
    heap: list[tuple[float, int, int]] = []
    heappush, heappop, seq = heapq.heappush, heapq.heappop, 0
    order: list[int] = []
    # ``stack``: steps whose prerequisites have all finished (``ready`` is final); ``heap``: transfers, placed
    # when the stack is empty. Releasing x at time t (inlined): raise ready[x] to t, count down need[x].
    stack = [g for g in range(len(nxt)) if need[g] == 0]
    stack.reverse()  # run the first steps in program order (deterministic tie order)
    while True:
        if stack:
            g = stack.pop()
            t = ready[g]
            if send_route[g] >= 0:
                if tail and g in tail:
                    t = max(t, tail[g] - cnt[g] * chunk / route_bw[send_route[g]])
                heappush(heap, (t, seq, g))
                seq += 1
                continue
            fin[g] = t  # local steps and plain receives take no time of their own
        elif heap:
            t, _, g = heappop(heap)
            r = send_route[g]
            links = route_links[r]
            dur = route_alpha[r] + cnt[g] * chunk / route_bw[r]
            if len(links) == 1:
                lid = links[0]
                if link_free[lid] <= t:  # fast path: the link is idle from t on, all its bookings are past
                    start, end = t, t + dur
                    booked[lid] = [t, end]
                    link_free[lid] = end
                else:
                    start, end = _book(booked, link_free, links, t, conn_start[conn_of[g]], dur)
                link_busy[lid] += dur
            else:
                for lid in links:
                    if link_free[lid] > t:
                        start, end = _book(booked, link_free, links, t, conn_start[conn_of[g]], dur)
                        break
                else:  # every link of the route is idle from t on
                    start, end = t, t + dur
                    for lid in links:
                        booked[lid] = [t, end]
                        link_free[lid] = end
                for lid in links:
                    link_busy[lid] += dur
            conn_start[conn_of[g]] = start
            fin[g] = t = end  # the send step finishes when the data has arrived
            if starts is not None:
                starts[g] = start
                order.append(g)
            x = matched[g]  # the message arrives
            if cut_through and x in cut_through:   # a switch stage goes on from the first bytes
                tail[x] = max(tail.get(x, 0.0), end)
                first_bytes = start + route_alpha[r]
                if first_bytes > ready[x]:
                    ready[x] = first_bytes
            elif t > ready[x]:
                ready[x] = t
            need[x] = left = need[x] - 1
            if not left:
                stack.append(x)
        else:
            break
        x = nxt[g]  # g finished at t: release the threadblock's next step, then g's dependents
        if x >= 0:
            if t > ready[x]:
                ready[x] = t
            need[x] = left = need[x] - 1
            if not left:
                stack.append(x)
        deps = revdep[g]
        if deps is not None:
            if tail and g in tail and g in cut_through:   # a gate hands its input's last arrival to its fan-out
                for x in deps:
                    tail[x] = max(tail.get(x, 0.0), tail[g])
            for x in deps:
                if t > ready[x]:
                    ready[x] = t
                need[x] = left = need[x] - 1
                if not left:
                    stack.append(x)
    return _Run(fin, starts, order, link_busy)


def _check_finished(program: Program, flat: _Flat, fin: list[float]) -> None:
    """Raise when some step never ran (the program deadlocks), naming the first few."""
    stuck = [g for g in range(len(fin)) if fin[g] < 0]
    if stuck:
        examples = ", ".join(_step_label(program, flat.owner(g)) for g in stuck[:3])
        raise SynthError(f"program {program.name!r} deadlocks: {len(stuck)} of {len(fin)} steps never run "
                         f"(first: {examples})")


def _step_label(program: Program, owner: tuple[int, int, int]) -> str:
    """How errors name a step: ``rank r tb t step s``, or ``switch NAME op j`` for an in-network step."""
    node, tb, step = owner
    if tb < 0:   # switch steps are owned by (switch node, -1 - k, op index) for program.switches[k]
        return f"switch {program.switches[-1 - tb].name} op {step}"
    return f"rank {node} tb {tb} step {step}"


def _link_report(router: Router, flat: _Flat, run: _Run, makespan: float) -> tuple[dict[str, float], list[Event]]:
    """(busy fraction of the makespan per link name, the recorded transfers as :data:`Event` s)."""
    real = len(router.topology.links)   # the reduction engines after them are no links
    link_names = [router.link_name(i) for i in range(real)] + flat.engines
    utilization = {link_names[i]: (busy / makespan if makespan > 0 else 0.0)
                   for i, busy in enumerate(run.link_busy[:real])}
    events: list[Event] = []
    if run.starts is not None:
        starts, fin = run.starts, run.fin
        names = [tuple(link_names[i] for i in r[0]) for r in flat.routes]
        events = [flat.owner(g) + (starts[g], fin[g], names[flat.send_route[g]]) for g in run.order]
    return utilization, events

"""Test helpers for the synthesis methods: small topologies built directly, and an independent
semantic check of a Schedule (data flow, reductions, link exclusivity), so the method tests do not
depend on lowering/verify."""

from __future__ import annotations

from synth.collectives import Collective
from synth.schedule import Schedule
from synth.topology.model import Link, Topology


def slow_and_fast_boxes(slow: float, fast: float, slow_ranks: int = 4, fast_ranks: int = 2, *, fast_boxes: int = 1,
                        intra_bw: float = 100.0) -> Topology:
    """NVSwitch boxes on one IB switch: one of ``slow_ranks`` ranks with ``slow`` GB/s NICs, then ``fast_boxes`` of
    ``fast_ranks`` ranks with ``fast`` GB/s NICs (the fast NICs carry circuits at both rates)."""
    from synth.topology import generators as gen

    boxes = [gen.Box(slow_ranks, "nvswitch", intra_bw, 0.5, nic_bw=slow)]
    boxes += [gen.Box(fast_ranks, "nvswitch", intra_bw, 0.5, nic_bw=fast)] * fast_boxes
    return gen.boxes_on_ib(boxes, 1, name=f"mixed-{slow:g}-{fast:g}" + (f"x{fast_boxes}" if fast_boxes > 1 else ""))


def ring(n: int, bw: float = 50.0, alpha: float = 0.5) -> Topology:
    links = []
    for i in range(n):
        j = (i + 1) % n
        links += [Link(i, j, bw, alpha), Link(j, i, bw, alpha)]
    return Topology(f"ring{n}", n, tuple(links))


def line(n: int, bw: float = 50.0, alpha: float = 0.5) -> Topology:
    links = []
    for i in range(n - 1):
        links += [Link(i, i + 1, bw, alpha), Link(i + 1, i, bw, alpha)]
    return Topology(f"line{n}", n, tuple(links))


def full(n: int, bw: float = 50.0, alpha: float = 0.5) -> Topology:
    return Topology(f"fc{n}", n, tuple(Link(i, j, bw, alpha) for i in range(n) for j in range(n) if i != j))


def star(n: int, bw: float = 300.0, alpha: float = 0.7) -> Topology:
    links = []
    for i in range(n):
        links += [Link(i, n, bw, alpha), Link(n, i, bw, alpha)]
    return Topology(f"star{n}", n, tuple(links), switches=("sw",))


def torus2(a: int, b: int, bw: float = 50.0, alpha: float = 0.5) -> Topology:
    links: dict[tuple[int, int], Link] = {}
    for x in range(a):
        for y in range(b):
            u = x * b + y
            for v in (((x + 1) % a) * b + y, x * b + (y + 1) % b):
                links[(u, v)] = Link(u, v, bw, alpha)
                links[(v, u)] = Link(v, u, bw, alpha)
    return Topology(f"torus{a}x{b}", a * b, tuple(links.values()))


def check_schedule(schedule: Schedule, topology: Topology, eps: float = 1e-6) -> None:
    """Raise AssertionError unless ``schedule`` implements its collective on ``topology``.

    State per (rank, chunk): the set of contributions it holds (copy: the chunk's one contribution).
    A transfer reads the sender's state at its start (the sender must have received everything
    that ends before then) and writes at its end. Reductions must never double-count.
    Every physical link of a route carries one transfer at a time.
    """
    coll: Collective = schedule.collective
    n = coll.num_ranks
    state: dict[tuple[int, int], frozenset[int]] = {}
    if coll.is_reduction:
        for r in range(n):
            for c in coll.schedule_chunks:
                state[(r, c)] = frozenset({coll.contribution(r, c)})
    else:
        for (r, _slot), contrib in coll.precondition.items():
            state[(r, contrib)] = frozenset({contrib})
    transfers = sorted(schedule.transfers, key=lambda t: (t.start, t.end))
    # link exclusivity
    busy: dict[tuple[int, int], list[tuple[float, float]]] = {}
    seen_groups: set[tuple[int, int, int, float, float]] = set()
    for t in transfers:
        if t.group >= 0:
            # chunks of one group move together as one transfer (one MSCCL step)
            key = (t.group, t.src, t.dst, round(t.start, 9), round(t.end, 9))
            if key in seen_groups:
                continue
            seen_groups.add(key)
        assert t.end > t.start - eps, t
        hops = (t.src, *t.route, t.dst)
        for a, b in zip(hops, hops[1:]):
            assert topology.link(a, b) is not None, f"no link {a}->{b} for {t}"
            busy.setdefault((a, b), []).append((t.start, t.end))
        assert all(topology.is_switch(s) for s in t.route), t
    for key, spans in busy.items():
        spans.sort()
        for (s0, e0), (s1, _e1) in zip(spans, spans[1:]):
            assert s1 >= e0 - eps, f"link {key} overlaps: {(s0, e0)} and {s1}"
    # data flow: apply events in time order; arrivals at time t are visible to sends starting at t
    events = []
    for i, t in enumerate(transfers):
        events.append((t.start, 1, i))
        events.append((t.end, 0, i))
    events.sort()
    snap: dict[int, frozenset[int]] = {}
    for _time, kind, i in events:
        t = transfers[i]
        if kind == 1:
            held = state.get((t.src, t.chunk))
            assert held, f"rank {t.src} sends chunk {t.chunk} it does not hold at {t.start}: {t}"
            snap[i] = held
            continue
        held = snap[i]
        if t.reduce:
            mine = state.get((t.dst, t.chunk), frozenset())
            assert not (mine & held), f"double counting in {t}"
            state[(t.dst, t.chunk)] = mine | held
        else:
            state[(t.dst, t.chunk)] = held
    for (r, _slot), want in coll.postcondition.items():
        chunk = (coll.split_contribution(next(iter(want)))[1] if coll.is_reduction else next(iter(want)))
        got = state.get((r, chunk), frozenset())
        assert got == want, f"rank {r} chunk {chunk}: has {sorted(got)}, needs {sorted(want)}"


def programs_at_or_above_bound(topology: Topology, collective: str, size_bytes: float, methods) -> list[float]:
    """The simulated times of every method in ``methods`` that gives a verified program for the request, each
    checked to be at least the request's time bound (a method that refuses the instance is skipped)."""
    from synth.errors import SynthError
    from synth.lower_bounds import compute_bounds
    from synth.pipeline import synthesize

    bound = compute_bounds(topology, collective, size_bytes).time_bound_us
    timed = []
    for method in methods:
        try:
            result = synthesize(topology, collective, size_bytes, method)
        except SynthError:
            continue
        timed.append(result.time_us)
        assert result.time_us >= bound * (1 - 1e-9), method
    return timed

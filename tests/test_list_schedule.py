"""The list schedule's rules (synth.synthesis.timing.list_schedule, docs/cost-model.md), checked on random jobs:
data before sends, one message per link direction at a time, α-β durations with one α per MSCCL step, no idle
link while a job waits for it, the best key first among jobs that waited, and coalesced messages of contiguous
chunks on one connection."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.errors import SynthError
from synth.synthesis.base import MAX_STEP_CHUNKS
from synth.synthesis.timing import MAX_COALESCE, Jobs, list_schedule, route_costs
from synth.topology import generators as gen

EPS = 1e-9
CHUNK_BYTES = 1 << 20


@st.composite
def job_sets(draw):
    """(fabric, jobs): a ring, a fully connected fabric or a star (one switch) of 3-5 ranks; each job sends 1-3
    contiguous chunks to a neighbour (through the switch on the star), after 0-2 earlier jobs, with a random key of
    few values (so ties happen)."""
    n = draw(st.integers(3, 5))
    fabric = draw(st.sampled_from([gen.ring(n, bw=25.0, alpha=1.0), gen.fully_connected(n, bw=50.0, alpha=0.5),
                                   gen.star(n, bw=40.0, alpha=0.7)]))
    route = (n,) if fabric.switches else ()
    pairs = sorted({(src, dst) for src in range(n) for dst in range(n) if src != dst} if route else
                   {(link.src, link.dst) for link in fabric.links})
    jobs = Jobs.empty()
    next_chunk: dict[tuple[int, int], int] = {}
    for i in range(draw(st.integers(1, 40))):
        src, dst = draw(st.sampled_from(pairs))
        # chunks continue the connection's last job (coalescible) or jump ahead (not)
        first = next_chunk.get((src, dst), 0) + draw(st.sampled_from([0, 0, 5]))
        size = draw(st.integers(1, 3))
        next_chunk[(src, dst)] = first + size
        deps = tuple(sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=2))))) if i else ()
        jobs.add(tuple(range(first, first + size)), src, dst, route, False, deps, (draw(st.integers(0, 3)),))
    return fabric, jobs


def _messages(jobs: Jobs) -> dict[int, list[int]]:
    heads: dict[int, list[int]] = {}
    for i, head in enumerate(jobs.head):
        heads.setdefault(head, []).append(i)
    return heads


def _check_rules(fabric, jobs: Jobs, coalesce: bool, alpha_share: float = 0.01, drain: float | None = None,
                 batch: bool = False) -> None:
    order, start, end = list_schedule(jobs, fabric, CHUNK_BYTES, coalesce=coalesce, alpha_share=alpha_share,
                                      drain=drain, batch=batch)
    n = len(jobs.msg)
    assert sorted(order) == list(range(n))
    assert all(start[a] <= start[b] + EPS for a, b in zip(order, order[1:]))
    hops, route_alpha, route_rate = route_costs(jobs, fabric, CHUNK_BYTES)[:3]
    ready = [max((end[d] for d in jobs.deps[i]), default=0.0) for i in range(n)]
    messages = _messages(jobs)
    by_link: dict[int, list[tuple[float, float, int]]] = {}
    for head, members in messages.items():
        assert head in members and all(start[m] == start[head] and end[m] == end[head] for m in members)
        chunks = [c for m in sorted(members, key=lambda m: jobs.msg[m][0]) for c in jobs.msg[m]]
        assert chunks == list(range(chunks[0], chunks[0] + len(chunks)))    # contiguous: one MSCCL step's range
        assert len({(jobs.src[m], jobs.dst[m], jobs.route[m]) for m in members}) == 1
        assert len(members) == 1 or len(chunks) <= MAX_COALESCE
        steps = math.ceil(len(chunks) / MAX_STEP_CHUNKS)
        duration = route_alpha[head] * steps + len(chunks) * CHUNK_BYTES / route_rate[head]
        assert end[head] - start[head] == duration or math.isclose(end[head] - start[head], duration, rel_tol=1e-12)
        for m in members:
            assert start[head] >= ready[m] - EPS     # a message leaves once all its data has arrived
        for link in hops[head]:
            by_link.setdefault(link, []).append((start[head], end[head], head))
    for busy in by_link.values():
        busy.sort()
        for (_, e0, _), (s1, _, _) in zip(busy, busy[1:]):
            assert s1 >= e0 - EPS                  # one message at a time per link direction
    if fabric.switches:
        return   # a routed job may wait for the far links of its route, and a later one overtake it
    for i in range(n):
        link = hops[i][0]
        # work-conserving: from the moment job i was ready until it started, its link was busy
        t = ready[i]
        for s, e, _ in by_link[link]:
            if s <= t + EPS and e > t:
                t = e
        assert t >= start[i] - EPS, (i, ready[i], start[i])
    if coalesce:
        return
    for head in messages:
        # the best key first: a job that was waiting for the link (ready before this one started) and starts
        # later has no better key (ties by index)
        for j in range(n):
            if hops[j][0] == hops[head][0] and ready[j] < start[head] - EPS and start[j] > start[head] + EPS:
                assert (jobs.key[j], j) > (jobs.key[head], head)


@settings(max_examples=150, deadline=None)
@given(job_sets())
def test_plain_list_schedule_keeps_its_rules(case):
    fabric, jobs = case
    _check_rules(fabric, jobs, coalesce=False)


@settings(max_examples=150, deadline=None)
@given(job_sets(), st.sampled_from([0.01, 0.0025, 1.0]), st.sampled_from([None, 1.0, 0.25]), st.booleans())
def test_coalesced_list_schedule_keeps_its_rules(case, alpha_share, drain, batch):
    fabric, jobs = case
    _check_rules(fabric, jobs, coalesce=True, alpha_share=alpha_share, drain=drain, batch=batch)


@settings(max_examples=60, deadline=None)
@given(job_sets(), st.booleans())
def test_timing_again_gives_the_same_schedule(case, coalesce):
    # the derived arrays cached on the jobs serve a second timing unchanged
    fabric, jobs = case
    first = list_schedule(jobs, fabric, CHUNK_BYTES, coalesce=coalesce)
    heads = list(jobs.head)
    second = list_schedule(jobs, fabric, CHUNK_BYTES, coalesce=coalesce)
    assert first[0] == second[0] and heads == jobs.head
    assert (first[1] == second[1]).all() and (first[2] == second[2]).all()


def test_cyclic_dependencies_are_an_error():
    fabric = gen.ring(3, bw=25.0, alpha=1.0)
    jobs = Jobs.empty()
    jobs.add((0,), 0, 1, (), False, (1,), (0,))
    jobs.add((1,), 1, 2, (), False, (0,), (0,))
    with pytest.raises(SynthError, match="cyclic"):
        list_schedule(jobs, fabric, CHUNK_BYTES)


def test_coalescing_merges_queued_contiguous_chunks_into_one_message():
    # four one-chunk jobs on one link, all ready at 0: the first starts alone (the others are not queued yet
    # when it leaves), then the three queued behind it go as one message with one α
    fabric = gen.ring(3, bw=25.0, alpha=1.0)
    jobs = Jobs.empty()
    for c in range(4):
        jobs.add((c,), 0, 1, (), False, (), (c,))
    _, start, end = list_schedule(jobs, fabric, CHUNK_BYTES, coalesce=True, alpha_share=0.001)
    assert len(set(jobs.head)) == 2 and jobs.head[1:] == [1, 1, 1]
    chunk_us = CHUNK_BYTES / 25e3
    assert math.isclose(end[0], 1.0 + chunk_us) and math.isclose(end[3], end[0] + 1.0 + 3 * chunk_us)

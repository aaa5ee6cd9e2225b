"""The TACOS-style greedy method: correct schedules for all eight collectives, speed at scale."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schedule_check import check_schedule, line, ring, star, torus2

from synth.collectives import COLLECTIVES, Collective
from synth.errors import SynthError
from synth.synthesis import greedy
from synth.synthesis.base import Instance, SynthOptions
from synth.synthesis.greedy import synthesize, virtual_links
from synth.topology.model import Link, Topology


@pytest.mark.parametrize("name", COLLECTIVES)
@pytest.mark.parametrize("topo", [ring(6), line(5), star(5), torus2(3, 3)], ids=lambda t: t.name)
def test_every_collective_is_correct(name, topo):
    coll = Collective(name, topo.num_ranks, root=1 if name in ("broadcast", "reduce", "gather", "scatter") else 0)
    schedule = synthesize(Instance(topo, coll, 1 << 20, SynthOptions()))
    check_schedule(schedule, topo)
    assert schedule.predicted_time_us == pytest.approx(schedule.makespan)
    assert "status" not in schedule.notes    # the pipeline alone decides a program's status


def test_chunks_option_and_deterministic_seed():
    topo = ring(5)
    coll = Collective("allgather", 5)
    a = synthesize(Instance(topo, coll, 1e6, SynthOptions(chunks=2, seed=3)))
    b = synthesize(Instance(topo, coll, 1e6, SynthOptions(chunks=2, seed=3)))
    assert a.collective.chunk_factor == 2
    assert a.transfers == b.transfers
    check_schedule(a, topo)


def test_ring_allgather_is_optimal():
    # bidirectional ring of 8: 4 rounds of (alpha + chunk/bw) is optimal
    topo = ring(8, bw=50, alpha=0.5)
    schedule = synthesize(Instance(topo, Collective("allgather", 8), 8e6, SynthOptions()))
    assert schedule.makespan == pytest.approx(4 * (0.5 + 1e6 / 50e3))


def test_switch_routes_hold_every_hop():
    topo = star(4)
    vl = virtual_links(topo)
    assert vl.count == 12 and all(r == (4,) for r in vl.route)
    assert vl.alpha[0] == pytest.approx(1.4)
    schedule = synthesize(Instance(topo, Collective("allgather", 4), 4e6, SynthOptions()))
    # each rank has one uplink: 3 sequential receives of one chunk each
    assert schedule.makespan == pytest.approx(3 * (1.4 + 1e6 / 300e3))
    assert all(t.route == (4,) for t in schedule.transfers)


def test_allreduce_defaults_to_n_chunks():
    topo = ring(4)
    schedule = synthesize(Instance(topo, Collective("allreduce", 4), 1e6, SynthOptions()))
    assert schedule.collective.chunk_factor == 4
    assert any(t.reduce for t in schedule.transfers) and any(not t.reduce for t in schedule.transfers)
    check_schedule(schedule, topo)


def test_rank_mismatch_and_unreachable():
    with pytest.raises(SynthError):
        synthesize(Instance(ring(4), Collective("allgather", 5), 1e6, SynthOptions()))
    oneway = Topology("oneway", 3, (Link(0, 1, 10.0), Link(1, 2, 10.0)))
    with pytest.raises(SynthError):
        synthesize(Instance(oneway, Collective("allgather", 3), 1e6, SynthOptions()))


def test_scales_to_256_ranks_fast():
    topo = torus2(16, 16)
    t0 = time.perf_counter()
    options = SynthOptions(extra={"greedy_tries": 1})
    schedule = synthesize(Instance(topo, Collective("allgather", 256), 1 << 20, options))
    assert time.perf_counter() - t0 < 30
    assert len(schedule.transfers) == 256 * 255
    # every rank receives 255 chunks over 4 in-links: at least 64 rounds
    one = 0.5 + (1 << 20) / 256 / 50e3
    assert 64 * one - 1e-6 <= schedule.makespan < 2 * 64 * one


@pytest.mark.parametrize("name", COLLECTIVES)
def test_every_program_verifies(name):
    pipeline = pytest.importorskip("synth.pipeline")
    for topo in (ring(5), star(4), torus2(2, 3)):
        for inplace in (False, True):
            if inplace and name == "alltoall":
                with pytest.raises(SynthError, match="in-place alltoall"):
                    pipeline.synthesize(topo, name, 1 << 20, "greedy", SynthOptions(), inplace=True)
                continue
            result = pipeline.synthesize(topo, name, 1 << 20, "greedy", SynthOptions(), root=1, inplace=inplace)
            assert result.status == "heuristic"
            assert result.time_us > 0


# Regression (QA): completion times a few ulps apart (α/β sums taken in different orders) were
# applied as one event at the EARLIEST of them, so a forward could start before its chunk fully
# arrived (lowering rejects it; reductions lost a contribution). Found at 64 MiB on mi250 and by a
# random sweep on this 6-rank mixed-bandwidth ring with chords.
def _mixed6() -> Topology:
    spec = [(0, 1, 200, 0.5), (1, 2, 200, 1.0), (2, 3, 50, 1.0), (3, 4, 100, 0.7), (4, 5, 50, 0.7),
            (5, 0, 50, 0.7), (5, 2, 100, 1.0)]
    links = [Link(a, b, bw, al) for u, v, bw, al in spec for a, b in ((u, v), (v, u))]
    return Topology("mixed6", 6, tuple(links))


def _assert_sends_after_arrival(schedule) -> None:
    """Exact (no epsilon) store-and-forward: every copy sent from a non-source rank starts at or
    after the end of a transfer that delivered that chunk there."""
    coll = schedule.collective
    if coll.is_reduction:
        return
    arrived: dict[tuple[int, int], float] = {}
    for t in schedule.transfers:
        arrived[(t.dst, t.chunk)] = min(arrived.get((t.dst, t.chunk), float("inf")), t.end)
    for t in schedule.transfers:
        if t.src not in coll.chunk_sources(t.chunk):
            assert arrived[(t.src, t.chunk)] <= t.start, t


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "allreduce"])
def test_near_equal_completion_times_mixed6(name):
    topo = _mixed6()
    for size in (1 << 20, 64 << 20):
        schedule = synthesize(Instance(topo, Collective(name, 6), size, SynthOptions()))
        check_schedule(schedule, topo)
        _assert_sends_after_arrival(schedule)


@pytest.mark.parametrize("topo_name", ["mi250", "ndv2-2node", "mi250-2node"])
@pytest.mark.parametrize("name", ["allgather", "reducescatter", "allreduce"])
def test_reference_topologies_at_64mib(topo_name, name):
    from synth.topology.io import load_topology

    topo = load_topology(topo_name)
    schedule = synthesize(Instance(topo, Collective(name, topo.num_ranks), 64 << 20, SynthOptions()))
    check_schedule(schedule, topo)
    _assert_sends_after_arrival(schedule)


def test_near_equal_times_lower_and_verify():
    # lowering orders by exact time; this is the CLI failure "sends chunk 0 from rank 12 before it arrives"
    lower = pytest.importorskip("synth.program.lower")
    verify = pytest.importorskip("synth.verification")
    from synth.topology.io import load_topology

    topo = load_topology("mi250")
    for name in ("allgather", "reducescatter"):
        schedule = synthesize(Instance(topo, Collective(name, 16), 64 << 20, SynthOptions()))
        result = verify.verify(lower.lower(schedule))
        assert result.ok, result.errors[:3]


@pytest.mark.parametrize("name", ["allgather", "allreduce"])
def test_time_limit_ends_a_first_run_with_a_clear_error(name):
    # a run checks the limit at every event: a first run past it is a time-out, not a late schedule
    # (a 256-rank torus alltoall ran 441 s under --time-limit 30)
    topo, coll = torus2(4, 4), Collective(name, 16)
    assert synthesize(Instance(topo, coll, 1 << 20, SynthOptions())).notes["tries"] == 4
    with pytest.raises(SynthError, match=r"time limit \(1e-09 s\) ran out before its 4 runs finished"):
        synthesize(Instance(topo, coll, 1 << 20, SynthOptions(time_limit=1e-9)))


def test_a_later_run_past_the_limit_is_a_time_out_not_a_shorter_search(monkeypatch):
    # the plan is the best of all ``tries`` runs on any machine: a later run past the wall-clock safety
    # stop fails the method instead of leaving a plan that depends on the machine's speed
    topo, coll = torus2(4, 4), Collective("allgather", 16)
    problem, _ = greedy.copy_problem(coll)
    vl = greedy.virtual_links(topo)
    chunk_bytes = coll.chunk_bytes(1 << 20)
    real = greedy.greedy_copy
    calls = []

    def second_times_out(*args, **kwargs):
        calls.append(kwargs.get("seed"))
        if len(calls) == 2:
            raise greedy.GreedyTimeout("late")
        return real(*args, **kwargs)

    monkeypatch.setattr(greedy, "greedy_copy", second_times_out)
    with pytest.raises(greedy.GreedyTimeout):
        greedy.best_greedy(vl, problem, chunk_bytes, seed=0, tries=4, deadline=time.monotonic() + 3600)
    assert calls == [0, 1]
    monkeypatch.setattr(greedy, "greedy_copy", real)
    plan = greedy.best_greedy(vl, problem, chunk_bytes, seed=0, tries=4, deadline=time.monotonic() + 3600)
    assert plan.tries == 4
    assert plan.makespan == min(real(vl, problem, chunk_bytes, seed=k).makespan for k in range(4))
    with pytest.raises(greedy.GreedyTimeout):
        real(vl, problem, chunk_bytes, seed=0, deadline=time.monotonic() - 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 20), st.integers(0, 2**32 - 1))
def test_packed_columns_is_packbits_of_the_transpose(rows, cols, seed):
    matrix = np.random.default_rng(seed).random((rows, cols)) < 0.4
    assert np.array_equal(greedy._packed_columns(matrix), np.packbits(matrix.T, axis=1))

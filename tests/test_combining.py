"""Direct combining allreduce (synth.synthesis.combining; issue 35 part 3): partial sums move and combine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth.collectives import Collective
from synth.errors import SynthError
from synth.pipeline import synthesize
from synth.synthesis import combining
from synth.synthesis.base import SynthOptions
from synth.synthesis.pareto import explore
from synth.synthesis.steps import fabric
from synth.topology import generators as gen
from synth.topology.io import load_topology

PEERS = Path(__file__).parent / "fixtures" / "peers"


@pytest.fixture(scope="module")
def dgx1():
    return load_topology("dgx1")


def _sccl_algorithm(fab, doc: dict) -> combining.CombiningAlgorithm:
    """msccl-tools' allreduce (steps of (address, src, dst) sends) as a combining algorithm of this encoding."""
    index = {(int(u), int(v)): j for j, (u, v) in enumerate(zip(fab.vl.src, fab.vl.dst))}
    sends, rounds = [], []
    for s, step in enumerate(doc["steps"], start=1):
        rounds.append(int(step["rounds"]))
        sends += [(s, int(a), index[(int(u), int(v))]) for a, u, v in step["sends"]]
    return combining.CombiningAlgorithm(int(doc["instance"]["chunks"]), len(rounds), sum(rounds), tuple(rounds),
                                        tuple(sorted(sends)), "optimal", 0.0)


def test_sccl_dgx1_allreduce_is_a_solution_of_the_encoding_and_its_least_steps(dgx1):
    fab = fabric(dgx1)
    sccl = _sccl_algorithm(fab, json.loads((PEERS / "dgx1_allreduce.msccl.json").read_text()))
    combining.check_algorithm(fab, sccl)                          # SCCL's 2-step algorithm replays exactly
    assert combining.steps_lower_bound(fab.dist) == 2
    status, algo = combining.solve_instance(fab, 1, 2, work_limit=10.0)
    assert status == "sat" and algo is not None and algo.status == "optimal"
    assert (algo.chunks, algo.steps, algo.rounds) == (sccl.chunks, sccl.steps, sccl.rounds) == (1, 2, 2)
    assert len(algo.sends) == len(sccl.sends) == 32
    assert combining.solve_instance(fab, 1, 1, work_limit=10.0) == ("unsat", None)


def test_replay_refuses_a_contribution_counted_twice(dgx1):
    fab = fabric(dgx1)
    index = {(int(u), int(v)): j for j, (u, v) in enumerate(zip(fab.vl.src, fab.vl.dst))}
    # 0 -> 1 then 1 -> 0 again: rank 0's own value comes back inside 1's partial sum
    bad = combining.CombiningAlgorithm(1, 2, 2, (1, 1), ((1, 0, index[(0, 1)]), (2, 0, index[(1, 0)])), "optimal", 0)
    with pytest.raises(SynthError, match="twice"):
        combining.check_algorithm(fab, bad)
    short = combining.CombiningAlgorithm(1, 1, 1, (1,), ((1, 0, index[(0, 1)]),), "optimal", 0)
    with pytest.raises(SynthError, match="short"):
        combining.check_algorithm(fab, short)


def test_dgx1_1kb_allreduce_milp_is_direct_verified_and_within_sccl(dgx1):
    res = synthesize(dgx1, "allreduce", 1000, "milp")          # the pipeline verifies what it returns
    notes = res.schedule.notes
    assert notes["encoding"].startswith("combining") and notes["steps"] == 2
    assert res.time_us <= 1.48 + 1e-9                           # SCCL's 2-step shape simulates at 1.48 us
    assert all(t.reduce for t in res.schedule.transfers)
    composed = synthesize(dgx1, "allreduce", 1000, "milp", SynthOptions(extra={"milp_combining": False}))
    assert "encoding" not in composed.schedule.notes and composed.time_us > res.time_us   # 2.82 us, 4 steps


def test_dgx1_1kb_allreduce_executes(dgx1):
    pytest.importorskip("torch")
    from synth.execution.runner import execute

    res = synthesize(dgx1, "allreduce", 1000, "milp")
    out = execute(res.program, size_bytes=1000, iters=1, warmup=0)
    assert out.ok, out.errors[:3]


def test_copies_of_a_complete_sum_reach_what_sccls_encoding_cannot():
    # on a ring a partial sum can never come back to a rank whose own value it holds (SCCL's encoding, no
    # copies): no combining allreduce in 4 steps on ring-5; reduce into rank 0 and copy the sum back is one
    fab = fabric(gen.ring(5))
    assert combining.solve_instance(fab, 1, 4, work_limit=10.0, copies=False)[0] == "unsat"
    status, algo = combining.solve_instance(fab, 1, 4, work_limit=10.0)
    assert status == "sat" and algo is not None and algo.copies and algo.steps == 4
    index = {(int(u), int(v)): j for j, (u, v) in enumerate(zip(fab.vl.src, fab.vl.dst))}
    early = combining.CombiningAlgorithm(1, 1, 1, (1,), (), "optimal", 0.0, copies=((1, 0, index[(0, 1)]),))
    with pytest.raises(SynthError, match="incomplete"):
        combining.check_algorithm(fab, early)


def test_ring6_allreduce_with_copies_is_verified_faster_and_executes():
    ring6 = gen.ring(6)
    res = synthesize(ring6, "allreduce", 1000, "milp", inplace=True)
    composed = synthesize(ring6, "allreduce", 1000, "milp", SynthOptions(extra={"milp_combining": False}))
    assert res.schedule.notes["encoding"].startswith("combining") and res.time_us < composed.time_us
    assert any(not t.reduce for t in res.schedule.transfers)   # the complete sum travels as copies
    pytest.importorskip("torch")
    from synth.execution.runner import execute

    out = execute(res.program, size_bytes=1000, iters=1, warmup=0)
    assert out.ok, out.errors[:3]


@pytest.mark.parametrize("topology", [gen.ring(4), gen.fully_connected(4), gen.hypercube(3)],
                         ids=lambda t: t.name)
def test_generated_fabrics_direct_is_verified_and_no_slower_than_composed(topology):
    direct = synthesize(topology, "allreduce", 1000, "milp")
    composed = synthesize(topology, "allreduce", 1000, "milp", SynthOptions(extra={"milp_combining": False}))
    assert direct.schedule.notes.get("encoding", "").startswith("combining")
    assert direct.time_us <= composed.time_us
    # a combining allreduce needs the diameter in steps, and reaches it on these fabrics
    assert direct.schedule.notes["steps"] == combining.steps_lower_bound(fabric(topology).dist)


def test_pareto_allreduce_reports_sccl_units(dgx1):
    exp = explore(dgx1, "allreduce", max_chunks=1, time_limit=60, size_bytes=1000)
    keys = {(p.chunks, p.steps, p.rounds) for p in exp.points}
    assert (1, 2, 2) in keys                                    # combining, SCCL's least-steps instance
    assert exp.steps_lb == 2
    composed = [t for t in exp.tried if t["encoding"] == "composed" and t["status"] == "sat"]
    # reduce-scatter + allgather with one chunk per owner: 8 buffer chunks, not 1
    assert composed and all(t["chunks"] == 8 for t in composed)
    for p in exp.points:
        assert p.schedule.collective.chunk_factor == p.chunks


def test_pareto_allreduce_chunks_count_the_buffer(dgx1):
    res = synthesize(dgx1, "allreduce", 1000, "pareto", SynthOptions(chunks=3, extra={"max_steps": 2}))
    assert res.collective.chunk_factor == 3 and res.schedule.notes["steps"] == 2


def test_combining_refuses_other_collectives(dgx1):
    with pytest.raises(SynthError, match="allreduce"):
        combining.best_schedule(dgx1, Collective("allgather", 8), 1000, chunks=None, work_limit=1.0, threads=None,
                                seed=0, method="milp")


def test_composed_alternative_kept_where_faster_names_its_own_solver():
    # ring-5: the combining allreduce needs 4 steps (2.04 us), reduce-scatter + allgather simulates 2.016 us
    res = synthesize(gen.ring(5), "allreduce", 1000, "milp")
    assert "encoding" not in res.schedule.notes and res.solver == "highs"
    direct = synthesize(gen.ring(6), "allreduce", 1000, "milp")
    assert direct.schedule.notes["encoding"].startswith("combining") and direct.solver == "cp-sat"


def test_pinned_chunks_replicate_the_one_chunk_algorithm(dgx1):
    # least R with 8 chunks scatters them over links (an α per run); the 1-chunk algorithm on all 8 at once
    # pays one α per link and step: 2 x (0.7 + 1000 B / 25 GB/s) = 1.48 us
    fab = fabric(dgx1)
    _, one = combining.solve_instance(fab, 1, 2, work_limit=10.0)
    assert one is not None
    eight = combining.replicate(fab, one, 8)                   # checked by the replay inside
    assert (eight.chunks, eight.steps) == (8, 2) and len(eight.sends) == 8 * len(one.sends)
    assert combining.predicted_us(fab, eight, 1000) == pytest.approx(1.48)
    res = synthesize(dgx1, "allreduce", 1000, "milp", SynthOptions(chunks=8))
    assert res.collective.chunk_factor == 8 and res.time_us <= 1.48 + 1e-9


def test_recursive_doubling_is_the_fallback_behind_a_switch():
    # 16 GPUs on one NVSwitch: CP-SAT does not find a 4-step solution in a small budget; recursive doubling (the
    # solution hint, 16 x 4 exchanges of disjoint partial sums, one round a step) is then the answer
    fab = fabric(load_topology("dgx2"))
    assert sum(combining.doubling_hint(fab, 1, 4).values()) == 64
    status, algo = combining.solve_instance(fab, 1, 4, work_limit=0.05)
    assert status == "sat" and algo is not None and (algo.steps, algo.rounds) == (4, 4)
    assert combining.doubling_hint(fabric(gen.ring(6)), 1, 5) == {}       # not a power of two
    assert combining.doubling_hint(fab, 1, 3) == {}                        # too few steps

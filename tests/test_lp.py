"""Method lp: every LP backend finds the cut-bound optimum; lp and trees agree; programs verify."""

from __future__ import annotations

import pytest

from synth.collectives import Collective
from synth.errors import SynthError
from synth.synthesis.base import SynthOptions
from synth.synthesis.lp import LP_SOLVERS, solve_rate, synthesize
from synth.synthesis.packing import integer_fabric, optimal_ratio
from synth.topology.model import Link, Topology


def _bidir(n_ranks, edges, switches=(), name="t"):
    links = []
    for a, b, bw in edges:
        links += [Link(a, b, bw, 0.5), Link(b, a, bw, 0.5)]
    return Topology(name, n_ranks, tuple(links), tuple(switches))


SMALL = [
    _bidir(4, [(0, 1, 50), (1, 2, 50), (2, 3, 50), (3, 0, 50)], name="ring4"),
    _bidir(4, [(0, 1, 100), (2, 3, 100), (1, 2, 10)], name="boxes"),
    _bidir(4, [(i, 4, 100) for i in range(4)], switches=("sw",), name="star4"),
    _bidir(4, [(0, 1, 25), (0, 2, 50), (1, 2, 25), (2, 3, 75), (1, 3, 25)], name="mixed"),
]


@pytest.mark.parametrize("topology", SMALL, ids=lambda t: t.name)
@pytest.mark.parametrize("solver", LP_SOLVERS)
def test_all_backends_find_the_cut_bound(topology, solver):
    roots = tuple(range(topology.num_ranks))
    exact = float(optimal_ratio(integer_fabric(topology), {r: 1 for r in roots}))
    lp = solve_rate(topology, roots, solver)
    tol = 1e-4 if solver == "pdlp" else 1e-7
    assert lp.ratio == pytest.approx(exact, rel=tol)


@pytest.mark.parametrize("topology", SMALL, ids=lambda t: t.name)
def test_large_lps_take_highs_interior_point_to_the_same_optimum(topology, monkeypatch):
    # above IPM_VARIABLES HiGHS runs interior point + crossover (large fabrics: minutes, not hours);
    # here every model counts as large, and the optimum and the programs are the same
    import synth.solvers
    from synth.program.lower import lower
    from synth.synthesis import lp as lp_method
    from synth.verify import verify

    algorithms = []
    real_solve = synth.solvers.solve

    def recording(model, *args, **kwargs):
        algorithms.append(kwargs.get("lp_algorithm"))
        return real_solve(model, *args, **kwargs)

    monkeypatch.setattr(synth.solvers, "solve", recording)
    roots = tuple(range(topology.num_ranks))
    simplex = solve_rate(topology, roots, "highs")
    monkeypatch.setattr(lp_method, "IPM_VARIABLES", 0)
    interior = solve_rate(topology, roots, "highs")
    assert algorithms == [None, "ipm"]
    assert interior.ratio == pytest.approx(simplex.ratio, rel=1e-7)
    schedule = synthesize(topology, Collective("allgather", topology.num_ranks), 2**24, SynthOptions())
    assert verify(lower(schedule)).ok


@pytest.mark.parametrize("topology", SMALL, ids=lambda t: t.name)
def test_broadcast_lp_matches_min_cut(topology):
    exact = float(optimal_ratio(integer_fabric(topology), {0: 1}))
    assert solve_rate(topology, (0,), "highs").ratio == pytest.approx(exact, rel=1e-7)


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "broadcast", "reduce", "allreduce"])
@pytest.mark.parametrize("topology", SMALL[:3], ids=lambda t: t.name)
def test_lp_programs_verify_and_agree_with_trees(topology, name):
    from synth.program.lower import lower
    from synth.synthesis.trees import synthesize as trees
    from synth.verify import verify

    coll = Collective(name, topology.num_ranks)
    schedule = synthesize(topology, coll, 2**24, SynthOptions())
    assert verify(lower(schedule)).ok
    other = trees(topology, coll, 2**24, SynthOptions())
    assert schedule.notes["tree_bandwidth_time_us"] == pytest.approx(other.notes["tree_bandwidth_time_us"],
                                                                      rel=1e-3)


def test_lp_rejects_mip_only_solver():
    with pytest.raises(SynthError, match="--solver"):
        synthesize(SMALL[0], Collective("allgather", 4), 2**20, SynthOptions(solver="cp-sat"))

"""The public API (``import synth``): one call per CLI job, on plain values."""

from __future__ import annotations

import pydoc

import pytest

import synth
from synth.errors import SynthError


def test_synthesize_on_plain_values_returns_a_verified_program_with_time_bound_and_gap():
    result = synth.synthesize("dgx1", "allgather", "64MiB")
    assert result.size_bytes == 64 * 2**20
    assert result.program.num_ranks == 8
    assert result.bound_us == pytest.approx(synth.bounds("dgx1", "allgather", "64MiB").time_bound_us)
    assert result.time_us >= result.bound_us
    assert result.gap == pytest.approx((result.time_us - result.bound_us) / result.time_us)
    assert synth.verify(result.program).ok
    assert synth.simulate(result.program, "dgx1", "64MiB").time_us == pytest.approx(result.time_us)


def test_save_and_load_program_round_trip(tmp_path):
    result = synth.synthesize("ring-8", "allreduce", 2**20, "ring")
    path = synth.save_program(result.program, tmp_path / "ar.xml")
    loaded = synth.load_program(path)
    assert loaded.num_ranks == 8
    assert synth.verify(path).ok
    assert synth.simulate(path, "ring-8", 2**20).time_us == pytest.approx(result.time_us)


def test_bounds_and_topology_take_names():
    topology = synth.load_topology("dgx-a100-2node")
    assert topology.num_ranks == 16
    assert synth.bounds(topology, "allgather", "1GiB").time_bound_us == \
        synth.bounds("dgx-a100-2node", "allgather", 2**30).time_bound_us


def test_unknown_option_is_named():
    with pytest.raises(SynthError, match="unknown option.*colour"):
        synth.synthesize("dgx1", "allgather", "1MiB", colour="red")


def test_help_lists_the_api():
    # the stage modules have names of their own, so importing them never hides the API's functions
    import synth.execution.runner  # noqa: F401
    import synth.lower_bounds  # noqa: F401
    import synth.simulation  # noqa: F401
    import synth.sweep  # noqa: F401
    import synth.verification  # noqa: F401

    text = pydoc.render_doc(synth, renderer=pydoc.plaintext)
    for name in ("load_topology", "bounds", "synthesize", "verify", "simulate", "execute", "save_program", "methods",
                 "run_sweep"):
        assert name in text
        assert callable(getattr(synth, name))


def test_methods_and_run_sweep_take_plain_values(tmp_path):
    assert {"ring", "trees", "greedy"} <= set(synth.methods())
    result = synth.run_sweep(["dgx1", "ring-8"], ["allgather"], ["1M"], ["ring", "greedy"])
    assert [(r["topology"], r["method"]) for r in result.rows] == [
        ("dgx1", "ring"), ("dgx1", "greedy"), ("ring-8", "ring"), ("ring-8", "greedy")]
    assert result.ok_rows == result.rows and result.failed == 0
    for row in result.rows:
        assert row["verified"] is True and row["size_bytes"] == 10**6 and row["time_us"] >= row["bound_us"]
    best = result.best()
    assert set(best) == {("dgx1", "allgather", 10**6), ("ring-8", "allgather", 10**6)}
    for (topo, _, _), row in best.items():
        assert row["time_us"] == min(r["time_us"] for r in result.rows if r["topology"] == topo)
    assert result.write(tmp_path / "rows.csv").read_text().count("\n") == 5   # header + 4 rows
    with pytest.raises(SynthError, match="unknown option.*colour"):
        synth.run_sweep(["dgx1"], ["allgather"], ["1M"], ["ring"], colour="red")

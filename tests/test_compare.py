"""``synth compare``: every built-in topology x collective runs (cheap methods), rows and bound are
consistent, failures stay in their rows, bad input exits 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.collectives import COLLECTIVES
from synth.synthesis.registry import METHODS
from synth.topology.builtin import builtin_names

CHEAP = ("ring", "dbt", "rdh", "direct", "hierarchical")
# 27-32 ranks: the ring search alone takes seconds per collective; these run with -m slow
BIG = {"mi250-2node", "dgx-a100-4node", "torus-3x3x3"}
TOPOLOGIES = [pytest.param(t, marks=pytest.mark.slow) if t in BIG else t for t in builtin_names()]


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def compare_json(*args: str) -> dict:
    res = invoke("compare", *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.parametrize("topo", TOPOLOGIES)
def test_compare_every_builtin_and_collective(topo: str) -> None:
    """Acceptance: compare runs on every built-in topology x collective without error."""
    for coll in COLLECTIVES:
        methods = [m for m in CHEAP if coll in METHODS[m].collectives]
        doc = compare_json("-t", topo, "-c", coll, "-s", "64KiB", "--methods", ",".join(methods))
        assert [r["method"] for r in doc["rows"]] == methods
        bound = doc["bound"]["time_bound_us"]
        assert bound > 0
        ok = [r for r in doc["rows"] if r["error"] is None]
        assert ok, (topo, coll, doc["rows"])    # ring applies everywhere
        for r in ok:
            assert r["time_us"] >= bound * (1 - 1e-9), (topo, coll, r)
            assert r["ratio_to_bound"] == pytest.approx(r["time_us"] / bound)
            assert r["algbw_GBps"] == pytest.approx(65536 / r["time_us"] / 1e3)
        assert doc["best"] == min(ok, key=lambda r: r["time_us"])["method"]


def test_compare_errors_stay_in_rows_and_table() -> None:
    doc = compare_json("-t", "dgx1", "-c", "allreduce", "-s", "1MiB", "--methods", "ring,hierarchical,nccl")
    rows = {r["method"]: r for r in doc["rows"]}
    assert rows["hierarchical"]["status"] == "error" and "multi-box" in rows["hierarchical"]["error"]
    assert rows["hierarchical"]["time_us"] is None
    assert rows["ring"]["error"] is None and rows["nccl"]["error"] is None
    # NCCL runs its ring at 1 MiB here, with the rings' own 48 chunks per loop (NCCL needs no divisibility);
    # the ring program takes a chunk count the MSCCL runtime runs on 2^18 elements, a little slower
    assert rows["nccl"]["time_us"] <= rows["ring"]["time_us"] <= 1.01 * rows["nccl"]["time_us"]
    for key in ("method", "status", "time_us", "algbw_GBps", "busbw_GBps", "ratio_to_bound", "synthesis_s", "error"):
        assert key in rows["ring"]
    res = invoke("compare", "-t", "dgx1", "-c", "allreduce", "-s", "1MiB", "--methods", "ring,hierarchical")
    assert res.exit_code == 0, res.output
    assert "bound" in res.output and "ring" in res.output and "multi-box" in res.output


def test_compare_default_methods_cover_registry() -> None:
    """Without --methods every registered method supporting the collective gets a row."""
    doc = compare_json("-t", "ring-8", "-c", "gather", "-s", "64KiB", "--time-limit", "5")
    assert [r["method"] for r in doc["rows"]] == [m for m in METHODS if "gather" in METHODS[m].collectives]


@pytest.mark.parametrize("args, needle", [
    (("-t", "dgx1", "-c", "allreduce", "--methods", "nope"), "unknown method"),
    (("-t", "dgx1", "-c", "allreduce", "--methods", " , "), "names no method"),
    (("-t", "dgx1", "-c", "alltoall", "--methods", "dbt"), "do not support"),
    (("-t", "dgx1", "-c", "allreduce", "--root", "9"), "not a rank"),
    (("-t", "dgx1", "-c", "allreduce", "--time-limit", "0"), "time-limit"),
    (("-t", "dgx1", "-c", "frobnicate"), "unknown collective"),
    (("-t", "no-such-topology", "-c", "allreduce"), ""),
])
def test_compare_bad_input_exit_2(args: tuple[str, ...], needle: str) -> None:
    res = invoke("compare", *args)
    assert res.exit_code == 2
    assert needle in res.output
    assert "Traceback" not in res.output


def test_compare_rooted_and_table_marks_bound() -> None:
    doc = compare_json("-t", "dgx-a100", "-c", "broadcast", "-s", "1MiB", "--root", "3", "--methods", "ring,dbt,nccl")
    assert doc["root"] == 3 and all(r["error"] is None for r in doc["rows"])
    assert all(r["ratio_to_bound"] >= 1 - 1e-9 for r in doc["rows"])
    res = invoke("compare", "-t", "dgx-a100", "-c", "broadcast", "-s", "1MiB", "--root", "3", "--methods", "ring,dbt")
    assert res.exit_code == 0 and "bound" in res.output and "dbt" in res.output


def test_compare_method_crash_is_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import synth.pipeline as pipeline

    real = pipeline.synthesize

    def flaky(topology, collective, size_bytes, method="auto", *args, **kwargs):
        if method == "dbt":
            raise RuntimeError("boom")
        return real(topology, collective, size_bytes, method, *args, **kwargs)

    monkeypatch.setattr(pipeline, "synthesize", flaky)
    doc = compare_json("-t", "dgx-a100", "-c", "allreduce", "-s", "1MiB", "--methods", "ring,dbt")
    rows = {r["method"]: r for r in doc["rows"]}
    assert rows["dbt"]["error"] == "internal: RuntimeError: boom" and rows["ring"]["error"] is None
    assert doc["best"] == "ring"


def test_exact_methods_get_a_deterministic_work_budget_and_no_clock_by_default(monkeypatch) -> None:
    """The rows must not depend on the machine's load: solver work, not seconds, bounds each method
    unless the user asks for a wall-clock safety stop."""
    import synth.cli.cmd_compare as cmd

    seen = []

    def fake_rows(topology, collective, size_bytes, methods, options, root=0, bound_us=None):
        seen.append(options)
        return []

    monkeypatch.setattr(cmd, "compare_rows", fake_rows)
    compare_json("-t", "ring-8", "-c", "allgather", "-s", "1MiB", "--methods", "ring")
    compare_json("-t", "ring-8", "-c", "allgather", "-s", "1MiB", "--methods", "ring", "--work-limit", "3",
                 "--time-limit", "7")
    assert (seen[0].work_limit, seen[0].time_limit) == (cmd.DEFAULT_WORK_LIMIT, None)
    assert (seen[1].work_limit, seen[1].time_limit) == (3.0, 7.0)

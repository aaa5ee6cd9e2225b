"""benchmarks/link_report.py: each link's account adds up to the simulated makespan."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from synth import api
from synth.simulation import simulate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    """benchmarks/ is not a package: load the script as a module (registered, as dataclasses need)."""
    spec = importlib.util.spec_from_file_location("link_report", ROOT / "benchmarks" / "link_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["link_report"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("topology, method", [("dgx1", "ring"), ("dgx-a100-2node", "railblocks")])
def test_rows_add_up(report, topology, method):
    result = api.synthesize(topology, "allgather", "64MiB", method)
    fabric = api.load_topology(topology)
    sim = simulate(result.program, fabric)
    rows = report.link_rows(sim, fabric)
    used = {hop for *_, route in sim.events for hop in route}
    assert {row.link for row in rows} == used
    assert rows[0].tail_us == pytest.approx(0.0, abs=1e-6)     # the last link to end ends the program
    assert [row.end_us for row in rows] == sorted((row.end_us for row in rows), reverse=True)
    alpha = {f"{fabric.node_name(link.src)}->{fabric.node_name(link.dst)}": link.alpha for link in fabric.links}
    for row in rows:
        intervals = [(start, end, route) for *_, start, end, route in sim.events if row.link in route]
        assert row.messages == len(intervals)
        assert row.busy_us == pytest.approx(sum(end - start for start, end, _ in intervals))
        assert row.alpha_us == pytest.approx(sum(sum(alpha[hop] for hop in route) for *_, route in intervals))
        assert 0 <= row.alpha_us <= row.busy_us + 1e-9
        # a link's transfers never overlap (it serves one at a time), so the idle parts and the busy time fill
        # the makespan exactly
        assert row.head_us + row.busy_us + row.gaps_us + row.tail_us == pytest.approx(sim.time_us)


def test_cli_prints_the_rows(report, tmp_path, capsys):
    result = api.synthesize("dgx1", "allgather", "1MiB", "ring")
    path = tmp_path / "ring.xml"
    api.save_program(result.program, path)
    report.main([str(path), "dgx1", "-s", "1MiB", "--top", "3", "--links", "0"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"makespan {result.time_us:.1f} us")
    assert len(out) == 2 + 3 + 1
    assert all(" 0->" in f" {line}" or "->0 " in line for line in out[2:5])
    assert out[-1].startswith("median idle over these links")

"""``auto`` is deterministic: the same topology, collective, SIZE and options write byte-identical programs
on an idle machine and on a loaded one (budgets are deterministic work; the wall clock is only a safety
stop, see ``synth.synthesis.auto``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from synth.topology import generators as gen
from synth.topology.io import save_topology

BUSY = "while True: pass"


def _synthesize(args: list[str], out: Path) -> dict:
    """``synth synthesize ... --json -o out`` in a fresh interpreter; its JSON answer."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "synth", "synthesize", *args, "-o", str(out), "--json"],
                          capture_output=True, text=True, env=env, timeout=300, check=True)
    return json.loads(done.stdout)


def _loaded(args: list[str], out: Path) -> dict:
    """The same run beside two CPU-bound processes (killed after)."""
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        return _synthesize(args, out)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.parametrize("case", ["boxes-allgather-64MiB", "dgx1-allgather-1KiB"])
def test_auto_writes_the_same_bytes_on_an_idle_and_a_loaded_machine(case, tmp_path):
    if case.startswith("boxes"):
        # two boxes of four ranks behind NICs: bandwidth-bound, trees then ring, hierarchical and greedy
        topo = tmp_path / "boxes.yaml"
        save_topology(gen.boxes_behind_nics(2, per_box=4), topo)
        args = ["-t", str(topo), "-c", "allgather", "-s", "64MiB"]
    else:
        # latency-bound: the baselines, then greedy within 1 % of the bound
        args = ["-t", "dgx1", "-c", "allgather", "-s", "1KiB"]
    idle = _synthesize(args, tmp_path / "idle.json")
    busy = _loaded(args, tmp_path / "busy.json")
    ran = [row["method"] for row in idle["tried"] if "time_us" in row]
    assert len(ran) >= 4, idle["tried"]
    assert (tmp_path / "idle.json").read_bytes() == (tmp_path / "busy.json").read_bytes()
    assert [row["method"] for row in busy["tried"] if "time_us" in row] == ran
    assert busy["method"] == idle["method"] and busy["time_us"] == idle["time_us"]
    assert idle["not_tried"] == [] and busy["not_tried"] == []

"""A method written as one file: register() makes it a method like the built-ins, auto included."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.collectives import Collective
from synth.errors import SynthError
from synth.synthesis import auto
from synth.synthesis.base import AutoRule, Instance, MethodSpec, SynthOptions
from synth.synthesis.registry import METHODS, register, registered, unregister
from synth.topology.io import load_topology


# ---- the whole method: the README's "Adding a method" example --------------------------------------------
def direct_ring(inst):
    """Toy: the allgather over the first ring the ring baseline finds, as one ring."""
    from synth.synthesis.ring import find_rings, ring_schedule

    return ring_schedule(inst.topology, inst.collective, inst.size_bytes, inst.options,
                         find_rings(inst.topology)[:1], method="direct-ring")


DIRECT_RING = MethodSpec(name="direct-ring", run=direct_ring, collectives=frozenset({"allgather"}),
                         description="toy: one ring", auto=AutoRule(when=lambda inst: inst.ranks <= 16))


@pytest.fixture
def toy():
    register(DIRECT_RING)
    yield DIRECT_RING
    unregister("direct-ring")


def test_a_registered_method_is_listed_run_compared_swept_and_tried_by_auto(toy, tmp_path):
    runner = CliRunner()
    listed = runner.invoke(cli, ["synthesize", "--list-methods"])
    assert "direct-ring" in listed.output and "toy: one ring" in listed.output

    out = tmp_path / "ag.json"
    made = runner.invoke(cli, ["synthesize", "-t", "ring-8", "-c", "allgather", "-s", "1MiB", "-m", "direct-ring",
                               "-o", str(out), "--json"])
    assert made.exit_code == 0, made.output
    assert json.loads(made.output)["method"] == "direct-ring" and out.exists()

    compared = runner.invoke(cli, ["compare", "-t", "ring-8", "-c", "allgather", "-s", "1MiB",
                                   "--methods", "direct-ring,ring", "--json"])
    assert compared.exit_code == 0, compared.output
    assert "direct-ring" in [row["method"] for row in json.loads(compared.output)["rows"]]

    from synth.sweep import run_sweep

    swept = run_sweep([load_topology("ring-8")], ["allgather"], [2**20], ["direct-ring"], SynthOptions(),
                      cache_dir=None)
    assert [row["method"] for row in swept.rows] == ["direct-ring"] and swept.rows[0]["verified"]

    topology = load_topology("ring-8")
    assert "direct-ring" in auto.candidates(Instance(topology, Collective("allgather", 8), 2**20))
    assert "direct-ring" not in auto.candidates(Instance(topology, Collective("allreduce", 8), 2**20))  # unsupported
    big = load_topology("mi250-2node")
    assert "direct-ring" not in auto.candidates(Instance(big, Collective("allgather", 32), 2**20))   # its rule

    # auto runs its plan with it: 1 GiB on ring-8 is bandwidth-bound, so the tree methods run first and the rest,
    # the toy among them, are listed (run, or skipped once a program is within 1 % of the bound)
    tried = json.loads(runner.invoke(cli, ["synthesize", "-t", "ring-8", "-c", "allgather", "-s", "1GiB",
                                           "-o", str(tmp_path / "auto.json"), "--json"]).output)["tried"]
    assert "direct-ring" in [row["method"] for row in tried]


def test_register_refuses_taken_names_and_unregister_restores(toy):
    with pytest.raises(SynthError, match="already registered"):
        register(MethodSpec(name="ring", run=direct_ring, collectives=frozenset(), description="x"))
    with pytest.raises(SynthError, match="already registered"):
        register(DIRECT_RING)
    assert register(DIRECT_RING, replace=True) is DIRECT_RING
    assert [spec.name for spec in registered()] == ["direct-ring"]
    unregister("direct-ring")
    assert "direct-ring" not in METHODS and registered() == []
    register(DIRECT_RING)        # the fixture unregisters it again


def test_a_method_that_supersedes_others_leaves_them_as_fallbacks():
    """``MethodSpec.supersedes``: where auto plans the method, the methods it names run only if nothing before them
    produced a program (as rsag does for the allreduce's own tree methods); where it is not planned they keep their
    place."""
    stand_in = MethodSpec(name="stand-in", run=direct_ring, collectives=frozenset({"allgather"}),
                          description="toy: stands in for ring", auto=AutoRule(when=lambda inst: inst.ranks <= 8),
                          supersedes=frozenset({"ring"}))
    register(stand_in)
    try:
        small = Instance(load_topology("ring-8"), Collective("allgather", 8), 2**20)
        plan = {c.method: c.fallback for c in auto.plan(small)}
        assert plan["stand-in"] is False and plan["ring"] is True
        wider = Instance(load_topology("torus-4x4"), Collective("allgather", 16), 2**20)
        plan = {c.method: c.fallback for c in auto.plan(wider)}
        assert "stand-in" not in plan and plan["ring"] is False
    finally:
        unregister("stand-in")

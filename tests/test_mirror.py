"""mirror: an allgather or reducescatter (a broadcast or reduce) as the time mirror of trees' program for the other
collective (synth/synthesis/mirror.py)."""

from __future__ import annotations

import pytest

from synth.collectives import Collective
from synth.errors import SynthError
from synth.pipeline import instance, synthesize
from synth.program.lower import lower
from synth.simulation import simulate
from synth.synthesis.auto import plan
from synth.synthesis.mirror import mirrored, reversible
from synth.synthesis.trees import METHOD as TREES
from synth.topology.families import fabric_family
from synth.topology.model import Link, Topology
from synth.verification import verify

GiB = 2**30
FAMILY = {f.name: f for f in fabric_family()}


def _busy(transfers, flip: bool) -> dict[tuple[int, int], float]:
    busy: dict[tuple[int, int], float] = {}
    for x in transfers:
        key = (x.dst, x.src) if flip else (x.src, x.dst)
        busy[key] = busy.get(key, 0.0) + x.end - x.start
    return busy


@pytest.mark.parametrize("name, other", [("allgather", "reducescatter"), ("reducescatter", "allgather")])
def test_the_mirror_is_the_other_collective_with_the_same_makespan_and_link_times(name, other):
    t = FAMILY["torus-4x4"].build()
    found = TREES.run(instance(t, name, GiB))
    mirror = mirrored(found)
    assert mirror.collective.name == other and mirror.collective.chunk_factor == found.collective.chunk_factor
    assert mirror.makespan == pytest.approx(found.makespan)
    assert all(x.reduce == (other == "reducescatter") for x in mirror.transfers)
    # every link holds the mirrored transfers for as long as it held the originals (on its reverse twin)
    before, after = _busy(found.transfers, False), _busy(mirror.transfers, True)
    assert before.keys() == after.keys()
    assert max(abs(before[k] - after[k]) for k in before) < 1e-6
    program = lower(mirror, name="mirror")
    assert verify(program).ok and program.collective == other
    assert simulate(program, t, GiB).time_us == pytest.approx(found.makespan, rel=0.02)


def test_mirror_refuses_another_chunking():
    t = FAMILY["torus-4x4"].build()
    found = TREES.run(instance(t, "allgather", GiB))
    wrong = Collective("reducescatter", t.num_ranks, found.collective.chunk_factor + 1)
    with pytest.raises(SynthError, match="chunks per piece"):
        mirrored(found, wrong)


@pytest.mark.parametrize("name, other", [("reducescatter", "allgather"), ("allgather", "reducescatter")])
def test_the_method_reaches_the_other_collectives_trees_time(name, other):
    t = FAMILY["torus-4x4"].build()
    result = synthesize(t, name, GiB, "mirror")
    assert result.method == "mirror" and verify(result.program).ok and result.program.collective == name
    assert result.schedule.notes["mirror_of"] == other
    assert result.time_us == pytest.approx(synthesize(t, other, GiB, "trees").time_us, rel=0.01)


def test_in_place_reducescatter_mirror():
    t = FAMILY["torus-4x4"].build()
    result = synthesize(t, "reducescatter", GiB, "mirror", inplace=True)
    assert verify(result.program).ok and result.program.inplace


def test_fabrics_unlike_their_reverse_and_other_collectives_are_refused():
    # a four-rank ring whose clockwise links are twice as fast as the others
    links = tuple(Link(r, (r + 1) % 4, 100.0, 0.5) for r in range(4)) + tuple(
        Link((r + 1) % 4, r, 50.0, 0.5) for r in range(4))
    lopsided = Topology("lopsided-ring", 4, links, ())
    assert not reversible(lopsided)
    with pytest.raises(SynthError, match="mirror does not apply"):
        synthesize(lopsided, "allgather", GiB, "mirror")
    with pytest.raises(SynthError, match="does not support allreduce"):
        synthesize(FAMILY["torus-4x4"].build(), "allreduce", GiB, "mirror")


def test_auto_tries_the_mirror_after_trees_up_to_24_ranks():
    names = [c.method for c in plan(instance(FAMILY["mixed-mi250-h100"].build(), "reducescatter", GiB))]
    assert names.index("trees") < names.index("mirror")
    for fabric, collective in (("mi250x2-ib25", "allgather"), ("mixed-mi250-h100", "allreduce")):
        assert "mirror" not in [c.method for c in plan(instance(FAMILY[fabric].build(), collective, GiB))]


@pytest.mark.parametrize("name, other", [("reduce", "broadcast"), ("broadcast", "reduce")])
@pytest.mark.parametrize("root", [0, 5])
def test_a_reduce_is_the_mirror_of_a_broadcast_to_the_same_root(name, other, root):
    # the root's contribution k (chunk root·C + k) and the slot k every rank sums into are the same chunk mirrored
    t = FAMILY["mixed-a100-h100"].build()
    found = TREES.run(instance(t, other, GiB, root=root))
    mirror = mirrored(found)
    assert (mirror.collective.name, mirror.collective.root) == (name, root)
    assert mirror.makespan == pytest.approx(found.makespan)
    program = lower(mirror, name="mirror")
    assert verify(program).ok and program.collective == name
    assert simulate(program, t, GiB).time_us == pytest.approx(found.makespan, rel=0.02)
    result = synthesize(t, name, GiB, "mirror", root=root)
    assert result.time_us == pytest.approx(synthesize(t, other, GiB, "trees", root=root).time_us, rel=0.01)


def test_auto_tries_the_rooted_mirror_up_to_64_ranks():
    names = [c.method for c in plan(instance(FAMILY["mi250x4-ib16"].build(), "reduce", GiB))]
    assert names.index("trees") < names.index("mirror")
    assert "mirror" not in [c.method for c in plan(instance(FAMILY["mi250x8-ib16"].build(), "reduce", GiB))]

"""rsag: an allreduce as trees' best allgather's time mirror (a reduce-scatter) followed by that allgather
(synth/synthesis/rsag.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.errors import SynthError
from synth.lower_bounds import compute_bounds
from synth.pipeline import instance, synthesize
from synth.synthesis.auto import plan
from synth.synthesis.mirror import mirrored
from synth.synthesis.rsag import applies, bounds_add_up, concatenated
from synth.synthesis.trees import METHOD as TREES
from synth.topology.families import fabric_family
from synth.verification import verify

GiB = 2**30
FAMILY = {f.name: f for f in fabric_family()}


def test_concatenation_refuses_phases_of_other_chunkings():
    t = FAMILY["torus-4x4"].build()
    allgather = TREES.run(instance(t, "allgather", GiB))
    other = instance(t, "allreduce", GiB).collective
    with pytest.raises(SynthError, match="chunks per piece"):
        concatenated(mirrored(allgather), allgather, other)


@pytest.mark.parametrize("name", ["torus-4x4", "a100x2"])
def test_the_allreduce_reaches_its_phases_ratio(name):
    t = FAMILY[name].build()
    assert applies(instance(t, "allreduce", GiB))
    result = synthesize(t, "allreduce", GiB, "rsag")
    assert verify(result.program).ok and result.program.collective == "allreduce"
    allgather = synthesize(t, "allgather", GiB, "trees")
    ratio_ag = compute_bounds(t, "allgather", GiB).time_bound_us / allgather.time_us
    ratio_ar = compute_bounds(t, "allreduce", GiB).time_bound_us / result.time_us
    # the bounds add up, so the phases one after the other keep (about) the allgather's ratio
    assert ratio_ar >= ratio_ag - 0.01


def test_fabrics_whose_allreduce_bound_beats_its_phases_are_refused():
    t = FAMILY["mesh-4x4"].build()   # the traffic bound is below the phases' sum: spantree's case
    assert not bounds_add_up(t, float(GiB))
    with pytest.raises(SynthError, match="rsag does not apply.*allreduce bound is below the sum"):
        synthesize(t, "allreduce", GiB, "rsag")
    one_way = _uplinked_boxes(2, 2, 200.0, 50.0)   # the refusal says which condition fails: uplinks slower up
    one_way = replace(one_way, links=tuple(replace(link, alpha=5.0) if one_way.node_name(link.dst) == "spine0"
                                           else link for link in one_way.links))
    with pytest.raises(SynthError, match="not equal to its reverse"):
        synthesize(one_way, "allreduce", GiB, "rsag")
    with pytest.raises(SynthError, match="supports allreduce"):
        synthesize(FAMILY["torus-4x4"].build(), "allgather", GiB, "rsag")


def test_auto_runs_the_phases_instead_of_the_allreduce_trees_above_64_ranks():
    found = plan(instance(FAMILY["mi250x8-ib12.5"].build(), "allreduce", GiB))
    names = [c.method for c in found]
    assert names.index("rsag") < names.index("trees")
    assert next(c for c in found if c.method == "trees").fallback
    assert next(c for c in found if c.method == "greedy").fallback
    four_boxes = plan(instance(FAMILY["mi250x4-ib12.5"].build(), "allreduce", GiB))
    assert "rsag" not in [c.method for c in four_boxes]
    assert not next(c for c in four_boxes if c.method == "trees").fallback
    # where the bound is below the phases' sum nothing changes
    mixed = plan(instance(FAMILY["mixed-mi250-a100"].build(), "allreduce", GiB))
    assert "rsag" not in [c.method for c in mixed]


def _uplinked_boxes(boxes: int, per_box: int, port: float, uplink: float):
    """``boxes`` switches of ``per_box`` ranks (``port`` GB/s), each switch on one ``uplink`` GB/s link to a core
    switch: every box shares one way out (a leaf-spine of one spine)."""
    from synth.topology import generators as gen

    return gen.leaf_spine(boxes, per_box, 1, port, 0.7, uplink_bw=uplink, uplink_alpha=2.0)


def test_auto_runs_the_phases_after_the_allreduce_trees_on_few_ranks():
    t = _uplinked_boxes(3, 4, 200.0, 50.0)
    found = plan(instance(t, "allreduce", GiB))
    names = [c.method for c in found]
    assert names.index("trees") < names.index("rsag")
    assert not any(c.fallback for c in found if c.method in ("trees", "greedy"))
    # past RSAG_BESIDE and up to RSAG_ABOVE ranks the allreduce's own search runs alone (its CPU, auto._rsag)
    assert "rsag" not in [c.method for c in plan(instance(_uplinked_boxes(4, 8, 200.0, 50.0), "allreduce", GiB))]


@pytest.mark.parametrize("boxes, per_box, port, uplink", [(3, 4, 200.0, 50.0), (4, 3, 300.0, 25.0)])
def test_the_phases_win_where_the_allreduce_trees_fall_short(boxes, per_box, port, uplink):
    # each box sends and receives the others' sums over one uplink: the allreduce's own forests (0.85) and
    # leafring (0.87) fall short of the phases (about the allgather's ratio)
    t = _uplinked_boxes(boxes, per_box, port, uplink)
    result = synthesize(t, "allreduce", GiB)
    assert verify(result.program).ok
    assert result.bound_us / result.time_us >= 0.95, [(r.method, r.time_us) for r in result.tried]

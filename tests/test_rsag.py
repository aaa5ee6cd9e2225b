"""rsag: an allreduce as trees' best allgather's time mirror (a reduce-scatter) followed by that allgather
(synth/synthesis/rsag.py)."""

from __future__ import annotations

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
    with pytest.raises(SynthError, match="rsag does not apply"):
        synthesize(t, "allreduce", GiB, "rsag")
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

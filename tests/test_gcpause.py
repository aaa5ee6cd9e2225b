"""synth.gcpause: full collections deferred around a synthesis, thresholds restored after."""

from __future__ import annotations

import gc

import pytest

from synth.gcpause import DEFERRED_THRESHOLD, full_collections_deferred, gc_paused


def _oldest_collections() -> int:
    return gc.get_stats()[2]["collections"]


def test_no_full_collection_inside_and_thresholds_restored():
    before = gc.get_threshold()
    with full_collections_deferred():
        assert gc.get_threshold() == (before[0], before[1], DEFERRED_THRESHOLD)
        assert gc.isenabled()
        full = _oldest_collections()
        # enough long-lived containers for many young and middle collections
        kept = [[i] for i in range(300_000)]
        assert _oldest_collections() == full
        del kept
    assert gc.get_threshold() == before


def test_young_cycles_still_collected():
    with full_collections_deferred():
        gc.collect(0)
        young = gc.get_stats()[0]["collections"]
        for _ in range(50_000):
            cycle: list = []
            cycle.append(cycle)
        assert gc.get_stats()[0]["collections"] > young


def test_thresholds_restored_after_an_exception():
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), full_collections_deferred():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before


def test_synthesize_restores_the_thresholds():
    import synth

    before = gc.get_threshold()
    result = synth.synthesize("ring-8", "allgather", 1 << 20, method="ring")
    assert result.time_us > 0
    assert gc.get_threshold() == before


def test_gc_paused_restores_the_enabled_state():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()

"""Collective semantics: the vectorised queries lower, verify and greedy use agree with the per-slot
``postcondition`` / ``precondition`` oracle, and CollectiveKind behaves as its string."""

import itertools
import json

import numpy as np
import pytest

from synth.collectives import ALL_ORIGINS, COLLECTIVES, Collective, CollectiveKind, canonical_name
from synth.errors import SynthError

CASES = [(n, c, root, inplace) for n, c, root, inplace in itertools.product((1, 3, 4), (1, 2), (0, 2), (False, True))
         if root < n]


def _oracle_destinations(coll: Collective) -> dict[int, dict[int, int]]:
    """chunk -> {rank: output slot}, read off the postcondition (reductions: chunk = input slot)."""
    out: dict[int, dict[int, int]] = {}
    for (r, slot), contribs in coll.postcondition.items():
        chunks = {coll.split_contribution(x)[1] for x in contribs} if coll.is_reduction else contribs
        for chunk in chunks:
            out.setdefault(chunk, {})[r] = slot
    return out


@pytest.mark.parametrize("name", COLLECTIVES)
def test_vectorised_queries_match_the_oracle(name):
    for n, c, root, inplace in CASES:
        coll = Collective(name, n, c, root, inplace)
        post, oracle = coll.postcondition, _oracle_destinations(coll)
        assert coll.schedule_chunks == tuple(sorted(oracle))
        space = np.arange(-1, coll.chunk_space + 1)
        assert space[coll.is_schedule_chunk(space)].tolist() == sorted(oracle)
        # destination_slot over every (rank, schedule chunk)
        ranks, chunks = (a.ravel() for a in np.meshgrid(np.arange(n), np.array(sorted(oracle)), indexing="ij"))
        want = [oracle[k].get(r, -1) for r, k in zip(ranks.tolist(), chunks.tolist(), strict=True)]
        assert coll.destination_slot(ranks, chunks).tolist() == want
        triples = list(zip(*(a.tolist() for a in coll.destinations()), strict=True))
        assert triples == sorted((k, r, s) for k, d in oracle.items() for r, s in d.items())
        # the postcondition as arrays: same slots, in (rank, slot) order, same contribution sets
        pa = coll.postcondition_arrays()
        got = {(r, s): frozenset(coll.contribution(q, i) for q in (range(n) if o == ALL_ORIGINS else (o,)))
               for r, s, i, o in zip(*(a.tolist() for a in pa), strict=True)}
        assert got == post and list(got) == sorted(post)
        # the precondition, as schedule chunks
        for r, s in itertools.product(range(n), range(-1, coll.input_chunks + 1)):
            held = coll.precondition.get((r, s))
            expect = -1 if held is None else (s if coll.is_reduction else held)
            assert int(coll.initial_chunk(r, s)) == expect
        for k in coll.schedule_chunks:
            origins = {coll.split_contribution(x)[0] for s in post.values() for x in s
                       if (coll.split_contribution(x)[1] if coll.is_reduction else x) == k}
            assert set(coll.chunk_sources(k)) == origins & set(coll.source_ranks)


@pytest.mark.parametrize("name", COLLECTIVES)
def test_in_place_aliases_fit_the_buffers(name):
    """An aliased buffer is a window of the other, inside it, and ranks' windows do not overlap."""
    coll = Collective(name, 4, 2, inplace=True)
    size = {"i": coll.input_chunks, "o": coll.output_chunks}
    windows = [coll.alias(r, b) + (b,) for r in range(4) for b in "io" if coll.alias(r, b)]
    assert len(windows) == 4 and all(base + size[b] <= size[t] for t, base, b in windows)
    assert Collective(name, 4, 2).alias(0, "o") is None


def test_kind_is_its_string():
    kind = canonical_name(" All_Reduce ")
    assert kind is CollectiveKind.ALLREDUCE and kind == "allreduce" and f"{kind}" == "allreduce"
    assert json.dumps({"c": kind, kind: 1}) == '{"c": "allreduce", "allreduce": 1}'
    assert Collective("reduce_scatter", 2).name is CollectiveKind.REDUCESCATTER
    assert [str(k) for k in COLLECTIVES] == ["allgather", "reducescatter", "allreduce", "alltoall", "broadcast",
                                             "reduce", "gather", "scatter"]
    with pytest.raises(SynthError, match="unknown collective 'allscatter'"):
        canonical_name("allscatter")

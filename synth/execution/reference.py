"""Deterministic inputs and an independent reference check for executed collectives (torch).

Inputs: input slot ``s`` of rank ``r`` is drawn from a generator seeded by (seed, r, s), so any
rank can regenerate any other rank's input without communication. Integer dtypes get uniform
ints in [-1000, 1000]; float dtypes get standard normals rounded to the dtype.

The expected value of an output slot is read off the collective's postcondition (the set of
contributions it must hold), never from the program:
- copy collectives and integer dtypes: bit-exact (floats compared bit for bit);
- float reductions: ``|out - ref| <= n * eps(dtype) * sum_i |x_i|`` where ``ref`` is the float64
  sum of the n contributions ``x_i`` (already rounded to the dtype). Summing n terms in any order
  (any reduction tree) errs by at most ``(n - 1) * eps/2 * sum |x_i|`` (Higham, *Accuracy and
  Stability of Numerical Algorithms*, 2nd ed., section 4.2); the float64 reference adds at most
  as much again, so the bound holds for every correct program and catches any missing or doubled
  contribution (whose error is about |x_i|, far above the bound).
"""

from __future__ import annotations

import torch

from synth.collectives import Collective

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
         torch.float16: torch.int16}


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def _seed(seed: int, origin: int, slot: int) -> int:
    return ((seed * 1_000_003 + origin) * 1_000_033 + slot) % (1 << 62)


def input_slot(origin: int, slot: int, elems: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """The contents of input slot ``slot`` of rank ``origin`` (CPU tensor of ``elems`` elements)."""
    gen = torch.Generator().manual_seed(_seed(seed, origin, slot))
    if dtype.is_floating_point:
        base = torch.float64 if dtype == torch.float64 else torch.float32
        return torch.randn(elems, generator=gen, dtype=base).to(dtype)
    return torch.randint(-1000, 1001, (elems,), generator=gen, dtype=dtype)


def make_inputs(coll: Collective, rank: int, elems: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s whole input buffer (``input_chunks * elems`` elements)."""
    return torch.cat([input_slot(rank, s, elems, dtype, seed) for s in range(coll.input_chunks)])


def poison(dtype: torch.dtype) -> float | int:
    """A value no correct program leaves in an output slot (outputs are reset to it every run)."""
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


def tolerance_factor(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def check_rank(coll: Collective, rank: int, output_slot, elems: int, dtype: torch.dtype, seed: int = 0,
               max_errors: int = 8) -> list[str]:
    """Compare every output slot the postcondition names for ``rank``; return error lines.

    ``output_slot(slot)`` returns the CPU tensor that holds output slot ``slot`` of this rank.
    """
    errors: list[str] = []

    def contribution(c: int) -> torch.Tensor:
        # regenerated on demand: each rank needs each contribution about once, so no cache
        origin, slot = coll.split_contribution(c)
        return input_slot(origin, slot, elems, dtype, seed)

    for (r, slot), contribs in sorted(coll.postcondition.items()):
        if r != rank:
            continue
        out = output_slot(slot)
        if len(contribs) == 1 and not coll.is_reduction:
            ref = contribution(next(iter(contribs)))
            if dtype in _BITS:
                bad = out.view(_BITS[dtype]) != ref.view(_BITS[dtype])
            else:
                bad = out != ref
        elif dtype.is_floating_point:
            ref = torch.zeros(elems, dtype=torch.float64)
            bound = torch.zeros(elems, dtype=torch.float64)
            for c in sorted(contribs):  # streamed: memory stays O(chunk) for large SIZE
                x = contribution(c).double()
                ref += x
                bound += x.abs()
            bound *= len(contribs) * tolerance_factor(dtype)
            diff = (out.double() - ref).abs()
            bad = ~(diff <= bound)  # NaN counts as wrong
        else:
            acc = torch.zeros(elems, dtype=torch.int64)
            for c in sorted(contribs):
                acc += contribution(c)
            ref = acc.to(dtype)
            bad = out != ref
        nbad = int(bad.sum())
        if nbad:
            j = int(bad.nonzero()[0, 0])
            what = "copy of contribution" if len(contribs) == 1 else f"sum of {len(contribs)} contributions"
            errors.append(f"rank {rank} output chunk {slot}: {nbad}/{elems} elements wrong ({what}), "
                          f"first at element {j}: got {out[j].item()!r}, expected {ref[j].item()!r}")
            if len(errors) >= max_errors:
                errors.append(f"rank {rank}: further output chunks not checked")
                break
    return errors


def check_input(rank: int, actual: torch.Tensor, original: torch.Tensor, elems: int, max_errors: int = 8) -> list[str]:
    """Out-of-place programs must leave the input buffer as the caller filled it (NCCL's ``sendbuff``
    is const; docs/programs.md, "Input buffer"): compare it bit for bit, chunk by chunk."""
    bits = _BITS.get(actual.dtype)
    same = actual.view(bits) == original.view(bits) if bits is not None else actual == original
    if bool(same.all()):
        return []
    errors = []
    bad_chunks = (~same).view(-1, elems).any(dim=1).nonzero().flatten().tolist()
    for k in bad_chunks[:max_errors]:
        part = ~same[k * elems:(k + 1) * elems]
        j = int(part.nonzero()[0, 0])
        errors.append(f"rank {rank} input chunk {k}: {int(part.sum())}/{elems} elements changed by an out-of-place "
                      f"program, first at element {j}: got {actual[k * elems + j].item()!r}, "
                      f"was {original[k * elems + j].item()!r}")
    if len(bad_chunks) > max_errors:
        errors.append(f"rank {rank}: {len(bad_chunks) - max_errors} more input chunks changed")
    return errors

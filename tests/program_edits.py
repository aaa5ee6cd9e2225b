"""Test helpers: a Program with one threadblock's steps edited (the verifier and column tests' faulty programs)."""

from __future__ import annotations

from dataclasses import replace

from synth.program.ir import Program, Step


def with_steps(program: Program, rank: int, tb: int, steps: tuple[Step, ...]) -> Program:
    """``program`` with the steps of threadblock ``tb`` (its index on ``rank``) replaced by ``steps``."""
    gpus = list(program.gpus)
    tbs = list(gpus[rank].threadblocks)
    tbs[tb] = replace(tbs[tb], steps=tuple(steps))
    gpus[rank] = replace(gpus[rank], threadblocks=tuple(tbs))
    return program.with_(gpus=tuple(gpus))


def with_step(program: Program, rank: int, tb: int, index: int, step: Step | None = None, **changes) -> Program:
    """``program`` with step ``index`` of threadblock ``tb`` of ``rank`` replaced by ``step`` (or changed)."""
    steps = list(program.gpus[rank].threadblocks[tb].steps)
    steps[index] = step if step is not None else replace(steps[index], **changes)
    return with_steps(program, rank, tb, tuple(steps))

"""Which threadblocks the runtime-limit step checks must look at, read from the program's step columns
(:mod:`synth.program.columns`)."""

from __future__ import annotations

import numpy as np

from synth.program.columns import NO_KIND, NOP, StepColumns, kind_flags
from synth.program.ir import Program
from synth.runtime_limits import RuntimeProfile


def suspect_threadblocks(columns: StepColumns, program: Program, msccl: bool, limits: RuntimeProfile) -> np.ndarray:
    """Per threadblock (program order), whether the runtime-limit step checks
    (:func:`synth.program.msccl_xml.runtime_limit_errors`) may find anything in it: a step that sends
    or receives without the peer, a type that is no step type, a ``nop`` with a dependency (the chain rule is
    left to the per-step code), and with ``msccl`` too many steps, a depended-on tb id, cnt or an offset over
    the runtime's limits. A numpy bool array."""
    tbs = [tb for gpu in program.gpus for tb in gpu.threadblocks]
    if len(columns.start) != len(tbs) + 1:
        raise ValueError("columns do not match the program's threadblocks")
    tb_of = columns.tb_of
    kind = columns.kind
    known = kind != NO_KIND
    sends, receives, reads, writes = kind_flags(kind)
    no_send = np.array([tb.send < 0 for tb in tbs], dtype=bool)[tb_of]
    no_recv = np.array([tb.recv < 0 for tb in tbs], dtype=bool)[tb_of]
    nop = kind == NOP
    bad = ~known | (sends & no_send) | (receives & no_recv) | (nop & (columns.depid >= 0))
    if msccl:
        real = known & ~nop
        bad |= columns.depid > limits.max_depended_tb
        bad |= real & ((columns.cnt < 1) | (columns.cnt > limits.max_step_chunks)
                       | (reads & (columns.srcoff > limits.max_offset))
                       | (writes & (columns.dstoff > limits.max_offset)))
    suspect = np.zeros(len(tbs), dtype=bool)
    suspect[tb_of[bad]] = True
    if msccl:
        suspect |= np.diff(columns.start) > limits.max_steps_per_tb
    return suspect

"""Program stage: rank-level threadblocks and steps (the content of MSCCL XML and synth JSON)."""

from synth.program.ir import Gpu, Program, Step, Threadblock

__all__ = ["Gpu", "Program", "Step", "Threadblock"]

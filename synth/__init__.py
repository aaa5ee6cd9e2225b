"""synth: synthesis of collective-communication schedules with provable optimality gaps.

Pipeline (one IR per stage, data flows one way):
Topology -> Collective -> Formulation -> Solver -> Schedule -> Program -> XML/JSON, verify, simulate, execute.
"""

__version__ = "0.1.0"

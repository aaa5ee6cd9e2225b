"""synth: synthesis of collective-communication schedules with provable optimality gaps.

Pipeline (one IR per stage, data flows one way):
Topology -> Collective -> Formulation -> Solver -> Schedule -> Program -> XML/JSON, verify, simulate, execute.

The public API (each call takes plain values: a built-in name or file, a collective name, a size such as "1GiB"):

- :func:`load_topology` -- a built-in or a YAML/JSON fabric file
- :func:`bounds` -- lower bounds on a collective's time
- :func:`synthesize` -- a verified, simulated program, with its time, bound and gap
- :func:`verify`, :func:`simulate`, :func:`execute` -- check, time, or run a program
- :func:`save_program`, :func:`load_program` -- MSCCL XML or JSON program files
- :func:`methods`, :func:`run_sweep` -- the registered methods; a grid of topologies x collectives x sizes x methods

>>> import synth
>>> result = synth.synthesize("dgx1", "allgather", "64MiB")   # doctest: +SKIP
>>> synth.save_program(result.program, "dgx1-allgather.xml")  # doctest: +SKIP
"""

from synth.api import (
    bounds,
    execute,
    load_program,
    load_topology,
    methods,
    run_sweep,
    save_program,
    simulate,
    synthesize,
    verify,
)

__version__ = "0.1.0"
__all__ = ["load_topology", "bounds", "synthesize", "verify", "simulate", "execute", "save_program", "load_program",
           "methods", "run_sweep"]

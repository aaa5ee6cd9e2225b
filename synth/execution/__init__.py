"""Real execution of Programs with torch.distributed (``synth execute``).

- :mod:`synth.execution.plan`: the program simulated once in waves -> per-rank op lists (pure Python);
- :mod:`synth.execution.worker`: one rank: buffers, replay, timing, check;
- :mod:`synth.execution.reference`: deterministic inputs and the independent output check;
- :mod:`synth.execution.runner`: ``execute(program, ...)`` / ``execute_many``: launch (fork, spawn or torchrun);
- :mod:`synth.execution.samples`: hand-written programs for every collective.

Import the submodules directly: torch is only imported by worker, reference and runner's callers.
"""

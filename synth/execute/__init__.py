"""Real execution of Programs with torch.distributed (``synth execute``).

- :mod:`synth.execute.plan`: the program simulated once in waves -> per-rank op lists (pure Python);
- :mod:`synth.execute.worker`: one rank: buffers, replay, timing, check;
- :mod:`synth.execute.reference`: deterministic inputs and the independent output check;
- :mod:`synth.execute.runner`: ``execute(program, ...)`` / ``execute_many``: launch (fork, spawn or torchrun);
- :mod:`synth.execute.samples`: hand-written programs for every collective.

Import the submodules directly: torch is only imported by worker, reference and runner's callers.
"""

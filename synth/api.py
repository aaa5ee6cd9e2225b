"""The public Python API: what one ``synth`` command does, as one call on plain values.

Every function takes plain values (a built-in name or a file path for the topology, a collective name, a size
such as ``"1GiB"`` or an int of bytes) as well as the objects the stages use. The stage modules are imported
inside each function, so ``import synth`` stays cheap (the solvers take seconds to import).

Example
-------
>>> import synth
>>> result = synth.synthesize("dgx1", "allgather", "64MiB")      # doctest: +SKIP
>>> result.time_us, result.bound_us, result.gap                   # doctest: +SKIP
>>> synth.save_program(result.program, "dgx1-allgather.xml")      # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synth.execution.runner import ExecResult
    from synth.lower_bounds import Bounds
    from synth.pipeline import SynthesisResult
    from synth.program.ir import Program
    from synth.simulation import SimResult
    from synth.sweep import SweepResult
    from synth.topology.model import Topology
    from synth.verification import VerifyResult

__all__ = ["load_topology", "bounds", "synthesize", "verify", "simulate", "execute", "save_program", "load_program",
           "methods", "run_sweep"]


def _topology(topology: Topology | str | os.PathLike) -> Topology:
    from synth.topology.model import Topology

    return topology if isinstance(topology, Topology) else load_topology(topology)


def _size(size: str | int) -> int:
    from synth.units import parse_size

    return parse_size(size)


def _program(program: Program | str | os.PathLike) -> Program:
    from synth.program.ir import Program

    return program if isinstance(program, Program) else load_program(program)


def _options(options: dict):
    """:class:`~synth.synthesis.base.SynthOptions` of keyword arguments; SynthError naming unknown ones."""
    from synth.errors import SynthError
    from synth.synthesis.base import SynthOptions

    known = set(SynthOptions.__dataclass_fields__) - {"extra"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise SynthError(f"unknown option(s) {', '.join(unknown)}; options are {', '.join(sorted(known))}")
    return SynthOptions(**options)


def load_topology(name_or_path: str | os.PathLike) -> Topology:
    """Load a topology: a YAML/JSON file, or a built-in by name.

    Parameters
    ----------
    name_or_path : str or path
        A file path, or the name of a built-in (``synth topology list``), e.g. ``"dgx-a100-2node"``.

    Returns
    -------
    Topology
        The validated fabric (ranks, switches, α-β links).

    Examples
    --------
    >>> import synth
    >>> synth.load_topology("dgx1").num_ranks
    8
    """
    from synth.topology.io import load_topology as load

    return load(name_or_path)


def bounds(topology: Topology | str, collective: str, size: str | int = "1GiB", *, root: int = 0) -> Bounds:
    """Lower bounds on the time of ``collective`` of ``size`` on ``topology`` (as ``synth bounds``).

    Parameters
    ----------
    topology : Topology or str
        The fabric, or a built-in name / file path.
    collective : str
        ``allgather``, ``reducescatter``, ``allreduce``, ``alltoall``, ``broadcast``, ``reduce``, ``gather``
        or ``scatter``.
    size : str or int
        The buffer SIZE (nccl-tests convention, see ``docs/units.md``): ``"1GiB"``, ``"64M"`` or bytes.
    root : int
        The root of rooted collectives.

    Returns
    -------
    Bounds
        ``bandwidth_bound_us``, ``latency_bound_us``, ``time_bound_us`` (their max) and ``details`` (how).

    Examples
    --------
    >>> import synth
    >>> round(synth.bounds("dgx-a100", "allgather", "1GiB").time_bound_us, 1)
    3131.6
    """
    from synth.collectives import canonical_name
    from synth.lower_bounds import compute_bounds

    return compute_bounds(_topology(topology), canonical_name(collective), _size(size), root=root)


def synthesize(topology: Topology | str, collective: str, size: str | int = "1GiB", method: str = "auto", *,
               root: int = 0, inplace: bool = False, **options) -> SynthesisResult:
    """Synthesize, verify and simulate a program (as ``synth synthesize``).

    Parameters
    ----------
    topology : Topology or str
        The fabric, or a built-in name / file path.
    collective : str
        The collective's name.
    size : str or int
        The buffer SIZE, e.g. ``"1GiB"``.
    method : str
        A registered method (``synth synthesize --list-methods``) or ``"auto"``.
    root : int
        The root of rooted collectives.
    inplace : bool
        Emit an in-place program.
    **options
        Fields of :class:`synth.synthesis.base.SynthOptions`: ``solver``, ``time_limit``, ``gap``, ``threads``,
        ``chunks``, ``max_trees``, ``runtime_chunks``.

    Returns
    -------
    SynthesisResult
        ``program`` (verified), ``time_us`` (simulated), ``bound_us``, ``gap``, ``method``, ``status``.

    Raises
    ------
    SynthError
        Bad input, an unsupported request, or a method that found no verified program.

    Examples
    --------
    >>> import synth
    >>> r = synth.synthesize("dgx1", "allgather", "64MiB")      # doctest: +SKIP
    >>> r.gap < 0.02                                             # doctest: +SKIP
    True
    """
    from synth.pipeline import synthesize as run

    return run(_topology(topology), collective, _size(size), method, _options(options), root=root, inplace=inplace)


def verify(program: Program | str | os.PathLike, collective: str | None = None) -> VerifyResult:
    """Check symbolically that ``program`` computes its collective (as ``synth verify``).

    Parameters
    ----------
    program : Program or path
        A program, or an MSCCL XML / JSON program file.
    collective : str, optional
        The collective to check against; by default the one the program declares.

    Returns
    -------
    VerifyResult
        ``ok`` and, when not, ``errors`` naming rank and chunk.

    Examples
    --------
    >>> import synth
    >>> synth.verify(synth.synthesize("dgx1", "allgather", "1MiB", "ring").program).ok   # doctest: +SKIP
    True
    """
    from synth.program.load import load_program_format
    from synth.verification import verify as check

    if isinstance(program, (str, os.PathLike)):
        loaded, fmt = load_program_format(program)
        return check(loaded, collective, msccl_limits=fmt == "xml")   # an XML file must load in the runtimes
    return check(program, collective)


def simulate(program: Program | str | os.PathLike, topology: Topology | str, size: str | int | None = None
             ) -> SimResult:
    """Time ``program`` on ``topology`` under the α-β model of ``docs/cost-model.md`` (as ``synth simulate``).

    Parameters
    ----------
    program : Program or path
        A program or a program file.
    topology : Topology or str
        The fabric it runs on; it must have the content the program records (``fabric.sha256``), if any.
    size : str or int, optional
        The buffer SIZE; by default the size the program was made for.

    Returns
    -------
    SimResult
        ``time_us``, ``algbw_GBps``, ``busbw_GBps`` and link utilisation.

    Raises
    ------
    SynthError
        ``topology`` has other content than the fabric the program was made for.

    Examples
    --------
    >>> import synth
    >>> r = synth.synthesize("dgx1", "allgather", "64MiB", "ring")                  # doctest: +SKIP
    >>> synth.simulate(r.program, "dgx1", "64MiB").time_us == r.time_us             # doctest: +SKIP
    True
    """
    from synth.program.fabric import check_fabric
    from synth.simulation import simulate as run

    program, topology = _program(program), _topology(topology)
    check_fabric(program, topology, "the topology given")
    return run(program, topology, None if size is None else _size(size))


def execute(program: Program | str | os.PathLike, size: str | int = "1MiB", *, backend: str = "gloo",
            **kwargs) -> ExecResult:
    """Run ``program`` for real with torch.distributed, one process per rank (as ``synth execute``).

    Needs the ``exec`` extra (torch). Each rank's output is checked against the collective's reference.

    Parameters
    ----------
    program : Program or path
        A program or a program file.
    size : str or int
        The buffer SIZE to run.
    backend : str
        ``gloo`` (CPU) or ``nccl`` (CUDA).
    **kwargs
        ``dtype``, ``iters``, ``warmup``, ``timeout``, ``seed`` of :func:`synth.execution.runner.execute_many`.

    Returns
    -------
    ExecResult
        ``ok``, per-iteration times and any wrong outputs.

    Examples
    --------
    >>> import synth
    >>> synth.execute(synth.synthesize("ring-8", "allreduce", "1MiB", "ring").program).ok   # doctest: +SKIP
    True
    """
    from synth.execution.runner import execute as run

    return run(_program(program), backend=backend, size_bytes=_size(size), **kwargs)


def save_program(program: Program, path: str | os.PathLike, *, coll_spelling: str | None = None,
                 runtime: str = "msccl-executor") -> Path:
    """Write ``program`` atomically as MSCCL XML (``.xml``, runtime limits checked) or JSON (``.json``).

    Parameters
    ----------
    program : Program
        The program, e.g. ``synthesize(...).program``.
    path : str or path
        The file to write; its suffix picks the format.
    coll_spelling : str or None
        MSCCL ``coll`` spelling of reduce-scatter (``reducescatter`` or ``reduce_scatter``); None: the runtime's.
    runtime : str
        ``msccl-executor`` (Azure/msccl-executor-nccl) or ``msccl`` (microsoft/msccl): the XML's attribute set,
        ``coll`` spelling and limits (docs/programs.md, "Runtimes"). Its ``minBytes``/``maxBytes`` are the
        program's; :func:`synth.runtimes.byte_range` gives the ones a runtime selects at a SIZE.

    Returns
    -------
    Path
        The path written.

    Examples
    --------
    >>> import synth
    >>> synth.save_program(synth.synthesize("dgx1", "allgather", "1MiB").program, "ag.xml")   # doctest: +SKIP
    """
    from synth.program.load import save_program as save

    return save(program, path, coll_spelling=coll_spelling, runtime=runtime)


def load_program(path: str | os.PathLike) -> Program:
    """Read an MSCCL XML or JSON program file.

    Parameters
    ----------
    path : str or path
        The file.

    Returns
    -------
    Program
        The per-rank program.

    Examples
    --------
    >>> import synth
    >>> synth.load_program("ag.xml").num_ranks      # doctest: +SKIP
    8
    """
    from synth.program.load import load_program as load

    return load(path)


def methods() -> list[str]:
    """The registered synthesis methods (``synth synthesize --list-methods``), in registry order.

    Examples
    --------
    >>> import synth
    >>> "ring" in synth.methods()
    True
    """
    from synth.synthesis.registry import METHODS

    return list(METHODS)


def run_sweep(topologies, collectives, sizes, methods=("auto",), *, root: int = 0,
          cache_dir: str | os.PathLike | None = None, **options) -> SweepResult:
    """Every topology x collective x size x method through the pipeline (as ``synth sweep``).

    Parameters
    ----------
    topologies : sequence of Topology or str
        Fabrics, or built-in names / file paths.
    collectives : sequence of str
        Collective names.
    sizes : sequence of str or int
        Buffer SIZEs, e.g. ``["1K", "64M"]``.
    methods : sequence of str
        Registered methods or ``"auto"``.
    root : int
        The root of rooted collectives.
    cache_dir : str or path, optional
        Where finished rows are kept between runs (None: no cache).
    **options
        Fields of :class:`synth.synthesis.base.SynthOptions`, as for :func:`synthesize`.

    Returns
    -------
    SweepResult
        ``rows`` (one dict per cell with the ``synth sweep --json`` keys: method, status, time_us, bound_us,
        gap, verified, ...), and the counts ``computed``, ``cached`` and ``failed``.

    Examples
    --------
    >>> import synth
    >>> result = synth.run_sweep(["dgx1"], ["allgather"], ["1M"], ["ring"])      # doctest: +SKIP
    >>> result.rows[0]["verified"]                                            # doctest: +SKIP
    True
    """
    from synth.sweep import run_sweep as run

    return run([_topology(t) for t in topologies], list(collectives), [_size(s) for s in sizes],
                     list(methods), _options(options), root=root, cache_dir=cache_dir)

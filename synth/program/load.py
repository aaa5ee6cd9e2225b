"""Read and write program files: MSCCL XML (``.xml``) or JSON program (``.json``)."""

from __future__ import annotations

import os
from pathlib import Path

from synth.errors import SynthError
from synth.fileio import atomic_write_chunks, read_input_text
from synth.program.ir import Program


def load_program(path: str | os.PathLike) -> Program:
    """Load a program; the format comes from the extension, else from the first character (< or {)."""
    return load_program_format(path)[0]


def load_program_format(path: str | os.PathLike) -> tuple[Program, str]:
    """``load_program`` and the format it read: ``"xml"``, ``"json"`` or ``"sccl"`` (an msccl-tools algorithm);
    verify holds XML to the runtimes."""
    p = Path(path)
    return parse_program_text(read_input_text(p, "program file"), p)


def parse_program_text(text: str, path: str | os.PathLike) -> tuple[Program, str]:
    """:func:`load_program_format` of a file's ``text`` already read (a FIFO can be read only once)."""
    from synth.program.json_io import program_from_json
    from synth.program.msccl_xml import program_from_xml

    p = Path(path)
    ext = p.suffix.lower()
    head = text.lstrip()[:1]
    if ext == ".xml" or (ext != ".json" and head == "<"):
        return program_from_xml(text, str(p)), "xml"
    if ext == ".json" or head == "{":
        from synth.program.sccl import is_sccl_algorithm, program_from_sccl

        doc = _json_or_none(text)
        if is_sccl_algorithm(doc):   # msccl-tools' .msccl.json (docs/programs.md, "SCCL algorithms")
            return program_from_sccl(doc, str(p)), "sccl"
        return program_from_json(text, str(p)), "json"
    raise SynthError(f"{p}: not a program file (expected MSCCL XML or a synth JSON program)")


def _json_or_none(text: str):
    """The decoded JSON, or None when it is not JSON (the JSON reader then names the problem)."""
    import json

    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def save_program(program: Program, path: str | os.PathLike, coll_spelling: str | None = "reduce_scatter",
                 check_limits: bool = True, runtime: str | None = None) -> Path:
    """Write ``program`` atomically; ``.xml`` is MSCCL XML (runtime limits checked first), else JSON.

    The text is streamed to a temporary file piece by piece (:func:`synth.program.msccl_xml.iter_program_xml`,
    :func:`synth.program.json_io.iter_program_json`), so a program of millions of steps is never one string in
    memory; the file gets its name only when complete, and a failure part way leaves none (docs/programs.md,
    "Writing programs"). ``runtime`` (``msccl-executor`` or ``msccl``, :mod:`synth.runtime_limits`) writes that
    runtime's attribute set and ``coll`` spelling (``coll_spelling`` None) and checks its limits."""
    from synth.program.json_io import iter_program_json
    from synth.program.msccl_xml import check_no_switch_steps, check_runtime_limits, iter_program_xml

    p = Path(path)
    if p.suffix.lower() == ".xml":
        check_no_switch_steps(program)
        program = _selectable(program, runtime)
        if check_limits:
            check_runtime_limits(program, runtime=runtime)
        pieces = iter_program_xml(program, coll_spelling=coll_spelling, runtime=runtime)
    elif p.suffix.lower() == ".json":
        pieces = iter_program_json(program)
    else:
        raise SynthError(f"{p}: program files end in .xml (MSCCL XML) or .json (JSON program)")
    try:
        return atomic_write_chunks(p, pieces)
    except OSError as exc:
        raise SynthError(f"{p}: cannot write program file ({exc})") from None


def _selectable(program: Program, runtime: str | None) -> Program:
    """For a runtime with no unbounded ``maxBytes`` (microsoft/msccl), a program's ``max_bytes`` of 0 ("no
    limit" elsewhere) would make it never selected: give it the range that selects its SIZE
    (:func:`synth.runtimes.byte_range`), or refuse when it records no SIZE."""
    from synth.runtime_limits import runtime_profile
    from synth.runtimes import byte_range

    if runtime is None or program.max_bytes != 0:
        return program
    profile = runtime_profile(runtime)
    if profile.max_bytes_unbounded is not None:
        return program
    if not program.size_bytes:
        raise SynthError(f"maxBytes=0 selects nothing in {profile.repo} and the program records no SIZE; set "
                         "min_bytes/max_bytes (synth.runtimes.byte_range) before writing it")
    low, high = byte_range(profile, int(program.size_bytes), program.min_bytes or None, None)
    return program.with_(min_bytes=low, max_bytes=high)

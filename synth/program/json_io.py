"""JSON program: the content of the MSCCL XML plus synth metadata (docs/programs.md).

Described by ``synth/program/schema.json`` (shipped in the package, read with importlib.resources)
and validated on load. Steps are compact arrays in the order of ``STEP_FIELDS`` so that programs with
millions of steps stay small and quick to validate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from functools import lru_cache
from importlib import resources

from synth.errors import SynthError
from synth.program.ir import (
    BUFFERS,
    STEP_TYPES,
    Fabric,
    Gpu,
    Program,
    Step,
    SwitchOp,
    SwitchProgram,
    Threadblock,
    switch_op_problem,
)
from synth.runtime_limits import MAX_PARSE_BUFFER_CHUNKS, MAX_PARSE_TOTAL_CHUNKS, parse_capped

FORMAT = "synth-program"
VERSION = 1
# Version 2 adds the top-level ``switches`` (in-network steps, docs/programs.md "Switch steps"); a program
# without switches is written as version 1, byte for byte as before.
SWITCH_VERSION = 2
VERSIONS = (VERSION, SWITCH_VERSION)
SWITCH_OP_FIELDS = ("type", "srcs", "dsts", "cnt", "chan")
STEP_FIELDS = ("type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")


@lru_cache(maxsize=1)
def program_schema() -> dict:
    """The JSON Schema of a JSON program."""
    return json.loads(resources.files("synth.program").joinpath("schema.json").read_text(encoding="utf-8"))


def _strict_class(schema: dict):
    """The schema's validator class with "integer" meaning a JSON integer: jsonschema also takes an integral
    float (``-0.0``, ``4.0``), which reached the program as a float offset (a TypeError in the verifier)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    checker = cls.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    return jsonschema.validators.extend(cls, type_checker=checker)


@lru_cache(maxsize=1)
def _validator():
    schema = program_schema()
    cls = _strict_class(schema)
    cls.check_schema(schema)
    return cls(schema)


def _number(x):
    """Non-finite metadata (an unknown time) is written as null; numpy scalars as plain numbers."""
    if x is None:
        return None
    x = x.item() if hasattr(x, "item") else x
    return x if math.isfinite(x) else None


def _plain(value):
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def _step_row(st: Step) -> list:
    """A step as its JSON array, in the order of ``STEP_FIELDS``."""
    return [st.type, st.srcbuf, st.srcoff, st.dstbuf, st.dstoff, st.cnt, st.depid, st.deps, int(st.hasdep)]


def program_to_dict(program: Program, steps: bool = True) -> dict:
    """The JSON document of ``program``; ``steps`` False leaves every threadblock's ``steps`` out (the streaming
    writer encodes them piece by piece)."""
    def tb_dict(tb: Threadblock) -> dict:
        out = {"id": tb.id, "send": tb.send, "recv": tb.recv, "chan": tb.chan}
        if steps:
            out["steps"] = [_step_row(st) for st in tb.steps]
        return out

    doc = {
        "format": FORMAT, "version": SWITCH_VERSION if program.switches else VERSION,
        "name": program.name, "collective": program.collective,
        "num_ranks": program.num_ranks, "root": program.root, "inplace": program.inplace,
        "proto": program.proto, "nchannels": program.nchannels, "nchunksperloop": program.nchunksperloop,
        "min_bytes": program.min_bytes, "max_bytes": program.max_bytes, "topology": program.topology,
        "chunk_factor": program.chunk_factor, "size_bytes": _number(program.size_bytes),
        "chunk_bytes": _number(program.chunk_bytes), "predicted_time_us": _number(program.predicted_time_us),
        "extra": program.extra if isinstance(program.extra, dict) else {},
        **({"fabric": _fabric_to_dict(program.fabric)} if program.fabric is not None else {}),
        "step_fields": list(STEP_FIELDS),
        "gpus": [{"id": g.id, "i_chunks": g.i_chunks, "o_chunks": g.o_chunks, "s_chunks": g.s_chunks,
                  "threadblocks": [tb_dict(tb) for tb in g.threadblocks]}
                 for g in program.gpus],
    }
    if program.switches:
        doc["switches"] = [{"name": sw.name, "ops": [[op.type, list(op.srcs), list(op.dsts), op.cnt, op.chan]
                                                      for op in sw.ops]} for sw in program.switches]
    return doc


def _fabric_to_dict(fabric: Fabric) -> dict:
    from synth.topology.io import topology_to_dict

    doc = {"name": fabric.name, "sha256": fabric.sha256, "source": fabric.source}
    if fabric.topology is not None:
        doc["topology"] = topology_to_dict(fabric.topology)
    return doc


def _fabric_from_dict(doc: dict, source: str) -> Fabric:
    """The ``fabric`` entry; an embedded topology must hash to the recorded sha256 (else the file was edited)."""
    from synth.topology.io import parse_topology

    topology = None
    if "topology" in doc:
        topology = parse_topology(doc["topology"], f"{source}: fabric.topology")
        if topology.sha256 != doc["sha256"]:
            raise SynthError(f"{source}: the embedded fabric.topology has sha256 {topology.sha256[:12]}, not the "
                             f"recorded fabric.sha256 {doc['sha256'][:12]}; the file was edited: synthesize it again")
    return Fabric(name=doc["name"], sha256=doc["sha256"], source=doc["source"], topology=topology)


def program_to_json(program: Program) -> str:
    """Compact JSON text (programs can have millions of steps): the pieces of :func:`iter_program_json` joined."""
    return "".join(iter_program_json(program))


#: Steps per piece of :func:`iter_program_json`.
JSON_STEPS_PER_PIECE = 4096


def iter_program_json(program: Program) -> Iterator[str]:
    """The compact JSON text of ``program`` in pieces, for streaming to a file
    (:func:`synth.fileio.atomic_write_chunks`).

    The same bytes as ``json.dumps(program_to_dict(program), separators=(",", ":"))`` plus a newline, without
    building the document: the metadata comes first (every top-level field before ``gpus``; metadata that JSON
    cannot hold is refused before it is yielded), then one piece per threadblock, or per
    :data:`JSON_STEPS_PER_PIECE` steps of a longer one, then the switches. Raises SynthError for a value JSON
    cannot hold (NaN in ``extra``, a non-finite step field), wherever it is."""
    encode = _ENCODER.encode
    doc = program_to_dict(program, steps=False)
    gpus, switches = doc.pop("gpus"), doc.pop("switches", None)
    head = _encoded(encode, doc, program)
    yield head[:-1] + ',"gpus":['
    for g, gpu in enumerate(program.gpus):
        tbs = gpus[g].pop("threadblocks")
        piece = ("," if g else "") + _encoded(encode, gpus[g], program)[:-1] + ',"threadblocks":['
        for t, tb in enumerate(gpu.threadblocks):
            piece += ("," if t else "") + _encoded(encode, tbs[t], program)[:-1] + ',"steps":['
            steps = tb.steps
            for start in range(0, len(steps), JSON_STEPS_PER_PIECE):
                rows = [_step_row(st) for st in steps[start:start + JSON_STEPS_PER_PIECE]]
                yield piece + ("," if start else "") + _encoded(encode, rows, program)[1:-1]
                piece = ""
            piece += "]}"
        yield piece + "]}"
    tail = "]"
    if switches is not None:
        tail += ',"switches":' + _encoded(encode, switches, program)
    yield tail + "}\n"


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_plain)


def _encoded(encode, value, program: Program) -> str:
    """``value`` as compact JSON, or the SynthError naming ``program`` that says why it cannot be."""
    try:
        return encode(value)
    except (TypeError, ValueError) as exc:
        raise SynthError(f"program {program.name!r} cannot be written as JSON: {exc}") from None


def _where(path) -> str:
    return "/".join(str(p) for p in path) or "(top level)"


def _first_error(instance, validator) -> tuple[list, str] | None:
    error = next(iter(sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))), None)
    return None if error is None else (list(error.absolute_path), error.message)


@lru_cache(maxsize=1)
def _step_validator():

    schema = program_schema()
    return _strict_class(schema)({**schema["$defs"]["step"], "$defs": schema["$defs"]})


_STEP_TYPES = frozenset(STEP_TYPES)
_BUFFERS = frozenset(BUFFERS)


def _plain_step(step) -> bool:
    """The common well-formed step, checked without jsonschema (which costs ~250 µs a step); anything else
    goes to the schema for its verdict and message."""
    if type(step) is not list or len(step) != 9:
        return False
    kind, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, deps, hasdep = step
    if type(kind) is not str or type(srcbuf) is not str or type(dstbuf) is not str:  # a list or dict is unhashable
        return False
    return (kind in _STEP_TYPES and srcbuf in _BUFFERS and dstbuf in _BUFFERS and type(srcoff) is int
            and type(dstoff) is int and type(cnt) is int and type(depid) is int and depid >= -1
            and type(deps) is int and deps >= -1 and type(hasdep) is int and hasdep in (0, 1))


def _schema_error(doc: dict) -> str | None:
    """``PATH: message`` of the first schema violation, or None. The document without its step arrays goes
    through jsonschema; the steps are checked by :func:`_plain_step` and only odd ones by the schema."""
    gpus = doc.get("gpus")
    step_lists = []
    skeleton = doc
    if isinstance(gpus, list) and all(isinstance(g, dict) and isinstance(g.get("threadblocks"), list) for g in gpus):
        new_gpus = []
        for gi, g in enumerate(gpus):
            tbs = []
            for ti, tb in enumerate(g["threadblocks"]):
                if isinstance(tb, dict) and isinstance(tb.get("steps"), list):
                    step_lists.append((gi, ti, tb["steps"]))
                    tb = {**tb, "steps": []}
                tbs.append(tb)
            new_gpus.append({**g, "threadblocks": tbs})
        skeleton = {**doc, "gpus": new_gpus}
    found = _first_error(skeleton, _validator())
    if found is not None:
        return f"{_where(found[0])}: {found[1]}"
    for gi, ti, steps in step_lists:
        for si, step in enumerate(steps):
            if not _plain_step(step):
                found = _first_error(step, _step_validator())
                if found is not None:
                    path = ["gpus", gi, "threadblocks", ti, "steps", si, *found[0]]
                    return f"{_where(path)}: {found[1]}"
    return None


def _check_buffer_sizes(gpus: list[dict], source: str) -> None:
    """The caps the XML reader puts on buffer sizes (synth.runtime_limits): checked before the verifier sizes its
    buffers from them (s_chunks=2**31 ran out of memory)."""
    total = 0
    for g in gpus:
        where = f"{source}: gpu {g['id']}"
        for key in ("i_chunks", "o_chunks", "s_chunks"):
            total += parse_capped(g[key], MAX_PARSE_BUFFER_CHUNKS, key, where)
        parse_capped(total, MAX_PARSE_TOTAL_CHUNKS, "the buffers' chunks so far", where)


def program_from_dict(doc, source: str = "<json>") -> Program:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SynthError(f"{source}: not a synth JSON program (missing \"format\": \"{FORMAT}\")")
    if doc.get("version") not in VERSIONS or isinstance(doc.get("version"), bool):
        raise SynthError(f"{source}: JSON program version {doc.get('version')!r} is not supported "
                         f"(this synth reads versions {VERSION} and {SWITCH_VERSION})")
    if "switches" in doc and doc["version"] != SWITCH_VERSION:
        raise SynthError(f"{source}: \"switches\" needs \"version\": {SWITCH_VERSION} (in-network steps, "
                         "docs/programs.md)")
    try:
        error = _schema_error(doc)
    except RecursionError:   # jsonschema recurses per level (and repr in its message): a value ~1000 deep
        raise SynthError(f"{source}: invalid JSON program: a value is nested too deeply") from None
    if error is not None:
        raise SynthError(f"{source}: invalid JSON program at {error}")
    _check_buffer_sizes(doc["gpus"], source)
    gpus = []
    for g in doc["gpus"]:
        tbs = tuple(Threadblock(id=tb["id"], send=tb["send"], recv=tb["recv"], chan=tb["chan"],
                                steps=tuple(Step(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], bool(s[8]))
                                            for s in tb["steps"]))
                    for tb in g["threadblocks"])
        gpus.append(Gpu(id=g["id"], i_chunks=g["i_chunks"], o_chunks=g["o_chunks"], s_chunks=g["s_chunks"],
                        threadblocks=tbs))
    ids = [g.id for g in gpus]
    if len(ids) != doc["num_ranks"] or ids != list(range(len(ids))):   # num_ranks may be any huge integer
        shown = ", ".join(map(str, ids[:16])) + (f", ... ({len(ids)} gpus)" if len(ids) > 16 else "")
        raise SynthError(f"{source}: num_ranks={doc['num_ranks']} but gpu ids are [{shown}] "
                         f"(expected 0..{doc['num_ranks'] - 1} in order)")
    switches = _switches_from_doc(doc, source)
    if doc["version"] == SWITCH_VERSION:
        _check_switch_peers(gpus, doc["num_ranks"], switches, source)
    return Program(
        name=doc["name"], collective=doc["collective"], num_ranks=doc["num_ranks"], gpus=tuple(gpus),
        inplace=doc.get("inplace", False), proto=doc.get("proto", "Simple"), nchannels=doc.get("nchannels", 1),
        nchunksperloop=doc.get("nchunksperloop", 1), root=doc.get("root", 0), min_bytes=doc.get("min_bytes", 0),
        max_bytes=doc.get("max_bytes", 0), topology=doc.get("topology"), chunk_factor=doc.get("chunk_factor"),
        size_bytes=doc.get("size_bytes"), chunk_bytes=doc.get("chunk_bytes"),
        predicted_time_us=doc.get("predicted_time_us"), extra=doc.get("extra", {}),
        fabric=_fabric_from_dict(doc["fabric"], source) if "fabric" in doc else None, switches=switches,
    )


def _switches_from_doc(doc: dict, source: str) -> tuple[SwitchProgram, ...]:
    """The ``switches`` entry (schema-checked already): names unique, ops well formed, members ranks."""
    n = doc["num_ranks"]
    switches, seen = [], set()
    for k, sw in enumerate(doc.get("switches", ())):
        where = f"{source}: switches/{k} ({sw['name']!r})"
        if sw["name"] in seen:
            raise SynthError(f"{where}: switch named twice")
        seen.add(sw["name"])
        ops = []
        for j, (typ, srcs, dsts, cnt, chan) in enumerate(sw["ops"]):
            op = SwitchOp(typ, tuple(srcs), tuple(dsts), cnt, chan)
            problem = switch_op_problem(op, n)
            if problem:
                raise SynthError(f"{where} op {j}: {problem}")
            ops.append(op)
        switches.append(SwitchProgram(sw["name"], tuple(ops)))
    return tuple(switches)


def _check_switch_peers(gpus: list[Gpu], n: int, switches: tuple[SwitchProgram, ...], source: str) -> None:
    """In a version 2 program a threadblock peer >= num_ranks names ``switches[peer - num_ranks]``: it must exist."""
    top = n + len(switches) - 1
    for g in gpus:
        for tb in g.threadblocks:
            for role, peer in (("send", tb.send), ("recv", tb.recv)):
                if peer > top:
                    named = (f"nor a switch ({n}..{top}, the {len(switches)} of \"switches\")" if switches
                             else "and the program names no switches")
                    raise SynthError(f"{source}: gpu {g.id} tb {tb.id}: {role} peer {peer} is not a rank "
                                     f"(0..{n - 1}) {named}")


def program_from_json(text: str, source: str = "<json>") -> Program:
    """Parse and validate a JSON program. Raises SynthError naming ``source`` and the bad field."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SynthError(f"{source}: not valid JSON ({exc})") from None
    except RecursionError:
        raise SynthError(f"{source}: not valid JSON (nested too deeply)") from None
    return program_from_dict(doc, source)

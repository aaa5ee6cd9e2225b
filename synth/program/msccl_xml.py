"""MSCCL XML export and import, and the structural limits the MSCCL runtimes enforce.

Format (microsoft/msccl-tools ``msccl/language/ir.py`` ``ir_to_xml``, old format; parsed by
Azure/msccl-executor-nccl ``src/misc/msccl/msccl_parser.cc``)::

    <algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>
      <gpu id i_chunks o_chunks s_chunks>
        <tb id send recv chan>
          <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>

Both runtimes' attributes are written: the executor fork reads ``outofplace minBytes maxBytes``
and spells reduce-scatter ``reducescatter``; the original runtime spells it ``reduce_scatter``.
The executor's hand-written parser only accepts double-quoted values separated by single spaces
and no ``<?xml?>`` prolog, so the writer emits exactly that.

The fabric a program was made for (docs/programs.md, ``fabric``) goes in a comment before ``<algo>``,
``<!-- synth fabric name="..." sha256="..." source="..." -->``: both runtimes' parsers skip comments
wherever an element may start (``mscclXmlGetNode``/``xmlGetNode`` read ``<!--`` up to ``-->``), whereas an
extra ``<algo>`` attribute would count against their 16 (``MAX_ATTR_COUNT``).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from urllib.parse import quote, unquote
from xml.sax.saxutils import escape

import numpy as np

from synth.collectives import COLL_ALIASES, COLLECTIVES, ROOTED
from synth.errors import SynthError
from synth.program.columns import NO_KIND, NOP, StepColumns, kind_flags, peerless_steps, program_columns
from synth.program.ir import (
    BUFFERS,
    READS_SRC,
    RECEIVES,
    SENDS,
    STEP_TYPES,
    WRITES_DST,
    Fabric,
    Gpu,
    Program,
    Step,
    Threadblock,
)
from synth.runtime_limits import (
    EXECUTOR,
    MAX_PARSE_BUFFER_CHUNKS,
    MAX_PARSE_TOTAL_CHUNKS,
    MAX_RANKS,
    NTHREADS_MULTIPLE,
    PROTOCOLS,
    RUNTIME_COLLECTIVES,
    RuntimeProfile,
    parse_capped,
    runtime_profile,
)

COLL_SPELLINGS = ("reduce_scatter", "reducescatter")
_ALGO_KNOWN = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
               "minBytes", "maxBytes", "root")


def _coll_attr(collective: str, coll_spelling: str) -> str:
    if coll_spelling not in COLL_SPELLINGS:
        raise SynthError(f"coll spelling must be one of {', '.join(COLL_SPELLINGS)}, not {coll_spelling!r}")
    return coll_spelling if collective == "reducescatter" else collective


# Characters XML 1.0 cannot hold at all, escaped or not: a file with one would not load again.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


# Always double quotes (quoteattr switches to single ones around a '"'; the executor's parser
# reads only double), and whitespace as references so that it reads back unnormalised.
_ATTR_ENTITIES = {'"': "&quot;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}


def _xml_attr(value: str, attribute: str) -> str:
    """``value`` as a double-quoted attribute, or a SynthError if the file could not be read back."""
    bad = _NOT_XML.search(value)
    if bad is not None:
        raise SynthError(f"<algo> {attribute}: the character {bad.group()!r} cannot be written to MSCCL XML "
                         f"(in {value[:60]!r})")
    return f'"{escape(value, _ATTR_ENTITIES)}"'


_FABRIC_COMMENT = re.compile(r'\s*<!-- synth fabric name="([^"]*)" sha256="([0-9a-f]{64})" source="([^"]*)" -->')


def _comment_value(value: str) -> str:
    """``value`` percent-encoded so that the comment holds no quote, control character or ``--`` (which would end
    an XML comment early)."""
    return re.sub("-(?=-)", "%2D", quote(value, safe="/:@+,=!$&'()*;"))


def fabric_comment(fabric: Fabric) -> str:
    """The comment line that records ``fabric`` in MSCCL XML (the runtimes skip comments)."""
    return (f'<!-- synth fabric name="{_comment_value(fabric.name)}" sha256="{fabric.sha256}" '
            f'source="{_comment_value(fabric.source)}" -->')


def fabric_from_comment(text: str) -> Fabric | None:
    """The fabric an XML file records in its leading comment (:func:`fabric_comment`), or None."""
    found = _FABRIC_COMMENT.match(text)
    if found is None:
        return None
    name, sha256, source = found.groups()
    return Fabric(name=unquote(name), sha256=sha256, source=unquote(source))


def switch_steps_problem(program: Program) -> str | None:
    """Why ``program`` cannot be MSCCL XML because of its in-network steps (None when it has none).

    MSCCL XML has no element for a switch's reduce or multicast (NVLS/SHARP, docs/programs.md "Switch
    steps"), and its peers are ranks only, so such a program exists only as a version 2 JSON program."""
    if not program.switches:
        return None
    reduces = sum(op.type == "reduce" for sw in program.switches for op in sw.ops)
    multicasts = sum(op.type == "multicast" for sw in program.switches for op in sw.ops)
    names = ", ".join(sw.name for sw in program.switches)
    plural = "es" if len(program.switches) > 1 else ""
    return (f"MSCCL XML cannot express in-network steps ({reduces} reduce and {multicasts} multicast ops on "
            f"switch{plural} {names}); write a .json program")


def check_no_switch_steps(program: Program) -> None:
    """Raise the one-line SynthError of :func:`switch_steps_problem`, if any."""
    problem = switch_steps_problem(program)
    if problem is not None:
        raise SynthError(problem)


def program_to_xml(program: Program, coll_spelling: str | None = "reduce_scatter",
                   runtime: str | RuntimeProfile | None = None) -> str:
    """MSCCL XML text of ``program`` (one element per line, double-quoted attributes): the pieces of
    :func:`iter_program_xml` joined."""
    return "".join(iter_program_xml(program, coll_spelling, runtime))


#: Steps per piece of :func:`iter_program_xml` (a threadblock of a million steps is not one string).
XML_STEPS_PER_PIECE = 4096


def iter_program_xml(program: Program, coll_spelling: str | None = "reduce_scatter",
                     runtime: str | RuntimeProfile | None = None) -> Iterator[str]:
    """MSCCL XML text of ``program`` in pieces, for streaming to a file (:func:`synth.fileio.atomic_write_chunks`).

    The first piece is the ``<algo>`` line (after the fabric comment) and every check runs before it is
    yielded: a program with switch steps is refused (:func:`switch_steps_problem`), as is an attribute value
    XML cannot hold. Then one piece per threadblock, or per :data:`XML_STEPS_PER_PIECE` steps of a longer one;
    each piece is whole lines ending in a newline. With ``runtime`` (a :class:`synth.runtime_limits.RuntimeProfile`
    or its name), the ``<algo>`` attributes are that runtime's set (``RuntimeProfile.attributes``) and ``coll``
    its spelling, unless ``coll_spelling`` overrides it; without, the executor's set with ``coll_spelling``
    (the writer's historical default)."""
    yield _xml_head(program, coll_spelling, runtime)
    for gpu in program.gpus:
        head = (f'  <gpu id="{gpu.id}" i_chunks="{gpu.i_chunks}" o_chunks="{gpu.o_chunks}" '
                f's_chunks="{gpu.s_chunks}">\n')
        for tb in gpu.threadblocks:
            head += f'    <tb id="{tb.id}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">\n'
            steps = tb.steps
            for start in range(0, len(steps), XML_STEPS_PER_PIECE):
                yield head + _xml_steps(steps, start, min(start + XML_STEPS_PER_PIECE, len(steps)))
                head = ""
            yield head + "    </tb>\n"
            head = ""
        yield head + "  </gpu>\n"
    yield "</algo>\n"


def _xml_steps(steps: tuple[Step, ...], start: int, stop: int) -> str:
    """``<step>`` lines ``start`` to ``stop`` - 1 of a threadblock, each ending in a newline."""
    return "".join(
        f'      <step s="{index}" type="{st.type}" srcbuf="{st.srcbuf}" srcoff="{st.srcoff}" '
        f'dstbuf="{st.dstbuf}" dstoff="{st.dstoff}" cnt="{st.cnt}" depid="{st.depid}" '
        f'deps="{st.deps}" hasdep="{int(st.hasdep)}"/>\n'
        for index, st in zip(range(start, stop), steps[start:stop]))


def _xml_head(program: Program, coll_spelling: str | None, runtime: str | RuntimeProfile | None) -> str:
    """The fabric comment (if any) and the ``<algo>`` line, every check of the writer done."""
    check_no_switch_steps(program)
    profile = runtime_profile(runtime) if runtime is not None else None
    if profile is not None:
        if profile.coll(program.collective) is None:
            raise SynthError(f"{profile.repo} does not load {program.collective} programs (its coll values: "
                             f"{', '.join(v for _, v in profile.coll_spellings)})")
        coll_spelling = coll_spelling or dict(profile.coll_spellings)["reducescatter"]
    coll = _coll_attr(program.collective, coll_spelling or "reduce_scatter")
    xml_extra = dict(program.extra.get("xml_attrs", {})) if isinstance(program.extra, dict) else {}
    outofplace = xml_extra.pop("outofplace", "0" if program.inplace else "1")
    values = {"name": program.name, "proto": program.proto, "nchannels": program.nchannels,
              "nchunksperloop": program.nchunksperloop, "ngpus": program.num_ranks, "coll": coll,
              "inplace": int(program.inplace), "outofplace": outofplace,
              "minBytes": program.min_bytes, "maxBytes": program.max_bytes}
    attrs = [(key, values[key]) for key in (profile or EXECUTOR).attributes]
    if program.collective in ROOTED:
        attrs.append(("root", program.root))
    attrs.extend((k, v) for k, v in xml_extra.items() if k not in _ALGO_KNOWN)
    comment = fabric_comment(program.fabric) + "\n" if program.fabric is not None else ""
    return comment + "<algo " + " ".join(f"{k}={_xml_attr(str(v), k)}" for k, v in attrs) + ">\n"


# ---- import ---------------------------------------------------------------------------------------
#: An integer attribute as the runtimes' ``strtol`` reads it whole: ASCII digits, a sign, C white space around.
#: Python's ``int`` also takes "١" or "１" (non-ASCII digits) and "1_0", which ``strtol`` reads as 0 and 1.
_INTEGER = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)[ \t\n\v\f\r]*")


def _int(elem: ET.Element, key: str, where: str, default: int | None = None) -> int:
    raw = elem.get(key)
    if raw is None:
        if default is None:
            raise SynthError(f"{where}: missing required attribute {key!r}")
        return default
    match = _INTEGER.fullmatch(raw)
    if match is None:
        raise SynthError(f"{where}: attribute {key}={raw!r} is not an integer")
    return int(match.group(1))


def _canonical_coll(raw: str) -> str:
    key = raw.strip().lower()
    key = COLL_ALIASES.get(key, key)
    return key if key in COLLECTIVES else raw.strip()  # keep unknown names (e.g. custom) as given


def _parse_step(elem: ET.Element, where: str) -> tuple[int, Step]:
    stype = elem.get("type")
    if stype is None:
        raise SynthError(f"{where}: missing required attribute 'type'")
    stype = stype.strip()
    if stype not in STEP_TYPES:
        raise SynthError(f"{where}: unknown step type {stype!r} (expected one of {' '.join(STEP_TYPES)})")
    bufs = {}
    for key, default in (("srcbuf", "i"), ("dstbuf", "o")):
        value = (elem.get(key) or default).strip()
        if value not in BUFFERS:
            raise SynthError(f"{where}: {key}={value!r} is not a buffer (i, o, s)")
        bufs[key] = value
    hasdep = _int(elem, "hasdep", where, 0)
    if hasdep not in (0, 1):
        raise SynthError(f"{where}: hasdep must be 0 or 1, not {hasdep}")
    step = Step(type=stype, srcbuf=bufs["srcbuf"], srcoff=_int(elem, "srcoff", where, 0),
                dstbuf=bufs["dstbuf"], dstoff=_int(elem, "dstoff", where, 0),
                cnt=parse_capped(_int(elem, "cnt", where, 1), MAX_PARSE_BUFFER_CHUNKS, "cnt", where),
                depid=_int(elem, "depid", where, -1), deps=_int(elem, "deps", where, -1), hasdep=bool(hasdep))
    return _int(elem, "s", where, -1), step


def _parse_tb(elem: ET.Element, where_gpu: str, position: int) -> Threadblock:
    tb_id = _int(elem, "id", f"{where_gpu} <tb> #{position}")
    where = f"{where_gpu} <tb id={tb_id}>"
    indexed = []
    for k, child in enumerate(elem):
        if child.tag != "step":
            continue  # foreign elements are ignored, as the runtimes do
        s, step = _parse_step(child, f"{where} <step> #{k}")
        indexed.append((s if s >= 0 else len(indexed), step))
    order = sorted(range(len(indexed)), key=lambda k: indexed[k][0])
    numbers = [indexed[k][0] for k in order]
    if numbers != list(range(len(indexed))):
        raise SynthError(f"{where}: step numbers s must be 0..{len(indexed) - 1} without gaps, got {numbers}")
    return Threadblock(id=tb_id, send=_int(elem, "send", where, -1), recv=_int(elem, "recv", where, -1),
                       chan=_int(elem, "chan", where, 0), steps=tuple(indexed[k][1] for k in order))


def _usage(threadblocks: tuple[Threadblock, ...], buffer: str) -> int:
    """Chunks of ``buffer`` a gpu's steps touch (for files that omit i_chunks/o_chunks/s_chunks)."""
    top = 0
    for tb in threadblocks:
        for st in tb.steps:
            if st.type == "nop":
                continue
            if st.srcbuf == buffer and st.type in READS_SRC:
                top = max(top, st.srcoff + st.cnt)
            if st.dstbuf == buffer and st.type in WRITES_DST:
                top = max(top, st.dstoff + st.cnt)
    return top


def program_from_xml(text: str, source: str = "<xml>") -> Program:
    """Parse MSCCL XML (ours or foreign). Raises SynthError naming ``source`` and the element."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise SynthError(f"{source}: not well-formed XML ({exc})") from None
    if root.tag != "algo":
        raise SynthError(f"{source}: root element is <{root.tag}>, expected <algo>")
    where = f"{source}: <algo>"
    coll_raw = root.get("coll")
    if coll_raw is None:
        raise SynthError(f"{where}: missing required attribute 'coll'")
    if "ngpus" in root.attrib:
        parse_capped(_int(root, "ngpus", where), MAX_RANKS, "ngpus", where)
    gpus = []
    total = 0
    for k, elem in enumerate(root):
        if elem.tag != "gpu":
            continue
        gid = _int(elem, "id", f"{source}: <gpu> #{k}")
        wg = f"{source}: <gpu id={gid}>"
        tbs = tuple(_parse_tb(child, wg, j) for j, child in enumerate(elem) if child.tag == "tb")
        sizes = {key: parse_capped(_int(elem, f"{key}_chunks", wg, _usage(tbs, key)), MAX_PARSE_BUFFER_CHUNKS,
                              f"{key}_chunks", wg) for key in BUFFERS}
        total += sum(sizes.values())
        parse_capped(total, MAX_PARSE_TOTAL_CHUNKS, "the buffers' chunks so far", wg)
        gpus.append(Gpu(id=gid, i_chunks=sizes["i"], o_chunks=sizes["o"], s_chunks=sizes["s"], threadblocks=tbs))
    gpus.sort(key=lambda g: g.id)
    ngpus = _int(root, "ngpus", where, len(gpus))
    ids = [g.id for g in gpus]
    if ids != list(range(ngpus)):
        raise SynthError(f"{where}: ngpus={ngpus} but <gpu> ids are {ids} (expected 0..{ngpus - 1} once each)")
    inplace = _int(root, "inplace", where, 0)
    chans = [tb.chan for g in gpus for tb in g.threadblocks]
    extra_attrs = {k: v for k, v in root.attrib.items() if k not in _ALGO_KNOWN}
    if "outofplace" in root.attrib and _int(root, "outofplace", where) != (0 if inplace else 1):
        extra_attrs["outofplace"] = root.get("outofplace")
    stem = source.rsplit("/", 1)[-1].rsplit(".", 1)[0] or "msccl"
    return Program(
        name=root.get("name", stem), collective=_canonical_coll(coll_raw), num_ranks=ngpus, gpus=tuple(gpus),
        inplace=bool(inplace), proto=root.get("proto", "Simple"),
        nchannels=_int(root, "nchannels", where, max(chans, default=-1) + 1 or 1),
        nchunksperloop=_int(root, "nchunksperloop", where,
                            max((max(g.i_chunks, g.o_chunks) for g in gpus), default=1) or 1),
        root=_int(root, "root", where, 0), min_bytes=_int(root, "minBytes", where, 0),
        max_bytes=_int(root, "maxBytes", where, 0),
        extra={"xml_attrs": extra_attrs} if extra_attrs else {},
        fabric=fabric_from_comment(text),
    )


# ---- runtime limits -------------------------------------------------------------------------------
_BUFFER_NAMES = {"i": "input", "o": "output", "s": "scratch"}


def runtime_limit_errors(program: Program, msccl: bool = True,
                         runtime: str | RuntimeProfile | None = None, suspect=None) -> Iterator[str]:
    """Every reason an MSCCL runtime's XML loader would refuse ``program``, lazily, one line each.

    The structural checks (dense threadblock ids, 1 <= nchannels, chan < nchannels, peers, a peer for
    every send and receive, nchunksperloop >= 1, buffer sizes >= 0, byte range, protocol, collective, a
    ``nop`` dependency chain ending on a step with its own dependency) apply to any program; with
    ``msccl`` also the capacity limits of the runtimes' fixed-size structures (docs/programs.md table):
    channels, threadblocks, peers per channel, steps, cnt, depended-on ids, int16 offsets, and XML
    nodes. JSON programs are held only to the structural ones.

    ``runtime`` (a profile or its name, :mod:`synth.runtime_limits`) holds the program to that runtime's
    limits and collectives only: microsoft/msccl's 216 threadblocks and 256 steps, its collectives (no
    gather, scatter), its ``i_chunks``/``o_chunks`` against ``nchunksperloop`` check and its ``nthreads``;
    the executor's 1024 threadblocks and 64 steps. Without, the executor's capacities and the checks of
    both runtimes' attributes (historical default, what synth's methods plan within).

    ``suspect`` (one bool per threadblock in program order, as :func:`suspect_threadblocks` finds them by array
    operations) lets the step checks skip every threadblock none of whose steps can fail them; the others are
    checked step by step as without.
    """
    profile = runtime_profile(runtime) if runtime is not None else None
    limits = profile or EXECUTOR
    g = -1
    n = program.num_ranks
    switch_problem = switch_steps_problem(program) if msccl else None
    if switch_problem is not None:
        yield switch_problem
    top = n + (0 if msccl else len(program.switches))   # JSON: peers n.. name the program's switches
    yield from _algo_errors(program, msccl, profile)
    for gpu in program.gpus:
        r = gpu.id
        tbs = gpu.threadblocks
        for buf in BUFFERS:
            if gpu.chunks(buf) < 0:
                yield f"rank {r}: {buf}_chunks={gpu.chunks(buf)} is negative"
        ids = sorted(tb.id for tb in tbs)
        if ids != list(range(len(tbs))):
            shown = ids if len(ids) <= 8 else ids[:8] + ["..."]
            yield f"rank {r} threadblock ids {shown} are not dense from 0 (the runtimes need 0..{len(tbs) - 1})"
        if msccl:
            yield from _capacity_errors(program, gpu, limits)
            if profile is not None and profile.loop_chunks_match:
                yield from _loop_chunk_errors(program, gpu, profile)
        for tb in tbs:
            g += 1
            where = f"rank {r} tb {tb.id}"
            for peer, role in ((tb.send, "send"), (tb.recv, "recv")):
                if peer == r:
                    yield f"{where} has {role} peer equal to itself"
                elif peer < -1 or peer >= top:
                    switches = f" or one of its {top - n} switches ({n}..{top - 1})" if top > n else ""
                    yield f"{where} has {role} peer {peer}, not a rank (0..{n - 1}){switches}"
            if not 0 <= tb.chan < max(program.nchannels, 1) or (msccl and tb.chan >= limits.max_channels):
                yield (f"{where} uses channel {tb.chan}, outside 0..{program.nchannels - 1}"
                       f" (at most {limits.max_channels} channels; --max-trees)")
            if suspect is None or suspect[g]:
                yield from _step_errors(tb, where, msccl, limits)


def _algo_errors(program: Program, msccl: bool, profile: RuntimeProfile | None) -> Iterator[str]:
    """The ``<algo>`` attributes' checks."""
    limits = profile or EXECUTOR
    if program.nchannels < 1:
        yield f"nchannels={program.nchannels}: a program needs at least one channel"
    elif msccl and program.nchannels > limits.max_channels:
        yield (f"nchannels={program.nchannels} exceeds {limits.max_channels} channels; use fewer channels "
               "(--max-trees)")
    if program.nchunksperloop < 1:
        yield f"nchunksperloop={program.nchunksperloop} must be at least 1 (the runtimes divide the buffer by it)"
    if msccl and program.num_ranks > MAX_RANKS:
        yield f"ngpus={program.num_ranks} exceeds {MAX_RANKS} (the runtimes store peers as int16)"
    if program.proto not in PROTOCOLS:
        yield f"proto={program.proto!r} is not one of {', '.join(PROTOCOLS)}"
    if program.collective not in RUNTIME_COLLECTIVES:
        yield f"coll={program.collective!r} is a collective neither MSCCL runtime loads"
    elif profile is not None and profile.coll(program.collective) is None:
        yield (f"coll={program.collective!r}: {profile.repo} does not load it (it loads "
               f"{', '.join(v for _, v in profile.coll_spellings)}; {profile.parser})")
    if program.min_bytes < 0 or program.max_bytes < 0:
        yield f"minBytes={program.min_bytes} / maxBytes={program.max_bytes} must not be negative"
    elif 0 < program.max_bytes < program.min_bytes or (profile is not None and profile.max_bytes_unbounded is None
                                                       and program.max_bytes < program.min_bytes):
        yield f"minBytes={program.min_bytes} is greater than maxBytes={program.max_bytes}"
    xml_extra = program.extra.get("xml_attrs", {}) if isinstance(program.extra, dict) else {}
    nthreads = str(xml_extra.get("nthreads", "0")).strip()
    if msccl and profile is not EXECUTOR and not (nthreads.isdigit() and int(nthreads) % NTHREADS_MULTIPLE == 0):
        yield f"nthreads={nthreads!r} must be a multiple of {NTHREADS_MULTIPLE} (microsoft/msccl)"


def _loop_chunk_errors(program: Program, gpu: Gpu, profile: RuntimeProfile) -> Iterator[str]:
    """microsoft/msccl ``topo.cc`` ``mscclGetAlgoFromXMLAndSetAlgo``: ``i_chunks`` (× ngpus for allgather) and
    ``o_chunks`` (× ngpus for reduce-scatter) must equal ``nchunksperloop`` where they are > 0."""
    n, loop = program.num_ranks, program.nchunksperloop
    for buf, count, multiplier in (("i", gpu.i_chunks, n if program.collective == "allgather" else 1),
                                   ("o", gpu.o_chunks, n if program.collective == "reducescatter" else 1)):
        if count > 0 and count * multiplier != loop:
            shown = f"{count} x {multiplier}" if multiplier > 1 else str(count)
            yield (f"rank {gpu.id}: {buf}_chunks={shown} is not nchunksperloop={loop}, which {profile.repo} "
                   "requires (topo.cc:886)")


def _capacity_errors(program: Program, gpu: Gpu, limits: RuntimeProfile) -> Iterator[str]:
    """One rank's counts against the runtime's fixed-size tables."""
    r, tbs = gpu.id, gpu.threadblocks
    if len(tbs) > limits.max_threadblocks:
        yield (f"rank {r} has {len(tbs)} threadblocks, more than {limits.max_threadblocks}"
               f"{'' if limits is EXECUTOR else ' (' + limits.repo + ', topo.cc:903)'}; use fewer trees or channels "
               "(--max-trees)")
    for role in ("send", "recv"):
        per_chan: dict[int, int] = {}
        for tb in tbs:
            if getattr(tb, role) >= 0:
                per_chan[tb.chan] = per_chan.get(tb.chan, 0) + 1
        for chan, count in per_chan.items():
            if count > limits.max_tb_per_channel:
                yield (f"rank {r} channel {chan} has {count} threadblocks with a {role} peer, more than "
                       f"{limits.max_tb_per_channel}; spread over channels or use fewer trees (--max-trees)")
    nodes = 1 + program.num_ranks + len(tbs) + sum(len(tb.steps) for tb in tbs)
    if nodes > limits.max_xml_nodes:
        yield (f"rank {r} needs {nodes} XML nodes, more than {limits.max_xml_nodes}; use fewer chunks (--chunks) "
               "or trees (--max-trees)")


def _step_errors(tb: Threadblock, where: str, msccl: bool, limits: RuntimeProfile) -> Iterator[str]:
    """One threadblock's steps."""
    if msccl and len(tb.steps) > limits.max_steps_per_tb:
        yield f"{where} has {len(tb.steps)} steps, more than {limits.max_steps_per_tb}; use fewer chunks (--chunks)"
    pending_nops = False   # nops carrying dependencies, which the runtimes attach to the next real step
    for s, st in enumerate(tb.steps):
        wst = f"{where} step {s} ({st.type})"
        if st.type in SENDS and tb.send < 0:
            yield f"{wst} sends but the threadblock has no send peer"
        if st.type in RECEIVES and tb.recv < 0:
            yield f"{wst} receives but the threadblock has no recv peer"
        if msccl and st.depid > limits.max_depended_tb:   # nops' dependencies are stored too (int8)
            yield (f"{wst} depends on tb {st.depid}; depended-on tb ids must be <= {limits.max_depended_tb}; "
                   "use fewer trees (--max-trees)")
        if st.type == "nop":
            pending_nops = pending_nops or st.depid >= 0
            continue
        if pending_nops and st.depid < 0:
            yield (f"{wst} follows nop steps with dependencies but has none itself; the runtimes require the "
                   "last dependency of such a chain on the step")
        pending_nops = False
        if not msccl:
            continue
        if not 1 <= st.cnt <= limits.max_step_chunks:
            yield f"{wst} has cnt={st.cnt}, must be 1..{limits.max_step_chunks}; use fewer chunks (--chunks)"
        for used, buf, off in ((st.type in READS_SRC, st.srcbuf, st.srcoff),
                               (st.type in WRITES_DST, st.dstbuf, st.dstoff)):
            if used and off > limits.max_offset:
                yield (f"{wst}: {_BUFFER_NAMES.get(buf, buf)} offset {off} exceeds the runtimes' int16 offset "
                       f"limit ({limits.max_offset}); use fewer chunks (--chunks)")


def suspect_threadblocks(columns: StepColumns, program: Program, msccl: bool, limits: RuntimeProfile) -> np.ndarray:
    """Per threadblock (program order), whether :func:`_step_errors` may find anything in it, by array operations
    on the program's step columns: a step that sends or receives without the peer, a type that is no step type, a
    real step without a dependency after nops with one (the chain rule), and with ``msccl`` too many steps, a
    depended-on tb id, cnt or an offset over the runtime's limits. A numpy bool array."""
    tbs = [tb for gpu in program.gpus for tb in gpu.threadblocks]
    if len(columns.start) != len(tbs) + 1:
        raise ValueError("columns do not match the program's threadblocks")
    tb_of = columns.tb_of
    kind = columns.kind
    known = kind != NO_KIND
    _, _, reads, writes = kind_flags(kind)
    nop = kind == NOP
    has_dep = columns.depid >= 0
    bad = ~known | peerless_steps(columns, tbs)
    # the chain rule: nops with dependencies (counted by prefix sums) between a real step and the one before it
    real = np.flatnonzero(~nop)
    if len(real):
        nop_deps = np.concatenate([[0], np.cumsum(nop & has_dep)])
        previous = np.concatenate([[-1], real[:-1]])
        previous = np.maximum(previous, columns.start[tb_of[real]] - 1)   # within the real step's threadblock
        chained = nop_deps[real] - nop_deps[previous + 1] > 0
        bad[real[chained & ~has_dep[real]]] = True
    if msccl:
        real_kind = known & ~nop
        bad |= columns.depid > limits.max_depended_tb
        bad |= real_kind & ((columns.cnt < 1) | (columns.cnt > limits.max_step_chunks)
                            | (reads & (columns.srcoff > limits.max_offset))
                            | (writes & (columns.dstoff > limits.max_offset)))
    suspect = np.zeros(len(tbs), dtype=bool)
    suspect[tb_of[bad]] = True
    if msccl:
        suspect |= np.diff(columns.start) > limits.max_steps_per_tb
    return suspect


def check_runtime_limits(program: Program, runtime: str | RuntimeProfile | None = None) -> None:
    """Raise SynthError on the first reason an MSCCL runtime (``runtime``'s, or the default checks) would
    refuse ``program`` as XML. The step checks look only at the threadblocks :func:`suspect_threadblocks` finds
    on the program's step columns (all of them where it has none)."""
    columns = program_columns(program)
    suspect = None if columns is None else suspect_threadblocks(
        columns, program, True, runtime_profile(runtime) if runtime is not None else EXECUTOR)
    for problem in runtime_limit_errors(program, msccl=True, runtime=runtime, suspect=suspect):
        raise SynthError(f"runtime limit: {problem}")

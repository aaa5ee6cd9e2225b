"""Targeting an MSCCL runtime: the ``minBytes``/``maxBytes`` to write, each runtime's selection rule, scratch.

A runtime runs an XML program for a call only when its own selection rule picks it. That rule differs
between the two runtimes (profiles in :mod:`synth.runtime_limits`), so one file does not serve both
(line numbers at the commits read: Azure/msccl-executor-nccl c6f6b36, microsoft/msccl b23e9cd):

- **msccl-executor** (Azure/msccl-executor-nccl ``src/misc/msccl/msccl_lifecycle.cc``
  ``mscclInternalSchedulerSelectAlgo``, lines 304-348, the test at 333-339): ``count > 0``,
  ``(count · sizeMultiplier) mod nChunksPerLoop = 0``,
  ``minBytes ≤ nBytes`` and (``maxBytes = 0`` or ``nBytes ≤ maxBytes``), ``nRanks`` equal, ``func`` equal,
  and ``inPlace`` (in-place call) or ``outOfPlace`` (out-of-place call) set; ``nBytes = count · typeSize ·
  sizeMultiplier`` with ``sizeMultiplier = ngpus`` for allgather, reducescatter and alltoall, else 1
  (``msccl_parser.cc`` ``mscclGetAlgoMetaFromXmlFile``, lines 721-790). The first file in path order that
  matches runs (the sorted set of ``mscclInternalSchedulerInit``, lines 153-168).
- **msccl** (microsoft/msccl ``src/graph/tuning.cc`` ``ncclTopoGetMSCCLAlgo``, lines 344-377, the test at
  366-369, with ``mscclInPlaceTotalCountHelper`` at 312-342; alltoall in ``src/collectives/all_to_all.cc``
  ``ncclAllToAll``, from line 45, the test at 89-91): ``collectiveType`` equal, ``inPlace`` equal to the
  call's (alltoall: out of place only), ``ngpus`` equal, ``totalCount mod nchunksPerLoop = 0`` and
  ``minBytes ≤ nBytes < maxBytes``; ``nBytes = count · typeSize`` (× nRanks for allgather, reduce_scatter,
  alltoall: ``src/misc/argcheck.cc`` ``ArgsCheck``, lines 47-52), and ``totalCount`` is an ``int`` of the call's count
  (× nRanks for allgather and reduce_scatter), counted in bytes for allgather and broadcast, which ArgsCheck
  converts to ``ncclInt8`` (alltoall: ``allcount = sendcount × nRanks`` elements, a ``size_t``).
  The first of the (at most 4) ``MSCCL_XML_FILES`` that matches runs, and only when ``NCCL_ALGO`` lets
  MSCCL in.

Neither rule compares ``root``: a program written for root 0 also runs for a call rooted elsewhere.
For the collectives synth writes, ``nBytes`` is SIZE in both runtimes (docs/units.md), except the executor's
gather and scatter, which no NCCL call of that fork reaches (its ``collectives.cc`` has no ``ncclGather``;
``mscclRunAlgo`` runs a loaded program by handle).
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from synth.collectives import ROOTED
from synth.errors import SynthError
from synth.program.ir import Program
from synth.runtime_limits import RUNTIMES, RuntimeProfile, runtime_profile

INT64_MAX = (1 << 63) - 1
# msccl: ArgsCheck converts these calls' counts to bytes (ncclInt8) before tuning.cc takes totalCount
_BYTE_COUNTED = frozenset({"allgather", "broadcast"})
_PER_RANK_COUNT = frozenset({"allgather", "reducescatter", "alltoall"})   # the call's count is one rank's share


@dataclass(frozen=True)
class Call:
    """One collective call as a runtime sees it: the collective, SIZE (the nccl-tests buffer, docs/units.md),
    whether it is in place, the communicator's size, the element size of its data type, and its root."""

    collective: str
    size_bytes: int
    inplace: bool
    ngpus: int
    element_bytes: int = 4
    root: int = 0

    @property
    def count(self) -> int:
        """The ``count`` argument of the NCCL call (elements; one rank's share where the call takes that)."""
        elements = self.size_bytes // self.element_bytes
        return elements // self.ngpus if self.collective in _PER_RANK_COUNT else elements


@dataclass(frozen=True)
class Selection:
    """Whether a runtime picks a program for a call, and why (the first condition that fails)."""

    selected: bool
    reason: str


def _int(attrs: Mapping[str, str], key: str) -> int | None:
    """``strtol``-like read of an attribute the parsers convert with ``strtol``/``strtoll`` (None: absent)."""
    raw = attrs.get(key)
    if raw is None:
        return None
    match = re.match(r"\s*([+-]?\d+)", raw)
    return int(match.group(1)) if match else 0


def _int32(value: int) -> int:
    """``value`` stored into a C ``int`` (two's complement wrap), as microsoft/msccl's ``totalCount`` is."""
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


def select(runtime: str | RuntimeProfile, attrs: Mapping[str, str], call: Call) -> Selection:
    """Does ``runtime`` run the program whose ``<algo>`` attributes are ``attrs`` (raw strings, as in the file)
    for ``call``? A re-implementation of the runtime's own rule (module docstring), for tests and
    ``synth verify --runtime``; loader checks beyond ``<algo>`` are :func:`loader_errors`'s."""
    profile = runtime_profile(runtime)
    missing = [key for key in profile.required if key not in attrs]
    if missing:
        return Selection(False, f"{profile.repo} does not load it: <algo> lacks {', '.join(missing)}")
    collective = profile.collective_of(attrs["coll"])
    if collective is None:
        return Selection(False, f"{profile.repo} does not load coll={attrs['coll']!r} (it reads "
                                f"{', '.join(v for _, v in profile.coll_spellings)})")
    if collective != call.collective:
        return Selection(False, f"coll {attrs['coll']!r} is not the call's {call.collective}")
    if _int(attrs, "ngpus") != call.ngpus:
        return Selection(False, f"ngpus={attrs['ngpus']} is not the communicator's {call.ngpus}")
    loop = _int(attrs, "nchunksperloop") or 0
    if loop <= 0:
        return Selection(False, f"nchunksperloop={attrs['nchunksperloop']} divides nothing")
    if profile.max_bytes_inclusive:
        return _select_executor(profile, attrs, call, loop)
    return _select_msccl(profile, attrs, call, loop)


def _select_executor(profile: RuntimeProfile, attrs: Mapping[str, str], call: Call, loop: int) -> Selection:
    """msccl_lifecycle.cc ``mscclInternalSchedulerSelectAlgo``: ``msgSizeIsValid`` (lines 333-335) and the
    ``isInPlace ? m.inPlace : m.outOfPlace`` test (line 339); ``isInPlace`` from lines 315-327."""
    if call.collective in ("gather", "scatter"):
        return Selection(False, f"no NCCL call of {profile.repo} selects {call.collective} by size (collectives.cc "
                                "has none); load it and run it by handle with mscclRunAlgo")
    multiplier = call.ngpus if call.collective in _PER_RANK_COUNT else 1
    count = call.count
    n_bytes = count * call.element_bytes * multiplier
    if count <= 0:
        return Selection(False, "count is 0")
    if (count * multiplier) % loop:
        return Selection(False, f"the call's {count * multiplier} elements are not a multiple of "
                                f"nchunksperloop={loop}")
    low, high = _int(attrs, "minBytes") or 0, _int(attrs, "maxBytes") or 0
    if n_bytes < low:
        return Selection(False, f"nBytes={n_bytes} < minBytes={low}")
    if high != profile.max_bytes_unbounded and n_bytes > high:
        return Selection(False, f"nBytes={n_bytes} > maxBytes={high} (0 would mean no limit)")
    key = "inplace" if call.inplace else "outofplace"
    if not _int(attrs, key):
        return Selection(False, f"{key}={attrs[key]}: the program does not serve {'in' if call.inplace else 'out-of'}"
                                "-place calls")
    return Selection(True, f"selected: {low} <= nBytes={n_bytes} <= {high or 'no limit'}, {loop} divides the count")


def _select_msccl(profile: RuntimeProfile, attrs: Mapping[str, str], call: Call, loop: int) -> Selection:
    """tuning.cc ``ncclTopoGetMSCCLAlgo`` lines 366-369 (``mscclInPlaceTotalCountHelper``, 312-342, for
    ``inPlace``/``totalCount``), and all_to_all.cc ``ncclAllToAll`` lines 89-91 for alltoall (in place refused
    at line 50)."""
    multiplier = call.ngpus if call.collective in _PER_RANK_COUNT else 1
    n_bytes = call.count * call.element_bytes * multiplier
    if call.collective == "alltoall":   # all_to_all.cc: allcount = sendcount * nRanks (size_t, elements)
        total = call.count * multiplier
        if call.inplace:
            return Selection(False, "microsoft/msccl refuses in-place alltoall (all_to_all.cc)")
    else:   # tuning.cc: an int totalCount, in bytes where ArgsCheck made the call ncclInt8
        total = _int32(call.count * (call.element_bytes if call.collective in _BYTE_COUNTED else 1) * multiplier)
    if call.collective != "alltoall" and bool(_int(attrs, "inplace")) != call.inplace:
        return Selection(False, f"inplace={attrs['inplace']} is not the call's {int(call.inplace)}")
    if total % loop:
        return Selection(False, f"totalCount={total} is not a multiple of nchunksperloop={loop}")
    low = _int(attrs, "minBytes") or 0
    high = _int(attrs, "maxBytes")
    high = profile.max_bytes_absent if high is None else high
    if n_bytes < low:
        return Selection(False, f"nBytes={n_bytes} < minBytes={low}")
    if not n_bytes < high:
        return Selection(False, f"nBytes={n_bytes} is not < maxBytes={high} (microsoft/msccl has no 'no limit' value)")
    return Selection(True, f"selected: {low} <= nBytes={n_bytes} < {high}, {loop} divides totalCount")


def algo_attributes(xml_text: str) -> dict[str, str]:
    """The ``<algo>`` element's attributes as written: raw strings, in file order (what :func:`select` takes)."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise SynthError(f"not well-formed XML ({exc})") from None
    return dict(list(root.attrib.items()))


def loader_errors(runtime: str | RuntimeProfile, xml_text: str, size_bytes: int | None = None) -> Iterator[str]:
    """The reasons ``runtime``'s loader refuses the XML file ``xml_text`` that synth's reader cannot see (it
    fills defaults and reads every ``coll`` spelling): required attributes of every element, the ``coll``
    spelling, attributes past the parser's 16th, and for microsoft/msccl a ``maxBytes`` that selects nothing.
    With ``size_bytes``, also whether the runtime's rule selects the program at that SIZE (:func:`select`).
    The program-level limits are :func:`synth.program.msccl_xml.runtime_limit_errors`."""
    profile = runtime_profile(runtime)
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise SynthError(f"not well-formed XML ({exc})") from None
    yield from parser_text_errors(xml_text)
    attrs = dict(root.attrib)
    where = f"{profile.repo}"
    if len(attrs) > profile.max_attributes:
        past = list(attrs)[profile.max_attributes:]
        yield f"<algo> has {len(attrs)} attributes; {where}'s parser ignores those past {profile.max_attributes} " \
              f"({', '.join(past)}) (MAX_ATTR_COUNT of its XML reader)"
        attrs = dict(list(attrs.items())[:profile.max_attributes])
    yield from _missing_attributes(root, attrs, [profile])
    spelling = attrs.get("coll")
    if spelling is not None and profile.collective_of(spelling) is None:
        yield (f"coll={spelling!r} is not one {where} loads ({', '.join(v for _, v in profile.coll_spellings)}; "
               f"{profile.parser}); write it with --runtime {profile.name}")
    if profile.max_bytes_unbounded is None and _int(attrs, "maxBytes") == 0:
        yield (f"maxBytes=0: {where} selects a program only where nBytes < maxBytes (tuning.cc:369 "
               "ncclTopoGetMSCCLAlgo), so it never runs this one; 0 means no limit only in msccl-executor-nccl")
    if size_bytes is not None and spelling is not None and profile.collective_of(spelling) is not None:
        call = Call(profile.collective_of(spelling), int(size_bytes), bool(_int(attrs, "inplace")),
                    _int(attrs, "ngpus") or 0)
        verdict = select(profile, attrs, call)
        if not verdict.selected:
            yield f"{where} would not select it at SIZE {size_bytes} B: {verdict.reason}"


def shared_loader_errors(xml_text: str) -> Iterator[str]:
    """The attributes that both runtimes' parsers read without a default and ``xml_text`` lacks: neither
    runtime loads such a file, though synth's reader fills defaults (``synth verify`` without ``--runtime``;
    an attribute only one runtime requires is :func:`loader_errors`'s, with that runtime)."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise SynthError(f"not well-formed XML ({exc})") from None
    yield from parser_text_errors(xml_text)
    yield from _missing_attributes(root, dict(root.attrib), [runtime_profile(name) for name in RUNTIMES])


# Both loaders read XML with the same hand-written tokenizer (msccl-executor-nccl c6f6b36
# src/misc/msccl/msccl_parser.cc:104-156, mscclXmlGetNode; microsoft/msccl b23e9cd src/graph/xml.cc:106-158,
# xmlGetNode): between elements only ' ', '\n' and '\r' are skipped, anything but '<' then is refused
# ("expecting '<'"), "<!--" starts a comment, and any other element name is read as a tag whose attributes
# must end in '>' ("expected >"), so a "<?xml ...?>" declaration is refused.
_BETWEEN = re.compile(r"[ \n\r]*")
_PARSER_LINES = "msccl_parser.cc:107-113, xml.cc:109-115"


def parser_text_errors(xml_text: str) -> Iterator[str]:
    """What the runtimes' tokenizer refuses that an XML parser accepts: text or a tab between elements, or a
    ``<?...?>`` declaration (the first problem only: the loader stops there)."""
    pos, end = 0, len(xml_text)
    while True:
        pos = _BETWEEN.match(xml_text, pos).end()
        if pos >= end:
            return
        if xml_text[pos] != "<":
            yield (f"character {xml_text[pos]!r} at offset {pos} between elements: both runtimes' XML readers "
                   f"skip only spaces and line breaks there ({_PARSER_LINES})")
            return
        if xml_text.startswith("<!--", pos):
            close = xml_text.find("-->", pos + 4)
            pos = end if close < 0 else close + 3
            continue
        if xml_text.startswith("<?", pos):
            yield (f"an XML declaration or processing instruction (<?...?>) at offset {pos}: both runtimes' XML "
                   "readers refuse it (msccl_parser.cc:151-154, xml.cc:154-157: expected '>')")
            return
        close = xml_text.find(">", pos)
        pos = end if close < 0 else close + 1


def _missing_attributes(root: ET.Element, attrs: Mapping[str, str], profiles: list[RuntimeProfile]) -> Iterator[str]:
    """Attributes that every parser of ``profiles`` reads without a default and the file lacks: each missing
    ``<algo>`` attribute (``attrs``), and per element tag the first element lacking some, with the lines."""
    keys = [(tag, key) for tag, key, _ in profiles[0].reads
            if all((tag, key) in {(t, k) for t, k, _ in p.reads} for p in profiles[1:])]
    who = "both MSCCL runtimes' parsers require" if len(profiles) > 1 else f"{profiles[0].repo}'s parser requires"

    def cite(tag: str, names: list[str]) -> str:
        return ", ".join(p.read_at(tag, name) for p in profiles for name in names[:1])

    for tag, key in keys:
        if tag == "algo" and key not in attrs:
            yield f"<algo> lacks {key}, which {who} ({cite(tag, [key])})"
    for tag in dict.fromkeys(tag for tag, _ in keys if tag != "algo"):
        wanted = [key for t, key in keys if t == tag]
        for k, elem in enumerate(root.iter(tag)):
            missing = [key for key in wanted if key not in elem.attrib]
            if missing:
                yield f"<{tag}> #{k} lacks {', '.join(missing)}, which {who} ({cite(tag, missing)})"
                break


def byte_range(runtime: str | RuntimeProfile, size_bytes: int, min_bytes: int | None = None,
               max_bytes: int | None = None) -> tuple[int, int]:
    """The ``(minBytes, maxBytes)`` to write so that ``runtime`` selects the program for every SIZE in
    ``[min_bytes, max_bytes]`` (inclusive, the user's view; None: from 0, and without upper limit where the
    runtime has one, else up to ``size_bytes``), which must contain ``size_bytes``.

    msccl-executor: ``minBytes ≤ nBytes ≤ maxBytes``, ``maxBytes = 0`` unbounded, so the range is written as
    given (``max_bytes`` 0 or None: 0). microsoft/msccl: ``minBytes ≤ nBytes < maxBytes`` with no unbounded
    value, and its scratch is ``maxBytes × s_chunks / nchunksperloop`` bytes from the start, so ``maxBytes`` is
    ``max_bytes + 1`` (default ``size_bytes + 1``: the program serves SIZE itself; widen with ``--max-bytes``).
    """
    profile = runtime_profile(runtime)
    low = min_bytes or 0
    if low < 0 or (max_bytes is not None and max_bytes < 0):
        raise SynthError(f"--min-bytes/--max-bytes must not be negative ({low}, {max_bytes})")
    unbounded = profile.max_bytes_unbounded
    if unbounded is None and max_bytes == 0:
        raise SynthError(f"--max-bytes 0 means no limit only in msccl-executor-nccl; {profile.repo} selects a "
                         "program only below maxBytes, so give the largest SIZE it should serve")
    if max_bytes is None or max_bytes == unbounded:
        top = None if unbounded is not None else size_bytes     # msccl: no unbounded value, SIZE itself
    else:
        top = max_bytes
    if not (low <= size_bytes and (top is None or size_bytes <= top)):
        raise SynthError(f"--min-bytes/--max-bytes {low}..{'no limit' if top is None else top} exclude SIZE "
                         f"{size_bytes} B, the size the program is synthesized for")
    if unbounded is not None:
        return low, unbounded if top is None else int(top)
    if top >= INT64_MAX:
        raise SynthError(f"--max-bytes {top} does not fit {profile.repo}'s int64 maxBytes once made exclusive")
    return low, int(top) + 1


def scratch_bytes(program: Program, size_bytes: float) -> float:
    """Scratch one rank allocates for the program at SIZE, the largest over ranks: ``s_chunks`` chunks of
    ``SIZE / nchunksperloop`` bytes (msccl-executor-nccl ``msccl_setup.cc`` sizes it ``nBytes ×
    nScratchChunks / nChunksPerLoop``; microsoft/msccl ``init.cc`` the same with ``maxBytes``)."""
    most = max((gpu.s_chunks for gpu in program.gpus), default=0)
    return most * size_bytes / max(program.nchunksperloop, 1)


_MULTIPLE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*x\s*$", re.IGNORECASE)


def parse_scratch_budget(text: str | None, size_bytes: float) -> float:
    """``--max-scratch``: a SIZE in bytes (``512MiB``), a multiple of the buffer (``2x``, ``0.5x``), or
    ``none`` (no budget); None: the buffer's size (``1x``)."""
    from synth.units import parse_size

    if text is None:
        return float(size_bytes)
    if text.strip().lower() in ("none", "inf", "unlimited"):
        return math.inf
    multiple = _MULTIPLE.match(text)
    if multiple:
        return float(multiple.group(1)) * size_bytes
    if text.strip() == "0":   # no scratch at all (parse_size wants a positive SIZE)
        return 0.0
    return float(parse_size(text))


def export_notes(runtime: str | RuntimeProfile, program: Program, size_bytes: float) -> list[str]:
    """What a user loading the exported XML into ``runtime`` must know that the file cannot say."""
    profile = runtime_profile(runtime)
    notes = []
    if program.collective in ROOTED and program.root != 0:
        notes.append(f"this {program.collective} is for root {program.root}, but MSCCL runtimes select a program by "
                     "collective, rank count, in-place flag and size only, never by root: a call with another root "
                     "runs it too and gets wrong data; load it only where every call uses this root")
    if not profile.max_bytes_inclusive and program.collective == "alltoall" and program.inplace:
        notes.append(f"{profile.repo} refuses in-place alltoall calls (all_to_all.cc), so it never runs this program")
    if profile.max_bytes_unbounded is not None and program.collective in ("gather", "scatter"):
        notes.append(f"{profile.repo} loads {program.collective} but no NCCL call selects it by size; run it by "
                     "handle with mscclLoadAlgo / mscclRunAlgo")
    if profile.scratch_from_max_bytes and program.max_bytes > 0:
        most = max((gpu.s_chunks for gpu in program.gpus), default=0)
        if most:
            need = program.max_bytes * most / max(program.nchunksperloop, 1)
            notes.append(f"{profile.repo} allocates maxBytes x s_chunks / nchunksperloop = {need:.0f} B of scratch "
                         "per rank when the communicator is created (init.cc), whatever the call's size")
    return notes

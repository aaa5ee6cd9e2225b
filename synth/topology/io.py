"""Topology files (docs/topology.md): load, validate and save YAML or JSON.

Validation has two layers. The JSON Schema shipped as package data (``schema.json``) checks the
structure: required keys, types, ``bw > 0``, ``alpha >= 0`` and unknown keys. Semantic checks then
resolve node names and reject unknown nodes, self-loops, disagreeing α on parallel entries, bad
``machines``, isolated switches and ranks that cannot reach every other rank (directed, through
switches). Every failure is a :class:`SynthError` with one line: ``FILE: ENTRY: problem``.

Loaded topologies are canonical: directed links merged per (src, dst) (parallel entries add their
bandwidth) and sorted by (src, dst), so ``parse(topology_to_dict(t)) == t`` for every canonical
``t`` (the generators produce canonical topologies too).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from synth.errors import SynthError
from synth.topology.builtin import builtin_names, builtin_path
from synth.topology.checks import (
    MAX_ALPHA_US,
    MAX_BW_GBPS,
    MIN_BW_GBPS,
    canonical_features,
    check_topology,
    hop_diameter,
    join_parallel_switches,
    merge_links,
)
from synth.topology.model import Link, SwitchFeatures, Topology

__all__ = [
    "load_topology",
    "parse_topology",
    "topology_to_dict",
    "save_topology",
    "dump_topology",
    "check_topology",
    "hop_diameter",
    "merge_links",
    "provenance",
    "check_not_shadowing",
    "switch_entries",
]

_YAML_SUFFIXES = {".yaml", ".yml"}
_MAX_REPR = 60


# --------------------------------------------------------------------------------------------
# error formatting


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", str(text)).strip()


def _fail(source: str, where: str, problem: str) -> SynthError:
    where = f"{where}: " if where else ""
    return SynthError(_one_line(f"{source}: {where}{problem}"))


def _path_str(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


_TYPE_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (int, float)):
        return "a number"
    return type(value).__name__


def _schema_problem(error: Any) -> str:
    """Turn a jsonschema ValidationError into a short, human problem statement."""
    kind, value, expected = error.validator, error.instance, error.validator_value
    if kind == "required":
        missing = [k for k in expected if not (isinstance(value, dict) and k in value)]
        return f"missing required key {missing[0]!r}" if missing else error.message
    if kind == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        extra = [k for k in value if k not in known] if isinstance(value, dict) else []
        allowed = ", ".join(sorted(known))
        return f"unknown key {_short(extra[0]) if extra else '?'} (allowed: {allowed})"
    if kind == "type":
        names = [expected] if isinstance(expected, str) else list(expected)
        want = " or ".join(_TYPE_NAMES.get(n, n) for n in names)
        return f"must be {want}, got {_type_name(value)} {_short(value)}"
    if kind in ("exclusiveMinimum", "minimum", "maximum") and isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {_short(value)}"
    if kind == "exclusiveMinimum":
        return f"must be > {expected}, got {_short(value)}"
    if kind == "minimum":
        return f"must be >= {expected}, got {_short(value)}"
    if kind == "maximum":
        return f"must be <= {expected}, got {_short(value)}"
    if kind in ("minLength", "minItems"):
        return "must not be empty"
    if kind == "uniqueItems":
        seen: set = set()
        for item in value:
            key = json.dumps(item, sort_keys=True, default=str)
            if key in seen:
                return f"duplicate entry {_short(item)}"
            seen.add(key)
        return "entries must be unique"
    return error.message


@lru_cache(maxsize=1)
def _validator():
    from importlib.resources import files

    import jsonschema

    schema = json.loads(files("synth.topology").joinpath("schema.json").read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


_LINK_KEYS = frozenset({"src", "dst", "bw", "alpha", "directed"})


def _plain_link(entry: Any) -> bool:
    """A fast, conservative version of the schema's link rule (True only if the schema accepts it)."""
    if type(entry) is not dict or not _LINK_KEYS.issuperset(entry) or "src" not in entry or "dst" not in entry:
        return False
    for key in ("src", "dst"):
        if type(entry[key]) not in (int, str):
            return False
    bw, alpha, directed = entry.get("bw", 1.0), entry.get("alpha", 0.0), entry.get("directed", False)
    return (
        type(bw) in (int, float) and MIN_BW_GBPS <= bw <= MAX_BW_GBPS
        and type(alpha) in (int, float) and 0 <= alpha <= MAX_ALPHA_US
        and type(directed) is bool
    )


def _schema_check(doc: Any, source: str) -> None:
    """jsonschema on the document; large link lists take a fast path that only falls back to
    jsonschema (for the message) when an entry looks wrong."""
    from jsonschema.exceptions import best_match

    links = doc.get("links")
    if type(links) is list and len(links) > 64 and all(_plain_link(e) for e in links):
        doc = {**doc, "links": []}
    try:
        error = best_match(_validator().iter_errors(doc))
        if error is not None:
            problem = _fail(source, _path_str(error.absolute_path), _schema_problem(error))
    except RecursionError:   # jsonschema recurses per level (and repr in its message): a value ~1000 deep
        raise _fail(source, "", "a value is nested too deeply") from None
    if error is not None:
        raise problem


# --------------------------------------------------------------------------------------------
# dict <-> Topology


def _resolve(node: Any, num_ranks: int, switch_ids: dict[str, int], where: str, source: str) -> int:
    if isinstance(node, bool):
        raise _fail(source, where, f"must be a rank integer or a switch name, got {node!r}")
    if isinstance(node, float):
        if not node.is_integer():
            raise _fail(source, where, f"unknown node {_short(node)} (ranks are integers)")
        node = int(node)
    if isinstance(node, int):
        if 0 <= node < num_ranks:
            return node
        raise _fail(source, where, f"unknown node {node} (ranks are 0..{num_ranks - 1})")
    if node in switch_ids:
        return switch_ids[node]
    hint = ", ".join(_short(s) for s in list(switch_ids)[:8]) or "none declared"
    if isinstance(node, str) and node.strip().lstrip("-").isdigit():
        hint += "; ranks must be written as integers, not strings"
    raise _fail(source, where, f"unknown node {_short(node)} (switches: {hint})")


#: Longest topology or switch name; names reach program files and the runtimes' logs.
MAX_NAME_CHARS = 256
#: Longest description.
MAX_DESCRIPTION_CHARS = 4096


def _check_text(value: str, where: str, source: str, limit: int, allowed: str = "") -> None:
    """A string that reaches output files: printable (no control characters) and at most ``limit`` long."""
    if len(value) > limit:
        raise _fail(source, where, f"longer than {limit} characters ({len(value)})")
    bad = next((ch for ch in value if not ch.isprintable() and ch not in allowed), None)
    if bad is not None:
        raise _fail(source, where, f"contains the control or unprintable character {bad!r} in {_short(value)}")


def _check_texts(doc: dict, source: str) -> None:
    """Names and the description (the schema already made them strings)."""
    _check_text(doc["name"], "name", source, MAX_NAME_CHARS)
    if "description" in doc:  # line breaks and tabs are fine in free text
        _check_text(doc["description"], "description", source, MAX_DESCRIPTION_CHARS, allowed="\n\t")
    for k, entry in enumerate(doc.get("switches", ())):
        if isinstance(entry, dict):
            _check_text(entry["name"], f"switches[{k}].name", source, MAX_NAME_CHARS)
        else:
            _check_text(entry, f"switches[{k}]", source, MAX_NAME_CHARS)


_FEATURE_KEYS = ("reduce", "multicast", "reduce_alpha", "reduce_bw")


def _switches(doc: dict, source: str) -> tuple[tuple[str, ...], list[tuple[str, SwitchFeatures]]]:
    """The switch names, and the in-network features of those written as mappings (docs/topology.md,
    "In-network reduction"); the schema already checked the types and ranges."""
    names: list[str] = []
    features: list[tuple[str, SwitchFeatures]] = []
    first: dict[str, int] = {}
    for k, entry in enumerate(doc.get("switches", ())):
        name = entry["name"] if isinstance(entry, dict) else entry
        if name in first:
            raise _fail(source, f"switches[{k}]", f"switch {name!r} is already switches[{first[name]}]")
        first[name] = k
        names.append(name)
        if not isinstance(entry, dict):
            continue
        for key in ("reduce_alpha", "reduce_bw"):
            if key in entry and not math.isfinite(float(entry[key])):
                raise _fail(source, f"switches[{k}].{key}", f"must be a finite number, got {entry[key]!r}")
        if not entry.get("reduce", False) and ("reduce_alpha" in entry or "reduce_bw" in entry):
            raise _fail(source, f"switches[{k}]", f"reduce_alpha and reduce_bw need reduce: true on switch {name!r}")
        features.append((name, SwitchFeatures(
            reduce=entry.get("reduce", False), multicast=entry.get("multicast", False),
            reduce_alpha=float(entry.get("reduce_alpha", 0.0)), reduce_bw=float(entry.get("reduce_bw", math.inf)))))
    return tuple(names), features


def parse_topology(doc: Any, source: str = "<topology>") -> Topology:
    """Validate a decoded YAML/JSON document and build a canonical :class:`Topology`."""
    if not isinstance(doc, dict):
        raise _fail(source, "", f"the top level must be a mapping with name, ranks and links, got {_type_name(doc)}")
    _schema_check(doc, source)
    _check_texts(doc, source)

    num_ranks = int(doc["ranks"])
    switches, features = _switches(doc, source)
    switch_ids = {name: num_ranks + k for k, name in enumerate(switches)}
    defaults = doc.get("defaults", {})

    entries: list[tuple[int, int, float, float, bool]] = []
    for i, raw in enumerate(doc["links"]):
        where = f"links[{i}]"
        src = _resolve(raw["src"], num_ranks, switch_ids, f"{where}.src", source)
        dst = _resolve(raw["dst"], num_ranks, switch_ids, f"{where}.dst", source)
        if src == dst:
            raise _fail(source, where, f"self-loop {raw['src']!r} -> {raw['dst']!r}")
        if "bw" in raw:
            bw = raw["bw"]
        elif "bw" in defaults:
            bw = defaults["bw"]
        else:
            raise _fail(source, where, "missing required key 'bw' (and no defaults.bw)")
        alpha = raw.get("alpha", defaults.get("alpha", 0.0))
        if not math.isfinite(float(bw)):
            raise _fail(source, f"{where}.bw", f"must be a finite number, got {bw!r}")
        if not math.isfinite(float(alpha)):
            raise _fail(source, f"{where}.alpha", f"must be a finite number, got {alpha!r}")
        entries.append((src, dst, float(bw), float(alpha), bool(raw.get("directed", defaults.get("directed", False)))))

    links = merge_links(entries, lambda i, problem: _fail(source, f"links[{i}]", problem))
    written = (tuple(switches), links)
    switches, links = join_parallel_switches(num_ranks, tuple(switches), links, dict(features))

    machines: list[tuple[int, ...]] = []
    owner: dict[int, int] = {}
    for m, group in enumerate(doc.get("machines", ())):
        for rank in group:
            rank = int(rank)
            if rank >= num_ranks:
                raise _fail(source, f"machines[{m}]", f"unknown rank {rank} (ranks are 0..{num_ranks - 1})")
            if rank in owner:
                raise _fail(source, f"machines[{m}]", f"rank {rank} is already in machines[{owner[rank]}]")
            owner[rank] = m
        machines.append(tuple(int(r) for r in group))
    if machines and len(owner) != num_ranks:
        lost = next(r for r in range(num_ranks) if r not in owner)
        raise _fail(source, "machines", f"rank {lost} is in no machine (machines must cover every rank)")

    def built(switches: tuple[str, ...], links: tuple[Link, ...], as_written: Topology | None = None) -> Topology:
        return Topology(name=doc["name"], num_ranks=num_ranks, links=links, switches=switches,
                        machines=tuple(machines), description=doc.get("description", ""),
                        features=canonical_features(switches, features), source=source, as_written=as_written)

    joined = switches != written[0]
    return check_topology(built(switches, links, built(*written) if joined else None), source)


def _number(value: float) -> int | float:
    """Integral floats are written as ints: ``bw: 50`` rather than ``bw: 50.0``."""
    return int(value) if float(value).is_integer() and abs(value) < 2**53 else float(value)


def switch_entries(topology: Topology, names: Iterable[str]) -> list[str | dict[str, Any]]:
    """The file form of switches ``names`` of ``topology``: each a plain name, or a mapping with its
    in-network features (docs/topology.md, "In-network reduction")."""
    if not topology.features:
        return list(names)
    featured = dict(topology.features)
    return [_switch_entry(name, featured[name]) if name in featured else name for name in names]


def _switch_entry(name: str, features: SwitchFeatures) -> dict[str, Any]:
    """A switch with in-network features as a mapping; only the keys that differ from the defaults."""
    entry: dict[str, Any] = {"name": name}
    if features.reduce:
        entry["reduce"] = True
    if features.multicast:
        entry["multicast"] = True
    if features.reduce_alpha:
        entry["reduce_alpha"] = _number(features.reduce_alpha)
    if math.isfinite(features.reduce_bw):
        entry["reduce_bw"] = _number(features.reduce_bw)
    return entry


def topology_to_dict(topology: Topology) -> dict[str, Any]:
    """The file form of a topology: a link pair with equal (bw, α) both ways becomes one
    undirected entry; a common bw or α moves to ``defaults``."""
    doc: dict[str, Any] = {"name": topology.name}
    if topology.description:
        doc["description"] = topology.description
    doc["ranks"] = topology.num_ranks
    if topology.switches:
        doc["switches"] = switch_entries(topology, topology.switches)
    if topology.machines:
        doc["machines"] = [list(m) for m in topology.machines]

    links = topology.links
    defaults: dict[str, Any] = {}
    if links:
        bws = {link.bw for link in links}
        alphas = {link.alpha for link in links}
        if len(bws) == 1:
            defaults["bw"] = _number(next(iter(bws)))
        if len(alphas) == 1:
            defaults["alpha"] = _number(next(iter(alphas)))
    if defaults:
        doc["defaults"] = defaults

    by_pair = {(link.src, link.dst): link for link in links}
    entries = []
    for link in sorted(links, key=lambda x: (min(x.src, x.dst), max(x.src, x.dst), x.src)):
        back = by_pair.get((link.dst, link.src))
        undirected = back is not None and back.bw == link.bw and back.alpha == link.alpha
        if undirected and link.src > link.dst:
            continue  # written once, from the smaller end
        entry: dict[str, Any] = {"src": topology.node_name(link.src), "dst": topology.node_name(link.dst)}
        if "bw" not in defaults:
            entry["bw"] = _number(link.bw)
        if "alpha" not in defaults:
            entry["alpha"] = _number(link.alpha)
        if not undirected:
            entry["directed"] = True
        entries.append(entry)
    doc["links"] = entries
    return doc


# --------------------------------------------------------------------------------------------
# text <-> document


_RESOLVED_TAGS = 1 << 16     # distinct scalar texts whose implicit tag the YAML loader remembers


def _yaml_loader():
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: ~4x faster

    class StrictLoader(base):
        """Safe YAML that rejects duplicate keys instead of silently keeping the last one."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._tags: dict[tuple[str, tuple[bool, bool]], str] = {}

        def resolve(self, kind, value, implicit):  # noqa: ANN001, ANN202 (PyYAML's signature)
            # The implicit tag of a plain scalar depends only on its text (SafeLoader has no path resolvers),
            # and a topology repeats a few texts ("src", "bw", rank numbers) many times: regex matching each
            # one took most of the load time of a large file (200k links: 6 s of 11).
            if kind is not yaml.ScalarNode or self.yaml_path_resolvers:
                return super().resolve(kind, value, implicit)
            key = (value, implicit)
            tag = self._tags.get(key)
            if tag is None:
                tag = super().resolve(kind, value, implicit)
                if len(self._tags) < _RESOLVED_TAGS:
                    self._tags[key] = tag
            return tag

    def construct_mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):  # compare raw scalars: cheap, no construction
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key)
        return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


def _yaml_error(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"malformed YAML{where}: {problem}"


def decode_text(text: str, source: str, fmt: str | None = None) -> Any:
    """Decode YAML or JSON text; ``fmt`` is ``json``, ``yaml`` or None (guess from the text)."""
    if fmt is None:
        fmt = "json" if text.lstrip().startswith("{") else "yaml"
    if fmt == "json":
        try:
            return json.loads(text)
        except RecursionError:
            raise _fail(source, "", "malformed JSON: nested too deeply") from None
        except ValueError as exc:
            return_msg = f"malformed JSON: {exc}"
            raise _fail(source, "", return_msg) from None
    import yaml

    loader = _yaml_loader()(text)
    try:
        # Compose, bound the expanded size, then construct: what yaml.load does, plus the bound.
        node = loader.get_single_node()
        if node is None:
            return None
        if "*" in text:  # without one there is no alias, and the walk would cost ~1 s per million nodes
            _check_expanded_size(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _fail(source, "", _yaml_error(exc)) from None
    except RecursionError:
        raise _fail(source, "", "malformed YAML: nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. an impossible date 2021-02-30
        raise _fail(source, "", f"malformed YAML: {exc}") from None
    finally:
        loader.dispose()


#: Most nodes a YAML document may expand to through aliases, unless it writes out more itself.
MAX_YAML_NODES = 1_000_000


def _check_expanded_size(root: Any, source: str) -> None:
    """Refuse a YAML node graph whose aliases expand it past ``MAX_YAML_NODES`` ("billion laughs").

    An alias is the same node object in several places, so the expanded size is 1 + the sizes of
    the children, memoised by node identity: linear in the nodes written. Iterative, so depth is
    no problem. A document written out in full (no aliases) always passes, whatever its size.
    """
    size: dict[int, int] = {}
    distinct = 0
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in size and not done:
            continue
        children = _yaml_children(node)
        if not done:
            distinct += 1
            size[key] = 0  # placeholder: a recursive alias (a node inside itself) counts once
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in size)
            continue
        size[key] = 1 + sum(size[id(child)] for child in children)
    limit = max(MAX_YAML_NODES, distinct)
    if size[id(root)] > limit:
        raise _fail(
            source, "", f"YAML aliases expand the document to {size[id(root)]:,} nodes, more than the limit of "
            f"{limit:,} (an alias bomb?)"
        )


def _yaml_children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):  # (key, value) pairs
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return node.value
    return []


def _format_of(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in _YAML_SUFFIXES:
        return "yaml"
    return None


#: Largest topology file read (docs/topology.md): ~1.5M link entries in JSON, ~30 bytes of memory per byte.
MAX_TOPOLOGY_BYTES = 32 * 2**20
#: Largest YAML topology file (~125k link entries): PyYAML's node graph takes up to ~180 bytes of memory
#: and 1.6 µs of CPU per byte, so the densest 4 MiB file loads in ~750 MB and ~7 s (JSON: 30x faster).
MAX_YAML_TOPOLOGY_BYTES = 4 * 2**20


def read_topology_file(path: str | os.PathLike) -> Topology:
    from synth.fileio import read_input_text

    path = Path(path)
    source = str(path)
    text = read_input_text(path, "topology file", MAX_TOPOLOGY_BYTES)
    if not text.strip():
        raise _fail(source, "", "empty file (expected a YAML or JSON topology)")
    fmt = _format_of(path) or ("json" if text.lstrip().startswith("{") else "yaml")
    if fmt == "yaml" and len(text) > MAX_YAML_TOPOLOGY_BYTES:
        raise _fail(source, "", f"a YAML topology file holds at most {MAX_YAML_TOPOLOGY_BYTES // 2**20} MiB (its parse "
                                f"takes ~180 bytes of memory per byte); write it as JSON (up to "
                                f"{MAX_TOPOLOGY_BYTES // 2**20} MiB)")
    doc = decode_text(text, source, fmt)
    from synth.topology.importers import topology_from_msccl
    from synth.topology.msccl_tools import is_msccl_object

    if is_msccl_object(doc):   # an msccl-tools topology JSON, read at the import defaults (docs/topology.md)
        return topology_from_msccl(doc, source)
    return parse_topology(doc, source)


def load_topology(name_or_path: str | os.PathLike) -> Topology:
    """Load a topology file, or a built-in (``dgx1`` -> ``topologies/dgx1.yaml``) if no such file exists."""
    path = Path(name_or_path)
    if path.exists():
        return read_topology_file(path)
    builtin = builtin_path(str(name_or_path))
    if builtin is not None:
        return read_topology_file(builtin)
    names = ", ".join(builtin_names())
    raise SynthError(f"{name_or_path}: no such file and no built-in topology of that name (built-ins: {names})")


def provenance(topology: Topology) -> str:
    """Where ``topology`` came from, as recorded in a program: ``builtin:NAME`` for a built-in file,
    ``file:/abs/path`` for another file, ``generated`` for one built in memory (generators, API)."""
    if topology.source is None:
        return "generated"
    path = Path(topology.source)
    if not path.is_file():
        return "generated"
    path = path.resolve()
    builtin = builtin_path(path.stem)
    if builtin is not None and builtin.resolve() == path:
        return f"builtin:{path.stem}"
    return f"file:{path}"


def check_not_shadowing(topology: Topology) -> None:
    """Refuse a topology named like a built-in with other content: a program made for it would name a fabric
    that ``-t NAME`` resolves to something else. The same content under that name is fine."""
    builtin = builtin_path(topology.name)
    if builtin is None:
        return
    theirs = read_topology_file(builtin).sha256
    if theirs != topology.sha256:
        raise SynthError(f"topology {topology.name!r} shadows the built-in of that name with other content "
                         f"(sha256 {topology.sha256[:12]} vs built-in {theirs[:12]}); pass --name to name it otherwise")


def dump_topology(topology: Topology, fmt: str = "yaml") -> str:
    """The text of a topology file (``yaml`` or ``json``)."""
    doc = topology_to_dict(topology)
    _check_texts(doc, topology.source or "topology")  # never write what load_topology would reject
    if fmt == "json":
        return _readable_size(json.dumps(doc, indent=2) + "\n", fmt, topology.name)
    # PyYAML's writer takes ~60 µs per link: first a lower bound from compact JSON (a YAML link entry is at
    # most 4 bytes shorter: no quotes around keys and names, but "- " and a space after each ":" and ",")
    least = len(json.dumps(doc, separators=(",", ":")).encode("utf-8")) - 4 * len(doc["links"])
    if least > MAX_YAML_TOPOLOGY_BYTES:
        _readable_size("", fmt, topology.name, least)
    return _readable_size(_yaml_text(doc), fmt, topology.name)


def _readable_size(text: str, fmt: str, name: str, size: int | None = None) -> str:
    """``text``, unless it is larger than :func:`read_topology_file` reads (``size``: known larger already)."""
    limit = MAX_TOPOLOGY_BYTES if fmt == "json" else MAX_YAML_TOPOLOGY_BYTES
    size = len(text.encode("utf-8")) if size is None else size
    if size > limit:
        hint = "write it as .json (up to 32 MiB)" if fmt == "yaml" else "generate a smaller topology"
        raise SynthError(f"topology {name!r} would be {size / 2**20:.1f} MiB or more of {fmt.upper()}, more than the "
                         f"{limit // 2**20} MiB synth reads back (docs/topology.md); {hint}")
    return text


def _yaml_text(doc: dict[str, Any]) -> str:
    """The YAML of a topology document: one flow-style mapping per link."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    class FlowMap(dict):
        pass

    class FlowSeq(list):
        pass

    Dumper.add_representer(
        FlowMap, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v.items(), flow_style=True)
    )
    Dumper.add_representer(FlowSeq, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
    if "switches" in doc:
        doc["switches"] = FlowSeq(FlowMap(s) if isinstance(s, dict) else s for s in doc["switches"])
    if "machines" in doc:
        doc["machines"] = [FlowSeq(m) for m in doc["machines"]]
    if "defaults" in doc:
        doc["defaults"] = FlowMap(doc["defaults"])
    doc["links"] = [FlowMap(e) for e in doc["links"]]
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100, allow_unicode=True)


def save_topology(topology: Topology, path: str | os.PathLike) -> Path:
    """Write a topology atomically; ``.json`` gives JSON, anything else YAML."""
    from synth.fileio import atomic_write_text

    suffix = Path(path).suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise SynthError(f"{path}: unknown topology file extension {suffix or '(none)'!r}; use .yaml, .yml or .json")
    fmt = "json" if suffix == ".json" else "yaml"
    try:
        return atomic_write_text(path, dump_topology(topology, fmt))
    except OSError as exc:
        raise SynthError(f"{path}: cannot write topology file ({exc.strerror or exc})") from None

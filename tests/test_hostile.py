"""Hostile or odd input (issue 32): every case ends in exit code 2 with one clear line, never a hang,
a traceback, a MemoryError or an internal error, and synth never writes a file it would reject.

Each case runs the real CLI in a subprocess under a 30 s timeout and a 2 GB address-space limit.
"""

from __future__ import annotations

import json
import os
import re
import resource
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.cli import cli
from synth.errors import SynthError

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 30
MEMORY_BYTES = 2 * 2**30
# A valid two-rank topology; cases replace one field with something hostile.
BASE = {"name": "pair", "ranks": 2, "links": [{"src": 0, "dst": 1, "bw": 10}]}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def run_synth(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("SYNTH_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "synth", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, preexec_fn=_limit_memory, env=env, cwd=cwd)


def assert_rejected(result: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 2 and one line naming the problem (click's usage banner around it aside)."""
    err = result.stderr
    assert result.returncode == 2, (result.returncode, err[-2000:])
    for bad in ("Traceback", "MemoryError", "internal error", "out of memory"):
        assert bad not in err, err[-2000:]
    lines = message_lines(err)
    assert len(lines) == 1, err[-2000:]
    for word in words:
        assert word in lines[0], lines[0]


def message_lines(err: str) -> list[str]:
    """The non-blank lines of ``err`` past click's usage banner (``Usage: ...`` to ``Try '...'``, wrapped)."""
    lines = err.splitlines()
    if lines and lines[0].startswith("Usage:"):
        lines = lines[next((k + 1 for k, line in enumerate(lines) if line.startswith("Try '")), 0):]
    return [line for line in lines if line.strip()]


def bomb(depth: int = 9) -> str:
    """A YAML flow sequence whose aliases expand to about 10**depth nodes ("billion laughs")."""
    parts = ['&a0 [' + ", ".join(['"lol"'] * 10) + "]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, depth)]
    return "[" + ", ".join(parts) + "]"


def yaml_with(field: str, value: str) -> str:
    """``BASE`` as YAML with ``field`` set to the raw YAML ``value``."""
    fields = {"name": "pair", "ranks": "2", "links": "[{src: 0, dst: 1, bw: 10}]", field: value}
    return "".join(f"{key}: {text}\n" for key, text in fields.items())


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


def topology_json(**changes: object) -> str:
    return json.dumps({**BASE, **changes})


# ---- YAML alias bombs --------------------------------------------------------------------------

BOMB_FIELDS = ["name", "description", "ranks", "switches", "machines", "defaults", "links", "extra"]


@pytest.mark.parametrize("field", BOMB_FIELDS)
def test_alias_bomb_validate(tmp_path, field):
    path = write(tmp_path, "bomb.yaml", yaml_with(field, bomb()))
    assert_rejected(run_synth("topology", "validate", path), "alias")


def test_alias_bomb_inside_a_link(tmp_path):
    path = write(tmp_path, "bomb.yaml", yaml_with("links", f"[{{src: 0, dst: 1, bw: 1, alpha: {bomb()}}}]"))
    assert_rejected(run_synth("topology", "validate", path), "alias")


def test_alias_bomb_of_mappings(tmp_path):
    parts = ["&m0 {src: 0, dst: 1, bw: 1}"] + [f"&m{i} [" + ", ".join([f"*m{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = write(tmp_path, "bomb.yaml", yaml_with("links", "[" + ", ".join(parts) + "]"))
    assert_rejected(run_synth("topology", "validate", path), "alias")


@pytest.mark.parametrize("command", [["bounds", "-c", "allgather"],
                                     ["synthesize", "-c", "allgather", "-m", "ring", "-s", "1MiB"],
                                     ["topology", "show"]])
def test_alias_bomb_other_commands(tmp_path, command):
    path = write(tmp_path, "bomb.yaml", yaml_with("description", bomb()))
    args = [*command, path] if command[0] == "topology" else [command[0], "-t", path, *command[1:]]
    assert_rejected(run_synth(*args, cwd=tmp_path), "alias")
    assert not list(tmp_path.glob("*.xml"))


def test_recursive_alias_is_a_clear_error(tmp_path):
    path = write(tmp_path, "rec.yaml", yaml_with("name", "&r [*r]"))
    assert_rejected(run_synth("topology", "validate", path), "name")


def test_aliases_in_a_real_topology_still_load(tmp_path):
    text = ("name: trio\nranks: 3\nlinks:\n  - {src: 0, dst: 1, bw: &bw 10, alpha: &a 0.5}\n"
            "  - {src: 1, dst: 2, bw: *bw, alpha: *a}\n")
    result = run_synth("topology", "validate", write(tmp_path, "ok.yaml", text))
    assert result.returncode == 0, result.stderr


# ---- unbounded and odd files -------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["topology", "validate", "/dev/zero"],
    ["bounds", "-t", "/dev/zero", "-c", "allgather"],
    ["synthesize", "-t", "/dev/zero", "-c", "allgather", "-m", "ring", "-s", "1MiB"],
    ["verify", "/dev/zero"],
    ["simulate", "/dev/zero"],
])
def test_dev_zero(tmp_path, args):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    assert_rejected(run_synth(*args, cwd=tmp_path), "/dev/zero", "MiB limit")


def test_dev_urandom(tmp_path):
    if not os.path.exists("/dev/urandom"):
        pytest.skip("no /dev/urandom")
    assert_rejected(run_synth("topology", "validate", "/dev/urandom"), "/dev/urandom", "MiB limit")


@pytest.mark.parametrize("suffix,args", [(".yaml", ["topology", "validate"]), (".json", ["topology", "validate"]),
                                         (".xml", ["verify"]), (".json", ["simulate"])])
def test_huge_file(tmp_path, suffix, args):
    path = tmp_path / f"huge{suffix}"
    with open(path, "wb") as handle:  # sparse: no disk used
        handle.truncate(300 * 2**20)
    assert_rejected(run_synth(*args, str(path)), "MiB limit")


def test_fifo_is_size_capped(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"head -c 300000000 /dev/zero > {fifo}"])
    try:
        assert_rejected(run_synth("topology", "validate", str(fifo)), "MiB limit")
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.parametrize("args", [["topology", "validate"], ["verify"]])
def test_directory(tmp_path, args):
    (tmp_path / "d.yaml").mkdir()
    assert_rejected(run_synth(*args, str(tmp_path / "d.yaml")), "directory")


@pytest.mark.parametrize("name,content", [
    ("bad.yaml", b"name: \xff\xfe\nranks: 2\nlinks: []\n"),
    ("bad.json", b'{"name": "\xc3\x28", "ranks": 2, "links": []}'),
    ("latin1.yaml", "name: caf\u00e9\nranks: 2\nlinks: [{src: 0, dst: 1, bw: 1}]\n".encode("latin-1")),
])
def test_non_utf8_topology(tmp_path, name, content):
    assert_rejected(run_synth("topology", "validate", write(tmp_path, name, content)), "UTF-8")


def test_non_utf8_program(tmp_path):
    assert_rejected(run_synth("verify", write(tmp_path, "p.xml", b'<algo name="\xff"/>')), "UTF-8")


@pytest.mark.parametrize("name,content", [
    ("deep.yaml", "name: " + "[" * 100_000 + "]" * 100_000 + "\nranks: 2\nlinks: []\n"),
    ("deep-block.yaml", "name:\n" + "".join("  " * i + "- \n" for i in range(1, 3000)) + "ranks: 2\n"),
    ("deep.json", '{"name": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ("deep-map.yaml", "name: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"),
])
def test_deeply_nested(tmp_path, name, content):
    assert_rejected(run_synth("topology", "validate", write(tmp_path, name, content)))


# ---- wrong types and values --------------------------------------------------------------------

@pytest.mark.parametrize("text,words", [
    (topology_json(ranks="x"), ["ranks"]),
    (topology_json(ranks=10**12), ["ranks"]),
    (topology_json(ranks=True), ["ranks"]),
    (topology_json(links=5), ["links"]),
    (topology_json(name=5), ["name"]),
    (topology_json(links=[{"src": 0, "dst": 1, "bw": "fast"}]), ["bw"]),
    (topology_json(links=[{"src": 0, "dst": 1, "bw": 1e400}]), ["bw"]),
    (topology_json(switches=[["a"]]), ["switches"]),
    ("[1, 2, 3]", ["mapping"]),
    ("42", ["mapping"]),
    ("   \n", ["empty"]),
    ("name: pair\nname: other\nranks: 2\nlinks: []\n", ["duplicate"]),
])
def test_wrong_types(tmp_path, text, words):
    suffix = ".json" if text.lstrip().startswith(("{", "[")) else ".yaml"
    assert_rejected(run_synth("topology", "validate", write(tmp_path, "t" + suffix, text)), *words)


# ---- names that reach output files -------------------------------------------------------------

@pytest.mark.parametrize("changes,field", [
    ({"name": "a\u0000b"}, "name"),
    ({"name": "a\x01b"}, "name"),
    ({"name": "red\x1b[31m"}, "name"),
    ({"name": "line\nbreak"}, "name"),
    ({"name": "del\x7f"}, "name"),
    ({"name": "x" * 300}, "name"),
    ({"name": "lone\ud800"}, "name"),
    ({"description": "bell\x07"}, "description"),
    ({"switches": ["sw\x02"], "links": [{"src": 0, "dst": "sw\x02", "bw": 1}, {"src": 1, "dst": "sw\x02", "bw": 1}]},
     "switches[0]"),
])
def test_unprintable_names(tmp_path, changes, field):
    path = write(tmp_path, "t.json", json.dumps({**BASE, **changes}))
    result = run_synth("synthesize", "-t", path, "-c", "allgather", "-m", "ring", "-s", "1MiB", "-o", "p.xml",
                       cwd=tmp_path)
    assert_rejected(result, field)
    assert not (tmp_path / "p.xml").exists()


def test_generate_refuses_a_name_it_could_not_load(tmp_path):
    result = run_synth("topology", "generate", "ring", "-n", "4", "--name", "a\x01b", "-o", str(tmp_path / "r.yaml"))
    assert_rejected(result, "name")
    assert not (tmp_path / "r.yaml").exists()


def test_xml_writer_refuses_what_xml_cannot_hold():
    from synth.program.msccl_xml import _xml_attr

    with pytest.raises(SynthError, match="cannot be written"):
        _xml_attr("a\x01b", "name")
    assert _xml_attr('say "hi"\n', "name") == '"say &quot;hi&quot;&#10;"'


_PRINTABLE = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40).filter(str.isprintable)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_PRINTABLE)
def test_valid_names_round_trip_through_programs(tmp_path_factory, name):
    from synth.program.load import load_program
    from synth.topology.io import load_topology, save_topology

    base = tmp_path_factory.mktemp("names")
    topology = load_topology("dgx1")
    path = base / "t.json"
    save_topology(replace(topology, name=name), path)
    assert load_topology(path).name == name
    for out in ("p.xml", "p.json"):
        result = CliRunner().invoke(cli, ["synthesize", "-t", str(path), "-c", "allgather", "-m", "ring", "-s", "1MiB",
                                          "-o", str(base / out)])
        assert result.exit_code == 0, result.output
        assert name in load_program(base / out).name


# ---- numeric CLI options -----------------------------------------------------------------------

SYN = ["synthesize", "-t", "dgx1", "-c", "allgather", "-s", "1MiB"]


@pytest.mark.parametrize("args,option", [
    ([*SYN, "--time-limit", "nan"], "--time-limit"),
    ([*SYN, "--time-limit", "inf"], "--time-limit"),
    ([*SYN, "--time-limit", "-1"], "--time-limit"),
    ([*SYN, "--time-limit", "0"], "--time-limit"),
    ([*SYN, "--time-limit", "1e300"], "--time-limit"),
    ([*SYN, "--chunks", str(10**8)], "--chunks"),
    ([*SYN, "--chunks", "0"], "--chunks"),
    ([*SYN, "--threads", "100000"], "--threads"),
    ([*SYN, "--threads", "-3"], "--threads"),
    ([*SYN, "--gap", "nan"], "--gap"),
    ([*SYN, "--gap", "2"], "--gap"),
    ([*SYN, "--max-trees", str(10**9)], "--max-trees"),
    ([*SYN, "--root", "-1"], "--root"),
    ([*SYN, "--root", str(10**12)], "--root"),
    (["bounds", "-t", "dgx1", "-c", "allgather", "--root", "-5"], "--root"),
    (["execute", "p.xml", "--timeout", "nan"], "--timeout"),
    (["execute", "p.xml", "--timeout", "inf"], "--timeout"),
    (["execute", "p.xml", "--timeout", "-1"], "--timeout"),
    (["execute", "p.xml", "--iters", str(10**9)], "--iters"),
    (["execute", "p.xml", "--warmup", "-1"], "--warmup"),
    (["pareto", "-t", "dgx1", "-c", "allgather", "--time-limit", "nan"], "--time-limit"),
    (["pareto", "-t", "dgx1", "-c", "allgather", "--threads", str(10**6)], "--threads"),
    (["pareto", "-t", "dgx1", "-c", "allgather", "--max-chunks", str(10**9)], "--max-chunks"),
    (["compare", "-t", "dgx1", "-c", "allgather", "--time-limit", "nan"], "--time-limit"),
    (["sweep", "-t", "dgx1", "-c", "allgather", "-s", "1M", "-o", "t.csv", "--jobs", str(10**6)], "--jobs"),
    (["sweep", "-t", "dgx1", "-c", "allgather", "-s", "1M", "-o", "t.csv", "--time-limit", "inf"], "--time-limit"),
])
def test_numeric_options(tmp_path, args, option):
    assert_rejected(run_synth(*args, cwd=tmp_path), option)


@pytest.mark.parametrize("args,words", [
    (["ring", "-n", str(10**9)], ["ring size"]),
    (["ring", "-n", "4", "--bw", "nan"], ["bw"]),
    (["ring", "-n", "4", "--alpha", "inf"], ["alpha"]),
    (["leaf-spine", "--leaves", "100000", "--per-leaf", "100000"], ["limit"]),
    (["boxes", "--boxes", str(10**6), "--per-box", str(10**6)], ["limit"]),
    (["hypercube", "--dim", "1000"], ["dimension"]),
    (["torus", "--dims", "100000x100000"], ["limit"]),
    (["boxes", "--boxes", str(10**6), "--per-box", "1"], ["limit"]),     # ran minutes: 2·10^6 switches, one by one
    (["fully-connected", "-n", "3000"], ["links"]),
    (["ring", "-n", "200000", "-o", "r.yaml"], ["MiB", ".json"]),          # YAML synth could not read back
])
def test_generate_huge_or_non_finite(tmp_path, args, words):
    assert_rejected(run_synth("topology", "generate", *args, cwd=tmp_path), *words)


def test_a_large_generated_ring_reads_back(tmp_path):
    """10^5 ranks: written, then validated; the all-pairs diameter is skipped, not run for minutes."""
    result = run_synth("topology", "generate", "ring", "-n", "100000", "-o", "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    result = run_synth("topology", "validate", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["ranks"] == 100_000 and info["diameter"] is None


# ---- output to non-regular files ---------------------------------------------------------------

def test_output_to_dev_null_keeps_the_device(tmp_path):
    if not os.access("/dev/null", os.W_OK):
        pytest.skip("/dev/null is not writable")
    link = tmp_path / "p.xml"  # synthesize wants a .xml name: point one at /dev/null
    link.symlink_to("/dev/null")
    result = run_synth("synthesize", "-t", "dgx1", "-c", "allgather", "-m", "ring", "-s", "1MiB", "-o", str(link))
    assert result.returncode == 0, result.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert link.is_symlink()
    assert [p.name for p in tmp_path.iterdir()] == ["p.xml"]


def test_atomic_write_to_dev_null_directly():
    if not os.access("/dev/null", os.W_OK):
        pytest.skip("/dev/null is not writable")
    from synth.fileio import atomic_write_text

    atomic_write_text("/dev/null", "x")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("unnamed", [True, False])
def test_failed_write_leaves_no_temp_file(tmp_path, monkeypatch, unnamed):
    import synth.fileio as fileio

    if not unnamed:  # the portable mkstemp path
        monkeypatch.setattr(fileio, "_write_unnamed", lambda *a: False)

    def broken_replace(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", broken_replace)
    (tmp_path / "out.txt").write_text("old")
    with pytest.raises(OSError):
        fileio.atomic_write_text(tmp_path / "out.txt", "new")
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    assert (tmp_path / "out.txt").read_text() == "old"


# ---- synth's own size limits (synth/limits.py): refused at once, naming the limit ------------------------------
@pytest.mark.parametrize(("ranks", "command"), [
    (5000, ["synthesize", "-c", "allgather"]),     # 24,995,000 chunk transfers > 2**24
    (9000, ["bounds", "-c", "allgather"]),         # more ranks than bounds and synthesis take
    (9000, ["synthesize", "-c", "broadcast"]),
])
def test_too_big_requests_stop_at_a_stated_limit(tmp_path, ranks, command):
    from synth.topology import generators as gen
    from synth.topology.io import dump_topology

    path = tmp_path / "big.yaml"
    path.write_text(dump_topology(gen.ring(ranks)))
    out = ["-o", str(tmp_path / "p.xml")] if command[0] == "synthesize" else []
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "synth", *command, "-t", str(path), *out],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "limit" in result.stderr or "at most" in result.stderr
    assert "docs/cli.md" in result.stderr and "Traceback" not in result.stderr
    assert time.monotonic() - began < 30
    assert not (tmp_path / "p.xml").exists()


_FABRICS = st.one_of(
    st.builds(lambda n: ("ring", n), st.integers(3, 8)),
    st.builds(lambda a, b: ("torus", (a, b)), st.integers(2, 3), st.integers(2, 4)),
    st.builds(lambda n, seed: ("rr3", (n, seed)), st.sampled_from([8, 10, 12]), st.integers(1, 3)),
)


def _fabric(kind: str, arg):
    from synth.topology import generators as gen

    if kind == "ring":
        return gen.ring(arg)
    if kind == "torus":
        return gen.torus(list(arg))
    return gen.random_regular(arg[0], 3, arg[1], (25.0, 50.0, 100.0))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fabric=_FABRICS, name=_PRINTABLE, method=st.sampled_from(["ring", "trees", "greedy"]), data=st.data())
def test_every_written_program_reloads_and_verifies(tmp_path_factory, fabric, name, method, data):
    """Whatever synthesize writes for a valid request loads again and verifies (XML with the runtimes' checks)."""
    from synth.program.load import load_program_format
    from synth.synthesis.registry import METHODS
    from synth.topology.io import save_topology
    from synth.verification import verify

    base = tmp_path_factory.mktemp("written")
    path = base / "t.json"
    save_topology(replace(_fabric(*fabric), name=name), path)
    collective = data.draw(st.sampled_from(sorted(METHODS[method].collectives)))
    for out in ("p.xml", "p.json"):
        result = CliRunner().invoke(cli, ["synthesize", "-t", str(path), "-c", collective, "-m", method, "-s", "1MiB",
                                          "-o", str(base / out)])
        if result.exit_code != 0:   # a method may refuse a fabric (one line, exit 2), and then writes nothing
            assert fabric[0] != "ring" or method != "ring", result.output   # ... but the ring runs on a ring
            assert result.exit_code == 2 and result.output.startswith("error: "), result.output
            assert not (base / out).exists()
            continue
        program, fmt = load_program_format(base / out)
        assert verify(program, msccl_limits=fmt == "xml").ok


# ---- generated cases (hypothesis, derandomized): mutated topologies, programs and CLI arguments ------------
# Each example runs the real CLI. Whatever the mutation, the run ends in exit 0 (the mutation left the input
# valid: then what it read loads, and what it wrote loads and verifies), 1 (verify found the program wrong)
# or 2 with one clear line.

GENERATED = settings(derandomize=True, database=None, deadline=None, max_examples=40,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                            HealthCheck.data_too_large])


def assert_clean(result: subprocess.CompletedProcess, codes: tuple[int, ...] = (0, 2)) -> None:
    """An allowed exit code; on failure one clear line (click's usage banner aside), never a traceback."""
    err = result.stderr
    assert result.returncode in codes, (result.returncode, err[-2000:])
    for bad in ("Traceback", "MemoryError", "internal error", "out of memory"):
        assert bad not in err, err[-2000:]
    if result.returncode == 2:
        lines = message_lines(err)
        assert len(lines) == 1 and lines[0].lower().startswith("error"), err[-2000:]


def assert_written_loads(path: Path) -> None:
    """A program synth wrote loads again and verifies (XML with the runtimes' checks)."""
    from synth.program.load import load_program_format
    from synth.verification import verify

    program, fmt = load_program_format(path)
    assert verify(program, msccl_limits=fmt == "xml").ok


_HOSTILE_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["", "1e400", "-0", "0x10", "\u202e", "\x00", "\x1b[2J", "sw", "9" * 400]),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["a", "src", "bw"]), st.integers(), max_size=2),
)
_BASES = [
    {"name": "ring4", "ranks": 4, "links": [{"src": i, "dst": (i + 1) % 4, "bw": 10} for i in range(4)]},
    {"name": "star3", "ranks": 3, "switches": ["sw"], "machines": [[0, 1], [2]], "defaults": {"bw": 25, "alpha": 0.5},
     "links": [{"src": r, "dst": "sw"} for r in range(3)]},
]
_TOP_KEYS = ["name", "description", "ranks", "switches", "machines", "defaults", "links", "extra"]
_LINK_KEYS = ["src", "dst", "bw", "alpha", "directed", "extra"]


@st.composite
def hostile_topology_doc(draw) -> object:
    """A valid small topology with one or two hostile edits."""
    import copy

    doc = copy.deepcopy(draw(st.sampled_from(_BASES)))
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["set", "delete", "link-set", "link-delete", "self-link", "unknown-node",
                                     "duplicate-switch", "duplicate-rank", "disconnect", "deep", "many-links"]))
        links = doc.setdefault("links", []) if isinstance(doc.get("links"), list) else None
        if kind == "set":
            doc[draw(st.sampled_from(_TOP_KEYS))] = draw(_HOSTILE_SCALARS)
        elif kind == "delete" and doc:
            doc.pop(draw(st.sampled_from(sorted(doc))), None)
        elif kind == "link-set" and links and isinstance(links[0], dict):
            links[draw(st.integers(0, len(links) - 1))][draw(st.sampled_from(_LINK_KEYS))] = draw(_HOSTILE_SCALARS)
        elif kind == "link-delete" and links and isinstance(links[0], dict):
            links[draw(st.integers(0, len(links) - 1))].pop(draw(st.sampled_from(_LINK_KEYS)), None)
        elif kind == "self-link" and links is not None:
            links.append({"src": 1, "dst": 1, "bw": 1})
        elif kind == "unknown-node" and links is not None:
            links.append({"src": 0, "dst": draw(st.sampled_from(["nosuch", 99, -1, 2**40, "0"])), "bw": 1})
        elif kind == "duplicate-switch":
            doc["switches"] = ["sw", "sw"]
        elif kind == "duplicate-rank":
            doc["machines"] = [[0, 1], [1, 2]]
        elif kind == "disconnect" and links:
            links.pop()
        elif kind == "deep":   # spelled out by _serialize (a deep object would not even print)
            doc[draw(st.sampled_from(_TOP_KEYS))] = f"{_DEEP}{draw(st.sampled_from([200, 5000, 50_000]))}"
        elif kind == "many-links" and links is not None:
            links.extend([{"src": 0, "dst": 1, "bw": 1e-300}] * draw(st.sampled_from([1000, 100_000])))
    return doc


_DEEP = "DEEPNEST"


def _serialize(doc: object, fmt: str) -> str:
    """JSON (NaN, Infinity and huge integers as Python writes them) or YAML; ``_DEEP``N becomes N nested lists."""
    import re

    import yaml

    if fmt == "json":
        text = json.dumps(doc)
    else:
        text = yaml.safe_dump(doc, allow_unicode=True, default_flow_style=None)
    return re.sub(rf'"?{_DEEP}(\d+)"?', lambda m: "[" * int(m.group(1)) + "1" + "]" * int(m.group(1)), text)


@st.composite
def damaged_text(draw, text: str) -> bytes:
    """``text`` as bytes, truncated, with junk spliced in, or one byte flipped (or untouched)."""
    data = text.encode("utf-8", errors="surrogatepass")
    how = draw(st.sampled_from(["keep", "keep", "truncate", "junk", "flip"]))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    if how == "truncate":
        return data[:at]
    if how == "junk":
        return data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at:]
    if how == "flip" and data:
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    return data


_TOPOLOGY_COMMANDS = [
    ["topology", "validate", "{t}"],
    ["topology", "show", "{t}"],
    ["bounds", "-t", "{t}", "-c", "allgather", "-s", "1MiB"],
    ["synthesize", "-t", "{t}", "-c", "allgather", "-m", "ring", "-s", "1MiB", "-o", "{out}"],
    ["synthesize", "-t", "{t}", "-c", "allreduce", "-m", "greedy", "-s", "64KiB", "-o", "{out}"],
]


@GENERATED
@given(doc=hostile_topology_doc(), fmt=st.sampled_from(["json", "yaml"]), command=st.sampled_from(_TOPOLOGY_COMMANDS),
       data=st.data())
def test_generated_topology_files(tmp_path_factory, doc, fmt, command, data):
    from synth.topology.io import load_topology

    base = tmp_path_factory.mktemp("gentopo")
    path = base / f"t.{fmt}"
    path.write_bytes(data.draw(damaged_text(_serialize(doc, fmt))))
    out = base / data.draw(st.sampled_from(["p.xml", "p.json"]))
    result = run_synth(*[arg.format(t=path, out=out) for arg in command], cwd=base)
    assert_clean(result)
    if result.returncode == 0:
        load_topology(path)    # what synth accepted loads
        if command[0] == "synthesize":
            assert_written_loads(out)
    else:
        assert not out.exists()


def _program_base() -> str:
    """A real MSCCL program (8 ranks, dgx1), the start of every generated program."""
    return (REPO / "tests" / "fixtures" / "sccl_dgx1_allgather_steps2.xml").read_text()


_PROGRAM_ATTRS = {"algo": ["name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
                           "minBytes", "maxBytes", "nthreads"],
                  "gpu": ["id", "i_chunks", "o_chunks", "s_chunks"], "tb": ["id", "send", "recv", "chan"],
                  "step": ["s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"]}
_ATTR_VALUES = st.one_of(
    st.integers(-2**40, 2**40).map(str), st.sampled_from(["0", "-1", "32767", "32768", "65536", "1000000", str(2**31),
                                                           str(2**63), "1e9", "nan", "0x7fffffff", "", " 3", "abc",
                                                           "s", "o", "i", "rrcs", "LL128", "\u00e9"]),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=8),
)


@st.composite
def hostile_program(draw) -> bytes:
    import copy
    import xml.etree.ElementTree as ET

    root = ET.fromstring(_program_base())
    for _ in range(draw(st.integers(1, 3))):
        tag = draw(st.sampled_from(sorted(_PROGRAM_ATTRS)))
        elements = [root] if tag == "algo" else list(root.iter(tag))
        elem = elements[draw(st.integers(0, len(elements) - 1))]
        kind = draw(st.sampled_from(["set", "set", "delete-attr", "delete", "duplicate"]))
        if kind == "set":
            elem.set(draw(st.sampled_from(_PROGRAM_ATTRS[tag])), draw(_ATTR_VALUES))
        elif kind == "delete-attr":
            elem.attrib.pop(draw(st.sampled_from(_PROGRAM_ATTRS[tag])), None)
        elif tag != "algo":
            parent = next(p for p in root.iter() if elem in list(p))
            if kind == "delete":
                parent.remove(elem)
            else:
                parent.append(copy.deepcopy(elem))
    return draw(damaged_text(ET.tostring(root, encoding="unicode")))


_PROGRAM_COMMANDS = [
    ["verify", "{p}"], ["verify", "{p}"], ["verify", "--runtime", "msccl", "{p}"],
    ["verify", "--runtime", "msccl-executor", "-s", "1MiB", "{p}"], ["simulate", "{p}", "-t", "dgx1", "-s", "1MiB"],
]


@GENERATED
@given(program=hostile_program(), command=st.sampled_from(_PROGRAM_COMMANDS))
def test_generated_programs(tmp_path_factory, program, command):
    base = tmp_path_factory.mktemp("genprog")
    path = base / "p.xml"
    path.write_bytes(program)
    result = run_synth(*[arg.format(p=path) for arg in command], cwd=base)
    assert_clean(result, (0, 1, 2) if command[0] == "verify" else (0, 2))


_SIZES = st.one_of(st.sampled_from(["1MiB", "1", "0", "-1MiB", "nan", "infGiB", "1e400", "1ZiB", "1e30", "3.5KB", "MiB",
                                    "1 GiB", "0x10", "9" * 100, "\u0661MiB"]), st.text(max_size=6))
_COUNTS = st.one_of(st.integers(-2**40, 2**40).map(str), st.sampled_from(["0", "-1", "1", "2", "nan", "1e3", "", "x"]))
_NAMES = st.one_of(st.sampled_from(["ring-8", "ring-8", "dgx1", "nosuch", "/dev/zero", "/dev/null", "/", "..", "-",
                                    "../../etc/passwd", "ring-8.yaml", "\u202edgx1", "a" * 5000]), st.text(max_size=8))
_COLLS = st.one_of(st.sampled_from(["allgather", "allreduce", "alltoall", "reduce_scatter", "broadcast", "ALLGATHER",
                                    "nosuch", ""]), st.text(max_size=6))


@st.composite
def hostile_arguments(draw) -> list[str]:
    """A command line with valid and hostile values mixed; valid ones stay small (ring-8, ring method)."""
    kind = draw(st.sampled_from(["bounds", "synthesize", "generate", "simulate", "plot", "compare"]))
    if kind == "bounds":
        args = ["bounds", "-t", draw(_NAMES), "-c", draw(_COLLS), "-s", draw(_SIZES), "--root", draw(_COUNTS)]
    elif kind == "synthesize":
        args = ["synthesize", "-t", draw(_NAMES), "-c", draw(_COLLS), "-s", draw(_SIZES),
                "-m", draw(st.sampled_from(["ring", "direct", "nosuch", "", "RING"])),
                "-o", draw(st.sampled_from(["p.xml", "p.json", "p.txt", "", "/", "no/such/dir/p.xml", "-"]))]
        if draw(st.booleans()):
            args += [draw(st.sampled_from(["--chunks", "--root", "--threads", "--time-limit", "--gap",
                                           "--max-scratch", "--min-bytes", "--max-bytes"])), draw(_COUNTS)]
    elif kind == "generate":
        family = draw(st.sampled_from(["ring", "torus", "hypercube", "star", "leaf-spine", "boxes", "nosuch"]))
        option = {"ring": "-n", "star": "-n", "torus": "--dims", "hypercube": "--dim", "leaf-spine": "--leaves",
                  "boxes": "--boxes", "nosuch": "-n"}[family]
        value = draw(st.one_of(_COUNTS, st.sampled_from(["4x4", "0x4", "100000x100000", "2x2x2x2x2x2x2x2x2x2x2x2",
                                                         "axb", "4x-4"])))
        args = ["topology", "generate", family, option, value, "--bw", draw(st.sampled_from(["50", "nan", "-1", "0",
                                                                                              "1e400", "x"])),
                "-o", "g.yaml"]
    elif kind == "simulate":
        args = ["simulate", draw(st.sampled_from(["p.xml", "/dev/null", "nosuch.xml", "/"])), "-t", draw(_NAMES),
                "-s", draw(_SIZES)]
    elif kind == "plot":
        args = ["plot", "--kind", draw(st.sampled_from(["topology", "gantt", "nosuch"])), "-t", draw(_NAMES),
                "-o", draw(st.sampled_from(["x.png", "x.txt", "/dev/null"]))]
    else:
        args = ["compare", "-t", draw(_NAMES), "-c", draw(_COLLS), "-s", draw(_SIZES), "-m",
                draw(st.sampled_from(["ring", "ring,direct", "nosuch", ","]))]
    return [arg.replace("\x00", "") for arg in args]


@GENERATED
@given(args=hostile_arguments())
def test_generated_arguments(tmp_path_factory, args):
    base = tmp_path_factory.mktemp("genargs")
    (base / "p.xml").write_text(_program_base())
    result = run_synth(*args, cwd=base)
    assert_clean(result)
    for written in base.iterdir():
        if written.name != "p.xml" and written.suffix in (".xml", ".json") and written.is_file():
            assert_written_loads(written)
        assert not written.name.startswith("."), written   # no temp file left behind


# ---- the runtimes' required attributes (synth/runtime_limits.py RuntimeProfile.reads) ------------------------

def _required_cases() -> list[tuple[str, str]]:
    from synth.runtime_limits import EXECUTOR, MSCCL

    return sorted({(tag, key) for profile in (EXECUTOR, MSCCL) for tag, key, _ in profile.reads})


@pytest.mark.parametrize(("tag", "key"), _required_cases())
def test_a_missing_required_attribute_fails_verify(tmp_path, tag, key):
    """Each attribute a runtime's parser reads without a default: removed from a real program, plain verify
    fails where both parsers require it (exit 1), else only ``verify --runtime`` of the one that does."""
    import xml.etree.ElementTree as ET

    from synth.runtime_limits import RUNTIMES

    root = ET.fromstring(_program_base())
    elem = root if tag == "algo" else next(root.iter(tag))
    assert key in elem.attrib
    del elem.attrib[key]
    path = write(tmp_path, "p.xml", ET.tostring(root, encoding="unicode"))
    requiring = [name for name, profile in RUNTIMES.items() if (tag, key) in {(t, k) for t, k, _ in profile.reads}]
    if len(requiring) == len(RUNTIMES):
        result = run_synth("verify", path)
        assert_clean(result, (1, 2))    # 2: synth's own reader needs it too (coll, ids, a step's type)
        assert (f"lacks {key}" in result.stderr and "both MSCCL runtimes" in result.stderr
                or f"missing required attribute {key!r}" in result.stderr), result.stderr
    else:
        (needs,) = requiring
        assert run_synth("verify", path).returncode == 0   # synth's reader fills the default, like the other runtime
        result = run_synth("verify", "--runtime", needs, path)
        assert_clean(result, (1,))
        assert f"lacks {key}" in result.stderr and RUNTIMES[needs].read_at(tag, key) in result.stderr


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda text: '<?xml version="1.0"?>\n' + text, "<?...?>"),
    (lambda text: text.replace("\n<", "\n\t<", 1), "'\\t'"),
])
def test_what_the_runtimes_tokenizer_refuses_fails_verify(tmp_path, edit, needle):
    """Both loaders tokenize XML by hand: an XML declaration, or a tab between elements, is refused there
    though any XML parser (synth's too) reads it; plain verify must fail such a file (exit 1), and a comment,
    which the tokenizer skips, must not."""
    base = _program_base()
    result = run_synth("verify", write(tmp_path, "p.xml", edit(base)))
    assert_clean(result, (1,))
    assert needle in result.stderr and "msccl_parser.cc" in result.stderr, result.stderr
    for runtime in ("msccl-executor", "msccl"):   # each runtime's own check refuses it too
        result = run_synth("verify", "--runtime", runtime, write(tmp_path, "p.xml", edit(base)))
        assert_clean(result, (1,))
        assert needle in result.stderr, result.stderr
    commented = base.replace("\n<", "\n<!-- a comment, with <tags> and 'quotes' -->\n<", 1)
    assert run_synth("verify", write(tmp_path, "c.xml", commented)).returncode == 0


def test_required_attributes_cite_one_line_each():
    from synth.runtime_limits import EXECUTOR, MSCCL

    for profile in (EXECUTOR, MSCCL):
        lines = [line for _, _, line in profile.reads]
        assert lines == sorted(lines) and len(set(lines)) == len(lines)   # read in file order, once each
        assert {"coll", "ngpus", "nchunksperloop", "nchannels", "proto", "inplace"} <= set(profile.required)
    assert set(EXECUTOR.required) - set(MSCCL.required) == {"minBytes", "maxBytes", "outofplace"}
    assert set(MSCCL.required) - set(EXECUTOR.required) == {"name"}


# ---- hand-written program bombs --------------------------------------------------------------------------

_LAUGHS = ('<?xml version="1.0"?>\n<!DOCTYPE algo [\n <!ENTITY a "aaaaaaaaaa">\n'
           + "".join(f' <!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">\n' for i in range(8))
           + ']>\n<algo name="&i;" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2" coll="allgather" '
             'inplace="0"/>\n')


@pytest.mark.parametrize(("text", "words"), [
    (_LAUGHS, ["not well-formed"]),
    ('<!DOCTYPE algo [<!ENTITY x SYSTEM "/dev/zero">]>\n<algo name="&x;" coll="allgather"/>', ["external entity"]),
    ('<!DOCTYPE algo [<!ENTITY x SYSTEM "/etc/passwd">]>\n<algo coll="allgather">&x;</algo>', []),
    ("<algo>" + "<gpu>" * 100_000 + "</gpu>" * 100_000 + "</algo>", []),
    ('<algo coll="allgather" name="' + "x" * 10_000_000 + '"/>', []),
    ('<algo coll="allgather" ngpus="2"' + "".join(f' a{i}="1"' for i in range(100_000)) + "/>", []),
    (_program_base().replace('ngpus="8"', 'ngpus="100000000"'), ["ngpus", "cap"]),
    (_program_base().replace('i_chunks="1"', 'i_chunks="1000000000"', 1), ["i_chunks", "cap"]),
    (_program_base().replace('cnt="1"', 'cnt="1000000000"', 1), ["cnt", "cap"]),
    (_program_base()[:5000], ["not well-formed"]),
])
def test_program_bombs(tmp_path, text, words):
    result = run_synth("verify", write(tmp_path, "p.xml", text))
    assert_clean(result, (1, 2))
    for word in words:
        assert word in result.stderr


@pytest.mark.parametrize(("old", "new", "words"), [
    ('<tb id="0"', '<tb id="1000000"', ["dense"]),
    ('nchannels="1"', 'nchannels="0"', ["nchannels=0"]),
    ('chan="0"', 'chan="5"', ["chan"]),
    ('send="-1" recv="4"', 'send="-1" recv="0"', ["itself"]),
])
def test_runtime_checks_through_the_cli(tmp_path, old, new, words):
    text = _program_base()
    assert old in text
    result = run_synth("verify", write(tmp_path, "p.xml", text.replace(old, new, 1)))
    assert_clean(result, (1,))
    for word in words:
        assert word in result.stderr


# ---- inputs that never arrive, and sizes past the stated limits ---------------------------------------------

def test_fifo_without_a_writer_fails_instead_of_blocking(tmp_path):
    fifo = tmp_path / "pipe.xml"
    os.mkfifo(fifo)
    began = time.monotonic()
    assert_rejected(run_synth("verify", str(fifo)), "nothing to read")
    assert time.monotonic() - began < 25


def test_process_substitution_still_reads(tmp_path):
    """A pipe with a writer (``<(cat file)``) reads as before."""
    source = REPO / "synth" / "_topologies" / "ring-8.yaml"
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"sleep 1; cat {source} > {fifo}"])
    try:
        result = run_synth("topology", "validate", str(fifo))
    finally:
        writer.wait()
    assert result.returncode == 0, result.stderr
    assert "ring-8, 8 ranks" in result.stdout


@pytest.mark.parametrize(("suffix", "text", "words"), [
    (".yaml", "name: big\nranks: 2\nlinks: [" + "{src: 0, dst: 1, bw: 1}, " * 200_000 + "]\n", ["4 MiB", "JSON"]),
    (".yml", "name: big\nranks: 2\nextra: [" + "1," * 2_200_000 + "]\n", ["4 MiB"]),
    (".json", '{"name": "big", "ranks": 2, "links": [' + '{"src": 0, "dst": 1, "bw": 1}, ' * 1_200_000 + "]}",
     ["32 MiB limit"]),
])
def test_topology_size_limits(tmp_path, suffix, text, words):
    assert_rejected(run_synth("topology", "validate", write(tmp_path, "t" + suffix, text)), *words)


def test_dense_yaml_just_under_the_limit_loads_within_bounds(tmp_path):
    """The densest YAML the cap lets through (4 MiB of one-character nodes) fails cleanly under 2 GB and 30 s."""
    text = "name: x\nranks: 2\nlinks: [{src: 0, dst: 1, bw: 1}]\nextra: [" + "1," * 2_000_000 + "1]\n"
    assert_rejected(run_synth("topology", "validate", write(tmp_path, "t.yaml", text)), "extra")


def _switch_chain(switches: int) -> dict:
    names = [f"s{i}" for i in range(switches)]
    links = [{"src": a, "dst": b} for a, b in zip(names, names[1:])]
    links += [{"src": 0, "dst": names[0]}, {"src": 1, "dst": names[switches // 2]}, {"src": 2, "dst": names[-1]}]
    return {"name": "chain", "ranks": 3, "switches": names, "defaults": {"bw": 50}, "links": links}


def test_three_ranks_behind_a_long_switch_chain(tmp_path):
    """Synthesis stops at once at the stated route limit (it took 30 s and 5.5 GB for 1000 switches); bounds run."""
    path = write(tmp_path, "chain.json", json.dumps(_switch_chain(1000)))
    result = run_synth("synthesize", "-t", path, "-c", "allgather", "-o", "p.xml", cwd=tmp_path)
    assert_rejected(result, "1,000 switches", "at most 64")
    assert not (tmp_path / "p.xml").exists()
    assert run_synth("bounds", "-t", path, "-c", "allgather").returncode == 0


def test_large_star_stops_at_the_routed_rank_limit(tmp_path):
    """5000 ranks on one switch: 25M rank-pair routes ran past 100 s; refused at once, naming the limit."""
    from synth.topology import generators as gen
    from synth.topology.io import dump_topology

    path = write(tmp_path, "star.json", dump_topology(gen.star(5000), "json"))
    result = run_synth("synthesize", "-t", path, "-c", "broadcast", "-o", "p.xml", cwd=tmp_path)
    assert_rejected(result, "5,000 ranks behind switches", "2,048")
    assert not (tmp_path / "p.xml").exists()


def test_longest_switch_route_matches_the_routes():
    from synth.limits import MAX_ROUTE_SWITCHES
    from synth.topology import generators as gen
    from synth.topology.io import load_topology, parse_topology
    from synth.topology.routes import longest_switch_route, rank_routes

    fabrics = [load_topology(name) for name in ("dgx1", "dgx-a100-4node", "leaf-spine-4x4", "mi250-2node")]
    fabrics += [gen.fat_tree(4, 4, 2), gen.star(5), parse_topology(_switch_chain(MAX_ROUTE_SWITCHES + 1), "chain")]
    for topology in fabrics:
        routes = rank_routes(topology)
        longest = max((len(path) - 2 for path in routes.values()), default=0)
        assert longest_switch_route(topology) == longest, topology.name
    assert longest_switch_route(fabrics[-1]) == MAX_ROUTE_SWITCHES + 1


def test_out_of_memory_is_one_line(monkeypatch):
    import synth.cli.cmd_topology as cmd_topology

    def exhausted(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(cmd_topology, "load_topology_arg", exhausted, raising=False)
    monkeypatch.setattr("synth.topology.io.load_topology", exhausted)
    result = CliRunner().invoke(cli, ["topology", "validate", "dgx1"])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: out of memory") and len(result.output.strip().splitlines()) == 1


# ---- found by a fuzz campaign (mutated built-in topologies, fixtures and written programs) ----------------

def _json_program() -> dict:
    """The fixture's 8-rank allgather as a JSON program document (steps ``[type, srcbuf, srcoff, dstbuf, dstoff,
    cnt, depid, deps, hasdep]``; gpu 0 tb 0 receives from rank 4)."""
    from synth.program.json_io import program_to_json
    from synth.program.load import load_program

    program = load_program(str(REPO / "tests" / "fixtures" / "sccl_dgx1_allgather_steps2.xml"))
    return json.loads(program_to_json(program))


@pytest.mark.parametrize(("field", "value"), [(0, ["r"]), (1, {"x": "i"}), (3, [[["o"]]])])
def test_json_step_with_a_list_or_dict_for_a_name(tmp_path, field, value):
    """A list or dict where a step's type or buffer name belongs was an unhashable-type internal error."""
    doc = _json_program()
    doc["gpus"][0]["threadblocks"][0]["steps"][0][field] = value
    path = write(tmp_path, "p.json", json.dumps(doc))
    for command in (["verify", path], ["simulate", path, "-t", "dgx1"], ["convert", path, "-o", "c.xml"]):
        assert_rejected(run_synth(*command, cwd=tmp_path), "gpus/0/threadblocks/0/steps/0/")
    assert not (tmp_path / "c.xml").exists()


@pytest.mark.parametrize("num_ranks", [2**31, 10**30])
def test_json_program_num_ranks_far_past_its_gpus(tmp_path, num_ranks):
    """num_ranks=2**31 built range(num_ranks) to compare with the gpu ids: out of memory."""
    doc = {**_json_program(), "num_ranks": num_ranks}
    path = write(tmp_path, "p.json", json.dumps(doc))
    for command in (["verify", path], ["bounds", "-t", "dgx1", "-c", "allgather", "--exclude-link", "0:1",
                                       "--baseline", path]):
        assert_rejected(run_synth(*command), f"num_ranks={num_ranks}", "gpu ids are [0, 1, 2")


@pytest.mark.parametrize("step", [0, 1])    # a receive (step 0) and, on rank 4, the matching send
def test_a_step_cnt_far_past_its_buffer_is_a_verify_error(tmp_path, step):
    """cnt=2**40 on a step was padded to 2**40 chunks by the verifier's message matching: out of memory."""
    doc = _json_program()
    if step == 0:
        doc["gpus"][0]["threadblocks"][0]["steps"][0][5] = 2**40
    else:
        sends = [tb for tb in doc["gpus"][4]["threadblocks"] if tb["send"] == 0]
        sends[0]["steps"][0][5] = 2**40
    result = run_synth("verify", write(tmp_path, "p.json", json.dumps(doc)))
    assert_clean(result, (1,))
    assert "out of range" in result.stderr and "cnt=1099511627776" in result.stderr


def test_schema_range_is_the_checks_range():
    from synth.topology.checks import MAX_ALPHA_US, MAX_BW_GBPS

    defs = json.loads((REPO / "synth" / "topology" / "schema.json").read_text())["$defs"]
    assert defs["bw"]["maximum"] == MAX_BW_GBPS and defs["alpha"]["maximum"] == MAX_ALPHA_US
    mapping = defs["switch"]["properties"]
    assert mapping["reduce_bw"]["maximum"] == MAX_BW_GBPS and mapping["reduce_alpha"]["maximum"] == MAX_ALPHA_US


@pytest.mark.parametrize(("link", "words"), [
    ({"bw": 1e30}, ["links[0].bw", "must be <= 1000000"]),
    ({"bw": 10**20}, ["links[0].bw", "must be <= 1000000"]),
    ({"bw": 1e308}, ["links[0].bw"]),
    ({"alpha": 1e15}, ["links[0].alpha", "must be <= 1000000"]),
    ({"bw": float("inf")}, ["links[0].bw", "finite"]),
    ({"bw": 1e-320}, ["links[0].bw", "must be >= 1e-06"]),
    ({"bw": 1e-9}, ["links[0].bw"]),
])
@pytest.mark.parametrize("command", [
    ["topology", "validate"], ["bounds", "-c", "allgather", "-t"],
    ["synthesize", "-c", "broadcast", "-s", "1MB", "-m", "trees", "-o", "p.json", "-t"]])
def test_link_numbers_past_the_stated_range(tmp_path, link, words, command):
    """bw 1e30 overflowed the bounds' int64 capacities and α 1e15 made trees' event times collide ("internal
    error: cyclic transfer dependencies"); both are refused where the file is read."""
    links = [{"src": 0, "dst": 1, "bw": 10, **link}, {"src": 1, "dst": 2, "bw": 10}, {"src": 0, "dst": 2, "bw": 10}]
    path = write(tmp_path, "t.json", json.dumps({"name": "tri", "ranks": 3, "links": links}))
    assert_rejected(run_synth(*command, path, cwd=tmp_path), *words)
    assert not (tmp_path / "p.json").exists()


def test_parallel_entries_may_not_add_up_past_the_bandwidth_limit(tmp_path):
    links = [{"src": 0, "dst": 1, "bw": 900_000}] * 2
    path = write(tmp_path, "t.json", json.dumps({"name": "pair", "ranks": 2, "links": links}))
    assert_rejected(run_synth("topology", "validate", path), "link 0 -> 1", "bw 1.8e+06")


@pytest.mark.parametrize("args", [["ring", "-n", "4", "--bw", "1e9"], ["ring", "-n", "4", "--alpha", "1e9"],
                                  ["ring", "-n", "4", "--bw", "1e-320"]])
def test_generators_refuse_numbers_a_file_may_not_hold(tmp_path, args):
    assert_rejected(run_synth("topology", "generate", *args, "-o", "r.yaml", cwd=tmp_path), "link 0 -> 1")
    assert not (tmp_path / "r.yaml").exists()


def test_import_refuses_rates_a_file_may_not_hold(tmp_path):
    source = REPO / "tests" / "fixtures" / "import" / "dgx-a100.nvidia-smi.txt"
    assert_rejected(run_synth("topology", "import", str(source), "--set", "link_bw=1e12"), "not in [1e-06, 1e+06]")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e309])
def test_msccl_tools_topology_with_a_non_finite_count(tmp_path, value):
    """NaN or infinity in an msccl-tools link matrix was a ValueError / OverflowError (import, -t, and the
    topology an SCCL algorithm embeds)."""
    doc = json.loads((REPO / "tests" / "fixtures" / "peers" / "dgx1.topology.msccl.json").read_text())
    doc["links"][1][7] = value
    path = write(tmp_path, "t.msccl.json", json.dumps(doc))
    assert_rejected(run_synth("topology", "import", path), "links[1][7]", "whole number")
    assert_rejected(run_synth("topology", "validate", path), "links[1][7]", "whole number")
    algo = json.loads((REPO / "tests" / "fixtures" / "peers" / "dgx1_gather_root0.msccl.json").read_text())
    algo["topology"]["links"][4][2] = value
    assert_rejected(run_synth("verify", write(tmp_path, "a.msccl.json", json.dumps(algo))), "links[4][2]")


@pytest.mark.parametrize(("old", "new", "words"), [
    ('sm="80"', 'sm="x"', ["GPU", "sm 'x'"]),
    ('sm="80"', 'sm="inf"', ["GPU", "sm 'inf'"]),
])
def test_nccl_topology_dump_with_a_bad_number(tmp_path, old, new, words):
    text = (REPO / "tests" / "fixtures" / "import" / "dgx-a100.nccl-topo.xml").read_text()
    assert old in text
    assert_rejected(run_synth("topology", "import", write(tmp_path, "t.xml", text.replace(old, new, 1))), *words)


def test_nccl_topology_dump_with_a_malformed_pcie_speed(tmp_path):
    """A link_speed such as "8.0.0 GT/s" was a ValueError; it is read as unknown, like a missing one."""
    text = (REPO / "tests" / "fixtures" / "import" / "dgx-a100.nccl-topo.xml").read_text()
    text = re.sub(r'link_speed="[^"]*"', 'link_speed="8.0.0 GT/s"', text)
    assert run_synth("topology", "import", write(tmp_path, "t.xml", text)).returncode == 0


@pytest.mark.parametrize("where", ["step", "collective"])
def test_a_huge_value_quoted_in_an_error_is_shortened(tmp_path, where):
    """A 5 MB step type or collective name came back whole in the one error line (5 MB of stderr)."""
    doc = _json_program()
    if where == "step":
        doc["gpus"][0]["threadblocks"][0]["steps"][0][0] = "x" * 5_000_000
    else:
        doc["collective"] = "z" * 5_000_000
    result = run_synth("verify", write(tmp_path, "p.json", json.dumps(doc)))
    assert_rejected(result, "characters left out")
    assert len(result.stderr) < 3000
    assert result.stderr.rstrip().endswith("'rrc', 'rrcs', 'cpy', 're', 'nop']" if where == "step" else "scatter)")


@pytest.mark.parametrize("value", ["１", "٣", "1_0", "\u20031"])
def test_xml_integer_attribute_the_runtimes_read_otherwise(tmp_path, value):
    """int() read cnt="１" (a fullwidth digit) as 1 and "1_0" as 10, where the runtimes' strtol reads 0 and 1:
    synth verify said ok about a file the runtimes run differently."""
    text = _program_base()
    assert 'cnt="1"' in text
    result = run_synth("verify", write(tmp_path, "p.xml", text.replace('cnt="1"', f'cnt="{value}"', 1)))
    assert_rejected(result, "cnt=", "is not an integer")


def test_xml_integer_attribute_with_a_sign_or_spaces_still_reads(tmp_path):
    text = _program_base().replace('cnt="1"', 'cnt=" +1 "', 1)
    assert run_synth("verify", write(tmp_path, "p.xml", text)).returncode == 0


@pytest.mark.parametrize(("fixture", "old", "new", "words"), [
    ("dgx1-v100.nvidia-smi.txt", "NV2", "NV9999", ["'NV9999'", "more than 64 NVLinks"]),
    ("dgx1-v100.nvidia-smi.txt", "NV2", "NV" + "9" * 30, ["more than 64 NVLinks"]),
    ("mi250.rocm-smi.txt", "50000-200000", "50000-" + "9" * 400 + "00000", ["more than 64 xGMI links"]),
    ("mi250.rocm-smi.txt", "50000-200000", "50000-5000000", ["5000000 MB/s", "more than 64 xGMI links"]),
])
def test_import_link_counts_past_any_machine(tmp_path, fixture, old, new, words):
    """A 400-digit rocm-smi bandwidth was an OverflowError (float division); NV9999 imported 9999 NVLinks."""
    text = (REPO / "tests" / "fixtures" / "import" / fixture).read_text()
    assert old in text
    assert_rejected(run_synth("topology", "import", write(tmp_path, fixture, text.replace(old, new))), *words)


@pytest.mark.parametrize(("path", "value"), [(("gpus", 0, "threadblocks", 0, "steps", 1, 4), -0.0),
                                             (("gpus", 0, "threadblocks", 0, "steps", 0, 5), 1.0),
                                             (("gpus", 0, "threadblocks", 0, "id"), 0.0),
                                             (("num_ranks",), 8.0)])
def test_json_program_integral_float_for_an_integer(tmp_path, path, value):
    """jsonschema counts -0.0 as an integer: a float dstoff reached the verifier (TypeError: slice indices)."""
    doc = _json_program()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    path_text = "/".join(map(str, path))
    for command in (["verify"], ["convert", "-o", "c.xml"]):
        result = run_synth(*command[:1], write(tmp_path, "p.json", json.dumps(doc)), *command[1:], cwd=tmp_path)
        assert_rejected(result, path_text, "is not of type 'integer'")
    assert not (tmp_path / "c.xml").exists()


@pytest.mark.parametrize("key", ["i_chunks", "o_chunks", "s_chunks"])
def test_json_program_buffer_past_the_reader_cap(tmp_path, key):
    """s_chunks=2**31 in a JSON program: the verifier sized its buffers from it and was killed for memory (the XML
    reader already capped it)."""
    doc = _json_program()
    doc["gpus"][3][key] = 2**31
    path = write(tmp_path, "p.json", json.dumps(doc))
    for command in (["verify", path], ["convert", path, "-o", "c.xml"]):
        assert_rejected(run_synth(*command, cwd=tmp_path), f"gpu 3: {key}=2147483648", "cap of 1048576")
    assert not (tmp_path / "c.xml").exists()


@pytest.mark.parametrize("where", ["json", "sccl"])
def test_recorded_chunk_factor_past_the_reader_cap(tmp_path, where):
    """A JSON program's chunk_factor or an SCCL instance's chunks of 2**31 made the verifier size the collective's
    buffers from it: out of memory."""
    if where == "json":
        doc = {**_json_program(), "chunk_factor": 2**31}
        path = write(tmp_path, "p.json", json.dumps(doc))
    else:
        doc = json.loads((REPO / "tests" / "fixtures" / "peers" / "dgx1_allgather_steps2.msccl.json").read_text())
        doc["instance"]["chunks"] = 2**31
        path = write(tmp_path, "p.msccl.json", json.dumps(doc))
    for command in (["verify", path], ["convert", path, "-o", "c.xml"], ["simulate", path, "-t", "dgx1"]):
        assert_rejected(run_synth(*command, cwd=tmp_path), "2147483648 chunks per piece", "cap of 1048576")
    assert not (tmp_path / "c.xml").exists()


def _deep(levels: int) -> str:
    return "[" * levels + "0" + "]" * levels


@pytest.mark.parametrize("levels", [900, 985, 995])
def test_nesting_just_under_the_json_decoders_limit(tmp_path, levels):
    """A list ~1000 deep decodes (or just fails to) where the schema validators, which recurse several frames a
    level, or the decoder under synth's own frames, then hit the recursion limit: RecursionError, an internal error."""
    topology = json.dumps({**BASE, "links": [[0]]}).replace("[[0]]", _deep(levels))
    path = write(tmp_path, "t.json", topology)
    for command in (["topology", "validate", path], ["bounds", "-c", "allgather", "-t", path]):
        assert_clean(run_synth(*command), (2,))
    compact = json.dumps(_json_program(), separators=(",", ":"))
    program = compact.replace('[["r","i",0,', '[["r",' + _deep(levels) + ",", 1)
    assert program != compact
    path = write(tmp_path, "p.json", program)
    for command in (["verify", path], ["convert", path, "-o", "c.json"], ["simulate", path, "-t", "dgx1"]):
        assert_clean(run_synth(*command, cwd=tmp_path), (2,))
    assert not (tmp_path / "c.json").exists()
    msccl = (REPO / "tests" / "fixtures" / "peers" / "dgx1.topology.msccl.json").read_text()
    path = write(tmp_path, "t.msccl.json", msccl.replace('"links": [', '"links": [' + _deep(levels) + ", ", 1))
    for command in (["topology", "import", path], ["topology", "validate", path]):
        assert_clean(run_synth(*command), (2,))


@pytest.mark.parametrize("suffix", [".xml", ".json"])
def test_control_characters_quoted_from_a_file_stay_on_one_line(tmp_path, suffix):
    """A program's recorded fabric source with a line break and an escape sequence (%0A%1B in the XML comment)
    came back raw in the fabric-mismatch error: two lines, and a terminal escape."""
    topology = write(tmp_path, "ring4.json", json.dumps({"name": "ring-4", "ranks": 4, "defaults": {"bw": 50},
                                                        "links": [{"src": i, "dst": (i + 1) % 4} for i in range(4)]}))
    program = tmp_path / f"p{suffix}"
    made = run_synth("synthesize", "-t", topology, "-c", "allgather", "-s", "1MB", "-m", "ring", "-o", str(program))
    assert made.returncode == 0, made.stderr
    text = program.read_text()
    if suffix == ".xml":
        text = re.sub(r'source="[^"]*"', 'source="%1B[31mred%0Afake line"', text, count=1)
    else:
        doc = json.loads(text)
        doc["fabric"]["source"] = "\x1b[31mred\nfake line"
        doc["fabric"].pop("topology")
        text = json.dumps(doc)
    program.write_text(text)
    result = run_synth("simulate", str(program), "-t", "dgx1")
    assert_rejected(result, "was made for fabric", "\\x1b[31mred\\nfake line")
    assert "\x1b" not in result.stderr


@pytest.mark.parametrize(("key", "fixture", "address"), [
    ("output_map", "dgx1_allgather_steps2.msccl.json", 2**40),
    ("output_map", "dgx1_allgather_steps2.msccl.json", 8),
    ("input_map", "dgx1_allgather_steps3_chunks2.msccl.json", 16),
])
def test_sccl_map_naming_no_chunk_of_the_collective(tmp_path, key, fixture, address):
    """An SCCL algorithm whose input or output map names an address that is no chunk of its collective (after
    msccl-tools' chunk_up: addr * chunks + k) verified ok: the extra slot was never filled."""
    doc = json.loads((REPO / "tests" / "fixtures" / "peers" / fixture).read_text())
    doc[key]["0"].append(address)
    assert_rejected(run_synth("verify", write(tmp_path, "a.msccl.json", json.dumps(doc))), f"'{key}'[0]",
                    str(address), "no chunk of the collective")
    assert run_synth("verify", str(REPO / "tests" / "fixtures" / "peers" / fixture)).returncode == 0


def test_nvidia_smi_link_count_in_other_digits(tmp_path):
    """nvidia-smi writes ASCII digits; 'NV١٢' (Arabic-Indic digits) was read as 12 NVLinks, since re's \\d matches
    any Unicode digit."""
    source = (REPO / "tests" / "fixtures" / "import" / "dgx-a100.nvidia-smi.txt").read_text()
    assert "NV12" in source
    path = write(tmp_path, "smi.txt", source.replace("NV12", "NV\u0661\u0662", 1))
    assert_rejected(run_synth("topology", "import", path, "-o", str(tmp_path / "out.yaml")), "row GPU0")
    assert not (tmp_path / "out.yaml").exists()


@pytest.mark.parametrize("factor", ["1e-320", "1e-300"])
def test_a_degraded_link_slower_than_the_least_bandwidth(tmp_path, factor):
    """A link slowed below 1 kB/s gave an infinite (or 1e301 µs) time, a NaN gap and exit 0."""
    assert_rejected(run_synth("synthesize", "-t", "ring-8", "-c", "allgather", "-s", "1M", "-m", "ring",
                              "--degrade", f"0:1={factor}", "-o", "x.json", cwd=tmp_path), "bw")
    assert not (tmp_path / "x.json").exists()

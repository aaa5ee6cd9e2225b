"""The streaming program writers (issue 31, "Memory and I/O"; docs/programs.md "Writing programs"): the bytes
``save_program`` streams are the bytes of the whole-document writers they replaced, and the write stays atomic."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import synth.fileio as fileio
import synth.program.json_io as json_io
import synth.program.msccl_xml as msccl_xml
from synth.errors import SynthError
from synth.execution import samples
from synth.program.ir import Fabric, Gpu, Program, Step, Threadblock
from synth.program.load import load_program, save_program
from synth.program.msccl_xml import _xml_attr, fabric_comment, iter_program_xml, program_to_xml
from synth.runtime_limits import EXECUTOR, runtime_profile

FIXTURES = Path(__file__).parent / "fixtures"


# ---- reference serializers: the whole-document writers as they were before streaming --------------------
def reference_xml(program: Program, coll_spelling: str | None = "reduce_scatter", runtime=None) -> str:
    """The pre-streaming ``program_to_xml``: every line in a list, joined once."""
    profile = runtime_profile(runtime) if runtime is not None else None
    if profile is not None:
        coll_spelling = coll_spelling or dict(profile.coll_spellings)["reducescatter"]
    spelling = coll_spelling or "reduce_scatter"
    coll = spelling if program.collective == "reducescatter" else program.collective
    xml_extra = dict(program.extra.get("xml_attrs", {})) if isinstance(program.extra, dict) else {}
    outofplace = xml_extra.pop("outofplace", "0" if program.inplace else "1")
    values = {"name": program.name, "proto": program.proto, "nchannels": program.nchannels,
              "nchunksperloop": program.nchunksperloop, "ngpus": program.num_ranks, "coll": coll,
              "inplace": int(program.inplace), "outofplace": outofplace,
              "minBytes": program.min_bytes, "maxBytes": program.max_bytes}
    attrs = [(key, values[key]) for key in (profile or EXECUTOR).attributes]
    if program.collective in ("broadcast", "reduce", "gather", "scatter"):
        attrs.append(("root", program.root))
    attrs.extend((k, v) for k, v in xml_extra.items() if k not in msccl_xml._ALGO_KNOWN)
    lines = [fabric_comment(program.fabric)] if program.fabric is not None else []
    lines.append("<algo " + " ".join(f"{k}={_xml_attr(str(v), k)}" for k, v in attrs) + ">")
    for gpu in program.gpus:
        lines.append(f'  <gpu id="{gpu.id}" i_chunks="{gpu.i_chunks}" o_chunks="{gpu.o_chunks}" '
                     f's_chunks="{gpu.s_chunks}">')
        for tb in gpu.threadblocks:
            lines.append(f'    <tb id="{tb.id}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">')
            for index, st in enumerate(tb.steps):
                lines.append(
                    f'      <step s="{index}" type="{st.type}" srcbuf="{st.srcbuf}" srcoff="{st.srcoff}" '
                    f'dstbuf="{st.dstbuf}" dstoff="{st.dstoff}" cnt="{st.cnt}" depid="{st.depid}" '
                    f'deps="{st.deps}" hasdep="{int(st.hasdep)}"/>')
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def reference_json(program: Program) -> str:
    """The pre-streaming ``program_to_json``: the whole document as one dict, dumped once."""
    return json.dumps(json_io.program_to_dict(program), separators=(",", ":"), allow_nan=False,
                      default=json_io._plain) + "\n"


def _long_threadblock(steps: int) -> Program:
    """A two-rank allgather whose one threadblock per rank has ``steps`` steps (several writer pieces)."""
    gpus = []
    for r in range(2):
        body = [Step("s", "o", r, "o", r)] + [Step("nop", depid=-1) for _ in range(steps - 2)]
        body.append(Step("r", "o", 1 - r, "o", 1 - r))
        gpus.append(Gpu(r, 0, 2, 0, (Threadblock(0, 1 - r, 1 - r, 0, tuple(body)),)))
    return Program("long", "allgather", 2, tuple(gpus), inplace=True, nchunksperloop=2, chunk_factor=1)


def _dgx1_allgather() -> Program:
    return load_program(FIXTURES / "sccl_dgx1_allgather_steps2.xml")


def _msccl_allreduce() -> Program:
    text = gzip.decompress((FIXTURES / "msccl_examples" / "allreduce_a100_ring_8_1_1.xml.gz").read_bytes()).decode()
    return msccl_xml.program_from_xml(text, "allreduce_a100_ring_8_1_1.xml")


def _programs() -> dict[str, Program]:
    fabric = Fabric(name="ring-4 --bw 50", sha256="ab" * 32, source="generator:ring -n 4")
    return {
        "dgx1-allgather": _dgx1_allgather(),
        "msccl-allreduce": _msccl_allreduce(),
        "ring-allreduce": samples.ring_allreduce(4, 2),
        "inplace-allgather": samples.ring_allgather(5).with_(inplace=True, name="in place"),
        "custom-coll": samples.ring_allgather(3).with_(collective="custom", extra={"note": "x\"<&", "n": [1, 2]}),
        "rooted-with-metadata": samples.chain_broadcast(4, 2, root=2).with_(
            fabric=fabric, predicted_time_us=float("inf"), size_bytes=2**20, chunk_bytes=2**19, topology="ring-4"),
        "long-threadblocks": _long_threadblock(3 * msccl_xml.XML_STEPS_PER_PIECE + 5),
        "no-gpus": Program("empty", "allgather", 0, ()),
    }


PROGRAMS = _programs()
SWITCH_PROGRAMS = {"nvls-allreduce": samples.nvls_allreduce(4), "nvls-allreduce-inplace":
                   samples.nvls_allreduce(4).with_(inplace=True)}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_xml_file_bytes_equal_the_whole_document_writer(tmp_path, name):
    program = PROGRAMS[name]
    path = save_program(program, tmp_path / f"{name}.xml", check_limits=False)
    assert path.read_bytes() == reference_xml(program).encode("utf-8")
    assert program_to_xml(program, coll_spelling="reducescatter") == reference_xml(program, "reducescatter")


@pytest.mark.parametrize("name", ["dgx1-allgather", "msccl-allreduce", "inplace-allgather", "rooted-with-metadata"])
def test_xml_for_microsoft_msccl_equals_the_whole_document_writer(tmp_path, name):
    program = PROGRAMS[name].with_(min_bytes=0, max_bytes=2**30)
    path = save_program(program, tmp_path / f"{name}.xml", check_limits=False, runtime="msccl", coll_spelling=None)
    assert path.read_bytes() == reference_xml(program, None, "msccl").encode("utf-8")


@pytest.mark.parametrize("name", sorted(PROGRAMS) + sorted(SWITCH_PROGRAMS))
def test_json_file_bytes_equal_the_whole_document_writer(tmp_path, name):
    program = {**PROGRAMS, **SWITCH_PROGRAMS}[name]
    path = save_program(program, tmp_path / f"{name}.json")
    expected = reference_json(program).encode("utf-8")
    assert path.read_bytes() == expected
    assert json_io.program_to_json(program).encode("utf-8") == expected
    if program.switches:
        assert json.loads(expected)["version"] == 2


def test_writers_yield_many_pieces_for_a_long_threadblock():
    program = PROGRAMS["long-threadblocks"]
    xml_pieces = list(iter_program_xml(program))
    json_pieces = list(json_io.iter_program_json(program))
    # 2 threadblocks of 3 full pieces and a short one each, plus head and tail pieces
    assert len(xml_pieces) >= 8 and len(json_pieces) >= 8
    longest = max(len(p) for p in xml_pieces)
    assert longest < len("".join(xml_pieces)) / 5


def test_streamed_json_loads_back_equal(tmp_path):
    for name, program in {**PROGRAMS, **SWITCH_PROGRAMS}.items():
        if program.num_ranks:
            known = program.with_(predicted_time_us=None) if name == "rooted-with-metadata" else program  # inf: null
            assert load_program(save_program(program, tmp_path / f"{name}.json")) == known, name


# ---- atomicity ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("unnamed", [True, False])
def test_failure_mid_stream_leaves_no_file_and_keeps_the_old_one(tmp_path, monkeypatch, unnamed):
    if not unnamed:  # the portable mkstemp path
        monkeypatch.setattr(fileio, "_write_unnamed", lambda *a: False)
    monkeypatch.setattr(fileio, "_WRITE_BLOCK", 16)    # so the first pieces reach the temp file
    target = tmp_path / "out.txt"
    target.write_text("old")
    written = []

    def pieces():
        for k in range(5):
            written.append(k)
            yield f"piece {k}\n"
        raise SynthError("the writer found a bad value half way")

    with pytest.raises(SynthError, match="half way"):
        fileio.atomic_write_chunks(target, pieces())
    assert written == list(range(5))
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    assert target.read_text() == "old"


def test_bad_step_value_half_way_through_a_json_program_leaves_no_file(tmp_path):
    program = PROGRAMS["long-threadblocks"]
    gpus = list(program.gpus)
    tb = gpus[1].threadblocks[0]
    steps = list(tb.steps)
    steps[-2] = Step("nop", srcoff=float("nan"))    # JSON has no NaN: refused when its piece is encoded
    gpus[1] = Gpu(1, 0, 2, 0, (Threadblock(0, 0, 0, 0, tuple(steps)),))
    bad = program.with_(gpus=tuple(gpus))
    with pytest.raises(SynthError, match="cannot be written as JSON"):
        save_program(bad, tmp_path / "sub" / "bad.json")
    assert list(tmp_path.iterdir()) == [tmp_path / "sub"] and not list((tmp_path / "sub").iterdir())
    with pytest.raises(SynthError, match="cannot be written as JSON"):
        json_io.program_to_json(bad)


def test_bad_metadata_is_refused_before_the_file_system_is_touched(tmp_path):
    program = PROGRAMS["ring-allreduce"].with_(extra={"bad": float("nan")})
    with pytest.raises(SynthError, match="cannot be written as JSON"):
        save_program(program, tmp_path / "new-dir" / "p.json")
    assert not (tmp_path / "new-dir").exists()
    with pytest.raises(SynthError, match="cannot be written to MSCCL XML"):
        save_program(program.with_(name="a\x01b", extra={}), tmp_path / "new-dir" / "p.xml", check_limits=False)
    assert not (tmp_path / "new-dir").exists()


def test_many_small_pieces_are_written_in_blocks(tmp_path, monkeypatch):
    calls = []
    real_write = fileio.os.write

    def counting_write(fd, data):
        calls.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(fileio.os, "write", counting_write)
    monkeypatch.setattr(fileio, "_WRITE_BLOCK", 1000)
    path = fileio.atomic_write_chunks(tmp_path / "x.txt", (f"{k:09d}\n" for k in range(1000)))
    assert path.read_text() == "".join(f"{k:09d}\n" for k in range(1000))
    assert len(calls) == 10 and sum(calls) == 10_000


def test_empty_and_bytes_pieces(tmp_path):
    assert fileio.atomic_write_chunks(tmp_path / "e", ()).read_bytes() == b""
    assert fileio.atomic_write_chunks(tmp_path / "m", [b"a", "é", b""]).read_bytes() == "aé".encode()


def test_bench_io_measures_every_phase():
    """benchmarks/bench_io.py end to end on a small ring: a row per phase, the files written and read back."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_io.py"
    done = subprocess.run([sys.executable, str(script), "--ranks", "8"], capture_output=True, text=True, check=True,
                          timeout=300)
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[2:]}
    assert set(rows) == {"build", "write-xml", "write-json", "load-xml", "load-json", "verify"}
    assert rows["verify"][-1] == "ok" and rows["load-json"][-2] == "64"
    assert float(rows["write-xml"][4]) > 0 and float(rows["write-json"][2]) >= float(rows["write-json"][3])

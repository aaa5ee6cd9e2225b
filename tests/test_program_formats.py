"""MSCCL XML and JSON program formats: import of real msccl-tools output, lossless round trips,
clear errors on malformed input, runtime limit checks, atomic save."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from test_verify import FIXTURES, direct_program, ring_allgather

from synth.collectives import COLLECTIVES, ROOTED
from synth.errors import SynthError
from synth.program.ir import Gpu, Program, Step, Threadblock
from synth.program.json_io import program_from_json, program_schema, program_to_dict, program_to_json
from synth.program.load import load_program, save_program
from synth.program.msccl_xml import check_runtime_limits, program_from_xml, program_to_xml
from synth.verification import verify


def _generated():
    progs = [direct_program(name, n=4, c=2, root=1 if name in ROOTED else 0) for name in COLLECTIVES]
    progs.append(ring_allgather(5))
    return progs


# ---- import and round trips ----------------------------------------------------------------------
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_import_and_round_trips(path):
    program = load_program(path)
    assert program.num_ranks == 4 and program.proto == "Simple" and program.nchannels == 1
    src = ET.fromstring(path.read_text())
    assert program.name == src.get("name")
    assert program.inplace == (src.get("inplace") == "1")
    assert program.num_steps() == len(src.findall("./gpu/tb/step"))
    check_runtime_limits(program)
    for spelling in ("reduce_scatter", "reducescatter"):
        text = program_to_xml(program, coll_spelling=spelling)
        assert program_from_xml(text, "x.xml") == program
    again = program_from_json(program_to_json(program), "x.json")
    assert again == program
    assert program_from_xml(program_to_xml(again)) == program
    # every attribute of every original step survives
    out = ET.fromstring(program_to_xml(program))
    for a, b in zip(src.iter("step"), out.iter("step"), strict=True):
        assert a.attrib == b.attrib


def test_inplace_allgather_fixture_uses_only_output():
    program = load_program(next(p for p in FIXTURES if p.stem.startswith("allgather")))
    assert program.inplace and all(g.i_chunks == 0 and g.o_chunks == 4 for g in program.gpus)


@pytest.mark.parametrize("program", _generated(), ids=lambda p: p.name)
def test_generated_programs_round_trip(program, tmp_path):
    program = program.with_(topology="ring", size_bytes=1 << 20, chunk_bytes=4096.0, predicted_time_us=12.5)
    for ext in ("xml", "json"):
        path = save_program(program, tmp_path / f"p.{ext}")
        back = load_program(path)
        if ext == "json":
            assert back == program
        else:  # XML carries no synth metadata
            assert back == program.with_(topology=None, size_bytes=None, chunk_bytes=None, predicted_time_us=None,
                                         chunk_factor=None)
        assert verify(back).ok


def test_reducescatter_spellings():
    program = direct_program("reducescatter", n=3, c=1)
    original = program_to_xml(program)
    executor = program_to_xml(program, coll_spelling="reducescatter")
    assert 'coll="reduce_scatter"' in original and 'coll="reducescatter"' in executor
    assert program_from_xml(original).collective == program_from_xml(executor).collective == "reducescatter"
    with pytest.raises(SynthError):
        program_to_xml(program, coll_spelling="rs")


def test_xml_has_both_runtimes_attributes_and_executor_friendly_layout():
    text = program_to_xml(ring_allgather(3).with_(min_bytes=1024, max_bytes=0))
    algo = ET.fromstring(text)
    for key in ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
                "minBytes", "maxBytes"):
        assert key in algo.attrib, key
    assert algo.get("outofplace") == "0" and algo.get("inplace") == "1" and algo.get("minBytes") == "1024"
    assert not text.startswith("<?xml")  # the executor's parser rejects a prolog
    assert "'" not in text  # and single-quoted values
    step = algo.find("./gpu/tb/step")
    assert list(step.attrib) == ["s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"]


def test_foreign_and_missing_optional_attributes():
    text = """<algo name="x" coll="allgather" ngpus="2" inplace="1" redop="sum" nchannels="1" outofplace="1">
      <gpu id="0" o_chunks="2"><tb id="0" send="1" recv="1" chan="0" extra="7">
        <step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" color="red"/>
        <step s="1" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1"/></tb>
        <comment/></gpu>
      <gpu id="1" i_chunks="0" o_chunks="2" s_chunks="0"><tb id="0" send="0" recv="0">
        <step type="s" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1"/>
        <step type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" depid="-1" deps="-1" hasdep="0"/></tb></gpu>
    </algo>"""
    program = program_from_xml(text, "foreign.xml")
    assert program.num_ranks == 2 and program.gpus[0].i_chunks == 0 and program.gpus[0].s_chunks == 0
    assert program.proto == "Simple" and program.min_bytes == 0
    assert verify(program).ok
    again = program_from_xml(program_to_xml(program))
    assert again == program
    assert again.extra["xml_attrs"] == {"redop": "sum", "outofplace": "1"}
    assert ET.fromstring(program_to_xml(program)).get("outofplace") == "1"


@pytest.mark.parametrize("text, needle", [
    ("<algo coll='allgather'><gpu", "not well-formed"),
    ("<graph/>", "<algo>"),
    ("<algo ngpus='1'/>", "'coll'"),
    ("<algo coll='allgather' ngpus='2'><gpu id='0' i_chunks='1' o_chunks='2' s_chunks='0'/></algo>", "ngpus=2"),
    ("<algo coll='allgather' ngpus='1'><gpu id='0' i_chunks='x'/></algo>", "<gpu id=0>"),
    ("<algo coll='allgather' ngpus='1'><gpu id='0'><tb id='0'><step s='0' srcoff='0'/></tb></gpu></algo>",
     "<tb id=0> <step> #0: missing required attribute 'type'"),
    ("<algo coll='allgather' ngpus='1'><gpu id='0'><tb id='0'><step type='zz'/></tb></gpu></algo>", "zz"),
    ("<algo coll='allgather' ngpus='1'><gpu id='0'><tb id='0'><step type='s' srcbuf='q'/></tb></gpu></algo>",
     "srcbuf"),
    ("<algo coll='allgather' ngpus='1'><gpu id='0'><tb id='0'><step s='0' type='s'/><step s='2' type='s'/>"
     "</tb></gpu></algo>", "without gaps"),
    ("<algo coll='allgather' ngpus='1'><gpu id='0'><tb send='1'/></gpu></algo>", "<tb> #0"),
])
def test_malformed_xml_names_file_and_element(tmp_path, text, needle):
    path = tmp_path / "bad.xml"
    path.write_text(text)
    with pytest.raises(SynthError) as info:
        load_program(path)
    assert str(path) in str(info.value) and needle in str(info.value), str(info.value)


# ---- JSON ----------------------------------------------------------------------------------------
def test_json_program_fields_and_schema():
    program = direct_program("allreduce", n=3, c=2).with_(topology="ring3", size_bytes=3e6, chunk_bytes=1.5e6,
                                                           predicted_time_us=42.0)
    doc = json.loads(program_to_json(program))
    assert doc["format"] == "synth-program" and doc["version"] == 1
    for key in ("topology", "collective", "chunk_factor", "chunk_bytes", "size_bytes", "predicted_time_us"):
        assert key in doc
    assert doc["chunk_factor"] == 2 and doc["topology"] == "ring3"
    schema = program_schema()
    assert schema["properties"]["format"] == {"const": "synth-program"}
    import jsonschema

    jsonschema.validate(doc, schema)


def test_json_writes_unknown_time_as_null_and_plain_extras():
    program = ring_allgather(3).with_(predicted_time_us=float("inf"), extra={"tags": {"b", "a"}})
    doc = json.loads(program_to_json(program))
    assert doc["predicted_time_us"] is None and doc["extra"] == {"tags": ["a", "b"]}
    assert program_from_json(program_to_json(program)).predicted_time_us is None


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("format"), "synth-program"),
    (lambda d: d.update(version=99), "version"),
    (lambda d: d["gpus"][0]["threadblocks"][0]["steps"][0].__setitem__(0, "zz"), "gpus/0/threadblocks/0/steps/0/0"),
    (lambda d: d["gpus"][1].pop("o_chunks"), "o_chunks"),
    (lambda d: d.update(unknown=1), "unknown"),
    (lambda d: d.update(num_ranks=5), "num_ranks=5"),
])
def test_invalid_json_is_rejected(tmp_path, mutate, needle):
    doc = program_to_dict(ring_allgather(3))
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SynthError) as info:
        load_program(path)
    assert str(path) in str(info.value) and needle in str(info.value), str(info.value)
    with pytest.raises(SynthError):
        program_from_json("{not json", "x.json")


def test_load_sniffs_format_and_reports_unreadable(tmp_path):
    program = ring_allgather(3)
    (tmp_path / "a.prog").write_text(program_to_xml(program))
    (tmp_path / "b.prog").write_text(program_to_json(program))
    assert load_program(tmp_path / "a.prog") == program == load_program(tmp_path / "b.prog")
    (tmp_path / "c.prog").write_text("hello")
    for bad in (tmp_path / "c.prog", tmp_path / "nope.xml", tmp_path):
        with pytest.raises(SynthError):
            load_program(bad)
    (tmp_path / "d.xml").write_bytes(b"\xff\xfe\x00<")
    with pytest.raises(SynthError):
        load_program(tmp_path / "d.xml")


# ---- runtime limits ------------------------------------------------------------------------------
def _one_tb_program(steps, send=1, recv=1, chan=0, tb_id=0, n=2, nchannels=1, extra_tbs=()) -> Program:
    tbs = (Threadblock(tb_id, send, recv, chan, tuple(steps)),) + tuple(extra_tbs)
    gpus = (Gpu(0, 1, 2, 0, tbs),) + tuple(Gpu(r, 1, 2, 0, ()) for r in range(1, n))
    return Program(name="t", collective="allgather", num_ranks=n, gpus=gpus, nchannels=nchannels)


@pytest.mark.parametrize("program, needles", [
    (_one_tb_program([Step("s", "i", 0, "o", 0)] * 65), ["65 steps", "rank 0 tb 0", "--chunks"]),
    (_one_tb_program([Step("s", "i", 0, "o", 0, cnt=72)]), ["cnt=72", "rank 0 tb 0 step 0", "--chunks"]),
    (_one_tb_program([], tb_id=1), ["not dense"]),
    (_one_tb_program([], send=0), ["equal to itself", "rank 0 tb 0"]),
    (_one_tb_program([], recv=7), ["not a rank"]),
    (_one_tb_program([Step("s", "i", 0, "o", 0)], send=-1), ["no send peer"]),
    (_one_tb_program([Step("r", "i", 0, "o", 0)], recv=-1), ["no recv peer"]),
    (_one_tb_program([Step("nop", depid=128, deps=0)]), ["<= 127", "--max-trees"]),
    (_one_tb_program([], nchannels=33, chan=32), ["33", "32 channels", "--max-trees"]),
    (_one_tb_program([], chan=3), ["channel 3"]),
    (_one_tb_program([], extra_tbs=[Threadblock(k, -1, -1, 0, ()) for k in range(1, 1025)]),
     ["1025 threadblocks", "--max-trees"]),
    (_one_tb_program([], n=40, extra_tbs=[Threadblock(k, k + 1, -1, 0, ()) for k in range(1, 33)]),
     ["33 threadblocks with a send peer", "channel 0", "--max-trees"]),
    (_one_tb_program([Step("nop")] * 60, extra_tbs=[Threadblock(k, -1, -1, 0, (Step("nop"),) * 60)
                                                    for k in range(1, 70)]), ["XML nodes", "rank 0", "--chunks"]),
])
def test_runtime_limits(program, needles, tmp_path):
    with pytest.raises(SynthError) as info:
        check_runtime_limits(program)
    for needle in needles:
        assert needle in str(info.value), str(info.value)
    target = tmp_path / "out.xml"
    with pytest.raises(SynthError):
        save_program(program, target)
    assert not target.exists() and not list(tmp_path.iterdir())  # nothing half-written
    save_program(program, tmp_path / "out.json")  # JSON is not bound by the runtime's limits


def test_limits_pass_on_generated_programs():
    for program in _generated():
        check_runtime_limits(program)


def test_save_rejects_unknown_extension(tmp_path):
    with pytest.raises(SynthError):
        save_program(ring_allgather(3), tmp_path / "p.txt")


def _schema_verdict(doc):
    """The full jsonschema's first error (path, message), as program_from_dict reported it before steps were
    checked apart."""
    from synth.program.json_io import _validator, _where

    error = next(iter(sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))), None)
    return None if error is None else f"{_where(error.absolute_path)}: {error.message}"


@pytest.mark.parametrize("position, value", [
    (0, "zz"), (1, "x"), (2, 1.5), (2, 2.0), (2, True), (5, None), (6, -2), (7, -2), (8, 2), (8, False), (8, 1.0),
    (3, 7), (None, "short"), (None, "long"), (None, "dict"),
])
def test_fast_step_check_agrees_with_the_schema(position, value):
    from synth.program.json_io import _schema_error

    doc = program_to_dict(ring_allgather(3))
    steps = doc["gpus"][1]["threadblocks"][0]["steps"]
    if position is None:
        steps[-1] = {"short": steps[-1][:8], "long": [*steps[-1], 0], "dict": {"type": "s"}}[value]
    else:
        steps[-1][position] = value
    assert _schema_error(doc) == _schema_verdict(doc)
    assert _schema_error(program_to_dict(ring_allgather(3))) is None

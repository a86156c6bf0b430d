"""The manifest additions for cutting and packing: buffer kinds `inout` and `source`, program flags
`once` and `derive`, the `cu_seqlens` fill, the `cut` field and a chunk's `batch.context` bound.
Each rule is shown twice: a manifest keeping it verifies, one breaking it gets an error naming the field."""

import copy
import json

import pytest

import manifests
from manifests import ManifestError
from runtime.protocol import Protocol
from toy.gen import SHAPES, manifest


def good() -> dict:
    return copy.deepcopy(manifest(next(s for s in SHAPES if s.name == "toy-paged"), 256))


def problems(raw) -> list[str]:
    with pytest.raises(ManifestError) as exc:
        manifests.parse(json.dumps(raw), "m.json")
    return exc.value.problems


COPY = {"params": ["in buffer<i64>", "out buffer<i64>"],
        "impl": {"launches": [{"module": "toy", "entry": "copy", "block": [256, 1, 1], "grid": [64, 1, 1]}]}}


def with_derive() -> dict:
    """toy-paged whose salt weight is derived at load from a `source` bound to the checkpoint."""
    raw = good()
    raw["buffers"]["salt.src"] = {"dtype": "i64", "shape": [64], "kind": "source", "bind": [{"tensor": "salt"}]}
    del raw["buffers"]["salt"]["bind"]
    raw["ops"]["copy"] = copy.deepcopy(COPY)
    raw["programs"]["derive_salt"] = {"derive": True, "calls": [
        {"op": "copy", "args": [{"buf": "salt.src"}, {"buf": "salt"}]}]}
    return raw


def with_once() -> dict:
    """toy-paged with a `once` program filling a carry table from the salt after load."""
    raw = good()
    raw["buffers"]["table"] = {"dtype": "i64", "shape": [64], "kind": "carry"}
    raw["ops"]["copy"] = copy.deepcopy(COPY)
    raw["programs"]["init"] = {"once": True, "calls": [{"op": "copy", "args": [{"buf": "salt"}, {"buf": "table"}]}]}
    return raw


def test_derive_and_once_programs_verify():
    m = manifests.parse(with_derive())
    assert m.programs["derive_salt"].derive and not m.programs["derive_salt"].batched
    assert m.buffers["salt.src"].kind == "source"
    m = manifests.parse(with_once())
    assert m.programs["init"].once
    assert [p.name for p in m.driven()] == ["prefill", "decode"]


@pytest.mark.parametrize("extra, named", [
    ({"batch": {"groups": 1, "rows": 1}}, "batch"),
    ({"once": True}, "once"),
    ({"graph": True}, "graph"),
])
def test_derive_combines_with_nothing_else(extra, named):
    raw = with_derive()
    raw["programs"]["derive_salt"].update(extra)
    ps = problems(raw)
    assert any(p.startswith("programs.derive_salt.derive: a derive program runs inside load and takes no")
               and named in p for p in ps), ps


def test_once_takes_no_batch():
    raw = with_once()
    raw["programs"]["init"]["batch"] = {"groups": 1, "rows": 1}
    assert any(p.startswith("programs.init.once: a once program runs after load") for p in problems(raw))


def test_a_graph_needs_a_batch():
    raw = with_once()
    raw["programs"]["init"]["graph"] = True
    assert any(p.startswith("programs.init.graph:") for p in problems(raw))


def test_flags_are_booleans():
    raw = with_once()
    raw["programs"]["init"]["once"] = "yes"
    assert problems(raw) == ['programs.init.once: expected true or false, got "yes"']


def test_a_source_needs_a_bind():
    raw = with_derive()
    del raw["buffers"]["salt.src"]["bind"]
    assert "buffers.salt.src.bind: a source needs a bind naming its checkpoint tensor" in problems(raw)


def test_only_a_derive_program_reads_a_source():
    raw = with_derive()
    raw["programs"]["decode"]["calls"][0]["args"][4] = {"buf": "salt.src"}
    ps = problems(raw)
    assert any(p.startswith("programs.decode.calls[0].args[4]: reads source buffer salt.src outside a derive program")
               for p in ps), ps


def test_no_program_writes_a_source():
    raw = with_derive()
    raw["programs"]["derive_salt"]["calls"].append({"op": "copy", "args": [{"buf": "salt"}, {"buf": "salt.src"}]})
    assert "programs.derive_salt.calls[1].args[1]: op copy writes source buffer salt.src" in problems(raw)


def test_only_a_derive_program_writes_a_weight():
    raw = with_derive()
    raw["programs"]["derive_salt"].pop("derive")
    ps = problems(raw)
    assert any(p.startswith("programs.derive_salt.calls[0].args[1]: op copy writes weight buffer salt") for p in ps), ps


def test_a_weight_without_a_bind_must_be_derived():
    raw = good()
    del raw["buffers"]["salt"]["bind"]
    assert problems(raw) == ["buffers.salt.bind: a weight needs a bind naming its tensor, or a derive program that writes it"]


def test_only_weights_and_sources_bind():
    raw = good()
    raw["buffers"]["positions"]["bind"] = [{"tensor": "salt"}]
    assert "buffers.positions.bind: only weights and sources bind tensors, this is a input" in problems(raw)


@pytest.mark.parametrize("kind", ["input", "inout"])
def test_a_program_at_load_reads_no_caller_input(kind):
    raw = with_once()
    raw["buffers"]["positions"]["kind"] = kind
    if kind == "inout":
        raw["buffers"]["positions"].pop("fill")
    raw["programs"]["init"]["calls"][0]["args"][0] = {"buf": "positions"}
    assert ("programs.init.calls[0].args[0]: a once program runs at load, before any caller writes "
            f"{kind} buffer positions") in problems(raw)


def test_inout_is_read_without_a_write_and_may_be_written():
    raw = good()
    raw["buffers"]["act"] = {"dtype": "i64", "shape": [64], "kind": "inout"}
    raw["ops"]["copy"] = copy.deepcopy(COPY)
    del raw["ops"]["copy"]
    raw["ops"]["bump"] = {"params": ["inout buffer<i64>"],
                          "impl": {"launches": [{"module": "toy", "entry": "bump", "block": [256, 1, 1], "grid": [1, 1, 1]}]}}
    raw["programs"]["prefill"]["calls"].insert(0, {"op": "bump", "args": [{"buf": "act"}]})
    m = manifests.parse(raw)
    assert m.buffers["act"].kind == "inout"
    raw["buffers"]["act"]["fill"] = "token"
    assert any(p.startswith("buffers.act.fill: fill 'token' is not allowed on a inout buffer") for p in problems(raw))


def packed(groups=16, offsets=257) -> dict:
    """toy-paged whose prefill packs up to `groups` sequences, split by a cu_seqlens input
    (which decode, sharing the write op, passes too)."""
    raw = good()
    raw["programs"]["prefill"]["batch"] = {"groups": groups, "rows": "tokens"}
    raw["buffers"]["cu"] = {"dtype": "i32", "shape": [offsets], "kind": "input", "fill": "cu_seqlens"}
    op = raw["ops"]["write"]
    launch = op["impl"]["launches"][0]
    op["params"] = list(op["params"]) + ["in buffer<i32>"]
    launch["params"] = list(launch["params"]) + ["in buffer<i32>"]
    launch["args"] = list(launch["args"]) + [{"param": len(op["params"]) - 1}]
    for prog in ("prefill", "decode"):
        call = raw["programs"][prog]["calls"][0] = dict(raw["programs"][prog]["calls"][0])
        call["args"] = list(call["args"]) + [{"buf": "cu"}]
    return raw


def test_a_packed_chunk_needs_cu_seqlens():
    assert manifests.parse(packed()).programs["prefill"].groups == 16
    raw = packed()
    raw["buffers"]["cu"].pop("fill")
    assert ("programs.prefill.batch.groups: a chunk of 16 sequences needs a cu_seqlens input to split its rows"
            " (or independent_rows, where no row reads its sequence)" in problems(raw))


def test_a_write_only_prefill_packs_by_independent_rows():
    """The shipped paged toys' prefill writes each row's slot and reads nothing of its sequence: it
    packs without cu_seqlens, and the protocol says so; a lined one (its rows fold into a line) does not."""
    m = manifests.parse(json.dumps(good()), "m.json")
    assert m.programs["prefill"].independent_rows and m.programs["prefill"].groups == 256
    assert Protocol(m).packs
    lined = manifests.parse(json.dumps(manifest(next(s for s in SHAPES if s.lined), 256)), "m.json")
    assert not lined.programs["prefill"].independent_rows and not Protocol(lined).packs


def test_independent_rows_read_nothing_of_their_sequence_and_emit_nothing():
    raw = good()
    call = raw["programs"]["prefill"]["calls"]
    call.append(copy.deepcopy(raw["programs"]["decode"]["calls"][1]))  # predict: lengths, a page table, a token out
    ps = problems(raw)
    for name in ("seq_lens", "block_table"):
        assert f"programs.prefill.batch.independent_rows: buffer {name!r} is per sequence: its rows read their sequence" in ps
    assert ("programs.prefill.batch.independent_rows: buffer 'next_token' emits per sequence: independent rows emit "
            "nothing") in ps
    raw = good()
    raw["programs"]["decode"]["batch"]["independent_rows"] = True
    assert ("programs.decode.batch.independent_rows: only a chunk (rows given as a var) lays several sequences' rows "
            "in one call") in problems(raw)
    raw = good()
    raw["programs"]["prefill"]["batch"]["independent_rows"] = "yes"
    assert 'programs.prefill.batch.independent_rows: expected true or false, got "yes"' in problems(raw)


def test_cu_seqlens_holds_one_offset_more_than_the_sequences():
    assert manifests.parse(packed(16, 257))
    ps = problems(packed(16, 16))
    assert "buffers.cu.shape: holds 16 offsets, programs.prefill packs 16 sequences (needs 17)" in ps
    assert "buffers.cu.shape: holds 16 offsets, programs.decode packs 256 sequences (needs 257)" in ps
    raw = packed()
    raw["buffers"]["cu"]["shape"] = ["seqs", 2]
    assert "buffers.cu.shape: a cu_seqlens buffer has one dim" in problems(raw)


def test_cu_seqlens_is_an_input_fill():
    raw = packed()
    raw["buffers"]["cu"]["kind"] = "output"
    assert any(p.startswith("buffers.cu.fill: fill 'cu_seqlens' is not allowed on a output buffer") for p in problems(raw))


def with_context(name="ctx", max_=16384) -> dict:
    raw = packed()
    raw["vars"]["ctx"] = {"max": max_}
    raw["programs"]["prefill"]["batch"]["context"] = name
    return raw


def test_the_context_bound_is_a_var_on_the_chunk():
    m = manifests.parse(with_context())
    assert m.programs["prefill"].context == "ctx"
    assert Protocol(m).context_bound == 16384
    assert Protocol(m).packs
    assert Protocol(manifests.parse(good())).context_bound is None
    one = good()
    one["programs"]["prefill"]["batch"] = {"groups": 1, "rows": "tokens"}  # a chunk of one sequence
    assert not Protocol(manifests.parse(one)).packs


def test_the_context_bound_names_a_var_of_its_own():
    assert "programs.prefill.batch.context: unknown var 'ctxx'" in problems(with_context("ctxx"))
    ps = problems(with_context("tokens"))
    assert "programs.prefill.batch.context: var 'tokens' already counts the call's rows" in ps
    raw = with_context()
    raw["programs"]["prefill"]["batch"]["context"] = 5
    assert "programs.prefill.batch.context: expected a var name, got 5" in problems(raw)


def test_a_declared_context_var_no_batch_names_is_unused():
    raw = with_context()
    del raw["programs"]["prefill"]["batch"]["context"]
    assert problems(raw) == ["vars.ctx: declared but never used"]


def test_the_cut_field():
    raw = good()
    raw["cut"] = {"id": "0123456789abcdef", "stage": 1, "stages": 3}
    assert manifests.parse(raw).cut == manifests.schema.Cut("0123456789abcdef", 1, 3)
    assert manifests.parse(good()).cut is None


@pytest.mark.parametrize("cut, problem", [
    ({"id": "xyz", "stage": 0, "stages": 2}, 'cut.id: expected 16 lowercase hex digits, got "xyz"'),
    ({"id": "0123456789abcdef", "stage": 2, "stages": 2}, "cut.stage: stage 2 of 2 stages (stages count from 0)"),
    ({"id": "0123456789abcdef", "stage": 0, "stages": 1}, "cut.stages: must be >= 2, got 1"),
    ({"id": "0123456789abcdef", "stage": 0}, "cut.stages: missing"),
    ({"id": "0123456789abcdef", "stage": 0, "stages": 2, "of": 1}, "cut.of: unknown field"),
])
def test_a_bad_cut_field_is_named(cut, problem):
    raw = good()
    raw["cut"] = cut
    assert problem in problems(raw)

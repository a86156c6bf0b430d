"""The layered toy (`toy-layers`): its shape, its load path, packed prefill, and a test per property
that breaks it and sees the answer change (issue 9).

Each break test runs the clean answer and the broken one through the runtime and asserts they
differ over 8 generated tokens (a coincidence is a 1-in-256^8 chance per test); the clean answer
is itself held to `toy/model.py`.
"""

import json

import numpy as np
import pytest

import manifests
from manifests import derive
from runtime.runtime import Runtime
from runtime.sequence import generate, single
from runtime.step import Cell
from runtime.weights import read_tensors
from tests.toyrun import CONFIG, target
from toy import gen_layers, model

NAME = "toy-layers"
PROMPT = list(b"The lighthouse keeper had not seen a ship in eleven days")
STEPS = 8


def layered():
    return target(NAME)


def answer(rt, cell, ids=PROMPT, steps=STEPS, chunk=None):
    return generate(rt, cell, ids, steps, 1, chunk).ids


def fresh(ids=PROMPT, steps=STEPS):
    m, w = layered()
    return single(m, w, len(ids), steps, 1)


def clean():
    m, _ = layered()
    want = model.generate(PROMPT, STEPS, m.raw)
    assert len(want) == STEPS, "pick a prompt whose answer does not stop early"
    return want


def hooked(rt, after):
    """Make `after(label, rt)` run after every call of every program the runtime runs."""
    inner = rt.run_call

    def call(c, env):
        if after(c.label, rt, c) is not False:
            inner(c, env)

    rt.run_call = call


def act(rt, rows):
    return rt.buffers["act"].view(np.uint64)[: rows * model.ACT].reshape(rows, model.ACT)


# -- shape -------------------------------------------------------------------------------------


def test_the_model_tells_the_families_apart_by_their_states():
    """Layered: states kv.0..kv.{L-1}; lined: a bytes_per_seq state; paged: neither."""
    assert model.layer_count(layered()[0].raw) == gen_layers.LAYERS >= 4
    for shape in ("toy-paged", "toy-stateful", "toy-big"):
        assert model.layer_count(target(shape)[0].raw) == 0
    assert model.is_lined(target("toy-stateful")[0].raw) and not model.is_lined(layered()[0].raw)
    # the same prompt through the three families gives three different answers
    answers = {tuple(model.generate(PROMPT, STEPS, target(s)[0].raw)) for s in ("toy-paged", "toy-stateful", NAME)}
    assert len(answers) == 3


def test_four_layers_each_own_a_paged_state_and_rewrite_an_8_word_activation():
    m, _ = layered()
    assert [s for s in sorted(m.states)] == [f"kv.{l}" for l in range(gen_layers.LAYERS)]
    assert all(s.paged for s in m.states.values())
    act_buf = m.buffers["act"]
    assert (act_buf.kind, act_buf.dtype, act_buf.shape) == ("workspace", "i64", ("tokens", 8))
    for prog in ("prefill", "decode"):
        layers = [c for c in m.programs[prog].calls if c.op == "layer"]
        assert [next(a.value for a in c.args if a.kind == "state") for c in layers] == list(sorted(m.states))
        for c in layers:  # each layer reads and rewrites the activation
            i = next(i for i, a in enumerate(c.args) if a.kind == "buf" and a.value == "act")
            assert m.ops["layer"].params[i].direction == "inout"


def test_prefill_and_decode_have_the_same_call_sequence_with_the_emitting_call_last():
    """So one cut index lands on the same layer boundary in every driven program."""
    m, _ = layered()
    seqs = [[(c.op, c.label) for c in p.calls] for p in m.driven()]
    assert len(seqs) == 2 and seqs[0] == seqs[1]
    assert seqs[0][0][0] == "embed" and seqs[0][-1][0] == "head"
    assert [op for op, _ in seqs[0][1:-1]] == ["layer"] * gen_layers.LAYERS
    for p in m.driven():
        last = p.calls[-1]
        assert any(a.kind == "buf" and m.buffers[a.value].fill == "tokens" for a in last.args)
        assert not any(a.kind == "buf" and m.buffers[a.value].fill == "tokens" for c in p.calls[:-1] for a in c.args)


def test_the_checkpoint_holds_the_source_the_model_derives_from_constants():
    t = CONFIG.targets[NAME]
    tensors = read_tensors(list(t.weights))
    assert tensors["layers.source"].tolist() == model.source(gen_layers.LAYERS)
    assert tensors["salt"].tolist() == list(model.SALT)


def test_a_reach_of_16384_and_a_context_bound():
    m, _ = layered()
    assert derive.reach(m) >= 16384
    assert m.programs["prefill"].context == "context" and m.vars["context"].max >= 16384


def test_runtime_equals_the_model_past_position_16384():
    """A 16384-token prompt (the context bound: the last chunk of 2048 ends exactly on it), then
    decode steps at positions 16384 and on."""
    m, w = layered()
    ids = [(i * 7 + i // 97) % 256 for i in range(16384)]
    rt, cell = single(m, w, len(ids), 3, 1)
    assert answer(rt, cell, ids, 3) == model.generate(ids, 3, m.raw)


# -- load: derive, sources, once -----------------------------------------------------------------


def test_derive_runs_at_load_and_the_once_table_after_it():
    rt, _ = fresh()
    mix = model.derive_mix(model.source(gen_layers.LAYERS))
    assert rt.buffers["mix"].view(np.uint64).tolist() == mix
    assert rt.buffers["table"].view(np.uint64).tolist() == model.table(mix, gen_layers.LAYERS)
    assert "source" not in rt.buffers, "a source lives only during load"
    assert rt.load_report == {"derived_bytes": 256, "source_peak_bytes": 256, "peak_bytes": 512}


def test_sources_are_staged_only_between_their_first_and_last_reader():
    """Derive programs A(s1), B(s2), C(s1), D(s3): s1 lives A..C, s2 only at B, s3 only at D, so the
    widest live set is s1 + s2 (at B), not all three; the peak is that plus the derived weights."""
    m, w = layered()
    raw = json.loads(json.dumps(m.raw))
    sizes = {"s1": 32, "s2": 64, "s3": 48}  # the derive op converts the first 32 words
    for s, n in sizes.items():
        raw["buffers"][s] = {"dtype": "i64", "shape": [n], "kind": "source", "bind": [{"tensor": s}]}
    for d, n in (("m2", 64), ("m3", 32), ("m4", 48)):
        raw["buffers"][d] = {"dtype": "i64", "shape": [n], "kind": "weight"}
    del raw["buffers"]["source"]
    call = lambda s, d: {"op": "derive", "args": [{"buf": s}, {"buf": d}]}  # noqa: E731
    del raw["programs"]["derive"]
    progs = {"a": [call("s1", "mix")], "b": [call("s2", "m2")], "c": [call("s1", "m3")], "d": [call("s3", "m4")]}
    raw["programs"] = {**{k: {"derive": True, "calls": v} for k, v in progs.items()}, **raw["programs"]}
    tensors = {k: v for k, v in read_tensors(w).items() if k == "salt"}
    for s, n in sizes.items():
        tensors[s] = np.arange(n, dtype=np.int64) + (1 << 40)
    rt = Runtime(manifests.parse(raw), tensors, pages=2)
    widest = (32 + 64) * 8
    derived = (32 + 64 + 32 + 48) * 8
    assert rt.load_report == {"derived_bytes": derived, "source_peak_bytes": widest, "peak_bytes": derived + widest}
    assert not set(sizes) & set(rt.buffers)
    mix = rt.buffers["m4"].view(np.uint64)[:32]
    assert mix.tolist() == model.derive_mix(tensors["s3"][:32].tolist())


def test_kern_run_json_prints_the_load_peak():
    from click.testing import CliRunner

    from kern.cli import main

    r = CliRunner().invoke(main, ["run", NAME, "--prompt", "x", "--steps", "2", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output.strip().splitlines()[-1])
    assert got["load"] == {"derived_bytes": 256, "source_peak_bytes": 256, "peak_bytes": 512}


def test_a_different_source_changes_every_answer():
    """The derive path feeds the answer: another checkpoint source, another answer."""
    m, w = layered()
    tensors = read_tensors(w)
    tensors["layers.source"] = tensors["layers.source"] ^ 1
    rt, cell = fresh()
    want = answer(rt, cell)
    assert want == clean()
    rt2 = Runtime(m, tensors, pages=rt.pages, backend="cpu", max_seqs=1)
    rt2.set_pad(0, None)
    assert answer(rt2, Cell(cell.pages, None, [], 0)) != want


def test_skipping_the_derive_or_the_once_program_changes_the_answer():
    want = clean()
    for skip in ("mix", "table"):
        rt, cell = fresh()
        rt.buffers[skip][:] = 0  # as if the program that fills it at load had not run
        assert answer(rt, cell) != want, skip


# -- state, activation, layers -----------------------------------------------------------------


def prefilled(ids=PROMPT):
    """A runtime and cell after prefill (which emits the first token)."""
    rt, cell = fresh(ids)
    c = Cell(cell.pages, cell.slot, ids, 0)
    rt.step("prefill", [c])
    return rt, cell, c.tokens[0]


def continue_from(rt, cell, first, pos, steps=STEPS - 1):
    out = [first]
    t = first
    while len(out) < steps + 1 and t != model.EOS:
        c = Cell(cell.pages, cell.slot, [t], pos)
        rt.step("decode", [c])
        t = c.tokens[0]
        out.append(t)
        pos += 1
    return out


def test_prefill_then_decode_equals_the_model():
    rt, cell, first = prefilled()
    assert continue_from(rt, cell, first, len(PROMPT)) == clean()


@pytest.mark.parametrize("layer", range(gen_layers.LAYERS))
@pytest.mark.parametrize("word", [3, 100], ids=["head", "tail"])
def test_a_wrong_byte_in_any_layers_state_changes_the_answer(layer, word):
    rt, cell, first = prefilled()
    q = 9
    kv = rt.arenas[f"kv.{layer}"].view(np.uint64)
    words = gen_layers.BYTES_PER_TOKEN // 8
    slot = cell.pages[q // rt.unit] * rt.unit + q % rt.unit
    kv[slot * words + word] ^= np.uint64(1 << 17)
    assert continue_from(rt, cell, first, len(PROMPT)) != clean()


def decode_two(mutate=None):
    """Two sequences prefilled, then decoded together for STEPS steps; `mutate(label, rt, step)` may
    change the activation after any call. Returns each sequence's tokens."""
    m, w = layered()
    prompts = [PROMPT, list(b"A hash map trades memory for speed: instead of scanning")]
    unit = derive.page_unit(m)
    per = -(-(max(map(len, prompts)) + STEPS) // unit)
    rt = Runtime(m, w, pages=1 + 2 * per, max_seqs=2)
    rt.set_pad(0, None)
    cells = [Cell(list(range(1 + i * per, 1 + (i + 1) * per)), None, p, 0) for i, p in enumerate(prompts)]
    rt.step("prefill", cells)
    outs = [[c.tokens[0]] for c in cells]
    step = [0]
    if mutate:
        hooked(rt, lambda label, rt, c: mutate(label, rt, step[0]))
    for s in range(STEPS - 1):
        step[0] = s
        batch = [Cell(c.pages, None, [o[-1]], len(p) + s) for c, o, p in zip(cells, outs, prompts)]
        rt.step("decode", batch)
        for o, b in zip(outs, batch):
            o.append(b.tokens[0])
    return outs, [model.generate(p, STEPS, m.raw) for p in prompts]


def test_two_sequences_decoded_together_equal_the_model():
    outs, want = decode_two()
    assert outs == want


def test_reordered_activation_rows_change_the_answer():
    def swap(label, rt, step):
        if label == "layer.1" and step == 2:
            a = act(rt, 2)
            a[[0, 1]] = a[[1, 0]]

    outs, want = decode_two(swap)
    assert outs[0] != want[0] and outs[1] != want[1]


def test_a_stale_activation_row_changes_the_answer():
    saved = {}

    def stale(label, rt, step):
        if label == "layer.2":
            if step == 1:
                saved["a"] = act(rt, 2).copy()
            if step == 3:
                act(rt, 2)[0] = saved["a"][0]  # the row the previous step left behind

    outs, want = decode_two(stale)
    assert outs[0] != want[0] and outs[1] == want[1]


@pytest.mark.parametrize("words", [range(4, 8), range(7, 8)], ids=["half", "last-word"])
def test_a_partly_copied_activation_row_changes_the_answer(words):
    def partial(label, rt, step):
        if label == "layer.0" and step == 2:
            a = act(rt, 2)
            for j in words:
                a[1, j] = 0

    outs, want = decode_two(partial)
    assert outs[0] == want[0] and outs[1] != want[1]


@pytest.mark.parametrize("layer", range(gen_layers.LAYERS))
def test_a_skipped_layer_changes_the_answer(layer):
    outs, want = decode_two(lambda label, rt, step: False if label == f"layer.{layer}" and step == 2 else None)
    assert outs[0] != want[0] and outs[1] != want[1]


def test_a_layer_given_another_layers_weights_changes_the_answer():
    def swapped(label, rt, step):
        if label == "layer.3" and step == 1:
            mix = rt.buffers["mix"].view(np.uint64)
            mix[24:32], mix[16:24] = mix[16:24].copy(), mix[24:32].copy()

    outs, want = decode_two(swapped)
    assert outs != want


# -- packed prefill ------------------------------------------------------------------------------


def test_a_packed_prefill_equals_each_sequence_alone():
    """Three sequences' chunks in one prefill call (one continuing at position 20, one fresh, one a
    single row): each first token is the model's, and every state byte equals the unpacked run."""
    m, w = layered()
    prompts = [PROMPT, list(b"Rain had turned the trail to mud"), [65]]
    per = 6
    rt = Runtime(m, w, pages=1 + 3 * per, max_seqs=4)
    rt.set_pad(0, None)
    cells = [list(range(1 + i * per, 1 + (i + 1) * per)) for i in range(3)]
    rt.step("prefill", [Cell(cells[0], None, PROMPT[:20], 0)])
    packed = [Cell(cells[0], None, PROMPT[20:], 20), Cell(cells[1], None, prompts[1], 0), Cell(cells[2], None, prompts[2], 0)]
    rt.step("prefill", packed)
    assert [c.tokens for c in packed] == [model.generate(p, 1, m.raw) for p in prompts]
    for pages, p in zip(cells, prompts):
        alone, cell = single(m, w, len(p), 1, 1)
        alone.step("prefill", [Cell(cell.pages, None, p, 0)])
        assert rt.read_state(pages, None, len(p)) == alone.read_state(cell.pages, None, len(p))


def test_a_packed_call_over_its_context_bound_is_refused():
    m, w = layered()
    rt = Runtime(m, w, pages=1 + 2 * 1030, max_seqs=2)
    a = Cell(list(range(1, 1031)), None, [1] * 8, 16000)
    b = Cell(list(range(1031, 2061)), None, [2] * 400, 0)
    with pytest.raises(ValueError, match="context 16408 .* over vars.context.max 16384"):
        rt.step("prefill", [a, b])


def test_the_layered_reference_answers_the_same_whatever_was_asked_before():
    """Property (seeded): `generate_layered` remembers fed prefixes (a trie shared by every call in
    the process), and its answer for any ids is the memo-free fold of `_feed` over them, whether the
    prefix was never seen, seen as an earlier prompt, or seen as an earlier prompt plus its answer."""
    import random

    def plain(ids, max_tokens, layers):
        sums, x = (0,) * layers, []
        for p, t in enumerate(ids):
            x, sums = model._feed(t, p, sums, layers)
        out, n = [], len(ids)
        while len(out) < max_tokens:
            t = model.next_of(model.head_sum(x))
            if t == model.EOS:
                break
            out.append(t)
            x, sums = model._feed(t, n, sums, layers)
            n += 1
        return out

    rng = random.Random(7)
    model._PREFIXES.clear()
    for _ in range(30):
        layers = rng.choice([2, 4])
        ids = [rng.randrange(256) for _ in range(rng.randrange(1, 40))]
        first = model.generate_layered(ids, 12, layers)
        assert first == plain(ids, 12, layers)
        turn2 = ids + first + [rng.randrange(256) for _ in range(rng.randrange(5))]
        assert model.generate_layered(turn2, 12, layers) == plain(turn2, 12, layers)
        assert model.generate_layered(ids[: len(ids) // 2 + 1], 6, layers) == plain(ids[: len(ids) // 2 + 1], 6, layers)
    assert len(model._PREFIXES) > 0

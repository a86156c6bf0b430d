"""vLLM's parameter rules (verdicts/params.py, ``RULES["vllm"]``) held to vLLM's own code.

Property: for any continuation (byte tokens, EOS, bad UTF-8), stop strings, stop token ids, include
flag, max_tokens and min_tokens, what `expect(..., rules=RULES["vllm"])` predicts (token ids, text,
finish reason, stop reason) is what vLLM 0.32's stop checks (`v1.core.sched.utils.check_stop`'s order:
EOS, stop ids, length, then min_tokens holding the rest) and its incremental detokenizer (the toy's
byte tokenizer through `IncrementalDetokenizer.from_new_request`, the tokenizers library's
DecodeStream, its stop-string match) make of the same tokens, one token a step. The continuation has
no EOS or stop id before min_tokens, as vLLM's logits processor masks them. Runs where vLLM is
installed (its venv: examples/vllm_toy/README.md), with this checkout on PYTHONPATH."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (its venv: examples/vllm_toy/README.md)", allow_module_level=True)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.stop_strings import stop_strings  # noqa: E402
from verdicts.params import RULES, expect, text_of  # noqa: E402

EOS = 256
MODEL = Path(__file__).resolve().parent.parent / "examples" / "vllm_toy" / "model"


@pytest.fixture(scope="module")
def tokenizer():
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(MODEL))


def vllm_answer(tokenizer, cont, max_tokens, stop=(), stop_ids=(), include=False, min_tokens=0):
    """What vLLM answers when its model emits `cont`, one token a step: (ids, text, finish, stop_reason)."""
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    params = types.SimpleNamespace(stop=list(stop), min_tokens=min_tokens, include_stop_str_in_output=include,
                                   skip_special_tokens=True, spaces_between_special_tokens=True)
    request = types.SimpleNamespace(request_id="r", sampling_params=params, prompt_token_ids=[65, 66],
                                    prompt_embeds=None)
    detok = IncrementalDetokenizer.from_new_request(tokenizer, request)
    ids, finish, reason = [], None, None
    for t in cont:
        ids.append(t)
        if t == EOS:
            finish = "stop"
        elif t in stop_ids:
            finish, reason = "stop", t
        elif len(ids) >= max_tokens:
            finish = "length"
        got = detok.update([t], finish == "stop")
        if got is not None:
            finish, reason = "stop", got
        if finish is not None:
            break
    return ids, detok.get_next_output_text(finished=True, delta=False), finish, reason


byte = st.one_of(st.integers(32, 126), st.integers(0, 255), st.sampled_from([0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0]))


@st.composite
def case(draw):
    max_tokens = draw(st.integers(1, 48))
    min_tokens = draw(st.one_of(st.just(0), st.integers(0, max_tokens)))
    body = draw(st.lists(byte, min_size=max_tokens, max_size=max_tokens))
    tail = draw(st.lists(st.one_of(byte, st.just(EOS)), min_size=0, max_size=max_tokens))
    cont = body[:min_tokens] + tail + body[min_tokens:]  # no EOS before min_tokens (masked)
    if min_tokens == 0 and draw(st.booleans()):
        cont = cont + [EOS]
    stop = stop_strings(draw, text_of(cont), 12, 4)
    stop_ids = ()
    if min_tokens == 0 and draw(st.booleans()):
        stop_ids = (draw(st.sampled_from(cont)),) if cont[0] != EOS else ()
    return cont, max_tokens, tuple(stop), tuple(t for t in stop_ids if t != EOS), draw(st.booleans()), min_tokens


@settings(max_examples=400, deadline=None)
@given(case())
def test_expect_under_vllms_rules_is_what_vllms_code_answers(tokenizer, c):
    cont, max_tokens, stop, stop_ids, include, min_tokens = c
    if EOS not in cont[:max_tokens] and len(cont) < max_tokens:
        cont = cont + [65] * (max_tokens - len(cont))
    want = expect(cont, max_tokens, EOS, stop=stop, stop_ids=stop_ids, include=include, rules=RULES["vllm"],
                  min_tokens=min_tokens)
    got = vllm_answer(tokenizer, cont, max_tokens, stop, stop_ids, include, min_tokens)
    assert (want.token_ids, want.text, want.finish, want.stop_reason) == got

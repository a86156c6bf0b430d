"""Every OpenAI request parameter is honoured as vLLM honours it, or refused with a 400 naming it
(serve/api/validate.py's PARAMS, docs/api.md): stop strings and stop token ids token-exactly against
toy/model.py, streamed text equal to the whole, echo, truncation, the greedy-only sampling values and
`--sampling greedy-warn`, unknown keys, type errors, and the keep rule with a stop string against the
gate's policy oracle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest

from conftest import EOS, PROMPTS, manifest_dict, oracle
from serve.api.validate import CHAT, CMPL, PARAMS, table_markdown, text_of
from serve.core.request import Request, Stops

TARGET = "toy-paged"
REPO = Path(__file__).resolve().parents[1]
LONG = list(PROMPTS[4].encode())  # its answer runs 200 tokens without an EOS
MT = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import start_server

    s = start_server(TARGET, log_path=tmp_path_factory.mktemp("params") / "server.log")
    yield s
    s.stop()
    if s.proc.poll() is None:
        s.proc.kill()


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    yield c
    c.close()


def _post(server, body, path="/v1/completions"):
    return httpx.post(server.url + path, json=body, timeout=120)


def _stream(server, body, path="/v1/completions"):
    """(texts per chunk, token ids per chunk, last chunk)."""
    texts, ids, last = [], [], None
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                last = json.loads(line[6:])
                c = last["choices"][0]
                texts.append(c["delta"].get("content", "") if "delta" in c else c["text"])
                ids.append(c["token_ids"])
    return texts, ids, last


def expect_stop(answer: list[int], stops: list[str], include: bool = False):
    """Brute force, independent of the server: the first token whose text completes a stop string
    (the first of `stops` found there, vLLM's order), the tokens up to it, the text before (or
    through) the string; or None when no string completes."""
    for k in range(1, len(answer) + 1):
        text = text_of(answer[:k])
        for s in stops:
            i = text.find(s)
            if i >= 0:
                return answer[:k], s, text[: i + len(s)] if include else text[:i]
    return None


def _stops_in(answer: list[int], n: int, length: int, need: bool = True) -> list[str]:
    """`n` ASCII stop strings of `length` characters that the answer's text holds, spread over it
    (fewer than `n` there: an assertion, or with `need` false, none)."""
    text = text_of(answer)
    runs = [m.start() for m in re.finditer(r"(?=[!-~]{%d})" % length, text)]
    if len(runs) < n:
        assert not need, text
        return []
    return [text[runs[i * len(runs) // n]: runs[i * len(runs) // n] + length] for i in range(n)]


def _tokens(choice) -> list[int]:
    return choice.model_extra["token_ids"]


# -- stop strings ------------------------------------------------------------------------------------


def test_stop_strings_end_where_the_oracle_completes_them(client):
    answer = oracle(TARGET, LONG, MT)
    assert len(answer) == MT and EOS not in answer
    cases = [[s] for s in _stops_in(answer, 4, 1) + _stops_in(answer, 3, 2) + _stops_in(answer, 2, 3)]
    for stops in cases:
        want = expect_stop(answer, stops)
        assert want is not None and len(want[0]) < MT
        r = client.completions.create(model=TARGET, prompt=LONG, max_tokens=MT, stop=stops[0],
                                      extra_body={"return_token_ids": True})
        c = r.choices[0]
        assert _tokens(c) == want[0], stops
        assert c.text == want[2] and stops[0] not in c.text
        assert c.finish_reason == "stop" and c.model_extra["stop_reason"] == want[1]
        assert r.usage.completion_tokens == len(want[0])


def test_several_stop_strings_the_first_completed_wins(client):
    answer = oracle(TARGET, LONG, MT)
    early, mid, late = _stops_in(answer, 3, 2)
    stops = [late, early, mid]
    want = expect_stop(answer, stops)
    r = client.completions.create(model=TARGET, prompt=LONG, max_tokens=MT, stop=stops,
                                  extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert (_tokens(c), c.model_extra["stop_reason"], c.text) == want
    assert want[1] != late  # the list's first string completes later: the earlier completion ends it


def test_a_stop_string_past_the_answer_changes_nothing(client):
    answer = oracle(TARGET, LONG, 40)
    r = client.completions.create(model=TARGET, prompt=LONG, max_tokens=40, stop=["\x00\x00never"],
                                  extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert _tokens(c) == answer and c.text == text_of(answer)
    assert c.finish_reason == "length" and c.model_extra["stop_reason"] is None


def test_include_stop_str_in_output_keeps_the_string(client):
    answer = oracle(TARGET, LONG, MT)
    for s in _stops_in(answer, 2, 2):
        want = expect_stop(answer, [s], include=True)
        r = client.completions.create(model=TARGET, prompt=LONG, max_tokens=MT, stop=[s],
                                      extra_body={"return_token_ids": True, "include_stop_str_in_output": True})
        c = r.choices[0]
        assert _tokens(c) == want[0] and c.text == want[2] and c.text.endswith(s)
        assert c.finish_reason == "stop"


def test_streamed_text_equals_the_whole_with_stop_strings(server):
    answer = oracle(TARGET, LONG, MT)
    text = text_of(answer)
    # a 3-character stop whose first character shows up earlier, unmatched: the stream must hold it back
    stop = next(text[i:i + 3] for i in range(20, len(text) - 3)
                if text[i:i + 3].isascii() and text[i:i + 3].isprintable() and text[i] in text[:i - 1]
                and text[i:i + 3] not in text[:i])
    for include in (False, True):
        body = {"prompt": LONG, "max_tokens": MT, "stop": [stop, "\x01zz"], "return_token_ids": True,
                "include_stop_str_in_output": include}
        whole = _post(server, body).json()["choices"][0]
        texts, ids, last = _stream(server, body)
        assert "".join(texts) == whole["text"] == expect_stop(answer, [stop], include)[2]
        assert sum(ids, []) == whole["token_ids"] == expect_stop(answer, [stop])[0]
        assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["stop_reason"] == stop
    for chat_ in (False, True):  # chat too, and several strings
        body = {"max_tokens": MT, "stop": _stops_in(answer, 3, 2)[1:], "return_token_ids": True}
        path = "/v1/chat/completions" if chat_ else "/v1/completions"
        body.update({"messages": [{"role": "user", "content": PROMPTS[4]}]} if chat_ else {"prompt": LONG})
        whole = _post(server, body, path).json()["choices"][0]
        texts, ids, _ = _stream(server, body, path)
        got = whole["message"]["content"] if chat_ else whole["text"]
        assert "".join(texts) == got == expect_stop(answer, body["stop"])[2]
        assert sum(ids, []) == whole["token_ids"]


def test_stop_strings_are_decided_as_tokens_are_committed():
    """Request.take decides on the scheduler thread: however a step's tokens come (a round's several
    rows, or one by one), the answer ends at the same token, and no later token is given out."""
    answer = oracle(TARGET, LONG, MT)
    stops = _stops_in(answer, 2, 2)[1:]
    want = expect_stop(answer, stops)
    for width in (1, 2, 3, 7):
        req = Request("r", LONG, MT, 1, lambda u: None, stops=Stops(stops, [], False))
        out = []
        for at in range(0, MT, width):
            out += req.take(answer[at:at + width])
            if req.reason is not None:
                break
        assert out == req.out == want[0] and req.reason == "stop"
        assert req.stops.reason == want[1] and text_of(out)[:req.stops.text_end] == want[2]


def test_stop_validation(server):
    for stop, code in (([""], "invalid_value"), (["a", "b", "c", "d", "e"], "invalid_value"), (5, "invalid_type"),
                       (["a", 1], "invalid_type")):
        r = _post(server, {"prompt": "hi", "stop": stop})
        assert r.status_code == 400, stop
        err = r.json()["error"]
        assert err["param"] == "stop" and err["code"] == code and "'stop'" in err["message"]


# -- stop token ids ------------------------------------------------------------------------------------


def test_stop_token_ids(server):
    answer = oracle(TARGET, LONG, MT)
    t = answer[57]
    k = answer.index(t) + 1
    for include in (False, True):
        c = _post(server, {"prompt": LONG, "max_tokens": MT, "stop_token_ids": [t], "return_token_ids": True,
                           "include_stop_str_in_output": include}).json()["choices"][0]
        assert c["token_ids"] == answer[:k] and c["finish_reason"] == "stop" and c["stop_reason"] == t
        assert c["text"] == text_of(answer[:k] if include else answer[:k - 1])  # vLLM: its text left out
        texts, ids, _ = _stream(server, {"prompt": LONG, "max_tokens": MT, "stop_token_ids": [t],
                                         "include_stop_str_in_output": include})
        assert "".join(texts) == c["text"] and sum(ids, []) == answer[:k]
    # EOS as a stop token id, with ignore_eos: it still stops (vLLM), naming the id
    short = list(PROMPTS[0].encode())
    ans = oracle(TARGET, short, 64)
    assert ans[-1] == EOS
    c = _post(server, {"prompt": short, "max_tokens": 64, "ignore_eos": True, "stop_token_ids": [EOS],
                       "return_token_ids": True}).json()["choices"][0]
    assert c["token_ids"] == ans and c["stop_reason"] == EOS and c["finish_reason"] == "stop"
    c = _post(server, {"prompt": short, "max_tokens": 64, "return_token_ids": True}).json()["choices"][0]
    assert c["token_ids"] == ans and c["stop_reason"] is None  # a plain EOS stop names nothing
    for bad in ([257], [-1], "5", [1.0]):
        r = _post(server, {"prompt": "hi", "stop_token_ids": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids"


# -- the keep rule with a stop string -------------------------------------------------------------------


class _Ref:
    def __init__(self, target: str):
        self.manifest = manifest_dict(target)

    def path_of(self, ids, steps, rows, emits):
        from toy.model import path

        return path(list(ids), steps, self.manifest, rows, emits)


def test_stop_string_snapshots_agree_with_the_policy_oracle(kern_server):
    """A stop string ending an answer at token L is retired as a length of L would be (the same steps,
    the same folded tokens): the gate's policy oracle, told max_tokens L, predicts the server's cached
    tokens, tier and snapshot verdict, request after request, and its counters after them."""
    from e2e.client import Answer
    from e2e.policy import PolicyGate

    target = "toy-stateful-spec"
    s = kern_server(target)
    facts = s.stats()["facts"]
    gate = PolicyGate(_Ref(target), facts, True)
    assert gate.active, gate.why
    verdicts, stopped = [], 0
    for p in PROMPTS[:8]:
        ids = list(p.encode())
        stops = _stops_in(oracle(target, ids, 120), 2, 1, need=False)[1:] or ["\x00never"]
        turn, first = ids, None
        for _ in range(2):
            d = _post(s, {"prompt": turn, "max_tokens": 120, "stop": stops, "return_token_ids": True}).json()
            c = d["choices"][0]
            got = oracle(target, turn, 120)
            w = expect_stop(got, stops)
            assert c["token_ids"] == (w[0] if w else got)
            stopped += w is not None
            a = Answer(c["token_ids"], None, turn, d["usage"]["prompt_tokens_details"]["cached_tokens"],
                       c["finish_reason"], d["kern"]["request_id"], d["kern"]["cache_tier"], d["kern"]["snapshot"])
            # a stop string at token L: predicted as max_tokens L
            gate.expect(p[:20], turn, len(w[0]) if w else 120, a)
            verdicts.append(a.snapshot)
            if first == "kept":
                assert a.cached >= len(turn) // 2  # the stop's snapshot was kept, and this turn hit it
            first = a.snapshot
            turn = turn + c["token_ids"] + list(b" more")  # the next turn starts with this one's answer
    gate.compare("stop strings", s.stats())
    assert gate.problems == [] and gate.requests == 16 and gate.compared == 1, (gate.problems, gate.why)
    assert stopped >= 8 and "kept" in verdicts, (stopped, verdicts)


# -- echo, truncation, request ids, stream options --------------------------------------------------------


def test_echo_leads_with_the_prompt(server, client):
    answer = oracle(TARGET, LONG, 12)
    r = client.completions.create(model=TARGET, prompt=PROMPTS[4], max_tokens=12, echo=True)
    assert r.choices[0].text == PROMPTS[4] + text_of(answer)
    texts, ids, _ = _stream(server, {"prompt": LONG, "max_tokens": 12, "echo": True})
    assert texts[0].startswith(PROMPTS[4]) and "".join(texts) == PROMPTS[4] + text_of(answer)
    assert sum(ids, []) == answer  # token_ids stay the answer's
    stop = _stops_in(oracle(TARGET, LONG, MT), 2, 2)[1]
    r = client.completions.create(model=TARGET, prompt=PROMPTS[4], max_tokens=MT, echo=True, stop=[stop])
    assert r.choices[0].text == PROMPTS[4] + expect_stop(oracle(TARGET, LONG, MT), [stop])[2]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=TARGET, prompt="hi", max_tokens=2, echo=True, logprobs=1)
    assert e.value.body["param"] == "logprobs"
    r = _post(server, {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "/v1/chat/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_truncate_prompt_tokens_keeps_the_last_k(server):
    for k in (1, 5, len(LONG), len(LONG) + 10):
        c = _post(server, {"prompt": LONG, "max_tokens": 8, "truncate_prompt_tokens": k, "return_token_ids": True}).json()
        assert c["choices"][0]["prompt_token_ids"] == LONG[-k:]
        assert c["choices"][0]["token_ids"] == oracle(TARGET, LONG[-k:], 8)
        assert c["usage"]["prompt_tokens"] == len(LONG[-k:])
    for bad in (0, -1, "3", 2.5):
        r = _post(server, {"prompt": LONG, "truncate_prompt_tokens": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_request_id_names_the_response(server):
    assert _post(server, {"prompt": "hi", "max_tokens": 2, "request_id": "abc-1"}).json()["id"] == "cmpl-abc-1"
    d = _post(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "request_id": "abc-2"},
              "/v1/chat/completions").json()
    assert d["id"] == "chatcmpl-abc-2" and re.fullmatch(r"req-\d+", d["kern"]["request_id"])


def test_stream_options(server):
    r = _post(server, {"prompt": "hi", "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"  # vLLM: only with stream
    r = _post(server, {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True, "foo": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.foo"
    chunks = []
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
            "prompt": LONG, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5, 5]  # and the usage chunk


def test_max_completion_tokens_comes_first(server):
    d = _post(server, {"messages": [{"role": "user", "content": PROMPTS[4]}], "max_tokens": 9,
                       "max_completion_tokens": 3, "return_token_ids": True}, "/v1/chat/completions").json()
    assert d["choices"][0]["token_ids"] == oracle(TARGET, LONG, 3)


def test_continue_final_message(server):
    body = {"messages": [{"role": "user", "content": PROMPTS[4]}], "max_tokens": 6, "return_token_ids": True,
            "continue_final_message": True}
    r = _post(server, body, "/v1/chat/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    r = _post(server, {**body, "add_generation_prompt": False}, "/v1/chat/completions")
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == oracle(TARGET, LONG, 6)


# -- sampling: greedy only ----------------------------------------------------------------------------


GREEDY = [{"temperature": 0}, {"temperature": None}, {"temperature": 0.0, "top_p": 1}, {"top_k": -1}, {"top_k": 0},
          {"top_k": 1}, {"min_p": 0}, {"seed": 12345}, {"n": 1}, {"best_of": 1}, {"frequency_penalty": 0},
          {"presence_penalty": 0.0}, {"repetition_penalty": 1}, {"length_penalty": 1.0}, {"use_beam_search": False},
          {"min_tokens": 0}, {"temperature": 0, "top_p": 0.5, "top_k": 40, "min_p": 0.2}]


@pytest.mark.parametrize("extra", GREEDY, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_greedy_values_are_served_exactly(server, extra):
    c = _post(server, {"prompt": LONG, "max_tokens": 10, "return_token_ids": True, **extra})
    assert c.status_code == 200, c.text
    assert c.json()["choices"][0]["token_ids"] == oracle(TARGET, LONG, 10)


def test_sampling_refusals_through_the_openai_client(client):
    for kw in ({"temperature": 0.7}, {"top_p": 0.9}, {"frequency_penalty": 0.5}, {"presence_penalty": -1},
               {"best_of": 3}):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=TARGET, prompt="hi", max_tokens=2, **kw)
        name = next(iter(kw))
        assert e.value.status_code == 400 and e.value.body["param"] == name
        assert name in e.value.body["message"] and "greedy" in e.value.body["message"]
    for kw in ({"extra_body": {"top_k": 50}}, {"extra_body": {"repetition_penalty": 1.3}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=TARGET, messages=[{"role": "user", "content": "hi"}], **kw)
        assert e.value.body["param"] == next(iter(kw["extra_body"]))
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=TARGET, prompt="hi", n=2)
    assert e.value.body["param"] == "n"


def test_greedy_warn_serves_sampling_greedily_with_one_warning_per_name(kern_server):
    s = kern_server(TARGET, "--sampling", "greedy-warn")
    for extra in ({"temperature": 0.8}, {"temperature": 1.0, "top_p": 0.9}, {"top_k": 40, "temperature": 0.5}):
        c = _post(s, {"prompt": LONG, "max_tokens": 10, "return_token_ids": True, **extra})
        assert c.status_code == 200 and c.json()["choices"][0]["token_ids"] == oracle(TARGET, LONG, 10)
    warns = [ln for ln in s.log().splitlines() if "sampling ignored" in ln]
    assert len(warns) == 3 and "WARN" in warns[0], warns
    assert sorted(re.search(r"param=(\w+)", w).group(1) for w in warns) == ["temperature", "top_k", "top_p"]
    for bad, param in (({"temperature": -1}, "temperature"), ({"n": 2}, "n"), ({"top_p": 0}, "top_p")):
        r = _post(s, {"prompt": "hi", **bad})  # out of range, or not sampling: still refused
        assert r.status_code == 400 and r.json()["error"]["param"] == param


# -- the table: every name honoured or refused by name -----------------------------------------------------


BASE = {CMPL: ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
        CHAT: ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})}


@pytest.mark.parametrize("endpoint", [CMPL, CHAT])
def test_every_parameter_in_the_table_is_honoured_or_refused_by_name(server, endpoint):
    path, base = BASE[endpoint]
    seen = set()
    for p in PARAMS:
        if endpoint not in p.on:
            continue
        seen.add(p.name)
        r = _post(server, {**base, p.name: p.probe}, path)
        if p.probe_ok:
            assert r.status_code == 200, (p.name, r.text)
            if p.name != "stream":
                assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        else:
            assert r.status_code == p.probe_status, (p.name, r.text)
            err = r.json()["error"]
            assert err["param"] == p.name and p.name in err["message"], (p.name, err)
        if p.check is not None:  # a value of the wrong type is a 400 naming it too
            wrong = "x" if isinstance(p.probe, dict) else {"x": 1}
            r = _post(server, {**base, p.name: wrong}, path)
            assert r.status_code == 400 and r.json()["error"]["param"] == p.name, (p.name, r.text)
    # each schema's every name is in the table
    if endpoint == CMPL:
        want = {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens",
                "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
                "top_p", "user"}
    else:
        want = {"messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
                "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "n",
                "parallel_tool_calls", "prediction", "presence_penalty", "reasoning_effort", "response_format",
                "seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice",
                "tools", "top_logprobs", "top_p", "user", "web_search_options", "add_generation_prompt",
                "continue_final_message", "echo", "chat_template", "chat_template_kwargs", "documents"}
    extras = {"top_k", "min_p", "repetition_penalty", "length_penalty", "use_beam_search", "stop_token_ids",
              "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
              "spaces_between_special_tokens", "truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids",
              "bad_words", "add_special_tokens", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
              "guided_decoding_backend", "structured_outputs", "priority", "request_id", "return_tokens_as_token_ids",
              "kv_transfer_params", "cache_salt", "return_token_ids"}
    assert want | extras <= seen, sorted((want | extras) - seen)


def test_refusals_name_the_parameter_through_the_openai_client(client):
    calls = [
        ("logprobs", lambda: client.completions.create(model=TARGET, prompt="hi", logprobs=2)),
        ("suffix", lambda: client.completions.create(model=TARGET, prompt="hi", suffix="!")),
        ("logit_bias", lambda: client.completions.create(model=TARGET, prompt="hi", logit_bias={"65": 3})),
        ("tools", lambda: client.chat.completions.create(
            model=TARGET, messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])),
        ("response_format", lambda: client.chat.completions.create(
            model=TARGET, messages=[{"role": "user", "content": "hi"}], response_format={"type": "json_object"})),
        ("logprobs", lambda: client.chat.completions.create(
            model=TARGET, messages=[{"role": "user", "content": "hi"}], logprobs=True)),
        ("min_tokens", lambda: client.completions.create(model=TARGET, prompt="hi", extra_body={"min_tokens": 4})),
        ("guided_regex", lambda: client.completions.create(model=TARGET, prompt="hi", extra_body={"guided_regex": "a"})),
    ]
    for name, call in calls:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.body["param"] == name and f"'{name}'" in e.value.body["message"], e.value.body
    # and what is accepted there is served exactly
    r = client.chat.completions.create(model=TARGET, messages=[{"role": "user", "content": PROMPTS[4]}], max_tokens=6,
                                       tools=[], tool_choice="none", response_format={"type": "text"}, logprobs=False,
                                       user="u", seed=3, store=False, metadata={"a": "b"}, service_tier="auto",
                                       extra_body={"return_token_ids": True, "skip_special_tokens": False,
                                                   "bad_words": [], "logit_bias": {}, "priority": 0})
    assert r.choices[0].model_extra["token_ids"] == oracle(TARGET, LONG, 6)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=TARGET, prompt="hi", extra_body={"min_tokens": 2})
    assert "second choice" in e.value.body["message"]


def test_unknown_keys_are_refused_by_name(server, client):
    hi = [{"role": "user", "content": "hi"}]
    for path, body, k in (("/v1/completions", {"prompt": "hi", "foo": 1}, "foo"),
                          ("/v1/completions", {"prompt": "hi", "messages": hi}, "messages"),  # chat's, not ours
                          ("/v1/completions", {"prompt": "hi", "max_completion_tokens": 2}, "max_completion_tokens"),
                          ("/v1/completions", {"prompt": "hi", "chat_template": None}, "chat_template"),
                          ("/v1/chat/completions", {"messages": hi, "prompt": "x"}, "prompt"),
                          ("/v1/chat/completions", {"messages": hi, "suffix": "x"}, "suffix"),
                          ("/v1/chat/completions", {"messages": hi, "foo": None}, "foo")):  # null too
        r = _post(server, body, path)
        assert r.status_code == 400, body
        err = r.json()["error"]
        assert err["code"] == "unknown_parameter" and err["param"] == k and f"unknown parameter '{k}'" == err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=TARGET, prompt="hi", extra_body={"frobnicate": True})
    assert e.value.body["param"] == "frobnicate"


def test_type_errors_name_the_parameter(server):
    for k, v in (("top_k", "x"), ("seed", 1.5), ("echo", "yes"), ("logit_bias", []), ("user", 5),
                 ("temperature", True), ("include_stop_str_in_output", 1), ("priority", "high"), ("stop_token_ids", 3)):
        r = _post(server, {"prompt": "hi", k: v})
        assert r.status_code == 400, (k, r.text)
        err = r.json()["error"]
        assert err["param"] == k and err["code"] == "invalid_type" and k in err["message"]


def test_what_the_gate_drivers_send_is_served(server):
    """The Python e2e client and the Rust kern gate driver (docs: kern-e2e.md §5) send exactly these."""
    ids = list(PROMPTS[1].encode())
    body = {"model": TARGET, "prompt": ids, "max_tokens": 64, "temperature": 0, "return_token_ids": True}
    for b in (body, {**body, "prompt": PROMPTS[1]}):
        c = _post(server, b).json()["choices"][0]
        assert c["token_ids"] == oracle(TARGET, ids, 64)
    texts, got, last = _stream(server, {"model": TARGET, "prompt": PROMPTS[5], "max_tokens": 16, "temperature": 0})
    assert sum(got, []) == oracle(TARGET, list(PROMPTS[5].encode()), 16)
    assert httpx.post(server.url + "/tokenize", json={"model": TARGET, "prompt": "hi"}, timeout=10).json()["tokens"] == [104, 105]


def test_docs_carry_the_table():
    doc = (REPO / "docs" / "api.md").read_text()
    assert table_markdown() in doc, "docs/api.md's table is not serve/api/validate.py's PARAMS (table_markdown())"

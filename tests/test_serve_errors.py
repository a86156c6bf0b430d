"""The bad-input matrix: each answered with an OpenAI-style JSON error and a 4xx (never FastAPI's 422,
never a 5xx), and the server healthy and answering correctly after all of them.
"""

from __future__ import annotations

import httpx
import pytest

from conftest import ask, assert_nothing_leaked, oracle

KEY = "sk-test"
TARGET = "toy-paged"
CAPACITY = 1024  # 64 pages: room over it is KvBudget, within the reach of 8192


def _post(server, path, content=None, json=None, key=KEY, **kw):
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(server.url + path, content=content, json=json, headers=headers, timeout=60, **kw)


CASES = [
    # (id, path, body (str = raw), status, code)
    ("malformed-json", "/v1/completions", '{"prompt": "hi",', 400, "invalid_json"),
    ("not-an-object", "/v1/completions", "[1, 2]", 400, "invalid_json"),
    ("empty-body", "/v1/completions", "", 400, "invalid_json"),
    ("prompt-int", "/v1/completions", {"prompt": 5}, 400, "invalid_type"),
    ("prompt-missing", "/v1/completions", {"max_tokens": 4}, 400, "missing_required_parameter"),
    ("prompt-mixed-list", "/v1/completions", {"prompt": [1, "a"]}, 400, "invalid_type"),
    ("two-prompts", "/v1/completions", {"prompt": ["a", "b"]}, 400, "invalid_value"),
    ("max-tokens-string", "/v1/completions", {"prompt": "hi", "max_tokens": "5"}, 400, "invalid_type"),
    ("max-tokens-float", "/v1/completions", {"prompt": "hi", "max_tokens": 4.0}, 400, "invalid_type"),
    ("max-tokens-bool", "/v1/completions", {"prompt": "hi", "max_tokens": True}, 400, "invalid_type"),
    ("stream-string", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "invalid_type"),
    ("temperature-string", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "invalid_type"),
    ("n-2", "/v1/completions", {"prompt": "hi", "n": 2}, 400, "invalid_value"),
    ("model-int", "/v1/completions", {"prompt": "hi", "model": 3}, 400, "invalid_type"),
    ("unknown-model", "/v1/completions", {"prompt": "hi", "model": "gpt-9"}, 404, "model_not_found"),
    ("empty-prompt", "/v1/completions", {"prompt": ""}, 400, "empty_prompt"),
    ("empty-ids", "/v1/completions", {"prompt": []}, 400, "empty_prompt"),
    ("id-257", "/v1/completions", {"prompt": [1, 257]}, 400, "invalid_token_id"),
    ("id-negative", "/v1/completions", {"prompt": [-1, 2]}, 400, "invalid_token_id"),
    ("id-huge", "/v1/completions", {"prompt": [10**30]}, 400, "invalid_token_id"),
    ("id-float", "/v1/completions", {"prompt": [1.5]}, 400, "invalid_type"),
    ("id-bool", "/v1/completions", {"prompt": [True]}, 400, "invalid_type"),
    ("max-tokens-0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "invalid_value"),
    ("max-tokens-negative", "/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, "invalid_value"),
    ("max-tokens-absurd", "/v1/completions", {"prompt": "hi", "max_tokens": 10**40}, 400, "invalid_value"),
    ("prompt-over-reach", "/v1/completions", {"prompt": [65] * 9000, "max_tokens": 1}, 400, "context_length_exceeded"),
    ("max-tokens-over-reach", "/v1/completions", {"prompt": "hi", "max_tokens": 9000}, 400, "context_length_exceeded"),
    ("over-the-pool", "/v1/completions", {"prompt": [65] * 100, "max_tokens": 2000}, 400, "kv_budget_exceeded"),
    ("exact-fill", "/v1/completions", {"prompt": [65] * 24, "max_tokens": CAPACITY - 24}, 400, "context_length_exceeded"),
    ("chat-no-messages", "/v1/chat/completions", {"max_tokens": 4}, 400, "missing_required_parameter"),
    ("chat-messages-string", "/v1/chat/completions", {"messages": "hi"}, 400, "invalid_type"),
    ("chat-content-int", "/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}, 400, "invalid_type"),
    ("chat-empty-content", "/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}, 400, "empty_prompt"),
    ("tokenize-no-prompt", "/tokenize", {"model": TARGET}, 400, "missing_required_parameter"),
    ("detokenize-bad-ids", "/detokenize", {"tokens": [1, 999]}, 400, "invalid_token_id"),
    ("unknown-route", "/v1/embeddings", {"input": "hi"}, 404, "not_found"),
    ("tokenize-unknown-key", "/tokenize", {"prompt": "hi", "foo": 1}, 400, "unknown_parameter"),
    ("detokenize-unknown-key", "/detokenize", {"tokens": [104], "foo": None}, 400, "unknown_parameter"),
    ("chat-no-role", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "missing_required_parameter"),
    ("chat-invented-role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "invalid_value"),
    ("chat-image-part", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400, "unsupported_content"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import start_server

    s = start_server(TARGET, "--api-key", KEY, "--capacity", str(CAPACITY),
                     log_path=tmp_path_factory.mktemp("errors") / "server.log")
    yield s
    s.stop()
    if s.proc.poll() is None:
        s.proc.kill()


@pytest.mark.parametrize("path, body, status, code", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_bad_input_is_an_openai_error(server, path, body, status, code):
    r = _post(server, path, content=body) if isinstance(body, str) else _post(server, path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and err["message"]
    if status == 400:
        assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("key", [None, "sk-wrong"], ids=["missing-key", "wrong-key"])
def test_a_bad_api_key_is_401(server, key):
    r = _post(server, "/v1/completions", json={"prompt": "hi"}, key=key)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
def test_a_body_that_is_not_json_by_its_content_type_is_415(server, path):
    body = '{"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "tokens": [104]}'
    r = httpx.post(server.url + path, content=body, timeout=60,
                   headers={"content-type": "text/plain", "authorization": f"Bearer {KEY}"})
    assert r.status_code == 415, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_media_type" and "text/plain" in err["message"]
    ok = httpx.post(server.url + "/tokenize", json={"prompt": "hi"}, timeout=60,
                    headers={"content-type": "application/json; charset=utf-8", "authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.json()["tokens"] == [104, 105]


@pytest.mark.parametrize("path, method", [("/health", "GET"), ("/v1/completions", "POST"), ("/stats", "GET")])
def test_a_host_the_server_does_not_answer_to_is_refused(server, path, method):
    r = httpx.request(method, server.url + path, json={"prompt": "hi", "max_tokens": 2}, timeout=60,
                      headers={"host": "rebound.example:80", "authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_host" and "rebound.example" in err["message"]
    assert httpx.get(server.url + "/health", headers={"host": "localhost"}, timeout=60).status_code == 200


def test_a_get_on_a_post_route_is_405(server):
    r = httpx.get(server.url + "/v1/completions", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_healthy_and_right_after_the_matrix(server):
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    ids = list(b"After the storm")
    r = _post(server, "/v1/completions", json={"prompt": ids, "max_tokens": 8, "return_token_ids": True})
    assert r.status_code == 200
    assert r.json()["choices"][0]["token_ids"] == oracle(TARGET, ids, 8)
    r = _post(server, "/v1/chat/completions", json={"messages": [{"role": "user", "content": "After "},
                                                                  {"role": "user", "content": "the storm"}],
                                                     "max_tokens": 8, "return_token_ids": True})
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == oracle(TARGET, ids, 8)
    assert _post(server, "/tokenize", json={"model": TARGET, "prompt": "After the storm"}).json()["tokens"] == ids
    assert _post(server, "/detokenize", json={"tokens": ids}).json()["prompt"] == "After the storm"
    models = httpx.get(server.url + "/v1/models", headers={"authorization": f"Bearer {KEY}"}, timeout=10).json()
    assert [m["id"] for m in models["data"]] == [TARGET]
    assert "kern:prefix_cache_hits_total{" in httpx.get(server.url + "/metrics", timeout=10).text
    assert_nothing_leaked(server)
    assert ask is not None


def test_metrics_agree_with_stats(server):
    """/metrics is Prometheus text carrying the same numbers as /stats, hits split by tier."""
    ids = list(b"A repeated prompt, long enough to fill more than one whole page of sixteen tokens")
    for _ in range(2):
        assert _post(server, "/v1/completions", json={"prompt": ids, "max_tokens": 4}).status_code == 200
    text = httpx.get(server.url + "/metrics", timeout=10).text
    stats = server.stats()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name.replace(f'model_name="{TARGET}"', "").replace("{,", "{").replace("{}", "")] = float(value)
    c, g = stats["counters"], stats["gauges"]
    assert samples["kern:resident_hits_total"] == c["resident_hits"] >= 1
    assert samples['kern:prefix_cache_hits_by_tier_total{tier="device"}'] == c["resident_hit_tokens"] >= 64
    assert samples['kern:prefix_cache_hits_by_tier_total{tier="host"}'] == c["host_hit_tokens"]
    assert samples["kern:prefix_cache_hits_total"] == c["prefix_hit_tokens"]
    for name, value in c.items():
        assert samples[f"kern:{name}_total"] == value, name
    for name in ("pages_used", "parked_entries", "leases"):
        assert samples[f"kern:{name}"] == g[name], name
    assert samples["kern:num_requests_running"] == g["running"]
    assert samples["kern:num_requests_waiting"] == g["waiting"]

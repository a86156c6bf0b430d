"""Packed prefill in the server: answers identical packed and unpacked (`--no-pack`), fewer prefill
calls packed; a prompt the manifest's context bound can never seat is refused at admission."""

from __future__ import annotations

import concurrent.futures
import json
import os

import httpx
import pytest

from conftest import PROMPTS, ask, assert_nothing_leaked, manifest_dict, oracle

LAYERS = "toy-layers"


def answers(server, prompts, max_tokens):
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: ask(server, p, max_tokens)["ids"], prompts))


def _no_layers() -> bool:
    from manifests.config import ConfigError, resolve

    try:
        resolve(LAYERS)
    except ConfigError:
        return True
    return False


@pytest.mark.parametrize("target", [
    pytest.param(LAYERS, marks=pytest.mark.skipif(_no_layers(), reason=f"no {LAYERS} target yet (issue 9)")),
    "toy-paged",  # no cu_seqlens: its prefill's rows are independent (docs/manifest.md)
])
def test_packed_prefill_answers_as_unpacked(kern_server, target):
    prompts = [list(p.encode()) * 3 for p in PROMPTS[:12]]
    # slow steps (20 ms more each, answers unchanged): the twelve requests, sent at once, are all
    # queued while the first prefill call runs, whatever the machine's load (beside a second suite
    # they once arrived one by one, and every packed call held one sequence)
    packed = kern_server(target, "--chunk", "64", "--capacity", "8192", "--fault", "slow-steps")
    unpacked = kern_server(target, "--chunk", "64", "--capacity", "8192", "--no-pack", "--fault", "slow-steps")
    got_packed = answers(packed, prompts, 8)
    got_unpacked = answers(unpacked, prompts, 8)
    assert got_packed == got_unpacked == [oracle(target, p, 8) for p in prompts]
    sp, su = assert_nothing_leaked(packed), assert_nothing_leaked(unpacked)
    assert sp["facts"]["pack"] is True and su["facts"]["pack"] is False
    assert sp["counters"]["prefill_tokens"] == su["counters"]["prefill_tokens"]
    # unpacked, every prefill call holds one sequence; packed, calls hold several
    assert su["counters"]["prefill_calls"] >= len(prompts)
    assert sp["counters"]["prefill_calls"] < su["counters"]["prefill_calls"]


def bounded_paged(tmp_path, bound: int) -> str:
    """toy-paged whose prefill declares a context bound of `bound` tokens."""
    raw = manifest_dict("toy-paged")
    raw["vars"]["context"] = {"max": bound}
    raw["programs"]["prefill"]["batch"]["context"] = "context"
    path = tmp_path / "toy-paged-bounded.json"
    path.write_text(json.dumps(raw))
    from manifests.config import resolve

    for w in resolve("toy-paged").weights:
        os.symlink(w.resolve(), tmp_path / w.name)
    return str(path)


def test_a_prompt_past_the_context_bound_is_refused_at_admission(kern_server, tmp_path):
    server = kern_server(bounded_paged(tmp_path, 64))
    # toy-paged prefills all but the last prompt token: 65 tokens reach 64, 66 reach 65
    fits = [7] * 65
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [7] * 66, "max_tokens": 4}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert "context bound is 64" in err["message"]
    assert ask(server, fits, 4)["ids"] == oracle("toy-paged", fits, 4)
    assert assert_nothing_leaked(server)["gauges"]["waiting"] == 0

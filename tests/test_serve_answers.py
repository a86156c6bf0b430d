"""Every toy shape through a real server: answers equal toy/model.py one at a time and 12 at once;
a repeated prompt hits whole pages below its last token (paged) or 0 (lined); a second turn sent as
ids hits the first turn's snapshot. The hit numbers are the Rust kern toy gate's (SPEC §10), at
--max-tokens 256; nothing is leaked at the end.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import EOS, PROMPTS, SUFFIX, ask, assert_nothing_leaked, oracle

M = 256

# target: (repeat cached for prompts 1-4, turn-2 cached for prompts 1-4, first turns not kept)
EXPECTED = {
    "toy-paged": ([96, 80, 96, 64], [144, 160, 112, 176], set()),
    "toy-stateful": ([0, 0, 0, 0], [117, 219, 160, 107], set()),
    "toy-spec": ([96, 80, 96, 64], [144, 160, 112, 160], set()),
    "toy-stateful-spec": ([0, 0, 0, 0], [117, 220, 0, 0], {2, 3}),
    "toy-big": ([64, 64, 64, 64], [128, 128, 64, 128], set()),
}


@pytest.mark.parametrize("target", list(EXPECTED))
def test_answers_hits_and_no_leak(kern_server, target):
    server = kern_server(target)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    prompts = [list(p.encode()) for p in PROMPTS]
    expected = [oracle(target, ids, M) for ids in prompts]

    # one at a time, through the official client
    serial = []
    for ids, want in zip(prompts, expected):
        r = client.completions.create(model=target, prompt=ids, max_tokens=M, extra_body={"return_token_ids": True})
        c = r.choices[0]
        assert c.token_ids == want
        assert c.finish_reason == ("stop" if want[-1] == EOS else "length")
        assert c.prompt_token_ids == ids
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert r.usage.completion_tokens == len(want)
        kern = r.model_extra["kern"]
        assert kern["snapshot"] in (("kept", "not kept") if server.stats()["facts"]["seq_slots"] else ("none",))
        serial.append(r)
    first_kept = [r.model_extra["kern"]["snapshot"] != "not kept" for r in serial[:4]]

    # repeat prompts 1-4: whole pages below the last token, or 0 on a lined target
    repeat, turn2, unkept = EXPECTED[target]
    for i in range(4):
        got = ask(server, prompts[i], M)
        assert got["ids"] == expected[i]
        assert got["cached"] == repeat[i], f"repeat {i + 1}"

    # turn 2 as ids: prompt + answer (with its stop) + suffix hits the first turn's snapshot
    assert {i for i in range(4) if not first_kept[i]} == unkept
    for i in range(4):
        ids2 = prompts[i] + list(serial[i].choices[0].token_ids) + list(SUFFIX.encode())
        got = ask(server, ids2, M)
        assert got["ids"] == oracle(target, ids2, M)
        assert got["cached"] == turn2[i], f"turn 2 of prompt {i + 1}"
        assert got["kern"]["cache_tier"] == ("device" if turn2[i] else None)

    # twelve at once, streamed: identical, and the streamed text is the non-streamed text
    with ThreadPoolExecutor(12) as pool:
        burst = list(pool.map(lambda ids: ask(server, ids, M, stream=True), prompts))
    for got, want, r in zip(burst, expected, serial):
        assert got["ids"] == want
        assert got["text"] == r.choices[0].text

    s = assert_nothing_leaked(server)
    assert s["counters"]["requests"] == 12 + 4 + 4 + 12
    if s["facts"]["rows"] > 1:
        c = s["counters"]
        assert c["rounds"] > 0 and 30 < 100 * c["accepted_rows"] / c["drafted_rows"] < 70
    assert server.stop() == 0


def test_a_streams_first_chunk_tells_its_hit(kern_server):
    """A stream's first chunk carries `kern` with the hit its admission found (docs/api.md), so a
    client that hangs up still learns it; the last chunk's kern says the same tier and wake."""
    import json

    import httpx

    server = kern_server("toy-paged")
    ids = list(PROMPTS[0].encode())
    first = ask(server, ids, 16)
    # usage on every chunk: a chunk a step, never a lagging stream's queued tokens folded into one
    # (docs/api.md), which on a busy machine could make the first chunk the last
    body = {"prompt": ids + first["ids"] + list(SUFFIX.encode()), "max_tokens": 16, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    chunks = [c for c in chunks if c["choices"]]  # the usage chunk after the last has none
    head, last = chunks[0]["kern"], chunks[-1]["kern"]
    cached = chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert len(chunks) > 1 and all("kern" not in c for c in chunks[1:-1]), chunks
    assert head == {"request_id": last["request_id"], "cache_tier": "device", "cached_tokens": cached,
                    "woken": False} and cached > 0, (head, last)
    assert (last["cache_tier"], last["woken"]) == ("device", False)

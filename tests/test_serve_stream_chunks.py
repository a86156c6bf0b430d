"""A stream's first token goes out in a data chunk of its own (it is the client's time to first token),
whatever is queued behind it; the tokens after it may fold into one chunk when the handler lags
(docs/api.md). In process, with the engine core in a process of its own, and with two front ends; and
on the speculative toy, whose first step brings several tokens at once: the first of them still alone.

Each case sends the twelve fixed prompts three times, all at once, so the handlers lag their steps: before
the first chunk had its own event, several of those first chunks carried a dozen tokens or more (and at
low load a whole 39-token answer went out as one chunk plus [DONE], which the Rust kern gate driver's
abort check reads as too few chunks). Then one at a time, as that driver streams.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import PROMPTS, oracle

M = 64


def chunks(url: str, prompt: str) -> list[dict]:
    """The `data:` events of one streamed completion, [DONE] as the string."""
    body = {"prompt": prompt, "max_tokens": M, "stream": True, "return_token_ids": True}
    out: list = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def check(target: str, prompt: str, events: list) -> None:
    want = oracle(target, list(prompt.encode()), M)
    assert len(want) >= 2
    assert events[-1] == "[DONE]"
    ids = [e["choices"][0]["token_ids"] for e in events[:-1]]
    assert [t for part in ids for t in part] == want  # the whole answer, token-exactly
    assert len(ids[0]) == 1, f"the first chunk holds {len(ids[0])} tokens: {ids[0]}"
    assert len(events) >= 3  # the first token, the rest (one chunk or more), [DONE]


@pytest.mark.parametrize("target,flags", [("toy-paged", ()), ("toy-paged", ("--frontend-process",)),
                                          ("toy-paged", ("--frontends", "2")), ("toy-spec", ())],
                         ids=["in-process", "frontend-process", "frontends-2", "spec"])
def test_the_first_token_has_a_chunk_of_its_own(kern_server, target, flags):
    server = kern_server(target, *flags)
    prompts = PROMPTS * 3
    with ThreadPoolExecutor(len(prompts)) as pool:
        burst = list(pool.map(lambda p: chunks(server.url, p), prompts))
    for prompt, events in zip(prompts, burst):
        check(target, prompt, events)
    for prompt in PROMPTS[:6]:
        check(target, prompt, chunks(server.url, prompt))

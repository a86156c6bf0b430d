"""Session blocks: block content that a prefix cache must tell apart by where it sits (issue 39).

- `blocks_moved`: equal block-aligned segments at different positions, within a prompt (A·A) and
  across prompts (A·C, then C·A, X·A·C, C·C·A), and the true prefix A·C again;
- `blocks_reparented`: the same block content at the same position after a different prefix,
  reached through cached blocks: X·S, then Y·X (Y cached), then Y·S (Y hits; S sits where X·S had
  it, after another parent), three rounds of fresh segments, and Y·S again;
- `block_edges`: prompts of k·B-1, k·B and k·B+1 tokens of one stem (B the engine's block, k 1-3),
  each sent twice and then with a fresh tail; on a paged target the repeat's hit is exactly the
  whole blocks below its last token, (n - 1) // B · B (a hit covering the last token of a prompt
  that fills its blocks, vLLM #11186, claims n);
- `stop_after_hit` (engines with `params`): a request ended by a stop string, then the same prompt
  plain, with the stop again, and as a next turn on the stopped answer (vLLM #5543: greedy answers
  changed after a warm-up that ended on a stop string and a later request that read the prefix cache).

Each check: every answer identical to the reference, every hit within what could have been cached
(`e2e/scenarios/wild.py`), and with ``cached-tokens`` at least one hit.
"""

from __future__ import annotations

import random

from e2e.client import Answer
from e2e.scenarios.wild import Judge, block, draw, segment
from kern.tokens import EOS
from verdicts.params import continuation, expect, text_of

__all__ = ["edges", "moved", "reparented", "stop_hit"]

M = 16  # answer tokens: the workloads are about what is read, not how long it runs
ROUNDS = 3


def _m(r) -> int:
    return min(r.m, M)


def _rng(r, what: str) -> random.Random:
    return random.Random(f"blocks-{what}-{r.opts.seed}")


def _hit_seen(j: Judge) -> tuple[bool, str]:
    if j.r.opts.engine.has("cached-tokens") and not any(j.hits):
        return False, "no request was served from the cache: the workload never reached it"
    return True, ""


def moved(r) -> None:
    b, m = block(r), _m(r)
    n = segment(b)
    rng = _rng(r, "moved")
    a, c, x = draw(rng, n), draw(rng, n), draw(rng, n)
    j = Judge(r, "blocks_moved")
    for label, head in (("A.C", a + c), ("C.A", c + a), ("A.A", a + a), ("X.A.C", x + a + c),
                        ("C.C.A", c + c + a), ("A.C again", a + c)):
        ids = head + draw(rng, rng.randint(1, b))
        got = j.serial(label, ids, m)
    j.serial("A.C's next turn + C.A", ids + got.fed + c + a, m)  # a lined cache hits only where a sequence ended
    j.add(*_hit_seen(j))


def reparented(r) -> None:
    b, m = block(r), _m(r)
    n = segment(b)
    rng = _rng(r, "reparented")
    j = Judge(r, "blocks_reparented")
    last = []
    for k in range(ROUNDS):
        x, y, s = draw(rng, n), draw(rng, n), draw(rng, n)
        j.serial(f"round {k + 1} X.S", x + s + draw(rng, rng.randint(1, b)), m)
        j.serial(f"round {k + 1} Y.X", y + x + draw(rng, rng.randint(1, b)), m)
        last = y + s + draw(rng, rng.randint(1, b))
        j.serial(f"round {k + 1} Y.S", last, m)
    got = j.serial("Y.S again", last, m)
    j.serial("Y.S's next turn + X", last + got.fed + x, m)
    j.add(*_hit_seen(j))


def edges(r) -> None:
    b, m = block(r), _m(r)
    rng = _rng(r, "edges")
    stem = draw(rng, 3 * b + 1)
    j = Judge(r, "block_edges")
    exact = r.opts.engine.has("cached-tokens") and not r.stateful
    wrong = []
    for k in (1, 2, 3):
        for n in (k * b - 1, k * b, k * b + 1):
            if n < 1 or (b == 1 and n < 2):
                continue
            j.serial(f"{n} tokens", stem[:n], m)
            again = j.serial(f"{n} tokens again", stem[:n], m)
            want = (n - 1) // b * b
            if exact and again.cached != want:
                wrong.append(f"{n} tokens again: cached_tokens {again.cached} (want {want}: the whole blocks below "
                             "its last token)")
            j.serial(f"{n} tokens + a fresh tail", stem[:n] + draw(rng, rng.randint(1, b)), m)
    j.serial(f"{n} tokens' next turn", stem[:n] + again.fed + stem[:b], m)
    ok, note = _hit_seen(j)
    j.add(ok and not wrong, "; ".join([*wrong[:4], note] if note else wrong[:4]))


def stop_hit(r) -> None:
    """A warm-up that ends on a stop string, then requests that read its prefix from the cache."""
    m = max(_m(r), 24)
    rng = _rng(r, "stop")
    j = Judge(r, "stop_after_hit")
    wrong, stopped = [], 0
    for k in range(ROUNDS):
        p = draw(rng, rng.randint(2 * block(r), 3 * block(r) + 8))
        plain = continuation(r.oracle, r.rows, p, m, EOS, False)
        text = text_of(plain)
        if len(text) < 6:
            continue
        i = rng.randrange(2, len(text) - 3)
        stop = text[i:i + rng.randint(1, 3)]
        want = expect(plain, m, EOS, stop=(stop,))
        for label in (f"prompt {k + 1} stopped", f"prompt {k + 1} stopped again"):
            limit, stopped = j.bound(p), stopped + 1
            got = _stopped(r, p, m, stop)
            if r.opts.engine.has("cached-tokens") and got["cached"] > limit:
                j.over.append(f"{label}: cached_tokens {got['cached']} > {limit}, the most it shares with anything "
                              "sent")
            if (got["ids"], got["finish"]) != (want.token_ids, want.finish):
                wrong.append(f"{label} (stop {stop!r}): ids {got['ids']} finish {got['finish']} "
                             f"(want {want.token_ids} {want.finish})")
            j.seen.append(p + got["ids"])
        j.serial(f"prompt {k + 1} plain after the stop", p, m)
        j.serial(f"prompt {k + 1} next turn on the stopped answer", p + want.token_ids + draw(rng, 4), m)
    ok, note = _hit_seen(j)
    told = f"stopped {stopped - len(wrong)}/{stopped} as the rule says"
    j.add(ok and not wrong, "; ".join([told, *wrong[:3], *([note] if note else [])]))


def _stopped(r, prompt: list[int], m: int, stop: str) -> dict:
    body = {"model": r.target.model, "prompt": prompt, "max_tokens": m, "temperature": 0, "return_token_ids": True,
            "stop": [stop]}
    live = r.need_any()
    data, mirrored = live.client.request(body)
    choice = (data.get("choices") or [{}])[0]
    ids, finish = list(choice.get("token_ids") or []), choice.get("finish_reason")
    usage, k = data.get("usage") or {}, data.get("kern") or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if live.policy is not None and live.policy.active:  # kern's policy oracle: a string's stop retires as a length
        a = Answer(ids, None, prompt, cached, finish, k.get("request_id") or mirrored, k.get("cache_tier"),
                   k.get("snapshot"), data, k.get("woken"))
        r.snapshots[a.request] = a.snapshot
        early = finish == "stop" and choice.get("stop_reason") is not None
        live.policy.expect("stop string", prompt, len(ids) if early else m, a)
    return {"ids": ids, "finish": finish, "cached": cached}

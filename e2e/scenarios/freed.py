"""Session freed: a cached block freed while requests still read it, then taken by another request
(issue 39: a refcount forced to zero, atlas#373; a block freed on one reader's end).

`freed_while_read`, on a cache sized so that it is exactly full (`cache`), in rounds until `ROUNDS` of them exercised the order (at most `MAX_ROUNDS`):

1. a warm prompt of w blocks and a token is answered: its w whole blocks, W, are cached;
2. `READERS` readers of W (W and one more token, the same prompt, streamed, `READ_TOKENS` answer
   tokens: a suffix whose reference answer runs them all is searched for) are sent at once; the gate
   waits for each one's first chunk (each is running, holding W);
3. a short reader S of W (one token) is answered: its end drops one reference from W, which the
   long readers still hold;
4. U, an unrelated prompt that asks exactly the blocks an engine could give it if S's end had freed
   W outright (S's tail, W, and the tails of the readers the gate saw end), is answered.

An engine that reserves every block of a request when it admits it holds, while the readers run, all
the cache but S's tail (and ended readers' tails); U must wait for the readers to end. One that freed
W on S's end admits U at once, and U's prompt is written over W while the readers still read it:
their answers change. Every answer (the readers', S's, U's) is held to the reference, every hit within
what could have been cached (`e2e/scenarios/wild.py`). The note gives, per round, how many readers
were still streaming when U was sent: a round where none was did not exercise the order, and a check
whose rounds all did not is reported, not passed. An engine that allocates as it decodes (vLLM) is
held to the same answers; for it the sizing is only a tight cache.
"""

from __future__ import annotations

import random
import threading
import time

from e2e.client import Answer
from e2e.scenarios.stream import streamed
from e2e.scenarios.wild import Judge, block, draw

__all__ = ["cache", "flags", "run"]

W_BLOCKS = 2
READERS = 16
READ_TOKENS = 200  # long enough that the readers outlast two of the gate's round trips many times over
ROUNDS = 2  # rounds that exercised the order (a reader still streaming when U was sent) ...
MAX_ROUNDS = 4  # ... out of at most this many
SEARCH = 48  # suffixes tried for a reader whose reference answer runs all READ_TOKENS
WAIT_S = 60.0


def _tail(b: int) -> int:
    """Each reader's tail in blocks of `b` beyond W: its one more token and `READ_TOKENS`."""
    return -(-(W_BLOCKS * b + 1 + READ_TOKENS) // b) - W_BLOCKS


def cache(r) -> int:
    """W, every reader's tail and S's one block: the whole cache, in tokens (blocks of the first
    session's page, as the session opens: `block` once it runs)."""
    b = r.page
    t = _tail(b)
    return (W_BLOCKS + READERS * t + 1) * b


def flags(r) -> list[str]:
    """No host tier: a block evicted or taken is gone, not parked."""
    return ["--host-gib", "0"]


def _reader(r, rng: random.Random, w: list[int], m: int) -> tuple[list[int], int]:
    """W and one token whose reference answer runs all `m` tokens (no stop before), else the longest
    found; (the prompt, its reference length)."""
    best: tuple[list[int], int] = ([], -1)
    for _ in range(SEARCH):
        ids = w + draw(rng, 1)
        n = len(r.oracle.run(ids, m, r.rows))
        if n > best[1]:
            best = (ids, n)
        if n == m:
            break
    return best


class _Streams:
    """The readers, each streamed on its own thread: its first chunk and its end are seen."""

    def __init__(self, client, model: str, prompt: list[int], m: int, n: int):
        self.first = [threading.Event() for _ in range(n)]
        self.ended = [threading.Event() for _ in range(n)]
        self.got: list[tuple[dict, str] | BaseException | None] = [None] * n
        body = {"model": model, "prompt": prompt, "max_tokens": m, "temperature": 0, "return_token_ids": True,
                "stream": True}

        def one(i: int) -> None:
            try:
                self.got[i] = client.request(dict(body), first=self.first[i])
            except BaseException as exc:  # judged per reader
                self.got[i] = exc
            finally:
                self.first[i].set()
                self.ended[i].set()

        self.threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
        for th in self.threads:
            th.start()

    def wait_first(self) -> bool:
        deadline = time.monotonic() + WAIT_S
        for ev in self.first:
            if not ev.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def running(self) -> int:
        return sum(not e.is_set() for e in self.ended)

    def join(self) -> None:
        for th in self.threads:
            th.join()


def _answer(data: dict, name: str, prompt: list[int]) -> Answer:
    ids, finish = streamed(data)
    stop = ids.pop() if finish == "stop" and ids else None
    details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
    return Answer(ids, stop, prompt, int(details.get("cached_tokens") or 0), finish, name, raw=data)


def _round(r, j: Judge, k: int, rng: random.Random) -> tuple[int, str]:
    """One round; (the readers still streaming when U was sent, what the round saw)."""
    b = block(r)
    t, m = _tail(b), READ_TOKENS
    warm = draw(rng, W_BLOCKS * b + 1)
    j.serial(f"round {k}: the warm prompt", warm, 1)
    w = warm[:W_BLOCKS * b]
    prompt, length = _reader(r, rng, w, m)
    r.oracle.prefetch(prompt, m, r.rows)
    limit = j.bound(prompt)
    live = r.need_any()
    streams = _Streams(live.client, r.target.model, prompt, m, READERS)
    if not streams.wait_first():
        j.errors.append(f"round {k}: not every reader sent a first chunk within {WAIT_S:.0f} s")
    s_ids = w + [(prompt[-1] + 1) % 256]
    j.serial(f"round {k}: the short reader", s_ids, 1)
    alive = streams.running()
    ended = READERS - alive
    # all ended: nothing to expose, and the cache less a reader's tail keeps U within what one request may hold
    # (and within the engine's longest request: vLLM's --max-model-len)
    room = int((r.facts.get("freed") or {}).get("max_request_tokens") or 1 << 30)
    u_ids = draw(rng, min((W_BLOCKS + 1 + min(ended, READERS - 1) * t) * b - 1, room - 1))
    j.serial(f"round {k}: the unrelated prompt ({len(u_ids)} tokens)", u_ids, 1)
    streams.join()
    for i, got in enumerate(streams.got):
        if not isinstance(got, tuple):
            j.errors.append(f"round {k} reader {i + 1}: {type(got).__name__}: {got}")
            continue
        data, name = got
        j.judge(f"round {k} reader {i + 1} (request {name})", prompt, m, _answer(data, name, prompt), limit)
    j.seen.append(prompt + r.oracle.run(prompt, m, r.rows))
    return alive, (f"round {k}: {alive} of {READERS} readers streaming when U was sent ({ended} ended before; "
            f"reference answer {length}/{m} tokens)")


def run(r) -> None:
    r.serial_ends("freed_while_read (readers run beside a short reader and an unrelated prompt)")
    rng = random.Random(f"freed-{r.opts.seed}")
    j = Judge(r, "freed_while_read")
    rounds: list[tuple[int, str]] = []
    while len(rounds) < MAX_ROUNDS and sum(alive > 0 for alive, _ in rounds) < ROUNDS:
        rounds.append(_round(r, j, len(rounds) + 1, rng))
    notes = "; ".join(note for _, note in rounds)
    if j.ok() and not any(alive for alive, _ in rounds):
        r.checks.add("freed_while_read", None, f"not judged: no round had a reader still streaming when U was "
                     f"sent (the order was never exercised); {j.note()}; {notes}")
        return
    j.add(True, notes)

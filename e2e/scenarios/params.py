"""params: the request parameters a client sends, each answer predicted exactly (verdicts/params.py).

Session `params` (default flags). For each of a few prompts the server first answers plainly (gated
identical to the reference, near-ties excused on float targets); that answer, the model's own
continuation, is what the parameters then act on, by the documented rule:

- `params_stop`: `stop` strings of random lengths 1-64 cut from random places of the answer's text,
  several at once (the first completed wins), some that never match, `include_stop_str_in_output`,
  streamed and not, completions and chat;
- `params_ids`: `stop_token_ids` (a token of the answer, EOS with `ignore_eos`), EOS exactly at the
  last allowed token (and one token short of it: length), `min_tokens` 0 accepted and a drawn
  1..96 refused with a 400 naming it, `ignore_eos` running past EOS to `max_tokens` (exact targets);
- `params_prompt`: `echo` (the prompt's text leads, streamed in the first chunk) and
  `truncate_prompt_tokens` (the prompt's last k tokens served, its answer the reference's for them;
  with `echo`, the served prompt's text leads).

Every response is compared whole: token ids, text, finish_reason, stop_reason, usage,
prompt_token_ids (the prompt served); a stream's chunks must concatenate to it and end with
``[DONE]``. The choices are drawn from a PRNG seeded by the gate's `--seed` and the target's name
(printed in the notes), so `--seed` replays them. The requests are serial: the policy oracle
predicts each (an answer a stop ended at token L as one of max_tokens L; an `ignore_eos` answer on
its path past EOS, a token a step, except on a target of speculative rounds, where exact predictions
end there).
"""

from __future__ import annotations

import random
from typing import Any

from e2e.client import Answer, Rejected
from e2e.prompts import PROMPTS
from kern.tokens import EOS
from verdicts import Same
from verdicts.params import RULES, Expected, Rules, continuation, decoded_path, expect, text_of

TOKENS = 96  # answer tokens asked: long enough for stop strings of up to 64 characters
PROMPTS_USED = 4


def seed_of(r) -> str:
    return f"{getattr(r.opts, 'seed', 0)}:{r.target.model}:params"  # a staged target draws as its single process


def rules_of(r) -> Rules:
    """The parameter rules of the engine a run gates (its ``facts.params``; kern's for our own)."""
    engine = getattr(r.opts, "engine", None)
    return RULES[engine.params_rules if engine is not None else "kern"]


def eos_of(r) -> int:
    """The EOS of the target's reference model (the toy's when it names none)."""
    return int(r.oracle.eos if r.oracle.eos is not None else EOS)


class Judge:
    """One check's tally: each response against its expectation."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.n = 0
        self.problems: list[str] = []

    def note(self, label: str, problem: str) -> None:
        self.problems.append(f"{label}: {problem}")

    def verdict(self, seed: str) -> tuple[bool, str]:
        head = f"{self.n - len(self.problems)}/{self.n} exact (seed {seed!r})"
        return not self.problems, head + ("; " + "; ".join(self.problems[:5]) if self.problems else "")


def shape(data: dict[str, Any], chat: bool, prompt_top: bool = False) -> dict[str, Any]:
    """What a response says, whole or as its stream's chunks joined; `prompt_top`: a chat answer's
    prompt_token_ids are on the response (a stream's chunk), not its choice (vLLM's rule)."""
    key = "message" if chat else None
    top = chat and prompt_top
    if "chunks" in data:
        chunks = data["chunks"]
        choices = [c["choices"][0] for c in chunks if c.get("choices")]
        text = "".join((c.get("delta") or {}).get("content") or "" if chat else c.get("text") or "" for c in choices)
        ids = [t for c in choices for t in (c.get("token_ids") or [])]
        last = choices[-1] if choices else {}
        prompt = next((c["prompt_token_ids"] for c in (chunks if top else choices) if c.get("prompt_token_ids") is not None), None)
        return {"ids": ids, "text": text, "finish": last.get("finish_reason"), "reason": last.get("stop_reason"),
                "usage": data.get("usage") or {}, "done": data.get("done"), "prompt": prompt}
    c = data["choices"][0]
    text = c["message"]["content"] if key else c.get("text")
    return {"ids": c.get("token_ids"), "text": text, "finish": c.get("finish_reason"), "reason": c.get("stop_reason"),
            "usage": data.get("usage") or {}, "done": True, "prompt": (data if top else c).get("prompt_token_ids")}


def compare(got: dict[str, Any], want: Expected, served: list[int]) -> str | None:
    """What differs between a response's shape and its expectation (None: nothing); `served` is the
    prompt served (after truncation), which `prompt_token_ids` and usage must name."""
    prompt_tokens = len(served)
    diffs = []
    if got["ids"] != want.token_ids:
        diffs.append(f"token_ids {len(got['ids'] or [])} tokens, want {len(want.token_ids)}"
                     + ("" if got["ids"] is None else f" (first difference at {_first(got['ids'], want.token_ids)})"))
    if got["text"] != want.text:
        diffs.append(f"text {got['text']!r:.80} want {want.text!r:.80}")
    if (got["finish"], got["reason"]) != (want.finish, want.stop_reason):
        diffs.append(f"finish/stop_reason {got['finish']}/{got['reason']!r}, want {want.finish}/{want.stop_reason!r}")
    u = got["usage"]
    if (u.get("prompt_tokens"), u.get("completion_tokens")) != (prompt_tokens, want.completion_tokens):
        diffs.append(f"usage {u.get('prompt_tokens')}/{u.get('completion_tokens')}, want "
                     f"{prompt_tokens}/{want.completion_tokens}")
    if got["prompt"] != served:
        diffs.append(f"prompt_token_ids {len(got['prompt'] or [])} tokens, want the {prompt_tokens} served")
    if not got["done"]:
        diffs.append("the stream did not end with [DONE]")
    return "; ".join(diffs) or None


def _first(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def stops_from(rng: random.Random, text: str) -> list[str]:
    """1-3 stop strings: most cut from `text` (length 1-64, anywhere), some that it never holds."""
    out = []
    for _ in range(rng.randint(1, 3)):
        if text and rng.random() < 0.75:
            n = rng.randint(1, min(64, len(text)))
            i = rng.randrange(len(text) - n + 1)
            out.append(text[i:i + n])
        else:
            s = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 64)))
            out.append(s if s not in text else "\x00" + s)
    return out


class Params:
    def __init__(self, r) -> None:
        self.r = r
        self.live = r.need("params")
        self.rng = random.Random(seed_of(r))
        self.eos = eos_of(r)
        self.plain = Same(r.oracle, r.rows)
        self.rules = rules_of(r)

    def body(self, prompt: list[int], max_tokens: int, chat: bool = False, **fields) -> dict[str, Any]:
        b: dict[str, Any] = {"model": self.r.target.model, "max_tokens": max_tokens, "temperature": 0,
                             "return_token_ids": True, **fields}
        if chat:
            b["messages"] = [{"role": "user", "content": text_of(prompt)}]
        else:
            b["prompt"] = prompt
        return b

    def continuation(self, prompt: list[int]) -> list[int]:
        """The server's plain answer (gated against the reference), EOS appended when it ended so."""
        a = self.r.answer(prompt, TOKENS)
        self.plain.add(f"plain {len(prompt)}-token prompt", prompt, a.ids, self.r.oracle.run(prompt, TOKENS, self.r.rows))
        return a.ids + ([self.eos] if a.finish == "stop" and a.stop == self.eos else [])

    def send(self, judge: Judge, label: str, body: dict[str, Any], served: list[int], want: Expected,
             chat: bool = False, walk: dict | None = None) -> None:
        path = "/v1/chat/completions" if chat else "/v1/completions"
        judge.n += 1
        try:
            data, mirrored = self.live.client.request(body, path)
        except Rejected as exc:
            judge.note(label, f"refused: {exc}")
            return
        got = shape(data, chat, self.rules.chat_prompt_top)
        problem = compare(got, want, served)
        if problem:
            judge.note(label, problem)
        self.predict(label, served, body, data, mirrored, got, walk)

    def predict(self, label: str, served: list[int], body: dict[str, Any], data: dict[str, Any], mirrored: str,
                got: dict[str, Any], walk: dict | None = None) -> None:
        """The policy oracle's turn: a stop string or id ending the answer at token L retires it as a
        length of L would (the same steps, the same folded tokens); an answer past EOS on `walk` (its path)."""
        policy = self.live.policy
        if policy is None or not policy.active:
            return
        ids = list(got["ids"] or [])
        stopped_early = got["finish"] == "stop" and got["reason"] is not None
        m = len(ids) if stopped_early else int(body["max_tokens"])
        usage = data.get("usage") or {}
        k = data.get("kern") or {}
        a = Answer(ids, None, served, int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
                   got["finish"], k.get("request_id") or mirrored, k.get("cache_tier"), k.get("snapshot"), data,
                   k.get("woken"))
        self.r.snapshots[a.request] = a.snapshot
        policy.expect(label, served, m, a, walk)


def run(r) -> None:
    p = Params(r)
    stop, ids, prompt = Judge("params_stop"), Judge("params_ids"), Judge("params_prompt")
    conts = []
    for i in range(PROMPTS_USED):
        served = list(PROMPTS[(i * 5 + 4) % len(PROMPTS)].encode())
        conts.append((served, p.continuation(served)))
    _stop_strings(p, stop, conts)
    ended = _stop_ids(p, ids, conts)
    _echo_and_truncation(p, prompt, conts)
    if r.oracle.exact and ended:
        _ignore_eos(r, p, ids, ended)
    seed = seed_of(r)
    for judge in (stop, ids, prompt):
        ok, note = judge.verdict(seed)
        if judge is stop:
            ok, note = ok and p.plain.ok, note + f"; plain answers {p.plain}"
        r.checks.add(judge.name, ok, note, p.plain.excused if judge is stop else 0)


def _stop_strings(p, stop, conts) -> None:
    """Stop strings: streamed and not, completions and chat, with and without the string kept."""
    rng = p.rng
    for j in range(8):
        served, cont = conts[j % len(conts)]
        strings = stops_from(rng, text_of(cont))
        include = rng.random() < 0.3
        stream, chat = j % 2 == 1, j % 4 >= 2
        want = expect(cont, TOKENS, p.eos, stop=tuple(strings), include=include, rules=p.rules)
        body = p.body(served, TOKENS, chat, stop=strings, include_stop_str_in_output=include, stream=stream)
        p.send(stop, f"stop {[len(s) for s in strings]}{' kept' if include else ''}{' streamed' if stream else ''}"
               f"{' chat' if chat else ''}", body, served, want, chat)


def _stop_ids(p, ids, conts) -> list:
    """Stop token ids (kept in the text or not), EOS at the last allowed token and one short of it,
    min_tokens 0 served and more refused by name; the conversations whose answer ended on EOS."""
    rng = p.rng
    for j in range(3):
        served, cont = conts[j]
        body_cont = [t for t in cont if t != p.eos]
        t = body_cont[rng.randrange(len(body_cont))]
        include = j == 1
        want = expect(cont, TOKENS, p.eos, stop_ids=(t,), include=include, rules=p.rules)
        p.send(ids, f"stop_token_ids [{t}]", p.body(served, TOKENS, stop_token_ids=[t], include_stop_str_in_output=include,
                                                     stream=j == 2), served, want)
    ended = [(s, c) for s, c in conts if c and c[-1] == p.eos]
    for served, cont in ended[:1]:
        for m in (len(cont), len(cont) - 1):
            p.send(ids, f"max_tokens {m} (EOS at {len(cont)})", p.body(served, m), served,
                   expect(cont, m, p.eos, rules=p.rules))
    served, cont = conts[0]
    p.send(ids, "min_tokens 0", p.body(served, TOKENS, min_tokens=0), served, expect(cont, TOKENS, p.eos, rules=p.rules))
    if p.rules.min_tokens:
        _min_tokens_honoured(p, ids, ended or conts[:1])
        return ended
    # min_tokens: 0 is the default; any more is refused (docs/api.md), a clear 400 naming it
    m, chat, stream = rng.randint(1, TOKENS), rng.random() < 0.5, rng.random() < 0.5
    label = f"min_tokens {m}{' chat' if chat else ''}{' streamed' if stream else ''}"
    ids.n += 1
    try:
        p.live.client.request(p.body(served, TOKENS, chat, min_tokens=m, stream=stream),
                              "/v1/chat/completions" if chat else "/v1/completions")
        ids.note(label, "served, not refused")
    except Rejected as exc:
        err = (exc.body or {}).get("error") if isinstance(exc.body, dict) else None
        err = err if isinstance(err, dict) else {}
        if exc.status != 400 or err.get("param") != "min_tokens" or "min_tokens" not in str(err.get("message")):
            ids.note(label, f"refused as {exc.status} naming {err.get('param')!r} ({str(err.get('message'))[:60]!r}), "
                            "not 400 naming min_tokens")
    return ended


def _min_tokens_honoured(p, ids, convs) -> None:
    """min_tokens where the engine honours it (vLLM): EOS masked until that many tokens are out, the
    model's runner-up in its place (the reference's `eos_masked`), and a stop string counted only when
    it completes after them. Asked of the first conversation whose plain answer ended on EOS, past that
    EOS (else of one that ran to TOKENS: nothing to mask, the answer the plain one): plain, streamed and
    with stop strings cut from the masked answer's text (some complete before min_tokens)."""
    masked_of = p.r.oracle.eos_masked
    label = "min_tokens"
    if masked_of is None:
        ids.n += 1
        ids.note(label, f"the engine honours min_tokens ({p.rules.name} rules) but the reference has no "
                        "eos_masked(ids, manifest) to say what the model emits with EOS masked")
        return
    rng = p.rng
    served, cont = convs[0]
    for j in range(3):
        m = rng.randint(min(len(cont), TOKENS), TOKENS)  # past the plain answer's EOS
        run_on = continuation(p.r.oracle, p.r.rows, served, TOKENS, p.eos, False, masked=(m, masked_of))
        strings = tuple(stops_from(rng, text_of(run_on[:m + 8]))) if j == 2 else ()
        want = expect(run_on, TOKENS, p.eos, stop=strings, rules=p.rules, min_tokens=m)
        p.send(ids, f"min_tokens {m} ({f'EOS at {len(cont)}' if cont[-1] == p.eos else 'no EOS'})"
               f"{' streamed' if j == 1 else ''}"
               f"{f' stop {[len(s) for s in strings]}' if strings else ''}",
               p.body(served, TOKENS, min_tokens=m, stream=j == 1, **({"stop": list(strings)} if strings else {})),
               served, want)


def _echo_and_truncation(p, prompt, conts) -> None:
    rng = p.rng
    for j in range(2):
        served, cont = conts[j]
        want = expect(cont, TOKENS, p.eos, echo=text_of(served) if p.rules.echo_text else "", rules=p.rules)
        p.send(prompt, f"echo{' streamed' if j else ''}", p.body(served, TOKENS, echo=True, stream=j == 1),
               served, want)
    for j in range(2):
        full, _ = conts[j + 2]
        k = rng.randint(1, len(full) - 1)
        served = full[-k:]
        cont = p.continuation(served)
        p.send(prompt, f"truncate_prompt_tokens {k}", p.body(full, TOKENS, truncate_prompt_tokens=k), served,
               expect(cont, TOKENS, p.eos, rules=p.rules))
        if j == 1:  # echo after truncation: the text of the prompt served leads (docs/api.md), streamed
            p.send(prompt, f"echo, truncate_prompt_tokens {k}, streamed",
                   p.body(full, TOKENS, truncate_prompt_tokens=k, echo=True, stream=True), served,
                   expect(cont, TOKENS, p.eos, echo=text_of(served) if p.rules.echo_text else "", rules=p.rules))


def _ignore_eos(r, p, ids, ended) -> None:
    """ignore_eos: past EOS to max_tokens (the reference continues after it). The policy follows the
    answer a token a step (verdicts.params.decoded_path); a target of speculative rounds, whose counts
    are the model's, ends its exact predictions here."""
    policy = p.live.policy
    if policy is not None and policy.active:
        policy.compare("the requests before ignore_eos", p.live.client.stats())
    if r.rows != 1:
        r.serial_ends(f"ignore_eos answers run past EOS in rounds of up to {r.rows} tokens (counts not modelled)")
    served, _ = ended[0]
    run_on = continuation(r.oracle, r.rows, served, TOKENS, p.eos, ignore_eos=True)
    emits = policy.policy.emits if policy is not None and policy.active else True
    p.send(ids, "ignore_eos", p.body(served, TOKENS, ignore_eos=True), served,
           expect(run_on, TOKENS, p.eos, ignore_eos=True, rules=p.rules), walk=decoded_path(len(served), run_on[:TOKENS], emits))
    p.send(ids, "ignore_eos, stop_token_ids [EOS]", p.body(served, TOKENS, ignore_eos=True, stop_token_ids=[p.eos]),
           served, expect(run_on, TOKENS, p.eos, stop_ids=(p.eos,), ignore_eos=True, rules=p.rules))
    if policy is not None and policy.active:
        policy.compare("the ignore_eos requests", p.live.client.stats())

"""What a completion with request parameters must answer, from the model's own continuation and the
documented rules (docs/api.md), written independently of the server's code.

`expect` takes the continuation the model emits (every token, EOS included where ``ignore_eos``
lets the answer run past it) and applies, token by token:

- EOS (unless ``ignore_eos``) ends the answer: finish ``stop``, ``stop_reason`` None, EOS in the ids;
- a stop token id ends it at that token: finish ``stop``, ``stop_reason`` the id, the id in the ids,
  its text left out unless ``include_stop_str_in_output``;
- a stop string ends it at the token after which the text decoded so far (complete UTF-8 characters)
  first holds one of the strings, the first of them in the order given: ``stop_reason`` the string,
  the text cut before it (after it with ``include_stop_str_in_output``);
- ``max_tokens`` tokens end it: finish ``length``;
- an answer that ends otherwise than by a string has its text's last partial character flushed (as
  U+FFFD) and matched against the strings too.

The text is the answer's byte tokens (ids below 256) decoded as UTF-8 with replacement; ``echo``
puts the prompt's text first.

`decoded_path` is the policy oracle's side of an answer the model's own path (`toy.model.path`) does
not give: one that ran past EOS to ``max_tokens`` (``ignore_eos``), decoded one token a step. No I/O,
nothing of the project imported.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from kern.tokens import BYTES

from .same import Oracle

__all__ = ["Expected", "continuation", "decoded_path", "expect", "text_of"]


def text_of(ids: list[int]) -> str:
    """Byte tokens as text (UTF-8, replacement characters for bad bytes); EOS and ids >= BYTES have none."""
    return bytes(t for t in ids if 0 <= t < BYTES).decode("utf-8", "replace")


@dataclass(frozen=True)
class Expected:
    token_ids: list[int]
    text: str
    finish: str
    stop_reason: str | int | None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


def _first_string(text: str, stops: tuple[str, ...]) -> tuple[str, int] | None:
    for s in stops:
        i = text.find(s)
        if i >= 0:
            return s, i
    return None


def expect(emitted: list[int], max_tokens: int, eos: int, stop: tuple[str, ...] = (), stop_ids: tuple[int, ...] = (),
           include: bool = False, ignore_eos: bool = False, echo: str = "") -> Expected:
    """The answer to a request whose model continuation is `emitted` (at least as long as the answer
    can run: up to `max_tokens`, or to its first EOS when EOS ends it)."""
    ids: list[int] = []
    finish, reason, cut = "length", None, None  # cut: (string, where) when a string ended it
    hide = False
    for t in emitted[:max_tokens]:
        ids.append(t)
        if t == eos and not ignore_eos:
            finish = "stop"
            break
        if t in stop_ids:
            finish, reason, hide = "stop", t, not include
            break
        if stop:
            text = codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(x for x in ids if x < BYTES))
            found = _first_string(text, stop)
            if found is not None:
                finish, reason, cut = "stop", found[0], found
                break
    shown = ids[:-1] if hide else ids
    text = text_of(shown)
    if cut is None and stop:
        found = _first_string(text, stop)  # the flushed last character completes a string
        if found is not None:
            finish, reason, cut = "stop", found[0], found
    if cut is not None:
        s, i = cut
        text = text[:i + len(s)] if include else text[:i]
    if len(emitted) < len(ids) or (len(ids) < max_tokens and finish == "length"):
        raise ValueError(f"the continuation ({len(emitted)} tokens) is shorter than the answer can run")
    return Expected(ids, echo + text, finish, reason)


def decoded_path(prompt_len: int, answer: list[int], emits: bool) -> dict:
    """The path (as `toy.model.path` gives it) of an answer that ran to its `max_tokens` (its length),
    EOS or not, on a server that decodes one token a step: an emitting prefill takes the first token
    and each step one more; otherwise the prefill stops a token short and each step emits one."""
    if not answer:
        raise ValueError("an answer of no tokens has no path")
    first = 1 if emits else 0
    counts = [1] * (len(answer) - first)
    return {"answer": list(answer), "reason": "length", "first": first, "counts": counts,
            "fed": prompt_len - (0 if emits else 1) + len(counts)}


def continuation(oracle: Oracle, rows: int, served: list[int], m: int, eos: int, ignore_eos: bool) -> list[int]:
    """What the model emits after `served`, up to `m` tokens, from `oracle.run` (which stops before
    EOS): EOS appended where it ends the answer; with `ignore_eos`, run on past each EOS (the reference
    continues after it) up to `m`. The continuation `expect` takes."""
    out: list[int] = []
    while len(out) < m:
        more = oracle.run(served + out, m - len(out), rows)
        out += more
        if len(out) < m:
            out.append(eos)
            if not ignore_eos:
                break
    return out

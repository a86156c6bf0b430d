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

Where engines document other behaviour, `Rules` names it (`RULES`: ``kern``, the default, and
``vllm``, read from vLLM 0.32's detokenizer, scheduler and completion server):

- ``min_tokens``: kern refuses any but 0; vLLM honours it: EOS is masked in the logits until that many
  tokens are out (the caller gives the continuation with EOS masked: `continuation`'s ``masked``),
  and a stop string counts only when it completes after them;
- which stop string: kern's is the first of the strings, in the order given, that the text holds;
  vLLM's, of the strings completing in the text a token added, the one completing earliest (ties:
  the first given);
- ``held_text``: vLLM shows the text as its incremental detokenizer (the tokenizers library's
  ``DecodeStream``) has it: bytes whose decoding ends in U+FFFD, an incomplete or an invalid
  character, are held until a later token completes the text, and held ones are never flushed at
  the end; kern decodes each byte as it comes and flushes the last partial character as U+FFFD;
- ``echo_text``: kern puts the prompt's text first; vLLM, asked for ``return_token_ids``, puts none
  (the prompt is its ``prompt_token_ids``);
- ``chat_prompt_top``: kern gives a chat answer's ``prompt_token_ids`` in its choice, as a completion's;
  vLLM on the chat response itself (a stream: on its first chunk).

`decoded_path` is the policy oracle's side of an answer the model's own path (`toy.model.path`) does
not give: one that ran past EOS to ``max_tokens`` (``ignore_eos``), decoded one token a step. No I/O,
nothing of the project imported.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Callable

from kern.tokens import BYTES

from .same import Oracle

__all__ = ["RULES", "Expected", "Rules", "continuation", "decoded_path", "expect", "held", "text_of"]


def text_of(ids: list[int]) -> str:
    """Byte tokens as text (UTF-8, replacement characters for bad bytes); EOS and ids >= BYTES have none."""
    return bytes(t for t in ids if 0 <= t < BYTES).decode("utf-8", "replace")


@dataclass(frozen=True)
class Rules:
    """An engine's documented rules where engines differ (the module's docstring says each)."""

    name: str
    min_tokens: bool  # honoured (EOS masked, stop strings held off) rather than refused when above 0
    held_text: bool  # text as an incremental detokenizer holds it, rather than decoded byte by byte
    echo_text: bool  # echo's prompt text leads even with return_token_ids
    chat_prompt_top: bool = False  # a chat answer's prompt_token_ids on the response (each first chunk), not its choice


RULES: dict[str, Rules] = {
    "kern": Rules("kern", min_tokens=False, held_text=False, echo_text=True),
    "vllm": Rules("vllm", min_tokens=True, held_text=True, echo_text=False, chat_prompt_top=True),
}


def held(data: bytes) -> str:
    """The text a `DecodeStream` has shown after `data`: its longest prefix whose decoding does not end
    in U+FFFD (an incomplete or invalid character waits for the bytes after it)."""
    for n in range(len(data), -1, -1):
        text = data[:n].decode("utf-8", "replace")
        if not text.endswith("\ufffd"):
            return text
    return ""


@dataclass(frozen=True)
class Expected:
    token_ids: list[int]
    text: str
    finish: str
    stop_reason: str | int | None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


def _earliest_new(text: str, new_from: int, stops: tuple[str, ...]) -> tuple[str, int] | None:
    """vLLM's match: of the strings completing in ``text[new_from:]``, the one that completes earliest
    (ties: the first given), and where it starts."""
    best = None
    for s in stops:
        i = text.find(s, max(0, new_from - len(s) + 1))
        if i >= 0 and (best is None or i + len(s) < best[1] + len(best[0])):
            best = (s, i)
    return best


def _first_string(text: str, stops: tuple[str, ...]) -> tuple[str, int] | None:
    for s in stops:
        i = text.find(s)
        if i >= 0:
            return s, i
    return None


def expect(emitted: list[int], max_tokens: int, eos: int, stop: tuple[str, ...] = (), stop_ids: tuple[int, ...] = (),
           include: bool = False, ignore_eos: bool = False, echo: str = "", rules: Rules = RULES["kern"],
           min_tokens: int = 0) -> Expected:
    """The answer to a request whose model continuation is `emitted` (at least as long as the answer
    can run: up to `max_tokens`, or to its first EOS when EOS ends it; with `min_tokens`, the
    continuation with EOS masked until then) under `rules`."""
    if min_tokens and not rules.min_tokens:
        raise ValueError(f"min_tokens {min_tokens} is refused under the {rules.name} rules")
    ids: list[int] = []
    finish, reason, cut = "length", None, None  # cut: (string, where) when a string ended it
    hide = False
    before = 0  # the length of the text shown before this token (vLLM matches strings completing after it)
    for t in emitted[:max_tokens]:
        ids.append(t)
        if t == eos and not ignore_eos:
            if len(ids) <= min_tokens:
                raise ValueError(f"EOS at token {len(ids)}, under min_tokens {min_tokens}: not a masked continuation")
            finish = "stop"
            break
        if t in stop_ids:
            finish, reason, hide = "stop", t, not include
            break
        if stop:
            text = _shown(ids, rules)
            found = None
            if len(ids) > min_tokens:
                found = _earliest_new(text, before, stop) if rules.held_text else _first_string(text, stop)
            before = len(text)
            if found is not None:
                finish, reason, cut = "stop", found[0], found
                break
    shown = ids[:-1] if hide else ids
    text = held(bytes(t for t in shown if 0 <= t < BYTES)) if rules.held_text else text_of(shown)
    if cut is None and stop and not rules.held_text and len(ids) > min_tokens:
        found = _first_string(text, stop)  # the flushed last character completes a string
        if found is not None:
            finish, reason, cut = "stop", found[0], found
    if cut is not None:
        s, i = cut
        text = text[:i + len(s)] if include else text[:i]
    if len(emitted) < len(ids) or (len(ids) < max_tokens and finish == "length"):
        raise ValueError(f"the continuation ({len(emitted)} tokens) is shorter than the answer can run")
    return Expected(ids, echo + text, finish, reason)


def _shown(ids: list[int], rules: Rules) -> str:
    """The answer's text so far, as the stop strings are matched against it."""
    data = bytes(x for x in ids if 0 <= x < BYTES)
    if rules.held_text:
        return held(data)
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data)


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


def continuation(oracle: Oracle, rows: int, served: list[int], m: int, eos: int, ignore_eos: bool,
                 masked: tuple[int, Callable[[list[int]], int]] | None = None) -> list[int]:
    """What the model emits after `served`, up to `m` tokens, from `oracle.run` (which stops before
    EOS): EOS appended where it ends the answer; with `ignore_eos`, run on past each EOS (the reference
    continues after it) up to `m`; with ``masked=(k, eos_masked)``, EOS masked until k tokens are out,
    `eos_masked(context)` the token the model emits in its place. The continuation `expect` takes."""
    out: list[int] = []
    while len(out) < m:
        more = oracle.run(served + out, m - len(out), rows)
        out += more
        if len(out) < m:
            if masked is not None and len(out) < masked[0]:
                out.append(int(masked[1](served + out)))
                continue
            out.append(eos)
            if not ignore_eos:
                break
    return out

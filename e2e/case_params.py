"""A replayed request with parameters, judged on its own: what `e2e --replay-case` holds it to.

The params session (`e2e/scenarios/params.py`) predicts each response from the server's plain answer
it asked for first; a case may have lost that request while it shrank, so a replay predicts each
from the reference instead: the model's continuation of the prompt served (`toy/model.py` through
the gate's oracle, EOS appended where it ended the answer, run on past EOS with `ignore_eos`), then
the documented rule (`verdicts/params.py`). The response is compared whole, as the session does:
token ids, text, finish_reason, stop_reason, usage, a stream ending with ``[DONE]``.

Only an exact target's answers are predicted (a float target's may take a near-tie the reference
does not); a body with a field this module does not know is left unjudged (`None`), never guessed.
"""

from __future__ import annotations

from typing import Any

from e2e.oracle_seam import Oracle
from e2e.scenarios.params import compare, shape
from verdicts.params import RULES, Rules, continuation, expect, text_of

__all__ = ["JUDGED", "expected_for", "judge", "judged", "served_of"]

# the body fields a replay can predict an answer for (the params session sends no others)
JUDGED = {"model", "prompt", "messages", "max_tokens", "temperature", "return_token_ids", "stream", "stop",
          "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "echo",
          "truncate_prompt_tokens"}


def served_of(body: dict[str, Any]) -> list[int] | None:
    """The prompt tokens the server serves for `body` (docs/api.md: UTF-8 bytes, chat messages' text
    concatenated, `truncate_prompt_tokens` keeps the last k); None when it cannot be said."""
    if "messages" in body:
        msgs = body["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                 for m in msgs):
            return None
        ids = list("".join(m["content"] for m in msgs).encode())
    elif isinstance(body.get("prompt"), str):
        ids = list(body["prompt"].encode())
    elif isinstance(body.get("prompt"), list) and all(isinstance(t, int) for t in body["prompt"]):
        ids = list(body["prompt"])
    else:
        return None
    k = body.get("truncate_prompt_tokens")
    return ids[-int(k):] if k else ids


def judged(body: dict[str, Any]) -> bool:
    """Can a replay predict the answer to `body`?"""
    return bool(body.get("min_tokens")) or (served_of(body) is not None and not set(body) - JUDGED
                                            and isinstance(body.get("max_tokens"), int))


def expected_for(body: dict[str, Any], oracle: Oracle, rows: int, eos: int, rules: Rules = RULES["kern"]):
    """(served prompt, `Expected`) for `body` under the engine's `rules`, or None when it is not a body
    a replay predicts (min_tokens above 0 where the rules refuse it, or the oracle cannot mask EOS)."""
    k = int(body.get("min_tokens") or 0)
    masked_of = oracle.eos_masked if k else None  # read only where min_tokens asks it
    if not judged(body) or (k and (not rules.min_tokens or masked_of is None)):
        return None
    served = served_of(body)
    m, ignore = int(body["max_tokens"]), bool(body.get("ignore_eos"))
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    emitted = continuation(oracle, rows, served, m, eos, ignore, masked=(k, masked_of) if k else None)
    want = expect(emitted, m, eos, stop=stop, stop_ids=tuple(body.get("stop_token_ids") or ()),
                  include=bool(body.get("include_stop_str_in_output")), ignore_eos=ignore,
                  echo=text_of(served) if body.get("echo") and rules.echo_text else "", rules=rules, min_tokens=k)
    return served, want


def judge(body: dict[str, Any], path: str, outcome: dict[str, Any] | Exception, oracle: Oracle, rows: int,
          eos: int, rules: Rules = RULES["kern"]) -> str | None:
    """What is wrong with the server's `outcome` (a response, or the `Rejected` it raised) to `body`:
    a problem in words, or None when it is exactly what the engine's `rules` predict. Under kern's,
    `min_tokens` above 0 must be refused with a 400 naming it (docs/api.md)."""
    status = getattr(outcome, "status", None)
    if body.get("min_tokens") and not rules.min_tokens:
        body_ = getattr(outcome, "body", None)
        param = ((body_ or {}).get("error") or {}).get("param") if isinstance(body_, dict) else None
        if status == 400 and param == "min_tokens":
            return None
        if status is None:
            return "served, not refused"
        return f"refused as {status} naming {param!r}, not 400 naming min_tokens"
    if isinstance(outcome, Exception):
        return f"refused: {outcome}"
    made = expected_for(body, oracle, rows, eos, rules)
    if made is None:
        return None
    served, want = made
    return compare(shape(outcome, path.endswith("/chat/completions"), rules.chat_prompt_top), want, list(served))

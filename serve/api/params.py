"""The request parameter table (docs/api.md writes it out; `table_markdown` renders it): one row per
parameter of the OpenAI completions and chat schemas, vLLM's extras and ours, with its rule, the values
served and a probe the tests send; and the checks the rows name. serve/api/validate.py reads it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from kern.tokens import EOS
from serve.common.api_error import ApiError, is_int, type_error

__all__ = ["ACCEPTED", "BOTH", "CHAT", "CMPL", "GREEDY", "HONOURED", "PARAMS", "REFUSED", "SAMPLING_MODES", "Ctx",
           "Param", "table_markdown", "typed"]


# -- the parameter table (docs/api.md writes it out; `table_markdown` renders it) ---------------------
#
# Every parameter of the OpenAI completions and chat schemas, vLLM's extras and ours, with what this
# server does with it. null is every parameter's default and always accepted; a value is checked for
# its type (a 400 naming the parameter), then by its row's rule:
#   honoured       served as vLLM serves it;
#   accepted when  only the values whose effect here is exactly vLLM's (listed), any other is a 400;
#   greedy only    a sampling parameter: only the values that leave decoding greedy; any other is a 400
#                  saying so, or (`kern serve --sampling greedy-warn`) served greedily with one WARN line
#                  per parameter name;
#   refused        any non-null value is a 400 naming it.
# A key in no row of its endpoint is a 400: "unknown parameter 'foo'", param "foo".

HONOURED, ACCEPTED, GREEDY, REFUSED = "honoured", "accepted when", "greedy only", "refused"
CMPL, CHAT = "completions", "chat"
BOTH = (CMPL, CHAT)
SAMPLING_MODES = ("refuse", "greedy-warn")
_KINDS = {"bool": "a boolean", "int": "an integer", "num": "a number", "str": "a string", "list": "a list",
          "obj": "an object"}


@dataclass(slots=True)
class Ctx:
    body: dict
    warn: bool  # --sampling greedy-warn
    sampled: list[str]  # greedy-only parameters served greedily (warned)


@dataclass(frozen=True, slots=True)
class Param:
    """One row: the parameter, the schemas it is in, its rule, the values served (docs), and a probe."""

    name: str
    on: tuple[str, ...]
    rule: str
    served: str  # what is served, in words (docs/api.md)
    check: Callable[[Ctx, str, Any], None] | None  # called with a non-null value; raises ApiError
    probe: Any  # a value other than the default (tests/test_serve_params.py sends it)
    probe_ok: bool  # the probe is served (200), else refused (probe_status, naming the parameter)
    probe_status: int = 400


def typed(name: str, v, kind: str) -> None:
    ok = {"bool": isinstance(v, bool), "int": is_int(v), "num": isinstance(v, (int, float)) and not isinstance(v, bool),
          "str": isinstance(v, str), "list": isinstance(v, list), "obj": isinstance(v, dict)}[kind]
    if not ok:
        raise type_error(name, _KINDS[kind], v)


def _no(name: str, v, why: str, code: str = "unsupported_value") -> ApiError:
    return ApiError(400, f"'{name}' {json.dumps(v)[:60]} is not supported: {why}", name, code)


def _any(kind: str):
    def check(ctx: Ctx, name: str, v) -> None:
        typed(name, v, kind)
    return check


def _only(kind: str, ok: Callable[[Any], bool], why: str):
    def check(ctx: Ctx, name: str, v) -> None:
        typed(name, v, kind)
        if not ok(v):
            raise _no(name, v, why)
    return check


def _never(why: str):
    def check(ctx: Ctx, name: str, v) -> None:
        raise _no(name, v, why)
    return check


def _greedy(kind: str, greedy: Callable[[Any], bool], valid: Callable[[Any], bool], rng: str, want: str,
            t0_resets: bool = False):
    """A sampling parameter: `greedy` values are served; `valid` bounds the rest (vLLM's own 400s)."""
    def check(ctx: Ctx, name: str, v) -> None:
        typed(name, v, kind)
        if not valid(v):
            raise ApiError(400, f"'{name}' must be {rng}, got {json.dumps(v)[:60]}", name, "invalid_value")
        if greedy(v):
            return
        t = ctx.body.get("temperature")
        if t0_resets and _is_num(t) and t == 0:
            return  # vLLM: a zero temperature resets top_p, top_k and min_p (greedy all the same)
        if ctx.warn:
            ctx.sampled.append(name)
            return
        raise ApiError(400, f"'{name}' {json.dumps(v)[:60]} asks for sampling, but decoding is greedy ({want}); "
                       "`kern serve --sampling greedy-warn` serves such requests greedily", name, "unsupported_value")
    return check


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _n(ctx: Ctx, name: str, v) -> None:
    if not is_int(v) or v != 1:
        raise ApiError(400, "'n' must be 1 (decoding is greedy: one choice per request)", "n", "invalid_value")


def _stop(ctx: Ctx, name: str, v) -> None:
    if not isinstance(v, str) and not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        raise type_error("stop", "a string or a list of strings", v)
    stops = [v] if isinstance(v, str) else v
    if len(stops) > 4:
        raise ApiError(400, f"'stop' has {len(stops)} strings; at most 4", "stop", "invalid_value")
    if any(not s for s in stops):
        raise ApiError(400, "'stop' strings must be non-empty", "stop", "invalid_value")


def _stop_ids(ctx: Ctx, name: str, v) -> None:
    if not isinstance(v, list) or not all(is_int(t) for t in v):
        raise type_error(name, "a list of integer token ids", v)
    bad = [t for t in v if not 0 <= t <= EOS]
    if bad:
        raise ApiError(400, f"'{name}' ids must be in 0..{EOS}; got {bad[:5]}", name, "invalid_token_id")


def _stream_options(ctx: Ctx, name: str, v) -> None:
    typed(name, v, "obj")
    for k, x in v.items():
        if k not in ("include_usage", "continuous_usage_stats"):
            raise ApiError(400, f"unknown parameter 'stream_options.{k}'", f"stream_options.{k}", "unknown_parameter")
        if x is not None:
            typed(f"stream_options.{k}", x, "bool")
    if ctx.body.get("stream") is not True:
        raise ApiError(400, "'stream_options' can only be given with 'stream': true", name, "invalid_value")


def _truncate(ctx: Ctx, name: str, v) -> None:
    typed(name, v, "int")
    if v < 1:
        raise ApiError(400, f"'{name}' must be at least 1 (keep the last k prompt tokens), got {v}", name,
                       "invalid_value")


def _continue(ctx: Ctx, name: str, v) -> None:
    typed(name, v, "bool")
    if v and ctx.body.get("add_generation_prompt", True) is not False:
        raise ApiError(400, "'continue_final_message' and 'add_generation_prompt' cannot both be true "
                       "(add_generation_prompt defaults to true)", name, "invalid_value")


def _empty(v) -> bool:
    return not v


_NO_LOGPROBS = "the toy has no log-probabilities"
_NO_TOOLS = "this server has no tool calling"
_NO_GUIDED = "this server has no guided decoding"

P = Param
PARAMS: tuple[Param, ...] = (
    # the request itself
    P("model", BOTH, HONOURED, "the served model's name (another is a 404)", None, "no-such-model", False, 404),
    P("prompt", (CMPL,), HONOURED, "a string (its UTF-8 bytes) or a list of token ids 0..256; one prompt", None,
      [72, 105], True),
    P("messages", (CHAT,), HONOURED, "text contents, concatenated (the chat template adds nothing)", None,
      [{"role": "user", "content": "Hi"}], True),
    P("max_tokens", BOTH, HONOURED, "an integer >= 1 (default 16); the room rule bounds it", None, 3, True),
    P("max_completion_tokens", (CHAT,), HONOURED, "as max_tokens, and before it (vLLM)", None, 3, True),
    P("stream", BOTH, HONOURED, "a boolean: server-sent events, the last chunk with usage", _any("bool"), True, True),
    P("stream_options", BOTH, HONOURED, "with stream true: include_usage (a last chunk with no choices and the "
      "usage, before [DONE]; without it the finishing chunk carries the usage), continuous_usage_stats (with "
      "include_usage: usage so far on every chunk)", _stream_options, {"include_usage": True}, False),
    P("return_token_ids", BOTH, HONOURED, "a boolean: token_ids and prompt_token_ids in the choice (ours)",
      _any("bool"), True, True),
    P("request_id", BOTH, HONOURED, "a string naming the response: id cmpl-<request_id> / chatcmpl-<request_id> "
      "(kern.request_id stays req-N)", _any("str"), "my-request", True),
    # stopping
    P("stop", BOTH, HONOURED, "a string or up to 4 non-empty strings: the answer ends at the token completing one; "
      "the text stops before it; stop_reason the string", _stop, "e", True),
    P("stop_token_ids", BOTH, HONOURED, "token ids 0..256: the answer ends at one (in token_ids, its text left "
      "out); stop_reason the id", _stop_ids, [101], True),
    P("include_stop_str_in_output", BOTH, HONOURED, "a boolean: the text keeps the stop string (or stop token)",
      _any("bool"), True, True),
    P("ignore_eos", BOTH, HONOURED, "a boolean: EOS is an answer token; only max_tokens (or a stop) ends it",
      _any("bool"), True, True),
    P("min_tokens", BOTH, ACCEPTED, "0 (the toy's greedy step has no second choice to take while EOS is masked)",
      _only("int", lambda v: v == 0, "the toy's greedy step has no second choice to take while EOS is masked"),
      3, False),
    P("truncate_prompt_tokens", BOTH, HONOURED, "an integer k >= 1: only the prompt's last k tokens are served",
      _truncate, 2, True),
    P("echo", (CMPL,), HONOURED, "a boolean: the prompt's text leads the text (a stream's first chunk)",
      _any("bool"), True, True),
    P("echo", (CHAT,), ACCEPTED, "false", _only("bool", lambda v: v is False, "chat echo is not served here"),
      True, False),
    # sampling: greedy only
    P("temperature", BOTH, GREEDY, "0", _greedy("num", lambda v: v == 0, lambda v: v >= 0, "non-negative", "temperature 0"),
      0.7, False),
    P("top_p", BOTH, GREEDY, "1 (any value in (0, 1] with temperature 0, which vLLM resets it under)",
      _greedy("num", lambda v: v == 1, lambda v: 0 < v <= 1, "in (0, 1]", "top_p 1", True), 0.5, False),
    P("top_k", BOTH, GREEDY, "-1, 0 or 1 (any with temperature 0)",
      _greedy("int", lambda v: v in (-1, 0, 1), lambda v: v >= -1, "-1, 0 or a positive integer", "top_k -1", True),
      40, False),
    P("min_p", BOTH, GREEDY, "0 (any value in [0, 1] with temperature 0)",
      _greedy("num", lambda v: v == 0, lambda v: 0 <= v <= 1, "in [0, 1]", "min_p 0", True), 0.1, False),
    P("frequency_penalty", BOTH, GREEDY, "0", _greedy("num", lambda v: v == 0, lambda v: -2 <= v <= 2, "in [-2, 2]",
                                                       "frequency_penalty 0"), 0.5, False),
    P("presence_penalty", BOTH, GREEDY, "0", _greedy("num", lambda v: v == 0, lambda v: -2 <= v <= 2, "in [-2, 2]",
                                                      "presence_penalty 0"), 0.5, False),
    P("repetition_penalty", BOTH, GREEDY, "1", _greedy("num", lambda v: v == 1, lambda v: v > 0, "positive",
                                                        "repetition_penalty 1"), 1.2, False),
    P("length_penalty", BOTH, GREEDY, "1", _greedy("num", lambda v: v == 1, lambda v: True, "a number",
                                                    "length_penalty 1"), 0.8, False),
    P("use_beam_search", BOTH, GREEDY, "false", _greedy("bool", lambda v: v is False, lambda v: True, "a boolean",
                                                         "no beam search"), True, False),
    P("best_of", (CMPL,), GREEDY, "1", _greedy("int", lambda v: v == 1, lambda v: v >= 1, "at least 1", "best_of 1"),
      2, False),
    P("n", BOTH, ACCEPTED, "1 (also under --sampling greedy-warn: one choice per request)", _n, 2, False),
    P("seed", BOTH, ACCEPTED, "any integer (greedy decoding draws nothing at random)", _any("int"), 1234, True),
    # log-probabilities
    P("logprobs", (CMPL,), REFUSED, "null only (0 too asks for the chosen tokens' log-probabilities)",
      _never(_NO_LOGPROBS), 1, False),
    P("logprobs", (CHAT,), ACCEPTED, "false", _only("bool", lambda v: v is False, _NO_LOGPROBS), True, False),
    P("top_logprobs", (CHAT,), ACCEPTED, "0", _only("int", lambda v: v == 0, _NO_LOGPROBS), 2, False),
    P("prompt_logprobs", BOTH, REFUSED, "null only (0 too asks for the prompt's log-probabilities)",
      _never(_NO_LOGPROBS), 1, False),
    P("return_tokens_as_token_ids", BOTH, ACCEPTED, "a boolean (it shapes log-probabilities only, which are refused)",
      _any("bool"), True, True),
    # what would change the tokens
    P("suffix", (CMPL,), REFUSED, "null only (as vLLM)", _never("no insertion (as vLLM)"), "tail", False),
    P("logit_bias", BOTH, ACCEPTED, "{} (no bias)", _only("obj", _empty, "the toy has no logits to bias"),
      {"65": 10}, False),
    P("allowed_token_ids", BOTH, REFUSED, "null only (an empty list allows no token: vLLM refuses it too)",
      _never("the toy's greedy step has no second choice to restrict to"), [65, 66], False),
    P("bad_words", BOTH, ACCEPTED, "[] (no words)", _only("list", _empty, "the toy's greedy step has no second choice"),
      ["the"], False),
    P("response_format", BOTH, ACCEPTED, '{"type": "text"}',
      _only("obj", lambda v: v == {"type": "text"}, _NO_GUIDED), {"type": "json_object"}, False),
    P("guided_json", BOTH, REFUSED, "null only", _never(_NO_GUIDED), {"type": "object"}, False),
    P("guided_regex", BOTH, REFUSED, "null only", _never(_NO_GUIDED), "a+", False),
    P("guided_choice", BOTH, REFUSED, "null only", _never(_NO_GUIDED), ["yes", "no"], False),
    P("guided_grammar", BOTH, REFUSED, "null only", _never(_NO_GUIDED), "root ::= \"a\"", False),
    P("guided_decoding_backend", BOTH, REFUSED, "null only", _never(_NO_GUIDED), "xgrammar", False),
    P("structured_outputs", BOTH, REFUSED, "null only", _never(_NO_GUIDED), {"regex": "a+"}, False),
    # tools
    P("tools", (CHAT,), ACCEPTED, "[]", _only("list", _empty, _NO_TOOLS), [{"type": "function", "function": {"name": "f"}}],
      False),
    P("functions", (CHAT,), ACCEPTED, "[]", _only("list", _empty, _NO_TOOLS), [{"name": "f"}], False),
    P("tool_choice", (CHAT,), ACCEPTED, '"none"', _only("str", lambda v: v == "none", _NO_TOOLS), "auto", False),
    P("function_call", (CHAT,), ACCEPTED, '"none"', _only("str", lambda v: v == "none", _NO_TOOLS), "auto", False),
    P("parallel_tool_calls", (CHAT,), ACCEPTED, "a boolean (with no tools it changes nothing)", _any("bool"), False,
      True),
    # the tokenizer and the chat template
    P("skip_special_tokens", BOTH, ACCEPTED, "a boolean (EOS, the only special token, has no text either way)",
      _any("bool"), False, True),
    P("spaces_between_special_tokens", BOTH, ACCEPTED, "a boolean (one special token, no text: nothing to space)",
      _any("bool"), False, True),
    P("add_special_tokens", BOTH, ACCEPTED, "a boolean (the byte tokenizer adds none either way)", _any("bool"), True,
      True),
    P("add_generation_prompt", (CHAT,), ACCEPTED, "a boolean (the template adds no generation prompt either way)",
      _any("bool"), False, True),
    P("continue_final_message", (CHAT,), ACCEPTED, "a boolean; true only with add_generation_prompt false (vLLM); "
      "the template ends no turn either way", _continue, True, False),
    P("chat_template", (CHAT,), REFUSED, "null only", _never("the chat template is fixed (contents concatenated)"),
      "{{ messages }}", False),
    P("chat_template_kwargs", (CHAT,), ACCEPTED, "{}", _only("obj", _empty, "the chat template is fixed"),
      {"enable_thinking": False}, False),
    P("documents", (CHAT,), ACCEPTED, "[]", _only("list", _empty, "the chat template renders no documents"),
      [{"text": "doc"}], False),
    # the chat schema's rest
    P("audio", (CHAT,), REFUSED, "null only", _never("text only"), {"voice": "alloy", "format": "wav"}, False),
    P("modalities", (CHAT,), ACCEPTED, '["text"]', _only("list", lambda v: v == ["text"], "text only"),
      ["text", "audio"], False),
    P("prediction", (CHAT,), REFUSED, "null only", _never("no predicted outputs"),
      {"type": "content", "content": "x"}, False),
    P("reasoning_effort", (CHAT,), REFUSED, "null only", _never("the toy does not reason"), "low", False),
    P("web_search_options", (CHAT,), REFUSED, "null only", _never("no web search"), {}, False),
    # bookkeeping
    P("user", BOTH, ACCEPTED, "a string (recorded nowhere)", _any("str"), "user-1", True),
    P("metadata", (CHAT,), ACCEPTED, "an object (stored nowhere)", _any("obj"), {"k": "v"}, True),
    P("store", (CHAT,), ACCEPTED, "false (nothing is stored)", _only("bool", lambda v: v is False, "nothing is stored"),
      True, False),
    P("service_tier", (CHAT,), ACCEPTED, '"auto" or "default" (one tier)',
      _only("str", lambda v: v in ("auto", "default"), "one service tier"), "flex", False),
    P("priority", BOTH, ACCEPTED, "0 (first come, first served)",
      _only("int", lambda v: v == 0, "no priority scheduling (first come, first served)"), 1, False),
    P("kv_transfer_params", BOTH, REFUSED, "null only", _never("no disaggregated prefill"), {"do_remote_decode": True},
      False),
    P("cache_salt", BOTH, REFUSED, "null only", _never("the prefix cache is not partitioned by salt"), "salt-1", False),
)
del P


def table_markdown() -> str:
    """The table as docs/api.md carries it (tests/test_serve_params.py holds the doc to it)."""
    rows = ["| parameter | completions | chat | rule | served |", "|---|---|---|---|---|"]
    for p in PARAMS:
        cm = "yes" if CMPL in p.on else ""
        ch = "yes" if CHAT in p.on else ""
        rows.append(f"| `{p.name}` | {cm} | {ch} | {p.rule} | {p.served.replace('|', '/')} |")
    return "\n".join(rows) + "\n"

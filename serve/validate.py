"""Request bodies -> what the scheduler runs, or an OpenAI-style error (SPEC §7 "Errors").

Every failure is an `ApiError` rendered as `{"error": {message, type, param, code}}`: 400 for
anything malformed (never FastAPI's 422), 404 for an unknown model, 401 for a bad api key. Numbers are
checked as Python ints before anything casts them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from kern.errors import KernError
from kern.tokens import BYTES, EOS

__all__ = ["PARAMS", "PARTS", "ROLES", "ROUTE_KEYS", "ApiError", "Ask", "Param", "chat", "completion", "detokenize", "parse", "room", "table_markdown",
           "tokenize"]

MAX_TOKENS_LIMIT = 1 << 31
DEFAULT_MAX_TOKENS = 16


class ApiError(KernError):
    """A request the server refuses; carries the HTTP status and the OpenAI error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __reduce__(self):  # pickled whole (serve/bodies.py's worker process raises them)
        return (ApiError, (self.status, self.message, self.param, self.code, self.type))


@dataclass(slots=True)
class Ask:
    """A validated completion or chat request."""

    ids: list[int]
    max_tokens: int
    stream: bool
    return_token_ids: bool
    include_usage: bool
    chat: bool
    sampling: tuple[str, ...] = ()  # non-greedy parameters served greedily (`--sampling greedy-warn`)
    ignore_eos: bool = False  # EOS is an answer token like any other; only max_tokens ends it
    stop: tuple[str, ...] = ()  # stop strings
    stop_ids: tuple[int, ...] = ()  # stop token ids
    include_stop: bool = False  # include_stop_str_in_output
    echo: bool = False  # completions: the prompt's text leads the answer's
    request_id: str | None = None  # names the response ("cmpl-<id>"), as vLLM's request_id does
    continuous_usage: bool = False  # stream_options.continuous_usage_stats with include_usage: usage on every chunk


def parse(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {str(exc)[:200]}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, not {type(body).__name__}", code="invalid_json")
    # a lone surrogate comes from a \u escape or from its bytes (json decodes with surrogatepass)
    bad = _undecodable(body) if b"\\u" in raw or not raw.isascii() else None
    if bad is not None:
        raise ApiError(400, f"'{bad}' holds a string that is not valid Unicode (a lone surrogate such as \\ud800); "
                       "strings must be UTF-8 text", bad, "invalid_string")
    return body


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _undecodable(body: dict) -> str | None:
    """The first field (`request_id`, `messages[0].content`, ...) of `body` whose string, or key, cannot
    be written as UTF-8 (JSON's \\ud800 escapes decode to lone surrogates), or None."""
    todo: list[tuple[str, object]] = [("", body)]
    while todo:
        path, v = todo.pop()
        if isinstance(v, str):
            if not _utf8(v):
                return path
        elif isinstance(v, dict):
            for k, x in reversed(v.items()):
                p = f"{path}.{k}" if path else k
                if not _utf8(k):
                    return p.encode("utf-8", "backslashreplace").decode()
                todo.append((p, x))
        elif isinstance(v, list):
            todo.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_error(param: str, want: str, v) -> ApiError:
    return ApiError(400, f"'{param}' must be {want}, got {type(v).__name__}", param, "invalid_type")


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _type_error(key, "a boolean", v)
    return v


def check_model(body: dict, served: str) -> None:
    if "model" not in body or body["model"] is None:
        return
    m = body["model"]
    if not isinstance(m, str):
        raise _type_error("model", "a string", m)
    if m != served:
        raise ApiError(404, f"the model '{m}' does not exist; this server serves '{served}'", "model",
                       "model_not_found")


def _ids(v, param: str) -> list[int]:
    if isinstance(v, str):
        if not v:
            raise ApiError(400, f"'{param}' is empty", param, "empty_prompt")
        return list(v.encode("utf-8"))
    if isinstance(v, list):
        if not v:
            raise ApiError(400, f"'{param}' is empty", param, "empty_prompt")
        if all(type(t) is int for t in v) and 0 <= min(v) and max(v) <= EOS:  # the common case, in C
            return list(v)
        if all(_is_int(t) for t in v):
            bad = [t for t in v if not 0 <= t <= EOS]
            if bad:
                raise ApiError(400, f"token ids must be in 0..{EOS}; got {bad[:5]}", param, "invalid_token_id")
            return list(v)
        if len(v) == 1 and isinstance(v[0], (str, list)):
            return _ids(v[0], param)
        if all(isinstance(t, (str, list)) for t in v):
            raise ApiError(400, "only one prompt per request is supported", param, "invalid_value")
        raise ApiError(400, f"'{param}' must be a string or a list of integer token ids", param, "invalid_type")
    raise _type_error(param, "a string or a list of token ids", v)


def _max_tokens(body: dict, chat_: bool) -> int:
    key = "max_tokens"
    mt = body.get("max_tokens")
    if chat_ and body.get("max_completion_tokens") is not None:  # vLLM: max_completion_tokens or max_tokens
        key, mt = "max_completion_tokens", body["max_completion_tokens"]
    if mt is None:
        mt = DEFAULT_MAX_TOKENS
    if not _is_int(mt):
        raise ApiError(400, f"'{key}' must be a positive integer, got {json.dumps(mt)[:50]}", key, "invalid_type")
    if mt < 1:
        raise ApiError(400, f"'{key}' must be at least 1, got {mt}", key, "invalid_value")
    if mt >= MAX_TOKENS_LIMIT:
        raise ApiError(400, f"'{key}' {mt} is absurd (at most {MAX_TOKENS_LIMIT - 1})", key, "invalid_value")
    return mt


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
class _Ctx:
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
    check: Callable[[_Ctx, str, Any], None] | None  # called with a non-null value; raises ApiError
    probe: Any  # a value other than the default (tests/test_serve_params.py sends it)
    probe_ok: bool  # the probe is served (200), else refused (probe_status, naming the parameter)
    probe_status: int = 400


def _typed(name: str, v, kind: str) -> None:
    ok = {"bool": isinstance(v, bool), "int": _is_int(v), "num": isinstance(v, (int, float)) and not isinstance(v, bool),
          "str": isinstance(v, str), "list": isinstance(v, list), "obj": isinstance(v, dict)}[kind]
    if not ok:
        raise _type_error(name, _KINDS[kind], v)


def _no(name: str, v, why: str, code: str = "unsupported_value") -> ApiError:
    return ApiError(400, f"'{name}' {json.dumps(v)[:60]} is not supported: {why}", name, code)


def _any(kind: str):
    def check(ctx: _Ctx, name: str, v) -> None:
        _typed(name, v, kind)
    return check


def _only(kind: str, ok: Callable[[Any], bool], why: str):
    def check(ctx: _Ctx, name: str, v) -> None:
        _typed(name, v, kind)
        if not ok(v):
            raise _no(name, v, why)
    return check


def _never(why: str):
    def check(ctx: _Ctx, name: str, v) -> None:
        raise _no(name, v, why)
    return check


def _greedy(kind: str, greedy: Callable[[Any], bool], valid: Callable[[Any], bool], rng: str, want: str,
            t0_resets: bool = False):
    """A sampling parameter: `greedy` values are served; `valid` bounds the rest (vLLM's own 400s)."""
    def check(ctx: _Ctx, name: str, v) -> None:
        _typed(name, v, kind)
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


def _n(ctx: _Ctx, name: str, v) -> None:
    if not _is_int(v) or v != 1:
        raise ApiError(400, "'n' must be 1 (decoding is greedy: one choice per request)", "n", "invalid_value")


def _stop(ctx: _Ctx, name: str, v) -> None:
    if not isinstance(v, str) and not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        raise _type_error("stop", "a string or a list of strings", v)
    stops = [v] if isinstance(v, str) else v
    if len(stops) > 4:
        raise ApiError(400, f"'stop' has {len(stops)} strings; at most 4", "stop", "invalid_value")
    if any(not s for s in stops):
        raise ApiError(400, "'stop' strings must be non-empty", "stop", "invalid_value")


def _stop_ids(ctx: _Ctx, name: str, v) -> None:
    if not isinstance(v, list) or not all(_is_int(t) for t in v):
        raise _type_error(name, "a list of integer token ids", v)
    bad = [t for t in v if not 0 <= t <= EOS]
    if bad:
        raise ApiError(400, f"'{name}' ids must be in 0..{EOS}; got {bad[:5]}", name, "invalid_token_id")


def _stream_options(ctx: _Ctx, name: str, v) -> None:
    _typed(name, v, "obj")
    for k, x in v.items():
        if k not in ("include_usage", "continuous_usage_stats"):
            raise ApiError(400, f"unknown parameter 'stream_options.{k}'", f"stream_options.{k}", "unknown_parameter")
        if x is not None:
            _typed(f"stream_options.{k}", x, "bool")
    if ctx.body.get("stream") is not True:
        raise ApiError(400, "'stream_options' can only be given with 'stream': true", name, "invalid_value")


def _truncate(ctx: _Ctx, name: str, v) -> None:
    _typed(name, v, "int")
    if v < 1:
        raise ApiError(400, f"'{name}' must be at least 1 (keep the last k prompt tokens), got {v}", name,
                       "invalid_value")


def _continue(ctx: _Ctx, name: str, v) -> None:
    _typed(name, v, "bool")
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

_BY_ENDPOINT = {ep: {p.name: p for p in PARAMS if ep in p.on} for ep in BOTH}


def table_markdown() -> str:
    """The table as docs/api.md carries it (tests/test_serve_params.py holds the doc to it)."""
    rows = ["| parameter | completions | chat | rule | served |", "|---|---|---|---|---|"]
    for p in PARAMS:
        cm = "yes" if CMPL in p.on else ""
        ch = "yes" if CHAT in p.on else ""
        rows.append(f"| `{p.name}` | {cm} | {ch} | {p.rule} | {p.served.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def _checked(body: dict, endpoint: str, sampling: str) -> _Ctx:
    """Every key of `body` against the endpoint's rows (unknown keys first, in the body's order)."""
    rows = _BY_ENDPOINT[endpoint]
    for k in body:
        if k not in rows:
            raise ApiError(400, f"unknown parameter '{k}'", k, "unknown_parameter")
    ctx = _Ctx(body, sampling == "greedy-warn", [])
    for k, v in body.items():
        check = rows[k].check
        if v is not None and check is not None:
            check(ctx, k, v)
    return ctx


def _ask(body: dict, ids: list[int], chat_: bool, ctx: _Ctx) -> Ask:
    k = body.get("truncate_prompt_tokens")
    if k is not None:
        ids = ids[-k:]
    stop = body.get("stop")
    opts = body.get("stream_options") or {}
    return Ask(ids, _max_tokens(body, chat_), _bool(body, "stream"), _bool(body, "return_token_ids"),
               opts.get("include_usage") is True, chat_, tuple(dict.fromkeys(ctx.sampled)), _bool(body, "ignore_eos"),
               tuple([stop] if isinstance(stop, str) else stop or ()), tuple(body.get("stop_token_ids") or ()),
               _bool(body, "include_stop_str_in_output"), _bool(body, "echo") and not chat_, body.get("request_id"),
               opts.get("include_usage") is True and opts.get("continuous_usage_stats") is True)


def completion(body: dict, served: str, sampling: str = "refuse") -> Ask:
    check_model(body, served)
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required", "prompt", "missing_required_parameter")
    ids = _ids(body["prompt"], "prompt")
    ctx = _checked(body, CMPL, sampling)
    return _ask(body, ids, False, ctx)


# -- the chat messages' roles and content parts, and the other routes' keys (docs/api.md "Messages" and
# "The other routes": the tables are written out there, and tests/test_validate_input.py holds them to it)

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""The chat roles a message may have (OpenAI's, as vLLM takes them); the template treats them alike."""

PARTS = {"text": None, "image_url": "an image", "input_image": "an image", "input_audio": "audio",
         "audio_url": "audio", "video_url": "a video", "file": "a file", "refusal": "a refusal"}
"""Content part types: "text" is served (its text), every other known type is refused naming it."""

ROUTE_KEYS = {
    "tokenize": {"model": None, "prompt": None, "messages": None, "add_special_tokens": "bool",
                 "add_generation_prompt": "bool", "continue_final_message": "bool"},
    "detokenize": {"model": None, "tokens": None},
}
"""Every key /tokenize and /detokenize take (None: checked by the route itself, else its type); any
other is refused by name, as on the generating routes."""


def _known_keys(body: dict, route: str) -> None:
    keys = ROUTE_KEYS[route]
    for k, v in body.items():
        if k not in keys:
            raise ApiError(400, f"unknown parameter '{k}' (/{route} takes {', '.join(keys)})", k, "unknown_parameter")
        if v is not None and keys[k] is not None:
            _typed(k, v, keys[k])


def _role(m: dict, i: int) -> None:
    r = m.get("role")
    where = f"messages[{i}].role"
    if r is None:
        raise ApiError(400, f"'{where}' is required (one of {', '.join(ROLES)})", where, "missing_required_parameter")
    if r not in ROLES:
        raise ApiError(400, f"'{where}' {json.dumps(r)[:40]} is not a chat role (one of {', '.join(ROLES)})", where,
                       "invalid_value")


def _part_text(p, where: str) -> str:
    if not isinstance(p, dict):
        raise _type_error(where, "an object (a content part)", p)
    kind = p.get("type")
    if kind is None:
        raise ApiError(400, f"'{where}.type' is required (\"text\")", f"{where}.type", "missing_required_parameter")
    if kind not in PARTS:
        raise ApiError(400, f"'{where}.type' {json.dumps(kind)[:40]} is not a content part type", f"{where}.type",
                       "invalid_value")
    if PARTS[kind] is not None:
        raise ApiError(400, f"'{where}' is {PARTS[kind]} ({kind} part): this server serves text parts only", where,
                       "unsupported_content")
    text = p.get("text")
    if not isinstance(text, str):
        raise _type_error(f"{where}.text", "a string", text)
    return text


def _messages(body: dict) -> list[int]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list", "messages",
                       "missing_required_parameter" if msgs is None else "invalid_type")
    text = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _type_error(f"messages[{i}]", "an object", m)
        _role(m, i)
        c = m.get("content")
        if c is None:
            continue
        if isinstance(c, str):
            text.append(c)
        elif isinstance(c, list):
            text.extend(_part_text(p, f"messages[{i}].content[{j}]") for j, p in enumerate(c))
        else:
            raise _type_error(f"messages[{i}].content", "a string or a list of content parts", c)
    # the chat template: the contents concatenated, nothing added
    return _ids("".join(text), "messages")


def chat(body: dict, served: str, sampling: str = "refuse") -> Ask:
    check_model(body, served)
    ids = _messages(body)
    ctx = _checked(body, CHAT, sampling)
    return _ask(body, ids, True, ctx)


def tokenize(body: dict, served: str) -> list[int]:
    check_model(body, served)
    _known_keys(body, "tokenize")
    if "prompt" in body:
        return _ids(body["prompt"], "prompt")
    if "messages" in body:
        return _messages(body)
    raise ApiError(400, "'prompt' is required", "prompt", "missing_required_parameter")


def detokenize(body: dict, served: str) -> str:
    check_model(body, served)
    _known_keys(body, "detokenize")
    toks = body.get("tokens")
    if not isinstance(toks, list) or not all(_is_int(t) for t in toks):
        raise ApiError(400, "'tokens' must be a list of integer token ids", "tokens", "invalid_type")
    bad = [t for t in toks if not 0 <= t <= EOS]
    if bad:
        raise ApiError(400, f"token ids must be in 0..{EOS}; got {bad[:5]}", "tokens", "invalid_token_id")
    return text_of(toks)


def text_of(ids: list[int]) -> str:
    return bytes(t for t in ids if t < BYTES).decode("utf-8", "replace")


def room(ask: Ask, rows: int, reach: int, pool_tokens: int, max_request: int) -> None:
    """The room rule's rejections, in SPEC §6's order (the pool's own ExceedsPool comes at admission)."""
    need = len(ask.ids) + ask.max_tokens + rows - 1
    what = f"prompt {len(ask.ids)} + max_tokens {ask.max_tokens} + {rows - 1} draft rows = {need} tokens"
    if need > reach:
        raise ApiError(400, f"{what}: over one sequence's reach of {reach} tokens", "prompt",
                       "context_length_exceeded")
    if need > pool_tokens:
        raise ApiError(400, f"{what}: over the whole pool of {pool_tokens} tokens", "prompt", "kv_budget_exceeded")
    if need > max_request:
        raise ApiError(400, f"{what}: over the {max_request} tokens one request may hold (the pool less the pad)",
                       "prompt", "context_length_exceeded")

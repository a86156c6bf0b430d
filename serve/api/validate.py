"""Request bodies -> what the scheduler runs, or an OpenAI-style error (SPEC §7 "Errors").

Every failure is an `ApiError` rendered as `{"error": {message, type, param, code}}`: 400 for
anything malformed (never FastAPI's 422), 404 for an unknown model, 401 for a bad api key. Numbers are
checked as Python ints before anything casts them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kern.tokens import BYTES, EOS
from serve.api.params import BOTH, CHAT, CMPL, PARAMS, Ctx, Param, table_markdown, typed
from serve.common.api_error import ApiError, is_int, type_error

__all__ = ["PARAMS", "PARTS", "ROLES", "ROUTE_KEYS", "ApiError", "Ask", "Param", "chat", "completion", "detokenize", "parse", "room", "table_markdown",
           "tokenize"]

MAX_TOKENS_LIMIT = 1 << 31
DEFAULT_MAX_TOKENS = 16


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


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise type_error(key, "a boolean", v)
    return v


def check_model(body: dict, served: str) -> None:
    if "model" not in body or body["model"] is None:
        return
    m = body["model"]
    if not isinstance(m, str):
        raise type_error("model", "a string", m)
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
        if set(map(type, v)) == {int} and 0 <= min(v) and max(v) <= EOS:  # the common case, in C (no Python loop)
            return list(v)
        if all(is_int(t) for t in v):
            bad = [t for t in v if not 0 <= t <= EOS]
            if bad:
                raise ApiError(400, f"token ids must be in 0..{EOS}; got {bad[:5]}", param, "invalid_token_id")
            return list(v)
        if len(v) == 1 and isinstance(v[0], (str, list)):
            return _ids(v[0], param)
        if all(isinstance(t, (str, list)) for t in v):
            raise ApiError(400, "only one prompt per request is supported", param, "invalid_value")
        raise ApiError(400, f"'{param}' must be a string or a list of integer token ids", param, "invalid_type")
    raise type_error(param, "a string or a list of token ids", v)


def _max_tokens(body: dict, chat_: bool) -> int:
    key = "max_tokens"
    mt = body.get("max_tokens")
    if chat_ and body.get("max_completion_tokens") is not None:  # vLLM: max_completion_tokens or max_tokens
        key, mt = "max_completion_tokens", body["max_completion_tokens"]
    if mt is None:
        mt = DEFAULT_MAX_TOKENS
    if not is_int(mt):
        raise ApiError(400, f"'{key}' must be a positive integer, got {json.dumps(mt)[:50]}", key, "invalid_type")
    if mt < 1:
        raise ApiError(400, f"'{key}' must be at least 1, got {mt}", key, "invalid_value")
    if mt >= MAX_TOKENS_LIMIT:
        raise ApiError(400, f"'{key}' {mt} is absurd (at most {MAX_TOKENS_LIMIT - 1})", key, "invalid_value")
    return mt


_BY_ENDPOINT = {ep: {p.name: p for p in PARAMS if ep in p.on} for ep in BOTH}


def _checked(body: dict, endpoint: str, sampling: str) -> Ctx:
    """Every key of `body` against the endpoint's rows (unknown keys first, in the body's order)."""
    rows = _BY_ENDPOINT[endpoint]
    for k in body:
        if k not in rows:
            raise ApiError(400, f"unknown parameter '{k}'", k, "unknown_parameter")
    ctx = Ctx(body, sampling == "greedy-warn", [])
    for k, v in body.items():
        check = rows[k].check
        if v is not None and check is not None:
            check(ctx, k, v)
    return ctx


def _ask(body: dict, ids: list[int], chat_: bool, ctx: Ctx) -> Ask:
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
            typed(k, v, keys[k])


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
        raise type_error(where, "an object (a content part)", p)
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
        raise type_error(f"{where}.text", "a string", text)
    return text


def _messages(body: dict) -> list[int]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list", "messages",
                       "missing_required_parameter" if msgs is None else "invalid_type")
    text = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise type_error(f"messages[{i}]", "an object", m)
        _role(m, i)
        c = m.get("content")
        if c is None:
            continue
        if isinstance(c, str):
            text.append(c)
        elif isinstance(c, list):
            text.extend(_part_text(p, f"messages[{i}].content[{j}]") for j, p in enumerate(c))
        else:
            raise type_error(f"messages[{i}].content", "a string or a list of content parts", c)
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
    if not isinstance(toks, list) or not all(is_int(t) for t in toks):
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

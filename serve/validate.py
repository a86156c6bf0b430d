"""Request bodies -> what the scheduler runs, or an OpenAI-style error (SPEC §7 "Errors").

Every failure is an `ApiError` rendered as `{"error": {message, type, param, code}}`: 400 for
anything malformed (never FastAPI's 422), 404 for an unknown model, 401 for a bad api key. Numbers are
checked as Python ints before anything casts them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from serve.request import EOS

__all__ = ["ApiError", "Ask", "chat", "completion", "detokenize", "parse", "room", "tokenize"]

MAX_TOKENS_LIMIT = 1 << 31
DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
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


@dataclass(slots=True)
class Ask:
    """A validated completion or chat request."""

    ids: list[int]
    max_tokens: int
    stream: bool
    return_token_ids: bool
    include_usage: bool
    chat: bool
    sampling: str = ""  # non-greedy parameters asked for (served greedily anyway)
    ignore_eos: bool = False  # EOS is an answer token like any other; only max_tokens ends it


def parse(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {str(exc)[:200]}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, not {type(body).__name__}", code="invalid_json")
    return body


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
        return list(v.encode("utf-8", "surrogatepass"))
    if isinstance(v, list):
        if not v:
            raise ApiError(400, f"'{param}' is empty", param, "empty_prompt")
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


def _common(body: dict, chat_: bool) -> tuple[int, bool, bool, bool]:
    key = "max_tokens"
    mt = body.get("max_tokens")
    if mt is None and chat_:
        key, mt = "max_completion_tokens", body.get("max_completion_tokens")
    if mt is None:
        mt = DEFAULT_MAX_TOKENS
    if not _is_int(mt):
        raise ApiError(400, f"'{key}' must be a positive integer, got {json.dumps(mt)[:50]}", key, "invalid_type")
    if mt < 1:
        raise ApiError(400, f"'{key}' must be at least 1, got {mt}", key, "invalid_value")
    if mt >= MAX_TOKENS_LIMIT:
        raise ApiError(400, f"'{key}' {mt} is absurd (at most {MAX_TOKENS_LIMIT - 1})", key, "invalid_value")
    for k in ("temperature", "top_p", "frequency_penalty", "presence_penalty"):
        v = body.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise _type_error(k, "a number", v)
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise ApiError(400, "'n' must be 1 (decoding is greedy)", "n", "invalid_value")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _type_error("stop", "a string or a list of strings", stop)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _type_error("stream_options", "an object", opts)
    include_usage = bool(opts and opts.get("include_usage") is True)
    return mt, _bool(body, "stream"), _bool(body, "return_token_ids"), include_usage


def _sampling(body: dict) -> str:
    asked = [k for k, greedy in (("temperature", 0), ("top_p", 1), ("top_k", -1)) if body.get(k) not in (None, greedy)]
    return ",".join(asked)


def completion(body: dict, served: str) -> Ask:
    check_model(body, served)
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required", "prompt", "missing_required_parameter")
    ids = _ids(body["prompt"], "prompt")
    mt, stream, rti, usage = _common(body, False)
    return Ask(ids, mt, stream, rti, usage, False, _sampling(body), _bool(body, "ignore_eos"))


def chat(body: dict, served: str) -> Ask:
    check_model(body, served)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list", "messages",
                       "missing_required_parameter" if msgs is None else "invalid_type")
    text = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _type_error(f"messages[{i}]", "an object", m)
        c = m.get("content")
        if c is None:
            continue
        if isinstance(c, str):
            text.append(c)
        elif isinstance(c, list) and all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in c):
            text.extend(p.get("text", "") for p in c)
        else:
            raise _type_error(f"messages[{i}].content", "a string or a list of text parts", c)
    # the chat template: the contents concatenated, nothing added
    ids = _ids("".join(text), "messages")
    mt, stream, rti, usage = _common(body, True)
    return Ask(ids, mt, stream, rti, usage, True, _sampling(body))


def tokenize(body: dict, served: str) -> list[int]:
    check_model(body, served)
    if "prompt" in body:
        return _ids(body["prompt"], "prompt")
    if "messages" in body:
        return chat(body, served).ids
    raise ApiError(400, "'prompt' is required", "prompt", "missing_required_parameter")


def detokenize(body: dict, served: str) -> str:
    check_model(body, served)
    toks = body.get("tokens")
    if not isinstance(toks, list) or not all(_is_int(t) for t in toks):
        raise ApiError(400, "'tokens' must be a list of integer token ids", "tokens", "invalid_type")
    bad = [t for t in toks if not 0 <= t <= EOS]
    if bad:
        raise ApiError(400, f"token ids must be in 0..{EOS}; got {bad[:5]}", "tokens", "invalid_token_id")
    return text_of(toks)


def text_of(ids: list[int]) -> str:
    return bytes(t for t in ids if t < 256).decode("utf-8", "replace")


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

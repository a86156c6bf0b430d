"""One request's response body: whole, or as stream chunks whose texts concatenate to it (the text, the
token ids, usage and the kern object, as docs/api.md gives them)."""

from __future__ import annotations

import codecs
import json
import time

from serve.api import validate
from serve.api.validate import Ask
from serve.client.seam import EOS, Done, Request, Update

__all__ = ["Reply"]


class Reply:
    """Builds one request's response: whole, or as stream chunks whose texts concatenate to it."""

    def __init__(self, req: Request, ask: Ask, model: str) -> None:
        self.req = req
        self.ask = ask
        self.model = model
        self.tokens: list[int] = []
        self.created = int(time.time())
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.done: Done | None = None
        self.sent_role = False
        self.sent_prompt = False
        self.sent_kern = False
        self.echo = validate.text_of(ask.ids) if ask.echo else ""  # leads the text (the first chunk's)
        self.hold = req.stops.hold if req.stops is not None else 0
        self._pieces: list[str] = []  # the answer's text as decoded
        self._pending = ""  # decoded, not yet released to a stream
        self._sent = 0  # characters released
        self._mid: tuple[str, str, str] | None = None  # a middle chunk's JSON around its text and ids

    def add(self, update: Update) -> str:
        """Take an update; return the text it releases (a stream chunk's). With stop strings the last
        `hold` characters (the longest stop string's length - 1, as vLLM) wait until they can no longer
        start a match; at the end the text is cut at `Done.text_end` (the scheduler matched it)."""
        self.tokens.extend(update.tokens)
        toks = update.tokens
        last = update.done is not None
        if last:
            self.done = update.done
            if update.done.hide_last and toks:
                toks = toks[:-1]  # a stop token id's text is left out (vLLM)
        got = self.decoder.decode(bytes([t for t in toks if t != EOS] if EOS in toks else toks), final=last)
        self._pieces.append(got)
        pending = self._pending + got
        if not last:
            n = max(len(pending) - self.hold, 0)
            self._pending, self._sent = pending[n:], self._sent + n
            return pending[:n]
        end = self.done.text_end
        self._pending = ""
        return pending if end is None else pending[:end - self._sent]

    def text(self) -> str:
        """The whole answer's text (after the last update), cut by a stop string, the echo first."""
        text = "".join(self._pieces)
        end = self.done.text_end if self.done is not None else None
        return self.echo + (text if end is None else text[:end])

    def _usage(self) -> dict:
        n = len(self.ask.ids)
        return {"prompt_tokens": n, "completion_tokens": len(self.tokens), "total_tokens": n + len(self.tokens),
                "prompt_tokens_details": {"cached_tokens": self.done.cached if self.done else 0}}

    untold_tier = False  # --fault untold-tier: cache_tier left out of the kern object

    def _kern(self) -> dict:
        out = self._told()
        if self.untold_tier:
            del out["cache_tier"]
        return out

    def _told(self) -> dict:
        """The kern object (docs/api.md): the server's request id, where its cached tokens came from,
        what became of its snapshot, whether its hit was woken from the host tier."""
        d = self.done
        return {"request_id": self.req.id, "cache_tier": d.tier if d else None, "snapshot": d.snapshot if d else "none",
                "woken": bool(d.woken) if d else False}

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.ask.chat else "text_completion") + (".chunk" if chunk and self.ask.chat else "")
        prefix = "chatcmpl" if self.ask.chat else "cmpl"
        name = self.ask.request_id or self.req.id
        return {"id": f"{prefix}-{name}", "object": kind, "created": self.created, "model": self.model}

    def whole(self) -> dict:
        text = self.text()
        choice: dict = {"index": 0, "finish_reason": self.done.reason, "logprobs": None}
        if self.ask.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["stop_reason"] = self.done.stop_reason
        if self.ask.return_token_ids:
            choice["token_ids"] = list(self.tokens)
            choice["prompt_token_ids"] = list(self.ask.ids)
        return {**self._head(False), "choices": [choice], "usage": self._usage(), "kern": self._kern()}

    def chunk_text(self, update: Update) -> str:
        """`chunk(update)` as compact JSON. A chunk in the middle of a stream (not its first or last,
        no usage on every chunk) is the same each time but for its text and token ids, so its JSON is
        made from a prefix and a suffix cut once, not by serializing a fresh dict a token (a third of
        a stream chunk's time in the front end)."""
        if update.done is not None or not self.sent_kern or self.ask.continuous_usage:  # echo rides on the first
            return json.dumps(self.chunk(update), separators=(",", ":"))
        if self._mid is None:
            probe = json.dumps({**self._head(True), "choices": [self._choice("\0", None, [0])]}, separators=(",", ":"))
            text_at = probe.index('"\\u0000"')
            ids_at = probe.rindex("[0]")
            self._mid = (probe[:text_at], probe[text_at + 8 : ids_at + 1], probe[ids_at + 2 :])
        before, between, after = self._mid
        text = self.add(update)
        return f"{before}{json.dumps(text)}{between}{','.join(map(str, update.tokens))}{after}"

    def _choice(self, text: str, done: Done | None, tokens: list[int], role: bool = False) -> dict:
        """A stream chunk's choice (its `prompt_token_ids`, on the first, added by `chunk`); `role`: the
        chat delta's role too (the first chunk's)."""
        last = done is not None
        choice: dict = {"index": 0, "finish_reason": done.reason if last else None, "logprobs": None}
        if self.ask.chat:
            delta: dict = {"content": text}
            if role:
                delta["role"] = "assistant"
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice["stop_reason"] = done.stop_reason if last else None
        choice["token_ids"] = list(tokens)
        return choice

    def chunk(self, update: Update) -> dict:
        text = self.add(update)
        if self.echo:
            text, self.echo = self.echo + text, ""
        last = update.done is not None
        choice = self._choice(text, self.done if last else None, update.tokens, self.ask.chat and not self.sent_role)
        self.sent_role = True
        if self.ask.return_token_ids and not self.sent_prompt:
            choice["prompt_token_ids"] = list(self.ask.ids)
            self.sent_prompt = True
        out = {**self._head(True), "choices": [choice]}
        if self.ask.continuous_usage or (last and not self.ask.include_usage):
            out["usage"] = self._usage()  # with include_usage alone: only in `usage_chunk`, as vLLM
        if last:
            out["kern"] = self._kern()
        if not last and not self.sent_kern:  # the hit is known at admission: a client that hangs up still learns it
            out["kern"] = self._admitted()
        self.sent_kern = True
        return out

    def usage_chunk(self) -> dict:
        """`stream_options.include_usage`: the chunk after the last, with no choices and the whole
        request's usage (the non-streamed answer's), as vLLM sends it."""
        return {**self._head(True), "choices": [], "usage": self._usage()}

    def _admitted(self) -> dict:
        """A stream's first chunk's kern object: the request's hit as its admission found it (its snapshot
        is told at the end)."""
        r = self.req
        out = {"request_id": r.id, "cache_tier": r.tier, "cached_tokens": r.cached, "woken": bool(r.woken)}
        if self.untold_tier:
            del out["cache_tier"]
        return out

"""Request traces for `kern replay`: the Mooncake format and our own token traces, as `Req` records.

Mooncake (FAST'25) lines: `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}`.
A hash id stands for a fixed block of 512 tokens derived from the id; the last block is partial (its
first tokens). Token traces: JSON lines with the prompt as token ids under `prompt` (or
`prompt_token_ids`, or `tokens`) and `output_length` (or `max_tokens`), optional `timestamp`; a
`prefix-trace/1` file (../shared/bench/prefix-vs-sglang/trace.py --jsonl) is read as its lookups,
each answered by as many tokens as its insert adds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from kern.errors import KernError
from pool import Tokens

__all__ = ["BLOCK", "Req", "TraceError", "block_tokens", "packed_fresh", "packed_prompt", "read", "scale"]

BLOCK = 512
FRESH = 1 << 31  # output tokens are numbered from here: never in any prompt
_OFFSETS = np.arange(BLOCK, dtype=np.uint32)


class TraceError(KernError, ValueError):
    """A trace file that cannot be read (names the line and what was wrong)."""


@dataclass(slots=True)
class Req:
    """One request: its arrival, input length, output length, and either hash ids or token ids."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int] | None = None
    tokens: list[int] | None = None
    block: int = BLOCK  # tokens a hash id stands for (512, or 512/k once scaled)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x


def block_tokens(hash_ids: list[int], length: int, vocab: int | None = None, block: int = BLOCK) -> np.ndarray:
    """The prompt of a Mooncake request: block `id` is 512 tokens derived from the id, the last one
    cut to `length`. Without `vocab` token j of block id is `id*512 + j` (no two blocks share a
    token); with it, a hash of that into 0..vocab-1 (for a server's small vocabulary)."""
    ids = np.asarray(hash_ids, dtype=np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= (FRESH // BLOCK)):
        raise TraceError(f"hash ids must be in 0..{FRESH // BLOCK - 1}")
    toks = (ids[:, None] * BLOCK + np.arange(block, dtype=np.int64)).ravel()[:length]
    if vocab is not None:
        toks = (_mix(toks) % np.uint64(vocab)).astype(np.int64)
    return toks


def fresh_tokens(start: int, n: int, vocab: int | None = None) -> np.ndarray:
    """`n` output tokens numbered from `start` (never in a prompt); hashed into the vocabulary if given."""
    toks = np.arange(FRESH + start, FRESH + start + n, dtype=np.int64)
    if vocab is not None:
        toks = (_mix(toks) % np.uint64(vocab)).astype(np.int64)
    return toks


def request_tokens(r: Req, vocab: int | None = None) -> np.ndarray:
    if r.tokens is not None:
        return np.asarray(r.tokens, dtype=np.int64)
    return block_tokens(r.hash_ids, r.input_length, vocab, r.block)


def packed_prompt(r: Req, vocab: int | None = None) -> bytes:
    """`request_tokens(r, vocab)` packed as `pool.Tokens` packs them (4 big-endian bytes a token).
    A Mooncake prompt without a vocabulary is built in 32 bits straight away (its ids are below
    2**31), with no int64 array in between."""
    if r.tokens is not None or vocab is not None or r.block > BLOCK:
        return request_tokens(r, vocab).astype(">u4").tobytes()
    ids = np.asarray(r.hash_ids, dtype=np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= (FRESH // BLOCK)):
        raise TraceError(f"hash ids must be in 0..{FRESH // BLOCK - 1}")
    toks = (ids.astype(np.uint32)[:, None] * np.uint32(BLOCK) + _OFFSETS[:r.block]).ravel()[:r.input_length]
    return toks.astype(">u4").tobytes()


def packed_fresh(start: int, n: int, vocab: int | None = None) -> bytes:
    """`fresh_tokens(start, n, vocab)`, packed."""
    if vocab is not None:
        return fresh_tokens(start, n, vocab).astype(">u4").tobytes()
    return np.arange(FRESH + start, FRESH + start + n, dtype=">u4").tobytes()


def _int(d: dict, key: str, where: str, least: int) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        raise TraceError(f"{where}: {key} must be an integer >= {least}, got {v!r}")
    return v


def read(path: str, order: str = "file") -> list[Req]:
    """Every request of the trace at `path`, in file order or by timestamp (`order="timestamp"`;
    ties keep file order)."""
    reqs: list[Req] = []
    header = None
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read the trace {path}: {exc.strerror}") from None
    with f:
        for no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            where = f"{path}:{no}"
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(d, dict):
                raise TraceError(f"{where}: each line must be a JSON object")
            if no == 1 and d.get("format") == "prefix-trace/1":
                header = d
                continue
            if header is not None:
                reqs.append(_prefix_trace_op(d, where, reqs))
                continue
            reqs.append(_one(d, where))
    if header is not None:
        reqs = [r for r in reqs if r is not None]
    if not reqs:
        raise TraceError(f"{path}: no requests")
    if order == "timestamp":
        reqs.sort(key=lambda r: r.timestamp)
    elif order != "file":
        raise TraceError(f"unknown order {order!r} (file or timestamp)")
    return reqs


def _one(d: dict, where: str) -> Req:
    ts = d.get("timestamp", 0)
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise TraceError(f"{where}: timestamp must be a number, got {ts!r}")
    if "hash_ids" in d:
        n = _int(d, "input_length", where, 1)
        m = _int(d, "output_length", where, 1)
        ids = d["hash_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise TraceError(f"{where}: hash_ids must be a list of non-negative integers")
        if not (len(ids) - 1) * BLOCK < n <= len(ids) * BLOCK:
            raise TraceError(f"{where}: input_length {n} does not fit {len(ids)} blocks of {BLOCK}")
        return Req(float(ts), n, m, hash_ids=ids)
    key = next((k for k in ("prompt", "prompt_token_ids", "tokens") if k in d), None)
    if key is None:
        raise TraceError(f"{where}: a request needs hash_ids, or prompt token ids (prompt, prompt_token_ids or tokens)")
    toks = d[key]
    if not isinstance(toks, list) or not toks or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < FRESH for t in toks):
        raise TraceError(f"{where}: {key} must be a non-empty list of token ids in 0..{FRESH - 1}")
    m = d.get("output_length", d.get("max_tokens"))
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise TraceError(f"{where}: output_length (or max_tokens) must be an integer >= 1, got {m!r}")
    return Req(float(ts), len(toks), m, tokens=toks)


def _prefix_trace_op(d: dict, where: str, reqs: list) -> Req | None:
    op, toks = d.get("op"), d.get("tokens")
    if op not in ("lookup", "insert") or not isinstance(toks, list):
        raise TraceError(f"{where}: a prefix-trace/1 op needs op lookup|insert and tokens")
    if op == "lookup":
        return Req(float(len(reqs)), len(toks), 1, tokens=toks)
    last = reqs[-1] if reqs else None
    if last is None or last.output_length != 1 or len(toks) <= last.input_length:
        raise TraceError(f"{where}: an insert must follow its lookup and extend it")
    last.output_length = len(toks) - last.input_length
    return None


def scale(reqs: list[Req], k: int) -> list[Req]:
    """Every length divided by `k` (at least 1): a Mooncake request keeps its ids, each block then
    standing for 512/k tokens. Token traces keep their first tokens."""
    if k == 1:
        return reqs
    out = []
    for r in reqs:
        n = max(1, r.input_length // k)
        m = max(1, r.output_length // k)
        if r.hash_ids is not None:
            out.append(Req(r.timestamp, n, m, hash_ids=r.hash_ids, block=max(1, r.block // k)))
        else:
            out.append(Req(r.timestamp, n, m, tokens=r.tokens[:n]))
    return out


def pack(toks: np.ndarray) -> Tokens:
    return Tokens.from_numpy(toks)

"""`kern replay TRACE --server URL`: the replay as a check of a running `kern serve`.

The trace is scaled down (`--scale k` divides every length by k), its token ids hashed into the
server's vocabulary, and replayed model-free against the server's own sizes (its pages, host bytes,
prefill chunk, and its target's geometry); then every request is sent to the server one at a time,
asking for its output length with `ignore_eos`, and the server's hit (`cached_tokens`) and tier
(`kern.cache_tier`) must equal the replay's, request by request, and its counters (hits by tier,
parks, evictions, host evictions) must equal the replay's totals. The server must start empty.
"""

from __future__ import annotations

import json
import sys

import click
import httpx

from kern.tokens import BYTES
from replay.run import Setup, replay_engine
from replay.traces import Req, request_tokens, scale

__all__ = ["check_server"]

VOCAB = BYTES  # draw the toy's byte tokens (EOS is the id past them)
COMPARED = ("prefix_hit_tokens", "resident_hits", "resident_hit_tokens", "host_hits", "host_hit_tokens", "parks",
            "evictions", "host_evictions")


def _err(msg: str) -> int:
    click.echo(f"kern replay: {msg}", err=True)
    return 2


def check_server(reqs: list[Req], flags, config: str | None) -> int:
    """Replay `reqs` against the server at --server's sizes, send them, compare (`flags`: the command's
    `replay.flags.ReplayFlags`; `config`: `kern --config`). 0 agreed, 1 differed, 2 cannot check."""
    url = flags.server.rstrip("/")
    headers = {"Authorization": f"Bearer {flags.api_key}"} if flags.api_key else {}
    try:
        client = httpx.Client(base_url=url, headers=headers, timeout=600.0)
        stats = client.get("/stats").json()
    except (httpx.HTTPError, ValueError) as exc:
        return _err(f"cannot read {url}/stats: {exc}")
    facts, gauges, before = stats["facts"], stats["gauges"], stats["counters"]
    if gauges.get("resident_entries") or gauges.get("parked_entries") or gauges.get("running"):
        return _err(f"the server at {url} is not empty (its index holds snapshots): start a fresh one")
    setup = _setup(flags.target, config, facts)
    if isinstance(setup, str):
        return _err(setup)
    reqs = scale(reqs, flags.scale_k)
    fig = replay_engine(reqs, setup)
    got, short = _send(client, url, reqs, facts["model"])
    after = client.get("/stats").json()["counters"]
    diffs = [(i, w, g) for i, (w, g) in enumerate(zip(fig.per_request, got)) if w != g]
    served = {name: after[name] - before[name] for name in COMPARED}
    replayed = {"prefix_hit_tokens": fig.hit_tokens, "resident_hits": fig.resident_hits,
                "resident_hit_tokens": fig.resident_hit_tokens, "host_hits": fig.host_hits,
                "host_hit_tokens": fig.host_hit_tokens, "parks": fig.parks, "evictions": fig.evictions,
                "host_evictions": fig.host_evictions}
    agree = not diffs and served == replayed
    capacity = setup.capacity
    if flags.as_json:
        click.echo(json.dumps({"agree": agree, "requests": len(reqs), "capacity": capacity,
                               "host_bytes": facts["host_bytes"], "replay": replayed, "server": served,
                               "differ": [{"request": i, "replay": w, "server": g} for i, w, g in diffs[:20]],
                               "ended_early": short}))
        return 0 if agree else 1
    from tabulate import tabulate

    click.echo(f"{len(reqs)} requests (scale 1/{flags.scale_k}) against {url}: {capacity} device tokens, "
               f"{facts['host_bytes']} host bytes")
    click.echo(tabulate([[n, replayed[n], served[n], "same" if replayed[n] == served[n] else "DIFFER"]
                         for n in COMPARED], headers=["figure", "replay", "server", ""]))
    for i, w, g in diffs[:20]:
        click.echo(f"request {i}: replay (hit, tier) {w}, server {g}")
    if short:
        click.echo(f"{short} requests ended before their output length (is ignore_eos honoured?)")
    click.echo("agree" if agree else f"DISAGREE: {len(diffs)} requests differ")
    return 0 if agree else 1


def _setup(target: str | None, config: str | None, facts: dict):
    """What the replay runs against: the server's sizes and its target's geometry; or why not (a line)."""
    from manifests import derive, load
    from manifests.config import resolve
    from pool import Geometry
    from runtime.protocol import Protocol

    if target is None:
        return "--server needs --target, the target the server serves (its geometry sizes the replay)"
    try:
        m = load(resolve(target, config).manifest)
    except Exception as exc:  # a bad name or manifest: the message names it
        return f"--target {target}: {exc}"
    if derive.is_lined(m):
        return f"--target {target} is lined: the replay models paged targets (checkpoints every page)"
    if facts.get("rows", 1) != 1:
        return f"the server runs {facts['rows']} rows a step: start it with --rows 1"
    geometry = Geometry(**derive.geometry(m))
    if geometry.unit != facts["page"]:
        return f"--target {target} has pages of {geometry.unit} tokens, the server {facts['page']}"
    capacity = facts["pages"] * facts["page"]
    return Setup(geometry, capacity, facts["host_bytes"], chunk=facts["chunk"],
                 emits=Protocol(m).prefill_emits, vocab=VOCAB)


def _send(client, url: str, reqs: list[Req], model: str) -> tuple[list, int]:
    """Each request sent in turn (its output length, ignore_eos): ((cached tokens, tier) or None for a
    refusal, per request; how many ended before their output length)."""
    got: list = []
    short = 0
    with click.progressbar(reqs, label=f"sending {len(reqs)} requests to {url}", file=sys.stderr) as bar:
        for r in bar:
            ids = request_tokens(r, VOCAB).tolist()
            body = {"model": model, "prompt": ids, "max_tokens": r.output_length, "ignore_eos": True,
                    "temperature": 0}
            resp = client.post("/v1/completions", json=body)
            if resp.status_code != 200:
                got.append(None)
                continue
            d = resp.json()
            if d["usage"]["completion_tokens"] != r.output_length:
                short += 1
            got.append((d["usage"]["prompt_tokens_details"]["cached_tokens"], d["kern"]["cache_tier"]))
    return got, short

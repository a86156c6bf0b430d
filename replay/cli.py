"""`kern replay TRACE`: capacity planning without a model (replay/run.py), and `--server URL`: the
same trace, scaled down, sent to a running `kern serve`, whose hits and tiers must equal the replay's.

Exit codes: 0 done (and, with --server, agreed); 1 the server disagreed; 2 bad flags or trace.
"""

from __future__ import annotations

import json
import os
import sys
import time

import click

from replay.flags import ReplayFlags

__all__ = ["replay_command"]

GIB = 1 << 30


def _capacities(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        mult = 1
        for suffix, m in (("k", 10**3), ("m", 10**6), ("g", 10**9)):
            if part.endswith(suffix):
                part, mult = part[:-1], m
        try:
            v = float(part) * mult
        except ValueError:
            raise click.BadParameter(f"{text!r}: capacities are token counts like 16000000, 16M or 1M,4M,10M") from None
        if v < 1 or v != int(v):
            raise click.BadParameter(f"{text!r}: a capacity must be a whole number of tokens >= 1")
        out.append(int(v))
    return out


class TokenCount(click.ParamType):
    """A token count: 64000000, 64M, 64_000_000 or 0 (the suffixes of --capacity)."""

    name = "tokens"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        if str(value).strip() in ("0", "0.0"):
            return 0
        try:
            (n,) = _capacities(str(value))
        except (click.BadParameter, ValueError):
            self.fail(f"{value!r} is not a token count like 64000000 or 64M", param, ctx)
        return n


def _fail(msg: str) -> None:
    click.echo(f"kern replay: {msg}", err=True)
    sys.exit(2)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--page", default=None, type=click.IntRange(1),
              help="Tokens per page. engine: default 16. lru: the LRU's block, default a hash id's 512 tokens; "
                   "for Mooncake ids it must divide 512 (each id's block is split into pages).")
@click.option("--capacity", "capacity_text", default="16M", show_default=True,
              help="Device tier in tokens; a comma-separated list is a sweep (e.g. 1M,4M,10M,50M).")
@click.option("--host-tokens", default=None, type=TokenCount(), help="Host tier in tokens, e.g. 64M (engine policy).")
@click.option("--host-gib", default=None, type=click.FloatRange(0), help="Host tier in GiB, with --bytes-per-token.")
@click.option("--bytes-per-token", default=None, type=click.IntRange(1),
              help="KV bytes per token (for --host-gib; with --server, the target's).")
@click.option("--order", default="file", show_default=True, type=click.Choice(["file", "timestamp"]),
              help="Arrival order: the file's lines, or their timestamps.")
@click.option("--policy", default="engine", show_default=True, type=click.Choice(["engine", "lru"]),
              help="engine: the scheduler's own rules; lru: per-block LRU of the inputs only (the Mooncake paper's simulation).")
@click.option("--limit", default=None, type=click.IntRange(1), help="Replay only the first N requests.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON, one object per capacity.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Write the figures (TRACE-POLICY.json) and the plot of hit ratio by tier against capacity "
                   "(TRACE-POLICY.png) into this folder.")
@click.option("--plot", default=None, type=click.Path(dir_okay=False),
              help="Write the plot here instead (a PNG path; without --out or --plot nothing is written).")
@click.option("--server", default=None, help="Check a running kern serve at this URL against the replay instead.")
@click.option("--target", default=None, help="With --server: the target it serves (its geometry sizes the replay).")
@click.option("--scale", "scale_k", default=1, show_default=True, type=click.IntRange(1),
              help="Divide every length and capacity by k (for --server).")
@click.option("--api-key", default=None, help="With --server: its API key.")
@click.pass_context
def replay_command(ctx, **given) -> None:
    """Replay TRACE (Mooncake JSONL, or our token traces) through the pool, the index and the host tier
    and print hit figures per device capacity."""
    flags = ReplayFlags(**given)
    from replay.mooncake import known
    from replay.traces import scale

    capacities = _checked(flags)
    reqs = _requests(flags)
    if flags.server is not None and (flags.out_dir or flags.plot):
        _fail("--out and --plot draw a replay's figures; with --server there are none to draw")
    paper = known(len(reqs), sum(r.input_length for r in reqs))
    if flags.server is not None:
        from replay.server import check_server

        sys.exit(check_server(reqs, flags, ctx.obj.get("config") if isinstance(ctx.obj, dict) else None))
    k = flags.scale_k
    reqs = scale(reqs, k)
    capacities = [max(1, c // k) for c in capacities]
    bpt = flags.bytes_per_token or 1
    host_gib, host_tokens = flags.host_gib, flags.host_tokens
    host = host_tokens if host_tokens is not None else (int(host_gib * GIB) // bpt if host_gib else 0)
    host //= k
    figs = _sweep(reqs, capacities, flags.policy, flags.page, host, bpt)
    if flags.as_json:
        for f in figs:
            click.echo(json.dumps(f.as_dict()))
    else:
        click.echo(table(figs))
    _write(figs, flags.trace, flags.policy, paper, k, flags.out_dir, flags.plot)


def _checked(flags: ReplayFlags) -> list[int]:
    """The capacities --capacity names; one line and exit 2 for flags that do not go together."""
    try:
        capacities = _capacities(flags.capacity_text)
    except click.BadParameter as exc:
        _fail(f"--capacity: {exc.message}")
    if flags.host_gib is not None and flags.host_tokens is not None:
        _fail("give --host-tokens or --host-gib, not both")
    if flags.host_gib is not None and flags.bytes_per_token is None and flags.server is None:
        _fail("--host-gib needs --bytes-per-token (how many bytes one token's KV takes)")
    if flags.policy == "lru" and (flags.host_gib or flags.host_tokens):
        _fail("--policy lru models the device tier only; drop --host-tokens/--host-gib")
    return capacities


def _requests(flags: ReplayFlags) -> list:
    """The trace's requests (the first --limit); one line and exit 2 for a bad trace or --page."""
    from replay.traces import TraceError, read

    try:
        reqs = read(flags.trace, flags.order)
    except TraceError as exc:
        _fail(str(exc))
    if flags.limit:
        reqs = reqs[:flags.limit]
    if not reqs:
        _fail(f"{flags.trace}: no requests")
    page = flags.page
    if flags.policy == "lru" and page is not None:
        ids = reqs[0].hash_ids is not None
        if ids and (page > reqs[0].block or reqs[0].block % page):
            _fail(f"--policy lru --page {page}: a page must divide the trace's block of {reqs[0].block} tokens "
                  f"(a Mooncake hash id), e.g. --page {reqs[0].block} (the paper's) or 16")
    return reqs


def _sweep(reqs, capacities, policy, page, host, bpt, every: float = 10.0) -> list:
    """One replay per device capacity, with progress on stderr: a bar on a terminal; piped (a CI log), a
    line at each capacity's start and at least every `every` seconds (requests done, elapsed, left)."""
    from replay.run import replay_engine, replay_lru, setup_for

    figs = []
    bound = None
    total = len(reqs) * len(capacities)
    if sys.stderr.isatty():  # drawn about 200 times in all, not once a request (a draw costs more than a request)
        progress = click.progressbar(length=total, label=f"replaying {len(reqs)} requests", file=sys.stderr,
                                     show_pos=True, update_min_steps=max(1, total // 200))
    else:
        progress = _Lines(total, every)
    with progress as bar:
        for cap in capacities:
            if isinstance(bar, _Lines):
                bar.say(f"capacity {cap:,} tokens ({policy})")
            if policy == "lru":
                fig = replay_lru(reqs, cap, page, tick=bar.update)
            else:
                pg = page or 16
                longest = max(r.input_length + r.output_length for r in reqs)
                fig = replay_engine(reqs, setup_for(pg, cap, host, bpt, reach=longest + pg), tick=bar.update,
                                    bound=bound)
                bound = fig.bound_tokens
            figs.append(fig)
    return figs


class _Lines:
    """Progress for a pipe: plain lines on stderr, one at each `say` and one at least every `every`
    seconds of `update`s (the clock read once per 1,000 requests)."""

    def __init__(self, total: int, every: float) -> None:
        self.total, self.every, self.done = total, every, 0
        self.t0 = self.last = time.monotonic()

    def __enter__(self) -> "_Lines":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.say("done")

    def say(self, what: str) -> None:
        now = time.monotonic()
        left = (now - self.t0) / self.done * (self.total - self.done) if self.done else None
        eta = f", about {left:.0f} s left" if left is not None and self.done < self.total else ""
        click.echo(f"replay: {what}: {self.done:,}/{self.total:,} requests replayed in {now - self.t0:.0f} s{eta}",
                   err=True)
        self.last = now

    def update(self, n: int) -> None:
        before, self.done = self.done, self.done + n
        if before // 1000 != self.done // 1000 and time.monotonic() - self.last >= self.every:
            self.say("progress")


def _write(figs, trace, policy, paper, scale_k, out_dir, plot) -> None:
    """`--out DIR`: the figures as JSON and their plot beside it; `--plot PATH`: the plot alone."""
    stem = trace.rsplit("/", 1)[-1].rsplit(".", 1)[0] + f"-{policy}"
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, stem + ".json")
        with open(path, "w") as f:
            json.dump({"trace": trace, "known": paper.name if paper else None, "scale": scale_k,
                       "paper": list(paper.paper) if paper else None,
                       "figures": [x.as_dict() for x in figs]}, f, indent=1)
        click.echo(f"figures: {path}", err=True)
        plot = plot or os.path.join(out_dir, stem + ".png")
    if plot:
        from replay.plot import draw

        draw(figs, plot, trace, paper, scale_k)
        click.echo(f"hit ratio by tier against capacity: {plot}", err=True)
    elif len(figs) > 1:
        click.echo("(--out DIR writes these figures and their plot)", err=True)


def table(figs) -> str:
    from tabulate import tabulate

    rows = [
        ("requests", lambda f: f"{f.requests:,}" + (f" ({f.rejected:,} too long)" if f.rejected else "")),
        ("input tokens", lambda f: f"{f.input_tokens:,}"),
        ("hit tokens", lambda f: f"{f.hit_tokens:,}"),
        ("hit ratio", lambda f: f"{f.hit_ratio:.3f}"),
        ("resident hits (requests)", lambda f: f"{f.resident_hits:,}"),
        ("resident hits (tokens)", lambda f: f"{f.resident_hit_tokens:,}"),
        ("host hits (requests)", lambda f: f"{f.host_hits:,}"),
        ("host hits (tokens)", lambda f: f"{f.host_hit_tokens:,}"),
        ("parks", lambda f: f"{f.parks:,}"),
        ("evictions (dropped)", lambda f: f"{f.evictions:,}"),
        ("host evictions", lambda f: f"{f.host_evictions:,}"),
        ("left to compute p50", lambda f: f"{f.left_p50:,.0f}"),
        ("left to compute p90", lambda f: f"{f.left_p90:,.0f}"),
        ("left to compute p99", lambda f: f"{f.left_p99:,.0f}"),
        ("infinite-cache bound", lambda f: f"{f.bound_tokens:,} ({f.bound_ratio:.3f})"),
        ("seconds", lambda f: f"{f.seconds:.2f}"),
    ]
    head = ["policy " + figs[0].policy] + [f"{f.capacity:,} tokens" + (f" + host {f.host_tokens:,}" if f.host_tokens else "")
                                          for f in figs]
    return tabulate([[name] + [fn(f) for f in figs] for name, fn in rows], headers=head, disable_numparse=True)

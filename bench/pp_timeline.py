"""Join a pipeline's `pp item` lines (every stage's, from one log or several) into per-stage busy
time, with each stage's idle time split by its cause, and draw it.

    python bench/pp_timeline.py server.log [more.log ...] [--png timeline.png] [--window 0,50]

An item is one step's batch (a prefill chunk or a decode step) as it passes each stage; a stage is
busy with it from its `issued_us` to its `done_us`. The gaps between a stage's items are split:

- **waiting on another stage**: some item was in flight elsewhere (issued by stage 0 and not yet
  done by the last stage): the stage's next item was still upstream, or (stage 0) the head was held
  by the items downstream.
- **head between steps**: no item was in flight, but a request was (between its `admitted` and
  `finished` lines, DEBUG level): the head was collecting an answer and scheduling the next step.
- **client idle**: no item and no request in flight: the client had sent nothing. Not a pipeline
  cost. Without `admitted`/`finished` lines in the logs the last two cannot be told apart and are
  both reported as client idle (the tables say so).

Tables: per stage, its items, rows, busy ms, span (first issued to last done), the three kinds of
gap, and busy share of the time a request was in flight (busy / (span - client idle)); per stage and
program, each item's busy ms (mean, p50, max); and per item the time from stage 0's issue to the
last stage's done. The PNG has two panels: the timeline (one row per stage, items coloured by
program, the gaps shaded by cause) and each item's busy ms per stage, stacked, against the item
number. `--window A,B` keeps the items issued in ms A..B after the first (a burst up close).
"""

from __future__ import annotations

import bisect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import click

LINE = re.compile(r" pp item (.*)$")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z .* (admitted|finished) request=(\S+)")
PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@dataclass(frozen=True, slots=True)
class Item:
    stage: int
    item: int
    rows: int
    issued_us: int
    done_us: int
    program: str = ""


def parse(lines) -> list[Item]:
    """Every `pp item` line's fields; other lines are skipped."""
    out = []
    for line in lines:
        m = LINE.search(line)
        if not m:
            continue
        kv = {k: v.strip('"') for k, v in PAIR.findall(m.group(1))}
        try:
            out.append(Item(int(kv["stage"]), int(kv["item"]), int(kv["rows"]), int(kv["issued_us"]),
                            int(kv["done_us"]), kv.get("program", "")))
        except (KeyError, ValueError):
            continue
    return out


def requests(lines) -> list[tuple[int, int]]:
    """Each request's `admitted` to `finished` (us, the lines' own timestamps); one never finished
    runs to the end of the logs."""
    import datetime

    opened: dict[str, int] = {}
    out, last = [], 0
    for line in lines:
        m = STAMP.match(line)
        if not m:
            continue
        t = datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc)
        us = int(t.timestamp() * 1e6)
        last = max(last, us)
        if m.group(2) == "admitted":
            opened[m.group(3)] = us
        elif m.group(3) in opened:
            out.append((opened.pop(m.group(3)), us))
    return out + [(a, last) for a in opened.values()]


def merge(spans) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def in_flight(items: list[Item]) -> list[tuple[int, int]]:
    """When the pipeline held some item: each item's first issue to its last done, merged (us)."""
    spans: dict[int, list[int]] = {}
    for i in items:
        s = spans.setdefault(i.item, [i.issued_us, i.done_us])
        s[0], s[1] = min(s[0], i.issued_us), max(s[1], i.done_us)
    return merge(tuple(x) for x in spans.values())


def pieces(spans: list[tuple[int, int]], a: int, b: int) -> list[tuple[int, int]]:
    """The parts of [a, b) the merged intervals `spans` cover."""
    out = []
    k = max(0, bisect.bisect_right(spans, (a, a)) - 1)
    while k < len(spans) and spans[k][0] < b:
        lo, hi = max(a, spans[k][0]), min(b, spans[k][1])
        if hi > lo:
            out.append((lo, hi))
        k += 1
    return out


def covered(spans: list[tuple[int, int]], a: int, b: int) -> int:
    """How much of [a, b) the merged intervals `spans` cover (us)."""
    return sum(hi - lo for lo, hi in pieces(spans, a, b))


@dataclass(frozen=True, slots=True)
class Gap:
    """A stage's idle time between two of its items, split by cause (us)."""

    start: int
    end: int
    waiting: int  # some item in flight elsewhere
    between: int  # no item in flight, a request in flight: the head between steps
    idle: int  # nothing in flight: the client idle


def gaps(mine: list[Item], flight: list[tuple[int, int]], running: list[tuple[int, int]]) -> list[Gap]:
    """A stage's gaps between consecutive items (sorted by issue). `running`: when a request was in
    flight, merged with `flight` (so `flight` alone when the logs hold no request lines)."""
    out = []
    for prev, nxt in zip(mine, mine[1:]):
        a, b = prev.done_us, nxt.issued_us
        if b > a:
            w, r = covered(flight, a, b), covered(running, a, b)
            out.append(Gap(a, b, w, r - w, (b - a) - r))
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def summarize(items: list[Item], reqs: list[tuple[int, int]] = ()) -> tuple[list[dict], list[dict], dict]:
    """(per-stage rows, per stage-and-program rows, overall), times in ms."""
    flight = in_flight(items)
    running = merge([*flight, *reqs])
    stages = sorted({i.stage for i in items})
    rows, per_program = [], []
    for k in stages:
        mine = sorted((i for i in items if i.stage == k), key=lambda i: i.issued_us)
        busy = sum(i.done_us - i.issued_us for i in mine) / 1e3
        span = (mine[-1].done_us - mine[0].issued_us) / 1e3
        g = gaps(mine, flight, running)
        idle = sum(x.idle for x in g) / 1e3
        worked = span - idle
        row = {"stage": k, "items": len(mine), "rows": sum(i.rows for i in mine), "busy_ms": round(busy, 1),
               "span_ms": round(span, 1), "waiting_on_stages_ms": round(sum(x.waiting for x in g) / 1e3, 1)}
        if reqs:
            row["head_between_steps_ms"] = round(sum(x.between for x in g) / 1e3, 1)
            row["client_idle_ms"] = round(idle, 1)
        else:
            row["empty_ms (client idle or head between steps)"] = round(idle, 1)
        row["busy_share_of_work"] = round(busy / worked, 3) if worked > 0 else 1.0
        rows.append(row)
        for program in sorted({i.program for i in mine}):
            ms = [(i.done_us - i.issued_us) / 1e3 for i in mine if i.program == program]
            per_program.append({"stage": k, "program": program or "?", "items": len(ms),
                                "busy_ms": round(sum(ms), 1), "per_item_mean_ms": round(sum(ms) / len(ms), 3),
                                "p50_ms": round(_pct(ms, 0.5), 3), "max_ms": round(max(ms), 3)})
    by_item: dict[int, list[Item]] = {}
    for i in items:
        by_item.setdefault(i.item, []).append(i)
    whole = [i for i in by_item.values() if len(i) == len(stages)]
    lat = sorted((max(x.done_us for x in g) - min(x.issued_us for x in g)) / 1e3 for g in whole)
    overall = {"stages": len(stages), "items": len(by_item), "complete_items": len(whole),
               "requests_seen": len(reqs),
               "item_ms_p50": round(lat[len(lat) // 2], 2) if lat else None,
               "item_ms_max": round(lat[-1], 2) if lat else None}
    return rows, per_program, overall


def window(items: list[Item], text: str) -> list[Item]:
    """The items whose item number stage 0 (or the earliest stage seen) issued in ms A..B after the first."""
    try:
        a, b = (float(x) for x in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected A,B in ms since the first item, e.g. 0,50") from None
    t0 = min(i.issued_us for i in items)
    first: dict[int, int] = {}
    for i in items:
        first[i.item] = min(first.get(i.item, i.issued_us), i.issued_us)
    keep = {n for n, t in first.items() if a <= (t - t0) / 1e3 <= b}
    return [i for i in items if i.item in keep]


COLOURS = {"prefill": "#7b4ea3", "decode": "#2a9d8f"}
WAIT, BETWEEN, IDLE = "#d62728", "#f2b134", "#bbbbbb"
STAGE_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def draw(items: list[Item], path: str, reqs: list[tuple[int, int]] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(i.issued_us for i in items)
    ms = lambda us: (us - t0) / 1e3  # noqa: E731
    stages = sorted({i.stage for i in items})
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(12, 0.7 * len(stages) + 5.5),
                                 height_ratios=[0.7 * len(stages) + 0.8, 3])
    _timeline(ax, items, reqs, stages, ms)
    _busy(bx, items, stages)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _stage_gaps(mine: list[Item], flight, running, reqs, ms) -> tuple[list, list]:
    """One stage's gaps by cause, as (start ms, width ms) bars: waiting on another stage (an item in
    flight elsewhere), and (with `reqs`) the head between steps (requests running, nothing in flight)."""
    waits, betweens = [], []
    for g in gaps(mine, flight, running):
        waits += [(ms(lo), (hi - lo) / 1e3) for lo, hi in pieces(flight, g.start, g.end)]
        if reqs:
            w = pieces(flight, g.start, g.end)
            for lo, hi in pieces(running, g.start, g.end):
                # the running parts less the in-flight ones
                cur = lo
                for a, b in w:
                    if b <= cur or a >= hi:
                        continue
                    if a > cur:
                        betweens.append((ms(cur), (a - cur) / 1e3))
                    cur = max(cur, b)
                if hi > cur:
                    betweens.append((ms(cur), (hi - cur) / 1e3))
    return waits, betweens


def _timeline(ax, items: list[Item], reqs, stages: list[int], ms) -> None:
    """The timeline: items by program; each stage's gaps by cause, a thin bar through the row."""
    from matplotlib.patches import Patch

    flight = in_flight(items)
    running = merge([*flight, *reqs])
    programs = sorted({i.program for i in items})
    colour = {p: COLOURS.get(p, f"C{4 + n}") for n, p in enumerate(programs)}
    for k in stages:
        mine = sorted((i for i in items if i.stage == k), key=lambda i: i.issued_us)
        for p in programs:
            bars = [(ms(i.issued_us), max((i.done_us - i.issued_us) / 1e3, 1e-3)) for i in mine if i.program == p]
            ax.broken_barh(bars, (k - 0.35, 0.7), facecolors=colour[p])
        waits, betweens = _stage_gaps(mine, flight, running, reqs, ms)
        ax.broken_barh(waits, (k - 0.1, 0.2), facecolors=WAIT)
        ax.broken_barh(betweens, (k - 0.1, 0.2), facecolors=BETWEEN)
    idle = [(ms(b0), (a1 - b0) / 1e3) for (_, b0), (a1, _) in zip(running, running[1:]) if a1 > b0]
    ax.broken_barh(idle, (stages[0] - 0.5, len(stages)), facecolors=IDLE, alpha=0.6, zorder=0)
    ax.set_yticks(stages)
    ax.set_yticklabels([f"stage {k}" for k in stages])
    ax.set_ylim(stages[-1] + 0.5, stages[0] - 0.5)
    ax.set_xlim(0, ms(max(i.done_us for i in items)) * 1.01)
    ax.set_xlabel("ms since the first item")
    ax.set_title(f"pipeline timeline: {len({i.item for i in items})} items over {len(stages)} stages", fontsize=10)
    handles = [Patch(color=colour[p], label=f"busy: {p or '?'}") for p in programs]
    handles.append(Patch(color=WAIT, label="idle: waiting on another stage"))
    if reqs:
        handles += [Patch(color=BETWEEN, label="idle: head between steps"),
                    Patch(color=IDLE, alpha=0.6, label="client idle (nothing in flight)")]
    else:
        handles.append(Patch(color=IDLE, alpha=0.6, label="pipeline empty (client idle or head between steps)"))
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=len(handles),
              frameon=False)


def _busy(bx, items: list[Item], stages: list[int]) -> None:
    """Each item's busy time per stage, stacked (a few outliers clipped, and said so)."""
    numbers = sorted({i.item for i in items})
    at = {n: x for x, n in enumerate(numbers)}
    bottom = [0.0] * len(numbers)
    for k in stages:
        h = [0.0] * len(numbers)
        for i in items:
            if i.stage == k:
                h[at[i.item]] += (i.done_us - i.issued_us) / 1e3
        bx.bar(range(len(numbers)), h, bottom=bottom, width=1.0, color=STAGE_COLOURS[k % len(STAGE_COLOURS)],
               label=f"stage {k}", linewidth=0)
        bottom = [x + y for x, y in zip(bottom, h)]
    bx.set_xlim(-0.5, len(numbers) - 0.5)
    # a few outliers (a first call that compiles) would flatten the rest: clip them and say so
    top = max(bottom, default=0.0)
    typical = sorted(bottom)[int(0.98 * (len(bottom) - 1))] if bottom else 0.0
    ylim = min(top, max(typical * 1.5, 3 * sorted(bottom)[len(bottom) // 2])) * 1.08 if top > 0 else 1.0
    bx.set_ylim(0, ylim)
    clipped = [x for x, t in enumerate(bottom) if t > ylim]
    for x in clipped[:8]:
        bx.annotate(f"item {numbers[x]}: {bottom[x]:.0f} ms", (x, ylim), xytext=(3, -10), textcoords="offset points",
                    fontsize=7, va="top")
    if clipped:
        bx.text(0.99, 0.72, f"{len(clipped)} bar(s) clipped at {ylim:.1f} ms", transform=bx.transAxes, ha="right",
                fontsize=7)
    step = max(1, len(numbers) // 12)
    bx.set_xticks(range(0, len(numbers), step))
    bx.set_xticklabels([str(numbers[x]) for x in range(0, len(numbers), step)])
    bx.set_xlabel("item (a prefill chunk or a decode step), in issue order")
    bx.set_ylabel("busy ms, per stage")
    bx.set_title("busy time per item, stacked by stage (the tallest part is that item's slowest stage)", fontsize=10)
    bx.legend(fontsize=8, loc="upper right")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--png", default=None, help="Write the timeline and per-item busy chart here.")
@click.option("--window", "window_text", default=None, metavar="A,B",
              help="Only the items issued A..B ms after the first (to see a burst up close).")
def main(logs, png, window_text) -> None:
    """Per-stage busy time from the `pp item` lines in LOGS, each stage's idle time split into
    waiting on another stage and pipeline empty (client idle), per-item busy time per stage, and a
    PNG of both."""
    from tabulate import tabulate

    lines = [line for p in logs for line in Path(p).read_text(errors="replace").splitlines()]
    items = parse(lines)
    reqs = requests(lines)
    if not items:
        click.echo("no `pp item` lines in " + ", ".join(logs) + " (they are debug lines: serve with --log-level debug)",
                   err=True)
        sys.exit(1)
    if window_text:
        items = window(items, window_text)
        if not items:
            click.echo(f"no items issued in --window {window_text}", err=True)
            sys.exit(1)
    if window_text and reqs:
        t0, t1 = min(i.issued_us for i in items), max(i.done_us for i in items)
        reqs = [(max(a, t0), min(b, t1)) for a, b in reqs if b > t0 and a < t1]
    rows, per_program, overall = summarize(items, reqs)
    click.echo(tabulate(rows, headers="keys"))
    click.echo()
    click.echo(tabulate(per_program, headers="keys"))
    click.echo(" ".join(f"{k}={v}" for k, v in overall.items()))
    if png:
        draw(items, png, reqs)
        click.echo(f"timeline: {png}")


if __name__ == "__main__":
    main()

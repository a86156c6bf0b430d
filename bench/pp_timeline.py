"""Join a pipeline's `pp item` lines (every stage's, from one log or several) into per-stage busy and
wait times, and draw the items as a gantt chart.

    python bench/pp_timeline.py server.log [more.log ...] [--png timeline.png]

Per stage: items, rows, busy (the sum of done - issued), span (first issued to last done), wait
(span - busy: the time the stage sat idle between items) and busy share of the span; per item the
time from stage 0's issue to the last stage's done. The gantt has one row per stage and one bar per
item, labelled by item number.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import click

LINE = re.compile(r" pp item (.*)$")
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


def summarize(items: list[Item]) -> tuple[list[dict], dict]:
    """(per-stage rows, overall) with times in ms."""
    stages = sorted({i.stage for i in items})
    rows = []
    for k in stages:
        mine = sorted((i for i in items if i.stage == k), key=lambda i: i.issued_us)
        busy = sum(i.done_us - i.issued_us for i in mine) / 1e3
        span = (mine[-1].done_us - mine[0].issued_us) / 1e3
        rows.append({"stage": k, "items": len(mine), "rows": sum(i.rows for i in mine), "busy_ms": round(busy, 1),
                     "span_ms": round(span, 1), "wait_ms": round(span - busy, 1),
                     "busy_share": round(busy / span, 3) if span > 0 else 1.0})
    by_item: dict[int, list[Item]] = {}
    for i in items:
        by_item.setdefault(i.item, []).append(i)
    whole = [i for i in by_item.values() if len(i) == len(stages)]
    lat = sorted((max(x.done_us for x in g) - min(x.issued_us for x in g)) / 1e3 for g in whole)
    overall = {"stages": len(stages), "items": len(by_item), "complete_items": len(whole),
               "item_ms_p50": round(lat[len(lat) // 2], 2) if lat else None,
               "item_ms_max": round(lat[-1], 2) if lat else None}
    return rows, overall


def gantt(items: list[Item], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(i.issued_us for i in items)
    stages = sorted({i.stage for i in items})
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(stages)))
    for i in items:
        x = (i.issued_us - t0) / 1e3
        w = max((i.done_us - i.issued_us) / 1e3, 1e-3)
        ax.broken_barh([(x, w)], (i.stage - 0.4, 0.8), facecolors=f"C{i.item % 10}")
        if len(items) <= 200:
            ax.text(x + w / 2, i.stage, str(i.item), ha="center", va="center", fontsize=6)
    ax.set_yticks(stages)
    ax.set_yticklabels([f"stage {k}" for k in stages])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first item")
    ax.set_title("pipeline items per stage")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--png", default=None, help="Write the gantt chart here.")
def main(logs, png) -> None:
    """Per-stage busy and wait times from the `pp item` lines in LOGS (and a gantt PNG)."""
    from tabulate import tabulate

    items = parse(line for p in logs for line in Path(p).read_text(errors="replace").splitlines())
    if not items:
        click.echo("no `pp item` lines in " + ", ".join(logs), err=True)
        sys.exit(1)
    rows, overall = summarize(items)
    click.echo(tabulate(rows, headers="keys"))
    click.echo(" ".join(f"{k}={v}" for k, v in overall.items()))
    if png:
        gantt(items, png)
        click.echo(f"gantt: {png}")


if __name__ == "__main__":
    main()

"""`kern replay`'s plot: hit ratio by tier (device, host) stacked against device capacity.

One bar per capacity on a log axis, the device tier's hits below and the host tier's above, each
bar labelled with its total; the infinite-cache bound dashed; the Mooncake paper's points (Fig. 9)
when the trace is one of its two (`replay.mooncake`). The y axis starts at 0 and ends at 1 or the
first tenth above everything drawn, so a 0.3% change looks like one.
"""

from __future__ import annotations

import math

__all__ = ["draw", "y_top"]


def _tokens(n: float) -> str:
    for div, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if n >= div:
            v = n / div
            return f"{v:.0f}{suffix}" if v == int(v) else f"{v:.3g}{suffix}"
    return f"{n:.0f}"


def y_top(values) -> float:
    """The y axis's top: the first tenth above the highest value plus a margin, at most 1."""
    return min(1.0, max(0.1, math.ceil((max(values, default=0.0) + 0.04) * 10) / 10))


def draw(figs, path: str, title: str, paper=None, scale: int = 1) -> None:
    """Write the plot of `figs` (one `replay.run.Figures` per capacity) to `path` (PNG).
    `paper`: a `replay.mooncake.Known` whose points are drawn (capacities divided by `scale`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = sorted(figs, key=lambda f: f.capacity)
    xs = [f.capacity for f in figs]
    dev = [f.resident_hit_tokens / f.input_tokens if f.input_tokens else 0.0 for f in figs]
    host = [f.host_hit_tokens / f.input_tokens if f.input_tokens else 0.0 for f in figs]
    bound = figs[0].bound_ratio
    pts = [(c / scale, r) for c, r in paper.paper] if paper is not None else []

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    # bars a fixed fraction of a decade wide, whatever the capacities
    lo, hi = [x / 1.25 for x in xs], [x * 1.25 for x in xs]
    ax.bar(lo, dev, width=[h - l for l, h in zip(lo, hi)], align="edge", color="#3b75af",
           label="device tier hits")
    if any(host):
        ax.bar(lo, host, bottom=dev, width=[h - l for l, h in zip(lo, hi)], align="edge", color="#ef8636",
               label="host tier hits (woken)")
    top = y_top(dev + [d + h for d, h in zip(dev, host)] + [bound] + [r for _, r in pts])
    for x, d, h in zip(xs, dev, host):
        # the total inside the bar's top (above it when the bar is too short to hold it)
        inside = d + h > 0.08 * top
        ax.annotate(f"{d + h:.3f}", (x, d + h), textcoords="offset points", xytext=(0, -3 if inside else 3),
                    ha="center", va="top" if inside else "bottom", fontsize=8, fontweight="bold",
                    color="white" if inside else "black")
        if h and d > 0.12 * top:  # and the device tier's part inside its own segment
            ax.annotate(f"{d:.3f}", (x, d / 2), ha="center", va="center", fontsize=7, color="white")
    ax.axhline(bound, color="grey", linestyle="--", linewidth=1,
               label=f"infinite cache (never evicts): {bound:.3f}")
    if pts:
        above = max(r for _, r in pts) > bound + 0.005
        # the paper simulated its own trace; the ids as released give a lower never-evicts bound (conversation:
        # 0.37 against the paper's 0.40), so its points can stand above our infinite-cache line
        ax.plot([c for c, _ in pts], [r for _, r in pts], color="black", marker="D", markersize=5, linewidth=1,
                label="the paper's LRU (Mooncake FAST'25, Fig. 9)" + (
                    ";\nabove the dashed line: the paper's trace, not the ids as released" if above else ""))
    _axes(ax, xs, pts, lo, hi, top)
    f0 = figs[0]
    what = f"policy {f0.policy}, page {f0.page}"
    if f0.host_tokens:
        what += f", host tier {_tokens(f0.host_tokens)} tokens"
    name = paper.name if paper is not None else title.rsplit("/", 1)[-1]
    ax.set_title(f"{name}: {f0.requests:,} requests, {f0.input_tokens:,} input tokens\n{what}", fontsize=9)
    # below the axes, where it covers no bar
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _axes(ax, xs: list[int], pts: list, lo: list[float], hi: list[float], top: float) -> None:
    """The axes: capacities on a log scale, ticked at each one replayed and each of the paper's points;
    hit ratios from 0 to `top`."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log")
    ticks = sorted(set(xs) | {c for c, _ in pts})
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([_tokens(t) for t in ticks])
    ax.set_xlim(min(lo + [c / 1.5 for c, _ in pts]), max(hi + [c * 1.5 for c, _ in pts]))
    ax.set_ylim(0, top)
    ax.set_xlabel("device capacity (tokens, log scale)")
    ax.set_ylabel("hit ratio (hit tokens / input tokens)")
    ax.grid(axis="y", alpha=0.3)

"""Run by hand: two `e2e` gates at once, round after round; every round both must pass.

    python bench/double_gate.py [--rounds 20] [--targets ...] [--max-tokens N] [--out DIR] [-- extra e2e args]

Each round starts two gates side by side (ports picked by the servers, `--port 0`; their own `--out`)
and waits for both. A round passes when both exit 0. Prints one line per round and the tally; exits 0
only when every round passed. On a 2-core machine this is the "no false failures" bar: a good commit
passes 20 rounds out of 20.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent


@click.command(context_settings={"help_option_names": ["-h", "--help"], "ignore_unknown_options": True})
@click.option("--rounds", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--targets", default="", help="Target names for both gates (space or comma separated; default: all).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default="results/double", show_default=True)
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def main(rounds, targets, max_tokens, out, extra) -> None:
    """Two gates at once, `--rounds` times; exit 0 only if every gate of every round passed."""
    passed = 0
    for n in range(1, rounds + 1):
        t0 = time.monotonic()
        procs = []
        for g in ("a", "b"):
            cmd = [sys.executable, "-m", "e2e.cli", "--backend", "cpu", "--port", "0", "--max-tokens", str(max_tokens),
                   "--out", str(Path(out) / f"round{n}{g}")]
            if targets:
                cmd += ["--targets", *targets.replace(",", " ").split()]
            cmd += list(extra)
            log = (Path(out) / f"round{n}{g}.log")
            log.parent.mkdir(parents=True, exist_ok=True)
            procs.append((g, log, subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)))
        codes = {g: p.wait() for g, _, p in procs}
        ok = all(c == 0 for c in codes.values())
        passed += ok
        click.echo(f"round {n}: {'pass' if ok else 'FAIL'} (exit codes {codes['a']}, {codes['b']}; "
                   f"{time.monotonic() - t0:.0f}s)" + ("" if ok else f"; logs {', '.join(str(lg) for _, lg, _ in procs)}"))
    click.echo(f"{passed}/{rounds} rounds passed, two gates at once")
    sys.exit(0 if passed == rounds else 1)


if __name__ == "__main__":
    main()

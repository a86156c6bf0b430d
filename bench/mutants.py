"""Plant each mutant of the catalogue in a temporary copy of the repository and gate it: the kill rate.

    python bench/mutants.py [--only NAME ...] [--jobs N] [--max-tokens M] [--backend cpu|gpu] [--list]
                            [--require-killed] [--repeat N]

For each mutant (bench/mutant_catalogue.py): copy the checkout (numba caches included, so only what the
mutant touches recompiles), replace its snippet (it must match exactly once, else the mutant is
*stale*), regenerate the manifests when a kernel changed (so the pinned sha256 is not what catches
it), then run `e2e` on the mutant's targets and checks. Exit 1 from the gate kills the mutant; 0 is a
survivor; anything else is an *error* (the gate could not judge it). Prints one line per mutant, then
the table and the kill rate: killed ÷ (catalogue − equivalent − stale). With `--require-killed` the
exit status is 1 unless every mutant run was killed (CI runs three this way). A mutant of GPU-only code
(the pinned staging ring, the landing buffer, CUDA graphs: its `backend` is gpu) is gated only with
`--backend gpu` on a GPU machine; otherwise it is reported `gpu-only`, outside the rate.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.mutant_catalogue import CATALOGUE, Mutant  # noqa: E402

IGNORE = shutil.ignore_patterns(".git", "results", ".pytest_cache", "*.egg-info", ".hypothesis", ".whl")


def apply(root: Path, m: Mutant) -> str | None:
    """Plant `m` under `root`; None, or why it is stale."""
    path = root / m.path
    if not path.is_file():
        return f"{m.path} is gone"
    text = path.read_text()
    n = text.count(m.find)
    if n != 1:
        return f"its snippet matches {n} times in {m.path}"
    path.write_text(text.replace(m.find, m.replace))
    return None


def gate(m: Mutant, max_tokens: int, timeout: float, backend: str = "cpu") -> tuple[str, str, float]:
    """(result, detail, seconds) for one mutant: killed, survived, stale, error or equivalent."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(ROOT, root, ignore=IGNORE)
        stale = apply(root, m)
        if stale is not None:
            return "stale", stale, time.monotonic() - t0
        path = os.environ.get("PYTHONPATH")  # the copy first; what the caller put on the path after it
        env = dict(os.environ, PYTHONPATH=str(root) + (os.pathsep + path if path else ""))
        if m.kernel:
            gen = subprocess.run([sys.executable, "-m", "kern.cli", "gen", "--out", "manifests"], cwd=root,
                                 env=env, capture_output=True, text=True)
            if gen.returncode != 0:
                return "error", f"kern gen failed: {gen.stderr.strip()[-300:]}", time.monotonic() - t0
        tokens = max(max_tokens, m.max_tokens or 0)
        cmd = [sys.executable, "-m", "e2e.cli", "--backend", backend, "--port", "0", "--max-tokens", str(tokens),
               "--out", str(Path(tmp) / "results"), "--targets", *m.targets, "--scenarios", *m.checks]
        try:
            p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "error", f"the gate ran past {timeout:.0f}s", time.monotonic() - t0
        failed = [ln.strip() for ln in p.stdout.splitlines() if "[FAIL]" in ln]
        dt = time.monotonic() - t0
        if p.returncode == 1:
            return "killed", (failed[0][:160] if failed else "exit 1"), dt
        if p.returncode == 0:  # what the named checks said (a check not judged passes the gate too)
            said = [ln.strip() for ln in p.stdout.splitlines() if any(f"{c}:" in ln for c in m.checks)]
            return "survived", "every named check passed" + "".join(f"; {ln[:300]}" for ln in said), dt
        return "error", f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}", dt


def _folded(got: list[tuple[str, str, float]]) -> tuple[str, str, float]:
    """One mutant's runs as one result: killed when every run was, else the first run that was not;
    with several runs the detail leads with how many killed it."""
    worst = next((g for g in got if g[0] != "killed"), got[0])
    if len(got) == 1:
        return worst
    killed = sum(g[0] == "killed" for g in got)
    return worst[0], f"{killed}/{len(got)} runs killed; {worst[1]}", sum(g[2] for g in got)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--only", multiple=True, help="Mutant names (space or comma separated; default: the whole catalogue).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Mutants gated at once.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--timeout", type=float, default=1800.0, show_default=True, help="Seconds per mutant's gate.")
@click.option("--backend", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True,
              help="The gate's backend. GPU-only mutants (the catalogue's backend gpu) are gated only with gpu; "
                   "with cpu they are reported `gpu-only` and left out of the kill rate.")
@click.option("--list", "list_", is_flag=True, help="List the catalogue and exit.")
@click.option("--require-killed", is_flag=True, help="Exit 1 unless every mutant run was killed.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Gate each mutant this many times (its own copy each time); it counts as killed only when "
                   "every run killed it, and its detail says how many did.")
def main(only, jobs, max_tokens, timeout, backend, list_, require_killed, repeat) -> None:
    """Gate every mutant of the catalogue; print the kill rate and the survivors."""
    names = [n for v in only for n in v.replace(",", " ").split()]
    known = {m.name: m for m in CATALOGUE}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.UsageError(f"unknown mutant(s) {', '.join(unknown)}")
    chosen = [known[n] for n in names] if names else list(CATALOGUE)
    if list_:
        click.echo(tabulate([(m.name, m.path, ", ".join(m.checks), ", ".join(m.targets)) for m in chosen],
                            headers=["mutant", "file", "checks", "targets"]))
        return
    results: dict[str, tuple[str, str, float]] = {}
    todo = []
    for m in chosen:
        if m.equivalent:
            results[m.name] = ("equivalent", m.equivalent, 0.0)
        elif m.backend == "gpu" and backend != "gpu":
            results[m.name] = ("gpu-only", "its code runs on the GPU backend only: --backend gpu on a GPU machine", 0.0)
        else:
            todo.append(m)
    click.echo(f"{len(todo)} mutant(s) to gate {repeat} time(s) each, {jobs} at a time", err=True)
    runs: dict[str, list[tuple[str, str, float]]] = {m.name: [] for m in todo}
    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        futures = {ex.submit(gate, m, max_tokens, timeout, backend): m for m in todo for _ in range(repeat)}
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            m = futures[fut]
            runs[m.name].append(fut.result())
            r, detail, dt = runs[m.name][-1]
            click.echo(f"[{i}/{len(futures)}] {m.name}: {r} ({dt:.0f}s) {detail}", err=True)
    for name, got in runs.items():
        results[name] = _folded(got)
    rows = [(m.name, results[m.name][0], ", ".join(m.checks), results[m.name][1][:100]) for m in chosen]
    click.echo(tabulate(rows, headers=["mutant", "result", "checks", "detail"]))
    counts = {k: sum(r[0] == k for r in results.values())
              for k in ("killed", "survived", "error", "stale", "equivalent", "gpu-only")}
    judged = len(chosen) - counts["equivalent"] - counts["stale"] - counts["gpu-only"]
    rate = counts["killed"] / judged if judged else 0.0
    click.echo(f"\nkill rate: {counts['killed']}/{judged} = {100 * rate:.1f}% (killed ÷ non-equivalent, "
               f"{counts['stale']} stale, {counts['equivalent']} equivalent, {counts['error']} error"
               + (f", {counts['gpu-only']} gpu-only not gated" if counts["gpu-only"] else "") + ")")
    survivors = [m for m in chosen if results[m.name][0] in ("survived", "error")]
    for m in survivors:
        click.echo(f"survivor: {m.name} ({results[m.name][0]}): {m.origin}")
    for m in chosen:
        if results[m.name][0] == "equivalent":
            click.echo(f"equivalent: {m.name}: {m.equivalent}")
    if require_killed and counts["killed"] != len(todo):
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Independent gate runs, one per cell (an engine, its version, a seed), through one executor seam.

A campaign is a TOML file of cells, each one `e2e` run with its own arguments and environment (a
vLLM version is its venv: ``env = { VENV = "/work/vllm-venv-0.31" }``) and, where it has one, the exit
code it should end with (0 a clean engine, 1 a planted bug caught)::

    [[cell]]
    name = "vllm-0.32"
    args = ["--engine", "vllm"]
    env = { VENV = "/work/vllm-venv" }
    expect = 0

`e2e-campaign CELLS.toml --out DIR` runs the cells as local processes (`--jobs N` at once); with
`--ray ADDRESS` each cell is a task of that Ray cluster instead (one CPU each), for campaigns of
versions, `--explore` seeds and mutants that outgrow one machine. Either way `run_cell` is what runs
a cell, wherever it runs: `e2e` in a process of its own, its results under ``DIR/<cell>``, and a
`Result` read back from its report.json files. The table at the end has one row per cell; the exit
code is 0 when every cell ended as expected (docs/exit-codes.md), 1 otherwise.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import click
from tabulate import tabulate

__all__ = ["Cell", "Local", "Ray", "Result", "load_cells", "main", "run_cell"]


@dataclass(frozen=True)
class Cell:
    name: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    expect: int | None = None  # the exit code it should end with (None: recorded, not judged)


@dataclass
class Result:
    cell: str
    code: int
    wall_s: float
    host: str  # where it ran: the host name and process id, and the Ray node where it was a Ray task
    checks: dict[str, int] = field(default_factory=dict)  # passed, failed, errors, skipped
    first_failure: str = ""
    failed: list[str] = field(default_factory=list)  # "target: check" of each check that failed or erred
    tail: str = ""  # the last lines e2e printed, for a cell that did not end as expected

    def met(self, expect: int | None) -> bool:
        return expect is None or self.code == expect


def load_cells(path: Path) -> list[Cell]:
    """The cells of a campaign file; `click.UsageError` naming what is wrong with one."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.UsageError(f"{path}: {exc}") from None
    cells, seen = [], set()
    for i, c in enumerate(raw.get("cell") or []):
        where = f"{path}: cell {i + 1}"
        name, args, env, expect = c.get("name"), c.get("args", []), c.get("env", {}), c.get("expect")
        if not isinstance(name, str) or not name or "/" in name or name in seen:
            raise click.UsageError(f"{where}: `name` must be a unique string without '/', got {name!r}")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args) or "--out" in args:
            raise click.UsageError(f"{where} ({name}): `args` must be a list of strings without --out "
                                   "(each cell's results go under the campaign's --out)")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise click.UsageError(f"{where} ({name}): `env` must be a table of strings")
        if expect is not None and (not isinstance(expect, int) or isinstance(expect, bool)):
            raise click.UsageError(f"{where} ({name}): `expect` must be an exit code, got {expect!r}")
        seen.add(name)
        cells.append(Cell(name, tuple(args), tuple(sorted(env.items())), expect))
    if not cells:
        raise click.UsageError(f"{path}: no [[cell]] tables")
    return cells


def _read(out: Path) -> tuple[dict[str, int], str, list[str]]:
    counts = dict.fromkeys(("passed", "failed", "errors", "skipped"), 0)
    first, failed = "", []
    for report in sorted(out.glob("*/report.json")):
        for c in json.loads(report.read_text()).get("checks", []):
            kind = ("passed" if c.get("ok") is True else "failed" if c.get("ok") is False
                    else "skipped" if str(c.get("note", "")).startswith("skipped") else "errors")
            if c.get("name") == "error" and c.get("ok") is False:
                kind = "errors"
            counts[kind] += 1
            if kind in ("failed", "errors"):
                failed.append(f"{report.parent.name}: {c.get('name')}")
                first = first or f"{report.parent.name}: {c.get('name')}: {str(c.get('note', ''))[:160]}"
    return counts, first, failed


def run_cell(cell: Cell, out_root: str, cwd: str, where: str = "") -> Result:
    """One cell's `e2e`, in a process of its own, with the cell's environment over this one's."""
    out = Path(out_root) / cell.name
    env = {**os.environ, **dict(cell.env)}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "e2e.cli", *cell.args, "--out", str(out)], cwd=cwd, env=env,
                       capture_output=True, text=True)
    wall = time.monotonic() - t0
    counts, first, failed = _read(out) if out.is_dir() else ({}, "", [])
    tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-6:])
    host = f"{socket.gethostname()} pid {os.getpid()}" + (f" {where}" if where else "")
    return Result(cell.name, p.returncode, round(wall, 1), host, counts, first, failed, tail)


class Local:
    """Cells as local processes, `jobs` at once."""

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = jobs

    def run(self, cells: list[Cell], out_root: str, cwd: str) -> Iterator[Result]:
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as ex:
            futs = [ex.submit(run_cell, c, out_root, cwd) for c in cells]
            for f in concurrent.futures.as_completed(futs):
                yield f.result()

    def close(self) -> None:
        pass


def _ray_task(cell: Cell, out_root: str, cwd: str) -> Result:
    import ray

    return run_cell(cell, out_root, cwd, f"(Ray node {ray.get_runtime_context().get_node_id()[:12]})")


class Ray:
    """Cells as tasks of the Ray cluster at `address` (one CPU each); the cluster's workers must see
    the same checkout and --out (one machine, or a shared file system)."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise click.UsageError("--ray needs Ray: pip install ray") from None
        try:
            ray.init(address=address, log_to_driver=False, logging_level="WARNING")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise click.UsageError(f"--ray {address}: no Ray cluster joined ({type(exc).__name__}: {exc})") from None
        self.ray = ray
        self.task = ray.remote(num_cpus=1, max_retries=0)(_ray_task)

    def run(self, cells: list[Cell], out_root: str, cwd: str) -> Iterator[Result]:
        pending = [self.task.remote(c, out_root, cwd) for c in cells]
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            yield self.ray.get(done[0])

    def close(self) -> None:
        self.ray.shutdown()


def campaign(cells: list[Cell], executor, out: Path, say: Callable[[str], None] = print) -> list[Result]:
    """Every cell through `executor`, each result said as it lands; the results in the cells' order."""
    out.mkdir(parents=True, exist_ok=True)
    got = {}
    try:
        for r in executor.run(cells, str(out.resolve()), os.getcwd()):
            got[r.cell] = r
            say(f"  {r.cell}: exit {r.code} in {r.wall_s:.0f}s on {r.host} ({len(got)}/{len(cells)})")
    finally:
        executor.close()
    results = [got[c.name] for c in cells]
    (out / "campaign.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    return results


def table(cells: Iterable[Cell], results: list[Result]) -> str:
    rows = []
    for c, r in zip(cells, results):
        k = r.checks
        rows.append((c.name, r.code, "-" if c.expect is None else c.expect, "yes" if r.met(c.expect) else "NO",
                     r.wall_s, f"{k.get('passed', 0)}/{k.get('failed', 0)}/{k.get('errors', 0)}/{k.get('skipped', 0)}",
                     r.first_failure[:70]))
    return tabulate(rows, headers=("cell", "exit", "expected", "as expected", "wall s", "pass/fail/err/skip",
                                   "first failure"), tablefmt="github")


def rounds_of(cells: list[Cell], rounds: int) -> list[Cell]:
    """Each cell `rounds` times, round after round (every cell once, then again), as runs named
    `<cell>.r<k>`; one round is the cells themselves."""
    if rounds == 1:
        return list(cells)
    return [Cell(f"{c.name}.r{k}", c.args, c.env, c.expect) for k in range(1, rounds + 1) for c in cells]


def rounds_table(cells: Iterable[Cell], results: list[Result], top: int = 4) -> str:
    """One row per cell over its rounds: how many runs ended as expected, their wall times, and the
    checks that failed most often over all of them ("target: check" and how many times)."""
    rows = []
    for c in cells:
        runs = [r for r in results if r.cell.startswith(f"{c.name}.r") and r.cell[len(c.name) + 2:].isdigit()]
        met = sum(r.met(c.expect) for r in runs)
        walls = [r.wall_s for r in runs]
        counts: dict[str, int] = {}
        for r in runs:
            for f in r.failed:
                counts[f] = counts.get(f, 0) + 1
        most = ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top])
        rows.append((c.name, "-" if c.expect is None else c.expect, len(runs), f"{met} of {len(runs)}",
                     f"{min(walls):.0f}-{max(walls):.0f}" if walls else "-", most or "-"))
    return tabulate(rows, headers=("cell", "expected", "runs", "as expected", "wall s", "failed most (times)"),
                    tablefmt="github")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("cells_file", metavar="CELLS.toml", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("campaign"), show_default=True,
              help="Each cell's e2e results under OUT/<cell>; campaign.json beside them.")
@click.option("--jobs", type=click.IntRange(1), default=1, show_default=True, help="Local cells at once.")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Run each cell as a task of this Ray cluster (e.g. 127.0.0.1:6379) instead of locally.")
@click.option("--rounds", type=click.IntRange(1), default=1, show_default=True,
              help="Run every cell this many times, round after round (each run under OUT/<cell>.r<k>); "
                   "the table then has a row per cell: runs as expected, wall times, the checks failed most.")
@click.option("--only", default="", metavar="NAMES",
              help="Run only these cells (names, space or comma separated); an unknown name is an error.")
def main(cells_file: Path, out: Path, jobs: int, ray_address: str | None, rounds: int, only: str) -> None:
    """Gate runs of a campaign file's cells (engine, version, seed), locally or over a Ray cluster; one
    row per cell. Exit 0 when every cell ended with the exit code it expects, 1 otherwise."""
    cells = load_cells(cells_file)
    if only:
        names = only.replace(",", " ").split()
        unknown = sorted(set(names) - {c.name for c in cells})
        if unknown:
            raise click.UsageError(f"--only: no cell named {', '.join(unknown)} in {cells_file} "
                                   f"(its cells: {', '.join(c.name for c in cells)})")
        cells = [c for c in cells if c.name in names]
    runs = rounds_of(cells, rounds)
    executor = Ray(ray_address) if ray_address else Local(jobs)
    where = f"the Ray cluster at {ray_address}" if ray_address else f"{jobs} local process(es) at once"
    print(f"e2e-campaign: {len(cells)} cell(s) from {cells_file}" + (f", {rounds} rounds" if rounds > 1 else "")
          + f" on {where}; results under {out}")
    results = campaign(runs, executor, out)
    print(table(runs, results) if rounds == 1 else rounds_table(cells, results))
    missed = [f"{c.name}: exit {r.code}, expected {c.expect}\n{r.tail}" for c, r in zip(runs, results)
              if not r.met(c.expect)]
    for m in missed:
        print(m, file=sys.stderr)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()

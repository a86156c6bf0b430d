"""`e2e --processes N`: the gate's targets split over N gate processes, so its clients and oracles do not
all share one interpreter lock.

On a GPU machine the gate process is what bounds the gate: on an H100 (16 host CPUs) all ten targets
took 45-48 s, and the gate process spent 49.6 s of CPU in 47.6 s of wall time (its clients, oracles and
in-process `kern run`, on one GIL), while the eight hosts that run the servers spent 98 s among them.
Here the parent splits the targets into N groups of about equal cost (`split`) and runs each group
as a child `e2e` (`child_argv`: the same flags, its own targets, `--out OUT/shards/<i>`, its share of
the hosts). It then reads back each target's report.json and links `OUT/<target>` to the child's
folder, so every path a report names still resolves. The summary, the JUnit file and the exit code
are the parent's, over every target, as one process would have written them. A target whose child
wrote no report (it died, or refused its flags) gets an `error` check naming the child's exit code
and log: never a dropped target.

Only the plain gate of this checkout's kern splits: `--engine`, `--engine-url`, `--kern`, `--explore`,
`--shrink` and `--replay-case` run in one process (`why_single`), and so does a fixed `--port`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from e2e.config import GateTarget
from e2e.flags import GateFlags

__all__ = ["GPU_PROCESSES", "OWN", "PASSED", "SINGLE", "SWITCHES", "child_argv", "processes_default", "run_shards",
           "split", "why_single"]

PASSED = {"config": "--config", "scenarios": "--scenarios", "reference": "--reference",
          "max_tokens": "--max-tokens", "backend": "--backend", "capacity": "--capacity",
          "server_flags": "--server-flags", "load_timeout": "--load-timeout", "jobs": "--jobs", "seed": "--seed"}
"""The `GateFlags` fields a child gets as they were given (its option)."""

SWITCHES = {"no_reference": ("--no-reference", None), "zygote": ("--zygote", "--no-zygote"),
            "reference_worker": ("--reference-worker", "--reference-in-process"),
            "at_once": ("--sessions-at-once", "--sessions-in-turn")}
"""The on/off flags a child gets as they were given: (on, off); None where the flag has no off."""

OWN = ("targets", "out", "hosts", "processes", "junit_path")
"""The fields each child gets its own value of (its targets, its folder, its hosts, one process, no JUnit)."""

SINGLE = {"engine_cmd": "--engine", "engine_url": "--engine-url", "kern": "--kern", "explore_n": "--explore",
          "shrink_": "--shrink", "replay_path": "--replay-case", "capabilities": "--capabilities",
          "port": "--port"}
"""The fields that keep the gate in one process when set (their flag, for the message)."""


def why_single(f: GateFlags) -> str | None:
    """None when the gate may split over processes, else the flag that keeps it in one."""
    for name, flag in SINGLE.items():
        if getattr(f, name) not in (None, False, 0):
            return f"{flag} runs the gate in one process"
    return None


def split(chosen: list[GateTarget], n: int) -> list[list[GateTarget]]:
    """`chosen` in at most `n` non-empty groups of about equal cost (the largest first onto the lightest
    group); a pipeline target costs one more for each stage past the first. Each group keeps the order
    the targets were chosen in."""
    n = max(1, min(n, len(chosen)))
    groups: list[list[int]] = [[] for _ in range(n)]
    load = [0.0] * n
    order = sorted(range(len(chosen)), key=lambda i: -_cost(chosen[i]))
    for i in order:
        g = min(range(n), key=lambda k: (load[k], k))
        groups[g].append(i)
        load[g] += _cost(chosen[i])
    return [[chosen[i] for i in sorted(g)] for g in groups if g]


def _cost(t: GateTarget) -> float:
    return 0.0 if t.skipped else float(t.stages)


def child_argv(f: GateFlags, targets: list[str], out: Path, hosts: int | None) -> list[str]:
    """The command line of one child gate: every flag of `f` as given, but its own targets, folder and
    hosts, one process and no JUnit file."""
    argv = [sys.executable, "-m", "e2e.cli"]
    for name, flag in PASSED.items():
        value = getattr(f, name)
        if isinstance(value, tuple):  # a multiple option (--scenarios): each word as given
            argv += [f"{flag}={v}" for v in value]
        elif value is not None and value != "":
            argv += [f"{flag}={value}"]
    for name, (on, off) in SWITCHES.items():
        value = getattr(f, name)
        if value is True:
            argv.append(on)
        elif value is False and off is not None:
            argv.append(off)
    argv += [f"--targets={t}" for t in targets] + ["--out", str(out), "--processes", "1"]
    if hosts is not None:
        argv += ["--hosts", str(hosts)]
    return argv


def run_shards(f: GateFlags, groups: list[list[GateTarget]], out: Path, hosts: int | None,
               say: Callable[[str], None]) -> list[dict]:
    """Run each group as a child gate at once and wait for all; every target's report, in the order of
    `groups` flattened (a child's log: OUT/shards/<i>/gate.log)."""
    out.mkdir(parents=True, exist_ok=True)
    each = None if hosts is None else max(1, hosts // len(groups)) if hosts else 0
    procs = []
    for i, group in enumerate(groups):
        folder = out / "shards" / str(i)
        folder.mkdir(parents=True, exist_ok=True)
        names = [t.name for t in group]
        log = open(folder / "gate.log", "w")
        argv = child_argv(f, names, folder, each)
        procs.append((i, group, folder, log, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                              start_new_session=False), time.monotonic()))
        say(f"e2e: gate process {i} ({', '.join(names)}) started; its log: {folder / 'gate.log'}")
    reports: dict[str, dict] = {}
    try:
        for i, group, folder, log, proc, began in procs:
            code = proc.wait()
            log.close()
            say(f"e2e: gate process {i} ended with exit {code} in {time.monotonic() - began:.1f} s")
            for t in group:
                reports[t.name] = _report_of(t, folder, code)
                _link(out / t.name, folder / t.name)
    except BaseException:
        for _, _, _, log, proc, _ in procs:
            if proc.poll() is None:
                proc.terminate()  # a child stops every server it started on SIGTERM (e2e/cli.py)
        for _, _, _, log, proc, _ in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        raise
    return [reports[t.name] for group in groups for t in group]


def _report_of(t: GateTarget, folder: Path, code: int) -> dict:
    path = folder / t.name / "report.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        note = (f"its gate process exited {code} without a readable report ({type(exc).__name__}: {exc}); "
                f"its log: {folder / 'gate.log'}")
        return {"target": t.name, "skipped": None, "facts": {}, "counters": {}, "wall_s": 0.0,
                "checks": [{"name": "error", "ok": False, "note": note, "error": True}]}


def _link(at: Path, to: Path) -> None:
    """`at` a symlink to `to` (relative, so the results folder can move), replacing what was there."""
    if at.is_symlink() or at.is_file():
        at.unlink()
    elif at.is_dir():
        import shutil

        shutil.rmtree(at)
    if to.exists():
        os.symlink(os.path.relpath(to, at.parent), at)


def processes_default(f: GateFlags, gpu: Callable[[], bool]) -> int:
    """`--processes 0`: `GPU_PROCESSES` on a GPU machine of at least 16 cores, else 1."""
    if (os.cpu_count() or 1) < 16 or f.backend == "cpu" or not gpu():
        return 1
    return GPU_PROCESSES


GPU_PROCESSES = 1
"""`--processes`' default on a GPU machine of 16 cores or more (measured: docs/results-measured.md)."""

"""A server's threads by the CPU they took (Linux's /proc): which one is the bound under load.

    before = thread_cpu(pid); ...load...; print(busiest(before, thread_cpu(pid), wall))
"""

from __future__ import annotations

import os

__all__ = ["busiest", "thread_cpu"]


def thread_cpu(pid: int) -> dict[tuple[str, int, str], float]:
    """CPU seconds (user + system) of each thread of process `pid` and of its children, keyed by
    (process, thread id, thread name): the process "front end" for `pid` and its children after the
    first, "core" for its first child (with --frontend-process: the engine core), from Linux's /proc;
    empty elsewhere."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        kids = []
    got = {}
    for p, role in [(pid, "front end"), *((k, "core" if i == 0 else "front end") for i, k in enumerate(kids))]:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/stat") as f:
                    stat = f.read()
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat.rsplit(")", 1)[1].split()
                got[(role, int(tid), name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, ValueError, IndexError):
                pass
    return got


def busiest(before: dict, after: dict, wall: float, n: int = 4) -> str:
    """The `n` threads that took the most CPU between two `thread_cpu` readings, each as a share of
    `wall` (a thread at 100% is a bound: one interpreter's thread does not go faster)."""
    used = sorted(((after[k] - before.get(k, 0.0), k) for k in after), reverse=True)[:n]
    return ", ".join(f"{role} {name} {s / wall:.0%}" for s, (role, _, name) in used if s > 0)

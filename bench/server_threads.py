"""A server's processes and threads by the CPU they took (Linux's /proc): which one is the bound under load.

    before = thread_cpu(pid); ...load...; print(busiest(before, thread_cpu(pid), wall))

Process `pid` and its children after the first are its front ends; its first child (with
--frontend-process) is the engine core.
"""

from __future__ import annotations

import os

__all__ = ["busiest", "children", "cpu_s", "thread_cpu"]


def children(pid: int) -> list[int]:
    """Process `pid`'s children in the order it started them (none where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(k) for k in f.read().split()]
    except OSError:
        return []


def _stat(path: str) -> tuple[str, float]:
    """(name, CPU seconds user + system) from a /proc stat file; ("", 0.0) where it cannot be read."""
    try:
        with open(path) as f:
            stat = f.read()
        fields = stat.rsplit(")", 1)[1].split()
        return stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return "", 0.0


def _roles(pid: int) -> list[tuple[int, str]]:
    return [(pid, "front end"), *((k, "core" if i == 0 else "front end") for i, k in enumerate(children(pid)))]


def cpu_s(pid: int) -> tuple[float, float]:
    """(CPU seconds, user + system) of the front ends and of the engine core now; zeros elsewhere."""
    got = {"front end": 0.0, "core": 0.0}
    for p, role in _roles(pid):
        got[role] += _stat(f"/proc/{p}/stat")[1]
    return got["front end"], got["core"]


def thread_cpu(pid: int) -> dict[tuple[str, int, str], float]:
    """CPU seconds (user + system) of each thread of the server's processes, keyed by (process's role,
    thread id, thread name); empty elsewhere."""
    got = {}
    for p, role in _roles(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            name, cpu = _stat(f"/proc/{p}/task/{tid}/stat")
            if name:
                got[(role, int(tid), name)] = cpu
    return got


def busiest(before: dict, after: dict, wall: float, n: int = 4) -> str:
    """The `n` threads that took the most CPU between two `thread_cpu` readings, each as a share of
    `wall` (a thread at 100% is a bound: one interpreter's thread does not go faster)."""
    used = sorted(((after[k] - before.get(k, 0.0), k) for k in after), reverse=True)[:n]
    return ", ".join(f"{role} {name} {s / wall:.0%}" for s, (role, _, name) in used if s > 0)

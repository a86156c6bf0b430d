"""The gate's hosts (`oracle/host.py`): a few warm processes that run its servers as threads.

On a GPU each process makes its own CUDA context and the driver makes them one at a time, so a gate
whose every server, `kern test` and `kern run` is a process of its own (sixty-odd) waits on the
driver. `Hosts(n, ...)` starts `n` host processes at once (each makes its one context and, on the
CPU, runs each warm target once) and `spawn` hands each command to the least loaded host, as
a `Child` that answers like the zygote's (`e2e/zygote.py`): its signals go through the host, and it
has no process group of its own (`Child.hosted`).

A staged target's server starts stage processes of its own, so the gate forks those from the zygote
instead (`e2e/cli.py`). If a host dies, its commands are reported killed (-9) and new ones go to the
others; when none is left, `spawn` raises `ZygoteGone` (the session reports a server that could not
start).

The seam: `Hosts` is one of `e2e.spawn`'s spawners (`Hosts.start`), and the only code that starts
`kern host` processes. A host process patches `threading.Thread.start` (every thread a command
starts runs in that command's context: `serve.common.hosted.inherit_context`) and `sys.stdout`/`sys.stderr`
(each command's output to its own log) process-wide: in the host process, never in the gate's. A
gate without hosts (`--hosts 0`, the CPU's default) runs none of it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from e2e.spawn import kern_args
from e2e.zygote import Child, Zygote, ZygoteGone

__all__ = ["Host", "Hosts"]


class Host(Zygote):
    """One `python -m kern.cli host` process (`kern host`), spoken to as a zygote is."""

    hosted = True
    how = " (a thread of one of the gate's hosts)"
    command = ("kern.cli", "host")

    def close(self) -> None:
        """Close its stdin and wait until it says every command has ended (its "bye"), not for the
        process to be gone: on a GPU the driver then tears its CUDA context down, about 0.3 s a
        process and one process at a time, and no command of the gate's is left in it to wait for."""
        self.hang_up()
        with self.cond:
            said = self.cond.wait_for(lambda: self.usage_self or self.gone, 15)
        if not said:
            self.proc.kill()
        threading.Thread(target=self.proc.wait, name="host-reaper", daemon=True).start()


class Hosts:
    """`n` hosts started at once; `spawn` picks the one whose running commands weigh least. An
    `e2e.spawn.Spawner` (`start`): the one way the gate runs a command in a host's thread."""

    hosted = True
    how = Host.how

    def __init__(self, n: int, env: dict[str, str], backend: str, config: Path | None = None,
                 warm: list[str] | tuple[str, ...] = (), log_dir: Path | None = None, ready_timeout: float = 600.0):
        """Back once the first host is ready (or every one failed): the gate's first session starts
        then, and the others join `hosts` as each warms (on a GPU the driver makes their contexts one
        at a time: four took 2.0-4.4 s, the first ready well before the last)."""
        if n < 1:
            raise ValueError(f"hosts: {n} must be at least 1")
        self.logs: list[Path] = []
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            self.logs = [log_dir / f"host-{i}.log" for i in range(n)]
        self.lock = threading.Lock()
        self.joined = threading.Condition(self.lock)  # a host ready or failed
        self.weights: dict[Host, dict[int, int]] = {}  # per host, its running commands' weights
        self.hosts: list[Host] = []  # the ready ones, in the order they became ready
        self.errors: list[str] = []
        self.asked = n
        self.all_warm_s: float | None = None  # when the last one was ready (or failed)
        self.closing = False
        self.dropped = 0  # ready only after close: closed at once
        t0 = time.monotonic()
        self.starters = [threading.Thread(target=self._start, args=(i, env, backend, config, warm, ready_timeout, t0),
                                          name=f"host-start-{i}", daemon=True) for i in range(n)]
        for t in self.starters:
            t.start()
        with self.joined:
            self.joined.wait_for(lambda: self.hosts or not self.starting())
            if not self.hosts:
                raise ZygoteGone("; ".join(self.errors) or "no host started")
        self.warm_s = round(time.monotonic() - t0, 2)

    def _start(self, i: int, env, backend: str, config, warm, ready_timeout: float, t0: float) -> None:
        err = open(self.logs[i], "ab") if self.logs else None
        try:
            host = Host(env, config, warm, ready_timeout, args=["--backend", backend], stderr=err)
            host.log = self.logs[i] if self.logs else None
        except Exception as exc:  # ZygoteGone, OSError, or anything else: this one failed, the others go on
            host, failed = None, str(exc) or type(exc).__name__
        finally:
            if err is not None:
                err.close()
        late = None
        with self.joined:
            if host is None:
                self.errors.append(failed)
            elif self.closing:  # the gate ended while this one warmed: it takes no command
                late = host
                self.dropped += 1
            else:
                self.hosts.append(host)
            if not self.starting():
                self.all_warm_s = round(time.monotonic() - t0, 2)
            self.joined.notify_all()
        if late is not None:
            late.close()

    def wait_all(self, timeout: float | None = None) -> bool:
        """Wait until no host is still warming; True if none is."""
        with self.joined:
            return self.joined.wait_for(lambda: not self.starting(), timeout)

    def starting(self) -> int:
        """Hosts neither ready nor failed yet (under `lock`)."""
        return self.asked - len(self.hosts) - len(self.errors) - self.dropped

    def load(self, host: Host) -> int:
        """The weight of the commands `host` runs now."""
        held = self.weights.setdefault(host, {})
        for pid in [p for p in held if host.exit_code(p) is not None]:
            del held[pid]
        return sum(held.values())

    def spawn(self, argv: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 60.0,
              weight: int = 1) -> Child:
        """Run `kern ARGV` on the host whose running commands weigh least, its output appended to
        `log`. A command on the gate's critical path (a target's default session) weighs more, so the
        others go elsewhere while it runs."""
        while True:
            with self.lock:
                alive = [h for h in self.hosts if not h.gone]
                if not alive and self.starting():
                    self.joined.wait()  # the ready ones died: the next to warm takes it
                    continue
                if not alive:
                    raise ZygoteGone("every host has exited")
                host = min(alive, key=self.load)
                try:
                    child = host.spawn(argv, log, env, timeout)
                except ZygoteGone:
                    if not host.gone:
                        raise
                    continue  # that host died just now: the next one
                self.weights.setdefault(host, {})[child.pid] = weight
                return child

    def start(self, cmd: list[str], log: Path, env: dict[str, str] | None = None, weight: int = 1) -> Child:
        """The `e2e.spawn.Spawner` seam: `cmd` is this checkout's `kern` (`own_kern()` and its arguments)."""
        return self.spawn(kern_args(cmd), log, env=env, weight=weight)

    def slowest(self) -> str:
        """The last host ready so far, its warm by part: "imports 1.2, device 0.9, targets 2.1 s"."""
        with self.lock:
            h = max(self.hosts, key=lambda h: h.warm_s or 0.0)
        parts = [f"{k.removesuffix('_s')} {v:.1f}" for k, v in h.warm_split.items()]
        return ", ".join(parts) + " s" if parts else ""

    def __len__(self) -> int:
        return len(self.hosts)

    def close(self) -> None:
        """Every host told to end at once; back when each has said every command of its has ended (a
        host still warming is closed as soon as it is ready)."""
        with self.lock:
            self.closing = True
            hosts = list(self.hosts)
        for h in hosts:
            h.hang_up()
        for h in hosts:
            h.close()
        for t in self.starters:
            t.join()

    def cpu_s(self) -> float | None:
        """CPU seconds (user + sys) the hosts spent, all their commands together, once closed."""
        seen = [sum(h.usage_self["cpu_s"]) for h in self.hosts if "cpu_s" in h.usage_self]
        return round(sum(seen), 1) if seen else None

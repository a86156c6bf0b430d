"""What the gate starts its servers from: the zygote (a warm parent it forks them from), the hosts (warm
processes that serve several targets' servers as threads), or fresh processes (`start_spawners`)."""

from __future__ import annotations


import concurrent.futures
import time
from pathlib import Path
from typing import Callable

import click

from e2e.config import GateTarget
from e2e.gate import Options
from e2e.spawn import gate_env

def start_zygote(cfg: Path, chosen: list[GateTarget], backend: str, say: Callable[[str], None] = click.echo,
                 progress=None):
    """The warm parent the servers are forked from (`e2e/zygote.py`); None (fresh processes) if it
    cannot start. On the CPU it runs each target's kernels once first; elsewhere it only imports."""
    from e2e.zygote import Zygote, ZygoteGone

    on_cpu = on_the_cpu(backend)
    warm = [t.name for t in chosen if not t.skipped and t.config in (None, cfg)] if on_cpu else []
    t0 = time.monotonic()
    if progress is not None:
        progress.busy("zygote", "importing the server" + (f", then running each of {len(warm)} target(s)' kernels "
                                "once (numba compiles them on a fresh clone and caches them)" if warm else ""))
    try:
        z = Zygote(gate_env(), cfg, warm, gpu_imports=not on_cpu,
                   on_progress=None if progress is None else lambda what: progress.busy("zygote", what))
    except (ZygoteGone, OSError) as exc:
        click.echo(f"e2e: no zygote ({exc}); each server starts as a fresh process", err=True)
        return None
    finally:
        if progress is not None:
            progress.done("zygote")
    gpu = f"; GPU imports: {z.gpu_imports}" if z.gpu_imports else ""
    say(f"zygote: warm in {time.monotonic() - t0:.1f}s ({len(warm)} target(s)' kernels run once{gpu})")
    return z


WORKER_CORES = 8  # --reference-worker by default from this many cores on
REFERENCE_WORKERS = 4  # a target's reference worker processes at most (a quarter of the cores, at least one)


def reference_workers(flag: bool | None, cores: int) -> int:
    """Each target's reference worker processes (0: in the gate's process): by default none below
    WORKER_CORES cores; else a quarter of the cores, 1 to REFERENCE_WORKERS (oracle/reference.py's
    `Workers`: calls routed by their prompt's start)."""
    if flag is False or (flag is None and cores < WORKER_CORES):
        return 0
    return max(1, min(REFERENCE_WORKERS, cores // 4))


GPU_HOSTS = 8  # --hosts on a GPU: processes (CUDA contexts) the gate's single-process servers share
HOSTS_PER_TARGET = 4  # ... at most this many per target gated: one target on an H200 machine, toy-paged's gate
# 7.3 s with 4 hosts against 8.6 s with 8 (the driver makes their contexts one at a time) and 7.6 s with 2


def default_hosts(on_cpu: bool, chosen: list[GateTarget]) -> int:
    """--hosts when not given: none on the CPU; on a GPU GPU_HOSTS, or HOSTS_PER_TARGET per target gated
    where that is fewer."""
    if on_cpu:
        return 0
    live = sum(1 for t in chosen if not t.skipped)
    return max(1, min(GPU_HOSTS, HOSTS_PER_TARGET * live))


def start_hosts(n: int, cfg: Path, chosen: list[GateTarget], on_cpu: bool, out: Path,
                check: concurrent.futures.Future | None = None, say: Callable[[str], None] = click.echo, progress=None):
    """`n` warm hosts (`e2e/hosts.py`) for the single-process targets' servers, `kern test` and
    `kern run`; None (the zygote, else fresh processes) if none can start (said, unless `check`
    says why: no device)."""
    from e2e.hosts import Hosts
    from e2e.zygote import ZygoteGone

    warm = [t.name for t in chosen if not t.skipped and t.stages <= 1 and t.config in (None, cfg)]
    t0 = time.monotonic()
    if progress is not None:
        progress.busy("hosts", f"starting {n} warm host(s): imports, the device, each of {len(warm)} target(s)' "
                               "kernels once (compiled on a fresh clone, cached after)")
    try:
        h = Hosts(n, gate_env(), "cpu" if on_cpu else "gpu", cfg, warm, log_dir=out / "hosts")
    except (ZygoteGone, OSError, ValueError) as exc:
        if check is None or check.result() is None:
            click.echo(f"e2e: no hosts ({exc}); each server is a process of its own", err=True)
        return None
    finally:
        if progress is not None:
            progress.done("hosts")
    for e in h.errors:
        click.echo(f"e2e: a host did not start: {e}", err=True)
    split = h.slowest()
    more = f" of {h.asked}" if len(h) < h.asked else ""
    which = "the first" if more else "the last"
    say(f"hosts: {len(h)}{more} warm in {time.monotonic() - t0:.1f}s ({'cpu' if on_cpu else 'gpu'}; "
               f"{len(warm)} target(s) run once in each{f'; {which}: ' + split if split else ''}"
               f"{'; the others join as they warm' if more else ''}); their own logs under {out / 'hosts'}")
    return h


def on_the_cpu(backend: str) -> bool:
    """Whether `backend` runs on the CPU here (`auto` without a GPU does)."""
    return backend == "cpu" or (backend == "auto" and no_gpu() is not None)


def no_gpu() -> str | None:
    """Why `--backend gpu` cannot run here (no cupy, no device), else None."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a cupy that cannot find its CUDA libraries
        return f"--backend gpu: cupy is not usable ({type(exc).__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"--backend gpu: no GPU ({type(exc).__name__}: {exc})"
    return None if n > 0 else "--backend gpu: no GPU"


def start_spawners(opts: Options, cfg: Path, chosen: list[GateTarget], backend: str, zygote: bool,
                   hosts: int | None, check: concurrent.futures.Future | None = None) -> None:
    """The hosts (`--hosts`) and the zygote (a staged target's servers, or everything without hosts),
    started at once. `check`, if given, says (its result not None) that the backend cannot run here:
    then a host's failure to start says nothing of its own and no zygote stands in for the hosts."""
    on_cpu = on_the_cpu(backend)
    n = hosts if hosts is not None else default_hosts(on_cpu, chosen)
    staged = any(t.stages > 1 and not t.skipped for t in chosen)
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        h = ex.submit(start_hosts, n, cfg, chosen, on_cpu, opts.out, check, opts.say, opts.progress) if n else None
        z = (ex.submit(start_zygote, cfg, chosen, backend, opts.say, opts.progress)
             if zygote and (staged or not n) else None)
        opts.hosts = h.result() if h is not None else None
        opts.zygote = z.result() if z is not None else None
    if check is not None and check.result() is not None:
        return
    if zygote and opts.zygote is None and opts.hosts is None and n:  # no hosts after all: the zygote
        opts.zygote = start_zygote(cfg, chosen, backend, opts.say, opts.progress)


def close_spawners(opts: Options) -> None:
    """Close the hosts and the zygote the gate started (each waits for what it still runs to end)."""
    for spawner in (opts.hosts, opts.zygote):
        if spawner is not None:
            spawner.close()


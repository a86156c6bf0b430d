"""The `e2e` command: every target of a config through `kern test` and the server (SPEC §10).

Exit codes: 0 every gated check passed; 1 a gated check failed (a server that fails to load is the
commit's failure); 2 usage or config error (an unknown target or scenario name included); 125
nothing could run for a reason outside the commit (every target skipped: a port in use, no GPU or
no cupy for ``--backend gpu``), so ``git bisect run e2e ...`` skips untestable commits; 130 when
interrupted. Ctrl-C or SIGTERM stops every server the gate started before it exits.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import resource
import shlex
import signal
import sys
import time
from pathlib import Path

import click

from e2e.config import ConfigError, GateTarget, load_targets
from e2e.engine import DEFAULT_TARGETS, PRESETS, Engine, EngineError
from e2e.running import running_engine
from e2e.vllm_preset import missing as vllm_missing
from verdicts.gate import EXIT_NOTHING_RAN
from e2e.driver import SESSIONS, _names, _skipped, engine_of, gate_all
from e2e.flags import GateFlags
from e2e.gate import Options
from e2e.shrinking import replay_case, shrink_failures
from e2e.spawners import (GPU_HOSTS, HOSTS_PER_TARGET, REFERENCE_WORKERS, WORKER_CORES, close_spawners, no_gpu,
                           reference_workers, start_spawners)
from e2e.progress import Progress
from e2e.report import commit, junit, write_report, write_summary
from e2e.scenarios import CHECKS
from e2e.session import STARTED, stop_all
from e2e.stages import record as record_stages
from manifests.config import PACKAGED, PACKAGED_PP
from oracle.reference import PACKAGED_MODEL, Reference, ReferenceError
from oracle.version import option as version_option

__all__ = ["main"]

EXIT_USAGE = 2
GREEDY = ("--targets", "--scenarios")


def _greedy(argv: list[str]) -> list[str]:
    """Let ``--targets a b`` and ``--scenarios x y`` take several words, as the Rust gate's nargs did."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        w = argv[i]
        out.append(w)
        i += 1
        if w in GREEDY:
            words = []
            while i < len(argv) and not argv[i].startswith("-"):
                words.append(argv[i])
                i += 1
            out.append(",".join(words))
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("e2e")
@click.option("--config", type=click.Path(dir_okay=False), default=None,
              help="TOML with [targets.NAME] tables (default: nearest kern.toml, else the packaged toy config).")
@click.option("--targets", multiple=True, help="Target names (space or comma separated; default: all).")
@click.option("--scenarios", multiple=True, help=f"Check names to report (default: all): {', '.join(CHECKS)}.")
@click.option("--reference", type=click.Path(dir_okay=False), default=str(PACKAGED_MODEL), show_default=True,
              help="model.py with generate() and ACCEPT_PCT: the exact oracle.")
@click.option("--no-reference", is_flag=True, help="No reference: gate against `kern run` (cached in oracle.json).")
@click.option("--out", type=click.Path(file_okay=False), default="results", show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--backend", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True)
@click.option("--port", type=click.IntRange(0, 65530), default=0, show_default=True,
              help="0: each server binds a free port and the gate reads it from its `serving` line; else sessions "
                   f"use port, +1, ... +{SESSIONS - 1} (target i of --jobs adds {SESSIONS}i).")
@click.option("--capacity", type=click.IntRange(min=1), default=16384, show_default=True,
              help="--capacity of the sessions that do not size their own pool.")
@click.option("--server-flags", default="",
              help="Extra server flags for every session (session flags override); under --engine (vllm included) "
                   "appended to the engine's command.")
@click.option("--kern", default=None, help="Command that runs another kern (the Rust one): its `serve`, `test` and `run` "
              "are gated, its log lines read where it has no /stats (default: this Python's kern.cli).")
@click.option("--engine", "engine_cmd", default=None,
              help="Gate another serving engine under docs/engine-contract.md: its command with {port} where the port "
                   "goes, e.g. \"python my_server.py --port {port}\", or a preset: " + ", ".join(PRESETS)
                   + " (examples/vllm_toy). Checks needing a capability it lacks are reported `skipped (engine lacks X)`.")
@click.option("--engine-url", "engine_url", default=None,
              help="Gate an engine already running at this URL (e.g. http://127.0.0.1:8000): nothing is started or "
                   "stopped; one target (--targets, else the one whose model GET /v1/models lists). Sessions that "
                   "need a fresh engine run after its declared cache reset (facts.reset), else are reported "
                   "`skipped (needs a fresh engine)`.")
@click.option("--capabilities", default=None,
              help="The --engine's capabilities, comma separated (default: its GET /kern/capabilities; without one, "
                   "the contract's core only; over a preset such as vllm, in place of what its config declares).")
@click.option("--load-timeout", type=float, default=600.0, show_default=True)
@click.option("--jobs", type=click.IntRange(min=0), default=0, show_default=True,
              help="Targets gated at once (each in its own server processes; progress lines carry the target); "
                   "0: one per CPU core.")
@click.option("--zygote/--no-zygote", default=True, show_default=True,
              help="Fork our own kern's servers from one warm process (imports and CPU kernels loaded once); "
                   "--no-zygote starts each as a fresh process. Ignored with --kern.")
@click.option("--hosts", type=click.IntRange(min=0), default=None,
              help="Run our own kern's single-process servers, `kern test` and `kern run` as threads of N warm "
                   "host processes (one device context each) instead of a process each (0: off). Default: "
                   f"{GPU_HOSTS} on a GPU ({HOSTS_PER_TARGET} per target where fewer: the driver makes one CUDA "
                   "context at a time, about 0.2 s each), 0 on the CPU (forked from the zygote). Ignored with --kern.")
@click.option("--reference-worker/--reference-in-process", "reference_worker", default=None,
              help="Run each target's reference arithmetic (model.py) in processes of its own, off the gate's "
                   f"GIL: a quarter of the cores, 1 to {REFERENCE_WORKERS} per target, each call sent to the one its "
                   "prompt's first 16 tokens pick. Default: in workers on a machine of "
                   f"{WORKER_CORES} or more cores, else in process.")
@click.option("--sessions-at-once/--sessions-in-turn", "at_once", default=True, show_default=True,
              help="Run a target's independent sessions at once, each in its own server, every session's "
                   "server started as soon as the first one's facts are known; --sessions-in-turn runs "
                   "them one after another.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), default=None, help="Write JUnit XML here.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="What the generated sessions (params, explore) draw from; the notes print it, and the "
                   "same seed replays the same requests exactly.")
@click.option("--shrink", "shrink_", is_flag=True,
              help="After a failing gate, replay each failed target's first failed check's session and shrink it "
                   "(fewer requests, fewer and shorter stop strings, shorter prompts, fewer tokens) to a case that "
                   "still fails: OUT/<target>/case_<target>_<session>.json and a pytest file beside it.")
@click.option("--replay-case", "replay_path", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Replay one case file (what --shrink wrote) on a fresh server; exit 0 pass, 1 fail.")
@click.option("--explore", "explore_n", type=click.IntRange(min=1), default=None,
              help="Gate N fresh random seeds, each its own run under OUT/seed-S, of the generated sessions' "
                   "checks (or --scenarios); prints each seed and the command that replays a failing one.")
def cli(**given) -> None:
    """Gate every target of a config through the server, token-exact against an oracle.

    Our own kern by default; another kern with --kern; any serving engine that meets
    docs/engine-contract.md with --engine."""
    f = GateFlags(**given)
    t0 = time.monotonic()
    if f.replay_path is not None:  # the case names its engine; --engine and --capabilities stand in for its
        sys.exit(replay_case(f.replay_path, f.backend, Path(f.out), f.engine_cmd, f.capabilities))
    if f.engine_url is not None:
        engine, targets = running_engine(f.engine_url, f.engine_cmd, f.kern, f.capabilities, f.config, f.targets,
                                         f.server_flags, f.shrink_)
        f = dataclasses.replace(f, targets=targets, at_once=False)  # one engine, one cache: a session's hits
        # must not be another's evictions
        config = f.config
    else:
        config, engine = _engine_option(f.engine_cmd, f.capabilities, f.kern, f.config)
    try:
        shlex.split(f.server_flags)
    except ValueError as exc:
        raise click.UsageError(f"--server-flags {f.server_flags!r}: {exc}") from None
    wanted = _wanted(f)
    try:
        cfg, chosen = load_targets(config, _names(f.targets) or _engine_default(config, engine))
        if engine is None and f.capabilities is not None:  # a preset's declaration, replaced (a control run)
            chosen = [dataclasses.replace(t, capabilities=tuple(_names((f.capabilities,)))) if t.engine else t
                      for t in chosen]
        for t in chosen:
            if t.engine is not None and engine is None:
                Engine.foreign(t.engine, t.capabilities)  # a bad declaration is a usage error, before anything starts
    except (ConfigError, EngineError) as exc:
        raise click.UsageError(str(exc)) from None
    ref = None if f.no_reference else Path(f.reference)
    if ref is not None:
        try:
            Reference(ref, {})
        except ReferenceError as exc:
            raise click.UsageError(str(exc)) from None
    progress = Progress(suppress=lambda: STARTED.closed).start()  # a stopped gate's lanes print no FAIL lines
    workers = f.reference_worker
    opts = Options(cfg.resolve(), Path(f.out), f.max_tokens, f.backend, f.port, f.server_flags, f.capacity,
                   f.load_timeout, shlex.split(f.kern) if f.kern else None, at_once=f.at_once,
                   reference_worker=reference_workers(workers, os.cpu_count() or 1),
                   started=t0, seed=f.seed, engine=engine, progress=progress)
    names = [t.name for t in chosen]
    under = (engine.shown if engine else f.kern if f.kern else "the config's, per target"
             if any(t.engine for t in chosen) else "kern (this checkout)")
    opts.say(f"e2e: {len(chosen)} target(s) ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}) from {cfg}; "
             f"backend {f.backend}; engine: {under}; results under {f.out}")
    try:
        _gate(cfg, chosen, opts, ref, wanted, f, t0)
    finally:
        progress.stop()


def _wanted(f: GateFlags) -> set[str] | None:
    """The checks asked for (None: all), `--explore`'s by default; an unknown one is a usage error."""
    wanted = set(_names(f.scenarios)) or None
    if f.explore_n is not None and wanted is None:
        wanted = set(SEEDED)
    unknown = sorted((wanted or set()) - set(CHECKS))
    if unknown:
        raise click.UsageError(f"unknown scenario(s) {', '.join(unknown)} (checks: {', '.join(CHECKS)})")
    return wanted


def _gate(cfg, chosen, opts: Options, ref: Path | None, wanted: set[str] | None, f: GateFlags, t0: float) -> None:
    """The gate itself, once its options are made: spawners, targets, the summary; exits with its code."""
    backend, jobs, explore_n, max_tokens, junit_path = f.backend, f.jobs, f.explore_n, f.max_tokens, f.junit_path
    why = None
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        # --backend gpu: is there one? Asked (cupy's import, the driver's start: about 1 s on an H200)
        # while the hosts warm, which fail on their own without one and are then closed unheard
        check = ex.submit(no_gpu) if backend == "gpu" else None
        if opts.kern is None and not all(engine_of(t, opts).external for t in chosen if not t.skipped):
            start_spawners(opts, cfg, chosen, backend, f.zygote, f.hosts, check)
        why = check.result() if check is not None else None
    if why is not None:
        close_spawners(opts)
        reports = [_skipped(t, why, opts.say) for t in chosen]
    elif explore_n is not None:
        try:
            code = explore(chosen, opts, ref, wanted, jobs or max(1, os.cpu_count() or 1), explore_n, f.targets)
        except BaseException:
            stop_all()
            raise
        finally:
            close_spawners(opts)
        sys.exit(code)
    else:
        try:
            reports = gate_all(chosen, opts, ref, wanted, jobs or max(1, os.cpu_count() or 1))
            if f.shrink_:
                cases = shrink_failures(reports, opts, opts.say)
                for r in reports:
                    if r["target"] in cases:
                        r["case"] = str(cases[r["target"]])
        except BaseException:
            stop_all()  # before the zygote goes: its children die with it, and the lanes would stop them unseen
            raise
        finally:
            close_spawners(opts)
        record_stages(chosen, reports, wanted, opts.say)
    for r in reports:
        write_report(opts.out, r)
    meta = {"commit": commit(), "backend": backend, "max_tokens": max_tokens, "wall_s": time.monotonic() - t0,
            "out": str(opts.out), "seed": opts.seed, "engine": opts.engine.shown if opts.engine else None,
            "config": None if cfg.resolve() in (PACKAGED.resolve(), PACKAGED_PP.resolve()) else str(cfg),
            "zygote_warm_s": getattr(opts.zygote, "warm_s", None), "gate_cpu_s": _own_cpu(),
            "hosts": len(opts.hosts) if opts.hosts is not None else 0, "hosts_warm_s": getattr(opts.hosts, "warm_s", None),
            "hosts_all_warm_s": getattr(opts.hosts, "all_warm_s", None),
            "hosts_cpu_s": opts.hosts.cpu_s() if opts.hosts is not None else None}
    table, code = write_summary(opts.out, reports, meta)
    opts.progress.stop()
    click.echo("\n" + table)
    if junit_path:
        Path(junit_path).parent.mkdir(parents=True, exist_ok=True)
        Path(junit_path).write_text(junit(reports))
    sys.exit(code)


SEEDED = ("params_stop", "params_ids", "params_prompt", "policy_params", "metrics_params", "explore_equals_run",
          "policy_explore", "metrics_explore",
          # the workloads from the wild (e2e/scenarios/blocks.py, cold_burst.py, tight.py, freed.py)
          "blocks_moved", "blocks_reparented", "block_edges", "stop_after_hit", "cold_prefix_burst", "eviction_proven",
          "refcount_stress", "preempt_recompute", "policy_blocks", "policy_tight", "freed_while_read")
"""The checks whose requests the seed draws: what `--explore` gates by default."""


def explore(chosen: list[GateTarget], opts: Options, ref: Path | None, wanted: set[str] | None, jobs: int, n: int,
            targets) -> int:
    """`--explore N`: N fresh seeds, each a gate of its own under OUT/seed-S; the exit code of the worst."""
    import random

    seeds = random.SystemRandom().sample(range(1, 1 << 31), n)
    failed = []
    for i, seed in enumerate(seeds, 1):
        o = dataclasses.replace(opts, seed=seed, out=opts.out / f"seed-{seed}")
        opts.say(f"== explore {i}/{n}: seed {seed}")
        reports = gate_all(chosen, o, ref, wanted, jobs)
        for r in reports:
            write_report(o.out, r)
        _, code = write_summary(o.out, reports, {"commit": commit(), "backend": opts.backend, "seed": seed,
                                                 "max_tokens": opts.max_tokens})
        bad = [f"{r['target']}: {c['name']}" for r in reports for c in r.get("checks", []) if c["ok"] is False]
        names = ",".join(_names(targets)) if targets else ",".join(t.name for t in chosen)
        replay = (f"e2e --seed {seed} --backend {opts.backend} --targets {names} --scenarios {' '.join(sorted(wanted))}"
                  if wanted else f"e2e --seed {seed}")
        opts.say(f"   seed {seed}: " + ("pass" if code == 0 else f"FAIL ({', '.join(bad)[:300]}); replay: {replay}"))
        if code != 0:
            failed.append(seed)
    opts.say(f"explore: {n - len(failed)}/{n} seeds pass" + (f"; failing seeds: {failed}" if failed else ""))
    return 1 if failed else 0


def _engine_default(config: str | None, engine: Engine | None) -> list[str] | None:
    """``e2e --engine CMD`` without ``--targets``: `DEFAULT_TARGETS`, those the config has (None: every target)."""
    if engine is None:
        return None
    _, every = load_targets(config, None)
    names = {t.name for t in every}
    return [n for n in DEFAULT_TARGETS if n in names] or None


def _engine_option(engine_cmd: str | None, capabilities: str | None, kern: str | None,
                   config: str | None) -> tuple[str | None, Engine | None]:
    """``--engine`` and ``--capabilities``: (the config to read, the engine for every target or None).
    A preset name stands for its config, whose targets carry their engine's command."""
    if engine_cmd is None:
        if capabilities is not None:
            raise click.UsageError("--capabilities declares an --engine's: give --engine too")
        return config, None
    if kern is not None:
        raise click.UsageError("--engine and --kern: give one (--kern gates another kern, --engine any engine)")
    if engine_cmd in PRESETS:  # --capabilities, if given, replaces what its config declares (below)
        gone = vllm_missing() if engine_cmd == "vllm" and config is None else None
        if gone is not None:  # nothing could run: one line, exit 125 (docs/exit-codes.md)
            click.echo(f"e2e: {gone}", err=True)
            sys.exit(EXIT_NOTHING_RAN)
        return config or str(PRESETS[engine_cmd]), None
    try:
        return config, Engine.foreign(engine_cmd, _names((capabilities,)) if capabilities is not None else None)
    except EngineError as exc:
        raise click.UsageError(str(exc)) from None


def _own_cpu() -> float:
    """This process's CPU seconds so far (user + sys; its children not included)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return round(use.ru_utime + use.ru_stime, 1)


EXIT_INTERRUPTED = 130


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    """`e2e`: Ctrl-C or SIGTERM stops every server the gate started, then exits 130."""
    args = _greedy(list(sys.argv[1:] if argv is None else argv))
    STARTED.closed, STARTED.stopped = False, 0  # a gate interrupted earlier in this process closed it
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(args=args, prog_name="e2e", standalone_mode=False)
    except (KeyboardInterrupt, click.exceptions.Abort):
        stop_all()
        click.echo(f"e2e: interrupted; stopped {STARTED.stopped} server(s)", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()

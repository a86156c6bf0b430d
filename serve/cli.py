"""`kern serve TARGET` / `kern server TARGET` / `kern-serve TARGET`: the flags of SPEC §7.

The listening socket is bound (and listening) before the model loads, so a taken port fails at once;
a connection made during the load waits until the server serves. Every start-up error is one line,
`kern serve: error: ...`, naming the flag or the file.

Exit codes (`EXIT_CODES`, also in `kern serve --help` and docs/serve.md): 0 after SIGTERM (or SIGINT)
drained; 1 the HTTP server failed to start after the load; 2 a bad flag value or a target that cannot
be served (config, manifest, weights, kernels, sizes); 3 the listening socket cannot be bound (the
port is taken: the line says "address already in use"); 75 when the drain ran out of --drain-timeout
and requests were cut off (each answered a 503); 101 when the scheduler thread crashed.
"""

from __future__ import annotations

import errno
import sys

import click

from serve.core.faults import FAULTS
from oracle.version import option as version_option
from serve.api.guard import Limits
from pool.fair import POLICIES, Rule
from serve.common.exits import EXIT_BIND, EXIT_CODES, EXIT_CRASHED, EXIT_CUT_OFF, EXIT_START_FAILED, EXIT_USAGE  # noqa: F401 (importers read them here)
from serve.flags import QUEUE_TIMEOUT_S, ServeFlags
from serve.server import bind, run, start_scheduler

__all__ = ["main", "serve_command"]

_D = Limits()
_R = Rule()
_FAULT_HELP = "; ".join(f"{k}: {v}" for k, v in FAULTS.items())
_POSITIVE = click.FloatRange(min=0, min_open=True)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """One line on stderr, `kern serve: error: ...`, then exit `code`."""
    click.echo("kern serve: error: " + " ".join(str(message).split()), err=True)
    sys.exit(code)


class OneLineErrors(click.Command):
    """A bad flag value is one line naming the flag and exit 2, not click's usage block (also when
    the command runs under the `kern` group: every context parses its arguments here)."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            fail(exc.format_message(), EXIT_USAGE)


@click.command(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@version_option("kern serve")
@click.argument("target")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on (0: any free port; the `serving` line names it).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--capacity", default=None, type=click.IntRange(min=1), help="Tokens the pool holds, rounded down to a page (default: 16384 on the CPU; on the GPU the free memory less 1 GiB less --reserve-gib).")
@click.option("--host-gib", default=0.0, show_default=True, type=click.FloatRange(min=0), help="Host tier for parked snapshots, GiB (0: none).")
@click.option("--host-chunk-bytes", "host_chunk", default=None, type=click.IntRange(min=1), help="Hold the host tier in pieces of this many bytes, each taken at its first write, on the CPU too (the GPU's default: 32 MiB pinned pieces); the gate sets an odd size so parks and wakes cross piece edges. Single-process servers only.")
@click.option("--max-seqs", default=None, type=click.IntRange(min=1), help="Most sequences running at once (default 256, at most min(seqs.max, tokens.max / rows)).")
@click.option("--chunk", default=None, type=click.IntRange(min=1), help="Prefill chunk in tokens (default: the manifest's tokens bound; may only be lowered).")
@click.option("--rows", default=None, type=click.IntRange(min=1), help="Rows per step: 1 = plain decode, else a speculative round (default: the widest declared).")
@click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "gpu"]))
@click.option("--gpus", "--device", "device", default=None, help="GPU index (one rank).")
@click.option("--reserve-gib", default=4.0, show_default=True, type=click.FloatRange(min=0), help="GPU memory left out of the default capacity, GiB.")
@click.option("--weights", multiple=True, help="Weights file(s) (default: the target's, or every *.safetensors beside a manifest path).")
@click.option("--allowed-hosts", "allowed_hosts", default=None, help="Host header names the server answers to, comma separated ('*': any); IP addresses, localhost and --host are always accepted, and a server bound to 0.0.0.0 or :: without this flag accepts any (docs/serve.md). Another Host is a 400.")
@click.option("--api-key", default=None, help="Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize.")
@click.option("--served-model-name", default=None, help="Model name to answer to (default: the manifest's model).")
@click.option("--config", "config", default=None, type=click.Path(dir_okay=False), help="TOML with [targets.NAME] tables (as `kern --config`).")
@click.option("--protect-stats", is_flag=True, help="With --api-key, require it on /stats and /metrics too.")
@click.option("--drain-timeout", default=_D.drain_timeout, show_default=True, type=_POSITIVE, help="On SIGTERM, seconds to finish queued and running requests; then the rest get a 503 and the exit code is 75.")
@click.option("--max-connections", default=_D.max_connections, show_default=True, type=click.IntRange(min=1), help="Open connections at most; beyond, a new one is answered 503 and closed.")
@click.option("--max-connections-per-client", "max_per_client", default=_D.max_per_client, show_default=True, type=click.IntRange(min=1), help="Open connections from one peer address at most; beyond, a new one from it is answered 503 and closed. At --max-connections, a newcomer from a peer holding fewer sheds the longest-silent connection of the peer holding the most. Behind a proxy every client is one address: raise it to --max-connections.")
@click.option("--header-timeout", default=_D.header_timeout, show_default=True, type=_POSITIVE, help="Seconds for a request's headers to arrive (from its first byte); then a 408 and the connection closes.")
@click.option("--body-timeout", default=_D.body_timeout, show_default=True, type=_POSITIVE, help="Seconds for a request's body to arrive after its headers; then a 408 and the connection closes.")
@click.option("--keep-alive", default=_D.keep_alive, show_default=True, type=_POSITIVE, help="Seconds an idle keep-alive connection is held open.")
@click.option("--max-body-bytes", default=_D.max_body_bytes, show_default=True, type=click.IntRange(min=1), help="Largest request body; a larger one is answered 413.")
@click.option("--max-tokenize-tokens", default=_D.max_tokenize_tokens, show_default=True, type=click.IntRange(min=1), help="Largest /tokenize input, in tokens; a larger one is answered 413.")
@click.option("--admission", "admission", default=_R.name, show_default=True, type=click.Choice(list(POLICIES)), help="The order waiting requests are tried for room: fifo (first come, first served: nothing starts while the head of the queue does not fit) or fair (the head first, then a request behind it that fits, at most --max-bypass times per head; a client over its share of pages or rows waits while others wait). docs/pool-at-scale.md.")
@click.option("--client-page-share", "page_share", default=_R.page_share, show_default=True, type=click.FloatRange(min=0, max=1, min_open=True), help="fair: the fraction of the pool's pages one client (its API key, else its peer address) may reserve before its waiting requests are passed over for other clients'.")
@click.option("--client-row-share", "row_share", default=_R.row_share, show_default=True, type=click.FloatRange(min=0, max=1, min_open=True), help="fair: the fraction of --max-seqs running rows one client may hold before its waiting requests are passed over for other clients'.")
@click.option("--max-bypass", "bypass", default=_R.bypass, show_default=True, type=click.IntRange(min=0), help="fair: how many requests may start ahead of a head of the queue that does not fit; then it alone is tried until it starts (0: as fifo, apart from the shares).")
@click.option("--queue-timeout", "queue_timeout", default=QUEUE_TIMEOUT_S, show_default=True, type=click.FloatRange(min=0), help="Seconds a request may wait for room; then a 503 queue_timeout with Retry-After (a stream: before its first byte). 0: wait without bound.")
@click.option("--max-tokens-ceiling", "ceiling", default=None, type=click.IntRange(min=1), help="Refuse a request whose max_tokens is above this with a 400 naming the flag (default: no ceiling past the pool's own).")
@click.option("--stuck-after", "stuck_after", default=_D.stuck_after, show_default=True, type=_POSITIVE, help="/health answers 503 (engine_core_stuck) once the engine core's iteration in progress has run this many seconds; a core that does not answer at all gets its 503 within 0.4 s (/health) or 0.8 s (/stats, /stats/live, /metrics) (docs/serve.md).")
@click.option("--stats-every", default=5.0, show_default=True, type=_POSITIVE, help="Seconds per `stats` log window.")
@click.option("--decode-steps", "decode_steps", default=None, type=click.IntRange(min=1, max=64), help="Decode steps a launch: the device feeds each sequence its own token between them, the host stages, reads back and commits once per launch (runtime/multistep.py). Default 8 on a GPU (bench/step_device.sh measures 1, 8 and 16), 1 on the CPU; 1 wherever the target's decode program cannot (a speculative round, a lined state, a pipeline).")
@click.option("--overlap/--no-overlap", "overlap", default=None, help="With several decode steps a launch: send the next launch before committing the last (the device feeds each sequence its last token), so the host's commit overlaps the device's steps (serve/core/core.py). Default: on a GPU; off on the CPU, whose kernels run as they are issued.")
@click.option("--gpu-wait", "gpu_wait", default="auto", show_default=True, type=click.Choice(["auto", "spin", "yield", "blocking"]), help="How the engine core's threads wait on the GPU (a launch's readback): spin (the lowest latency; the waiting thread holds its CPU), yield (spins, giving the CPU to the process's other threads between looks), blocking (sleeps until the GPU is done), or auto: CUDA's own choice (spin on a machine of more CPUs than GPU contexts). Single-process serving; ignored on the CPU (docs/serve.md).")
@click.option("--no-graphs", is_flag=True, help="Run `graph: true` programs launch by launch instead of as captured CUDA graphs (GPU; for comparison).")
@click.option("--no-pack", "no_pack", is_flag=True, help="Prefill one sequence per call even when the manifest packs several (cu_seqlens), for comparison.")
@click.option("--stages", default=None, type=click.IntRange(min=1), help="Serve as a pipeline of N stages on this machine: cut TARGET (at the layer boundaries that balance calls per stage, or --at) and start N-1 stage processes; this process is stage 0, the head.")
@click.option("--at", "at", default=None, help="Cut points (call indices, comma separated) for --stages, instead of the balanced ones.")
@click.option("--pp-listen", default=None, help="Head: bind the pipeline's control socket here (tcp://HOST:PORT) and wait for stages started separately with --pp-head.")
@click.option("--pp-head", default=None, help="Run as a pipeline stage (TARGET is its stage manifest) for the head at this address (tcp://HOST:PORT); no HTTP.")
@click.option("--pp-timeout", default=60.0, show_default=True, type=_POSITIVE, help="Seconds a pipeline peer may stay silent (or an item unanswered) before it counts as lost (a stage: exits non-zero; the head: restarts it, see --pp-restart).")
@click.option("--pp-restart/--no-pp-restart", "pp_restart", default=True, show_default=True, help="Head: when a stage is lost, start it again (or wait, up to --stage-connect-timeout, for a replacement started by hand with --pp-head) and resume every request from its prompt and the tokens it already produced; without: answer them with 503 pipeline_stage_lost and exit 3.")
@click.option("--stage-connect-timeout", "stage_connect", default=None, type=_POSITIVE, help="Pipeline head: seconds to wait for every stage to connect, and again for them to load; a stage still missing then ends the head with one line naming it, exit 3 (default: 180, or --pp-timeout when longer). A stage: how long it waits for the head's table.")
@click.option("--pp-bind", default="127.0.0.1", show_default=True, help="Stage: the address its activation socket binds (the previous stage connects to it).")
@click.option("--pp-parent", default=None, type=click.IntRange(min=1), hidden=True, help="Stage: end when this process (the head that started it) ends.")
@click.option("--pp-share", default=1, type=click.IntRange(min=1), hidden=True, help="Stage: processes sharing this GPU; the default capacity takes 1/N of its free memory.")
@click.option("--sampling", default="refuse", show_default=True, type=click.Choice(["refuse", "greedy-warn"]), help="A non-greedy sampling value (temperature > 0, top_p < 1, penalties, ...): refuse it with a 400 naming it, or serve it greedily with one WARN line per parameter name (docs/api.md).")
@click.option("--metrics-prefix", "metrics_prefix", default="kern", show_default=True, type=click.Choice(["kern", "vllm"]), help="Name the /metrics that mirror vLLM's `vllm:` with vLLM's labels (model_name, engine), so a vLLM Grafana dashboard works unchanged (docs/grafana/); kern's own stay `kern:` (docs/metrics.md).")
@click.option("--fault", "faults", multiple=True, type=click.Choice(sorted(FAULTS)), help=f"Misbehave on purpose, for testing the gate (repeatable). {_FAULT_HELP}.")
@click.option("--frontend-process/--no-frontend-process", "frontend_process", default=None, help="Run the engine core (the scheduler thread, the runtime, the pool) in a process of its own, forked before the load, and the HTTP front end (replies, SSE, /metrics' histograms) in this one, so they do not share one interpreter lock; they speak msgpack over ZeroMQ (docs/serve.md). Default: on for a GPU (--backend gpu, or auto where an NVIDIA driver is loaded), else off unless KERN_FRONTEND_PROCESS=1. Not in a pipeline stage (--pp-head) or a warm host's command (served in process).")
@click.option("--frontends", "frontends", default=1, show_default=True, type=click.IntRange(min=1), help="HTTP front-end processes on the one port (vLLM's --api-server-count), each with its own interpreter lock for parsing, replies, SSE and /metrics' histograms, one engine core serving them all; above 1 implies --frontend-process. /metrics sums every front end's (prometheus_client's multiprocess mode); the connection limits above hold per front end (docs/serve.md). Linux.")
@click.option("--http", "http", default="auto", show_default=True, type=click.Choice(["auto", "httptools", "h11"]), help="The HTTP/1.1 parser: httptools (C, llhttp; a whole answer costs the front end about two thirds of h11's time), h11 (pure Python), or auto: httptools where it is installed. The connection limits above hold under both (docs/serve.md).")
@click.option("--log-level", "log_level", default=None, type=click.Choice(["debug", "info", "warn", "error"]),
              help="Write log lines at this level or above (default: info, or the kern_serve level RUST_LOG names, as the Rust kern gate driver sets it; the gates read debug lines: e2e sets RUST_LOG=kern_serve=debug too).")
@click.pass_context
def serve_command(ctx, **given) -> None:
    """Serve TARGET (a config target name or a manifest path) over OpenAI-compatible HTTP.

    Every start-up error is one line on stderr, `kern serve: error: ...`, naming the flag or file.
    The port is bound before the model loads.

    \b
    Exit codes:
      0    SIGTERM (or SIGINT) drained every request
      1    the HTTP server failed to start after the load
      2    a bad flag value, or a target that cannot be served (config,
           manifest, weights and their sha256, kernels, sizes)
      3    --host/--port cannot be bound (the port is taken: "address
           already in use"); checked before the load
      75   --drain-timeout ran out and requests were cut off (each a 503)
      101  the scheduler thread crashed (or, with --frontend-process, the
           engine core process was killed)
    """
    flags = ServeFlags(**given)
    from serve.common import hosted, logs
    from serve.common.startup import Phases

    phases = Phases()  # the ready line's start_s and its split
    limits = _limits(flags)
    flags.http = _parser(flags.http)  # before the load: a parser that is not installed fails in a second
    logs.set_level(flags.log_level or logs.level_from_env(hosted.getenv("RUST_LOG")) or "info")
    if flags.config is None and ctx.obj and isinstance(ctx.obj, dict):
        flags.config = ctx.obj.get("config")
    opts = _options(flags)
    errors = _load_errors()
    if flags.host_chunk is not None and flags.pipelined:
        fail("--host-chunk-bytes is for single-process servers (not --stages, --pp-head or --pp-listen)")
    if flags.pp_timeout <= 0:
        fail(f"--pp-timeout {flags.pp_timeout} must be positive")
    if flags.pp_head is not None:
        _serve_stage(flags, errors)
    sock = _bind(flags)  # before the load: a taken port fails in a second, not after the model loaded

    def load():
        try:
            engine, head = _engine(flags, opts, phases)
        except errors as exc:
            fail(exc)
        if flags.served_model_name:
            engine.model = flags.served_model_name
        return engine, head

    split = _frontends_split(flags.frontends, flags.frontend_process) or _split(flags.frontend_process, flags.backend)
    engine, head, scheduler = _start(load, split, flags.stats_every, phases, sock, flags.frontends)
    code = run(engine, flags, limits, sock, phases=phases, scheduler=scheduler)
    if head is not None:
        head.stop()
    sys.exit(code)


def _options(flags: ServeFlags):
    """The engine's options (`serve.core.engine.Options`) the flags name."""
    from serve.core.engine import Options
    from serve.core.faults import Faults

    return Options(capacity=flags.capacity, host_gib=flags.host_gib, max_seqs=flags.max_seqs, chunk=flags.chunk,
                   rows=flags.rows, backend=flags.backend, device=flags.device, reserve_gib=flags.reserve_gib,
                   weights=tuple(flags.weights), config=flags.config, faults=Faults(flags.faults),
                   graphs=not flags.no_graphs, decode_steps=flags.decode_steps, overlap=flags.overlap, pack=not flags.no_pack,
                   gpu_wait=flags.gpu_wait, host_chunk=flags.host_chunk,
                   admission=flags.rule(), queue_timeout=flags.queue_timeout or None)


def _serve_stage(flags: ServeFlags, errors) -> None:
    """--pp-head: serve as a pipeline stage (no HTTP), and exit with its code."""
    from serve.pipeline.stage import StageOptions, serve_stage

    sopts = StageOptions(weights=tuple(flags.weights), config=flags.config, capacity=flags.capacity,
                         host_gib=flags.host_gib, backend=flags.backend, device=flags.device,
                         reserve_gib=flags.reserve_gib, timeout=flags.pp_timeout, bind=flags.pp_bind,
                         parent=flags.pp_parent, share=flags.pp_share, connect=flags.stage_connect)
    try:
        sys.exit(serve_stage(flags.target, flags.pp_head, sopts))
    except errors as exc:
        fail(exc)


def _bind(flags: ServeFlags):
    """The listening socket, bound; one line and exit 3 when it cannot be."""
    host, port = flags.host, flags.port
    try:
        return bind(host, port)
    except OSError as exc:
        fail(f"cannot bind --host {host} --port {port}: {exc.strerror or exc}"
             + (" (the port is taken; pick another, or --port 0 for any free one)" if exc.errno == errno.EADDRINUSE else ""),
             EXIT_BIND)


def _frontends_split(frontends: int, frontend_process: bool | None) -> bool:
    """Whether --frontends asks for the split (above 1), or one line and exit 2 where it cannot be had."""
    if frontends == 1:
        return False
    from serve.common import hosted

    if frontend_process is False:
        fail(f"--frontends {frontends} needs the engine core in a process of its own: not with --no-frontend-process")
    if hosted.COMMAND.get() is not None:
        fail(f"--frontends {frontends} is not for a warm host's command (its servers are threads of one process)")
    if not sys.platform.startswith("linux"):
        fail(f"--frontends {frontends} needs Linux")
    return True


def _start(load, split: bool, stats_every: float, phases, sock, frontends: int = 1):
    """(engine, pipeline head or None, None) loaded here, or with --frontend-process (engine's facts,
    None, the core process's `RemoteScheduler`): the core forked, loaded and its scheduler started;
    with `frontends` > 1 the other front ends forked too, each returning here with its own."""
    if not split:
        return (*load(), None)
    from serve.client.frontend import start_core

    engine, scheduler = start_core(load, lambda e: start_scheduler(e, stats_every, phases), sock, frontends)
    return engine, None, scheduler


def _split(flag: bool | None, backend: str) -> bool:
    """Whether the engine core runs in a process of its own: never in a warm host's command (a thread
    of a shared process); else --frontend-process or --no-frontend-process when given; else on for a
    GPU (`--backend gpu`, or `auto` on a machine with an NVIDIA driver loaded), where the engine steps
    faster than one interpreter lock can also serve HTTP (docs/results-measured.md: streaming 0.17 ->
    0.6 of the engine alone on an H200); else the environment's KERN_FRONTEND_PROCESS, off by default
    (on two CPU cores the split costs more than it frees). The hint for `auto` never touches CUDA
    before the fork; the core picks the backend."""
    from pathlib import Path

    from serve.common import hosted

    if hosted.COMMAND.get() is not None:
        return False
    if flag is not None:
        return flag
    if backend == "gpu" or (backend == "auto" and Path("/proc/driver/nvidia/version").exists()):
        return True
    return (hosted.getenv("KERN_FRONTEND_PROCESS") or "").strip().lower() in ("1", "true", "yes", "on")


def _engine(flags: ServeFlags, opts, phases):
    """(engine, None) for one process, or (engine, head) for a pipeline's head and its stages."""
    from serve.core.engine import build
    from serve.pipeline.plan import pipeline_paths

    plan = pipeline_paths(flags.target, flags.stages, flags.at, opts.config, list(opts.weights) or None,
                          bool(flags.pp_listen))
    if plan is None:
        return build(flags.target, opts, phases), None
    from serve.pipeline.head import PipelineOptions, build_head

    paths, target_weights = plan
    if target_weights and not opts.weights:
        opts.weights = tuple(str(w) for w in target_weights)
    engine, head = build_head(paths, opts, PipelineOptions(listen=flags.pp_listen, timeout=flags.pp_timeout,
                                                          startup=flags.stage_connect, restart=flags.pp_restart,
                                                          entry=_stage_entry))
    phases.mark("stages")  # the head's load and its stages' start
    return engine, head


def _stage_entry(argv: list[str]) -> None:
    """What a stage forked warm from its head runs (serve/pipeline/forked.py): this command on the
    stage's command line, as `python -m serve ARGV` would; it exits with the command's code."""
    serve_command.main(args=argv, prog_name="kern-serve", standalone_mode=True)


def _limits(flags: ServeFlags) -> Limits:
    """The connection and body limits, checked (and the file descriptors they need); one line and exit 2
    for a value that cannot be served."""
    from serve.api.guard import fit_descriptors

    limits = flags.limits()
    try:
        limits.check()
        if flags.protect_stats and flags.api_key is None:
            raise ValueError("--protect-stats needs --api-key (the key it requires on /stats and /metrics)")
        fit_descriptors(limits)
    except ValueError as exc:
        fail(exc)
    return limits


def _parser(http: str) -> str:
    """The HTTP parser --http names, installed; one line and exit 2 when it is not."""
    from serve.api.guard import parser

    try:
        return parser(http)
    except ValueError as exc:
        fail(exc)


def _load_errors() -> tuple[type[Exception], ...]:
    """What a target that cannot be served raises while it loads: each one line, exit 2."""
    from manifests import ManifestError
    from manifests.config import ConfigError
    from pool import GeometryError, PoolError
    from runtime.backend import KernelError
    from runtime.protocol import ProtocolError
    from runtime.weights import WeightsError
    from serve.core.engine import EngineError
    from serve.pipeline.plan import PlanError

    return (ManifestError, ConfigError, EngineError, ProtocolError, WeightsError, KernelError, GeometryError,
            PoolError, PlanError)






















def main() -> None:
    """The `kern-serve` entry: the same command, standalone."""
    serve_command(prog_name="kern-serve")

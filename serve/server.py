"""The HTTP server's life for `kern serve` (`run`): uvicorn over the app, started on a socket bound
before the load (`bind`), its `serving` line, and its shutdown: the drain, the port answering 503 until
it closes last, the backlog answered rather than reset (docs/limits-and-shutdown.md)."""

from __future__ import annotations


import asyncio
import functools
import logging
import os
import signal


from serve.api.guard import Limits
from serve.common.exits import EXIT_CUT_OFF, EXIT_START_FAILED

__all__ = ["bind", "ready_fields", "run", "start_scheduler"]

_D = Limits()


def bind(host: str, port: int):
    """The listening socket for `host:port`, bound and listening (before the load). The caller exits
    EXIT_BIND on OSError."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP (a proto of 0,
    # socket.socket's default, left Nagle on: every answer written in two parts waited 40 ms for the
    # client's delayed ACK). serve/api/guard.py sets it on each connection as well.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no obstacle
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def run(engine, flags, limits: Limits = _D, sock=None, phases=None, scheduler=None) -> int:
    """Serve until a signal; the exit code. `flags`: the command's `serve.flags.ServeFlags` (where it
    listens, the api key, --sampling, --metrics-prefix, --http, --allowed-hosts, --stats-every);
    `sock`: the listening socket (`bind`), else bound here; `phases` (`serve.common.startup.Phases`): the
    start so far, whose split the ready line gives; `scheduler`: one already started (the engine
    core's process stand-in, `serve.client.frontend.RemoteScheduler`), else one is started here."""
    import uvicorn

    from serve.api import guard
    from serve.common import logs
    from serve.common.startup import Phases

    phases = phases or Phases()
    phases.mark("imports")
    front_end_only = scheduler is not None  # --frontend-process: the engine core is another process
    if scheduler is None:
        scheduler = start_scheduler(engine, flags.stats_every, phases)

    limit_log = logs.Limiter()
    http = guard.parser(flags.http)
    # a front end alone freezes its heap once it serves (the core's process froze its own after its warm-up)
    Server = _server_type(uvicorn, engine, flags.host, flags.port, phases, limit_log, limits, scheduler, http,
                          front_end_only)
    app = _app(engine, flags, limits, limit_log, scheduler)
    # past the drain's deadline every handler has its answer or its 503; the grace is for writing them
    config = uvicorn.Config(app, host=flags.host, port=flags.port, log_level="warning", access_log=False,
                            lifespan="off", http=guard.protocol(limits, limit_log, http),
                            timeout_keep_alive=limits.keep_alive,
                            timeout_graceful_shutdown=limits.drain_timeout + GRACE_S)
    server = Server(config)
    if sock is None:
        sock = bind(flags.host, flags.port)
    _serve(server, sock, scheduler, limit_log)
    died = scheduler.died
    if not server.started or died:
        scheduler.release()  # an engine core's process: its leader's directories
        return died or EXIT_START_FAILED
    return _stopped(engine, server, app, scheduler, limit_log)


def _app(engine, flags, limits: Limits, limit_log, scheduler):
    """The app (`serve.api.app.make_app`) over the scheduler, as the flags configure it."""
    from serve.api.app import make_app
    from serve.api.hosts import Hosts

    allowed = None if flags.allowed_hosts is None else tuple(flags.allowed_hosts.split(","))
    return make_app(scheduler, engine, flags.api_key, limits, limit_log, flags.protect_stats,
                    sampling=flags.sampling, metrics_prefix=flags.metrics_prefix, hosts=Hosts(flags.host, allowed))


def _serve(server, sock, scheduler, limit_log) -> None:
    """Run the server on `sock` until it stops: uvicorn's and asyncio's error lines through the limiter,
    the signals (or a warm host's stop message) turned into its drain."""
    filters = [(logging.getLogger(name), limit_log.logging_filter(name.replace(".error", "")))
               for name in ("uvicorn.error", "asyncio")]
    for logger, f in filters:
        logger.addFilter(f)
    from serve.common import hosted

    # a host's command: the host's signal message stops it as SIGTERM (SIGINT) would; SIGKILL, or a
    # crash, stops it at once (serve/common/hosted.py)
    if not hosted.on_stop(lambda sig: _stop_hosted(server, sig)):
        # uvicorn re-raises the signal it drained on; let that land here, harmlessly, so we exit 0
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
    scheduler.watch(lambda: setattr(server, "should_exit", True))  # a core process that dies: answered, then stop
    try:
        server.run(sockets=[sock])
    finally:
        for logger, f in filters:
            logger.removeFilter(f)


def _stopped(engine, server, app, scheduler, limit_log) -> int:
    """After an orderly stop: the core stopped and joined, the `stopped` line; 75 when requests were cut off."""
    from serve.common import logs

    scheduler.stop()
    scheduler.join(timeout=30)
    limit_log.flush()
    cut = (scheduler.cut_off + app.state.ctx.cancelled + (0 if server.drained else 1)
           + scheduler.peers_cut)  # --frontends: the other front ends' own ends
    if scheduler.index == 0:  # --frontends: the leader's line; its peers' at debug
        logs.event("stopped", model=engine.model, cut_off=scheduler.cut_off, cancelled=app.state.ctx.cancelled,
                   drained=server.drained)
    else:
        logs.event("front end stopped", "DEBUG", index=scheduler.index, cancelled=app.state.ctx.cancelled,
                   drained=server.drained)
    return EXIT_CUT_OFF if cut else 0


GRACE_S = 5.0


def start_scheduler(engine, stats_every: float, phases):
    """The scheduler thread over `engine`, started and ready; its ready line logged."""
    from serve.common import logs
    from serve.common.startup import freeze_when
    from serve.core.scheduler import Scheduler

    scheduler = Scheduler(engine, stats_every)
    scheduler.start()
    scheduler.ready.wait()
    phases.mark("scheduler")
    logs.event("scheduler ready", **ready_fields(engine), **phases.as_fields())
    freeze_when(scheduler.warm)  # the process's heap, once every program ran once
    return scheduler


def ready_fields(engine) -> dict:
    """The `scheduler ready` line's facts (what the gate reads of a server that logs it)."""
    f = engine.facts()
    ready = dict(ranks=1, pages=f["pages"], page=f["page"])
    if engine.lined:
        ready["seq_slots"] = f["seq_slots"]
    host_gib = engine.host_bytes / (1 << 30)
    ready.update(max_seqs=engine.max_seqs, max_seqs_per_rank=engine.max_seqs, max_request_tokens=f["max_request_tokens"],
                 chunk=engine.chunk, rows=engine.rows, decode_steps=f["decode_steps"], overlap=f["overlap"], checkpoints=f["checkpoints"],
                 host_gib=host_gib,
                 host_gib_per_rank=host_gib, model=engine.model, backend=engine.backend,
                 faults=",".join(sorted(engine.faults.names)) or "none")
    return ready


def _server_type(uvicorn, engine, host: str, port: int, phases, limit_log, limits: Limits, scheduler, http: str,
                 freeze: bool):
    """uvicorn's server with our start (the `serving` line, the limiter's flusher, event-loop errors
    through the limiter, with `freeze` the heap frozen) and our drain (the scheduler's, logged);
    `drained` says whether it finished."""
    from serve.common import logs

    class Server(uvicorn.Server):
        drained = False

        async def startup(self, sockets=None) -> None:
            loop = asyncio.get_running_loop()
            loop.set_exception_handler(lambda _, ctx: limit_log(
                "event loop error", "ERROR", reason=str(ctx.get("message", "?"))[:120],
                error=repr(ctx.get("exception"))[:200]))
            await super().startup(sockets)
            if self.started:
                bound = [s.getsockname()[1] for srv in self.servers for s in srv.sockets]
                phases.mark("http")
                count, index = scheduler.count, scheduler.index
                if index == 0:  # the leader's line: the others' follow at debug
                    logs.event("serving", model=engine.model, host=host, port=bound[0] if bound else port,
                               start_s=phases.as_fields()["start_s"], http=http, loop=_loop_name(loop),
                               **({"frontends": count, "metrics_dir": scheduler.shared} if count > 1 else {}))
                else:
                    logs.event("front end ready", "DEBUG", index=index, pid=os.getpid())
                if freeze:
                    from serve.common.startup import freeze_heap

                    freeze_heap()
                self.flusher = loop.create_task(_flush_every(limit_log))

        async def shutdown(self, sockets=None) -> None:
            """uvicorn's graceful shutdown, but the port answers until the end (`_shutdown`)."""
            await _shutdown(self, limits, scheduler, sockets or [])

        async def _wait_tasks_to_complete(self) -> None:
            await _wait_busy(self)

    return Server


async def _shutdown(server, limits: Limits, scheduler, sockets) -> None:
    """uvicorn's graceful shutdown, but the port answers until the end: a connection that arrives
    meanwhile, or a request on a connection idle when it began, gets a 503 `server_shutting_down`
    (`serve.api.guard`), not a reset; the listening socket closes last."""
    from serve.api import guard
    from serve.common import logs

    logs.event("draining", drain_timeout=limits.drain_timeout, connections=len(server.server_state.connections))
    scheduler.drain(limits.drain_timeout)
    server.config.http_protocol_class.going_away = True
    before = list(server.server_state.connections)  # what the drain waits for: later ones are answered 503
    for connection in before:
        connection.shutdown()
    await asyncio.sleep(0.1)
    try:
        async with asyncio.timeout(server.config.timeout_graceful_shutdown):
            await _wait_busy(server, before)
    except TimeoutError:
        logging.getLogger("uvicorn.error").error("Cancel %s running task(s), timeout graceful shutdown "
                                                 "exceeded", len(server.server_state.tasks))
        for t in server.server_state.tasks:
            t.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
    await _close_listening(server, sockets, whole=scheduler.index == 0)
    for connection in list(server.server_state.connections):
        getattr(connection, "let_go", lambda: None)()
    # the connections answered 503 since the shutdown drain what their clients still send
    loop, state = asyncio.get_running_loop(), server.server_state
    until = loop.time() + guard.LINGER_S
    while any(getattr(c, "_refused", False) for c in state.connections) and loop.time() < until:
        await asyncio.sleep(0.05)
    _read_what_is_left(state.connections)


def _read_what_is_left(connections) -> None:
    """The server's last read: what clients sent that the event loop has not read yet (a request that
    came after its 503, on a loop too busy to read it within the linger) is read and dropped, so the
    process's exit closes each socket with a FIN; unread bytes in a socket's buffer make the kernel
    send a reset instead, and the client loses the 503 it had not read yet (10 of 474 connections
    under a 16-worker test suite's load)."""
    for c in list(connections):
        transport = getattr(c, "transport", None)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or sock.fileno() < 0:
            continue
        try:
            while os.read(sock.fileno(), 65536):
                pass
        except OSError:  # BlockingIOError: nothing left; or the socket is gone
            pass


async def _close_listening(server, sockets, whole: bool = True) -> None:
    """Close the listening sockets, answering the connections still in their backlog (a 503
    `server_shutting_down` each, as during the drain) instead of resetting them. First no new
    handshake may start (`guard.stop_handshakes`: new SYNs dropped, so their clients are refused once
    the port is closed, before they sent a byte); those under way end in the backlog within
    `HANDSHAKE_S`; then the backlog is taken, the sockets closed with nothing awaited between, and each
    one served so. Without the first step a handshake that ended between the last accept and the
    close was reset with its request sent: about 1 connection in 1,000 in some runs of
    `tests/test_serve_exit.py`'s hammer. Only when the whole server goes (`whole`: the leader, or the
    only front end): with --frontends the socket is shared, and another front end told to stop alone
    leaves it listening in the others (closing its own descriptor resets nothing)."""
    from serve.api import guard

    loop = asyncio.get_running_loop()
    taken = []
    selector = type(loop).__module__.startswith("asyncio")  # its accept can be stopped; uvloop's cannot
    if selector:
        for sock in sockets:
            loop.remove_reader(sock.fileno())
    if whole and all([guard.stop_handshakes(sock) for sock in sockets]):
        # the handshakes under way end meanwhile: in the backlog (taken below), or under uvloop accepted
        # by its own loop and answered 503 as every connection is during the shutdown (uvloop keeps
        # accepting until the close: without this wait, the 32 connections a hammer had under way
        # when a uvloop server closed were all reset)
        await asyncio.sleep(guard.HANDSHAKE_S)
    if selector:
        for sock in sockets:
            while True:
                try:
                    taken.append(sock.accept()[0])
                except OSError:  # BlockingIOError: the backlog is empty
                    break
    for srv in server.servers:
        srv.close()
    for sock in sockets:
        sock.close()
    factory = functools.partial(server.config.http_protocol_class, config=server.config,
                                server_state=server.server_state, app_state=server.lifespan.state)
    for conn in taken:
        try:
            await loop.connect_accepted_socket(factory, conn)
        except OSError:
            conn.close()


async def _wait_busy(server, among=None) -> None:
    """uvicorn's graceful wait for the connections with a request in progress (not the ones held idle
    or answered 503 since the shutdown) and the tasks; cancelled when it outlasts
    timeout_graceful_shutdown. Sets `server.drained` once it finished. `among`: the connections open
    when the drain began (default: all): a client that keeps opening new ones while the server goes
    away is answered 503 on each and does not hold the exit back."""
    state = server.server_state

    def busy() -> bool:
        conns = state.connections if among is None else [c for c in among if c in state.connections]
        return any(not (getattr(c, "_going", False) or getattr(c, "_refused", False)) for c in conns)

    while (busy() or state.tasks) and not server.force_exit:
        await asyncio.sleep(0.1)
    server.drained = True


def _stop_hosted(server, sig: int) -> None:
    """What SIGTERM or SIGINT does to a server of its own process (uvicorn's handler: drain, and a
    second SIGINT forces); SIGKILL forces at once."""
    if sig == signal.SIGKILL:
        server.should_exit = server.force_exit = True
    else:
        server.handle_exit(sig, None)


async def _flush_every(limit_log) -> None:
    while True:
        await asyncio.sleep(limit_log.interval)
        limit_log.flush()


def _loop_name(loop) -> str:
    """The event loop uvicorn chose: uvloop where it is installed, else asyncio's."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"

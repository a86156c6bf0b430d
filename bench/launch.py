"""The benches' use of the gate's one launcher (`e2e/spawn.py`, `e2e.session.launch`): `start` a
`kern serve` of this checkout on an ephemeral 127.0.0.1 port, `stop` it (its process group with it)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the benches run as scripts: this checkout's e2e, whatever is installed

from e2e.session import ServerError, Session, launch  # noqa: E402
from e2e.spawn import Processes, own_kern  # noqa: E402

Server = Session

__all__ = ["REPO", "Server", "start", "stop"]


def start(target: str, flags: list[str] | tuple[str, ...], log: Path, timeout: float = 300.0,
          env: dict[str, str] | None = None) -> tuple[Session, str]:
    """`kern serve TARGET --port 0 FLAGS...` (this checkout first on the path, `env` over it), its output to
    `log`; the server and its URL once it is ready (its `serving` line names the port and /health answers
    200: warm). A server that exits or does not start in `timeout` seconds ends the bench with its log's tail."""
    cmd = [*own_kern(), "serve", target, "--port", "0", *flags]
    try:
        s = launch(Session(target, cmd, 0, log, spawner=Processes.project(env, cwd=REPO), env={}, header=False,
                           health=True, load_timeout=timeout, term_timeout=30.0))
    except ServerError as exc:
        raise SystemExit(f"server `{' '.join(cmd)}` did not start: {exc}\n{log.read_text()[-2000:]}") from None
    return s, s.url


def stop(server: Session, timeout: float = 30.0) -> int | None:
    """SIGTERM, then SIGKILL after `timeout`; whatever it started goes too (its process group: a
    pipeline's stages); the exit code."""
    server.term_timeout = timeout
    return server.stop()

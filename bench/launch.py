"""The one way the benches start a `kern serve` of this checkout and stop it (`start`, `stop`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVING = re.compile(r" serving .*\bport=(\d+)")

__all__ = ["REPO", "start", "stop"]


def start(target: str, flags: list[str] | tuple[str, ...], log: Path, timeout: float = 300.0,
          env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`kern serve TARGET --port 0 FLAGS...` (this checkout first on the path), its output to `log`; the
    process and its URL once its `serving` line names the port. A server that exits or does not start in
    `timeout` seconds ends the bench with its log's tail."""
    path = os.environ.get("PYTHONPATH")
    full = dict(os.environ, PYTHONPATH=str(REPO) + (os.pathsep + path if path else ""), **(env or {}))
    cmd = [sys.executable, "-m", "serve", target, "--port", "0", *flags]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=full, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = SERVING.search(log.read_text(errors="replace"))
        if m:
            return proc, f"http://127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop(proc)
    raise SystemExit(f"server `{' '.join(cmd)}` did not start:\n{log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> int | None:
    """SIGTERM, then SIGKILL after `timeout`; whatever it started goes too (its process group: a
    pipeline's stages); the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return proc.returncode

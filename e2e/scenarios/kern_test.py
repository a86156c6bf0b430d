"""kern_test: the A/B of the kernel builds, before any server starts; gated on exit 0."""

from __future__ import annotations

import subprocess

from e2e.session import kern_args, own_kern, project_env

VERDICTS = {0: "PASS", 1: "FAIL", 2: "INCONCLUSIVE"}


def run(r) -> None:
    base = r.opts.kern or own_kern()
    cmd = [*base, "--config", str(r.target.config or r.opts.config), "test", r.target.name, "--backend", r.opts.backend]
    r.dir.mkdir(parents=True, exist_ok=True)
    log = r.dir / "kern-test.log"
    spawner = r.opts.spawner()
    if spawner is not None:
        out, code = forked(spawner, cmd, log, r.opts.kern_test_timeout)
    else:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=project_env(), timeout=r.opts.kern_test_timeout)
            out, code = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as exc:
            out, code = f"{exc}", None
        log.write_text("$ " + " ".join(cmd) + "\n" + out)
    last = next((ln for ln in reversed(out.splitlines()) if ln.strip()), "")
    verdict = VERDICTS.get(code, "timeout" if code is None else f"exit {code}")
    r.checks.add("kern_test", code == 0, f"{verdict}; {last[:160]}")


def forked(zygote, cmd: list[str], log, timeout: float) -> tuple[str, int | None]:
    """A `kern` command forked from the gate's zygote (`e2e/zygote.py`), its output in `log`;
    (output, code), code None when it ran past `timeout` (then killed)."""
    from e2e.zygote import ZygoteGone

    header = "$ " + " ".join(cmd) + (" (a thread of one of the gate's hosts)" if zygote.hosted
                                     else " (forked by the gate's zygote)") + "\n"
    log.write_text(header)
    try:
        child = zygote.spawn(kern_args(cmd), log)
    except ZygoteGone as exc:
        return f"{exc}", 1
    try:
        code = child.wait(timeout)
    except subprocess.TimeoutExpired as exc:
        child.kill()
        child.wait(30)
        return f"{exc}", None
    return log.read_text()[len(header):], code

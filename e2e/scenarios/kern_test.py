"""kern_test: the A/B of the kernel builds, before any server starts; gated on exit 0."""

from __future__ import annotations

from e2e.spawn import own_kern, run_command

VERDICTS = {0: "PASS", 1: "FAIL", 2: "INCONCLUSIVE"}


def run(r) -> None:
    base = r.opts.kern or own_kern()
    cmd = [*base, "--config", str(r.target.config or r.opts.config), "test", r.target.name, "--backend", r.opts.backend]
    r.dir.mkdir(parents=True, exist_ok=True)
    out, code = run_command(r.opts.spawner(), cmd, r.dir / "kern-test.log", r.opts.kern_test_timeout)
    last = next((ln for ln in reversed(out.splitlines()) if ln.strip()), "")
    verdict = VERDICTS.get(code, "timeout" if code is None else f"exit {code}")
    r.checks.add("kern_test", code == 0, f"{verdict}; {last[:160]}")

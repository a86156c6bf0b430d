"""bench/gate_ab.sh's face: a help text, and a usage error (exit 2, nothing run) for a missing or wrong
checkout. Its timings are figures, never asserted."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gate_ab.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_help_says_what_it_times_and_exits_0():
    r = _run("--help")
    assert r.returncode == 0 and "interleaved" in r.stdout and "OTHER_CHECKOUT" in r.stdout


def test_no_checkout_is_a_usage_error():
    r = _run()
    assert r.returncode == 2 and "OTHER_CHECKOUT" in r.stdout


def test_a_checkout_that_is_not_there_is_named_and_nothing_runs(tmp_path):
    r = _run(str(tmp_path / "nowhere"), str(tmp_path / "out"))
    assert r.returncode == 2 and "no checkout at" in r.stderr and str(tmp_path / "nowhere") in r.stderr
    assert not (tmp_path / "out").exists()

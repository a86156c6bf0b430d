"""bench/frontend.py runs against the app as it is: its stand-in scheduler must meet the scheduler seam
the routes read (`delivery`, `shared`, ...), or the bench stops at its first request (it did once, unseen,
after the seam grew). Timing is never asserted: the run must end and print its table, every request answered."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_the_front_end_bench_answers_every_request_and_prints_its_table():
    r = subprocess.run([sys.executable, "bench/frontend.py", "--rounds", "1", "--streams", "2", "--chunks", "3",
                        "--requests", "20", "--tokens", "8"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| a stream chunk |" in r.stdout and "| a whole answer |" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr, r.stderr[-3000:]

"""The ready line's start split (`serve/common/startup.py`): the phases add up to start_s, and start_s counts
from the process's start, not from when the clock was made."""

import subprocess
import sys
import time

from serve.common.startup import Phases, process_age


def test_phases_add_up_to_start_and_repeat_names_accumulate():
    p = Phases()
    t = p.last
    p.mark("a", t + 0.25)
    p.mark("b", t + 0.5)
    p.mark("a", t + 1.0)
    f = p.as_fields()
    assert f["a_s"] == 0.75 and f["b_s"] == 0.25
    assert abs(sum(v for k, v in f.items() if k != "start_s") - f["start_s"]) < 0.005


def test_process_age_counts_from_the_process_start():
    # two fresh children, one sleeping 2 s before it asks: the sleeper sees at least its sleep, and
    # about 2 s more than the other (the same imports before both, which a loaded machine slows by
    # up to a few tenths: CI saw 0.28 s), so the clock starts at the process
    code = "import time; time.sleep({}); from serve.common.startup import process_age; print(process_age())"
    fresh, slept = (float(subprocess.check_output([sys.executable, "-c", code.format(d)], text=True)) for d in (0, 2.0))
    assert slept >= 2.0
    assert 0 < fresh < slept - 1.0, (fresh, slept)


def test_first_phase_starts_at_the_process_start():
    # this process started long before the clock was made: its first phase is that whole time
    t0 = time.monotonic()
    p = Phases()
    age = process_age()
    assert age is not None and p.origin <= t0
    assert p.spans["imports"] == p.last - p.origin and p.spans["imports"] >= age - 0.05


def test_serve_without_the_servers_dependencies_says_what_is_missing():
    """Where the server's dependencies do not import, `kern serve` is one line naming the import that
    failed and exit 2, not click's "No such command 'serve'"."""
    code = ("import sys\n"
            "for m in ('uvicorn', 'fastapi', 'h11'): sys.modules[m] = None\n"
            "from kern.cli import main; main(['serve', 'toy-paged', '--port', '0'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("kern serve: error: needs the server's dependencies") and "import of" in r.stderr
    assert "No such command" not in r.stderr and "Traceback" not in r.stderr

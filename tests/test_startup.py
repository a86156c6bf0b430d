"""The ready line's start split (`serve/startup.py`): the phases add up to start_s, and start_s counts
from the process's start, not from when the clock was made."""

import subprocess
import sys
import time

from serve.startup import Phases, process_age


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
    # a child that sleeps before it asks must see at least that sleep; a fresh one much less
    code = "import time; time.sleep({}); from serve.startup import process_age; print(process_age())"
    slept = float(subprocess.check_output([sys.executable, "-c", code.format(0.6)], text=True))
    assert slept >= 0.6
    age = process_age()
    assert age is not None and age > 0


def test_first_phase_starts_at_the_process_start():
    t0 = time.monotonic()
    p = Phases()
    assert p.origin <= t0 and p.spans["imports"] >= 0

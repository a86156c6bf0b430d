"""`serve.common.threads.name_native`: a thread named where the operating system shows it."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from serve.common.threads import name_native


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="native thread names are Linux's /proc here")
def test_a_thread_is_named_and_its_name_cut_to_linuxs_15_bytes():
    """The calling thread's comm becomes the name, cut to 15 bytes; another thread's stays."""
    got = {}

    def body(name: str) -> None:
        ok = name_native(name)
        got[name] = (ok, Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    for name in ("kern-scheduler", "kern-a-name-far-longer-than-fifteen"):
        t = threading.Thread(target=body, args=(name,))
        t.start()
        t.join()
    assert got["kern-scheduler"] == (True, "kern-scheduler")
    assert got["kern-a-name-far-longer-than-fifteen"] == (True, "kern-a-name-far")
    assert Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip() != "kern-scheduler"

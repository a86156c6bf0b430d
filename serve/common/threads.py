"""Our processes and threads named where the operating system shows them (`ps -o comm`, `top -H`,
`ps -L`, py-spy, /proc/PID/task/*/comm).

Python before 3.14 leaves every thread's native name as the process's ("python"), so a look at a busy
server cannot tell its scheduler thread from its message threads, nor pin one apart from the others
(`bench/serve_load.py --pin`); a pipeline stage forked from its head keeps the head's command line,
so its name is what tells it apart. `name_native(name)`, called first thing on a thread (a process's
main thread names the process), gives it `name` (the first 15 bytes: Linux's limit); elsewhere it
does nothing.
"""

from __future__ import annotations

import sys

__all__ = ["name_native"]

_PR_SET_NAME = 15


def name_native(name: str) -> bool:
    """The calling thread's native name set to `name`, cut to 15 bytes; True where it was set (Linux),
    False elsewhere or when the C library refuses."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False

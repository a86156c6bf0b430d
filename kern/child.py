"""What a process forked to run something else (not exec'd) does first and last: the gate's zygote
children (`oracle/zygote.py`) and a pipeline head's warm stages (`serve/pipeline/forked.py`)."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Callable, NoReturn

__all__ = ["exit_with", "fresh_signals"]


def fresh_signals() -> None:
    """The signal handlers a fresh Python has (the parent's were the parent's): SIGTERM, SIGHUP and
    SIGCHLD default, SIGPIPE ignored (a write to a socket the client closed raises, it does not kill
    the process), SIGINT raising KeyboardInterrupt, no wakeup fd."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)


def exit_with(run: Callable[[], int | None]) -> NoReturn:
    """Run `run` and end this process with its code, never returning into the parent's stack: its
    return value (None: 0), a SystemExit's code (a message: 1, printed), else 1 with the traceback."""
    code = 1
    try:
        code = run() or 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - whatever it was, this process ends here
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

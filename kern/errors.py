"""The root of every exception kern defines: `except KernError` catches any of them, and nothing else.

Each class keeps its builtin base beside this one (`class ManifestError(KernError, ValueError)`), so a
caller's `except ValueError` still catches it. This module imports nothing of the project (a leaf), so
every package may import it, `pool/` and `verdicts/` included. `tests/test_names.py` fails on an
exception class of the project that is not a `KernError`.
"""

from __future__ import annotations

__all__ = ["KernError"]


class KernError(Exception):
    """Something kern itself refused or could not do (a bad manifest, a lost stage, a server gone)."""

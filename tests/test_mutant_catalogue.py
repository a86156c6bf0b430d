"""bench/mutant_catalogue.py stays planted: every mutant's snippet is found exactly once in the file it
names (code moved or rewritten leaves a mutant "stale", and its check is then shown able to fail by
nothing), and the checks it names exist."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from e2e.scenarios import CHECKS

ROOT = Path(__file__).resolve().parent.parent


def _catalogue():
    """bench/mutant_catalogue.py loaded by its path: bench/ on sys.path would let bench/serve.py shadow
    the serve package for every test after this one in the same process."""
    spec = importlib.util.spec_from_file_location("mutant_catalogue", ROOT / "bench" / "mutant_catalogue.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.CATALOGUE


CATALOGUE = _catalogue()


def test_every_mutant_plants_exactly_once_and_names_real_checks():
    stale = [f"{m.name}: {m.path} has its snippet {(ROOT / m.path).read_text().count(m.find)} times"
             for m in CATALOGUE if (ROOT / m.path).read_text().count(m.find) != 1]
    assert not stale, "\n".join(stale)
    unknown = [f"{m.name}: {c}" for m in CATALOGUE for c in m.checks if c not in CHECKS and c != "error"]
    assert not unknown, unknown

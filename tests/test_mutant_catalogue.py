"""bench/mutant_catalogue.py stays planted: every mutant's snippet is found exactly once in the file it
names (code moved or rewritten leaves a mutant "stale", and its check is then shown able to fail by
nothing), and the checks it names exist."""

from __future__ import annotations

from pathlib import Path

from e2e.scenarios import CHECKS
from conftest import bench_module

ROOT = Path(__file__).resolve().parent.parent


def _catalogue():
    return bench_module("mutant_catalogue").CATALOGUE


CATALOGUE = _catalogue()


def test_every_mutant_plants_exactly_once_and_names_real_checks():
    stale = [f"{m.name}: {m.path} has its snippet {(ROOT / m.path).read_text().count(m.find)} times"
             for m in CATALOGUE if (ROOT / m.path).read_text().count(m.find) != 1]
    assert not stale, "\n".join(stale)
    unknown = [f"{m.name}: {c}" for m in CATALOGUE for c in m.checks if c not in CHECKS and c != "error"]
    assert not unknown, unknown

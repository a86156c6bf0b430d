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


def test_gpu_only_mutants_are_left_out_of_a_cpu_run():
    """A mutant of GPU-only code is never gated on the CPU backend (it would survive there, untouched):
    `bench/mutants.py` reports it `gpu-only` and keeps it out of the kill rate; the catalogue has them."""
    from click.testing import CliRunner

    gpu = [m.name for m in CATALOGUE if m.backend == "gpu"]
    assert {"staging-ring-offset-kept", "landing-read-before-sync", "graph-key-ignores-batch"} <= set(gpu)
    assert all(m.backend in ("cpu", "gpu") for m in CATALOGUE)
    out = CliRunner().invoke(bench_module("mutants").main, ["--only", ",".join(gpu)])
    assert out.exit_code == 0, out.output
    assert out.output.count("gpu-only") >= len(gpu) and f"{len(gpu)} gpu-only not gated" in out.output, out.output
    assert "kill rate: 0/0" in out.output, out.output

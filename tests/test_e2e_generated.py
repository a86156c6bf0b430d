"""The generated session (e2e/scenarios/generated.py, issue 40): a workload drawn from --seed for any
engine, judged by answers and cached_tokens alone, in a cache it churns.

- Our own kern, the check named, passes it, and the workload draws every kind it has (the note's
  counts), evictions and hits included (/stats: kern has it).
- The paged engine (tests/engines/paged_engine.py) passes it clean and fails it with a block key that
  ignores its parent (`--bug chain`): a "spliced" prompt brings an earlier prompt's later blocks at
  the same positions behind another earlier prompt's cached head, and the engine serves them as
  cached (a hit over the bound; on toy-paged the answer itself is right).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from e2e.cli import main
from e2e.scenarios.generated import KINDS

ROOT = Path(__file__).resolve().parent.parent
PAGED = (f"{sys.executable} {ROOT / 'tests' / 'engines' / 'paged_engine.py'} --port {{port}} --model {{model}} "
         "--cache-tokens {cache_tokens}")


def gate(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), "--scenarios", "generated_equals_run", *args])
    checks = {c["name"]: c for p in out.glob("*/report.json") for c in json.loads(p.read_text())["checks"]}
    return exc.value.code, checks


def test_our_kern_passes_a_generated_workload_that_draws_every_kind(tmp_path, capsys):
    code, checks = gate(tmp_path, "--targets", "toy-paged")
    c = checks["generated_equals_run"]
    assert code == 0 and c["ok"] is True, capsys.readouterr().out[-3000:]
    counts = {k: int(n) for k, n in re.findall(r"(fresh|next turn|branch|spliced|repeat) (\d+)", c["note"])}
    assert set(counts) == set(KINDS) and all(n > 0 for n in counts.values()), c["note"]
    hits, sent = map(int, re.search(r"hits (\d+)/(\d+)", c["note"]).groups())
    evicted = int(re.search(r"/stats: (\d+) evictions", c["note"]).group(1))
    assert 0 < hits < sent and evicted > 0, c["note"]  # a churning cache: some hits, some evictions


@pytest.mark.parametrize("bug, ok", [(None, True), ("chain", False)])
def test_the_paged_engine_passes_clean_and_fails_with_a_key_that_ignores_its_parent(tmp_path, capsys, bug, ok):
    cmd = PAGED + (f" --bug {bug}" if bug else "")
    code, checks = gate(tmp_path, "--engine", cmd, "--targets", "toy-paged")
    c = checks["generated_equals_run"]
    assert (code, c["ok"]) == ((0, True) if ok else (1, False)), c["note"]
    if not ok:
        assert "spliced" in c["note"] and "the most it shares with anything sent" in c["note"], c["note"]

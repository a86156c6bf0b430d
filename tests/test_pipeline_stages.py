"""`kern serve toy-layers --stages N` for every N from 1 to the number of places the manifest can be
cut: each serves (a request answered as toy/model.py does, and at the default log level no per-item
lines) or is refused in one line with exit 2 (a stage that would hold no state: the head's pages mean
nothing to it)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import PROMPTS, REPO, ask, oracle
from test_pipeline_serve import TARGET, _ids, pytestmark  # noqa: F401  (the same skips)

from serve.pipeline.plan import PlanError, _cut, _cuts, _driven_calls


def _manifest():
    from manifests import load
    from manifests.config import resolve

    return load(resolve(TARGET).manifest)


def _places() -> int:
    m = _manifest()
    calls = _driven_calls(m)
    return len([a for a in range(1, calls) if _cuts(m, [a])])


def _serves(n: int) -> bool:
    """Whether N stages can each hold a state (the plan's own answer: refused ones raise)."""
    from serve.pipeline.plan import pipeline_paths

    try:
        pipeline_paths(TARGET, n, None, None, None, False)
    except PlanError:
        return False
    return True


try:
    PLACES = _places()
except Exception:  # no layered toy here: the module's skips say why
    PLACES = 0


@pytest.mark.parametrize("n", range(1, PLACES + 2))
def test_every_stage_count_serves_or_is_refused_in_one_line(kern_server, n):
    if not _serves(n):
        r = subprocess.run([sys.executable, "-m", "serve", TARGET, "--stages", str(n), "--backend", "cpu",
                            "--port", "0"], capture_output=True, text=True, timeout=120, cwd=REPO)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(lines) == 1 and lines[0].startswith("kern serve: error:"), r.stderr
        assert f"{n} stages" in lines[0], lines[0]
        assert n > len(_manifest().raw["states"])  # up to one stage per state, each holds one: those must serve
        return
    s = kern_server(TARGET, "--stages", str(n), "--pp-timeout", "60", "--log-level", "info")
    ids = _ids(PROMPTS[0])
    assert ask(s, ids, 8)["ids"] == oracle(TARGET, ids, 8)
    assert " pp item " not in s.log()  # one line per step per stage is debug


def test_a_cut_that_leaves_a_stage_without_state_is_refused():
    from serve.pipeline.plan import pipeline_paths

    assert not _cut(_manifest(), [1])[0].raw.get("states")  # the embed alone holds nothing
    with pytest.raises(PlanError, match="leaves stage.s. 0 holding no state"):
        pipeline_paths(TARGET, 2, "1", None, None, False)

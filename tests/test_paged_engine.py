"""The second outside engine (tests/engines/paged_engine.py, issue 39): a vLLM-style paged engine
written from docs/engine-contract.md, gated clean, and each of its planted prefix-cache bugs held to
failing the check that catches it."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
import threading
from pathlib import Path

import pytest

from e2e.cli import main

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "engines"))

from paged import bugs as planted  # noqa: E402
from paged.engine import Engine  # noqa: E402
from paged.toy import Attn, Paged  # noqa: E402

PAGED = (f"{sys.executable} {ROOT / 'tests' / 'engines' / 'paged_engine.py'} --port {{port}} --model {{model}} "
         "--cache-tokens {cache_tokens}")
CORE = {"conc1_equals_run", "turn2_warm_equals_run", "concurrent", "prefix_cold_warm_restored",
        "blocks_moved", "blocks_reparented", "block_edges", "cold_prefix_burst"}  # the wild workloads need only the core
SIZED = {"eviction_proven", "refcount_stress", "preempt_recompute", "freed_while_read",
         "generated_equals_run"}  # {cache_tokens} in the command


def gate(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), *args])
    reports = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/report.json")}
    return exc.value.code, reports


def failed(reports: dict, target: str) -> set[str]:
    return {c["name"] for c in reports[target]["checks"] if c["ok"] is False}


@pytest.mark.parametrize("target", ["toy-paged", "toy-stateful"])
def test_the_clean_paged_engine_passes_every_check_it_can_be_judged_on(tmp_path, capsys, target):
    code, reports = gate(tmp_path, "--engine", PAGED, "--targets", target)
    assert code == 0, capsys.readouterr().out[-3000:]
    got = {c["name"]: c for c in reports[target]["checks"]}
    assert {n for n, c in got.items() if c["ok"] is True} == CORE | SIZED | {"repeat_hit", "turn2_hit",
                                                                               "stream_equals_whole"}
    assert reports[target]["engine"]["name"] == "paged-engine"


CAUGHT = [
    # (bug, target, the check that fails)
    ("collide", "toy-paged", "concurrent"),
    ("partial-full", "toy-paged", "turn2_warm_equals_run"),
    ("last-token", "toy-paged", "repeat_hit"),            # prompt 4 is 80 bytes, 5 whole blocks
    ("evict-stale", "toy-paged", "prefix_cold_warm_restored"),
    ("mru", "toy-paged", "repeat_hit"),                   # the blank blocks outlive the cached ones
    ("eos-after-hit", "toy-paged", "turn2_warm_equals_run"),
    ("line-boundary", "toy-stateful", "turn2_warm_equals_run"),
    ("chain", "toy-paged", "blocks_reparented"),          # X.S, then Y.X, then Y.S: a hit past what was sent
    ("free-shared", "toy-attn", "freed_while_read"),  # readers of W still running when U takes W's blocks
    ("same-step", "toy-paged", "cold_prefix_burst"),      # a block read in the step it is written
    ("k-only", "toy-attn", "repeat_hit"),                 # a hit's K words written at the wrong positions
]


TRIES = {"same-step": 3, "free-shared": 3}
"""Bugs whose catch is the engine's timing, gated up to this many times (the test holds that one of them
fails): whether two requests of cold_burst's rounds share a step depends on when the engine's HTTP threads
hand them over. Measured with the 16 rounds: caught in 7 of 8 single runs beside three CPU burners, 16 of
16 at ten rounds beside one or none; so a miss in three runs is about one in 500 at that load. And whether
freed_while_read's readers still run when its unrelated prompt comes depends on how fast the gate's client
is beside the engine: on toy-attn (slower steps: each reads its context) it caught free-shared in 11 of 11
runs at load 15-25 on the 2-core box, on toy-paged in 5 of 11 (a fresh-clone CI at load 25 missed it once
there)."""


def test_every_planted_bug_has_a_case():
    assert {b for b, _, _ in CAUGHT} == set(planted.BUGS)


@pytest.mark.parametrize("bug, target, check", [pytest.param(*c, id=c[0]) for c in CAUGHT])
def test_each_planted_bug_fails_the_gate(tmp_path, capsys, bug, target, check):
    """Each bug is gated on the check that catches it (and what that check needs)."""
    for attempt in range(TRIES.get(bug, 1)):
        code, reports = gate(tmp_path / str(attempt), "--engine", PAGED + f" --bug {bug}", "--targets", target,
                             "--scenarios", check)
        if code == 1:
            break
    out = capsys.readouterr().out
    assert code == 1, f"--bug {bug} passed the gate on {target}"
    assert check in failed(reports, target), f"--bug {bug}: failed {failed(reports, target)}; {out[-2000:]}"


# -- the attn family, in process, against the reference --------------------------------------------

def attn_reference():
    """toy.model's generate_attn, or the file KERN_ATTN_REFERENCE names (a tree where toy-attn is
    defined and not yet merged here); None skips."""
    from toy import model
    if hasattr(model, "generate_attn"):
        return model.generate_attn
    path = os.environ.get("KERN_ATTN_REFERENCE")
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("attn_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.generate_attn


@pytest.fixture
def engine(request):
    """An in-process engine on a family, the bug named by the test's parameter (or none) switched on."""
    started = []

    def make(family, bug=None, blocks=256):
        planted.set_bug(bug)
        e = Engine(family, blocks, 16)
        threading.Thread(target=e.run, daemon=True).start()
        started.append(e)
        return e

    yield make
    planted.set_bug(None)


def answer(e: Engine, ids: list[int], max_tokens: int = 48) -> tuple[list[int], int]:
    s = e.submit(ids, max_tokens)
    assert s.done.wait(60) and s.error is None, s.error
    return (s.out[:-1] if s.finish == "stop" else s.out), s.cached


def prompts(seed: int, lengths) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(256) for _ in range(n)] for n in lengths]


def test_the_attn_family_answers_as_the_reference_cold_warm_and_together(engine):
    ref = attn_reference()
    if ref is None:
        pytest.skip("toy-attn is not in this tree's toy/model.py (set KERN_ATTN_REFERENCE to a model.py that has it)")
    e = engine(Attn())
    ps = prompts(1, (5, 31, 32, 33, 100, 200))
    for p in ps:
        want = ref(p, 48)
        assert answer(e, p) == (want, 0)
        got, cached = answer(e, p)
        assert got == want and cached == (len(p) - 1) // 16 * 16
    seqs = [e.submit(p + [7], 48) for p in ps]  # all at once: one batch, hits and prefill chunks mixed
    for p, s in zip(ps, seqs):
        assert s.done.wait(60)
        assert (s.out[:-1] if s.finish == "stop" else s.out) == ref(p + [7], 48)


def test_k_only_changes_the_attn_answer_after_a_hit(engine):
    ref = attn_reference()
    if ref is None:
        pytest.skip("toy-attn is not in this tree's toy/model.py")
    p = prompts(2, (90,))[0]
    e = engine(Attn(), bug="k-only")
    assert answer(e, p)[0] == ref(p, 48)  # cold: nothing was hit, K is right
    got, cached = answer(e, p)
    assert cached == 80 and got != ref(p, 48)


def test_a_chain_key_without_its_parent_is_wrong_on_attn_and_invisible_on_paged(engine):
    """X·S, Y·X, then Y·S: Y's block is cached, and S's blocks are found under X's prefix. Only an entry
    that reads its prefix (toy-attn) shows it; toy-paged's entries at those positions are the same."""
    ref = attn_reference()
    if ref is None:
        pytest.skip("toy-attn is not in this tree's toy/model.py")
    x, y, s = prompts(3, (16, 16, 40))
    a = engine(Attn(), bug="chain")
    answer(a, x + s)
    answer(a, y + x)
    got, cached = answer(a, y + s)
    assert cached == 48 and got != ref(y + s, 48)
    from toy import model
    manifest = json.loads((ROOT / "manifests" / "toy" / "toy-paged.json").read_text())
    b = engine(Paged(), bug="chain")
    answer(b, x + s)
    answer(b, y + x)
    assert answer(b, y + s) == (model.generate(y + s, 48, manifest), 48)

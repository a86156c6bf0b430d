"""`e2e --processes N` (e2e/shards.py): the targets split over N gate processes, merged back as one gate.

Properties held here:
- `split` puts every target in exactly one non-empty group, keeps the chosen order within a group, and
  its groups' costs differ by at most the costliest target's (the largest-first rule's bound).
- Every `GateFlags` field is either passed to a child as given, given its own value there, or keeps the
  gate in one process; a child's command line parses back to the parent's flags but for those of its own.
- End to end: a pipeline target and its single-process twin in two different processes still get
  `stages_equal_single` judged (the parent compares them; neither child could), every target's folder
  resolves under OUT, and the exit code is the one gate's."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from e2e.cli import _greedy, cli
from e2e.config import GateTarget
from e2e.flags import GateFlags
from e2e.shards import OWN, PASSED, SINGLE, SWITCHES, child_argv, split, why_single
from tests.test_e2e_driver import EXIT_PASS, checks, gate


def _target(i: int, stages: int) -> GateTarget:
    return GateTarget(name=f"t{i}", manifest=Path("m.json"), reference=None, weights=(), model="toy", lined=False,
                      widest=1, ranks=1, skipped=None, stages=stages)


@given(st.lists(st.integers(1, 3), min_size=1, max_size=12), st.integers(1, 6))
def test_split_covers_every_target_once_in_order_and_evenly(stages, n):
    chosen = [_target(i, s) for i, s in enumerate(stages)]
    groups = split(chosen, n)
    assert 1 <= len(groups) <= n and all(groups)
    names = [t.name for g in groups for t in g]
    assert sorted(names) == sorted(t.name for t in chosen) and len(set(names)) == len(names)
    for g in groups:
        idx = [chosen.index(t) for t in g]
        assert idx == sorted(idx)
    loads = [sum(t.stages for t in g) for g in groups]
    assert max(loads) - min(loads) <= max(stages) or len(groups) < n


def test_every_flag_is_passed_owned_or_keeps_one_process():
    fields = {f.name for f in dataclasses.fields(GateFlags)}
    assert fields == set(PASSED) | set(SWITCHES) | set(OWN) | set(SINGLE), fields ^ (set(PASSED) | set(SWITCHES) | set(OWN) | set(SINGLE))


def test_a_childs_command_line_parses_back_to_the_parents_flags_but_its_own():
    f = GateFlags(config="x.toml", scenarios=("repeat_hit", "concurrent"), max_tokens=9, backend="cpu",
                  capacity=777, server_flags="--decode-steps 4 --capacity 99", load_timeout=12.5, jobs=3, seed=5,
                  zygote=False, reference_worker=True, at_once=False, no_reference=True, targets=("a", "b"),
                  out="o", hosts=4, processes=2, junit_path="j.xml")
    argv = child_argv(f, ["t1", "t2"], Path("/tmp/o/shards/0"), 2)
    ctx = cli.make_context("e2e", _greedy(argv[3:]))
    back = GateFlags(**ctx.params)
    own = {"targets": ("t1", "t2"), "out": "/tmp/o/shards/0", "hosts": 2, "processes": 1, "junit_path": None}
    assert back == dataclasses.replace(f, **own), (back, shlex.join(argv))


def test_flags_that_keep_the_gate_in_one_process_say_which():
    assert why_single(GateFlags()) is None
    assert "--engine" in why_single(GateFlags(engine_cmd="python e.py --port {port}"))
    assert "--port" in why_single(GateFlags(port=8100))


def test_a_pipeline_and_its_twin_in_two_processes_are_still_compared(tmp_path):
    code, reports = gate(tmp_path, "--targets", "toy-layers", "toy-layers-pp2", "--processes", "2",
                         "--scenarios", "conc1_equals_run,repeat_hit,stages_equal_single", max_tokens=8)
    out = tmp_path / "results"
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["0", "1"]
    assert all((out / t).is_symlink() and (out / t / "report.json").is_file() for t in ("toy-layers", "toy-layers-pp2"))
    staged = checks(reports["toy-layers-pp2"])["stages_equal_single"]
    assert staged["ok"] is True, staged
    assert code == EXIT_PASS, reports
    summary = (out / "summary.md").read_text()
    assert "2 gate processes" in summary and "toy-layers-pp2" in summary and "toy-layers |" in summary

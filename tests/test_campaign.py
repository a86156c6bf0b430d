"""`e2e-campaign`: independent gate runs (engine, version, seed cells) through one executor seam, as
local processes or as tasks of a Ray cluster (here a local Ray head the test starts and stops).

Three cells of the dict engine (tests/engines/dict_engine.py): clean at two seeds (expect exit 0) and
with a planted bug (`off-by-one`, caught by conc1_equals_run: expect 1). Each cell must end as expected
with its checks read back from its own results, and under --ray each must have run as a Ray task."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from e2e.campaign import Cell, Local, Result, campaign, load_cells, main, rounds_of, rounds_table, table
from e2e.session import free_port

ROOT = Path(__file__).resolve().parent.parent
DICT = "python tests/engines/dict_engine.py --port {port} --model {model}"
CELLS = """
[[cell]]
name = "dict-seed-1"
args = ["--engine", "%(d)s", "--targets", "toy-paged", "--scenarios", "conc1_equals_run", "--seed", "1"]
expect = 0

[[cell]]
name = "dict-seed-2"
args = ["--engine", "%(d)s", "--targets", "toy-paged", "--scenarios", "conc1_equals_run", "--seed", "2"]
env = { KERN_CAMPAIGN_TEST = "2" }
expect = 0

[[cell]]
name = "dict-off-by-one"
args = ["--engine", "%(d)s --bug off-by-one", "--targets", "toy-paged", "--scenarios", "conc1_equals_run"]
expect = 1
""" % {"d": DICT}


@pytest.fixture
def cells_file(tmp_path) -> Path:
    p = tmp_path / "cells.toml"
    p.write_text(CELLS)
    return p


def _judge(results) -> None:
    by = {r.cell: r for r in results}
    assert [by[n].code for n in ("dict-seed-1", "dict-seed-2", "dict-off-by-one")] == [0, 0, 1], by
    assert by["dict-seed-1"].checks["passed"] == 1 and by["dict-seed-1"].checks["failed"] == 0
    assert by["dict-off-by-one"].checks["failed"] == 1
    assert by["dict-off-by-one"].first_failure.startswith("toy-paged: conc1_equals_run")


def test_local_cells_each_end_as_expected(cells_file, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cells = load_cells(cells_file)
    results = campaign(cells, Local(jobs=2), tmp_path / "out", say=lambda s: None)
    _judge(results)
    assert all("Ray node" not in r.host for r in results)
    rows = {cols[0]: cols for cols in ([c.strip() for c in line.strip("|").split("|")]
                                       for line in table(cells, results).splitlines()[2:])}
    assert rows["dict-off-by-one"][1:4] == ["1", "1", "yes"], rows
    assert rows["dict-seed-1"][1:4] == ["0", "0", "yes"], rows
    assert (tmp_path / "out" / "campaign.json").is_file()
    assert (tmp_path / "out" / "dict-seed-2" / "toy-paged" / "report.json").is_file()


@pytest.fixture
def ray_head(tmp_path):
    """A local Ray head on 127.0.0.1 (2 CPUs, no dashboard) on a port no `--port 0` server can take,
    stopped with its process group after. Its output goes to a log whose tail a failed start shows."""
    pytest.importorskip("ray")
    port = free_port()  # below the ephemeral range: no `--port 0` server takes it first
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--port", str(port), "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
           "--temp-dir", tempfile.mkdtemp(prefix="ray", dir="/tmp")]  # short: Ray's socket paths have a limit
    if not Path(cmd[0]).exists():
        cmd[0:1] = [sys.executable, "-m", "ray.scripts.scripts"]
    log = tmp_path / "ray-head.log"
    with log.open("wb") as out:
        head = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if head.poll() is not None:
                pytest.fail(f"ray start --head exited {head.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
    else:
        pytest.fail(f"the Ray head did not listen within 60 s:\n{log.read_text(errors='replace')[-3000:]}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(5)  # `ray start --block` took over 30 s to end on SIGTERM (the suite's longest teardown)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(cmd[-1], ignore_errors=True)


def test_cells_fan_out_over_a_local_ray_head(cells_file, tmp_path, monkeypatch, ray_head, capsys):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exc:
        main([str(cells_file), "--out", str(tmp_path / "out"), "--ray", ray_head])
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    import json

    results = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert {r["cell"]: r["code"] for r in results} == {"dict-seed-1": 0, "dict-seed-2": 0, "dict-off-by-one": 1}
    assert all("(Ray node " in r["host"] and f"pid {os.getpid()} " not in r["host"] for r in results), results
    assert f"3 cell(s) from {cells_file} on the Ray cluster at {ray_head}" in out


def test_a_cell_that_misses_its_expectation_fails_the_campaign(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    p = tmp_path / "cells.toml"
    p.write_text('[[cell]]\nname = "clean-said-buggy"\nargs = ["--engine", "%s", "--targets", "toy-paged", '
                 '"--scenarios", "conc1_equals_run"]\nexpect = 1\n' % DICT)
    with pytest.raises(SystemExit) as exc:
        main([str(p), "--out", str(tmp_path / "out")])
    assert exc.value.code == 1
    assert "clean-said-buggy: exit 0, expected 1" in capsys.readouterr().err


@pytest.mark.parametrize("text, named", [
    ('[[cell]]\nname = "a"\nargs = ["--out", "x"]\n', "without --out"),
    ('[[cell]]\nname = "a"\n[[cell]]\nname = "a"\n', "unique"),
    ('[[cell]]\nname = "a"\nexpect = "0"\n', "`expect` must be an exit code"),
    ('x = 1\n', "no [[cell]] tables"),
    ('[[cell]\n', "cells.toml"),
])
def test_a_bad_campaign_file_is_named(tmp_path, text, named):
    import click

    p = tmp_path / "cells.toml"
    p.write_text(text)
    with pytest.raises(click.UsageError, match=None) as exc:
        load_cells(p)
    assert named in str(exc.value.message)


def test_rounds_run_every_cell_round_after_round_and_the_table_counts_each_cells_runs():
    """--rounds N: every cell once, then again (round-major), each run named <cell>.r<k>; a cell's row
    counts only its own runs (a cell whose name is another's prefix included), how many ended as expected,
    and the checks failed over all of them, most often first."""
    cells = [Cell("clean", ("a",), (), 0), Cell("clean.x", ("b",), (), 1)]
    runs = rounds_of(cells, 3)
    assert [r.name for r in runs] == ["clean.r1", "clean.x.r1", "clean.r2", "clean.x.r2", "clean.r3", "clean.x.r3"]
    assert rounds_of(cells, 1) == cells
    codes = {"clean.r1": 0, "clean.r2": 1, "clean.r3": 0, "clean.x.r1": 1, "clean.x.r2": 1, "clean.x.r3": 0}
    fails = {"clean.r2": ["toy-paged: repeat_hit"], "clean.x.r1": ["toy-paged: a", "toy-attn: b"],
             "clean.x.r2": ["toy-paged: a"]}
    results = [Result(n, codes[n], 10.0 + i, "h", failed=fails.get(n, [])) for i, n in enumerate(codes)]
    rows = {cols[0]: cols for cols in ([c.strip() for c in line.strip("|").split("|")]
                                       for line in rounds_table(cells, results).splitlines()[2:])}
    assert rows["clean"][1:5] == ["0", "3", "2 of 3", "10-12"], rows
    assert rows["clean"][5] == "toy-paged: repeat_hit 1"
    assert rows["clean.x"][1:5] == ["1", "3", "2 of 3", "13-15"], rows
    assert rows["clean.x"][5] == "toy-paged: a 2, toy-attn: b 1"


def test_the_paged_engines_campaign_names_every_planted_bug_once():
    sys.path.insert(0, str(ROOT / "tests" / "engines"))
    from paged.bugs import BUGS

    cells = load_cells(ROOT / "tests" / "engines" / "paged" / "campaign.toml")
    assert [(c.name, c.expect) for c in cells] == [("clean", 0)] + [(b, 1) for b in BUGS]
    assert all(dict(c.env).get("KERN_ENGINE_BUG") == c.name for c in cells[1:]) and not cells[0].env
    assert all("{cache_tokens}" in c.args[1] for c in cells)


def test_only_runs_the_named_cells_and_names_an_unknown_one(cells_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exc:
        main([str(cells_file), "--out", str(tmp_path / "out"), "--only", "dict-seed-1,nope"])
    assert exc.value.code == 2 and "no cell named nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([str(cells_file), "--out", str(tmp_path / "out"), "--only", "dict-off-by-one"])
    assert exc.value.code == 0
    assert [p.name for p in (tmp_path / "out").iterdir() if p.is_dir()] == ["dict-off-by-one"]

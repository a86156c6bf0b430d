"""tests/conftest.py's `pytest_cmdline_main`: the whole suite runs on xdist workers, a few named
tests (files, node ids, `-k`) run in process, and `-n` given wins. Each case runs pytest on a tiny
project whose conftest is ours and reads where its tests ran."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

REPO = Path(__file__).resolve().parents[1]

PROBE = '''
import os
from pathlib import Path

def test_where(request):
    out = Path(os.environ["PROBE_OUT"]) / request.node.nodeid.replace("/", "_").replace(":", "_")
    out.write_text(os.environ.get("PYTEST_XDIST_WORKER", "in-process"))
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("proj")
    (root / "tests").mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", root / "tests" / "conftest.py")
    (root / "tests" / "test_a.py").write_text(PROBE)
    (root / "tests" / "test_b.py").write_text(PROBE)
    # the same ini as ours: testpaths, and addopts without -n
    ini = (REPO / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(ini[ini.index("[tool.pytest.ini_options]"):])
    return root


def where(project: Path, *args: str) -> set[str]:
    """Where the run's tests ran: `in-process`, or xdist worker ids (gw0, ...)."""
    out = project / f"out{len(list(project.glob('out*')))}"
    out.mkdir()
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PROBE_OUT": str(out)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=project,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = {f.read_text() for f in out.iterdir()}
    assert ran, r.stdout + r.stderr
    return ran


def test_the_whole_suite_runs_on_workers(project):
    assert "in-process" not in where(project)


def test_a_directory_runs_on_workers(project):
    assert "in-process" not in where(project, "tests")


def test_one_file_runs_in_process(project):
    assert where(project, "tests/test_a.py") == {"in-process"}


def test_a_node_id_and_k_run_in_process(project):
    assert where(project, "tests/test_a.py::test_where") == {"in-process"}
    assert where(project, "-k", "where") == {"in-process"}


def test_n_given_wins(project):
    assert "in-process" not in where(project, "-n", "2", "tests/test_a.py")
    assert where(project, "-n0") == {"in-process"}

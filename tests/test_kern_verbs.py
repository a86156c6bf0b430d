"""`kern verify` and `kern test --json` as a user runs them: the shipped manifests verify and print
what they derive, a corrupted copy is refused in one line naming its problem, nothing is compiled,
and `kern test --json`'s object says what its lines say."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from manifests import load, page_unit, reach
from manifests.config import PACKAGED, PACKAGED_PP, load_config
from kern.cli import main
from tests.test_oracle_cli import broken_candidate
from tests.toyrun import CONFIG, manifest_path

SHIPPED = sorted(manifest_path("toy-paged").parent.glob("*.json"))
TARGETS = sorted({*load_config(PACKAGED).targets, *load_config(PACKAGED_PP).targets})
KERN = [sys.executable, "-m", "kern.cli"]


def kern(*args):
    return subprocess.run([*KERN, *args], capture_output=True, text=True, timeout=600)


def verify_in_process(*args):
    r = CliRunner().invoke(main, ["verify", *args], prog_name="kern")
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_manifest_verifies_and_prints_its_geometry(path):
    m = load(path)
    r = verify_in_process(str(path))
    assert r.exit_code == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == f"{m.model}: verified (schema {m.schema_version})"
    assert f"  page {page_unit(m)} tokens, reach {reach(m)} tokens a sequence" in out
    assert [line.split(":")[0] for line in out if line.startswith("  state ")] == [
        f"  state {s}" for s in sorted(m.states)]
    for pin in m.weights.values():
        assert any(line.startswith("  weights ") and f"sha256 {pin[:16]}... matches" in line for line in out), out
    for p in m.programs.values():
        head = next(i for i, line in enumerate(out) if line.startswith(f"  program {p.name}"))
        assert out[head].endswith(f": {len(p.calls)} calls")
        calls = out[head + 1:head + 1 + len(p.calls)]
        assert [c.split("(")[0].strip() for c in calls] == [c.op for c in p.calls], calls
    d = json.loads(verify_in_process(str(path), "--json").stdout)
    assert (d["page_tokens"], d["reach_tokens"]) == (page_unit(m), reach(m))
    assert [p["name"] for p in d["programs"]] == list(m.programs)
    pins = {Path(w["file"]).name: w["sha256"] for w in d["weights"]}  # every *.safetensors beside it, pinned or not
    assert {n: pins.get(n) for n in m.weights} == m.weights


@pytest.mark.parametrize("name", TARGETS)
def test_every_target_verifies_by_name(name):
    r = verify_in_process(name)
    assert r.exit_code == 0 and r.stdout.splitlines()[0].endswith(": verified (schema 5)"), r.stdout + r.stderr


def _copy(tmp_path) -> Path:
    """toy-layers (two pinned weights files, two kernel modules) copied with its weights."""
    src = manifest_path("toy-layers")
    for f in (src, src.parent / "salt.safetensors", src.parent / "layers.safetensors"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / src.name


def _edit(path: Path, change) -> None:
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "weights file bytes": (lambda p: _flip_byte(p.parent / "layers.safetensors"),
                           ("layers.safetensors: sha256 ", "but the manifest pins layers.safetensors")),
    "weights file missing": (lambda p: (p.parent / "layers.safetensors").unlink(),
                             ("weights.layers.safetensors: pinned file layers.safetensors is not among",)),
    "weights pin": (lambda p: _edit(p, lambda raw: raw["weights"]["salt.safetensors"].update(sha256="abc")),
                    ("weights.salt.safetensors.sha256: expected 64 lowercase hex digits",)),
    "module sha256": (lambda p: _edit(p, lambda raw: next(iter(raw["modules"].values())).update(sha256="0" * 64)),
                      ("modules.", ".sha256: does not match the kernels' sources")),
    "bad field": (lambda p: _edit(p, lambda raw: raw["buffers"]["salt"].update(dtype="i63")),
                  ("buffers.salt.dtype", "i63")),
    "manifest missing": (lambda p: p.unlink(), ("toy-layers.json does not exist",)),
    "not JSON": (lambda p: p.write_text("{"), ("toy-layers.json: not valid JSON",)),
}


@pytest.mark.parametrize("what", CORRUPTIONS)
def test_a_corrupted_copy_exits_1_with_one_line_naming_its_problem(tmp_path, what):
    path = _copy(tmp_path)
    assert kern("verify", str(path)).returncode == 0  # the copy itself verifies
    corrupt, named = CORRUPTIONS[what]
    corrupt(path)
    r = kern("verify", str(path))
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kern verify: "), r.stderr
    assert all(n in lines[0] for n in named), lines[0]
    assert "Traceback" not in r.stderr


def test_no_weights_checks_the_manifest_alone(tmp_path):
    path = _copy(tmp_path)
    (tmp_path / "layers.safetensors").unlink()
    assert kern("verify", str(path)).returncode == 1
    r = kern("verify", str(path), "--no-weights")
    assert r.returncode == 0 and "  weights " not in r.stdout, r.stdout + r.stderr


def test_verify_compiles_nothing_and_makes_no_device():
    """numba (the CPU kernels) and cupy (the GPU) are never imported: no build, no backend."""
    code = ("import json, sys; from kern.cli import run_command; c = run_command(['verify', 'toy-layers']); "
            "print(json.dumps([c, 'numba' in sys.modules, 'cupy' in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert json.loads(r.stdout.splitlines()[-1]) == [0, False, False], r.stdout + r.stderr


def _test_args(tmp_path, verdict):
    if verdict == "FAIL":
        return ["--manifest", str(broken_candidate(tmp_path)), "--reference", str(CONFIG.targets["toy-paged"].reference)]
    return ["toy-paged", "--steps", "8" if verdict == "PASS" else "100000"]


@pytest.mark.parametrize("verdict", ["PASS", "FAIL", "INCONCLUSIVE"])
def test_kern_test_json_counts_match_its_lines(tmp_path, verdict):
    args = _test_args(tmp_path, verdict)
    text, js = kern("test", *args), kern("test", *args, "--json")
    assert len(js.stdout.splitlines()) == 1, js.stdout
    d = json.loads(js.stdout)
    assert d["verdict"] == verdict and d["exit"] == js.returncode == text.returncode, js.stdout + text.stderr
    assert d["exit_codes"] == {"0": "PASS", "1": "FAIL", "2": "INCONCLUSIVE"}
    lines = text.stdout.splitlines()
    assert lines[-1] == f"{d['verdict']}: {d['summary']}"
    marks = [line.split()[0] for line in lines[:-1]]
    c = d["counts"]
    assert (c["cases"], c["pass"], c["fail"], c["skip"]) == (
        len(marks), marks.count("ok"), marks.count("FAIL"), marks.count("skip")), (c, marks)
    assert c["ran"] == c["pass"] + c["fail"] and c[{"PASS": "pass", "FAIL": "fail", "INCONCLUSIVE": "skip"}[verdict]] > 0
    assert [f"{x['case']}: {x['detail']}" for x in d["cases"]] == [line.split(None, 1)[1] for line in lines[:-1]]


def test_the_kern_cli_keeps_its_functions_short_and_their_parameters_few():
    """kern/cli.py: no function over 60 lines or 12 parameters; a `**flags` only on a click command
    whose first statement builds its options dataclass from them (as `kern run` does)."""
    import ast

    tree = ast.parse((Path(__file__).parent.parent / "kern" / "cli.py").read_text())
    bad = []
    for f in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        a = f.args
        params = len(a.posonlyargs + a.args + a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
        if f.end_lineno - f.lineno + 1 > 60 or params > 12:
            bad.append(f"{f.name}: {f.end_lineno - f.lineno + 1} lines, {params} parameters")
        if a.kwarg is not None:
            first = next(s for s in f.body if not isinstance(s, ast.Expr))  # past the docstring
            builds = isinstance(first, ast.Assign) and isinstance(first.value, ast.Call) and any(
                isinstance(k.value, ast.Name) and k.value.id == a.kwarg.arg and k.arg is None for k in first.value.keywords)
            if not builds:
                bad.append(f"{f.name}: **{a.kwarg.arg} not built at once into an options object")
    assert bad == []


VERBS = ("cut", "gen", "replay", "run", "serve", "server", "test", "verify")


def test_every_verb_answers_help_and_the_gates_hosts_stay_hidden():
    """`kern --help` lists the user's verbs, each of which answers its own --help (exit 0); the gate's
    `kern zygote` and `kern host` are left out of the list, and theirs is their own parser's."""
    r = CliRunner().invoke(main, ["--help"], prog_name="kern")
    listed = tuple(line.split()[0] for line in r.output.split("Commands:")[1].splitlines() if line[:3].strip())
    assert r.exit_code == 0 and listed == VERBS, r.output
    for verb in VERBS:
        h = CliRunner().invoke(main, [verb, "--help"], prog_name="kern")
        assert h.exit_code == 0 and h.output.startswith(f"Usage: kern {verb} "), (verb, h.output)
    for verb in ("zygote", "host"):
        h = subprocess.run([*KERN, verb, "--help"], capture_output=True, text=True, timeout=120)
        assert h.returncode == 0 and h.stdout.startswith(f"usage: kern {verb} "), (verb, h.stdout + h.stderr)

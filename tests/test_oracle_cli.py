"""`kern run`, `kern test` and `kern gen` as a user runs them: answers, verdicts, exit codes, errors."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from manifests import load
from oracle.abtest import FAIL, INCONCLUSIVE, PASS, ab_test
from tests.toyrun import SHAPES, CONFIG, manifest_path, target
from toy import model

KERN = [sys.executable, "-m", "kern.cli"]


def kern(*args, cwd=None):
    return subprocess.run([*KERN, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_kern_run_prints_the_models_ids_on_stderr():
    r = kern("run", "toy-stateful", "--prompt-ids", "1,2,3", "--steps", "12")
    assert r.returncode == 0, r.stderr
    want = model.generate([1, 2, 3], 12, target("toy-stateful")[0].raw)
    assert r.stderr.strip().splitlines()[-1] == f"generated ids: {want}"


def test_kern_run_json_and_text_prompt():
    r = kern("run", "toy-spec", "--prompt", "Hello there", "--steps", "20", "--chunk", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ids"] == model.generate(list(b"Hello there"), 20, target("toy-spec")[0].raw)
    assert out["rows"] == 4


def test_kern_run_takes_a_manifest_path_with_weights_beside_it():
    r = kern("run", str(manifest_path("toy-paged")), "--prompt-ids", "7,8,9", "--steps", "5", "--rows", "1")
    assert r.returncode == 0, r.stderr
    assert f"generated ids: {model.generate([7, 8, 9], 5, target('toy-paged')[0].raw)}" in r.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        pytest.param(["run", "toy-nope"], "unknown target 'toy-nope'", id="unknown-target"),
        pytest.param(["run", "toy-paged", "--prompt-ids", "1,2,257"], "0..256", id="id-out-of-vocab"),
        pytest.param(["run", "toy-paged", "--prompt-ids", "1,-1"], "0..256", id="negative-id"),
        pytest.param(["run", "toy-paged", "--steps", "0"], "--steps must be >= 1", id="steps-0"),
        pytest.param(["run", "toy-paged", "--rows", "4"], "--rows 4", id="rows-not-declared"),
        pytest.param(["run", "toy-paged", "--chunk", "5000"], "--chunk 5000", id="chunk-over"),
        pytest.param(["run", "toy-paged", "--steps", "9000"], "reach", id="over-reach"),
        pytest.param(["run", "no/such.json"], "does not exist", id="missing-manifest"),
    ],
)
def test_bad_input_is_one_clear_line(args, needle):
    r = kern(*args)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("kern: error:"), r.stderr
    assert needle in lines[0]


def test_malformed_manifest_is_one_clear_line(tmp_path):
    bad = json.loads(manifest_path("toy-paged").read_text())
    bad["buffers"]["salt"]["dtype"] = "i63"
    bad["vars"]["typo"] = {"max": 4, "axis": "sideways"}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    r = kern("run", str(tmp_path / "bad.json"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    (line,) = [l for l in r.stderr.splitlines() if l.strip()]
    assert "buffers.salt.dtype" in line and "vars.typo.axis" in line
    (tmp_path / "worse.json").write_text("{")
    r = kern("run", str(tmp_path / "worse.json"))
    assert r.returncode != 0 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("shape", SHAPES)
def test_kern_test_passes_on_every_shape(shape):
    t = CONFIG.targets[shape]
    lines = []
    code = ab_test(load(t.reference), load(t.manifest), [str(w) for w in t.weights], 16, "cpu", lines.append)
    assert code == PASS, "\n".join(lines)
    assert lines[-1].startswith("PASS")


def broken_candidate(tmp_path, shape="toy-paged"):
    """A candidate whose write kernel fills only half of each token slot (a short copy)."""
    raw = json.loads(manifest_path(shape).read_text())
    launch = raw["ops"]["write"]["impl"]["launches"][0]
    launch["args"][-1] = {"i64": raw["states"]["kv"]["bytes_per_token"] // 2}
    (tmp_path / "broken.json").write_text(json.dumps(raw))
    shutil.copy(CONFIG.targets[shape].weights[0], tmp_path / "salt.safetensors")
    return tmp_path / "broken.json"


def test_kern_test_fails_a_broken_candidate(tmp_path):
    cand = broken_candidate(tmp_path)
    r = kern("test", "--manifest", str(cand), "--reference", str(CONFIG.targets["toy-paged"].reference))
    assert r.returncode == FAIL, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("FAIL")


def test_kern_test_cli_passes_and_is_inconclusive_when_nothing_runs():
    r = kern("test", "toy-paged", "--steps", "8")
    assert r.returncode == PASS and r.stdout.strip().splitlines()[-1].startswith("PASS"), r.stdout + r.stderr
    r = kern("test", "toy-paged", "--steps", "100000")
    assert r.returncode == INCONCLUSIVE and r.stdout.strip().splitlines()[-1].startswith("INCONCLUSIVE")


def test_kern_test_json_is_one_object_with_every_case(tmp_path):
    r = kern("test", "toy-paged", "--steps", "8", "--json")
    d = json.loads(r.stdout)
    assert r.returncode == PASS == d["exit"] and d["verdict"] == "PASS", r.stdout + r.stderr
    assert d["cases"] and all(c["status"] == "pass" and c["case"].startswith("prompt ") for c in d["cases"])
    assert d["summary"] == f"{len(d['cases'])}/{len(d['cases'])} cases identical (ids and state bytes)"
    r = kern("test", "--manifest", str(broken_candidate(tmp_path)), "--reference",
             str(CONFIG.targets["toy-paged"].reference), "--json")
    d = json.loads(r.stdout)
    assert r.returncode == FAIL == d["exit"] and d["verdict"] == "FAIL"
    assert all(c["status"] == "fail" for c in d["cases"]) and "differ" in d["cases"][0]["detail"]


def test_kern_verify_prints_the_derived_geometry_or_names_the_problem(tmp_path):
    r = kern("verify", "toy-paged")
    assert r.returncode == 0, r.stderr
    assert "state kv: paged, 4096 bytes/token" in r.stdout and "page 16 tokens, reach 8192 tokens" in r.stdout
    assert re.search(r"program decode, groups 256, rows 1 \[graph\]: 2 calls\n    write\(", r.stdout), r.stdout
    d = json.loads(kern("verify", str(manifest_path("toy-layers")), "--json").stdout)
    assert [s["name"] for s in d["states"]] == ["kv.0", "kv.1", "kv.2", "kv.3"] and d["reach_tokens"] == 32768
    assert [c["label"] for c in next(p for p in d["programs"] if p["name"] == "decode")["calls"]] == [
        "embed", "layer.0", "layer.1", "layer.2", "layer.3", "head"]
    bad = json.loads(manifest_path("toy-paged").read_text())
    bad["buffers"]["salt"]["dtype"] = "i63"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    r = kern("verify", str(tmp_path / "bad.json"))
    assert r.returncode == 1 and "buffers.salt.dtype" in r.stderr and "Traceback" not in r.stderr
    r = kern("verify", "no-such-target")
    assert r.returncode == 1 and "unknown target 'no-such-target'" in r.stderr and "Traceback" not in r.stderr


def test_kern_gen_writes_the_shipped_set(tmp_path):
    r = kern("gen", "--out", str(tmp_path))
    assert r.returncode == 0 and re.search(r"\b\d+ manifests, salt and config", r.stdout), r.stdout
    for name in ("toy-paged.json", "toy-big-ref.json", "salt.safetensors"):
        assert (tmp_path / "toy" / name).read_bytes() == (manifest_path("toy-paged").parent / name).read_bytes()


def test_every_command_has_help():
    for cmd in ([], ["run"], ["test"], ["gen"], ["verify"]):
        r = kern(*cmd, "--help")
        assert r.returncode == 0 and "Usage:" in r.stdout


def test_kern_run_prompts_file_answers_each_line_as_the_model(tmp_path):
    """Each line of --prompts-file is its own sequence: one JSON answer a line, in order, each the
    model's (a speculative target, so every line runs rounds through one process's runtime)."""
    prompts = [[1, 2, 3], list(b"Hello there"), [7] * 40]
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in prompts) + "\n")
    r = kern("run", "toy-stateful-spec", "--prompts-file", str(f), "--steps", "16", "--json")
    assert r.returncode == 0, r.stderr
    outs = [json.loads(line) for line in r.stdout.splitlines()]
    raw = target("toy-stateful-spec")[0].raw
    assert [o["prompt_ids"] for o in outs] == prompts
    assert [o["ids"] for o in outs] == [model.generate(p, 16, raw) for p in prompts]


@pytest.mark.parametrize("line, says", [('[1, "a"]', "list of token ids"), ("[]", "list of token ids"),
                                        ("{", "not JSON"), ("[1, 999]", "0..256")])
def test_kern_run_prompts_file_refuses_a_bad_line_by_its_number(tmp_path, line, says):
    f = tmp_path / "prompts.jsonl"
    f.write_text("[1, 2]\n" + line + "\n")
    r = kern("run", "toy-paged", "--prompts-file", str(f))
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert f"{f}:2:" in r.stderr, r.stderr

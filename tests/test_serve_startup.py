"""`kern serve` start-up (issue 14): the port bound before the load, bad flags and bad weights one
line each with a documented exit code, --log-level, rejected requests logged through the limiter."""

import hashlib
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import REPO

TOY = REPO / "manifests" / "toy"


def serve(*args: str, timeout: float = 120):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "serve", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return r, time.monotonic() - t0


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [l for l in stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("kern serve: error:"), stderr
    return lines[0]


@pytest.fixture
def taken_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_a_taken_port_is_one_line_and_exit_3_before_the_load(taken_port):
    from e2e.session import PORT_IN_USE
    from serve.cli import EXIT_BIND

    r, dt = serve("toy-paged", "--backend", "cpu", "--port", str(taken_port))
    assert r.returncode == EXIT_BIND == 3, r.stderr
    line = one_line(r.stderr)  # one line: nothing was logged, no `scheduler ready`
    assert f"--port {taken_port}" in line and any(p in line.lower() for p in PORT_IN_USE), line  # e2e skips on it
    assert dt < 30, dt
    # the target is not even resolved: the bind comes first (an unknown target would be exit 2)
    r, _ = serve("toy-nope", "--backend", "cpu", "--port", str(taken_port))
    assert r.returncode == 3 and "address already in use" in one_line(r.stderr).lower(), r.stderr


@pytest.mark.parametrize("flag,value", [
    ("--port", "99999"), ("--port", "-1"), ("--port", "abc"), ("--host-gib", "-1"), ("--capacity", "0"),
    ("--capacity", "-16"), ("--max-seqs", "0"), ("--rows", "0"), ("--chunk", "0"), ("--drain-timeout", "-1"),
    ("--reserve-gib", "-1"), ("--stats-every", "0"), ("--keep-alive", "0"), ("--body-timeout", "-2"),
    ("--max-tokenize-tokens", "0"), ("--pp-share", "0"), ("--pp-parent", "0"), ("--stages", "-1"),
    ("--log-level", "loud"), ("--backend", "tpu"),
])
def test_every_bad_flag_value_is_one_line_naming_it_and_exit_2(flag, value):
    r, _ = serve("toy-paged", "--backend", "cpu", "--port", "0", flag, value)
    assert r.returncode == 2, r.stderr
    assert f"'{flag}'" in one_line(r.stderr)


def test_the_exit_codes_are_listed_in_help_and_docs():
    from click.testing import CliRunner

    from serve.cli import EXIT_CODES, serve_command

    help_text = CliRunner().invoke(serve_command, ["--help"]).output
    docs = (REPO / "docs" / "serve.md").read_text()
    assert "Exit codes" in help_text
    for code in EXIT_CODES:
        assert re.search(rf"^\s+{code}\s+\S", help_text, re.M), code
        assert f"| {code} |" in docs, code


def _copy_toy(tmp_path: Path) -> tuple[Path, Path]:
    for name in ("toy-paged.json", "salt.safetensors"):
        shutil.copy(TOY / name, tmp_path / name)
    return tmp_path / "toy-paged.json", tmp_path / "salt.safetensors"


def test_a_corrupted_weights_file_is_refused_with_both_sha256s(tmp_path):
    manifest, salt = _copy_toy(tmp_path)
    expected = json.loads(manifest.read_text())["weights"]["salt.safetensors"]["sha256"]
    assert hashlib.sha256(salt.read_bytes()).hexdigest() == expected  # kern gen pinned the shipped file
    data = bytearray(salt.read_bytes())
    data[-1] ^= 1  # a tensor word off by one bit: still a valid safetensors file
    salt.write_bytes(bytes(data))
    actual = hashlib.sha256(bytes(data)).hexdigest()
    r, _ = serve(str(manifest), "--backend", "cpu", "--port", "0")
    assert r.returncode == 2, r.stderr
    line = one_line(r.stderr)
    assert str(salt) in line and expected in line and actual in line, line


def test_a_swapped_weights_file_is_refused_and_the_pinned_one_loads(tmp_path):
    from manifests import load
    from runtime.runtime import Runtime
    from runtime.weights import WeightsError, read_tensors

    manifest, salt = _copy_toy(tmp_path)
    m = load(manifest)
    other = tmp_path / "other.safetensors"  # the salt under a name the manifest does not pin
    shutil.copy(salt, other)
    with pytest.raises(WeightsError, match="other.safetensors: supplies tensor 'salt'"):
        Runtime(m, [other], pages=4)
    assert set(read_tensors([salt], m.weights, {"salt"})) == {"salt"}
    Runtime(m, [salt], pages=4)  # the pinned file itself loads


def test_weights_pins_parse_strictly_and_survive_a_cut():
    import manifests
    from manifests import ManifestError
    from manifests.cut import cut

    raw = json.loads((TOY / "toy-paged.json").read_text())
    for bad, where in (({"a/b.safetensors": {"sha256": "0" * 64}}, "no directory"),
                       ({"salt.safetensors": {"sha256": "xyz"}}, "64 lowercase hex"),
                       ({"salt.safetensors": {"sha": "0" * 64}}, "unknown field")):
        with pytest.raises(ManifestError, match=where):
            manifests.parse({**raw, "weights": bad})
    m = manifests.load(TOY / "toy-layers.json")
    assert set(m.weights) == {"salt.safetensors", "layers.safetensors"}
    assert all(s.manifest.weights == m.weights for s in cut(m, [1, 4]))


def test_log_level_filters_lines_below_it(capsys):
    from serve.common import logs

    try:
        logs.set_level("info")
        logs.event("admitted", "DEBUG", request="req-0")
        logs.event("serving", port=1)
        logs.set_level("warn")
        logs.event("stats", tokens=1)
        logs.event("client disconnected", "WARN", reason="x")
        logs.set_level("debug")
        logs.event("finished", "DEBUG", request="req-0")
    finally:
        logs.set_level("info")
    err = capsys.readouterr().err
    assert " admitted " not in err and " serving " in err and " stats " not in err
    assert " client disconnected " in err and " finished " in err
    assert logs.level_from_env("kern_serve=debug,kern_runtime=info") == "debug"  # as the Rust gate driver sets it
    assert logs.level_from_env("warn") == "warn" and logs.level_from_env("kern_runtime=debug") is None
    assert logs.level_from_env(None) is None


def test_a_server_logs_rejections_once_per_reason_then_counts(kern_server):
    server = kern_server("toy-paged", "--log-level", "info")  # after the fixture's debug: this wins
    ok = httpx.post(server.url + "/v1/completions", json={"model": "toy-paged", "prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200
    assert httpx.post(server.url + "/v1/completions", content=b"{bad").status_code == 400
    assert httpx.get(server.url + "/no/such/route").status_code == 404
    time.sleep(0.5)
    log = server.log()
    assert " serving " in log and " admitted " not in log and " finished " not in log  # debug lines filtered
    rejected = [l for l in log.splitlines() if " rejected " in l]
    assert len(rejected) == 2, rejected
    assert "reason=invalid_json" in rejected[0] and "status=400" in rejected[0] and "path=/v1/completions" in rejected[0]
    assert "reason=not_found" in rejected[1] and "status=404" in rejected[1]
    with httpx.Client(base_url=server.url) as c:
        for _ in range(50):
            assert c.post("/v1/completions", content=b"{bad").status_code == 400
    time.sleep(0.5)
    flood = [l for l in server.log().splitlines() if " rejected " in l and "reason=invalid_json" in l]
    assert 1 <= len(flood) <= 3, flood  # the first, then at most a count per 10 s interval
    server.stop()
    lines = [l for l in server.log().splitlines() if " rejected " in l and "reason=invalid_json" in l]
    assert sum(int(m.group(1)) for l in lines if (m := re.search(r"repeated=(\d+)", l))) == 50, lines

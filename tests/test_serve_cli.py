"""`kern serve` refuses bad flags with one line naming the flag, exit 2, before binding anything."""

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize(
    "args,needle",
    [
        pytest.param(["toy-nope"], "unknown target 'toy-nope'", id="unknown-target"),
        pytest.param(["toy-paged", "--rows", "3"], "--rows 3", id="rows-not-declared"),
        pytest.param(["toy-paged", "--capacity", "8"], "--capacity 8 tokens is under two pages of 16", id="capacity-tiny"),
        pytest.param(["toy-paged", "--chunk", "99999"], "--chunk 99999", id="chunk-over"),
        pytest.param(["toy-stateful", "--max-seqs", "0"], "'--max-seqs': 0 is not in the range x>=1", id="max-seqs-0"),
        pytest.param(["no/such.json"], "does not exist", id="missing-manifest"),
        pytest.param(["toy-paged", "--pp-timeout", "0"], "'--pp-timeout': 0.0 is not in the range x>0", id="pp-timeout-0"),
        pytest.param(["toy-paged", "--at", "3"], "--at needs --stages N", id="at-without-stages"),
        pytest.param(["toy-paged", "--pp-listen", "tcp://127.0.0.1:0"], "--pp-listen needs --stages N", id="listen-alone"),
        pytest.param(["toy-paged", "--stages", "0"], "'--stages': 0 is not in the range x>=1", id="stages-0"),
        pytest.param(["tests"], "no stage manifests", id="dir-without-stages"),
        pytest.param(["toy-paged", "--max-connections", "0"], "'--max-connections': 0 is not in the range x>=1", id="max-connections-0"),
        pytest.param(["toy-paged", "--max-connections-per-client", "0"], "'--max-connections-per-client': 0 is not in the range x>=1", id="per-client-0"),
        pytest.param(["toy-layers", "--stages", "5"], "5 stages cannot each hold a state", id="stages-without-state"),
        pytest.param(["toy-layers", "--stages", "2", "--at", "1"], "leaves stage(s) 0 holding no state", id="at-stage-without-state"),
        pytest.param(["toy-paged", "--header-timeout", "0"], "'--header-timeout': 0.0 is not in the range x>0", id="header-timeout-0"),
        pytest.param(["toy-paged", "--drain-timeout", "-1"], "'--drain-timeout': -1.0 is not in the range x>0", id="drain-timeout-negative"),
        pytest.param(["toy-paged", "--max-body-bytes", "0"], "'--max-body-bytes': 0 is not in the range x>=1", id="max-body-0"),
        pytest.param(["toy-paged", "--max-connections", "100000000"], "--max-connections 100000000 needs", id="max-connections-over-fds"),
        pytest.param(["toy-paged", "--protect-stats"], "--protect-stats needs --api-key", id="protect-stats-no-key"),
    ],
)
def test_bad_flags_are_one_clear_line(args, needle):
    r = subprocess.run([sys.executable, "-m", "serve", *args, "--backend", "cpu", "--port", "0"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("kern serve: error:"), r.stderr
    assert needle in lines[0]


def test_the_flags_object_holds_every_flag_with_its_default():
    """`kern serve` builds one `ServeFlags` from its keywords: a flag it lacks would be a TypeError at
    start, a default that drifted from the flag's would serve a direct caller differently."""
    import dataclasses

    import click

    from serve.cli import serve_command
    from serve.flags import ServeFlags

    fields = {f.name: f for f in dataclasses.fields(ServeFlags)}
    params = {p.name: p for p in serve_command.params if p.expose_value}
    assert set(params) == set(fields)
    ctx = click.Context(serve_command)
    for name, p in params.items():
        if p.name == "target":
            continue
        want = p.process_value(ctx, p.get_default(ctx, call=True))  # what the command is given
        assert fields[name].default == want, name

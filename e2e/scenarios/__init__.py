"""The gate's steps: which session each runs in, which checks it adds, what it needs first.

`--scenarios` names checks; `plan` keeps the steps that add a named check and, transitively, the
steps they depend on (which then run unreported). Steps run in `STEPS` order, which is the session
order of SPEC §10 (kern_test, default, host, slots, rows1, wake_room), with churn and drop after host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from e2e.config import GateTarget
from e2e.scenarios import (abort, blocks, churn, cold_burst, concurrent, conc1, configs, cuts, explore, float_controls,
                           host, kern_test, long_room, params, prefix, recency, repeat, rows1, slots, stream, ties, tight,
                           turn2, wake_room)

__all__ = ["CHECKS", "COMPARED", "CROSS_CHECKS", "METRICS_CHECKS", "POLICY_CHECKS", "STEPS", "Step", "plan",
           "session_of"]


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


STEPS: tuple[Step, ...] = (
    Step("kern_test", None, ("kern_test",), (), kern_test.run,
         applies=lambda t: t.reference is not None, facts=False),
    Step("conc1", "default", ("conc1_equals_run",), (), conc1.run),
    Step("run_equals_reference", None, ("run_equals_reference",), (), conc1.run_equals_reference),
    Step("cut_equals_whole", None, ("cut_equals_whole",), (), cuts.run, applies=cuts.applies, facts=False),
    Step("float_controls", None, ("float_controls",), (), float_controls.run, applies=float_controls.applies,
         facts=False),
    Step("repeat", "default", ("repeat_hit",), ("conc1",), repeat.run),
    Step("turn2", "default", ("turn2_hit", "turn2_warm_equals_run"), ("conc1", "repeat"), turn2.run),
    Step("concurrent", "default", ("concurrent",), ("conc1",), concurrent.run, serial=False),
    Step("spec_acceptance", "default", ("spec_acceptance",), ("concurrent",), concurrent.spec_acceptance,
         applies=lambda t: t.spec, serial=False),
    Step("abort", "default", ("abort",), ("conc1",), abort.run, serial=False),
    # every engine that declares `stream` (docs/engine-contract.md); our own kern's params session streams
    # already, so it runs for ours only when named
    Step("stream", "default", ("stream_equals_whole",), ("conc1",), stream.run, serial=False, foreign=True),
    Step("host_cold", "host", ("turn2_warm_equals_cold",), ("turn2",), host.cold, flags=host.flags),
    Step("park_wake", "host", ("park_wake",), ("host_cold",), host.park_wake, flags=host.flags),
    Step("host_churn", "churn", ("host_churn",), ("turn2",), churn.run, flags=churn.flags),
    Step("evict_drops", "drop", ("evict_drops",), ("turn2",), churn.drop, flags=churn.drop_flags),
    Step("ties", "ties", ("index_ties",), ("turn2",), ties.run, flags=ties.flags),
    Step("host_frag", "frag", ("host_frag",), ("turn2",), ties.frag, flags=ties.flags,
         applies=lambda t: t.lined),
    Step("slot_growth", "slots", ("slot_growth",), ("turn2",), slots.run, flags=slots.flags,
         applies=lambda t: t.lined, early=True),
    Step("rows1", "rows1", ("rows1_equals_run", "rows1_vs_spec"), ("conc1",), rows1.run, flags=rows1.flags,
         applies=lambda t: t.spec, early=True),
    Step("wake_room", "wake_room", ("wake_room",), ("turn2",), wake_room.run, flags=wake_room.flags),
    # fair admission (issue 41): long requests holding most of a small pool beside short ones; a paged pool
    # in one process (a pipeline's head admits by the same core)
    Step("long_room", "long_room", ("long_beside_short",), (), long_room.run, flags=long_room.flags,
         applies=lambda t: not t.lined and t.stages <= 1, serial=False, facts=False),
    # an entry grown in place while other sequences ran keeps up its recency (issue 39): kern's own pool, paged
    Step("recency", "recency", ("recency_after_growth",), ("conc1",), recency.run, flags=recency.flags,
         applies=lambda t: not t.lined and t.stages <= 1, serial=False),
    # request parameters are the HTTP layer's, the same code in a pipeline's head as in one process: a staged
    # target's single process gates them, and each pipeline start costs a staged target seconds of CPU
    Step("params", "params", ("params_stop", "params_ids", "params_prompt"), (), params.run,
         applies=lambda t: t.stages <= 1),
    # the single process's explore already gates the same manifest; through stages it would cost a staged
    # target several pipeline starts of CPU
    Step("explore", "explore", ("explore_equals_run",), ("conc1",), explore.run, flags=explore.flags,
         applies=lambda t: t.stages <= 1),
    # every engine's gate (docs/engine-contract.md); our own kern's sessions above cover the same ground
    # (repeat, turn2, churn, drop), so it runs for ours only when named
    # the configurations kern ships beyond one process (issue 39): this checkout's kern only (RUNS); each
    # its own server of its own processes (never a host's thread)
    Step("split", "split", ("split_equals_run",), (), configs.split, flags=configs.split_flags,
         applies=lambda t: t.stages <= 1, serial=False, facts=False),
    Step("frontends2", "frontends2", ("frontends2_equals_run",), (), configs.frontends, flags=configs.frontends_flags,
         applies=lambda t: t.stages <= 1, serial=False, facts=False),
    Step("stage_loss", "stage_loss", ("stage_loss_resumed",), (), configs.stage_loss,
         applies=lambda t: t.stages > 1, serial=False, facts=False),
    Step("prefix", "prefix", ("prefix_cold_warm_restored",), (), prefix.run, serial=False, foreign=True),
    # workloads from the wild (issue 39): what real prefix caches got wrong, judged from outside, every engine;
    # a staged target's single process runs the same cache code (and each pipeline start costs seconds)
    Step("moved", "blocks", ("blocks_moved",), (), blocks.moved, applies=lambda t: t.stages <= 1),
    Step("reparented", "blocks", ("blocks_reparented",), (), blocks.reparented, applies=lambda t: t.stages <= 1),
    Step("edges", "blocks", ("block_edges",), (), blocks.edges, applies=lambda t: t.stages <= 1),
    Step("stop_hit", "blocks", ("stop_after_hit",), (), blocks.stop_hit, applies=lambda t: t.stages <= 1),
    Step("cold_burst", "cold_burst", ("cold_prefix_burst",), (), cold_burst.run, serial=False,
         applies=lambda t: t.stages <= 1),
    # its cache is sized from the page the default session told (conc1: the first session's facts)
    Step("evict_proof", "tight", ("eviction_proven",), ("conc1",), tight.evict_proof, cache=tight.cache, early=True,
         flags=tight.flags,
         applies=lambda t: t.stages <= 1),
    Step("refcount", "tight", ("refcount_stress",), ("conc1",), tight.refcount, cache=tight.cache, early=True,
         flags=tight.flags,
         serial=False, applies=lambda t: t.stages <= 1),
    Step("preempt", "tight", ("preempt_recompute",), ("conc1",), tight.preempt, cache=tight.cache, early=True,
         flags=tight.flags,
         serial=False, applies=lambda t: t.stages <= 1),
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


def session_of(check: str) -> str | None:
    """The session whose server a check's requests went to (policy_<s> and metrics_<s> name theirs)."""
    if check.startswith(("policy_", "metrics_")):
        return check.split("_", 1)[1]
    return next((s.session for s in STEPS if check in s.checks), None)


def plan(target: GateTarget, wanted: set[str] | None, has_reference: bool, external: bool = False) -> list[Step]:
    """The steps to run for `target`, in order: those adding a wanted check, and their dependencies.
    `external`: the engine under test is one under --engine (the `foreign` steps run by default)."""
    by_name = {s.name: s for s in STEPS}
    applicable = [s for s in STEPS if s.applies(target)
                  and (s.name != "run_equals_reference" or has_reference)
                  and (not s.foreign or external or (wanted is not None and bool(set(s.checks) & wanted)))]
    chosen = {s.name for s in applicable if wanted is None or set(s.checks) & wanted
              or (s.serial and f"policy_{s.session}" in wanted)
              or (s.session is not None and f"metrics_{s.session}" in wanted)
              or (s.name in COMPARED and bool(wanted & set(CROSS_CHECKS)))}
    todo = list(chosen)
    while todo:
        for d in by_name[todo.pop()].deps:
            if d not in chosen:
                chosen.add(d)
                todo.append(d)
    return [s for s in STEPS if s.name in chosen]

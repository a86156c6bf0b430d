"""conc1_equals_run: the 12 prompts one at a time, each identical to the oracle's answer.

run_equals_reference: with `--reference`, `kern run` on the same ids must equal the reference.
"""

from __future__ import annotations

import json

from e2e.prompts import PROMPTS
from e2e.results import Cold
from e2e.spawn import Processes, own_kern, run_command
from oracle.cache import KernRun
from verdicts import Same, oracle_gate


def run(r) -> Cold:
    same = Same(r.oracle, r.rows)
    cold = []
    for p in PROMPTS:  # the reference works ahead while the server answers
        r.oracle.prefetch(list(p.encode()), r.m, r.rows)
    for i, p in enumerate(PROMPTS):
        a = r.answer(p)
        a.prompt_ids = r.prompt_ids(a, p)
        cold.append(a)
        want = r.oracle.run(a.prompt_ids, r.m, r.rows)
        same.add(f"prompt {i + 1}", a.prompt_ids, a.ids, want, a.served)
    gate = oracle_gate(r.target.ranks, r.oracle.available)
    ok = same.ok if gate else gate
    r.checks.add("conc1_equals_run", ok, f"{same} (oracle: {r.oracle.kind})", same.excused, same.first)
    return Cold(tuple(cold))


def run_equals_reference(r) -> None:
    """kern run against the reference with `Same`: identical, or (a float target) divergent only at
    near-ties the probe shows, as the server's answers are judged."""
    if r.runner is None:
        r.checks.add("run_equals_reference", None, "no kern run oracle")
        return
    rows = r.rows
    how = _forked_runs(r, [list(p.encode()) for p in PROMPTS], rows)
    same = Same(r.oracle, rows)
    for i, p in enumerate(PROMPTS):
        ids = list(p.encode())
        same.add(f"prompt {i + 1}", ids, r.runner.run(ids, r.m, rows), r.oracle.run(ids, r.m, rows))
    r.checks.add("run_equals_reference", same.ok, f"{same} ({r.runner.kind} vs reference, rows {rows}{how})", same.excused)


def _forked_runs(r, prompts: list[list[int]], rows: int) -> str:
    """With a zygote (or hosts), `kern run --prompts-file` forked (or a host's thread) fills the runner's
    cache first: the runs go in another process (its own GIL and device), not this one's, which
    serves every lane.
    Whatever it did not answer the runner runs here. A note for the check: how the runs were made."""
    runner, z = r.runner, r.opts.spawner()
    if isinstance(z, Processes) or not isinstance(runner, KernRun) or runner.cache is None:
        return ""
    cache = runner.cache
    todo = [ids for ids in prompts if cache.get(ids, r.m, rows) is None]
    if not todo:
        return "; cached"
    r.dir.mkdir(parents=True, exist_ok=True)
    file = r.dir / "kern-run.jsonl"
    file.write_text("".join(json.dumps(ids) + "\n" for ids in todo))
    cmd = [*own_kern(), "run", str(runner.manifest_path), *[a for w in runner.weights for a in ("--weights", w)],
           "--prompts-file", str(file), "--steps", str(r.m), "--rows", str(rows), "--backend", runner.backend, "--json"]
    out, code = run_command(z, cmd, r.dir / "kern-run.log", r.opts.kern_test_timeout)
    got = 0
    for line in out.splitlines():
        try:
            answer = json.loads(line)
            cache.put(answer["prompt_ids"], r.m, rows, answer["ids"])
            got += 1
        except (ValueError, KeyError, TypeError):
            continue  # the log's other lines (warnings, a zygote's refusal)
    return f"; forked `kern run --prompts-file`: {got}/{len(todo)} answered, exit {code}"

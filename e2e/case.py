"""A failing session as a replayable case, and the shrinker that makes it small.

A *case* is one session of one target: its server flags (the session's own, over the gate's base)
and the requests it sent, in order, as `e2e/client.py` recorded them (`Client.script`):

    {"case": 1, "target": "toy-paged", "session": "drop", "check": "policy_drop", "seed": 0,
     "max_tokens": 64, "flags": ["--capacity", "...", ...],
     "engine": {"command": "python my_server.py --port {port}", "capabilities": [...], "facts": {...},
                "name": "...", "cwd": "/where/the/gate/ran"},             # null: this checkout's kern
     "config": "/path/kern.toml",                                          # null: the packaged targets
     "gate": {"backend": "cpu", "capacity": 16384, "load_timeout": 600.0, "server_flags": ""},
     "requests": [{"kind": "request", "path": "/v1/completions", "body": {...}},
                  {"kind": "hang_up", "prompt": "...", "chunks": 3, "max_tokens": 4096, "ignore_eos": true},
                  {"kind": "burst", "calls": [[prompt, max_tokens], ...]}]}

Replaying a case starts a fresh server of the engine that failed (the recorded command, in the
recorded working directory, judged on the capabilities and facts the gate saw; this checkout's kern
when `engine` is null) with those flags and sends the requests in order; it fails
when a plain answer differs from the reference (`answers`), when a request with parameters gets
another answer than the documented rule gives (`params`, e2e/case_params.py), when the policy
oracle's predictions for the serial requests differ (`policy_<session>`), when the session's
/metrics differ (`metrics_<session>`), or when the session errs (a crash, a hang: `error`). A
request with parameters, a hang-up or a burst ends the policy's exact predictions, as in the gate.

`shrink` reduces a failing case while it keeps failing the same way: delta debugging over the
requests (drop halves, quarters, ... then single requests), then fewer and shorter stop strings,
then shorter prompts, then fewer answer tokens. `write` saves it as JSON and as a pytest file that replays it (and so fails while the bug
is in). `e2e --shrink` and `e2e --replay-case FILE` are the commands.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from e2e.case_params import judge, judged, served_of
from e2e.client import Answer, Rejected
from e2e.scenarios.params import eos_of, rules_of
from verdicts import Same

__all__ = ["Case", "ddmin", "kind_of", "replay", "shrink", "write"]

PLAIN = {"model", "prompt", "max_tokens", "temperature", "return_token_ids"}
ANSWERS = "answers"  # a replay's own check (not a gate check): its plain answers against the reference
PARAMS = "params"  # a replay's own check: its requests with parameters against the rule (e2e/case_params.py)


@dataclass
class Case:
    target: str
    session: str
    check: str
    flags: list[str]
    requests: list[dict[str, Any]]
    seed: int = 0
    max_tokens: int = 64
    notes: list[str] = field(default_factory=list)
    case: int = 1
    engine: dict[str, Any] | None = None  # the engine under test (`Engine.describe`); None: this checkout's kern
    config: str | None = None  # the config the target came from; None: the packaged one
    gate: dict[str, Any] = field(default_factory=dict)  # the gate's flags: backend, capacity, load_timeout, ...

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def load(cls, path: str | Path) -> Case:
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a case file ({exc})") from None
        missing = [k for k in ("target", "session", "check", "flags", "requests") if k not in d]
        if missing or d.get("case") != 1:
            raise ValueError(f"{path}: not a case file (version {d.get('case')!r}; missing {', '.join(missing)})")
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def size(self) -> tuple[int, int, int]:
        """(requests, prompt tokens, answer tokens asked): what shrinking lowers."""
        n = p = m = 0
        for q in self.requests:
            for prompt, mt in _calls(q):
                n += 1
                p += len(prompt)
                m += int(mt)
        return n, p, m


def _calls(q: dict[str, Any]) -> list[tuple[Any, int]]:
    if q["kind"] == "burst":
        return [(p, m) for p, m in q["calls"]]
    if q["kind"] == "hang_up":
        return [(q["prompt"], q["max_tokens"])]
    b = q["body"]
    return [(served_of({k: v for k, v in b.items() if k != "truncate_prompt_tokens"}) or b.get("prompt") or [],
             b.get("max_tokens") or 16)]


def kind_of(check: str, session: str) -> str:
    """Which replay check a failure of `check` must reproduce as."""
    for k in ("policy", "metrics"):
        if check == f"{k}_{session}":
            return check
    return PARAMS if check.startswith("params_") else ANSWERS


def _what(body: dict[str, Any]) -> str:
    """A request with parameters in a few words: its fields beyond the plain ones."""
    return ", ".join(f"{k}={body[k]!r:.40}" for k in body if k not in PLAIN and k != "messages") or "plain"


def replay(case: Case, run) -> list[str]:
    """Send the case through a fresh server of `run` (an `e2e.gate.Run` for its target); the names of
    the replay's failed checks (``answers``, ``policy_<session>``, ``metrics_<session>``, ``error``)."""
    try:
        live = run.open(case.session, list(case.flags))
        same, params = Same(run.oracle, run.rows), []
        for q in case.requests:
            _send(run, live, same, params, q)
        run.checks.add(ANSWERS, same.ok, str(same), same.excused, same.first)
        if params:
            bad = [f"request {i + 1} ({_what(b)}): {p}" for i, (b, p) in enumerate(params) if p]
            note = f"{len(params) - len(bad)}/{len(params)} exact" + "".join(f"; {x}" for x in bad[:5])
            run.checks.add(PARAMS, not bad, note)
        if live.policy is not None and live.policy.active:
            live.policy.compare("the case's requests", live.client.stats())
        run.close()
    except Exception as exc:  # a crash, a hang, a refused start: the case fails as `error`
        run.checks.add("error", False, f"{type(exc).__name__}: {exc}")
        live, run.live = run.live, None
        if live is not None:
            live.client.close()
            live.session.stop(kill=True)
    return run.checks.failed()


def _send(run, live, same: Same, params: list, q: dict[str, Any]) -> None:
    kind = q["kind"]
    if kind == "request" and set(q["body"]) <= PLAIN:
        b = q["body"]
        prompt, m = b["prompt"], int(b["max_tokens"])
        try:
            a = run.answer(prompt, m)
        except Rejected:
            return  # a refusal is the server's answer; the policy oracle was told (Run.answer)
        ids = run.prompt_ids(a, prompt)
        same.add(f"request {a.request}", ids, a.ids, run.oracle.run(ids, m, run.rows), a.served)
    elif kind == "request":
        run.serial_ends("a request with parameters (the policy does not follow its stop)")
        try:
            outcome: Any = live.client.request(q["body"], q["path"])[0]
        except Rejected as exc:
            outcome = exc
        if run.oracle.exact and judged(q["body"]):  # a float target's near-ties: the session's
            params.append((q["body"], judge(q["body"], q["path"], outcome, run.oracle, run.rows, eos_of(run),
                                            rules_of(run))))
    elif kind == "hang_up":
        run.serial_ends("a stream hung up (its abort's timing)")
        live.client.hang_up(q["prompt"], q["chunks"], q["max_tokens"], ignore_eos=q["ignore_eos"])
        live.stats.idle()
    else:
        run.serial_ends("a burst (recency and counters depend on timing)")
        calls = [(p, int(m)) for p, m in q["calls"]]
        for (p, m), a in zip(calls, live.client.run_all(calls)):
            if isinstance(a, Answer):
                ids = run.prompt_ids(a, p)
                same.add(f"burst {a.request}", ids, a.ids, run.oracle.run(ids, m, run.rows), a.served)


def ddmin(items: list, fails: Callable[[list], bool]) -> list:
    """A smaller list that still `fails` (1-minimal over removals: no single item can go)."""
    n = 2
    while len(items) >= 2:
        size = math.ceil(len(items) / n)
        for i in range(0, len(items), size):
            rest = items[:i] + items[i + size:]
            if rest and fails(rest):
                items, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(items):
                break
            n = min(len(items), 2 * n)
    return items


def shrink(case: Case, fails: Callable[[Case], bool], echo: Callable[[str], None] = print) -> Case:
    """The smallest case found that still `fails`: fewer requests, fewer and shorter stop strings,
    shorter prompts, fewer answer tokens, in that order; each candidate is one replay."""
    tried = [0]

    def test(requests: list[dict[str, Any]], step: str) -> bool:
        tried[0] += 1
        c = Case(**{**asdict(case), "requests": requests})
        ok = fails(c)
        n, p, m = c.size()
        echo(f"  shrink: try {tried[0]} ({step}): {n} requests, {p} prompt tokens, {m} answer tokens -> "
             f"{'still fails' if ok else 'passes'}")
        return ok

    def put(requests: list, i: int, q: dict[str, Any]) -> list:
        return requests[:i] + [q] + requests[i + 1:]

    def body(q: dict[str, Any], **fields) -> dict[str, Any]:
        return {**q, "body": {**q["body"], **fields}}

    requests = ddmin(list(case.requests), lambda rs: test(rs, "drop requests"))
    for i in range(len(requests)):  # fewer stop strings and stop ids in a request with parameters
        for key in ("stop", "stop_token_ids"):
            values = requests[i].get("body", {}).get(key)
            if isinstance(values, list) and len(values) > 1:
                def with_(vs: list, i: int = i, key: str = key) -> list[dict[str, Any]]:
                    return put(requests, i, body(requests[i], **{key: vs}))

                requests = with_(ddmin(values, lambda vs: test(with_(vs), f"fewer {key}")))
    for i in range(len(requests)):  # shorter stop strings: each halved (its front or its back half)
        stops = requests[i].get("body", {}).get("stop")
        for j in range(len(stops) if isinstance(stops, list) else 0):
            while len(requests[i]["body"]["stop"][j]) > 1:
                st = requests[i]["body"]["stop"][j]
                for half in (st[:len(st) // 2], st[len(st) // 2:]):
                    stops = list(requests[i]["body"]["stop"])
                    stops[j] = half
                    candidate = put(requests, i, body(requests[i], stop=stops))
                    if test(candidate, f"stop string {len(st)} -> {len(half)} characters"):
                        requests = candidate
                        break
                else:
                    break
    for i in range(len(requests)):  # fewer calls in a burst (one is left: a burst of one is still sent at once)
        if requests[i]["kind"] == "burst" and len(requests[i]["calls"]) > 1:
            def calls_(cs: list, i: int = i) -> list[dict[str, Any]]:
                return put(requests, i, {**requests[i], "calls": cs})

            requests = calls_(ddmin(list(requests[i]["calls"]), lambda cs: test(calls_(cs), "fewer calls in a burst")))
    for step, change in (("shorter prompt", _halved), ("fewer answer tokens", _fewer)):
        for i in range(len(requests)):  # each prompt (each call's) halved, then each max_tokens
            for k in range(len(_calls(requests[i]))):
                while (smaller := change(requests[i], k)) is not None:
                    candidate = put(requests, i, smaller)
                    if not test(candidate, step):
                        break
                    requests = candidate
    return Case(**{**asdict(case), "requests": requests})


def _halved(q: dict[str, Any], k: int) -> dict[str, Any] | None:
    """`q` with its `k`-th call's prompt (a request's: its prompt or its one chat message's text) cut
    to its first half; None when it cannot be."""
    if q["kind"] == "burst":
        p, m = q["calls"][k]
        if len(p) < 2:
            return None
        return {**q, "calls": q["calls"][:k] + [[p[:len(p) // 2], m]] + q["calls"][k + 1:]}
    if q["kind"] != "request":
        return None
    b = _halved_body(q["body"])
    return None if b is None else {**q, "body": b}


def _fewer(q: dict[str, Any], k: int) -> dict[str, Any] | None:
    """`q` with its `k`-th call's max_tokens halved; None when it is 1 already (or a hang-up's)."""
    if q["kind"] == "burst":
        p, m = q["calls"][k]
        return None if int(m) <= 1 else {**q, "calls": q["calls"][:k] + [[p, int(m) // 2]] + q["calls"][k + 1:]}
    if q["kind"] != "request" or int(q["body"].get("max_tokens") or 1) <= 1:
        return None
    return {**q, "body": {**q["body"], "max_tokens": int(q["body"]["max_tokens"]) // 2}}


def _halved_body(b: dict[str, Any]) -> dict[str, Any] | None:
    keep = int(b.get("truncate_prompt_tokens") or 0)  # a prompt shorter than its truncation is refused
    p = b.get("prompt")
    if isinstance(p, list) and len(p) >= 2 and len(p) // 2 >= keep:
        return {**b, "prompt": p[:len(p) // 2]}
    m = b.get("messages")
    if (isinstance(m, list) and len(m) == 1 and isinstance(m[0], dict) and isinstance(m[0].get("content"), str)
            and len(m[0]["content"]) >= 2 and not keep):
        c = m[0]["content"]
        return {**b, "messages": [{**m[0], "content": c[:len(c) // 2]}]}
    return None


PYTEST = '''"""A case `e2e --shrink` wrote: {what}.

It replays {name}.json on a fresh server of {engine} and fails while the bug is in
(`e2e --replay-case` does the same from the command line). Copy both files into tests/ to keep it as
a regression test; E2E_REPLAY_ENGINE, if set, is the engine command to start instead of the recorded one.
"""

import os

from pathlib import Path

from e2e.case import replay_file


def test_{ident}():
    failed, note = replay_file(Path(__file__).with_name("{name}.json"), engine=os.environ.get("E2E_REPLAY_ENGINE"))
    assert not failed, note
'''


def write(case: Case, out: Path) -> tuple[Path, Path]:
    """The case as `out/case_<target>_<session>.json` (dashes as underscores) and a pytest file beside it."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"case-{case.target}-{case.session}".replace("-", "_")
    path = out / f"{name}.json"
    path.write_text(case.to_json() + "\n")
    n, p, m = case.size()
    what = f"{case.check} on {case.target}, {n} request(s), {p} prompt tokens, {m} answer tokens asked"
    test = out / f"test_{name}.py"
    engine = f"the engine that failed (`{case.engine['command']}`)" if case.engine else "this checkout's kern"
    test.write_text(PYTEST.format(what=what, name=name, ident=name, engine=engine.replace("\\", "\\\\")))
    return path, test


def replay_file(path: str | Path, backend: str | None = None, out: Path | None = None,
                echo: Callable[[str], None] = lambda _: None, engine: str | None = None) -> tuple[list[str], str]:
    """Replay a case file on its own (fresh server processes) against the engine it records (`engine`,
    a command, stands in for it): (failed checks, their notes)."""
    import tempfile

    case = Case.load(path)
    with tempfile.TemporaryDirectory(prefix="kern-case-") as tmp:
        run = replay_run(case, Path(out or tmp), backend, engine, echo=echo)
        try:
            failed = replay(case, run)
        finally:
            run.oracle.close()
    notes = "; ".join(f"{c['name']}: {c['note']}" for c in run.checks.list if c["ok"] is False)
    return failed, notes


def replay_run(case: Case, out: Path, backend: str | None = None, engine: str | None = None, capabilities=None,
               echo: Callable[[str], None] = lambda _: None):
    """The `Run` a replay of `case` sends through: its target from its config, its engine (the recorded one,
    or `engine` as the command with the recorded capabilities and facts) and the gate's recorded flags."""
    from e2e.engine import Engine
    from e2e.oracles import make_run

    g = case.gate or {}
    if case.engine:
        e = Engine.replayed(case.engine, engine, capabilities)
    elif engine is not None:
        e = Engine.foreign(engine, capabilities)
    else:
        e = None
    return make_run(case.target, backend or str(g.get("backend") or "cpu"), out, case.seed, case.max_tokens, echo,
                    config=case.config, engine=e, capacity=g.get("capacity"), load_timeout=g.get("load_timeout"))

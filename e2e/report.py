"""The gate's outputs: ``<out>/<target>/report.json``, ``<out>/summary.md`` and JUnit XML.

report.json (indent 1): ``{target, skipped, facts, counters: {default, host, churn, slots}, checks:
[{name, ok, note}], near_ties: {check: excused tokens}, hits: {served, counters}, wall_s}``, written
even for a skipped target (``near_ties`` lists only checks that excused some: float targets; ``hits``
is every serial answer's ``{session, step, request, tokens, ids (a digest), cached, tier, snapshot}``
and each all-serial session's hit counters, what ``stages_equal_single`` compares).

summary.md: a header (commit, backend, max tokens, wall time), the table of `verdicts.summarize`
(one row per target), then each failed check's reason (its note). docs/results.md says how to read
them.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any, Iterable
from xml.etree import ElementTree as ET

from verdicts import summarize

__all__ = ["commit", "junit", "summary_text", "write_report", "write_summary"]

CHECKOUT = Path(__file__).resolve().parents[1]


def write_report(out: Path, report: dict[str, Any]) -> Path:
    d = out / report["target"]
    d.mkdir(parents=True, exist_ok=True)
    path = d / "report.json"
    path.write_text(json.dumps(report, indent=1, default=_json) + "\n")
    return path


def _json(x: Any) -> Any:
    if isinstance(x, set):
        return sorted(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON: {type(x).__name__}")


def commit(root: Path = CHECKOUT) -> str:
    """``git rev-parse HEAD`` of the checkout the gate runs from, or "unknown" (no git, not a checkout)."""
    if not (root / ".git").exists():
        return "unknown"  # an installed copy: never some enclosing repository's HEAD
    try:
        p = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = p.stdout.strip()
    return sha if p.returncode == 0 and sha else "unknown"


def _backend(asked: str | None, reports: list[dict[str, Any]]) -> str:
    """The backend asked for, and the one the servers reported (their ready lines) when it differs."""
    ran = sorted({str(f["backend"]) for r in reports for f in (r.get("facts") or {}).values()
                  if isinstance(f, dict) and f.get("backend")})
    if asked is None:
        return ", ".join(ran) or "unknown"
    return f"{asked} (servers ran: {', '.join(ran)})" if ran and ran != [asked] else asked


def _fence(note: str) -> str:
    ticks = "```"
    while ticks in note:
        ticks += "`"
    return f"{ticks}text\n{note}\n{ticks}"


def summary_text(reports: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> tuple[str, int]:
    """summary.md's text and the gate's exit code. `meta` may give ``commit``, ``backend`` (asked for),
    ``max_tokens`` and ``wall_s`` (the whole gate's); what it lacks is read from the reports or left out."""
    meta = meta or {}
    table, code = summarize(reports)
    lines = ["# e2e summary", ""]
    lines.append(f"- harness commit: {meta.get('commit') or 'unknown'}")
    engines = engines_of(reports)
    lines += [f"- engine under test{' (' + ', '.join(targets) + ')' if len(engines) > 1 else ''}: {text}"
              for text, targets in engines.items()]
    lines.append(f"- backend: {_backend(meta.get('backend'), reports)}")
    if meta.get("max_tokens") is not None:
        lines.append(f"- max tokens: {meta['max_tokens']}")
    wall = meta.get("wall_s")
    if wall is None:
        wall = sum(float(r.get("wall_s") or 0) for r in reports)
    lines.append(f"- wall time: {float(wall):.1f} s")
    if meta.get("zygote_warm_s") is not None:
        lines.append(f"- servers forked from a zygote, warm in {float(meta['zygote_warm_s']):.1f} s")
    if meta.get("hosts"):
        lines.append(f"- single-process servers, `kern test` and `kern run` as threads of {int(meta['hosts'])} "
                     f"host(s), the first warm in {float(meta.get('hosts_warm_s') or 0):.1f} s"
                     + (f", the last in {float(meta['hosts_all_warm_s']):.1f} s" if meta.get("hosts_all_warm_s") else "")
                     + (f"; the hosts spent {float(meta['hosts_cpu_s']):.1f} s CPU (no split per server)"
                        if meta.get("hosts_cpu_s") is not None else ""))
    lines += ["", table]
    timed = [r for r in reports if r.get("times")]
    if timed:
        lines += ["", "## Where the time went", "", "Seconds by part: a session's name is its steps' time "
                  "(requests and checks); `start` and `stop` its server's. A target's independent sessions "
                  "run at once, so its parts add up to more than its wall time. CPU: the seconds (user + "
                  "sys) each forked server spent, and the gate process's own over the whole run.", ""]
        for r in timed:
            parts = sorted(r["times"].items(), key=lambda kv: -kv[1])
            starts = sum(v for k, v in parts if k.endswith((" start", " stop")))
            began = f"from {float(r['began_s']):.1f} s into the gate, " if r.get("began_s") is not None else ""
            line = (f"- {r['target']} ({began}{float(r.get('wall_s') or 0):.1f} s; servers' start and stop "
                    f"{starts:.1f} s): " + ", ".join(f"{k} {v:.1f}" for k, v in parts))
            cpu = sorted((r.get("cpu") or {}).items(), key=lambda kv: -kv[1])
            if cpu:
                line += (f"; servers' CPU {sum(v for _, v in cpu):.1f} s: "
                         + ", ".join(f"{k} {v:.1f}" for k, v in cpu))
            lines.append(line)
        if meta.get("gate_cpu_s") is not None:
            lines.append(f"- the gate process: {float(meta['gate_cpu_s']):.1f} s CPU (clients, oracles, "
                         "in-process `kern run`)")
    failed = causal([(r["target"], c) for r in reports if r.get("skipped") is None
                     for c in r.get("checks", []) if c["ok"] is False])
    head, tail = failures(failed, reports, meta)
    lines[2:2] = head
    return "\n".join(lines + tail), code


def failures(failed: list[tuple[str, dict]], reports: list[dict[str, Any]],
             meta: dict[str, Any]) -> tuple[list[str], list[str]]:
    """summary.md's lines on what failed: (those that lead it: the first failure, what its first wrong
    answer was served from, the shrunk cases; those at its end: every verdict's note, and the checks
    left unrun folded into one line per session)."""
    cases = [f"- shrunk case of {r['target']}: `{r['case']}` (replay: `e2e --replay-case {r['case']}`)"
             for r in reports if r.get("case")]
    head = [*cases, ""] if cases else []
    if not failed:
        return head, []
    target, first = failed[0]
    head = [f"**First failure: {target}: {first['name']}**: {lead(first)}", "", *head]
    tail = ["", "## Failed checks", "", "Verdicts first, then crashes, then the checks those left unrun, one line "
            "a session (docs/checks.md names each check's bug; a note's `first differs at token "
            "K (got N tokens, want M): got [...] want [...]` is the answer against the oracle's from token K, "
            "and `[served from cached_tokens C, tier T; prompt ...]` what the engine said it served it from)."]
    unrun = not_run([(t, c) for t, c in failed if c.get("error") and c["name"] != "error"])
    for target, c in failed:
        if not c.get("error") or c["name"] == "error":
            tail += ["", f"### {target}: {c['name']}", "", _fence(str(c.get("note") or "(no reason given)"))]
            where = where_to_look(target, c["name"], meta)
            tail += ["", where] if where else []
    return head, tail + (["", "### Not run", "", *unrun] if unrun else [])


def lead(c: dict[str, Any]) -> str:
    """The summary's first line of a failed check: what its first wrong answer was served from (its
    ``cached_tokens``, its tier where told), how it differs, and its prompt; else its note's first line."""
    f = c.get("first")
    if not isinstance(f, dict):
        return _first_line(c.get("note"))
    cached = "cached_tokens not told" if f.get("cached") is None else f"cached_tokens {f['cached']}"
    tier = f", tier {f['tier']}" if f.get("tier") else ""
    return f"{f.get('label')} was served from {cached}{tier}: {f.get('divergence')}; its {f.get('prompt')}"


def not_run(failed: list[tuple[str, dict]]) -> list[str]:
    """The checks that could not run (``error``: a step they need failed), one line per target and session:
    their names, and the first one's reason."""
    from e2e.scenarios import session_of

    groups: dict[tuple[str, str], list[dict]] = {}
    for target, c in failed:
        groups.setdefault((target, session_of(c["name"]) or c["name"]), []).append(c)
    lines = []
    for (target, session), checks in groups.items():
        why = str(checks[0].get("note") or "").removeprefix("not run: ")
        names = ", ".join(c["name"] for c in checks)
        lines.append(f"- {target}, session {session}: {len(checks)} not run ({names}): {_first_line(why)}")
    return lines


def causal(failed: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """Failed checks in the order a reader should take them: verdicts (a check that ran and found a
    wrong answer), then crashes and hangs (``error``), then the checks those left unrun."""
    def rank(item: tuple[str, dict]) -> int:
        c = item[1]
        if c["name"] == "error":
            return 1
        return 2 if c.get("error") else 0
    return sorted(failed, key=rank)  # stable: within a rank, the order they ran


def _first_line(note) -> str:
    text = str(note or "(no reason given)").splitlines()[0]
    return text if len(text) <= 240 else text[:237] + "..."


def where_to_look(target: str, check: str, meta: dict[str, Any]) -> str:
    """The failing server's log and a command that gates this check alone (``meta``: the gate's out,
    seed, max tokens, config, engine)."""
    from e2e.scenarios import session_of

    session = session_of(check)
    out = meta.get("out")
    parts = []
    if session and out:
        parts.append(f"server log: `{Path(out) / target / f'server-{session}.log'}`")
    if check != "error":
        cmd = ["e2e", "--targets", target, "--scenarios", check]
        for flag, key, default in (("--config", "config", None), ("--engine", "engine", None),
                                   ("--backend", "backend", "auto"), ("--seed", "seed", 0),
                                   ("--max-tokens", "max_tokens", 64)):
            value = meta.get(key)
            if value is not None and value != default:
                cmd += [flag, shlex.quote(str(value))]
        parts.append(f"reproduce: `{' '.join(cmd)}`")
    return "; ".join(parts)


def engine_text(e: dict[str, Any] | None) -> str:
    """One line naming an engine under test: name, version, commit, command (what is known)."""
    if not e:
        return "kern (this checkout)"
    text = str(e.get("name") or "unknown")
    if e.get("version"):
        text += f" {e['version']}"
    if e.get("commit"):
        text += f" (commit {e['commit']})"
    if e.get("command") and e.get("command") != e.get("name"):
        text += f"; command: `{e['command']}`"
    return text


def engines_of(reports: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each engine under test (its `engine_text`) and the targets it was gated as."""
    out: dict[str, list[str]] = {}
    for r in reports:
        out.setdefault(engine_text(r.get("engine")), []).append(str(r["target"]))
    return out


def write_summary(out: Path, reports: Iterable[dict[str, Any]], meta: dict[str, Any] | None = None) -> tuple[str, int]:
    """Write ``<out>/summary.md``; its text and the gate's exit code."""
    text, code = summary_text(list(reports), meta)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text + "\n")
    return text, code


def junit(reports: Iterable[dict[str, Any]]) -> str:
    """One testsuite per target, one testcase per check; a reported check passes with its note."""
    suites = ET.Element("testsuites", name="e2e")
    for r in reports:
        checks = r.get("checks", [])
        suite = ET.SubElement(suites, "testsuite", name=r["target"], tests=str(max(len(checks), 1)),
                              failures=str(sum(c["ok"] is False and not c.get("error") for c in checks)),
                              errors=str(sum(bool(c.get("error")) for c in checks)),
                              skipped=str(1 if r.get("skipped") is not None else sum(bool(c.get("skipped")) for c in checks)),
                              time=f"{r.get('wall_s', 0):.1f}")
        props = ET.SubElement(suite, "properties")
        e = r.get("engine") or {}
        for key in ("name", "version", "commit", "command"):
            if e.get(key):
                ET.SubElement(props, "property", name=f"engine.{key}", value=str(e[key]))
        ET.SubElement(props, "property", name="engine", value=engine_text(e))
        if r.get("skipped") is not None:
            case = ET.SubElement(suite, "testcase", classname=f"e2e.{r['target']}", name="target")
            ET.SubElement(case, "skipped", message=str(r["skipped"]))
            continue
        for c in checks:
            case = ET.SubElement(suite, "testcase", classname=f"e2e.{r['target']}", name=c["name"])
            if c.get("skipped"):
                ET.SubElement(case, "skipped", message=c["note"])
            elif c["ok"] is False:
                kind = "error" if c.get("error") else "failure"  # error: the check could not run
                ET.SubElement(case, kind, message=c["note"][:500]).text = c["note"]
            else:
                ET.SubElement(case, "system-out").text = ("reported: " if c["ok"] is None else "") + c["note"]
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"

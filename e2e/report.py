"""The gate's outputs: ``<out>/<target>/report.json``, ``<out>/summary.md`` and JUnit XML.

report.json (indent 1): ``{target, skipped, facts, counters: {default, host, slots}, checks:
[{name, ok, note}], near_ties: {check: excused tokens}, wall_s}``, written even for a skipped
target (``near_ties`` lists only checks that excused some: float targets).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable
from xml.etree import ElementTree as ET

from verdicts import summarize

__all__ = ["junit", "write_report", "write_summary"]


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


def write_summary(out: Path, reports: Iterable[dict[str, Any]]) -> tuple[str, int]:
    table, code = summarize(list(reports))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(table + "\n")
    return table, code


def junit(reports: Iterable[dict[str, Any]]) -> str:
    """One testsuite per target, one testcase per check; a reported check passes with its note."""
    suites = ET.Element("testsuites", name="e2e")
    for r in reports:
        checks = r.get("checks", [])
        suite = ET.SubElement(suites, "testsuite", name=r["target"], tests=str(max(len(checks), 1)),
                              failures=str(sum(c["ok"] is False for c in checks)),
                              skipped=str(1 if r.get("skipped") is not None else 0),
                              time=f"{r.get('wall_s', 0):.1f}")
        if r.get("skipped") is not None:
            case = ET.SubElement(suite, "testcase", classname=f"e2e.{r['target']}", name="target")
            ET.SubElement(case, "skipped", message=str(r["skipped"]))
            continue
        for c in checks:
            case = ET.SubElement(suite, "testcase", classname=f"e2e.{r['target']}", name=c["name"])
            if c["ok"] is False:
                ET.SubElement(case, "failure", message=c["note"][:500]).text = c["note"]
            else:
                ET.SubElement(case, "system-out").text = ("reported: " if c["ok"] is None else "") + c["note"]
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"

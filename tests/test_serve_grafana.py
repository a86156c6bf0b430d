"""`kern serve --metrics-prefix vllm`: vLLM's Grafana dashboard (docs/grafana/kern-vllm-dashboard.json,
its panels and PromQL queries) reads a kern server unchanged. A real server with the flag answers a
few requests (plain and streamed); its `/metrics` must export every metric every panel's query names
(after stripping functions, label matchers and ranges), with the labels the query selects and groups
by, and with data in it. `KERN_VLLM_DASHBOARD=path/to/vllm/grafana.json` checks another dashboard
file the same way (vLLM's own, say)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ask

REPO = Path(__file__).resolve().parents[1]
TARGET = "toy-paged"
OURS = REPO / "docs" / "grafana" / "kern-vllm-dashboard.json"
DASHBOARDS = [OURS] + ([Path(os.environ["KERN_VLLM_DASHBOARD"])] if os.environ.get("KERN_VLLM_DASHBOARD") else [])

# PromQL's functions, aggregations and keywords: the identifiers of an expression that are not metrics
PROMQL = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "by", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count", "count_over_time", "count_values", "delta", "deriv", "exp", "floor", "group",
    "histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_sum", "idelta",
    "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10", "max", "max_over_time", "min",
    "min_over_time", "offset", "on", "ignoring", "group_left", "group_right", "quantile", "quantile_over_time", "rate",
    "resets", "round", "scalar", "sort", "sort_desc", "sqrt", "stddev", "stdvar", "sum", "sum_over_time", "time",
    "timestamp", "topk", "vector", "without", "and", "or", "unless", "bool", "inf", "nan",
}


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel (rows' nested panels too)."""
    out = []
    for panel in dashboard.get("panels", []):
        for p in [panel, *panel.get("panels", [])]:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", "?"), t["expr"]))
    return out


def _close(expr: str, at: int) -> int:
    """The index of the parenthesis closing the one at `at`."""
    depth = 0
    for k in range(at, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[k], 0)
        if depth == 0:
            return k
    return len(expr)


def names_in(expr: str) -> dict[str, set[str]]:
    """The metric names an expression reads -> the label names it selects them by (`{...}`) or an
    aggregation around them groups them by (`sum by(le) (...)`)."""
    blank = lambda m: " " * len(m.group(0))  # noqa: E731 - positions are kept
    groups = []  # (start, end, labels) of each `by(...) (` aggregation's argument
    for m in re.finditer(r"\b(?:by|without)\s*\(([^)]*)\)\s*\(", expr):
        groups.append((m.end() - 1, _close(expr, m.end() - 1), {x.strip() for x in m.group(1).split(",") if x.strip()}))
    bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", blank, expr)  # label lists are not metrics
    bare = re.sub(r"\[[^\]]*\]", blank, bare)  # nor are ranges
    bare = re.sub(r'"[^"]*"', blank, bare)  # nor strings
    out: dict[str, set[str]] = {}
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?", bare):
        name, selector, at = m.group(1), m.group(2) or "", m.start()
        if name in PROMQL or (at and (bare[at - 1].isdigit() or bare[at - 1] == ".")):
            continue  # a function, or the exponent of a number
        labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!=|!~|=)", selector))
        for start, end, grouped in groups:
            if start < at < end:
                labels |= grouped
        out.setdefault(name, set()).update(labels)
    return out


def exported(text: str) -> dict[str, list]:
    """Sample name -> its samples, from a /metrics body."""
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def missing(dashboard: dict, samples: dict[str, list], model: str) -> list[str]:
    """What a dashboard's queries name that the scrape lacks (a metric, a label, data): empty when every
    panel would draw."""
    problems = []
    for title, expr in queries(dashboard):
        for name, labels in names_in(expr).items():
            got = [s for s in samples.get(name, []) if s.labels.get("model_name") == model]
            if not got:
                base = re.sub(r"_(bucket|sum|count|total)$", "", name)
                problems.append(f"{title}: {name} (family {base}) is not exported for model_name={model}")
                continue
            lacking = sorted(lab for lab in labels if lab != "model_name" and not all(lab in s.labels for s in got))
            if lacking:
                problems.append(f"{title}: {name} lacks the label(s) {', '.join(lacking)}")
            if name.endswith(("_bucket", "_sum", "_count")) and not any(s.value > 0 for s in got):
                problems.append(f"{title}: {name} has no observation after the requests")
    var = json.dumps(dashboard.get("templating", {}))
    if "vllm:.*" in var and not any(n.startswith("vllm:") and any("model_name" in s.labels for s in ss)
                                    for n, ss in samples.items()):
        problems.append("the model_name variable (label_values of vllm:.*) finds no model")
    return problems


@pytest.fixture(scope="module")
def scrape(tmp_path_factory) -> str:
    from conftest import start_server

    s = start_server(TARGET, "--metrics-prefix", "vllm", log_path=tmp_path_factory.mktemp("grafana") / "server.log")
    try:
        for i, prompt in enumerate([b"Hello there, how are you today?", b"short", b"Hello there, how are you today?"]):
            ask(s, list(prompt), 12 + 3 * i, stream=i == 1)
        r = httpx.get(s.url + "/metrics", timeout=30)
        assert r.status_code == 200
        yield r.text
    finally:
        s.stop()
        if s.proc.poll() is None:
            s.proc.kill()


def test_the_expression_reader():
    expr = ('histogram_quantile(0.99, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name='
            '"$model_name"}[$__rate_interval])))')
    assert names_in(expr) == {"vllm:e2e_request_latency_seconds_bucket": {"le", "model_name"}}
    expr = ('rate(vllm:a_sum{model_name="$model_name"}[$__rate_interval])\n/\nrate(vllm:a_count[5m]) * 1e-3 + '
            'sum by(finished_reason) (increase(vllm:request_success_total{model_name=~"x", engine!="1"}[1m]))')
    assert names_in(expr) == {"vllm:a_sum": {"model_name"}, "vllm:a_count": set(),
                              "vllm:request_success_total": {"finished_reason", "model_name", "engine"}}


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_every_panel_of_the_dashboard_reads_an_exported_metric(path, scrape):
    dashboard = json.loads(path.read_text())
    assert len(queries(dashboard)) >= 20  # vLLM's 13 panels, 32 queries
    samples = exported(scrape)
    problems = missing(dashboard, samples, TARGET)
    assert not problems, "\n".join(problems)
    # vLLM's labels: model_name and engine on every vllm: sample; kern's own metrics stay kern:
    vllm = [s for n, ss in samples.items() if n.startswith("vllm:") for s in ss]
    assert vllm and all(s.labels.get("engine") == "0" and s.labels.get("model_name") == TARGET for s in vllm)
    assert "kern:kv_pages_total" in samples and "vllm:kv_pages_total" not in samples
    assert not any(n.startswith("kern:") and n.replace("kern:", "vllm:", 1) in samples for n in samples)  # not twice


def test_the_default_names_do_not_serve_the_dashboard():
    """Without the flag the dashboard finds nothing: every query names a vllm: metric, kern's are kern:."""
    from prometheus_client import generate_latest

    from serve.api.metrics import Metrics

    names = {n for _, expr in queries(json.loads(OURS.read_text())) for n in names_in(expr)}
    assert names and all(n.startswith("vllm:") for n in names)
    for prefix, want in (("kern", False), ("vllm", True)):
        families = {f.name for f in text_string_to_metric_families(generate_latest(Metrics(TARGET, 4096, prefix).registry)
                                                                  .decode())}
        assert any(f.startswith("vllm:") for f in families) is want, prefix


def test_the_phases_add_up(scrape):
    """vLLM's per-request phases, from the three requests: queued + inference <= end to end, prefill +
    decode = inference, one observation each; n and max_tokens as asked; the longest sequence of a
    request (n = 1) is its answer."""
    samples = exported(scrape)

    def one(name: str) -> float:
        got = [s.value for s in samples[name] if s.labels.get("model_name") == TARGET]
        assert len(got) == 1, (name, got)
        return got[0]

    phases = ("e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time",
              "request_inference_time", "request_time_per_output_token")
    for p in phases:
        assert one(f"vllm:{p}_seconds_count") == 3, p
    total = {p: one(f"vllm:{p}_seconds_sum") for p in phases}
    assert total["request_prefill_time"] + total["request_decode_time"] == pytest.approx(total["request_inference_time"])
    assert total["request_queue_time"] + total["request_inference_time"] <= total["e2e_request_latency"] + 1e-6
    assert 0 < total["request_time_per_output_token"] <= total["request_decode_time"]
    assert one("vllm:request_params_n_sum") == 3 and one("vllm:request_params_max_tokens_sum") == 12 + 15 + 18
    assert one("vllm:request_max_num_generation_tokens_sum") == one("vllm:request_generation_tokens_sum")
    assert one("vllm:num_preemptions_total") == 0

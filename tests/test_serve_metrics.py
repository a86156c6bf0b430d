"""/metrics (serve/api/metrics.py): prometheus_client's exposition with vLLM's names under `kern:`, a
`model_name` label on every sample, histograms that move by exactly the requests served, token
counters by exactly the tokens sent and received, and one registry per app."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from conftest import ask, assert_nothing_leaked
from serve.api.metrics import buckets_1_2_5
from serve.core.stats import COUNTERS, GAUGES

TARGET = "toy-paged"
MODEL_GAUGES = {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "kv_pages_total",
                "kv_pages_used"}
VLLM_COUNTERS = {"prompt_tokens", "generation_tokens", "request_success", "prefix_cache_queries",
                 "prefix_cache_hits", "num_preemptions"}
PHASES = {"request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
          "request_inference_time_seconds", "request_time_per_output_token_seconds"}
HISTOGRAMS = {"time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_prompt_tokens", "request_generation_tokens", "request_max_num_generation_tokens",
              "request_params_n", "request_params_max_tokens"} | PHASES
PER_REQUEST = HISTOGRAMS - {"inter_token_latency_seconds"}  # one observation per request served


def expected_types() -> dict[str, str]:
    """Family name (as the parser names it: a counter without `_total`) -> type."""
    out = {f"kern:{n}": "gauge" for n in MODEL_GAUGES}
    out.update({f"kern:{n}": "counter" for n in VLLM_COUNTERS | {"prefix_cache_hits_by_tier"}})
    out.update({f"kern:{n}": "histogram" for n in HISTOGRAMS})
    out.update({f"kern:{n}": "counter" for n in COUNTERS})
    out.update({f"kern:{n}": "gauge" for n in GAUGES if n not in ("running", "waiting")})
    return out


def parse(text: str) -> dict:
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), f"a family twice: {sorted(n for n in names if names.count(n) > 1)}"
    return {f.name: f for f in families}


def scrape(server) -> tuple[dict, str]:
    r = httpx.get(server.url + "/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST
    return parse(r.text), r.text


def value(families: dict, family: str, sample: str | None = None, **labels) -> float:
    """The one sample named `sample` (default: the family's own, `_total` for a counter) whose labels
    include `labels`."""
    f = families[family]
    sample = sample or (family + "_total" if f.type == "counter" else family)
    got = [s.value for s in f.samples if s.name == sample and labels.items() <= s.labels.items()]
    assert len(got) == 1, (sample, labels, got)
    return got[0]


def test_names_types_labels_and_what_moves(kern_server):
    server = kern_server(TARGET, "--capacity", "2048")
    before, text = scrape(server)
    assert "kern_" not in text  # the hand-written names are gone
    assert {n: f.type for n, f in before.items()} == expected_types()
    for f in before.values():
        for s in f.samples:
            assert s.labels.get("model_name") == TARGET, s
    samples = [(s.name, tuple(sorted(s.labels.items()))) for f in before.values() for s in f.samples]
    assert len(samples) == len(set(samples)), "a sample twice"
    stats0 = server.stats()["counters"]

    shared = list(b"A shared opening, long enough to fill two pages of sixteen tokens each, ")
    prompts = [shared + list(b"first"), shared + list(b"second"), list(b"short"), shared + list(b"first"),
               list(b"another short prompt")]
    sent = received = 0
    reasons = {"stop": 0, "length": 0}
    for i, ids in enumerate(prompts):
        got = ask(server, ids, 12 + i, stream=i % 2 == 1)
        sent += len(ids)
        received += len(got["ids"])
        reasons[got["finish"]] += 1
    n = len(prompts)
    s = assert_nothing_leaked(server)
    after, _ = scrape(server)

    def moved(family, sample=None, **labels):
        return value(after, family, sample, **labels) - value(before, family, sample, **labels)

    for h in HISTOGRAMS:
        assert f"kern:{h}_bucket" in {x.name for x in after[f"kern:{h}"].samples}
    for h in PER_REQUEST:
        assert moved(f"kern:{h}", f"kern:{h}_count") == n, h
    # every token after a request's first is one inter-token observation
    assert moved("kern:inter_token_latency_seconds", "kern:inter_token_latency_seconds_count") == received - n
    assert moved("kern:request_prompt_tokens", "kern:request_prompt_tokens_sum") == sent
    assert moved("kern:request_generation_tokens", "kern:request_generation_tokens_sum") == received
    assert moved("kern:prompt_tokens") == sent
    assert moved("kern:generation_tokens") == received
    for reason, k in reasons.items():
        assert moved("kern:request_success", finished_reason=reason) == k, reason
    assert value(after, "kern:time_to_first_token_seconds", "kern:time_to_first_token_seconds_sum") > 0

    c, g, facts = s["counters"], s["gauges"], s["facts"]
    assert moved("kern:prefix_cache_queries") == sent
    hits = c["prefix_hit_tokens"] - stats0["prefix_hit_tokens"]
    assert moved("kern:prefix_cache_hits") == hits >= 64  # the repeat and the shared opening
    assert value(after, "kern:prefix_cache_hits_by_tier", tier="device") == c["resident_hit_tokens"]
    assert value(after, "kern:prefix_cache_hits_by_tier", tier="host") == c["host_hit_tokens"] == 0
    for name in COUNTERS:
        assert value(after, f"kern:{name}") == c[name], name
    for name in GAUGES:
        vname = {"running": "num_requests_running", "waiting": "num_requests_waiting"}.get(name, name)
        assert value(after, f"kern:{vname}") == g[name], name
    total, used = value(after, "kern:kv_pages_total"), value(after, "kern:kv_pages_used")
    assert total == facts["pages"] and used == g["pages_used"] == facts["pad_pages"] + g["snapshot_pages"]
    usage = value(after, "kern:kv_cache_usage_perc")
    assert 0 < usage <= 1 and usage == pytest.approx(used / total)


def _engine():
    from serve.core.engine import Options, build
    from serve.core.scheduler import Scheduler

    engine = build(TARGET, Options(capacity=512, backend="cpu"))
    sched = Scheduler(engine)
    sched.start()
    return engine, sched


def test_two_apps_in_one_process_do_not_share_metrics():
    from serve.api.app import make_app

    (ea, sa), (eb, sb) = _engine(), _engine()
    try:
        a, b = make_app(sa, ea), make_app(sb, eb)  # a second registration in one registry would raise
        assert a.state.metrics.registry is not b.state.metrics.registry
        assert not [n for n in REGISTRY._names_to_collectors if n.startswith("kern:")]

        async def run():
            async def client(app):
                return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://kern")

            async with await client(a) as ca, await client(b) as cb:
                r = await ca.post("/v1/completions", json={"prompt": list(b"only to a"), "max_tokens": 5})
                assert r.status_code == 200
                got = r.json()["usage"]
                return parse((await ca.get("/metrics")).text), parse((await cb.get("/metrics")).text), got

        ma, mb, usage = asyncio.run(run())
        assert value(ma, "kern:time_to_first_token_seconds", "kern:time_to_first_token_seconds_count") == 1
        assert value(mb, "kern:time_to_first_token_seconds", "kern:time_to_first_token_seconds_count") == 0
        assert value(ma, "kern:generation_tokens") == usage["completion_tokens"]
        assert value(mb, "kern:generation_tokens") == 0
        assert value(ma, "kern:prefix_cache_queries") == usage["prompt_tokens"]
        assert value(mb, "kern:requests") == 0
    finally:
        for s in (sa, sb):
            s.stop()
            s.join(30)


def test_token_buckets_are_vllms_1_2_5():
    assert buckets_1_2_5(8192) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
    assert buckets_1_2_5(1) == [1]


# -- the per-token observations gathered per scrape ---------------------------------------------------


def _exposed(m, stats, every: bool = False) -> dict:
    """The inter-token and generation-token samples (`every`: every sample) of a scrape."""
    return {(s.name, s.labels.get("le")): s.value for f in text_string_to_metric_families(m.render(stats).decode())
            for s in f.samples
            if every or "inter_token" in s.name or s.name.startswith("kern:generation_tokens")}


def test_pending_observations_expose_as_the_metrics_fed_one_by_one():
    """Property: inter-token latencies, generation tokens and any histogram's values (`put`: a
    finish's latencies and sizes) gathered in `Pending` and handed over when /metrics renders expose
    exactly what Prometheus's `observe` (once per token or value) and `inc` made (the same bucket for
    a value on a bound, the same sum), across several scrapes."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from serve.api.metrics import ITL_BUCKETS, Metrics

    values = st.one_of(st.sampled_from(list(ITL_BUCKETS)), st.floats(0, 30, allow_nan=False))
    sizes = st.one_of(st.integers(0, 300), st.sampled_from([1, 2, 5, 10, 20, 50, 64]))
    hists = ("ttft", "e2e", "request_prompt", "queue", "tpot", "max_generation", "params_max_tokens")

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.lists(st.tuples(values, st.integers(0, 9), st.sampled_from(hists), sizes), max_size=12),
                    min_size=1, max_size=3))
    def check(scrapes):
        gathered, direct = Metrics("m", 64), Metrics("m", 64)
        for updates in scrapes:
            for amount, n, name, size in updates:
                gathered.pending.observe(amount, n)
                gathered.pending.generated += n
                for _ in range(n):
                    direct.itl.observe(amount)
                direct.generation_tokens.inc(n)
                value = amount if name in ("ttft", "e2e", "queue", "tpot") else size  # a latency or a size
                gathered.pending.put(getattr(gathered, name), value)  # any histogram's one value, at the scrape
                getattr(direct, name).observe(value)
            got, want = _exposed(gathered, None, True), _exposed(direct, None, True)  # None: no scheduler part
            assert got.keys() == want.keys()
            for k in want:
                assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k

    check()

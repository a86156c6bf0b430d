"""vLLM's own /metrics held to vLLM's definitions against the gate's ledger (e2e/metrics_vllm.py): a
scrape that agrees passes, and each kind of disagreement is named."""

from __future__ import annotations

import pytest

from e2e.metrics import Sent, parse
from e2e.metrics_vllm import predict, verdict

L = 'model_name="kern-toy-vllm",engine="0"'


def scrape(**v: float) -> dict:
    """A vLLM-shaped scrape: counters, histograms' count and sum, gauges; `v` overrides the values."""
    d = {"prompt_tokens": 0, "generation_tokens": 0, "prompt_tokens_cached": 0, "prefix_cache_queries": 0,
         "prefix_cache_hits": 0, "num_preemptions": 0, "stop": 0, "length": 0, "abort": 0, "finished": 0,
         "first": 0, "prompt_sum": 0, "computed_sum": 0, "preempt_sum": 0, "running": 0, "waiting": 0,
         "usage": 0.0, **v}
    lines = []
    for name in ("prompt_tokens", "generation_tokens", "prompt_tokens_cached", "prefix_cache_queries",
                 "prefix_cache_hits", "num_preemptions"):
        lines += [f"# TYPE vllm:{name} counter", f"vllm:{name}_total{{{L}}} {d[name]}"]
    lines.append("# TYPE vllm:request_success counter")
    for r in ("stop", "length", "abort", "error"):
        lines.append(f'vllm:request_success_total{{{L},finished_reason="{r}"}} {d.get(r, 0)}')
    for name, count, total in (("e2e_request_latency_seconds", d["finished"], 1.0),
                               ("request_prompt_tokens", d["finished"], d["prompt_sum"]),
                               ("request_generation_tokens", d["finished"], d["generation_tokens"]),
                               ("request_num_preemptions", d["finished"], d["preempt_sum"]),
                               ("request_prefill_kv_computed_tokens", d["finished"], d["computed_sum"]),
                               ("time_to_first_token_seconds", d["first"], 0.5)):
        lines += [f"# TYPE vllm:{name} histogram", f'vllm:{name}_bucket{{{L},le="+Inf"}} {count}',
                  f"vllm:{name}_count{{{L}}} {count}", f"vllm:{name}_sum{{{L}}} {total}"]
    for name, key in (("num_requests_running", "running"), ("num_requests_waiting", "waiting"),
                      ("kv_cache_usage_perc", "usage")):
        lines += [f"# TYPE vllm:{name} gauge", f"vllm:{name}{{{L}}} {d[key]}"]
    return parse("\n".join(lines) + "\n")


SENT = [Sent("answered", 40, 12, 0, "length"), Sent("answered", 40, 5, 32, "stop"), Sent("refused", 9000)]
RIGHT = dict(prompt_tokens=80, generation_tokens=17, prompt_tokens_cached=32, prefix_cache_queries=80,
             prefix_cache_hits=32, stop=1, length=1, finished=2, first=2, prompt_sum=80, computed_sum=48)


def test_a_scrape_that_agrees_passes():
    ok, note = verdict(scrape(), scrape(**RIGHT), SENT)
    assert ok, note
    assert "2 answered, 0 hung up, 1 refused" in note


@pytest.mark.parametrize("change, named", [
    ({"generation_tokens": 18}, "vllm:generation_tokens_total 18 (sent: 17)"),
    ({"prompt_tokens_cached": 0, "prefix_cache_hits": 0, "computed_sum": 80}, "vllm:prompt_tokens_cached_total 0 (sent: 32)"),
    ({"stop": 0, "length": 2}, "vllm:request_success_total{stop} 0 (sent: 1)"),
    ({"num_preemptions": 3}, "num_preemptions_total 3 != the finished requests' request_num_preemptions_sum 0"),
    ({"computed_sum": 80}, "request_prefill_kv_computed_tokens_sum 80 != request_prompt_tokens_sum 80 - prompt_tokens_cached_total 32"),
    ({"prefix_cache_queries": 70}, "vllm:prefix_cache_queries_total 70 (sent: at least 80)"),
    ({"prefix_cache_hits": 90, "prefix_cache_queries": 85}, "prefix_cache_hits_total 90 > prefix_cache_queries_total 85"),
    ({"running": 1}, "vllm:num_requests_running 1 on an idle engine"),
    ({"usage": 0.25}, "vllm:kv_cache_usage_perc 0.25 on an idle engine"),
])
def test_each_disagreement_is_named(change, named):
    ok, note = verdict(scrape(), scrape(**{**RIGHT, **change}), SENT)
    assert not ok and named in note, note


def test_a_start_that_counted_already_fails():
    ok, note = verdict(scrape(prompt_tokens=5), scrape(**RIGHT), SENT)
    assert not ok and "vllm:prompt_tokens_total 5 at the session's start" in note, note


def test_a_hung_up_stream_holds_the_token_counts_at_least():
    """A stream hung up on ends as abort (or as stop or length when it had ended first); its tokens are
    not all known to the client, so token counts are held at least, and finished requests exactly."""
    sent = SENT + [Sent("hung_up", 40)]
    exact, least = predict(sent)
    assert exact == {} and least["prompt_tokens_total"] == 80 and least["prefix_cache_queries_total"] == 120
    end = {**RIGHT, "prompt_tokens": 120, "generation_tokens": 20, "prefix_cache_queries": 120, "abort": 1,
           "finished": 3, "first": 3, "prompt_sum": 120, "computed_sum": 88}
    ok, note = verdict(scrape(), scrape(**end), sent)
    assert ok, note
    assert "KNOWN" not in note
    ok, note = verdict(scrape(), scrape(**{**end, "stop": 0}), sent)
    assert not ok and "vllm:request_success_total 2 over every finished_reason (sent: 3, 1 of them hung up)" in note, note


def test_vllm_31503_passes_named_and_nothing_else_does():
    """vLLM up to 0.32 never counts a hung-up stream as finished (vllm#31503): every finished count
    short by exactly the hung-up streams and no abort counted passes, named; short by more fails."""
    sent = SENT + [Sent("hung_up", 40)]
    end = {**RIGHT, "prompt_tokens": 120, "generation_tokens": 20, "prefix_cache_queries": 120, "first": 3}
    ok, note = verdict(scrape(), scrape(**end), sent)
    assert ok and "KNOWN vllm#31503: 1 hung-up stream(s) aborted but never counted as finished" in note, note
    ok, note = verdict(scrape(), scrape(**{**end, "length": 0, "finished": 1}), sent)
    assert not ok and "over every finished_reason (sent: 3" in note, note


def test_speculative_drafts_are_told_and_more_accepted_than_drafted_fails():
    spec = '# TYPE vllm:spec_decode_num_draft_tokens counter\nvllm:spec_decode_num_draft_tokens_total{%s} %d\n' \
           '# TYPE vllm:spec_decode_num_accepted_tokens counter\nvllm:spec_decode_num_accepted_tokens_total{%s} %d\n'
    end = scrape(**RIGHT)
    ok, note = verdict(scrape(), {**end, **parse(spec % (L, 30, L, 12))}, SENT)
    assert ok and "speculative drafts 30 tokens, 12 accepted" in note, note
    ok, note = verdict(scrape(), {**end, **parse(spec % (L, 10, L, 12))}, SENT)
    assert not ok and "spec_decode_num_accepted_tokens_total 12 > its draft tokens 10" in note, note


def test_a_histogram_this_vllm_does_not_have_is_named_not_failed():
    """vLLM 0.29 has no vllm:request_num_preemptions: absent from both scrapes, it is told, not held;
    absent from the end scrape alone it is a difference."""
    drop = lambda m: {k: v for k, v in m.items() if not k[0].startswith("vllm:request_num_preemptions")}
    ok, note = verdict(drop(scrape()), drop(scrape(**RIGHT)), SENT)
    assert ok and "not in this vLLM: vllm:request_num_preemptions" in note, note
    ok, note = verdict(scrape(), drop(scrape(**RIGHT)), SENT)
    assert not ok and "vllm:request_num_preemptions_count missing" in note, note

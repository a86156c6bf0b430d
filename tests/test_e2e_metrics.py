"""The gate's /metrics prediction (e2e/metrics.py) against the server's own metric code.

Property: for any session of answered, hung-up and refused requests, feeding the server's `Metrics`
(serve/api/metrics.py) the updates those requests produce gives a scrape the gate's verdict passes, and
moving any one request metric by one fails it.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2e.client import hung_up
from e2e.metrics import Sent, parse, predict, told, verdict
from serve.api.metrics import Metrics
from serve.core.request import Done, Update
from serve.core.stats import COUNTERS, GAUGES


@st.composite
def session(draw):
    sent = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["answered", "answered", "hung_up", "refused"]))
        prompt = draw(st.integers(1, 300))
        if kind == "answered":
            steps = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
            tier = draw(st.sampled_from(["none", "device", "host"]))
            cached = 0 if tier == "none" else draw(st.integers(1, prompt))
            sent.append((Sent(kind, prompt, sum(steps), cached, draw(st.sampled_from(["stop", "length"])), tier,
                              tier == "host"), steps))
        elif kind == "hung_up":
            sent.append((Sent(kind, prompt), draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))))
        else:
            sent.append((Sent(kind, prompt), []))
    return sent


def stats_of(sent) -> dict:
    """The scheduler's side as its snapshot would give it: every admitted prompt queried, no hit."""
    queried = sum(s.prompt for s, _ in sent if s.kind != "refused")
    counters = dict.fromkeys(COUNTERS, 0)
    for tier, name in (("device", "resident_hit_tokens"), ("host", "host_hit_tokens")):
        counters[name] = sum(s.cached for s, _ in sent if s.kind == "answered" and s.tier == tier)
    counters["prefix_hit_tokens"] = counters["resident_hit_tokens"] + counters["host_hit_tokens"]
    told = [s for s, _ in sent if s.kind == "answered"]
    counters["resident_hits"] = sum(s.tier == "device" for s in told)
    counters["host_hits"] = counters["wakes"] = sum(s.tier == "host" for s in told)
    counters["wake_tokens"] = counters["host_hit_tokens"]
    return {"counters": counters, "gauges": dict.fromkeys(GAUGES, 0), "facts": {"pages": 1},
            "prefix_queries": queried}


def sample(key: str) -> tuple[str, tuple]:
    """A `predict` key as the parsed scrape's (name, labels)."""
    if "{" not in key:
        return "kern:" + key, ()
    name, label = key[:-1].split("{")
    k, _, v = label.rpartition("=")
    return "kern:" + name, ((k or "finished_reason", v),)


def scrape(sent) -> dict:
    m = Metrics("toy", 4096)
    for s, steps in sent:
        if s.kind == "refused":
            continue
        track = m.track(time.monotonic(), s.prompt)
        for n in steps:
            track.update(Update([65] * n))
        if s.kind == "answered":
            track.finish(Done(s.finish))
    return parse(m.render(stats_of(sent)).decode())


@settings(max_examples=60, deadline=None)
@given(session())
def test_the_servers_own_metrics_pass_and_any_moved_metric_fails(sent):
    ledger = [s for s, _ in sent]
    start, end = scrape([]), scrape(sent)
    stats = stats_of(sent)
    ok, note = verdict(start, end, ledger, stats, None)
    assert ok, note
    exact, _ = predict(ledger)
    for key in exact:
        name, labels = sample(key)
        assert end[(name, labels)] == exact[key], (key, note)
        moved = dict(end)
        moved[(name, labels)] += 1
        ok2, note2 = verdict(start, moved, ledger, stats, None)
        assert not ok2 and key.split("{")[0] in note2, (key, note2)
    # any bucket of the token-count histograms the gate holds bucket by bucket moved by one fails (the
    # request_max_num_generation_tokens and request_params_max_tokens histograms are held only +Inf = count)
    for (name, labels), v in end.items():
        if name in ("kern:request_prompt_tokens_bucket", "kern:request_generation_tokens_bucket"):
            moved = {**end, (name, labels): v + 1}
            ok2, note2 = verdict(start, moved, ledger, stats, None)
            assert not ok2 and "bucket" in note2, (name, labels, note2)


def test_a_host_hit_told_as_device_and_a_gauge_off_idle_fail():
    sent = [(Sent("answered", 40, 3, 32, "stop", "host", True), [1, 2]),
            (Sent("answered", 40, 3, 0, "length", "none", False), [3])]
    ledger = [s for s, _ in sent]
    start, end, stats = scrape([]), scrape(sent), stats_of(sent)
    assert verdict(start, end, ledger, stats, None)[0]
    told_device = [Sent("answered", 40, 3, 32, "stop", "device", False), ledger[1]]
    ok, note = verdict(start, end, told_device, stats, None)
    assert not ok and "prefix_cache_hits_by_tier_total{tier=host} 32 (sent: 0)" in note, note
    running = {**stats, "gauges": {**stats["gauges"], "leases": 1}}
    ok, note = verdict(start, end, ledger, running, None)
    assert not ok and "leases 0 (idle, /stats: 1)" in note, note
    assert verdict(start, end, ledger, running, None, idle=False)[0]  # a hung session's gauges are not held


def test_a_nonzero_start_and_a_stats_mismatch_fail():
    zero = scrape([])
    assert verdict(zero, zero, [], stats_of([]), None)[0]
    start = {**zero, ("kern:prompt_tokens_total", ()): 5.0}
    ok, note = verdict(start, zero, [], None, None)
    assert not ok and "prompt_tokens_total 5 at the session's start" in note
    end = {**zero, ("kern:parks_total", ()): 2.0}
    ok, note = verdict(zero, end, [], {"counters": {"parks": 3}}, {"parks": 3})
    assert not ok and "parks_total 2 (/stats 3)" in note and "parks_total 2 (policy 3)" in note


def _told_session():
    sent = [(Sent("answered", 40, 3, 0, "stop", "none", False, (), "req-0"), [1, 2]),
            (Sent("answered", 40, 3, 24, "stop", "device", False, (), "req-1"), [3]),
            (Sent("answered", 48, 2, 32, "length", "host", True, (), "req-2"), [2])]
    return sent, [s for s, _ in sent], scrape([]), scrape(sent), stats_of(sent)


def test_every_response_must_tell_its_kern_fields():
    """A server with /stats whose response (a stream's last chunk, a chat answer, one of a burst)
    lacks a kern field fails the metrics check, whichever request it was; a server with no /stats
    (the Rust kern) is not asked."""
    sent, ledger, start, end, stats = _told_session()
    assert verdict(start, end, ledger, stats, None)[0]
    quiet = [ledger[0], dataclasses.replace(ledger[1], untold=("cache_tier",)), ledger[2]]
    ok, note = verdict(start, end, quiet, stats, None)
    assert not ok and "1 response(s) without kern fields, e.g. req-1 lacks cache_tier" in note, note
    assert not told(end, quiet) == []
    assert "without kern fields" not in verdict(start, end, quiet, None, None)[1]


def test_woken_never_told_or_told_for_a_device_hit_fails():
    sent, ledger, start, end, stats = _told_session()
    never = [ledger[0], ledger[1], dataclasses.replace(ledger[2], woken=False)]
    ok, note = verdict(start, end, never, stats, None)
    assert not ok and "req-2: cache_tier host, woken False" in note and "wakes_total 1 (answers told: 0)" in note, note
    every = [ledger[0], dataclasses.replace(ledger[1], woken=True), ledger[2]]
    ok, note = verdict(start, end, every, stats, None)
    assert not ok and "req-1: cache_tier device, woken True" in note and "wake_tokens_total 32 (answers told: 56)" in note


@pytest.mark.parametrize("name", ["resident_hits", "host_hits", "wakes", "wake_tokens"])
def test_a_hit_counter_moved_by_one_fails_and_a_hung_stream_widens_it_by_its_one_hit(name):
    sent, ledger, start, end, stats = _told_session()
    key = ("kern:" + name + "_total", ())
    assert end[key] == {"resident_hits": 1, "host_hits": 1, "wakes": 1, "wake_tokens": 32}[name]
    for delta in (-1, 1):
        assert any(p.startswith(name + "_total") for p in told({**end, key: end[key] + delta}, ledger))
    hung = ledger + [Sent("hung_up", 40)]  # its hit is untold: one hit more, at most its 40 prompt tokens
    room = 40 if name == "wake_tokens" else 1
    assert told({**end, key: end[key] + room}, hung) == []
    assert told({**end, key: end[key] + room + 1}, hung) != []
    assert told({**end, key: end[key] - 1}, hung) != []


def test_a_hung_up_stream_is_told_by_its_first_chunk():
    """`Client.hang_up`'s ledger entry: the hit its first chunk's kern told; a stream hung up before
    any chunk is untold (its hit a range); a first chunk without kern is a kern field missing."""
    told_hit = hung_up("req-5", 40, {"choices": [], "kern": {"request_id": "req-5", "cache_tier": "host",
                                                            "cached_tokens": 32, "woken": True}})
    assert (told_hit.cached, told_hit.tier, told_hit.woken, told_hit.untold) == (32, "host", True, ())
    assert hung_up("req-5", 40, None) == Sent("hung_up", 40, request="req-5")
    assert hung_up("req-5", 40, {"choices": []}).untold == ("kern",)
    sent, ledger, start, end, stats = _told_session()
    exact, least = predict(ledger + [told_hit])
    assert "prefix_cache_hits_total" in exact and "generation_tokens_total" in least
    exact, least = predict(ledger + [hung_up("req-5", 40, None)])
    assert "prefix_cache_hits_total" in least
    # the told hung-up hit counts exactly: the answers' counters plus its one host hit and 32 tokens
    moved = {**end, ("kern:host_hits_total", ()): 2.0, ("kern:wakes_total", ()): 2.0,
             ("kern:wake_tokens_total", ()): 64.0}
    assert told(moved, ledger + [told_hit]) == []
    assert told(end, ledger + [told_hit]) != []
    assert "lacks kern" in "; ".join(told(end, ledger + [hung_up("req-5", 40, {"choices": []})]))


def test_after_a_stage_loss_prefix_lookups_are_held_to_at_least_the_ledger():
    """A pipeline head that resumed requests (/stats pipeline.requeued) looked each up again: its
    prefix-cache queries may exceed what was sent, never fall short; each resumed request may add one
    told hit. Without a loss both stay exact."""
    sent = [(Sent("answered", 40, 3, 32, "stop", "device", False), [1, 2]),
            (Sent("answered", 40, 3, 0, "length", "none", False), [3])]
    ledger = [s for s, _ in sent]
    start, end, stats = scrape([]), scrape(sent), stats_of(sent)
    key = ("kern:prefix_cache_queries_total", ())
    lost = {**stats, "pipeline": {"epoch": 1, "losses": 1, "requeued": 1, "answered_error": 0}}
    more = {**end, key: end[key] + 40}
    ok, note = verdict(start, more, ledger, stats, None)
    assert not ok and "prefix_cache_queries_total" in note, note
    ok, note = verdict(start, more, ledger, lost, None)
    assert ok and "1 request(s) resumed" in note, note
    assert not verdict(start, {**end, key: end[key] - 1}, ledger, lost, None)[0]
    hits = ("kern:resident_hits_total", ())
    assert told({**end, hits: end[hits] + 1}, ledger, resumed=1) == []
    assert told({**end, hits: end[hits] + 2}, ledger, resumed=1) != []
    assert told({**end, hits: end[hits] + 1}, ledger) != []

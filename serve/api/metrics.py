"""/metrics: Prometheus text from `prometheus_client`, with vLLM's names and meanings under `kern:`.

One `Metrics` per app (made in `make_app`), each with its own `CollectorRegistry`: nothing is
registered in the default registry, so two servers in one process share nothing. Every sample
carries `model_name`.

Two sources:
- what the scheduler owns (gauges, its counters) is read at scrape time by `SchedulerCollector` from
  one `serve.core.scheduler.snapshot(scheduler)`, taken on the scheduler thread (`scheduler.query(...)`);
- the latency and size histograms, the token counters and `request_success` are fed in the HTTP
  handler's path by a `Track` per request, as its updates arrive.

`--metrics-prefix vllm` (`Metrics(..., prefix="vllm")`) names the metrics that mirror vLLM's (`VLLM`)
`vllm:` instead of `kern:`, with vLLM's labels (`model_name` and `engine="0"`), so a vLLM Grafana
dashboard reads a kern server unchanged (docs/grafana/); kern's own metrics stay `kern:`.

docs/metrics.md lists every metric and the vLLM metric it mirrors.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from serve.client.seam import COUNTERS, GAUGES, Done, Update

__all__ = ["PREFIXES", "VLLM", "Metrics", "Names", "SchedulerCollector", "Track"]

PREFIX = "kern:"
PREFIXES = ("kern", "vllm")  # --metrics-prefix
ENGINE = "0"  # vLLM's `engine` label: the engine core's index (one engine here)
FINISHED = ("stop", "length")
# the metrics whose meaning is vLLM's metric of the same name (docs/metrics.md); under
# --metrics-prefix vllm they are named vllm:<name> and labelled model_name and engine
VLLM = frozenset({
    "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries", "prefix_cache_hits",
    "num_preemptions", "prompt_tokens", "generation_tokens", "request_success", "time_to_first_token_seconds",
    "inter_token_latency_seconds", "e2e_request_latency_seconds", "request_prompt_tokens", "request_generation_tokens",
    "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
    "request_inference_time_seconds", "request_time_per_output_token_seconds", "request_max_num_generation_tokens",
    "request_params_n", "request_params_max_tokens",
})
N_BUCKETS = (1, 2, 5, 10, 20)  # vLLM's request_params_n buckets
# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
# the scheduler's gauges that have a vLLM name instead of kern:<name>
RENAMED = {"running": "num_requests_running", "waiting": "num_requests_waiting"}


class _NoCreated:
    """No `_created` series (a scrape-time gauge of when each child was made): the scheduler's
    counters have none either, and dashboards read rates. Per class, not the module-wide switch."""

    def _child_samples(self):
        return tuple(s for s in super()._child_samples() if s.name != "_created")


class _Counter(_NoCreated, Counter):
    pass


class _Histogram(_NoCreated, Histogram):
    pass


def buckets_1_2_5(top: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `top` (vLLM's build_1_2_5_buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > top:
                return out or [1]
            out.append(m * scale)
        scale *= 10


class Names:
    """A metric's exposed name, label names and label values under a prefix (`PREFIXES`)."""

    def __init__(self, prefix: str, model: str) -> None:
        if prefix not in PREFIXES:
            raise ValueError(f"metrics prefix {prefix!r}: one of {', '.join(PREFIXES)}")
        self.vllm = prefix == "vllm"
        self.model = model

    def _theirs(self, name: str) -> bool:
        return self.vllm and name in VLLM

    def name(self, name: str) -> str:
        return ("vllm:" if self._theirs(name) else PREFIX) + name

    def labels(self, name: str) -> list[str]:
        return ["model_name", "engine"] if self._theirs(name) else ["model_name"]

    def values(self, name: str) -> list[str]:
        return [self.model, ENGINE] if self._theirs(name) else [self.model]


class SchedulerCollector(Collector):
    """The scheduler's gauges and counters, from the snapshot `Metrics.render` was handed."""

    def __init__(self, model: str, names: Names | None = None) -> None:
        self.model = model
        self.names = names or Names("kern", model)
        self.stats: dict | None = None

    def describe(self) -> Iterator:
        return self._families(None)

    def collect(self) -> Iterator:
        return self._families(self.stats)

    def _families(self, s: dict | None) -> Iterator:
        n = self.names

        def gauge(name: str, doc: str, value) -> GaugeMetricFamily:
            f = GaugeMetricFamily(n.name(name), doc, labels=n.labels(name))
            if s is not None:
                f.add_metric(n.values(name), value() if callable(value) else value)
            return f

        def counter(name: str, doc: str, value, extra: str | None = None) -> CounterMetricFamily:
            f = CounterMetricFamily(n.name(name), doc, labels=n.labels(name) + ([extra] if extra else []))
            if s is not None:
                for labels, v in (value() if callable(value) else [((), value)]):
                    f.add_metric([*n.values(name), *labels], v)
            return f

        c = s["counters"] if s else {}
        g = s["gauges"] if s else {}
        pages = s["facts"]["pages"] if s else 0
        yield gauge("num_requests_running", "Number of requests in model execution batches (holding a lease).",
                    lambda: g["running"])
        yield gauge("num_requests_waiting", "Number of requests waiting to be processed (queued for room).",
                    lambda: g["waiting"])
        yield gauge("kv_cache_usage_perc", "KV-cache usage (pages held, snapshots and the pad included, over the "
                    "pool's pages). 1 means 100 percent usage.",
                    lambda: g["pages_used"] / pages if pages else 0.0)
        yield gauge("kv_pages_total", "Pages in the device pool (facts.pages).", pages)
        yield gauge("kv_pages_used", "Pages held: leases, resident snapshots and the pad.", lambda: g["pages_used"])
        yield counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens "
                      "(prompt tokens of admitted requests).", lambda: [((), s["prefix_queries"])])
        yield counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      lambda: [((), c["prefix_hit_tokens"])])
        yield counter("num_preemptions", "Cumulative number of preemption from the engine (always 0: a request "
                      "that finds no room waits at the queue's head, none is preempted).", lambda: [((), 0)])
        yield counter("prefix_cache_hits_by_tier", "Prefix cache hits in cached tokens, by the tier they came from.",
                      lambda: [(("device",), c["resident_hit_tokens"]), (("host",), c["host_hit_tokens"])], "tier")
        for name in COUNTERS:
            yield counter(name, f"Cumulative {name.replace('_', ' ')} (/stats counters.{name}).",
                          lambda name=name: [((), c[name])])
        for name in GAUGES:
            if name not in RENAMED:
                yield gauge(name, f"Current {name.replace('_', ' ')} (/stats gauges.{name}).",
                            lambda name=name: g[name])


class Metrics:
    """One app's registry: the scheduler collector and the handler-fed histograms and counters.
    `prefix` ("kern" or "vllm", `--metrics-prefix`) names the vLLM-mirrored ones (`Names`)."""

    def __init__(self, model: str, max_model_len: int, prefix: str = "kern", shared: str | None = None) -> None:
        self.model = model
        # `--frontends`: the directory of every front end's values (`serve.client.frontend.share_metrics`), summed
        # at each scrape; each front end then hands its gathered observations over at once (`Pending.now`)
        self.shared = shared
        self.names = n = Names(prefix, model)
        self.registry = r = CollectorRegistry()
        self.scheduler = SchedulerCollector(model, n)
        r.register(self.scheduler)
        tokens = buckets_1_2_5(max(max_model_len, 1))

        def hist(name: str, doc: str, buckets) -> Histogram:
            return _Histogram(n.name(name), doc, n.labels(name), registry=r, buckets=buckets).labels(*n.values(name))

        def count(name: str, doc: str) -> Counter:
            return _Counter(n.name(name), doc, n.labels(name), registry=r).labels(*n.values(name))

        self.ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = hist("request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                          LATENCY_BUCKETS)
        self.inference = hist("request_inference_time_seconds",
                              "Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS)
        self.prefill = hist("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                            LATENCY_BUCKETS)
        self.decode = hist("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                           LATENCY_BUCKETS)
        self.request_prompt = hist("request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.request_generation = hist("request_generation_tokens", "Number of generation tokens processed.", tokens)
        self.max_generation = hist("request_max_num_generation_tokens",
                                   "Histogram of maximum number of requested generation tokens.", tokens)
        self.params_n = hist("request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.params_max_tokens = hist("request_params_max_tokens", "Histogram of the max_tokens request parameter.",
                                      tokens)
        self.prompt_tokens = count("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = count("generation_tokens", "Number of generation tokens processed.")
        success = _Counter(n.name("request_success"), "Count of successfully processed requests.",
                           n.labels("request_success") + ["finished_reason"], registry=r)
        self.success = {reason: success.labels(*n.values("request_success"), reason) for reason in FINISHED}
        self.pending = Pending(self.itl, self.generation_tokens, now=shared is not None)

    def render(self, stats: dict) -> bytes:
        """The exposition, the scheduler's part read from `stats` (a `snapshot`). No await happens
        between handing the snapshot over and rendering, so concurrent scrapes do not mix."""
        self.scheduler.stats = stats
        self.pending.flush()
        registry = self.registry
        if self.shared is not None:  # every front end's values, from their files
            from prometheus_client.multiprocess import MultiProcessCollector

            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.shared)
            registry.register(self.scheduler)
        try:
            return generate_latest(registry)
        finally:
            self.scheduler.stats = None

    def track(self, t_arrive: float, prompt: int, req=None, max_tokens: int | None = None) -> Track:
        """A request's observations; `req` (its `serve.core.request.Request`: `t_admit`, set on the scheduler
        thread before its first update) times its queue and prefill phases, `max_tokens` is the
        parameter asked."""
        return Track(self, t_arrive, prompt, req, max_tokens)


class Pending:
    """The handler-fed observations gathered as plain numbers and handed to their Prometheus metrics
    when /metrics renders: under load every update of every request made one histogram observation
    and one counter increment, and every finish a dozen more, each taking the metric's lock (a fifth
    of the front end's time at 64 streams, then a tenth of a whole answer's), where a scrape needs
    only the totals. Fed and flushed on the event loop's thread (the handlers' and `render`'s).
    `observe` takes the inter-token latencies (`n` at a time), `put` one value of any histogram."""

    __slots__ = ("itl", "tokens", "bounds", "counts", "sum", "generated", "held", "now")

    def __init__(self, itl: Histogram, tokens: Counter, now: bool = False) -> None:
        self.itl, self.tokens = itl, tokens
        self.now = now  # flushed at each finish and each batch of the core's timings (`--frontends`: a
        # scrape of another front end reads this one's values from its file, not through this object)
        self.bounds = list(itl._upper_bounds)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.generated = 0
        self.held: dict = {}  # histogram -> [its bounds, counts, sum]: `put`'s values

    def observe(self, amount: float, n: int) -> None:
        """`n` inter-token latencies of `amount` seconds each (`observe(amount)` n times)."""
        if n > 0:
            self.counts[bisect_left(self.bounds, amount)] += n
            self.sum += amount * n

    def put(self, hist: Histogram, value: float) -> None:
        """`hist.observe(value)`, at the next flush."""
        h = self.held.get(hist)
        if h is None:
            bounds = list(hist._upper_bounds)
            h = self.held[hist] = [bounds, [0] * len(bounds), 0.0]
        h[1][bisect_left(h[0], value)] += 1
        h[2] += value

    def flush(self) -> None:
        counts, self.counts = self.counts, [0] * len(self.bounds)
        for i, c in enumerate(counts):
            if c:
                self.itl._buckets[i].inc(c)
        if self.sum:
            self.itl._sum.inc(self.sum)
            self.sum = 0.0
        if self.generated:
            self.tokens.inc(self.generated)
            self.generated = 0
        held, self.held = self.held, {}
        for hist, (_, counts, total) in held.items():
            for i, c in enumerate(counts):
                if c:
                    hist._buckets[i].inc(c)
            hist._sum.inc(total)


class Track:
    """One request's observations, fed by its handler: `update` for each update as it arrives,
    `finish` once its answer is whole (a stop or length finish)."""

    __slots__ = ("m", "t_arrive", "prompt", "generated", "first", "last", "req", "max_tokens")

    def __init__(self, m: Metrics, t_arrive: float, prompt: int, req=None, max_tokens: int | None = None) -> None:
        self.m = m
        self.t_arrive = t_arrive
        self.prompt = prompt
        self.generated = 0
        self.first: float | None = None
        self.last: float | None = None
        self.req = req
        self.max_tokens = max_tokens

    def update(self, update: Update) -> None:
        n = len(update.tokens)
        if not n:
            return
        now = time.monotonic()
        m = self.m
        pending = m.pending
        if self.last is None:
            # the first token: prefill is done; tokens arriving with it came at no extra wait
            pending.put(m.ttft, now - self.t_arrive)
            self.first = now
            m.prompt_tokens.inc(self.prompt)
            pending.observe(0.0, n - 1)
        else:
            # each token of the update gets an even share of the wait since the previous update
            pending.observe((now - self.last) / n, n)
        pending.generated += n
        self.generated += n
        self.last = now

    def arrived(self, n: int) -> None:
        """`n` tokens after the first whose timings and count the metrics already have (an engine
        core that held a whole answer's tokens timed them, `serve.client.frontend_core.Timed`)."""
        self.generated += n
        self.last = time.monotonic()

    def close(self) -> None:
        """The request's handler is done with it (finished, hung up, refused or cut off): with
        `--frontends` what it observed is handed to its metrics now (`Pending.now`)."""
        if self.m.pending.now:
            self.m.pending.flush()

    def finish(self, done: Done) -> None:
        if done.reason not in FINISHED:
            return
        m = self.m
        now = time.monotonic()
        m.success[done.reason].inc()
        put = m.pending.put
        put(m.e2e, now - self.t_arrive)
        put(m.request_prompt, self.prompt)
        put(m.request_generation, self.generated)
        # vLLM's phases: queued (arrival to admission), prefill (admission to the first token), decode
        # (the first token to the last), inference (admission to the last token)
        admitted = getattr(self.req, "t_admit", 0.0) or self.t_arrive
        first = self.first if self.first is not None else now
        last = self.last if self.last is not None else now
        put(m.queue, max(admitted - self.t_arrive, 0.0))
        put(m.prefill, max(first - admitted, 0.0))
        put(m.decode, max(last - first, 0.0))
        put(m.inference, max(last - admitted, 0.0))
        put(m.tpot, (last - first) / (self.generated - 1) if self.generated > 1 else 0.0)
        put(m.max_generation, self.generated)  # one sequence per request (n = 1): its own
        put(m.params_n, 1)
        if self.max_tokens:
            put(m.params_max_tokens, self.max_tokens)
        self.close()

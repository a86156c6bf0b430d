"""Token-exact check of a running vLLM server (serving the kern toy model) against
toy_reference.generate.

usage: python check.py [BASE_URL] [--prompts N] [--flood M] [--seed S] [--block B]

Phases (every answer is compared with toy_reference.generate):
  cold       each prompt once, sequentially (prefix-sharing siblings may already hit)
  warm       right after its cold ask, the same prompt again (cached_tokens > 0
             expected if len > block; the KV budget is too small to keep all prompts)
  concurrent all prompts at once (small KV budget -> preemption)
  flood      M other long prompts, concurrently, to evict the cache
  restored   each prompt again, sequentially (blocks evicted -> recomputed)
The standard library, and numpy for the reference (urllib + threads).
"""

import argparse
import json
import os
import random
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy_reference as R  # noqa: E402

MODEL = "kern-toy-vllm"


def http(url, body=None, timeout=600):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return raw


def complete(base, ids, max_tokens=64):
    body = {"model": MODEL, "prompt": ids, "max_tokens": max_tokens,
            "temperature": 0, "return_token_ids": True}
    t0 = time.time()
    d = json.loads(http(base + "/v1/completions", body))
    ch = d["choices"][0]
    toks = list(ch["token_ids"])
    usage = d.get("usage") or {}
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return {"tokens": toks, "finish": ch.get("finish_reason"),
            "stop_reason": ch.get("stop_reason"),
            "prompt_ids": ch.get("prompt_token_ids"), "cached": cached,
            "secs": time.time() - t0}


def metric(base, name):
    txt = http(base + "/metrics").decode()
    tot = 0.0
    for line in txt.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            tot += float(line.rsplit(" ", 1)[1])
    return tot


def strip_eos(toks):
    return toks[:-1] if toks and toks[-1] == R.EOS else toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base", nargs="?", default="http://127.0.0.1:8811")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--flood", type=int, default=80)
    ap.add_argument("--seed", type=int, default=20261204)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--workers", type=int, default=64)
    a = ap.parse_args()
    base = a.base.rstrip("/")
    rng = random.Random(a.seed)

    # prompts with shared prefixes: 6 families of random-byte prefixes
    fams = [[rng.randrange(256) for _ in range(rng.randrange(40, 300))] for _ in range(6)]
    prompts = []
    edge = [5, 6, 31, 32, 33, 63, 64, 65, 200, 400]  # around block / chunk sizes
    for i in range(a.prompts):
        n = edge[i] if i < len(edge) else rng.randrange(5, 401)
        if i % 4 == 3:  # a quarter: no shared prefix
            p = [rng.randrange(256) for _ in range(n)]
        else:
            f = fams[i % len(fams)]
            k = min(len(f), rng.randrange(1, n + 1))
            p = f[:k] + [rng.randrange(256) for _ in range(n - k)]
        prompts.append(p)
    ref = [R.generate(p, a.max_tokens, None) for p in prompts]

    stats = {}
    mism = []
    eos_included = {"yes": 0, "no": 0}
    warm_miss = []

    def judge(phase, i, p, want, got):
        st = stats.setdefault(phase, {"n": 0, "ok": 0, "cached_tokens": 0,
                                      "cached_hits": 0, "eos_stops": 0, "secs": 0.0})
        st["n"] += 1
        st["secs"] += got["secs"]
        st["cached_tokens"] += got["cached"]
        st["cached_hits"] += got["cached"] > 0
        toks = got["tokens"]
        if toks and toks[-1] == R.EOS:
            eos_included["yes"] += 1
        gen = strip_eos(toks)
        ok = gen == want
        if len(want) < a.max_tokens:  # reference stopped on EOS
            ok = ok and got["finish"] == "stop"
            st["eos_stops"] += got["finish"] == "stop"
        else:
            ok = ok and got["finish"] == "length"
        if got["prompt_ids"] is not None and list(got["prompt_ids"]) != list(p):
            ok = False
        st["ok"] += ok
        if phase == "warm" and len(p) > a.block and got["cached"] == 0:
            warm_miss.append(len(p))
        if not ok:
            div = next((j for j, (x, y) in enumerate(zip(gen, want)) if x != y),
                       min(len(gen), len(want)))
            mism.append({"phase": phase, "i": i, "len": len(p), "first_div": div,
                         "got": toks, "want": want, "finish": got["finish"],
                         "prompt": p})

    def run_seq(phase, items):
        for i, p, want in items:
            judge(phase, i, p, want, complete(base, p, a.max_tokens))

    def run_conc(phase, items, workers):
        with ThreadPoolExecutor(workers) as ex:
            futs = [(i, p, want, ex.submit(complete, base, p, a.max_tokens))
                    for i, p, want in items]
            for i, p, want, f in futs:
                judge(phase, i, p, want, f.result())

    items = [(i, p, ref[i]) for i, p in enumerate(prompts)]
    pre0 = metric(base, "vllm:num_preemptions_total")
    t0 = time.time()
    for it in items:  # each prompt cold, then at once again (warm)
        run_seq("cold", [it])
        run_seq("warm", [it])
    pre1 = metric(base, "vllm:num_preemptions_total")
    run_conc("concurrent", items, a.workers)
    pre2 = metric(base, "vllm:num_preemptions_total")
    flood = []
    for i in range(a.flood):
        p = [rng.randrange(256) for _ in range(rng.randrange(250, 401))]
        flood.append((1000 + i, p, R.generate(p, a.max_tokens, None)))
    run_conc("flood", flood, 16)
    pre3 = metric(base, "vllm:num_preemptions_total")
    run_seq("restored", items)
    pre4 = metric(base, "vllm:num_preemptions_total")
    wall = time.time() - t0

    warm_expect = sum(1 for p in prompts if len(p) > a.block)
    print(f"server {base}  prompts={len(prompts)} (len {min(map(len, prompts))}.."
          f"{max(map(len, prompts))}, 6 prefix families)  flood={a.flood}  wall={wall:.1f}s")
    total = ok = 0
    for ph in ("cold", "warm", "concurrent", "flood", "restored"):
        st = stats[ph]
        total += st["n"]
        ok += st["ok"]
        print(f"  {ph:10s} identical {st['ok']:3d}/{st['n']:3d}  cached_tokens={st['cached_tokens']:6d}"
              f"  requests_with_cache_hit={st['cached_hits']:3d}  eos_stops={st['eos_stops']:3d}"
              f"  mean_latency={st['secs'] / max(1, st['n']):.2f}s")
    print(f"  warm: prompts longer than block {a.block}: {warm_expect}, "
          f"got cache hits on {stats['warm']['cached_hits']}"
          f"{'  (misses at lengths ' + str(warm_miss) + ')' if warm_miss else ''}")
    print(f"  token_ids ending with EOS(256): {eos_included['yes']}, not: {eos_included['no'] + sum(s['n'] for s in stats.values()) - eos_included['yes']}")
    print(f"  preemptions (vllm:num_preemptions_total deltas): cold+warm={pre1 - pre0:.0f} "
          f"concurrent={pre2 - pre1:.0f} flood={pre3 - pre2:.0f} restored={pre4 - pre3:.0f} "
          f"total={pre4:.0f}")
    print(f"TOTAL identical {ok}/{total}  mismatches={len(mism)}")
    for m in mism[:10]:
        print("MISMATCH", json.dumps(m))
    return 0 if ok == total else 1


if __name__ == "__main__":
    sys.exit(main())

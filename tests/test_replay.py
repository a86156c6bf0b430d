"""`kern replay`: trace reading, the paper's LRU, the engine policy's accounting, the command line, and
`--server`: a scaled trace sent to a real `kern serve`, whose hits and tiers must equal the replay's."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from click.testing import CliRunner

from replay.run import replay_engine, replay_lru, setup_for
from replay.traces import BLOCK, Req, TraceError, block_tokens, read, scale


def mooncake(path, n: int = 40, seed: int = 3, block: int = BLOCK) -> list[dict]:
    """A Mooncake-format trace of multi-turn sessions over two shared system blocks: each turn's ids
    extend its session's last turn; some sessions branch off another's history."""
    rng = random.Random(seed)
    next_id = 10
    sessions: list[list[int]] = []
    lines = []
    for t in range(n):
        if not sessions or rng.random() < 0.3:
            base = [0, 1] if rng.random() < 0.7 else [2]
            if sessions and rng.random() < 0.3:
                base = list(rng.choice(sessions))[: rng.randrange(1, 4)]
            sessions.append(base)
        s = rng.randrange(len(sessions))
        for _ in range(rng.randrange(1, 3)):
            sessions[s].append(next_id)
            next_id += 1
        ids = list(sessions[s])
        length = (len(ids) - 1) * block + rng.randrange(1, block + 1)
        lines.append({"timestamp": t * 10, "input_length": length, "output_length": rng.randrange(1, 3 * block),
                      "hash_ids": ids})
    with open(path, "w") as f:
        for d in lines:
            f.write(json.dumps(d) + "\n")
    return lines


def as_reqs(lines: list[dict], block: int) -> list[Req]:
    return [Req(d["timestamp"], d["input_length"], d["output_length"], d["hash_ids"], block=block) for d in lines]


# traces


def test_blocks_share_tokens_exactly_where_ids_do():
    a = block_tokens([5, 6, 7], 2 * BLOCK + 10)
    b = block_tokens([5, 6, 9], 3 * BLOCK)
    assert len(a) == 2 * BLOCK + 10 and len(b) == 3 * BLOCK
    assert (a[: 2 * BLOCK] == b[: 2 * BLOCK]).all() and not (a[2 * BLOCK:] == b[2 * BLOCK: 2 * BLOCK + 10]).any()
    # the partial last block is its block's first tokens
    assert (block_tokens([5, 6, 9], 2 * BLOCK + 10)[2 * BLOCK:] == b[2 * BLOCK: 2 * BLOCK + 10]).all()
    small = block_tokens([5, 6, 7], 2 * BLOCK, vocab=256)
    assert small.max() < 256 and (small == block_tokens([5, 6, 8], 2 * BLOCK, vocab=256)).all()


@pytest.mark.parametrize("line, message", [
    ("{", "not JSON"),
    ('[1, 2]', "JSON object"),
    ('{"input_length": 10, "output_length": 1, "hash_ids": [1, -2]}', "non-negative"),
    ('{"input_length": 600, "output_length": 1, "hash_ids": [1]}', "does not fit 1 blocks"),
    ('{"input_length": 10, "output_length": 0, "hash_ids": [1]}', "output_length must be"),
    ('{"prompt": [1, 2], "max_tokens": "3"}', r"output_length \(or max_tokens\)"),
    ('{"prompt": []}', "non-empty list"),
    ('{"foo": 1}', "needs hash_ids"),
])
def test_a_bad_line_is_named(tmp_path, line, message):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1]}\n' + line + "\n")
    with pytest.raises(TraceError, match=message) as info:
        read(str(p))
    assert "t.jsonl:2" in str(info.value)


def test_timestamp_order_and_scaling(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 5, "input_length": 1000, "output_length": 40, "hash_ids": [1, 2]}\n'
                 '{"timestamp": 1, "prompt": [7, 8, 9], "output_length": 2}\n')
    assert [r.timestamp for r in read(str(p))] == [5, 1]
    got = read(str(p), "timestamp")
    assert [r.timestamp for r in got] == [1, 5]
    small = scale(got, 4)
    assert (small[1].input_length, small[1].output_length, small[1].block) == (250, 10, 128)
    assert (small[0].input_length, small[0].tokens) == (1, [7])


# the paper's LRU


def test_lru_hits_leading_cached_blocks_and_evicts_the_least_recent():
    """Per-block LRU of the inputs: capacity of 2 blocks; a request hits its leading cached blocks."""
    reqs = [Req(0, 2 * BLOCK, 1, hash_ids=[1, 2]), Req(1, 2 * BLOCK, 1, hash_ids=[1, 2]),
            Req(2, BLOCK, 1, hash_ids=[3]), Req(3, 2 * BLOCK, 1, hash_ids=[1, 2]),
            Req(4, BLOCK + 7, 1, hash_ids=[2, 5])]
    f = replay_lru(reqs, 2 * BLOCK)
    # 2nd: both blocks; 3rd: none (3 evicts 1); 4th: none (1 is gone); 5th: block 2 is cached, 5 is not
    assert [h for h, _ in f.per_request] == [0, 2 * BLOCK, 0, 0, BLOCK]
    assert f.bound_tokens == 5 * BLOCK  # the 2nd, the 4th and the 5th's first, with a cache that never forgets
    assert f.evictions == 3  # block 1 for 3, block 3 for 1, block 1 again for 5's partial block
    big = replay_lru(reqs, 100 * BLOCK)
    assert big.hit_tokens == f.bound_tokens and big.evictions == 0


def test_piped_progress_speaks_at_least_every_interval():
    """`kern replay` piped (a CI log): a line per 1,000 requests once `every` seconds have passed, with
    the count done, so a 10-minute replay is never silent until its table."""
    import io
    from contextlib import redirect_stderr

    from replay.cli import _Lines

    err = io.StringIO()
    with redirect_stderr(err), _Lines(5000, every=0.0) as lines:
        for _ in range(5000):
            lines.update(1)
    said = err.getvalue().splitlines()
    assert [x.split(":")[1].strip() for x in said] == ["progress"] * 5 + ["done"], said
    assert "3,000/5,000 requests" in said[2] and "s left" in said[2] and "5,000/5,000" in said[-1]


# the engine policy


def test_engine_replay_without_pressure_reaches_the_bound(tmp_path):
    """With a device tier that holds everything, every request hits what the never-evicting index
    hits; and the replay leaves the pool empty (replay_engine asserts it)."""
    reqs = as_reqs(mooncake(tmp_path / "t.jsonl", block=64), 64)
    f = replay_engine(reqs, setup_for(16, 1 << 20, reach=1 << 16))
    assert f.hit_tokens == f.bound_tokens > 0 and f.evictions == f.parks == 0
    assert f.resident_hits == sum(1 for h, _ in f.per_request if h) and f.host_hits == 0


def test_engine_replay_parks_and_wakes_under_pressure(tmp_path):
    """A small device tier parks snapshots into the host tier and later turns wake them; a host too
    small drops its coldest; hits never exceed the bound, and the tiers add up."""
    reqs = as_reqs(mooncake(tmp_path / "t.jsonl", n=60, block=64), 64)
    f = replay_engine(reqs, setup_for(16, 1200, host_tokens=1500, reach=1 << 16))
    assert f.parks > 0 and f.host_hits > 0 and f.host_evictions > 0
    assert f.hit_tokens == f.resident_hit_tokens + f.host_hit_tokens <= f.bound_tokens
    assert f.rejected == sum(1 for x in f.per_request if x is None)


# the command line


def test_cli_table_json_sweep_and_errors(tmp_path):
    from kern.cli import main

    mooncake(tmp_path / "t.jsonl", n=20)
    runner = CliRunner()
    r = runner.invoke(main, ["replay", str(tmp_path / "t.jsonl"), "--capacity", "20k,200k", "--host-tokens",
                             "10000", "--json", "--plot", str(tmp_path / "sweep.png")])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert [x["capacity"] for x in rows] == [20000, 200000] and rows[1]["hit_ratio"] >= rows[0]["hit_ratio"]
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    # piped (not a terminal): a plain progress line at each capacity and at the end, never silent until the table
    assert "replay: capacity 20,000 tokens (engine): 0/40 requests" in r.stderr, r.stderr
    assert "replay: capacity 200,000 tokens (engine): 20/40 requests" in r.stderr, r.stderr
    assert "replay: done: 40/40 requests" in r.stderr, r.stderr
    r = runner.invoke(main, ["replay", str(tmp_path / "t.jsonl"), "--policy", "lru", "--capacity", "1M"])
    assert r.exit_code == 0 and "infinite-cache bound" in r.stdout and "hit ratio" in r.stdout
    # the README's spelling: --host-tokens takes --capacity's suffixes
    r = runner.invoke(main, ["replay", str(tmp_path / "t.jsonl"), "--capacity", "20k", "--host-tokens", "10k", "--json"])
    assert r.exit_code == 0, r.output
    assert [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")][0]["host_tokens"] == 10000
    for args, message in ((["--capacity", "lots"], "capacities are token counts"),
                          (["--host-tokens", "6x"], "is not a token count"),
                          (["--host-gib", "1"], "needs --bytes-per-token"),
                          (["--policy", "lru", "--host-tokens", "5"], "device tier only")):
        r = runner.invoke(main, ["replay", str(tmp_path / "t.jsonl"), *args])
        assert r.exit_code == 2 and message in r.output, (args, r.output)
    r = runner.invoke(main, ["replay", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "cannot read the trace" in r.output


def test_out_holds_the_figures_and_the_plot_and_the_cwd_nothing(tmp_path, monkeypatch):
    from kern.cli import main

    mooncake(tmp_path / "t.jsonl", n=20)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    runner = CliRunner()
    # a sweep without --out or --plot writes nothing anywhere
    r = runner.invoke(main, ["replay", str(tmp_path / "t.jsonl"), "--capacity", "20k,200k", "--host-tokens", "10k"])
    assert r.exit_code == 0, r.output
    assert list(cwd.iterdir()) == [] and "--out DIR" in r.stderr
    r = runner.invoke(main, ["replay", str(tmp_path / "t.jsonl"), "--capacity", "20k,200k", "--host-tokens", "10k",
                             "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["t-engine.json", "t-engine.png"]
    assert (tmp_path / "out" / "t-engine.png").read_bytes()[:4] == b"\x89PNG"
    got = json.loads((tmp_path / "out" / "t-engine.json").read_text())
    assert [f["capacity"] for f in got["figures"]] == [20000, 200000] and got["known"] is None
    # the tiers the plot stacks add up to the hits
    assert all(f["resident_hit_tokens"] + f["host_hit_tokens"] == f["hit_tokens"] for f in got["figures"])
    r = runner.invoke(main, ["replay", str(tmp_path / "t.jsonl"), "--server", "http://127.0.0.1:9", "--out", "o"])
    assert r.exit_code == 2 and "--server" in r.output and list(cwd.iterdir()) == []


def test_the_plots_y_axis_starts_at_0_and_ends_above_everything():
    from replay.plot import y_top

    # the sweep: 0.3692..0.3704 drawn from 0 to 0.5, not from 0.3692 to 0.3704
    assert y_top([0.3692, 0.3704]) == 0.5
    assert y_top([0.651, 0.658]) == 0.7 and y_top([0.99]) == 1.0 and y_top([]) == 0.1


def test_known_traces_are_known_by_their_totals_only():
    from replay.mooncake import known

    assert known(12_031, 144_793_823).name == "Mooncake conversation trace"
    assert known(3_993, 61_194_628).paper[0] == (1_000_000, 0.146)
    assert known(3_000, 61_194_628) is None  # --limit: not the paper's trace


def test_lru_page_is_honoured_or_refused(tmp_path):
    from kern.cli import main

    # a partial block then the whole block: a page of 512 hits the whole (its key is cached), a
    # page of 256 only the half the first request held
    lines = [{"timestamp": 0, "input_length": 256, "output_length": 1, "hash_ids": [7]},
             {"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [7]}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    runner = CliRunner()

    def hits(*page):
        r = runner.invoke(main, ["replay", str(tmp_path / "t.jsonl"), "--policy", "lru", "--capacity", "1M",
                                 "--json", *page])
        assert r.exit_code == 0, r.output
        row = json.loads([x for x in r.stdout.splitlines() if x.startswith("{")][0])
        return row["page"], row["hit_tokens"]

    assert hits() == (512, 512) and hits("--page", "512") == (512, 512)
    assert hits("--page", "256") == (256, 256) and hits("--page", "16") == (16, 256)
    for bad in ("300", "1024"):
        r = runner.invoke(main, ["replay", str(tmp_path / "t.jsonl"), "--policy", "lru", "--page", bad])
        assert r.exit_code == 2 and f"--page {bad}" in r.output and "divide" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_lru_pages_of_a_block_reach_the_bound_without_pressure(tmp_path):
    lines = mooncake(tmp_path / "t.jsonl", n=30)
    reqs = as_reqs(lines, BLOCK)
    for page in (16, 128, 512):
        f = replay_lru(reqs, 10**9, page)
        assert f.page == page and f.hit_tokens == f.bound_tokens > 0


# the replay as a check of a real server


def test_replay_agrees_with_a_running_server(kern_server, tmp_path):
    """A scaled trace sent to `kern serve toy-paged` one request at a time: every request's hit and
    tier, and the hit, park and eviction counters, equal the model-free replay's at the server's
    sizes; and the trace reaches every path (resident and host hits, parks, host evictions)."""
    from kern.cli import main

    mooncake(tmp_path / "t.jsonl", n=36, seed=5)
    server = kern_server("toy-paged", "--capacity", "1024", "--host-gib", str(40 * 65536 / 2**30))
    r = CliRunner().invoke(main, ["replay", str(tmp_path / "t.jsonl"), "--server", server.url, "--target",
                                  "toy-paged", "--scale", "16", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads([x for x in r.stdout.splitlines() if x.startswith("{")][-1])
    assert got["agree"] and not got["differ"], got
    served = got["server"]
    assert served["resident_hits"] and served["host_hits"] and served["parks"] and served["host_evictions"], served
    # every answer ran to its output length: ignore_eos is honoured (without it, 16 of these stop early)
    assert got["ended_early"] == 0
    bad = httpx.post(f"{server.url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "ignore_eos": "yes"})
    assert bad.status_code == 400 and "ignore_eos" in bad.json()["error"]["message"]


def test_the_flags_object_holds_every_flag_with_its_default():
    """`kern replay` builds one `ReplayFlags` from its keywords: a flag it lacks would be a TypeError,
    a default that drifted from the flag's would replay a direct caller differently."""
    import dataclasses

    import click

    from replay.cli import replay_command
    from replay.flags import ReplayFlags

    fields = {f.name: f for f in dataclasses.fields(ReplayFlags)}
    params = {p.name: p for p in replay_command.params if p.expose_value}
    assert set(params) == set(fields)
    ctx = click.Context(replay_command)
    for name, p in params.items():
        if name != "trace":
            assert fields[name].default == p.process_value(ctx, p.get_default(ctx, call=True)), name

"""bench/pp_timeline.py: a stage's idle time is split by cause (waiting on another stage, the head
between steps, the client idle), never all counted as waiting; the command reads real log lines."""

from __future__ import annotations


from click.testing import CliRunner
from conftest import bench_module

pt = bench_module("pp_timeline")

M = 1000  # us per ms
# two stages, two items (ms): item 0 at stage 0 [0, 10) and stage 1 [10, 30); item 1 at 50..60, 60..70
ITEMS = [pt.Item(0, 0, 8, 0, 10 * M, "prefill"), pt.Item(1, 0, 8, 10 * M, 30 * M, "prefill"),
         pt.Item(0, 1, 1, 50 * M, 60 * M, "decode"), pt.Item(1, 1, 1, 60 * M, 70 * M, "decode")]
# request A runs 0..30, request B is admitted at 45 (the head schedules until 50)
REQS = [(0, 30 * M), (45 * M, 70 * M)]


def by_stage(rows):
    return {r["stage"]: r for r in rows}


def test_gaps_are_split_by_cause():
    flight = pt.in_flight(ITEMS)
    assert flight == [(0, 30 * M), (50 * M, 70 * M)]
    running = pt.merge([*flight, *REQS])
    s0 = [i for i in ITEMS if i.stage == 0]
    s1 = [i for i in ITEMS if i.stage == 1]
    # stage 0 idles 10..50: item 0 is at stage 1 until 30 (waiting), nothing runs 30..45 (the client
    # idle), request B is in but no item until 50 (the head between steps)
    assert pt.gaps(s0, flight, running) == [pt.Gap(10 * M, 50 * M, waiting=20 * M, between=5 * M, idle=15 * M)]
    # stage 1 idles 30..60: nothing 30..45, the head 45..50, item 1 at stage 0 50..60
    assert pt.gaps(s1, flight, running) == [pt.Gap(30 * M, 60 * M, waiting=10 * M, between=5 * M, idle=15 * M)]


def test_summary_does_not_count_client_idle_as_wait():
    rows, per_program, overall = pt.summarize(ITEMS, REQS)
    r = by_stage(rows)
    assert (r[0]["waiting_on_stages_ms"], r[0]["head_between_steps_ms"], r[0]["client_idle_ms"]) == (20.0, 5.0, 15.0)
    assert (r[1]["waiting_on_stages_ms"], r[1]["head_between_steps_ms"], r[1]["client_idle_ms"]) == (10.0, 5.0, 15.0)
    # busy share of the time a request was in flight: stage 1 busy 30 of (70 - 10 - 15)
    assert r[1]["busy_share_of_work"] == round(30 / 45, 3)
    assert {(p["stage"], p["program"]): p["items"] for p in per_program} == {
        (0, "decode"): 1, (0, "prefill"): 1, (1, "decode"): 1, (1, "prefill"): 1}
    # without request lines the empty time cannot be split: one column says both
    rows, _, _ = pt.summarize(ITEMS)
    assert by_stage(rows)[0]["empty_ms (client idle or head between steps)"] == 20.0


LOG = """\
2026-12-04T14:42:17.898Z DEBUG serve: admitted request=req-0 prompt=8 max_tokens=2
2026-12-04T14:42:17.902Z INFO serve: pp item stage=0 item=0 program=prefill rows=8 issued_us=1796395337898000 done_us=1796395337900000
2026-12-04T14:42:17.914Z INFO serve: pp item stage=1 item=0 program=prefill rows=8 issued_us=1796395337900000 done_us=1796395337905000
2026-12-04T14:42:17.906Z DEBUG serve: finished request=req-0 reason=length
2026-12-04T14:42:17.950Z DEBUG serve: admitted request=req-1 prompt=8 max_tokens=2
2026-12-04T14:42:17.952Z INFO serve: pp item stage=0 item=1 program=prefill rows=8 issued_us=1796395337952000 done_us=1796395337953000
2026-12-04T14:42:17.955Z INFO serve: pp item stage=1 item=1 program=prefill rows=8 issued_us=1796395337953000 done_us=1796395337955000
2026-12-04T14:42:17.956Z DEBUG serve: finished request=req-1 reason=length
"""


def test_the_command_reads_logs_and_draws(tmp_path):
    (tmp_path / "server.log").write_text(LOG)
    lines = LOG.splitlines()
    assert pt.requests(lines) == [(1796395337898000, 1796395337906000), (1796395337950000, 1796395337956000)]
    # stage 1 idles 905..953 ms: req-0 until 906 and req-1 from 950 with no item (the head, 3 ms),
    # stage 0 busy with item 1 952..953 (waiting, 1 ms), nothing at all 906..950 (the client, 44 ms)
    rows, _, _ = pt.summarize(pt.parse(lines), pt.requests(lines))
    r1 = by_stage(rows)[1]
    assert (r1["waiting_on_stages_ms"], r1["head_between_steps_ms"], r1["client_idle_ms"]) == (1.0, 3.0, 44.0)
    r = CliRunner().invoke(pt.main, [str(tmp_path / "server.log"), "--png", str(tmp_path / "t.png")])
    assert r.exit_code == 0, r.output
    assert "client_idle_ms" in r.output and "requests_seen=2" in r.output
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    r = CliRunner().invoke(pt.main, [str(tmp_path / "server.log"), "--window", "50,60", "--png", str(tmp_path / "w.png")])
    assert r.exit_code == 0 and "items=1 " in r.output, r.output
    r = CliRunner().invoke(pt.main, [str(tmp_path / "server.log"), "--window", "soon"])
    assert r.exit_code == 2 and "A,B" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(pt.main, ["--help"])
    assert r.exit_code == 0 and "client idle" in r.output

"""The abort check's verdict (e2e/scenarios/abort.py): a hang-up passes only as a real abort, the
request ended by abort on the server with fewer tokens made than its whole answer. Three chunks read
and a right next answer prove nothing by themselves: an answer that finished before the hang-up was
seen gives them too, and so does a server that never aborts (`--fault ignore-hang-up`, gated in
tests/test_e2e_driver.py). These cover a server that tells it only in its `finished` line (the Rust
kern), whose line may be missing."""

from __future__ import annotations

from e2e.scenarios.abort import CHUNKS, verdict


def test_an_abort_that_cut_the_answer_short_passes():
    assert verdict(CHUNKS, "abort", 5, 4000) == []
    assert verdict(CHUNKS, "abort", None, 4000) == []  # a server that does not tell how many: its reason is enough


def test_no_word_of_an_abort_fails():
    assert verdict(CHUNKS, None, None, 40) == [
        "nothing shows a server-side abort (no finished line names the request)"]


def test_an_answer_that_finished_before_the_hang_up_fails():
    assert verdict(CHUNKS, "stop", 40, 40) == ["ended by stop, not by abort"]
    assert verdict(CHUNKS, "length", 4000, 4000) == ["ended by length, not by abort"]


def test_an_abort_after_the_whole_answer_fails():
    assert verdict(CHUNKS, "abort", 40, 40) == [
        "generated 40 of its 40 tokens before the abort: nothing was cut short"]


def test_too_few_chunks_fails():
    assert verdict(CHUNKS - 1, "abort", 2, 40) == [f"read only {CHUNKS - 1} chunks"]


class _Oracle:
    exact = True

    def run(self, ids, steps, rows):
        return [7] * min(steps, 40)

    def near_tie(self, context, a, b, rows):
        return None


def test_a_server_that_tells_the_abort_only_in_its_log_is_judged_by_that_line():
    """The whole `run` on a server without /stats or vLLM's metrics (the Rust kern): the hung-up
    request's `finished` line is read (the branch a local name once shadowed, an UnboundLocalError)."""
    from types import SimpleNamespace as NS

    from e2e.client import Answer
    from e2e.results import Cold
    from e2e.scenarios import abort

    lines = [{"request": "req-9", "reason": "abort", "generated": 5}]
    log = NS(lines=lambda kind: lines if kind == "finished" else [])
    stats = NS(has_endpoint=False, read=lambda: {}, idle=lambda: {})
    client = NS(hang_up=lambda prompt, chunks, bound, ignore_eos: ("req-9", CHUNKS))
    live = NS(stats=stats, client=client, session=NS(log=log))
    answer = Answer([7] * 40, None, [1, 2], 0, "length", "req-10")
    got = []
    r = NS(need=lambda name: live, oracle=_Oracle(), rows=1, facts={"default": {}}, opts=NS(engine=NS(has=lambda c: False)),
           answer=lambda prompt: answer, got=lambda kind: Cold((answer,)),
           checks=NS(add=lambda name, ok, note, *rest: got.append((name, ok, note))))
    abort.run(r)
    assert got and got[0][0] == "abort" and got[0][1] is True, got
    assert "(abort, 5 of" in got[0][2], got

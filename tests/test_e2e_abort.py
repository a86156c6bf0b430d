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

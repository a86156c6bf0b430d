"""The `concurrent` check's reading of the server's log (e2e/scenarios/concurrent.py `_together`): a burst
that shared no step fails unless the log shows no two of its requests were ever in the server at once.

The property: two requests were in the server at once exactly when one was queued before the other
finished, each way round (millisecond stamps; a tie is not "at once"); a request missing from the log's
queued or finished lines leaves it untold (None), which the check takes as "at once" (it fails)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from e2e.client import Answer
from e2e.log import Log
from e2e.scenarios.concurrent import _together


def _live(tmp_path, events: list[tuple[str, str, str]]):
    path = tmp_path / "server.log"
    path.write_text("".join(f"2026-12-07T10:00:{t}Z DEBUG serve: {tag} request={rid} prompt=3\n"
                            for t, tag, rid in events))
    return SimpleNamespace(session=SimpleNamespace(log=Log(path)))


def _answers(*ids: str) -> list[Answer]:
    return [Answer([1], None, [2], 0, "length", rid) for rid in ids]


@pytest.mark.parametrize("events, want", [
    # a queued while b ran: in the server at once
    ([("00.000", "queued", "a"), ("00.010", "queued", "b"), ("00.020", "finished", "a"), ("00.030", "finished", "b")], True),
    # each finished before the next was queued: never at once
    ([("00.000", "queued", "a"), ("00.005", "finished", "a"), ("00.007", "queued", "b"), ("00.009", "finished", "b")], False),
    # b queued in the very millisecond a finished: a tie is not "at once"
    ([("00.000", "queued", "a"), ("00.005", "finished", "a"), ("00.005", "queued", "b"), ("00.009", "finished", "b")], False),
    # b's finish is missing: untold
    ([("00.000", "queued", "a"), ("00.005", "finished", "a"), ("00.007", "queued", "b")], None),
])
def test_two_requests_were_in_the_server_at_once_when_one_was_queued_before_the_other_finished(tmp_path, events, want):
    assert _together(_live(tmp_path, events), _answers("a", "b")) is want


def test_other_requests_in_the_log_do_not_count(tmp_path):
    """Only the burst's own requests are read: another request running beside one of them is not the
    burst running together."""
    events = [("00.000", "queued", "x"), ("00.001", "queued", "a"), ("00.002", "finished", "a"),
              ("00.003", "queued", "b"), ("00.004", "finished", "b"), ("00.009", "finished", "x")]
    assert _together(_live(tmp_path, events), _answers("a", "b")) is False

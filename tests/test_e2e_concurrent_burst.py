"""The concurrent check's burst is sent again while the server shows no step shared by two sequences
(`/stats` `batched_steps`), at most three times; a server without the counter is taken at its word."""

from types import SimpleNamespace

from e2e.client import Answer
from e2e.scenarios import concurrent


class Live:
    """A fake live server: each burst answers every prompt; `/stats` batched_steps grows by `grows[k]`
    after burst k."""

    def __init__(self, grows: list[int], has_endpoint: bool = True) -> None:
        self.grows, self.sent, self.batched = grows, 0, 5
        self.stats = SimpleNamespace(has_endpoint=has_endpoint, read=self._read)
        self.client = SimpleNamespace(run_all=self._run_all)

    def _run_all(self, calls):
        self.batched += self.grows[self.sent]
        self.sent += 1
        return [Answer([1, 2], None, [3], 0, "length", f"r{i}") for i in range(len(calls))]

    def _read(self):
        return {"batched_steps": self.batched}


def _run(live):
    return concurrent._burst(SimpleNamespace(m=2), live, {"batched_steps": 5})


def test_a_burst_that_shared_a_step_is_sent_once():
    live = Live([3, 0, 0])
    bursts, shared = _run(live)
    assert (live.sent, len(bursts), shared) == (1, 1, True)


def test_an_unshared_burst_is_sent_again_until_one_shares():
    live = Live([0, 0, 1])
    bursts, shared = _run(live)
    assert (live.sent, len(bursts), shared) == (3, 3, True)


def test_three_unshared_bursts_are_not_exercised():
    live = Live([0, 0, 0, 9])
    bursts, shared = _run(live)
    assert (live.sent, shared) == (concurrent.BURSTS, False)


def test_a_server_without_stats_is_sent_one_burst():
    live = Live([0, 0, 0], has_endpoint=False)
    bursts, shared = _run(live)
    assert (live.sent, shared) == (1, True)

"""Session recency (e2e/scenarios/recency.py): an entry grown in place while other sequences ran is as
recent as its last growth. It passes on the shipped pool (the short request B, untouched since before
the long ones last grew, is the one entry a one-page flood evicts) and fails against the catalogue's
mutant `grown-entry-keeps-its-recency` (a growth found by walking the tree keeps its first insert's
tick), which no serial session can see."""

from __future__ import annotations

import re

from test_e2e_configs import _killed
from test_e2e_driver import EXIT_PASS, checks, gate


def test_the_short_request_is_the_one_evicted_on_the_shipped_pool(tmp_path):
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "recency_after_growth")
    got = checks(reports["toy-paged"])["recency_after_growth"]
    assert code == EXIT_PASS and got["ok"] is True, got
    # the flood evicted exactly one entry, B's, whose sequence then misses entirely
    assert re.search(r": 1 evicted; B's sequence again hit 0 of \d+ tokens", got["note"]), got["note"]
    # A and C ran on more than a page past B's end: each grew after B's insert
    after = [int(x) for x in re.search(r"ended \[(\d+), (\d+)\] steps after B", got["note"]).groups()]
    assert min(after) > 16, got["note"]


def test_an_entry_grown_in_place_that_keeps_its_old_recency_fails():
    _killed("grown-entry-keeps-its-recency", "recency_after_growth")  # that check, failed, is what killed it

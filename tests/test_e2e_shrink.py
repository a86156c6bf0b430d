"""Shrinking a failing session to a small replayable case (e2e/case.py, `e2e --shrink`, `--replay-case`).

Properties: `ddmin` keeps failing and ends 1-minimal (for a failure that needs a hidden set of
requests, it finds exactly that set); a case survives its file; and end to end, a planted fault's
failure shrinks to a case of at most 3 requests that fails replayed with the fault and passes
without it. A replay holds a request with parameters to the documented rule (e2e/case_params.py):
a right answer passes and a missed stop string fails, whole or streamed, chat or not; so a
`params_*` failure shrinks too, to one request.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2e.case import PLAIN, Case, ddmin
from e2e.cli import main


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.data())
def test_ddmin_finds_exactly_the_requests_a_failure_needs(n, data):
    items = list(range(n))
    needed = set(data.draw(st.sets(st.sampled_from(items), min_size=1, max_size=min(n, 4))))
    calls = []

    def fails(xs):
        calls.append(len(xs))
        return needed <= set(xs)

    got = ddmin(items, fails)
    assert set(got) == needed and got == sorted(got)  # order kept
    assert len(calls) <= 4 * n * max(len(needed), 1) + 8


def test_a_case_survives_its_file_and_a_bad_file_is_named(tmp_path):
    c = Case("toy-paged", "drop", "policy_drop", ["--capacity", "384"],
             [{"kind": "request", "path": "/v1/completions", "body": {"prompt": [1, 2], "max_tokens": 3}},
              {"kind": "burst", "calls": [[[5], 2], ["hi", 4]]}], seed=3)
    p = tmp_path / "c.json"
    p.write_text(c.to_json())
    assert Case.load(p) == c and c.size() == (3, 5, 9)
    p.write_text(json.dumps({"target": "x"}))
    with pytest.raises(ValueError, match="not a case file"):
        Case.load(p)


def test_shrink_turns_a_faults_failure_into_a_case_of_at_most_three_requests(tmp_path, capsys):
    out = tmp_path / "results"
    argv = ["--out", str(out), "--backend", "cpu", "--max-tokens", "12", "--targets", "toy-paged",
            "--scenarios", "conc1_equals_run", "--server-flags", "--fault wrong-token", "--shrink"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 1
    cases = list((out / "toy-paged").glob("case_*.json"))
    assert len(cases) == 1, capsys.readouterr().out
    case = Case.load(cases[0])
    assert case.check == "conc1_equals_run" and 1 <= case.size()[0] <= 3, case
    assert "--fault" in case.flags and (out / "toy-paged" / f"test_{cases[0].stem}.py").is_file()
    with pytest.raises(SystemExit) as exc:  # the fault is in the case's flags: it still fails
        main(["--replay-case", str(cases[0]), "--out", str(tmp_path / "r1"), "--backend", "cpu"])
    assert exc.value.code == 1
    fixed = Case(**{**case.__dict__, "flags": [f for f in case.flags if f not in ("--fault", "wrong-token")]})
    p = tmp_path / "fixed.json"
    p.write_text(fixed.to_json())
    with pytest.raises(SystemExit) as exc:  # the same requests on a server without the bug pass
        main(["--replay-case", str(p), "--out", str(tmp_path / "r2"), "--backend", "cpu"])
    assert exc.value.code == 0



def test_shrink_drops_burst_calls_stop_strings_prompt_and_tokens_a_failure_does_not_need():
    """A synthetic failure (no server): it needs two calls at once whose prompts start with "a", and a
    request whose stop strings hold "cd"; everything else goes, and what is left cannot halve further."""
    from e2e.case import shrink

    def req(prompt, stop, m=16):
        return {"kind": "request", "path": "/v1/completions", "body": {"prompt": prompt, "max_tokens": m, "stop": stop}}

    burst = {"kind": "burst", "calls": [["bbbb", 8], ["aaaa", 8], ["cccc", 8], ["abab", 8], ["aa", 3]]}
    c = Case("toy-paged", "default", "concurrent", [], [req([1, 2, 3], ["zz"]), burst,
                                                        req([4, 5, 6, 7], ["q", "abcdef", "r"]), req([8], ["x"])])

    def fails(k: Case) -> bool:
        bursts = [q for q in k.requests if q["kind"] == "burst"]
        stops = [s for q in k.requests if q["kind"] == "request" for s in q["body"]["stop"]]
        return (any(sum(p.startswith("a") for p, _ in q["calls"]) >= 2 for q in bursts)
                and any("cd" in s for s in stops))

    lines = []
    small = shrink(c, fails, lines.append)
    assert fails(small) and len(small.requests) == 2, small.requests
    b, r = sorted(small.requests, key=lambda q: q["kind"])
    assert b["calls"] == [["a", 1], ["a", 1]]
    assert r["body"] == {"prompt": [4], "max_tokens": 1, "stop": ["abcdef"]}  # "abc" and "def" hold no "cd"
    assert all("shrink: try" in x for x in lines) and any("fewer calls in a burst" in x for x in lines)

# --- a replayed request with parameters, judged on its own (e2e/case_params.py) ----------------------

class FakeOracle:
    """A deterministic exact model: printable bytes, EOS after every `eos_every`-th token of the sequence."""

    exact = True
    eos_masked = None  # it cannot say what it emits with EOS masked (kern's rules refuse min_tokens anyway)

    def __init__(self, eos_every: int) -> None:
        self.eos_every = eos_every

    def run(self, ids, steps, rows=1):
        out = []
        while len(out) < steps:
            seq = list(ids) + out
            if self.eos_every and len(seq) % self.eos_every == 0 and seq[-1] != EOS:
                return out
            out.append((sum(seq) * 131 + len(seq) * 17) % 95 + 32)
        return out


EOS = 256


def response(want, served, chat, stream, split):
    """What a server sends for the answer `want` (an `Expected`), whole or as a stream of two chunks."""
    usage = {"prompt_tokens": len(served), "completion_tokens": len(want.token_ids)}
    if not stream:
        c = {"token_ids": want.token_ids, "finish_reason": want.finish, "stop_reason": want.stop_reason,
             "prompt_token_ids": list(served)}
        c.update({"message": {"content": want.text}} if chat else {"text": want.text})
        return {"choices": [c], "usage": usage}
    k, j = min(split, len(want.text)), min(split, len(want.token_ids))
    parts = [(want.text[:k], want.token_ids[:j], None, None),
             (want.text[k:], want.token_ids[j:], want.finish, want.stop_reason)]
    chunks = [{"choices": [{**({"delta": {"content": t}} if chat else {"text": t}), "token_ids": ids,
                            "finish_reason": f, "stop_reason": r}]} for t, ids, f, r in parts]
    chunks[0]["choices"][0]["prompt_token_ids"] = list(served)  # the server sends it in the first chunk
    return {"chunks": chunks, "done": True, "usage": usage}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(32, 126), min_size=1, max_size=30), st.integers(1, 40), st.sampled_from([0, 7, 23]),
       st.booleans(), st.booleans(), st.booleans(), st.booleans(), st.integers(0, 40), st.data())
def test_a_replay_holds_a_stop_requests_answer_to_the_rule_and_flags_a_missed_stop(prompt, m, eos_every, chat, stream,
                                                                                   include, echo, split, data):
    from e2e.case_params import judge
    from verdicts.params import continuation, expect, text_of

    oracle = FakeOracle(eos_every)
    emitted = continuation(oracle, 1, prompt, m, EOS, False)
    text = text_of(emitted)
    stops = []
    for _ in range(data.draw(st.integers(1, 3))):
        if text and data.draw(st.booleans()):
            n = data.draw(st.integers(1, min(12, len(text))))
            i = data.draw(st.integers(0, len(text) - n))
            stops.append(text[i:i + n])
        else:
            stops.append("\x00never")
    body = {"model": "t", "max_tokens": m, "temperature": 0, "return_token_ids": True, "stop": stops,
            "include_stop_str_in_output": include, "stream": stream, "echo": echo}
    body.update({"messages": [{"role": "user", "content": text_of(prompt)}]} if chat else {"prompt": prompt})
    if chat:
        body.pop("echo")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    lead = text_of(prompt) if echo and not chat else ""
    want = expect(emitted, m, EOS, stop=tuple(stops), include=include, echo=lead)
    assert judge(body, path, response(want, prompt, chat, stream, split), oracle, 1, EOS) is None
    missed = expect(emitted, m, EOS, include=include, echo=lead)  # the bug: the stop strings never matched
    problem = judge(body, path, response(missed, prompt, chat, stream, split), oracle, 1, EOS)
    assert (problem is None) == (missed == want), problem


def test_a_replay_wants_min_tokens_refused_by_name_and_leaves_an_unknown_body_unjudged():
    from e2e.case_params import judge, judged
    from e2e.client import Rejected

    body = {"model": "t", "prompt": [65, 66], "max_tokens": 4, "min_tokens": 1}
    oracle = FakeOracle(0)
    assert judge(body, "/v1/completions", Rejected(400, {"error": {"param": "min_tokens"}}), oracle, 1, EOS) is None
    assert "not 400 naming min_tokens" in judge(body, "/v1/completions", Rejected(400, {"error": {"param": "x"}}),
                                                oracle, 1, EOS)
    assert judge(body, "/v1/completions", {"choices": [{}]}, oracle, 1, EOS) == "served, not refused"
    assert not judged({"model": "t", "prompt": [65], "max_tokens": 4, "logprobs": 2})
    assert judged({"model": "t", "prompt": [65], "max_tokens": 4, "stop": ["x"], "truncate_prompt_tokens": 1})


def test_shrink_turns_a_params_failure_into_one_request_with_parameters(tmp_path):
    out = tmp_path / "results"
    argv = ["--out", str(out), "--backend", "cpu", "--max-tokens", "12", "--targets", "toy-paged",
            "--scenarios", "params_stop", "--server-flags", "--fault wrong-token", "--shrink"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 1
    (path,) = (out / "toy-paged").glob("case_*.json")
    case = Case.load(path)
    assert case.check == "params_stop" and case.size()[0] == 1, case
    (q,) = case.requests
    assert q["kind"] == "request" and set(q["body"]) - PLAIN, q  # a request with parameters, judged by the rule
    for key in ("stop", "stop_token_ids"):  # any one of them fails under this fault: one is left, and short
        assert len(q["body"].get(key) or [0]) == 1, q
    assert all(len(s) == 1 for s in q["body"].get("stop") or []), q
    fixed = Case(**{**case.__dict__, "flags": [f for f in case.flags if f not in ("--fault", "wrong-token")]})
    p = tmp_path / "fixed.json"
    p.write_text(fixed.to_json())
    with pytest.raises(SystemExit) as exc:  # the same request on a server without the fault passes
        main(["--replay-case", str(p), "--out", str(tmp_path / "r"), "--backend", "cpu"])
    assert exc.value.code == 0

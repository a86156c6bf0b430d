"""The policy oracle in the gate: every request of a serial phase is predicted and compared exactly.

A session's `PolicyGate` starts with the server (sized from `/stats` facts) and follows every request
the gate sends while the session is serial: `expect` predicts the request's `cached_tokens`, cache
tier and `kern.snapshot` from `verdicts.policy.Policy` (fed the answer's path by the reference's
`path`) and records any difference; `compare` holds the server's counters, gauges and parked
lengths to the policy's after a scenario. A concurrent phase ends the exact predictions (`stop`):
recency and counters then depend on timing. The gate's `policy_*` checks report what was recorded.

No prediction is made (the check says why, and is only reported) when the reference has no `path`,
the server has no `/stats` facts for the policy, or the policy meets a path it does not model.
"""

from __future__ import annotations

from typing import Any

from e2e.oracle_seam import Oracle
from verdicts.policy import POLICY_COUNTERS, Policy, Unmodelled

__all__ = ["PolicyGate", "GAUGES"]

GAUGES = ("pages_used", "snapshot_pages", "resident_entries", "parked_entries", "snapshot_slots", "host_used_bytes")
NEEDED = ("page", "pages", "seq_slots", "host_bytes", "page_bytes", "slot_bytes", "prefill_emits", "rows", "chunk",
          "checkpoints")


class PolicyGate:
    def __init__(self, reference: Oracle | None, facts: dict[str, Any] | None, lined: bool):
        self.reference = reference
        self.problems: list[str] = []
        self.requests = 0
        self.compared = 0
        self.policy: Policy | None = None
        self.why: str | None = None
        if reference is None or reference.path_of is None:
            self.why = "no reference with path()"
        elif not facts or any(k not in facts for k in NEEDED):
            self.why = "the server's /stats facts do not size the policy"
        else:
            self.policy = Policy(page=int(facts["page"]), pages=int(facts["pages"]),
                                 lined=facts["checkpoints"] == "at request end", emits=bool(facts["prefill_emits"]),
                                 rows=int(facts["rows"]), chunk=int(facts["chunk"]), slots=int(facts["seq_slots"]),
                                 host_bytes=int(facts["host_bytes"]), page_bytes=int(facts["page_bytes"]),
                                 slot_bytes=int(facts["slot_bytes"]))
        self.rows = int(facts.get("rows", 1)) if facts else 1

    @property
    def active(self) -> bool:
        return self.policy is not None

    def stop(self, why: str) -> None:
        """No more exact predictions in this session (a concurrent phase, an unmodelled path)."""
        if self.policy is not None:
            self.policy = None
            self.why = why

    def prefetch(self, ids: list[int], max_tokens: int) -> None:
        """Let the reference start on this request's path (and answer) while the server serves it."""
        if self.policy is not None and self.reference is not None:
            self.reference.prefetch(ids, max_tokens, self.rows, path=(self.rows, self.policy.emits))

    def expect(self, label: str, ids: list[int], max_tokens: int, answer, path: dict | None = None) -> None:
        """Predict the request and compare the answer's cached tokens, tier and snapshot; `path` when
        the caller knows the answer's path (one past EOS), else the reference's."""
        if self.policy is None:
            return
        if path is None:
            path = self.reference.path_of(ids, max_tokens, self.rows, self.policy.emits)
        if path is None:
            self.stop("the reference gave no path")
            return
        try:
            want = self.policy.serve(ids, max_tokens, path)
        except Unmodelled as exc:
            self.stop(f"request {self.requests + 1} ({label}): {exc}")
            return
        self.requests += 1
        got = (answer.cached, answer.tier, answer.snapshot or "none")
        exp = (want.cached, want.tier, want.snapshot)
        if got != exp:
            self.problems.append(f"{label} ({answer.request}): cached/tier/snapshot {got}, policy {exp}")
        elif answer.woken is not None and bool(answer.woken) != want.woken:
            self.problems.append(f"{label} ({answer.request}): woken {answer.woken}, policy {want.woken}")

    def rejected(self, ids: list[int]) -> None:
        """A request refused at admission still looked its prefix up (recency moves)."""
        if self.policy is not None:
            self.policy.lookup(ids)

    def compare(self, label: str, raw: dict[str, Any] | None) -> None:
        """The server's counters, gauges and parked lengths against the policy's, exactly."""
        if self.policy is None or raw is None:
            return
        p = self.policy
        got_c, got_g = raw.get("counters", {}), raw.get("gauges", {})
        diffs = [f"{k} {got_c.get(k)} (policy {p.counters[k]})" for k in POLICY_COUNTERS if got_c.get(k) != p.counters[k]]
        mine = p.gauges()
        diffs += [f"{k} {got_g.get(k)} (policy {mine[k]})" for k in GAUGES if got_g.get(k) != mine[k]]
        if sorted(raw.get("parked_lengths") or []) != p.parked_lengths():
            diffs.append(f"parked lengths {sorted(raw.get('parked_lengths') or [])} (policy {p.parked_lengths()})")
        self.compared += 1
        if diffs:
            self.problems.append(f"after {label}: " + ", ".join(diffs))

    def verdict(self) -> tuple[bool | None, str]:
        """(ok, note) for the session's policy check: None when nothing could be predicted."""
        if self.requests == 0 and not self.problems:
            return None, f"not predicted: {self.why}"
        note = f"{self.requests} requests and {self.compared} counter reads predicted exactly" if not self.problems \
            else f"{len(self.problems)} difference(s) over {self.requests} requests: " + "; ".join(self.problems[:6])
        if self.why and self.policy is None:
            note += f"; predictions stopped: {self.why}"
        return not self.problems, note

"""Pure judgment for the e2e gate: values in, verdicts out; no I/O, nothing of the project imported.

- `same`: `Same` (identity with at most `EXCUSED_MAX` near-tie excuses), `divergence`, `Oracle`.
- `ulp`: `ulp_of` (bf16 ULP), `near_tie` (the 4-ULP rule), `ulps_down`.
- `evidence`: `evidence` (the verdict text on one disputed token from a probe's logits, checked
  against the reference's when given), `probe_disagreement`.
- `hits`: `turn2_hit`.
- `acceptance`: `accept_rate`, `acceptance_holds`.
- `gate`: `oracle_gate`, `summarize` (and the `Report`/`Check` shape, the exit codes).
- `policy`: `Policy`, the policy oracle (hits, tiers, snapshots, counters of the cache policy).
- `params`: `expect` (what a completion with request parameters answers), `Expected`, `text_of`,
  `decoded_path` (the policy's path of an answer run past EOS), `RULES`/`Rules` (each engine's rules
  where engines differ), `held` (the text an incremental detokenizer shows).
"""

from .acceptance import BURST_SHARE, accept_rate, acceptance_holds
from .evidence import PROBE_AGREE_ULPS, evidence, probe_disagreement
from .gate import EXIT_FAIL, EXIT_NOTHING_RAN, EXIT_PASS, Check, Report, oracle_gate, summarize
from .hits import turn2_hit
from .params import RULES, Expected, Rules, continuation, decoded_path, expect, held, text_of
from .policy import POLICY_COUNTERS, Policy, Prediction, Unmodelled
from .same import EXCUSED_MAX, PROMPT_CHARS, Oracle, Same, divergence, prompt_text, served_text
from .ulp import NEAR_TIE_ULPS, near_tie, ulp_of, ulps_down

__all__ = [
    "BURST_SHARE",
    "Check",
    "EXCUSED_MAX",
    "EXIT_FAIL",
    "EXIT_NOTHING_RAN",
    "EXIT_PASS",
    "Expected",
    "NEAR_TIE_ULPS",
    "Oracle",
    "POLICY_COUNTERS",
    "PROBE_AGREE_ULPS",
    "PROMPT_CHARS",
    "Policy",
    "Prediction",
    "RULES",
    "Report",
    "Rules",
    "Same",
    "Unmodelled",
    "accept_rate",
    "acceptance_holds",
    "continuation",
    "decoded_path",
    "divergence",
    "evidence",
    "expect",
    "held",
    "near_tie",
    "oracle_gate",
    "probe_disagreement",
    "prompt_text",
    "served_text",
    "summarize",
    "text_of",
    "turn2_hit",
    "ulp_of",
    "ulps_down",
]

"""float_controls: the float verdict shown able to fail, on this build's own probe, in every gate run.

No server. A float target's answers are judged by `verdicts.evidence` on probes (`docs/checks.md`,
"The rule"); a correct server seldom diverges, so a verdict that excused everything would pass every
other check. On prompt 1's context (the prompt and the first tokens of the reference's answer, so
it is a real step) the gate takes the runtime's probe and the reference's logits, and asks the
verdict two questions whose answers are known:

- the reference's token against the byte token with the lowest logit (many ULPs below the top): a
  `confident flip`, never excused;
- any disputed pair, judged with the reference's logits moved 3 ULPs of the top (over the 2 a probe
  may sit from the reference): `no evidence`, never excused.

Both must come out as stated; a verdict that judged a near-tie on one token only, took another
dtype's ULP or skipped the probe's agreement with the reference fails this check.
"""

from __future__ import annotations

from e2e.prompts import PROMPTS
from verdicts import evidence
from verdicts.ulp import ulp_of

CONTEXT_TOKENS = 4  # answer tokens of prompt 1 after which the step is judged
SHIFT_ULPS = 3  # over evidence's PROBE_AGREE_ULPS (2): a reference this far off is no evidence


def applies(t) -> bool:
    return t.floats and not t.skipped and t.stages <= 1


def run(r) -> None:
    o = r.oracle
    prober, logits = o.prober, o.logits
    if logits is None or prober is None:
        r.checks.add("float_controls", None, f"no reference logits or probe (oracle: {o.kind})")
        return
    ids = list(PROMPTS[0].encode())
    context = ids + list(o.run(ids, CONTEXT_TOKENS, 1))[:CONTEXT_TOKENS]
    ref = logits(context)
    try:
        _, probe, _ = prober.probe(context)
    except Exception as exc:  # noqa: BLE001 - a probe that cannot run leaves the control unjudged
        r.checks.add("float_controls", None, f"the probe failed: {type(exc).__name__}: {exc}")
        return
    top = max(range(len(ref)), key=lambda v: (ref[v], -v))
    low = min(range(min(256, len(ref))), key=lambda v: (ref[v], v))
    problems = []
    flip = evidence(probe, low, top, ref)
    if not flip.startswith("confident flip"):
        problems.append(f"token {low} ({ref[low]:g}) against the top {top} ({ref[top]:g}) judged {flip[:120]!r}, "
                        "not a confident flip")
    unit = ulp_of(max(ref))
    moved = [x - SHIFT_ULPS * unit if v == top else x for v, x in enumerate(ref)]
    second = max((v for v in range(len(ref)) if v != top), key=lambda v: (ref[v], -v))
    off = evidence(probe, second, top, moved)
    if not off.startswith("no evidence"):
        problems.append(f"with the reference's top logit moved {SHIFT_ULPS} ULPs, {second} against {top} judged "
                        f"{off[:120]!r}, not 'no evidence'")
    note = (f"prompt 1 + {CONTEXT_TOKENS} tokens: {low} vs top {top}: {flip.split(':')[0]}; reference moved "
            f"{SHIFT_ULPS} ULPs: {off.split('(')[0].strip() or off[:40]}")
    r.checks.add("float_controls", not problems, note + "".join(f"; {p}" for p in problems))

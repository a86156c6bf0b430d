"""The stop strings the parameter-rule property tests draw (tests/test_verdicts_params.py against kern's
server, tests/test_vllm_params_rules.py against vLLM's code): some cut from the continuation's text, so
they match, some drawn freely, which mostly never do."""

from __future__ import annotations

from hypothesis import strategies as st


def stop_strings(draw, text: str, longest: int, other: int) -> list[str]:
    """0-3 strings: each either a piece of `text` (1 to `longest` characters) or any text of 1 to `other`."""
    stop = []
    for _ in range(draw(st.integers(0, 3))):
        if text and draw(st.booleans()):
            n = draw(st.integers(1, min(longest, len(text))))
            i = draw(st.integers(0, len(text) - n))
            stop.append(text[i:i + n])
        else:
            stop.append(draw(st.text(min_size=1, max_size=other)))
    return stop

"""`ulp_of` and the 4-ULP near-tie rule (reference/kern-e2e.md §2.2, §2.3)."""

from __future__ import annotations

import struct

import pytest

from verdicts import NEAR_TIE_ULPS, near_tie, ulp_of, ulps_down


@pytest.mark.parametrize(
    "x, ulp",
    [
        # reference §2.2
        pytest.param(0.25, 2**-9, id="quarter"),
        pytest.param(1.0, 2**-7, id="one"),
        pytest.param(20.0, 2**-3, id="twenty"),
        pytest.param(3e-5, 2**-23, id="tiny"),
        pytest.param(-6.0, 2**-5, id="negative"),
        # our own
        pytest.param(0.0, 2**-133, id="zero"),
        pytest.param(-0.0, 2**-133, id="negative-zero"),
        pytest.param(1.5, 2**-7, id="inside-binade"),
        pytest.param(2.0, 2**-6, id="binade-edge"),
        pytest.param(1.9999, 2**-7, id="below-binade-edge"),
        pytest.param(29.25, 2**-3, id="evidence-example"),
    ],
)
def test_ulp_of(x: float, ulp: float) -> None:
    assert ulp_of(x) == ulp


def _is_bf16(x: float) -> bool:
    """A float32 whose low 16 bits are zero is exactly a bf16."""
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    back: float = struct.unpack("<f", struct.pack("<I", bits))[0]
    return back == x and bits & 0xFFFF == 0


@pytest.mark.parametrize("x", [0.25, 1.0, 1.5, 20.0, 29.25, 6.0, 100.5, 3.0517578125e-05])
def test_ulp_is_the_bf16_step(x: float) -> None:
    # independent of frexp: one ULP up is the next bf16, half of one is not a bf16
    assert _is_bf16(x)
    assert _is_bf16(x + ulp_of(x))
    assert not _is_bf16(x + ulp_of(x) / 2)


@pytest.mark.parametrize(
    "top, logit, ulps",
    [
        pytest.param(29.25, 29.125, 1.0, id="one-down"),
        pytest.param(29.25, 29.25, 0.0, id="the-top"),
        pytest.param(29.25, 28.75, 4.0, id="four-down"),
        pytest.param(-6.0, -6.125, 4.0, id="negative-top"),
    ],
)
def test_ulps_down(top: float, logit: float, ulps: float) -> None:
    assert ulps_down(top, logit) == ulps


@pytest.mark.parametrize(
    "top, a, b, tie",
    [
        # the recorded evidence: top-4 29.25 / 29.125 / 29.125 / 28.75, server's token 2nd, 1 ULP down
        pytest.param(29.25, 29.125, 29.25, True, id="evidence-example"),
        pytest.param(29.25, 28.75, 28.75, True, id="both-at-four"),
        pytest.param(29.25, 28.625, 29.25, False, id="server-at-five"),
        pytest.param(29.25, 29.25, 28.625, False, id="oracle-at-five"),
        pytest.param(1.0, 1.0 - 4 * 2**-7, 1.0, True, id="scale-one-four"),
        pytest.param(1.0, 1.0 - 5 * 2**-7, 1.0, False, id="scale-one-five"),
        pytest.param(-6.0, -6.125, -6.0, True, id="negative-four"),
        pytest.param(-6.0, -6.15625, -6.0, False, id="negative-five"),
        pytest.param(0.0, -4 * 2**-133, 0.0, True, id="zero-top-four"),
        pytest.param(0.0, -5 * 2**-133, 0.0, False, id="zero-top-five"),
    ],
)
def test_near_tie(top: float, a: float, b: float, tie: bool) -> None:
    assert near_tie(top, a, b) is tie


def test_rule_is_four_ulps() -> None:
    assert NEAR_TIE_ULPS == 4

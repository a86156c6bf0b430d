"""The gate's oracle seam (e2e/oracle_seam.py): `Adapted` gives every member `Oracle` declares, over each
of the oracle package's classes; what `kern run` cannot do is its neutral (nothing to prefetch or close)
or None (no EOS, logits or path), and the reference's own members pass through."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.oracle_seam import Oracle
from e2e.oracles import Adapted
from oracle.cache import CommandRun
from oracle.reference import Reference

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "manifests" / "toy"
MODEL = ROOT / "toy" / "model.py"


def _members() -> set[str]:
    """What `Oracle` declares: its annotated attributes and its methods."""
    methods = {n for n, v in vars(Oracle).items() if callable(v) and not n.startswith("_")}
    return set(Oracle.__annotations__) | methods


def test_the_protocol_declares_what_the_gate_reads():
    assert _members() == {"kind", "exact", "available", "accept_pct", "eos", "prober", "logits", "path_of", "run",
                          "near_tie", "prefetch", "close", "eos_masked"}


@pytest.mark.parametrize("raw", [
    lambda: Reference(MODEL, TOY / "toy-stateful.json"),
    lambda: CommandRun(["kern"], "kern.toml", "toy-paged"),
])
def test_adapted_has_every_member_of_the_protocol(raw):
    o = Adapted(raw())
    missing = {n for n in _members() if not hasattr(o, n)}
    assert not missing, f"Adapted lacks {sorted(missing)}"


def test_the_reference_passes_through():
    ref = Reference(MODEL, TOY / "toy-stateful.json")
    o = Adapted(ref)
    assert (o.kind, o.exact, o.available, o.accept_pct) == ("reference", True, True, (40, 60))
    assert o.eos == ref.module.EOS and o.prober is None
    ids = list(b"hello")
    assert o.run(ids, 8, 1) == ref.run(ids, 8, 1)
    assert o.path_of is not None and o.path_of(ids, 4, 1, True) == ref.path_of(ids, 4, 1, True)
    assert o.logits is not None and o.near_tie(ids, 1, 2, 1) == ""
    o.prefetch(ids, 8, 1, path=(1, True))  # no worker: nothing to start, nothing raised
    o.close()


def test_kern_run_s_missing_members_are_neutral():
    o = Adapted(CommandRun(["kern"], "kern.toml", "toy-paged"))
    assert (o.kind, o.exact, o.accept_pct) == ("kern run (the --kern command)", False, None)
    assert o.eos is None and o.prober is None and o.logits is None and o.path_of is None
    assert o.near_tie([1, 2], 3, 4, 1) is None  # no evidence: the divergence stands
    assert o.prefetch([1, 2], 4, 1) is None and o.close() is None  # nothing run, nothing held

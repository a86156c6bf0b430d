"""Every implementation of `serve.device.Device` states every member of the protocol, each method with
a signature the core's calls fit: the single-process runtime, the pipeline head, the replay's plan-only
runtime, the step-level faults' wrapper and the test doubles. The core calls these members directly (no `getattr` probing), so a
member missing from any of them is an AttributeError waiting for the one server that reaches it."""

from __future__ import annotations

import inspect
import queue
from types import SimpleNamespace

import pytest

from serve.device import Device

DATA = sorted(Device.__annotations__)
METHODS = sorted(n for n, v in vars(Device).items() if inspect.isfunction(v) and not n.startswith("_"))


def problems(device) -> list[str]:
    """What `device` lacks of the protocol: a member missing, a method not callable, or one the core's
    call (as many positional arguments as the protocol's method takes) does not fit."""
    out = []
    for name in DATA:
        if not hasattr(device, name):
            out.append(f"{name}: missing")
    for name in METHODS:
        got = getattr(device, name, None)
        if got is None:
            out.append(f"{name}(): missing")
            continue
        if not callable(got):
            out.append(f"{name}: not callable")
            continue
        want = list(inspect.signature(getattr(Device, name)).parameters)[1:]  # less self
        try:
            inspect.signature(got).bind(*[None] * len(want))
        except TypeError as exc:
            out.append(f"{name}{inspect.signature(got)}: the core calls {name}({', '.join(want)}): {exc}")
    return out


def _runtime():
    from runtime.runtime import Runtime
    from tests.toyrun import target

    m, w = target("toy-stateful")
    return Runtime(m, w, pages=4, slots=2)


def _pipeline():
    from serve.pipeline.pipeline import Pipeline
    from tests.test_pipeline_head import FakeWork

    proto = SimpleNamespace(forwards=[], prefill_emits=True)
    watch = SimpleNamespace(inbox=queue.Queue(), silent=lambda: {}, interval=0.25)
    return Pipeline(FakeWork(), proto, None, watch, 2, 5.0, 100)


def _pyruntime():
    from tests.pyruntime import PyRuntime

    return PyRuntime(16, True, 4)


def _stage0():
    from tests.test_pipeline_head import FakeRuntime

    return FakeRuntime()


def _faulty():
    from serve.faults import STEP_FAULTS, FaultyDevice

    return FaultyDevice(_pyruntime(), STEP_FAULTS, {"requests": 0}, "prefill", 4)


def _replay():
    from serve.replay import _Runtime

    return _Runtime(True)


IMPLEMENTATIONS = {
    "runtime.runtime.Runtime": _runtime,
    "serve.pipeline.pipeline.Pipeline": _pipeline,
    "serve.replay._Runtime": _replay,
    "serve.faults.FaultyDevice": _faulty,
    "tests.pyruntime.PyRuntime": _pyruntime,
    "tests.test_pipeline_head.FakeRuntime": _stage0,
}


def test_the_protocol_names_what_the_core_drives():
    assert set(DATA) == {"protocol", "timing", "epoch", "broken", "while_waiting"}
    assert set(METHODS) == {"step", "logits", "copy", "park", "wake", "land", "zero_slot", "hold_partial", "trouble"}


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_every_device_has_every_member_with_a_compatible_signature(name):
    assert problems(IMPLEMENTATIONS[name]()) == []


def test_the_check_names_a_missing_member_and_a_call_that_does_not_fit():
    device = _pyruntime()
    del device.broken  # an attribute gone
    device.trouble = None  # a member that cannot be called
    device.land = lambda: None  # a method the core's land(remap) does not fit
    device.hold_partial = lambda wait_s: False  # one that needs an argument the core never passes
    got = problems(device)
    assert [p.split(":")[0].split("(")[0] for p in got] == ["broken", "hold_partial", "land", "trouble"], got

"""Every implementation of `serve.core.device.Device` states every member of the protocol, each method with
a signature the core's calls fit: the single-process runtime, the pipeline head, the replay's plan-only
runtime, the step-level faults' wrapper and the test doubles. The core calls these members directly (no `getattr` probing), so a
member missing from any of them is an AttributeError waiting for the one server that reaches it."""

from __future__ import annotations

import inspect
import queue
from types import SimpleNamespace

import pytest

from serve.core.device import Device, Losable

DATA = sorted(Device.__annotations__)
METHODS = sorted(n for n, v in vars(Device).items() if inspect.isfunction(v) and not n.startswith("_"))


def problems(device, proto=Device) -> list[str]:
    """What `device` lacks of the protocol `proto` (`Device`, or `Losable`: its own members and
    Device's): a member missing, a method not callable, or one the core's call (as many positional
    arguments as the protocol's method takes) does not fit."""
    out = []
    data = sorted({*DATA, *proto.__annotations__})
    methods = sorted({*METHODS, *(n for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_"))})
    for name in data:
        if not hasattr(device, name):
            out.append(f"{name}: missing")
    for name in methods:
        got = getattr(device, name, None)
        if got is None:
            out.append(f"{name}(): missing")
            continue
        if not callable(got):
            out.append(f"{name}: not callable")
            continue
        want = list(inspect.signature(getattr(proto, name)).parameters)[1:]  # less self
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
    from serve.core.faults import STEP_FAULTS, FaultyDevice

    return FaultyDevice(_pyruntime(), STEP_FAULTS, {"requests": 0}, "prefill", 4)


def _replay():
    from replay.run import _Runtime

    return _Runtime(True)


IMPLEMENTATIONS = {
    "runtime.runtime.Runtime": _runtime,
    "serve.pipeline.pipeline.Pipeline": _pipeline,
    "replay.run._Runtime": _replay,
    "serve.core.faults.FaultyDevice": _faulty,
    "tests.pyruntime.PyRuntime": _pyruntime,
    "tests.test_pipeline_head.FakeRuntime": _stage0,
}


def test_the_protocol_names_what_the_core_drives():
    assert set(DATA) == {"protocol", "timing", "epoch", "broken", "while_waiting"}
    assert set(METHODS) == {"step", "logits", "copy", "park", "wake", "land", "zero_slot", "hold_partial", "trouble"}


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_every_device_has_every_member_with_a_compatible_signature(name):
    assert problems(IMPLEMENTATIONS[name]()) == []


@pytest.mark.parametrize("make", [_pipeline, lambda: _faulty_over(_pipeline())], ids=["Pipeline", "FaultyDevice(Pipeline)"])
def test_a_device_that_can_lose_state_is_losable(make):
    """The scheduler takes a lost stage through `Losable` alone (it imports no pipeline module): the
    pipeline head, and the step faults' wrapper around it, carry every member."""
    device = make()
    assert device.broken is not None
    assert problems(device, Losable) == []


def _faulty_over(inner):
    from serve.core.faults import STEP_FAULTS, FaultyDevice

    return FaultyDevice(inner, STEP_FAULTS, {"requests": 0}, "prefill", 4)


def test_the_check_names_a_missing_member_and_a_call_that_does_not_fit():
    device = _pyruntime()
    del device.broken  # an attribute gone
    device.trouble = None  # a member that cannot be called
    device.land = lambda: None  # a method the core's land(remap) does not fit
    device.hold_partial = lambda wait_s: False  # one that needs an argument the core never passes
    got = problems(device)
    assert [p.split(":")[0].split("(")[0] for p in got] == ["broken", "hold_partial", "land", "trouble"], got


def test_the_scheduler_imports_no_pipeline_module():
    """It drives any `Device` and takes a loss through `Losable`: nothing of serve/pipeline/ in it."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parent.parent / "serve" / "core" / "scheduler.py").read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [n for n in names if n.startswith("serve.pipeline")], sorted(names)

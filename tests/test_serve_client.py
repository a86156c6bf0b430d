"""serve/client/seam.py: the front end / engine core seam. Both implementations (the scheduler thread in
process, `RemoteScheduler` for a core in another process) carry every member of `EngineClient`, and
the engine views the routes read (`Engine`, `RemoteEngine`) every member of `EngineView`; the
delivery enum says what each does with updates."""

from __future__ import annotations

import inspect

import pytest

from serve.client.frontend import RemoteEngine, RemoteScheduler
from serve.client.seam import Delivery, EngineClient, EngineView
from serve.core.engine import Engine
from serve.core.scheduler import Scheduler


def _members(proto) -> set[str]:
    names = {n for n in vars(proto) if not n.startswith("_")} | set(getattr(proto, "__annotations__", {}))
    return names - {"_is_protocol", "_is_runtime_protocol"}


@pytest.mark.parametrize("cls", [Scheduler, RemoteScheduler])
def test_both_engine_clients_carry_the_whole_seam(cls):
    """Each member of `EngineClient`: a method is a method (a coroutine where the protocol's is), an
    attribute is a class attribute, a property, or set in `__init__`."""
    init = inspect.getsource(cls.__init__)
    for name in _members(EngineClient):
        want = getattr(EngineClient, name, None)
        got = getattr(cls, name, None)
        if inspect.isfunction(want):
            assert inspect.isfunction(got), (cls.__name__, name)
            assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(want), (cls.__name__, name)
        else:
            assert name in vars(cls) or any(name in vars(b) for b in cls.__mro__) or f"self.{name}" in init, (cls.__name__, name)


def test_each_client_says_how_updates_arrive():
    assert Scheduler.delivery is Delivery.STEPS and not Delivery.STEPS.on_loop and not Delivery.STEPS.holds_whole
    assert RemoteScheduler.delivery is Delivery.HELD and Delivery.HELD.on_loop and Delivery.HELD.holds_whole


@pytest.mark.parametrize("cls", [Engine, RemoteEngine])
def test_both_engine_views_carry_what_the_routes_read(cls):
    src = inspect.getsource(cls)
    for name in _members(EngineView):
        assert hasattr(cls, name) or f"self.{name}" in src or f"self.{name}," in src or f".{name} =" in src, (cls.__name__, name)

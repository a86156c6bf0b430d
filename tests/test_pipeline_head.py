"""The head's Pipeline against a scripted last stage: plans ride the next item in the order made,
at most `stages` items are in flight, a cell's tokens wait for their own item's answer only when
read, and a partial prefill item is held only while the pipeline is full."""

from __future__ import annotations

import queue
from types import SimpleNamespace

from pool import Copies
from runtime.step import Cell
from serve.pipeline.pipeline import Pipeline
from serve.pipeline.transport import Message


class FakeRuntime:
    """Stage 0: records what ran on it, in order (a whole `serve.core.device.Device`)."""

    unit, reach, lined, host_page_bytes = 16, 1024, False, 100

    def __init__(self) -> None:
        self.log: list = []
        self.manifest = SimpleNamespace(buffers={})
        self.protocol = SimpleNamespace(prefill_emits=True, forwards=[])
        self.timing = None
        self.epoch = 0
        self.broken = None
        self.while_waiting = None

    def copy(self, c):
        self.log.append(("copy", c.pages))

    def park(self, c):
        self.log.append(("park", c.pages))

    def wake(self, c):
        self.log.append(("wake", c.pages))

    def land(self, remap):
        self.log.append(("land", list(remap.made)))

    def zero_slot(self, slot):
        self.log.append(("zero", slot))

    def step(self, program, cells, arrive=None, leave=None):
        self.log.append(("step", program))
        return [[] for _ in cells]

    def logits(self, groups):
        return None

    def hold_partial(self):
        return False

    def trouble(self):
        return None


class FakeWork:
    def __init__(self) -> None:
        self.runtime = FakeRuntime()

    def run(self, program, cells, arrays):
        self.runtime.step(program, cells)
        return {}


class Down:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, msg, to=None):
        self.sent.append(msg)


def _pipe(stages=3):
    proto = SimpleNamespace(forwards=[SimpleNamespace(program="prefill", emits="t"),
                                      SimpleNamespace(program="decode", emits="t")])
    watch = SimpleNamespace(inbox=queue.Queue())
    down = Down()
    return Pipeline(FakeWork(), proto, down, watch, stages, 5.0, 100), watch, down


def _answer(watch, item, tokens):
    watch.inbox.put(Message("done", {"item": item, "tokens": tokens}))


def test_plans_ride_the_next_item_and_run_here_at_once():
    p, _, down = _pipe()
    p.copy(Copies([(1, 2)], None))
    p.park(Copies([(3, 7)], None))  # host page 7 is byte 700 here (host page of 100 bytes)
    p.step("prefill", [Cell([1], None, [5, 6], 0)])
    assert p.local.log == [("copy", [(1, 2)]), ("park", [(3, 700)]), ("step", "prefill")]
    assert down.sent[0].head["plans"] == [["copy", [[1, 2]], None], ["park", [[3, 7]], None]]
    p.step("prefill", [Cell([1], None, [7], 2)])
    assert down.sent[1].head["plans"] == [] and [m.head["item"] for m in down.sent] == [0, 1]


def test_every_plan_method_is_replayed_by_name_on_the_stages():
    """Each of the Device's plan methods called on the head runs on stage 0 at once and travels as its
    own name: a stage replaying the item's plans (serve/pipeline/work.py) makes the same calls, in order."""
    from serve.core.device import Device
    from serve.pipeline.work import PLANS, apply_plans

    p, _, down = _pipe()
    calls = {"copy": Copies([(1, 2)], (3, 4)), "park": Copies([(5, 6)], None), "wake": Copies([(6, 7)], None),
             "land": SimpleNamespace(made=[("page", 9), ("slot", 1)]), "zero_slot": 2}
    assert set(calls) == set(PLANS) <= set(vars(Device)), "a plan method the Device does not name"
    for method, arg in calls.items():
        getattr(p, method)(arg)
    p.step("prefill", [Cell([1], None, [5], 0)])
    stage = FakeRuntime()
    apply_plans(stage, p.host_page_bytes, down.sent[0].head["plans"])
    assert [m for m, *_ in down.sent[0].head["plans"]] == list(calls)
    assert stage.log == p.local.log[:-1] == [("copy", [(1, 2)]), ("park", [(5, 600)]), ("wake", [(600, 7)]),
                                             ("land", [("page", 9), ("slot", 1)]), ("zero", 2)]


def test_tokens_wait_for_their_own_item_and_in_flight_is_bounded():
    p, watch, _ = _pipe(stages=2)
    a = p.step("prefill", [Cell([1], None, [1, 2], 0)])[0]
    b = p.step("prefill", [Cell([2], None, [3], 0)])[0]
    assert list(p.in_flight) == [0, 1]
    _answer(watch, 0, [[11]])
    _answer(watch, 1, [[22]])
    c = p.step("decode", [Cell([1], None, [9], 2)])[0]  # a third item: the oldest answer is taken first
    assert list(p.in_flight) == [1, 2]
    assert b == [22] and list(p.in_flight) == [2]  # reading b waited for item 1 only
    assert a == [11]
    _answer(watch, 2, [[33]])
    assert c[:1] == [33] and not p.in_flight


def test_a_partial_item_is_held_only_while_the_pipeline_is_full():
    p, watch, _ = _pipe(stages=2)
    assert not p.hold_partial()
    p.step("prefill", [Cell([1], None, [1], 0)])
    assert not p.hold_partial()
    p.step("prefill", [Cell([2], None, [1], 0)])
    assert p.hold_partial(wait_s=0.01)  # full, nothing answered
    assert list(p.in_flight) == [0, 1]
    _answer(watch, 0, [[5]])
    assert not p.hold_partial()  # the answer in hand frees a place
    assert list(p.in_flight) == [1]


def test_losses_count_stages_lost_not_restarts():
    """/stats' pipeline.losses (issue 41): two stages lost before one take are two losses (one epoch,
    one restart); an unanswered item with no stage named is one; a named stage explains it."""
    p, _, _ = _pipe(stages=3)
    p.lose(1, "killed")
    p.lose(2, "killed")
    assert set(p.take_loss()) == {1, 2}
    assert (p.losses, p.epoch) == (2, 1)
    p.lose(None, "an item unanswered")
    p.take_loss()
    assert (p.losses, p.epoch) == (3, 2)
    p.lose(None, "an item unanswered")
    p.lose(2, "silent")
    assert set(p.take_loss()) == {2}
    assert (p.losses, p.epoch) == (4, 3)

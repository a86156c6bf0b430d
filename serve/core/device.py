"""`Device`: everything the serving core drives on `engine.runtime`, named once.

The single-process runtime (`runtime/runtime.py`), the pipeline head (`serve/pipeline/pipeline.py`),
the fault wrapper (`serve/core/faults.py`), the replay's plan-only runtime (`replay/run.py`) and every test
double implement it. The protocol is structural: `runtime` imports nothing of `serve`, it only has
these members. Each implementation states every member, with a plain default where it has nothing
to say (a runtime that cannot lose a stage has `broken` None, `trouble()` None, `epoch` 0), so the core
calls them directly and never probes with `getattr`. `tests/test_device.py` holds every
implementation to this list, member by member and signature by signature.

    step(program, cells)   run one program (a prefill chunk, a decode step or a round) over the cells;
                           returns each cell's emitted tokens, in the cells' order (a list per cell,
                           empty where the program emits none; a pipeline's fill in when its item
                           comes back)
    logits(groups)         the last step's logits (bf16 bits, a row per group), or None
    copy / park / wake     carry out the pool's copy plans: device to device, to host, from host
    land(remap)            carry out a pool remap (zero what it made)
    zero_slot(slot)        a fresh sequence's line
    hold_partial()         whether a partial prefill call should wait (a pipeline full of items)
    trouble()              what /health says of the device: None when it is whole

Several decode steps a launch (runtime/multistep.py) are the single-process runtime's alone: `steps` (which
the fault wrapper also has, taking them one at a time), and `launch_steps` and `collect` (which it has
not: binding a step fault turns the core's `overlap` off). The core calls them only where its engine
says `decode_steps` > 1 (and `overlap`), which `serve.core.engine.build` says of that runtime alone.

`Losable` is a `Device` that can lose state (the pipeline head, `serve/pipeline/pipeline.py`: a
stage process lost): what the scheduler takes a loss with, so it imports no pipeline module. A device
whose `broken` is not None is one; a call into it after a loss raises `StageLost`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Protocol

from kern.errors import KernError
from runtime.protocol import Protocol as Programs
from runtime.step import Cell

if TYPE_CHECKING:
    import numpy as np

    from runtime.runtime import StepTiming

__all__ = ["Device", "Losable", "StageLost"]


class StageLost(KernError, RuntimeError):
    """The device lost state (a pipeline stage): the step that raised it, and every item in flight, are void."""


class Device(Protocol):
    protocol: Programs  # the manifest's programs as a serving loop drives them (what emits, chunk, forwards)
    timing: StepTiming | None  # where step time goes (with `as_dict()`), or None: kept nowhere
    epoch: int  # bumped each time the device lost state (a pipeline stage); 0 for one that cannot
    broken: threading.Event | None  # set on a loss not taken yet; None: this device cannot lose state
    while_waiting: Callable[[], None] | None  # called while a step waits on something else (the scheduler's queries)

    def step(self, program: str, cells: list[Cell]) -> list[list[int]]: ...

    def logits(self, groups: int) -> np.ndarray | None: ...

    def copy(self, copies) -> None: ...

    def park(self, copies) -> None: ...

    def wake(self, copies) -> None: ...

    def land(self, remap) -> None: ...

    def zero_slot(self, slot: int) -> None: ...

    def hold_partial(self) -> bool: ...

    def trouble(self) -> dict | None: ...


class Losable(Device, Protocol):
    """A `Device` that can lose state, and what the scheduler takes the loss with."""

    whole: threading.Event  # set while every part is up (cleared from a loss until its restart)
    restarter: Callable[[list], str | None] | None  # stages -> None, or why not; None: a loss cannot be
    # restarted (the scheduler gives up)
    failed: str | None  # why a restart failed: the scheduler gives up

    def take_loss(self) -> dict[int | None, str]:
        """The losses since the last take (stage -> why; None: which one is unknown), and a new epoch."""

    def begin_restart(self, stages: list) -> None:
        """Restart `stages` (None in it: all of them); `whole` is set when all are back."""

    def lost_stages(self) -> list[int]:
        """The stages lost and not restarted, in order."""

    def die(self, reason: str, answered: int) -> None:
        """Give up: one clear line, and the process ends with the pipeline's exit code."""

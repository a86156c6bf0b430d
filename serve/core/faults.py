"""Deliberate misbehaviour, so each gate can be shown to catch it (`kern serve --fault NAME`).

The faults live here and only here: the serving code has no branch on a fault's name. They are bound
once, at start, by `Faults.bind(core)` (the scheduler calls it on the core it serves with):

- the step-level faults wrap the core's device in a `FaultyDevice` (a `serve.core.device.Device` around the
  real one) that sleeps, raises or spoils tokens around each step;
- the pool- and admission-level faults replace one named hook point of the core or its admission, each
  of which does the correct thing by default (`Core.abort`, `Core.release_aborted`, `Core.retire`,
  `Core.tell`, `Admission.checkpoint`, `Admission.on_remapping`, `Admission.too_long`, `Admission.lookup`,
  `Admission.restore`, `Admission.restore_copy`, `Admission.parker`);
- the HTTP side asks `Faults.request_limit(engine)` and `Faults.tells_tier` (bound when the flags are
  read) what limit to validate against and whether a reply tells its tier.
"""

from __future__ import annotations

import time

from kern.tokens import EOS
from pool import Denied, Tier
from runtime.step import Cell

__all__ = ["FAULTS", "Faults", "FaultyDevice", "runner_up"]

SLOW_STEP_S = 0.02  # the slow-steps fault's extra time per step
WEDGE_S = 600.0  # the wedge-step fault's step (bounded, so a hosted server's thread ends some day)
LONG_STEP_S = 12.0  # the long-first-step fault's extra time, once: longer than the watch's first poll and STILL_S together
STALL_AT = 12  # the stall-until-loss fault: steps after the first request when the head stalls (e2e's stage_loss KILL_AT)
STALL_S = 120.0  # the stall-until-loss fault's longest stall: past it, the step goes on (nothing was lost)

FAULTS = {
    "wrong-token": "one answer token off (the first non-stop token of every answer, xor 1)",
    "no-checkpoint": "never insert snapshots",
    "no-park": "drop evicted snapshots instead of parking them",
    "drop-wake": "ignore parked hits",
    "leak-lease": "never return an aborted request's lease",
    "ignore-hang-up": "a client that hangs up is never aborted: its request runs to its end (all of max_tokens "
                      "with ignore_eos), its tokens thrown away; a drain's cut-off and a stop still abort",
    "keep-overshoot": "keep snapshots a speculative round overshot (under the answer's key)",
    "raise-in-scheduler": "the scheduler thread raises after its first step",
    "wrong-token-batched": "in a decode step or round that batches more than one sequence, every sequence "
                           "but the first gets its first emitted token off (xor 1; fed back as its anchor): "
                           "sequences in a batch disturb each other, one at a time they answer right",
    "reject-drafts": "take only row 0 of every speculative round (count treated as 1): paged answers stay "
                     "right, accepted rows (and the acceptance rate) drop to 0",
    "no-remap": "never land the pool's remap plans: Remapping is handled as Busy (evict, else wait for a "
                "lease to end), so line slots never grow; the plan stays pending, unlanded, and requests "
                "are seated from slots that snapshots and finished leases give back",
    "skip-restore-copy": "a resident prefix hit restores into the lease without executing the copy plan "
                         "(the partial page and the line are never copied)",
    "flip-near-ties": "float targets: in every decode step, a sequence whose runner-up byte token sits within "
                      "4 bf16 ULPs of its top logit takes the runner-up (fed back as its anchor): each such "
                      "token is a near-tie the gate may excuse, but more than 3 in one answer is not",
    "slow-steps": "every step takes 20 ms more (a slow device; answers unchanged): lets a test catch a gate "
                  "or a server mid-run however fast the kernels are",
    "untold-tier": "the response's kern object leaves out cache_tier (a server that tells a request's tier only "
                   "in its log): the gate must fail it, whatever the server logs",
    "pad-in-limit": "the one-sequence limit counts the pad's page: a request whose room is the whole pool "
                    "passes validation and then waits for room forever, neither rejected nor seated",
    "wedge-step": "the scheduler's first step after its second request never returns (it sleeps in it for "
                  "WEDGE_S, 600 s): /stats stops answering while /stats/live says a step is in progress",
    "hit-unheld": "a lease restored from a resident hit while another request runs does not count as a holder "
                  "of the whole pages it shares (their count one short, vLLM's free-while-referenced class; paged "
                  "pages): the pages go back to the free list while a request or the "
                  "cache still reads them, and a later allocation overwrites them",
    "long-first-step": "the first step a request makes takes LONG_STEP_S (12 s) more, answers unchanged (numba "
                       "compiling on first use, a loaded box): legitimate slowness the gate must not call a hang",
    "foreign-parent": "paged targets: a resident prefix hit of two pages or more is served from pages after the "
                      "first that were written after another first block (the same tokens at the same positions; "
                      "a block cache whose key ignores the block's parent): invisible on toy-paged, whose slots "
                      "depend on token and position alone; toy-attn and toy-layers answer wrong",
    "stall-until-loss": "pipeline targets: once, STALL_AT (12) steps after the first request, unless a stage was "
                        "lost before, the head's next step waits until a stage is lost (at most STALL_S, 120 s), "
                        "answers unchanged (a stage hung mid-load until someone kills it): a gate's kill lands "
                        "mid-answer however starved it is",
}


def runner_up(bits, ulps: int = 4) -> int | None:
    """The runner-up byte token of one row of bf16 logit bits when it is within `ulps` bf16 ULPs
    of the top (EOS, the last logit, is left alone); else None."""
    import math

    import numpy as np

    vals = (np.asarray(bits[:-1], np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    order = np.argsort(-vals, kind="stable")
    top, second = float(vals[order[0]]), float(vals[order[1]])
    unit = 2.0 ** (math.frexp(abs(top))[1] - 8) if top else 2.0**-133
    return int(order[1]) if (top - second) / unit <= ulps else None


class Faults:
    """The faults asked for (validated against FAULTS) and what they bind: `bind(core)` once at start,
    and for the HTTP side `request_limit(engine)` and `tells_tier`."""

    def __init__(self, names=()) -> None:
        unknown = sorted(set(names) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
        self.names = frozenset(names)
        self.tells_tier = "untold-tier" not in self.names  # a reply tells its request's cache tier
        self._pad_in_limit = "pad-in-limit" in self.names

    def request_limit(self, engine) -> int:
        """The one-sequence limit a request is validated against: the pool's (pad-in-limit: the whole
        pool's tokens, the pad's page counted in)."""
        return engine.pages * engine.unit if self._pad_in_limit else engine.max_request_tokens

    def bind(self, core):
        """Bind the faults to `core` (once, before it serves): the step-level ones wrap its device, the
        others replace their hook point. Returns the core."""
        steps = [n for n in STEP_FAULTS if n in self.names]
        if steps:
            core.device = FaultyDevice(core.device, steps, core.counters, core.prefill_program, core.engine.rows)
            core.overlap = False  # its steps run one at a time, each returning its tokens
        for name in HOOK_FAULTS:  # in this order: no-checkpoint's retire replaces keep-overshoot's
            if name in self.names:
                HOOK_FAULTS[name](core)
        return core

    def __repr__(self) -> str:
        return f"Faults({sorted(self.names)})"


# -- the step-level faults: a Device around the real one ------------------------------------------


class FaultyDevice:
    """A `serve.core.device.Device` that misbehaves as the step-level faults say, around the real one: each
    fault runs before the real step, or after it over the tokens it returned (one list per cell)."""

    def __init__(self, inner, names, counters, prefill_program: str, rows: int) -> None:
        self.inner = inner
        # the real device's own objects, which it never replaces (its epoch and while_waiting: below)
        self.protocol, self.timing, self.broken = inner.protocol, inner.timing, inner.broken
        self.names = tuple(names)
        self.counters = counters  # the core's: the request count some faults wait for
        self.prefill_program = prefill_program
        self.rows = rows
        self.stepped = 0  # steps taken (not `steps`: that is the several-steps method)
        self.long_done = False
        self.first_request_step: int | None = None  # stall-until-loss: `stepped` when the first request was seen
        self.stalled = False
        self._before = [BEFORE[n] for n in BEFORE if n in names]
        self._after = [AFTER[n] for n in AFTER if n in names]

    def step(self, program: str, cells: list) -> list:
        for fault in self._before:
            fault(self)
        tokens = self.inner.step(program, cells)
        self.stepped += 1
        for fault in self._after:
            tokens = fault(self, program != self.prefill_program, tokens) or tokens
        return tokens

    def steps(self, program: str, cells: list, k: int, limits: list) -> list:
        """Several decode steps taken one at a time through `step`, so each step's faults apply (each
        step feeds a cell its last token; a cell past its limit sits the rest out)."""
        out: list[list[int]] = [[] for _ in cells]
        for j in range(k):
            live = [g for g in range(len(cells)) if j < limits[g] and (j == 0 or out[g])]
            step = [Cell(cells[g].pages, cells[g].slot, [out[g][-1]] if j else cells[g].ids, cells[g].pos + j)
                    for g in live]
            for g, toks in zip(live, self.step(program, step)):
                out[g] += toks[:1]
        return out

    # the rest of the Device: the real one's
    @property
    def epoch(self) -> int:
        return self.inner.epoch

    @property
    def losses(self) -> int:
        return self.inner.losses

    @property
    def while_waiting(self):
        return self.inner.while_waiting

    @while_waiting.setter
    def while_waiting(self, fn) -> None:
        self.inner.while_waiting = fn

    def logits(self, groups: int):
        return self.inner.logits(groups)

    def copy(self, copies) -> None:
        self.inner.copy(copies)

    def park(self, copies) -> None:
        self.inner.park(copies)

    def wake(self, copies) -> None:
        self.inner.wake(copies)

    def land(self, remap) -> None:
        self.inner.land(remap)

    def zero_slot(self, slot: int) -> None:
        self.inner.zero_slot(slot)

    def hold_partial(self) -> bool:
        return self.inner.hold_partial()

    # a `serve.core.device.Losable` (the inner one can lose state: `broken` is not None): the real one's
    @property
    def whole(self):
        return self.inner.whole

    @property
    def restarter(self):
        return self.inner.restarter

    @property
    def failed(self) -> str | None:
        return self.inner.failed

    def take_loss(self) -> dict:
        return self.inner.take_loss()

    def begin_restart(self, stages: list) -> None:
        self.inner.begin_restart(stages)

    def lost_stages(self) -> list[int]:
        return self.inner.lost_stages()

    def die(self, reason: str, answered: int) -> None:
        self.inner.die(reason, answered)

    def trouble(self) -> dict | None:
        return self.inner.trouble()


def _wedge_step(dev: FaultyDevice) -> None:
    if dev.counters["requests"] >= 2:
        time.sleep(WEDGE_S)  # the bug this fault stands for: a step that never returns


def _long_first_step(dev: FaultyDevice) -> None:
    if dev.counters["requests"] >= 1 and not dev.long_done:
        dev.long_done = True
        time.sleep(LONG_STEP_S)  # not a bug: a first-use compile, a loaded box


def _stall_until_loss(dev: FaultyDevice) -> None:
    if dev.broken is None or dev.stalled or not dev.counters["requests"]:
        return
    if dev.losses:  # a stage was lost before the stall point (a gate's kill needs no stall): none after
        dev.stalled = True
        return
    if dev.first_request_step is None:
        dev.first_request_step = dev.stepped
    if dev.stepped - dev.first_request_step >= STALL_AT:
        dev.stalled = True
        dev.broken.wait(STALL_S)  # not a bug: a stage hung until it is killed (the loss is then taken as always)


def _slow_steps(dev: FaultyDevice, forward: bool, tokens: list) -> None:
    time.sleep(SLOW_STEP_S)


def _raise_in_scheduler(dev: FaultyDevice, forward: bool, tokens: list) -> None:
    if dev.stepped > 1:
        raise RuntimeError("fault injected: raise-in-scheduler")


def _flip_near_ties(dev: FaultyDevice, forward: bool, tokens: list) -> None:
    # the bug this fault stands for: a kernel whose order of addition moves logits by more than a
    # near-tie's width, on every step
    if not forward or dev.rows != 1:
        return
    logits = dev.inner.logits(len(tokens))
    for g, toks in enumerate(tokens):
        alt = runner_up(logits[g]) if logits is not None else None
        if alt is not None and toks and toks[0] != EOS:
            toks[0] = alt


def _wrong_token_batched(dev: FaultyDevice, forward: bool, tokens: list) -> None:
    # the bug this fault stands for: a batch's rows bound wrongly, so every sequence but the first
    # gets its neighbour's row; here its first token off
    if forward and len(tokens) > 1:
        for toks in tokens[1:]:
            if toks and toks[0] != EOS:
                toks[0] ^= 1


def _reject_drafts(dev: FaultyDevice, forward: bool, tokens: list) -> list | None:
    if forward and dev.rows > 1:
        return [toks[:1] for toks in tokens]  # count treated as 1: the drafted rows are thrown away
    return None


BEFORE = {"wedge-step": _wedge_step, "long-first-step": _long_first_step, "stall-until-loss": _stall_until_loss}
AFTER = {"slow-steps": _slow_steps, "raise-in-scheduler": _raise_in_scheduler, "flip-near-ties": _flip_near_ties,
         "wrong-token-batched": _wrong_token_batched, "reject-drafts": _reject_drafts}
STEP_FAULTS = (*BEFORE, *AFTER)


# -- the pool- and admission-level faults: each replaces one hook point -----------------------------


def _leak_lease(core) -> None:
    leaked: list = []
    core.release_aborted = leaked.append  # an aborted request's lease is held for ever


def _ignore_hang_up(core) -> None:
    abort = core.abort

    def only_cut_offs(req, error=None) -> None:
        if error is not None or core.stopping:  # a drain's cut-off, a lost stage, a stop: aborted all the same
            abort(req, error)
        # the bug this fault stands for: the hang-up never reaches the core, the request runs on

    core.abort = only_cut_offs


def _keep_overshoot(core) -> None:
    keep = core.retire

    def retire(req, lease, known: int, kept: bool) -> str:
        if kept:
            return keep(req, lease, known, kept)
        # the bug this fault stands for: the answer's key over a state that folded more
        n = known + (req.reason == "stop")
        core.engine.prefix.insert((req.ids + req.out)[:n], core.engine.pool.retire(lease, n))
        return "kept"

    core.retire = retire


def _no_checkpoint(core) -> None:
    def retire(req, lease, known: int, kept: bool) -> str:
        lease.release()  # nothing inserted, nothing counted
        return "kept" if kept else "not kept"

    core.retire = retire
    core.admission.checkpoint = lambda req, full: None


def _wrong_token(core) -> None:
    tell, spoiled = core.tell, set()

    def spoil(req, update) -> None:
        if req.id not in spoiled:
            for i, t in enumerate(update.tokens):
                if t != EOS:
                    update.tokens[i] = t ^ 1
                    spoiled.add(req.id)
                    break
        tell(req, update)

    core.tell = spoil


def _no_park(core) -> None:
    core.admission.parker = lambda: None  # evicted snapshots are dropped


def _drop_wake(core) -> None:
    adm = core.admission
    lookup = adm.lookup

    def no_host_hits(ids):
        hit = lookup(ids)
        if hit is not None and hit.tier is Tier.HOST:
            hit.release()
            return None
        return hit

    adm.lookup = no_host_hits


def _hit_unheld(core) -> None:
    adm = core.admission
    restore, pool = adm.restore, core.engine.pool

    def unheld(hit, room: int):
        got = restore(hit, room)
        node = got[0].shared_node if isinstance(got, tuple) else None
        if node is not None and node.refs > 1 and pool.leases > 2:  # the pad, this lease and another request's
            node.refs -= 1  # the bug: this reader is not counted, so the last release frees it under another
        return got

    adm.restore = unheld


def _no_remap(core) -> None:
    core.admission.on_remapping = lambda: Denied.Busy  # the plan is never landed: the request waits as on Busy


def _skip_restore_copy(core) -> None:
    core.admission.restore_copy = lambda copies: None


REWRITE_ROWS = 256  # rows per prefill call when foreign-parent rewrites a hit's pages


def _foreign_parent(core) -> None:
    from runtime.step import Cell

    adm = core.admission
    lookup = adm.lookup

    def rewrite(ids, pages: list[int]) -> None:
        """Write ids into pages from position 0, in calls of REWRITE_ROWS rows."""
        for pos in range(0, len(ids), REWRITE_ROWS):
            core.device.step(core.prefill_program, [Cell(pages, None, ids[pos:pos + REWRITE_ROWS], pos)])

    def after_another_first_block(ids):
        hit = lookup(ids)
        unit = adm.engine.unit
        full = hit.len // unit if hit is not None and hit.tier is Tier.DEVICE else 0
        if full >= 2 and not adm.engine.lined:
            # the bug this fault stands for: the hit's blocks after the first were computed behind
            # another first block; page 0 is written back with its own tokens
            pages = list(hit.store.page_ids()[:full])
            toks = list(ids[: full * unit])
            rewrite([(t + 1) % 256 for t in toks[:unit]] + toks[unit:], pages)
            rewrite(toks[:unit], pages[:1])
        return hit

    adm.lookup = after_another_first_block


def _pad_in_limit(core) -> None:
    adm = core.admission
    too_long = adm.too_long

    def waits(req, got):
        if req.room <= adm.engine.pages * adm.engine.unit:
            return adm.WAIT  # the fault's limit says it fits once room frees: it never does
        return too_long(req, got)

    adm.too_long = waits


HOOK_FAULTS = {
    "leak-lease": _leak_lease, "ignore-hang-up": _ignore_hang_up, "keep-overshoot": _keep_overshoot, "no-checkpoint": _no_checkpoint,
    "wrong-token": _wrong_token, "no-park": _no_park, "drop-wake": _drop_wake, "no-remap": _no_remap,
    "skip-restore-copy": _skip_restore_copy, "pad-in-limit": _pad_in_limit, "foreign-parent": _foreign_parent,
    "hit-unheld": _hit_unheld,
}
FRONT_FAULTS = ("untold-tier", "pad-in-limit")  # read by the HTTP side through Faults (pad-in-limit: both)

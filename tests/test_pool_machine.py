"""A hypothesis state machine over the device tier: shrinks a failure to a readable call sequence."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from pool import Denied, Lease, Pool
from test_pool_models import HYBRID4, Device, Mapping, fold


class PoolMachine(RuleBasedStateMachine):
    """Pages and slots held are exactly those the live handles name; every handle reads what its
    writer wrote; remap plans land on the mapping model; releasing everything leaves nothing."""

    leases = Bundle("leases")
    checkpoints = Bundle("checkpoints")

    def __init__(self) -> None:
        super().__init__()
        self.pool, plan = Pool.new(HYBRID4, 4, 18, 3)
        self.map = Mapping(HYBRID4, 4, 18, self.pool)
        self.map.land(plan)
        self.dev = Device(4)
        # id(handle) -> (handle, content, line)
        self.live: dict[int, tuple] = {}
        self.stamp = 0

    def ask(self, fn):
        got = fn()
        if got == Denied.Remapping:
            self.map.land_pending()
            got = fn()
        return got

    @initialize(target=leases, tokens=st.integers(1, 32))
    def first_lease(self, tokens):
        # every bundle a rule draws from has something in it from the start, so hypothesis does
        # not throw away most of its draws on rules that cannot run yet
        return self.lease(tokens)

    @initialize(target=checkpoints)
    def empty_checkpoint(self):
        return None

    @rule(target=leases, tokens=st.integers(1, 32))
    def lease(self, tokens):
        got = self.ask(lambda: self.pool.lease(tokens))
        if not isinstance(got, Lease):
            return None
        content, line = [], 0
        for pos in range(tokens):
            self.stamp += 1
            self.dev.tokens[got.slot_of(pos)] = self.stamp
            content.append(self.stamp)
            line = fold(line, self.stamp)
        self.dev.lines[got.slot] = line
        self.live[id(got)] = (got, content, line)
        return got

    @rule(target=checkpoints, lease=leases)
    def checkpoint(self, lease):
        if lease is None or id(lease) not in self.live:
            return None
        _, content, line = self.live[id(lease)]
        got = self.ask(lambda: self.pool.checkpoint(lease, len(content)))
        if isinstance(got, Denied):
            return None
        self.dev.copy(got[1])
        self.live[id(got[0])] = (got[0], content, line)
        return got[0]

    @rule(target=leases, cp=checkpoints, extra=st.integers(1, 8))
    def restore(self, cp, extra):
        if cp is None or id(cp) not in self.live:
            return None
        _, content, line = self.live[id(cp)]
        got = self.ask(lambda: self.pool.restore(cp, cp.tokens, cp.tokens + extra))
        if isinstance(got, Denied):
            return None
        self.dev.copy(got[1])
        self.live[id(got[0])] = (got[0], list(content), line)
        return got[0]

    @rule(handle=consumes(leases) | consumes(checkpoints))
    def release(self, handle):
        if handle is not None and id(handle) in self.live:
            del self.live[id(handle)]
            handle.release()

    @invariant()
    def handles_name_what_is_held(self):
        pages, slots = set(), set()
        for handle, content, line in self.live.values():
            ids = handle.page_ids()
            pages.update(ids)
            slots.add(handle.seq_slot())
            for pos, want in enumerate(content[: len(ids) * 4]):
                assert self.dev.tokens.get(ids[pos // 4] * 4 + pos % 4) == want
            assert self.dev.lines.get(handle.seq_slot()) == line
        assert self.pool.used == len(pages) and self.pool.slots_used == len(slots)

    def teardown(self):
        for handle, _, _ in self.live.values():
            handle.release()
        assert (self.pool.used, self.pool.slots_used) == (0, 0)


PoolMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestPoolMachine = PoolMachine.TestCase

"""The runtime equals toy/model.py on every shape, chunk size and row count."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.sequence import RequestError, generate, single
from runtime.step import BUCKETS, Cell, bucket
from tests.toyrun import SHAPES, SPEC_SHAPES, target
from toy import model

prompts = st.lists(st.integers(0, 255), min_size=1, max_size=300)


def run(name, ids, steps, rows=1, chunk=None):
    m, w = target(name)
    rt, cell = single(m, w, len(ids), steps, rows)
    return generate(rt, cell, ids, steps, rows, chunk)


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ids=prompts, chunk=st.sampled_from([1, 7, 16, 64, None]), steps=st.integers(1, 24))
def test_runtime_equals_the_reference(shape, ids, chunk, steps):
    """For any prompt (ids 0-255, 1-300 tokens), chunk and step count, the runtime's greedy ids are the model's."""
    m, _ = target(shape)
    rows_choices = (1, 4) if shape in SPEC_SHAPES else (1,)
    want = model.generate(ids, steps, m.raw)
    for rows in rows_choices:
        assert run(shape, ids, steps, rows, chunk).ids == want


@pytest.mark.parametrize("shape", SPEC_SHAPES)
def test_rounds_accept_about_half_the_drafts(shape):
    """count = 1 + S % rows is uniform, so over many rounds acceptance lands inside ACCEPT_PCT."""
    drafted = accepted = 0
    for i in range(6):
        g = run(shape, list(f"{i}. The village market opened before dawn.".encode()), 48, rows=4)
        drafted += g.drafted
        accepted += g.accepted
    assert drafted > 60
    lo, hi = model.ACCEPT_PCT
    assert lo <= 100 * accepted / drafted <= hi


def test_toy_big_writes_64_kib_per_token():
    m, w = target("toy-big")
    ids = list(b"Rain had turned the trail to mud")
    rt, cell = single(m, w, len(ids), 8, 1)
    g = generate(rt, cell, ids, 8, 1)
    assert g.ids == model.generate(ids, 8, m.raw)
    state = rt.read_state(cell.pages, cell.slot, g.length)
    assert len(state) == g.length * 65536
    words = memoryview(state).cast("Q")
    # every word of every slot was written: tails are functions of heads, none left zero
    assert all(words[q * 8192 + 8191] != 0 for q in range(g.length))


def test_emitting_prefill_takes_the_first_token_from_the_last_chunk():
    m, _ = target("toy-stateful")
    ids = list(b"Photosynthesis converts light")
    assert run("toy-stateful", ids, 1, chunk=5).ids == model.generate(ids, 1, m.raw)


@pytest.mark.parametrize("n,cap,want", [(1, 256, 1), (3, 256, 4), (17, 256, 24), (200, 256, 256), (5, 5, 5), (3, 2, 3), (257, 256, 257)])
def test_bucket_ladder(n, cap, want):
    assert bucket(n, cap) == want
    assert bucket(n, cap) >= n


def test_padding_cells_leave_live_answers_alone():
    """A batch of 3 padded to 4 answers each live sequence as the model does."""
    m, w = target("toy-stateful")
    from runtime.runtime import Runtime

    rt = Runtime(m, w, pages=1 + 3 * 4, slots=5, max_seqs=8)
    rt.set_pad(0, 1)
    prompts = [list(b"abc"), list(b"hello world"), list(b"x")]
    cells = [Cell(list(range(1 + 4 * i, 5 + 4 * i)), 2 + i, p, 0) for i, p in enumerate(prompts)]
    for c in cells:
        rt.zero_slot(c.slot)
        rt.step("prefill", [c])
    firsts = [c.tokens[0] for c in cells]
    assert firsts == [model.generate(p, 1, m.raw)[0] for p in prompts]
    step = [Cell(c.pages, c.slot, [t], len(p)) for c, t, p in zip(cells, firsts, prompts)]
    rt.step("decode", step)
    assert [c.tokens[0] for c in step] == [model.generate(p, 2, m.raw)[1] for p in prompts]


def test_bad_requests_are_refused_by_name():
    m, w = target("toy-paged")
    rt, cell = single(m, w, 3, 4, 1)
    with pytest.raises(RequestError, match="0..256"):
        generate(rt, cell, [1, 2, 257], 4, 1)
    with pytest.raises(RequestError, match="empty"):
        generate(rt, cell, [], 4, 1)
    with pytest.raises(RequestError, match="steps"):
        generate(rt, cell, [1], 0, 1)
    with pytest.raises(RequestError, match="reach"):
        single(m, w, 8190, 8, 1)


LONG = list(("Compilers optimize loops by hoisting invariant computations out of them, which means " * 4).encode())[:300]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk", [1, 7, 16, 64, None])
def test_a_300_token_prompt_at_every_chunk_size(shape, chunk):
    """The longest drawn prompt length, at each chunk size the issue names, on every shape and row count."""
    m, _ = target(shape)
    want = model.generate(LONG, 16, m.raw)
    for rows in (1, 4) if shape in SPEC_SHAPES else (1,):
        assert run(shape, LONG, 16, rows, chunk).ids == want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_batches_that_change_every_step_answer_as_the_model(data):
    """Decode steps over batches whose members, order and pages change from step to step (a
    sequence's page list grows in place as it needs a page, others join, leave and are reordered,
    or neighbours swap rows here and there):
    the page tables and slot map kept between steps (runtime/tables.py) stay each row's own, so
    every sequence's ids are the model's."""
    from runtime.runtime import Runtime

    m, w = target("toy-paged")
    rt = Runtime(m, w, pages=96, max_seqs=16)
    rt.set_pad(0, None)
    unit = rt.unit
    free = data.draw(st.permutations(range(1, 96)))
    n = data.draw(st.integers(2, 12))
    prompts = [data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=40)) for _ in range(n)]
    cells, pos, anchor, out = [], [], [], [[] for _ in prompts]
    for p in prompts:
        pages = [free.pop() for _ in range(-(-len(p) // unit))]
        if len(p) > 1:
            rt.step("prefill", [Cell(pages, None, p[:-1], 0)])
        cells.append(pages)
        pos.append(len(p) - 1)
        anchor.append(p[-1])
    live = list(range(n))
    batch: list[int] = []
    while live:
        batch = [i for i in batch if i in live]
        if len(batch) >= 2 and data.draw(st.booleans()):
            # the batch before with pairs of neighbours swapped: rows rewritten here and there
            for at in range(0, len(batch) - 1, 2):
                if data.draw(st.booleans()):
                    batch[at], batch[at + 1] = batch[at + 1], batch[at]
        else:
            batch = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True))
        for i in batch:
            if pos[i] + 1 > len(cells[i]) * unit:
                cells[i].append(free.pop())  # the same list, one page longer
        step = [Cell(cells[i], None, [anchor[i]], pos[i]) for i in batch]
        rt.step("decode", step)
        for i, c in zip(batch, step):
            t = c.tokens[0]
            pos[i] += 1
            if t == model.EOS or len(out[i]) >= 24:
                live.remove(i)
            else:
                out[i].append(t)
                anchor[i] = t
    for p, got in zip(prompts, out):
        assert got == model.generate(p, 24, m.raw)[: len(got)]
        assert len(got) == 24 or len(model.generate(p, 24, m.raw)) == len(got)


def test_a_prefill_call_between_decode_steps_leaves_the_batch_rows_alone():
    """A prefill program that reads the slot map but no page table (toy-paged's) stages its slots from
    its own cell (`Runtime._staging`): the page-table rows the decode batch keeps between steps
    (runtime/tables.py) stay as they were, so the next decode step of the same batch rewrites no row
    (staged through them, the call took row 0 and the decode step rebuilt and uploaded it again); and
    every answer, the joining sequence's too, is still the model's."""
    from runtime.runtime import Runtime

    m, w = target("toy-paged")
    rt = Runtime(m, w, pages=32, max_seqs=8)
    rt.set_pad(0, None)
    prompts = [list(b"lighthouse"), list(b"risotto"), list(b"hash map"), list(b"x"), list(b"late joiner")]
    pages = [[1 + 2 * i, 2 + 2 * i] for i in range(len(prompts))]
    state = []  # (index, position, anchor, answer)
    for i, p in enumerate(prompts[:4]):
        if len(p) > 1:
            rt.step("prefill", [Cell(pages[i], None, p[:-1], 0)])
        state.append([i, len(p) - 1, p[-1], []])

    def decode(members):
        step = [Cell(pages[i], None, [a], pos) for i, pos, a, _ in members]
        rt.step("decode", step)
        for s, c in zip(members, step):
            s[1] += 1
            s[2] = c.tokens[0]
            s[3].append(c.tokens[0])

    decode(state)
    rt.step("prefill", [Cell(pages[4], None, prompts[4][:-1], 0)])
    decode(state)
    assert rt.resident.dirty == [], "the prefill call moved the batch's page-table rows"
    state.append([4, len(prompts[4]) - 1, prompts[4][-1], []])
    for _ in range(3):
        decode(state)
    for i, _, _, got in state:
        want = model.generate(prompts[i], 8, m.raw)  # up to its EOS, which the steps emit and go past
        assert got[: len(want)] == want[: len(got)] and (len(got) <= len(want) or got[len(want)] == model.EOS)


def test_a_non_emitting_prefill_call_is_timed_without_waiting():
    """A prefill call that reads nothing back (toy-paged's) returns once its launches are issued: its
    kernels' time waits in `StepTiming.unsettled` and is added, once, when the next step that reads
    back settles it (waiting to time it cost every such call a synchronization on a GPU)."""
    from runtime.runtime import Runtime

    m, w = target("toy-paged")
    rt = Runtime(m, w, pages=8, max_seqs=4)
    rt.set_pad(0, None)
    timed: list = []
    elapsed = rt.backend.elapsed_ms
    rt.backend.elapsed_ms = lambda a, b: timed.append((a, b)) or elapsed(a, b)
    p = list(b"lighthouse")
    rt.step("prefill", [Cell([1], None, p[:5], 0)])
    rt.step("prefill", [Cell([1], None, p[5:-1], 5)])
    t = rt.timing
    assert (timed, len(t.unsettled), t.kernel, t.steps) == ([], 2, 0.0, 2)
    step = [Cell([1], None, [p[-1]], len(p) - 1)]
    rt.step("decode", step)
    assert len(timed) == 3 and not t.unsettled and t.kernel > t.decode_kernel > 0
    assert t.kernel == pytest.approx(sum(elapsed(a, b) for a, b in timed) / 1000.0)
    assert step[0].tokens == model.generate(p, 1, m.raw)


def test_two_finishes_apart_rewrite_two_runs_of_rows():
    """Two sequences of a decode batch end together at rows 1 and 3; the batch's last sequence takes
    row 3 and a newcomer row 1 (the core's swap-remove and a join in one iteration): the page-table
    rows rewritten are two runs apart, and both must reach the device (a commit that copied only the
    first run, vLLM V1's bug, left row 3 reading the finished sequence's pages). Every answer is the
    model's."""
    from runtime.runtime import Runtime

    m, w = target("toy-paged")
    rt = Runtime(m, w, pages=32, max_seqs=8)
    rt.set_pad(0, None)
    prompts = [list(b"lighthouse"), list(b"risotto!"), list(b"hash map"), list(b"the keeper"), list(b"eleven days"),
               list(b"a newcomer")]
    pages = [[1 + 2 * i, 2 + 2 * i] for i in range(len(prompts))]
    pos, anchor, out = {}, {}, {i: [] for i in range(len(prompts))}
    for i, p in enumerate(prompts):
        rt.step("prefill", [Cell(pages[i], None, p[:-1], 0)])
        pos[i], anchor[i] = len(p) - 1, p[-1]

    def decode(batch):
        step = [Cell(pages[i], None, [anchor[i]], pos[i]) for i in batch]
        rt.step("decode", step)
        for i, c in zip(batch, step):
            pos[i] += 1
            anchor[i] = c.tokens[0]
            out[i].append(c.tokens[0])

    for _ in range(2):
        decode([0, 1, 2, 3, 4])
    decode([0, 5, 2, 4])  # 1 and 3 ended: the newcomer at row 1, the last (4) moved to row 3
    assert rt.resident.dirty == [(1, 2), (3, 4)]
    for _ in range(2):
        decode([0, 5, 2, 4])
    for i, got in out.items():
        want = model.generate(prompts[i], 8, m.raw)
        assert got[: len(want)] == want[: len(got)] and (len(got) <= len(want) or got[len(want)] == model.EOS), i

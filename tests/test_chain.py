"""The chain: `toy-layers` cut at every layer boundary, and three ways, runs its stages in order in
one process (`kern run --stages`) and gives the whole manifest's ids and every state byte, on the
gate's 12 prompts at two chunk sizes (issue 9). A chain that drops a hand-off, or hands on a stale
or partial activation, is caught."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from e2e.prompts import PROMPTS
from manifests.cut import cut
from kern.cli import main as kern
from runtime.chain import Chain, StagesError, load_stages
from runtime.sequence import generate, single
from tests.toyrun import target
from toy import gen_layers

NAME = "toy-layers"
CUTS = [[a] for a in range(1, gen_layers.LAYERS + 2)] + [[2, 4]]  # embed|layer.0 ... layer.3|head, and three stages
STEPS = 6
CHUNKS = (None, 16)


def stages_of(at):
    m, _ = target(NAME)
    return [s.manifest for s in cut(m, at)]


def run(ids, chunk, stages=None):
    m, w = target(NAME)
    rt, cell = single(None if stages else m, w, len(ids), STEPS, 1, stages=stages)
    g = generate(rt, cell, ids, STEPS, 1, chunk)
    return g.ids, rt.read_state(cell.pages, cell.slot, g.length)


@pytest.fixture(scope="module")
def whole():
    return {(i, c): run(list(p.encode()), c) for i, p in enumerate(PROMPTS) for c in CHUNKS}


def test_every_cut_point_lands_on_a_layer_boundary_with_one_owner_a_layer():
    for at in CUTS:
        stages = stages_of(at)
        owned = [sorted(s.states) for s in stages]
        assert sorted(x for o in owned for x in o) == [f"kv.{l}" for l in range(gen_layers.LAYERS)], at
        for s in stages:
            for p in s.driven():
                assert [c.op for c in p.calls] == [c.op for c in s.driven()[0].calls], "same calls in each program"
        assert [s.cut.stage for s in stages] == list(range(len(at) + 1))


@pytest.mark.parametrize("at", CUTS, ids=lambda a: "at-" + "-".join(map(str, a)))
def test_the_chain_is_bitwise_the_whole(at, whole):
    stages = stages_of(at)
    for i, p in enumerate(PROMPTS):
        for c in CHUNKS:
            got = run(list(p.encode()), c, stages)
            want = whole[(i, c)]
            assert got[0] == want[0], f"prompt {i + 1} chunk {c}: ids differ"
            assert got[1] == want[1], f"prompt {i + 1} chunk {c}: state bytes differ"


@pytest.mark.parametrize("fault", ["no-handoff", "stale", "partial"])
def test_a_chain_that_hands_on_wrongly_is_caught(fault, whole, monkeypatch):
    """Negative controls at the cut after layer.1: the activation not handed on (the next stage
    keeps what it had), the previous step's activation, only words 0..3 of each row."""
    stages = stages_of([3])
    saved = {}

    def broken(self, program, cells):
        be = self.backend
        first, second = self.stages
        first.step(program, cells)
        act = be.download(first.buffers["act"], first.last_env["tokens"] * 8).view(np.uint64).copy()
        if fault == "stale":
            sent, saved["act"] = saved.get("act", act), act
            sent = sent if sent.size == act.size else act
        elif fault == "partial":
            sent = act.reshape(-1, 8).copy()
            sent[:, 4:] = 0
        if fault != "no-handoff":
            be.upload(be.view(second.buffers["act"], "u64"), sent.reshape(-1))
        second.step(program, cells)
        return cells

    monkeypatch.setattr(Chain, "step", broken)
    got = run(list(PROMPTS[0].encode()), 16, stages)
    assert got[0] != whole[(0, 16)][0]


def test_kern_run_stages_runs_a_cut_written_to_a_directory(tmp_path, whole):
    m, w = target(NAME)
    for s in cut(m, [2, 4]):
        (tmp_path / f"stage{s.index}.json").write_text(json.dumps(s.raw))
    ids = ",".join(str(t) for t in PROMPTS[0].encode())
    r = CliRunner().invoke(kern, ["run", NAME, "--stages", str(tmp_path), "--prompt-ids", ids, "--steps", str(STEPS), "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output.strip().splitlines()[-1])
    assert got["stages"] == 3 and got["ids"] == whole[(0, None)][0]
    (tmp_path / "stage1.json").unlink()
    r = CliRunner().invoke(kern, ["run", NAME, "--stages", str(tmp_path), "--prompt-ids", ids])
    assert r.exit_code == 2 and "has stages [0, 1, 2], the directory holds [0, 2]" in r.output
    (tmp_path / "empty").mkdir()
    with pytest.raises(StagesError, match="no stage manifests"):
        load_stages(tmp_path / "empty")


def test_kern_cut_then_kern_run_stages_needs_only_the_directory(tmp_path, whole):
    """`kern cut` links the weights beside the stages, so `kern run --stages DIR` needs nothing else."""
    out = tmp_path / "stages"
    r = CliRunner().invoke(kern, ["cut", NAME, "--at", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    ids = ",".join(str(t) for t in PROMPTS[0].encode())
    r = CliRunner().invoke(kern, ["run", "--stages", str(out), "--prompt-ids", ids, "--steps", str(STEPS), "--chunk", "16", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output.strip().splitlines()[-1])
    assert (got["target"], got["stages"], got["ids"]) == (NAME, 2, whole[(0, 16)][0])
    assert got["load"]["peak_bytes"] > 0

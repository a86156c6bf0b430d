"""kern cut: the property test over random manifests, then the rules one at a time."""

import json

import pytest

import manifests
from manifests.cut import REFUSALS, CutError, cut, cut_id, fnv1a64, report
from tests.symbolic import Machine, Rng, build, random_manifest


def whole_and_stages(raw: dict, at: list[int]):
    m = manifests.parse(raw)
    return m, cut(m, at)


def run_whole(m):
    mach = Machine(m)
    mach.start()
    mach.run("p")
    return mach


def run_chain(stages):
    """Run the stages in order, each arriving buffer copied from the stage before."""
    prev = None
    regions, owners = {}, {}
    for st in stages:
        m = st.manifest
        mach = Machine(m)
        mach.start()
        for name, b in m.buffers.items():
            if b.kind in ("input", "inout") and name != "x":
                assert prev is not None and name in prev.m.buffers, f"stage {st.index}: {name} is held by no stage before"
                assert name in prev.bufs, f"stage {st.index}: the stage before never set {name}"
                mach.bufs[name] = dict(prev.bufs[name])
        mach.run("p")
        for r in mach.wrote_regions:
            assert r not in owners, f"state region {r} written by stages {owners[r]} and {st.index}"
            owners[r] = st.index
        regions.update({r: v for r, v in mach.regions.items() if r in mach.wrote_regions})
        prev = mach
    return prev, regions


def test_every_cut_that_is_made_computes_the_whole():
    """Property: for 400 random manifests, each cut at a random point (at two points half the time)
    is either refused, only with a known refusal, or gives stages whose chain, run by the symbolic
    interpreter with each crossing buffer copied from the stage before, computes the whole
    manifest's final `y` and every state region it writes, each region written by one stage only.
    The stages carry correct cut metadata and only ops of the whole. More than half the cuts
    succeed and at least one is refused."""
    made = refused = 0
    for seed in range(1, 401):
        raw = random_manifest(seed)
        m = manifests.parse(raw)
        n = len(m.programs["p"].calls)
        rng = Rng(seed ^ 0x5EED)
        if rng.next(2) and n > 2:
            a = 1 + rng.next(n - 2)
            at = [a, a + 1 + rng.next(n - 1 - a)]
        else:
            at = [1 + rng.next(n - 1)]
        try:
            stages = cut(m, at)
        except CutError as exc:
            assert any(r in str(exc) for r in REFUSALS[1:3]), f"seed {seed} at {at}: unexpected refusal {exc}"
            refused += 1
            continue
        made += 1
        ident = cut_id(m, at)
        assert [s.raw["cut"] for s in stages] == [{"id": ident, "stage": i, "stages": len(at) + 1} for i in range(len(at) + 1)]
        for s in stages:
            assert set(s.raw["ops"]) <= set(raw["ops"])
            assert "topology" not in s.raw
            assert len(s.raw["programs"]["p"]["calls"]) == ([0, *at, n][s.index + 1] - [0, *at][s.index])
        whole = run_whole(m)
        last, regions = run_chain(stages)
        assert last.bufs["y"] == whole.bufs["y"], f"seed {seed} at {at}: y differs"
        assert regions == {r: v for r, v in whole.regions.items() if r in whole.wrote_regions}, f"seed {seed} at {at}"
    assert made + refused == 400
    assert made > 200, (made, refused)
    assert refused >= 1


def test_the_interpreter_sees_a_wrong_copy():
    """The property test can fail: a chain that drops a crossing copy computes another `y`."""
    raw = build([("f1", [("buf", "x", 0), ("buf", "w0", 0)]),
                 ("g", [("buf", "w0", 0)]),
                 ("f1", [("buf", "w0", 0), ("buf", "y", 0)])])
    m, stages = whole_and_stages(raw, [1])
    whole = run_whole(m)
    last, _ = run_chain(stages)
    assert last.bufs["y"] == whole.bufs["y"]
    second = Machine(manifests.parse(stages[1].raw))
    second.start()
    second.bufs["w0"] = {0: 12345}  # stale
    second.run("p")
    assert second.bufs["y"] != whole.bufs["y"]


def layered() -> dict:
    """Two layers of three calls, each on its own state region; w0 carries the activation."""
    return build([
        ("f1", [("buf", "x", 0), ("buf", "w0", 0)]),
        ("sw", [("buf", "w0", 0), ("state", "s", 0)]),
        ("sr", [("state", "s", 0), ("buf", "w0", 0), ("buf", "w1", 0)]),
        ("f2", [("buf", "w1", 0), ("buf", "c", 0), ("buf", "w0", 0)]),
        ("sw", [("buf", "w0", 0), ("state", "s", 4)]),
        ("sr", [("state", "s", 4), ("buf", "w0", 0), ("buf", "w1", 0)]),
        ("g", [("buf", "w1", 0)]),
        ("f1", [("buf", "w1", 0), ("buf", "y", 0)]),
    ])


def test_stage_signatures_at_a_layer_boundary():
    m, (a, b) = whole_and_stages(layered(), [4])
    assert a.leaving == ["w0"] and a.raw["buffers"]["w0"]["kind"] == "output"
    assert b.arriving == {"w0": "input"} and b.raw["buffers"]["w0"]["kind"] == "input"
    assert "y" not in a.raw["buffers"] and "y" in b.raw["buffers"]
    assert "x" in a.raw["buffers"] and "x" not in b.raw["buffers"]
    # init is sliced: stage 0 reads c, so keeps z->c only; stage 1 reads no carry, so has no init
    assert [c["args"][0]["buf"] for c in a.raw["programs"]["init"]["calls"]] == ["c"]
    assert "init" not in b.raw["programs"] and "c" not in b.raw["buffers"]
    assert a.state_use == {"s": (1, 2)} and b.state_use == {"s": (1, 2)}
    assert set(a.raw["ops"]) == {"f1", "sw", "sr", "f2", "z"} and set(b.raw["ops"]) == {"sw", "sr", "g", "f1"}
    text = report([a, b])
    assert "stage 0: calls 0..3" in text and "state s: 1 of 2 regions (held whole" in text


def test_an_arriving_buffer_the_stage_rewrites_is_inout():
    raw = build([("f1", [("buf", "x", 0), ("buf", "w0", 0)]),
                 ("g", [("buf", "w0", 0)]),
                 ("f1", [("buf", "w0", 0), ("buf", "y", 0)])])
    _, (a, b) = whole_and_stages(raw, [1])
    assert b.arriving == {"w0": "inout"} and b.raw["buffers"]["w0"]["kind"] == "inout"


def test_an_overwritten_buffer_does_not_cross():
    raw = build([("f1", [("buf", "x", 0), ("buf", "w0", 0)]),
                 ("f1", [("buf", "x", 0), ("buf", "w0", 0)]),
                 ("f1", [("buf", "w0", 0), ("buf", "y", 0)])])
    _, (a, b) = whole_and_stages(raw, [1])
    assert a.leaving == [] and b.arriving == {}
    # a partial write (offset 8) does not kill: the rest of w0 still crosses
    raw["programs"]["p"]["calls"][1]["args"][1]["offset"] = 8
    _, (a, b) = whole_and_stages(raw, [1])
    assert a.leaving == ["w0"] and b.arriving == {"w0": "inout"}


def test_a_state_region_split_between_stages_is_refused():
    with pytest.raises(CutError, match=r"state s at offset 0 is touched by stages 0, 1"):
        whole_and_stages(layered(), [2])


def test_a_buffer_passing_through_untouched_is_refused():
    raw = build([("f1", [("buf", "x", 0), ("buf", "w0", 0)]),
                 ("f1", [("buf", "x", 0), ("buf", "w1", 0)]),
                 ("f2", [("buf", "w0", 0), ("buf", "w1", 0), ("buf", "y", 0)])])
    with pytest.raises(CutError, match=r"buffer w0 passes through stage 1 untouched"):
        whole_and_stages(raw, [1, 2])


def test_only_a_workspace_travels():
    raw = build([("f1", [("buf", "x", 0), ("buf", "c", 0)]),
                 ("f1", [("buf", "c", 0), ("buf", "y", 0)])])
    with pytest.raises(CutError, match=r"buffer c \(carry\) is live across the cut at call 1: only a workspace travels"):
        whole_and_stages(raw, [1])


def test_only_the_last_stage_writes_outputs_and_carries():
    raw = build([("f1", [("buf", "x", 0), ("buf", "c", 0)]),
                 ("f1", [("buf", "x", 0), ("buf", "y", 0)])])
    with pytest.raises(CutError, match=r"op f1 \(stage 0\) writes carry c before the last stage"):
        whole_and_stages(raw, [1])


@pytest.mark.parametrize("at, msg", [
    ([], "no cut points"),
    ([0], "cut point 0 is not after any call"),
    ([3, 3], "cut points must increase strictly, got 3, 3"),
    ([5, 2], "cut points must increase strictly"),
    ([8], "programs.p has 8 calls: cut point 8 leaves its last stage empty"),
])
def test_invalid_cut_points_are_errors(at, msg):
    with pytest.raises(CutError, match=msg):
        whole_and_stages(layered(), at)


def test_a_stage_is_not_cut_again():
    _, (a, _) = whole_and_stages(layered(), [4])
    with pytest.raises(CutError, match="is already stage 0 of cut"):
        cut(manifests.parse(a.raw, "stage0.json"), [1])


def test_a_manifest_without_a_batch_is_refused():
    raw = layered()
    del raw["programs"]["p"]["batch"]
    with pytest.raises(CutError, match="no program has a batch"):
        whole_and_stages(raw, [4])


def test_a_three_way_cut_and_the_id():
    m, stages = whole_and_stages(layered(), [1, 4])
    assert [s.arriving for s in stages] == [{}, {"w0": "inout"}, {"w0": "input"}]
    assert [s.leaving for s in stages] == [["w0"], ["w0"], []]
    text = json.dumps(m.raw, sort_keys=True, separators=(",", ":")).encode()
    want = fnv1a64(text + (1).to_bytes(8, "little") + (4).to_bytes(8, "little"))
    assert stages[0].raw["cut"]["id"] == f"{want:016x}" == cut_id(m, [1, 4])
    assert cut_id(m, [1, 4]) != cut_id(m, [4])
    # the same cut gives the same bytes
    again = cut(manifests.parse(layered()), [1, 4])
    assert [json.dumps(s.raw) for s in again] == [json.dumps(s.raw) for s in stages]


def test_fnv1a64_known_values():
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


def test_kern_cut_writes_verified_stages(tmp_path):
    from click.testing import CliRunner

    from kern.cli import main

    src = tmp_path / "m.json"
    src.write_text(json.dumps(layered()))
    (tmp_path / "w.safetensors").write_bytes(b"")
    out = tmp_path / "stages"
    r = CliRunner().invoke(main, ["cut", str(src), "--at", "1,4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "3 stages ->" in r.output and "arriving: w0 (inout)" in r.output
    got = [manifests.load(out / f"stage-{i}.json") for i in range(3)]
    assert [g.cut.stage for g in got] == [0, 1, 2] and len({g.cut.id for g in got}) == 1
    assert (out / "w.safetensors").is_symlink()
    r = CliRunner().invoke(main, ["cut", str(src), "--at", "2", "--out", str(out)])
    assert r.exit_code == 2
    assert "cannot cut" in r.output and "state s at offset 0 is touched by stages 0, 1" in r.output
    r = CliRunner().invoke(main, ["cut", str(src), "--at", "one", "--out", str(out)])
    assert r.exit_code == 2 and "--at: expected comma-separated integers" in r.output

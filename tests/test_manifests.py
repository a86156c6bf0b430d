"""The manifest loader: strict parsing, every error at once naming the field; derivations; kern gen."""

import copy
import json
import tomllib
from pathlib import Path

import pytest

import manifests
from manifests import ManifestError, derive
from toy.gen import SHAPES, generate, manifest

SHIPPED = Path(manifests.__file__).parent


def good(shape="toy-stateful-spec", block=256) -> dict:
    return copy.deepcopy(manifest(next(s for s in SHAPES if s.name == shape), block))


def problems(raw) -> list[str]:
    with pytest.raises(ManifestError) as exc:
        manifests.parse(json.dumps(raw) if isinstance(raw, dict) else raw, "m.json")
    return exc.value.problems


@pytest.mark.parametrize("shape", [s.name for s in SHAPES])
def test_generated_manifests_verify(shape):
    for block in (256, 128):
        m = manifests.parse(good(shape, block))
        assert m.model == shape


def test_unknown_field_is_named():
    raw = good()
    raw["buffers"]["salt"]["colour"] = "red"
    assert problems(raw) == ["buffers.salt.colour: unknown field"]


def test_bad_dtype_is_named():
    raw = good()
    raw["buffers"]["positions"]["dtype"] = "i63"
    (p,) = problems(raw)
    assert p.startswith("buffers.positions.dtype: unknown dtype \"i63\"")


def test_dangling_references_are_named():
    raw = good()
    raw["programs"]["decode"]["calls"][0]["args"][0] = {"buf": "tokens_ids"}
    raw["buffers"]["block_table"]["domain"]["index_into"] = "kvv"
    ps = problems(raw)
    assert "programs.decode.calls[0].args[0]: unknown buffer 'tokens_ids'" in ps
    assert "buffers.block_table.domain.index_into: unknown state or buffer 'kvv'" in ps


def test_batch_over_its_bound_is_named():
    raw = good()
    raw["programs"]["round"]["batch"]["groups"] = 1024
    ps = problems(raw)
    assert any(p.startswith("programs.round.batch: groups 1024 x rows 4 is over vars.tokens.max") for p in ps)
    assert "programs.round.batch.groups: 1024 is over vars.seqs.max 256" in ps


def test_an_out_never_written_is_named():
    raw = good("toy-paged")
    # the predict launch forwards next_token as an `in` buffer: nothing writes the op's out
    launch = raw["ops"]["predict"]["impl"]["launches"][0]
    launch["params"][4] = "in buffer<i64>"
    ps = problems(raw)
    assert "ops.predict.params[4]: declared out but no launch writes it" in ps


def test_read_before_write_is_named():
    raw = good("toy-paged")
    # decode reads next_token (an output) in its first call, before predict writes it
    raw["ops"]["write"]["params"][0] = "inout buffer<i64>"
    raw["ops"]["write"]["impl"]["launches"][0]["params"][0] = "inout buffer<i64>"
    raw["programs"]["decode"]["calls"][0]["args"][0] = {"buf": "next_token"}
    raw["programs"]["prefill"]["calls"][0]["args"][0] = {"buf": "next_token"}
    ps = problems(raw)
    assert any("reads output buffer next_token before anything in decode writes it" in p for p in ps)
    assert "buffers.token_ids: declared but never used" in ps


def test_write_to_an_input_is_named():
    raw = good("toy-paged")
    raw["ops"]["write"]["params"][0] = "inout buffer<i64>"
    raw["ops"]["write"]["impl"]["launches"][0]["params"][0] = "inout buffer<i64>"
    assert any("op write writes input buffer token_ids" in p for p in problems(raw))


def test_every_error_is_reported_at_once():
    raw = good()
    raw["buffers"]["salt"]["colour"] = "red"
    raw["buffers"]["positions"]["dtype"] = "i63"
    raw["modules"]["toy"]["sha256"] = "0" * 64
    raw["vars"]["seqs"]["max"] = 0
    ps = problems(raw)
    assert len(ps) >= 4
    assert any(p.startswith("buffers.salt.colour") for p in ps)
    assert any(p.startswith("buffers.positions.dtype") for p in ps)
    assert any(p.startswith("vars.seqs.max") for p in ps)


def test_module_hash_mismatch_is_refused():
    raw = good()
    raw["modules"]["toy"]["sha256"] = "0" * 64
    (p,) = problems(raw)
    assert p.startswith("modules.toy.sha256: does not match the kernels")


def test_unknown_module_impl_is_named():
    raw = good()
    raw["modules"]["toy"]["impl"] = "toy.no_such_kernels"
    assert any(p.startswith("modules.toy.impl: cannot import") for p in problems(raw))


def test_duplicate_names_and_bad_json_are_errors():
    text = json.dumps(good()).replace('"vars": {', '"vars": {"seqs": {"max": 1}, ', 1)
    assert "duplicate name 'seqs'" in problems(text)[0]
    assert problems("{not json")[0].startswith("not valid JSON")


def test_error_message_names_the_source_and_count():
    raw = good()
    raw["buffers"]["salt"]["colour"] = "red"
    with pytest.raises(ManifestError, match=r"^m.json: 1 problem: buffers.salt.colour: unknown field$"):
        manifests.parse(raw, "m.json")


@pytest.mark.parametrize(
    "shape,unit,reach,lined",
    [("toy-paged", 16, 8192, False), ("toy-stateful", 16, 8192, True), ("toy-big", 64, 65536, False)],
)
def test_derivations(shape, unit, reach, lined):
    m = manifests.parse(good(shape))
    assert derive.page_unit(m) == unit
    assert derive.reach(m) == reach
    assert derive.is_lined(m) == lined


def test_geometry_for_the_pool():
    g = derive.geometry(manifests.parse(good("toy-stateful")))
    assert g == {
        "paged": (("kv", 4096),),
        "lined": (("mem", 1 << 20),),
        "page_tables": (("block_table", "kv", 512, 16),),
        "line_tables": (("mem.line", "mem", 1, 1 << 20),),
    }


def test_kern_gen_reproduces_the_shipped_set_byte_for_byte(tmp_path):
    written = generate(tmp_path)
    # every target of the written config has a manifest and its -ref twin, and nothing else is JSON
    targets = tomllib.loads((tmp_path / "toy.toml").read_text())["targets"]
    assert {"toy-paged", "toy-float"} <= set(targets)
    assert len([p for p in written if p.suffix == ".json"]) == 2 * len(targets)
    for p in written:
        rel = p.relative_to(tmp_path)
        assert (SHIPPED / rel).read_bytes() == p.read_bytes(), f"{rel} differs from `kern gen --out manifests`"
    shipped = {p.relative_to(SHIPPED) for p in (SHIPPED / "toy").iterdir()} | {Path("toy.toml"), Path("toy-pp.toml")}
    assert shipped == {p.relative_to(tmp_path) for p in written}


def test_ref_twin_differs_only_in_its_kernel_build():
    a, b = good("toy-spec", 256), good("toy-spec", 128)
    assert a["modules"] != b["modules"]
    for d in (a, b):
        d.pop("modules")
        for op in d["ops"].values():
            for launch in op["impl"]["launches"]:
                launch.pop("block")
    assert a == b


def _rust_driver_keeps(config: Path) -> dict[str, str | None]:
    """The Rust kern gate driver's reading of a config (reference/kern-e2e.md §3): paths relative to
    the file; a target is skipped when its manifest or kernels path is missing, or a weights entry."""
    base = config.parent
    out = {}
    for name, t in tomllib.loads(config.read_text())["targets"].items():
        assert "kernels" in t, f"{name}: the Rust driver requires `kernels`"
        why = None
        for key in ("manifest", "kernels"):
            if not (base / t[key]).exists():
                why = why or f"{key} {t[key]} missing"
        for w in t.get("weights", []):
            p = base / w
            bare = Path(*[c for c in p.parts if "{" not in c and "*" not in c])
            if not (bare.exists() or (bare != p and bare.parent.exists())):
                why = why or f"weights {w} missing"
        if t.get("reference") is not None:
            assert (base / t["reference"]).is_file(), name
        out[name] = why
    return out


def test_the_rust_driver_keeps_the_integer_toys_and_leaves_out_ours():
    from e2e.config import load_targets
    from manifests.config import load_config

    config = SHIPPED / "toy.toml"
    kept = _rust_driver_keeps(config)
    assert [n for n, why in kept.items() if why is None] == [s.name for s in SHAPES]
    assert {n for n, why in kept.items() if why} == {"toy-layers", "toy-float", "toy-attn"}
    assert all(why.startswith("kernels absent-on-purpose/") for why in kept.values() if why)
    text = config.read_text()
    for name in ("toy-layers", "toy-float"):  # a comment says why, in the table itself
        table = text.split(f"[targets.{name}]\n", 1)[1]
        assert table.startswith("# kernels: absent on purpose"), table[:200]
    # ours reads the key and serves (and gates) every target, those two included
    assert set(load_config(config).targets) == set(kept)
    _, targets = load_targets(config, None)
    assert {t.name for t in targets if t.skipped is None} == set(kept)

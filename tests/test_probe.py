"""Probes: `kern run --probe-dir` in the Rust kern's layout, and the warm, cached `Prober`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oracle.cache import kern_run_identity
from oracle.probe import ProbeError, Prober, read, write
from tests.toyrun import CONFIG
from toy import model

ROOT = Path(__file__).resolve().parent.parent
FLOAT = {"buffers": {"logits": {}}}


def test_kern_run_probe_dir_writes_each_step_in_the_rust_layout(tmp_path):
    """decode0..decode2: 257 bf16 logits (514 bytes) and the step's token (i64), the token being the
    logits' argmax; the first step's logits are the reference's at that context (one tile)."""
    d = tmp_path / "probe"
    r = subprocess.run([sys.executable, "-m", "kern.cli", "run", "toy-float", "--prompt-ids", "1,2,3",
                        "--steps", "3", "--probe-dir", str(d), "--probe-labels", ""],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    ids = [int(x) for x in r.stderr.split("generated ids: [")[1].split("]")[0].split(",")]
    assert sorted(p.name for p in d.iterdir()) == sorted(
        f"decode{i}.{k}.bin" for i in range(3) for k in ("logits", "tokens"))
    for i in range(3):
        raw = (d / f"decode{i}.logits.bin").read_bytes()
        assert len(raw) == 257 * 2
        tok = int(np.frombuffer((d / f"decode{i}.tokens.bin").read_bytes(), "<i8")[0])
        assert tok == ids[i] == model.float_next(np.frombuffer(raw, "<u2"))
    assert list(np.frombuffer((d / "decode0.logits.bin").read_bytes(), "<u2")) == model.logits([1, 2, 3], FLOAT)
    tag, row, top = read(d, 257)
    assert (tag, top) == ("decode0", ids[0]) and len(row) == 257


def test_probe_steps_stops_the_run_and_integer_targets_have_no_probe(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kern.cli", "run", "toy-float", "--prompt-ids", "5,6",
                        "--steps", "9", "--probe-dir", str(tmp_path / "a"), "--probe-steps", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "decode0.logits.bin", "decode0.tokens.bin"], r.stderr
    r = subprocess.run([sys.executable, "-m", "kern.cli", "run", "toy-paged", "--prompt-ids", "5,6",
                        "--probe-dir", str(tmp_path / "b")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "no logits buffer" in r.stderr


def test_read_takes_the_dump_whose_argmax_is_its_token(tmp_path):
    row = np.zeros(257, np.uint16)
    row[7] = 0x3F80  # 1.0
    write(tmp_path, "decode0", row, [7])
    assert read(tmp_path, 257)[2] == 7
    write(tmp_path, "decode0", row, [8])  # a dump whose token is not its argmax is no evidence
    with pytest.raises(ProbeError):
        read(tmp_path, 257)


def test_prober_is_cached_by_artifact_identity(tmp_path):
    """A probe is made once per context; a second ask reads the dump; other artifacts (another
    identity) throw every dump away."""
    t = CONFIG.targets["toy-float"]
    ident = kern_run_identity(t.manifest, t.weights, "cpu")
    p = Prober(t.manifest, t.weights, "cpu", tmp_path / "probes", ident)
    ctx = list(b"A hash m")  # one tile: the runtime adds in the reference order
    tag, row, top = p.probe(ctx)
    assert p.made == 1 and tag == "decode0"
    assert [model.bf16_bits(np.float32(x))[()] for x in row] == model.logits(ctx, FLOAT)[:257]
    assert p.probe(ctx)[1] == row and p.made == 1
    p.probe(ctx[:-1])
    assert p.made == 2 and len(list((tmp_path / "probes").glob("probe-*"))) == 2
    other = Prober(t.manifest, t.weights, "cpu", tmp_path / "probes", "another identity")
    other.probe(ctx)
    assert other.made == 1 and len(list((tmp_path / "probes").glob("probe-*"))) == 1


def test_runtimes_take_turns_unless_on_a_threadsafe_cpu_layer(monkeypatch):
    """Property: an in-process runtime call (KernRun's or a Prober's) takes the one process-wide
    RUNTIME_LOCK on a GPU (numba-cuda's module loading raced when each class had its own lock), on
    numba's `workqueue` CPU layer (not threadsafe), and when the layer cannot be known; on the CPU
    under omp or tbb it takes none (the kernels release the GIL)."""
    import numba

    from oracle.cache import RUNTIME_LOCK, runtime_lock

    def layer(name):
        def f():
            if name is None:
                raise ValueError("Threading layer is not initialized.")
            return name
        return f

    import numba.np.ufunc.parallel as parallel

    monkeypatch.setattr(parallel, "_launch_threads", lambda: None)  # the layer stays unknown
    for name, on_cpu, locked in (("omp", True, False), ("tbb", True, False), ("workqueue", True, True),
                                 (None, True, True), ("omp", False, True)):
        monkeypatch.setattr(numba, "threading_layer", layer(name))
        assert (runtime_lock(on_cpu) is RUNTIME_LOCK) == locked, (name, on_cpu)


def test_a_spawned_probe_is_the_in_process_probe(tmp_path):
    """With `spawn` (how a gate with hosts probes), each probe is a `kern run --probe-dir` run
    elsewhere: the same logits and token as the in-process probe, and this process builds no
    runtime, not even to warm; a run that fails is a ProbeError naming its exit code."""
    import subprocess
    import sys

    t = CONFIG.targets["toy-float"]
    ident = kern_run_identity(t.manifest, t.weights, "cpu")
    ran = []

    def spawn(argv, log):
        ran.append(argv)
        r = subprocess.run([sys.executable, "-m", "kern.cli", *argv], capture_output=True, text=True, timeout=120)
        log.write_text(r.stdout + r.stderr)
        return r.stdout + r.stderr, r.returncode

    ctx = list(b"The capital of France is")
    here = Prober(t.manifest, t.weights, "cpu", tmp_path / "here", ident).probe(ctx)
    p = Prober(t.manifest, t.weights, "cpu", tmp_path / "spawned", ident, spawn)
    p.warm()
    assert p.probe(ctx) == here and p.made == 1 and len(ran) == 1 and p._runtimes == {}
    assert p.probe(ctx) == here and len(ran) == 1  # the dump is read back, not made again

    def failing(argv, log):
        return "error: boom", 2

    bad = Prober(t.manifest, t.weights, "cpu", tmp_path / "bad", ident, failing)
    with pytest.raises(ProbeError, match="exited 2: error: boom"):
        bad.probe(ctx)

"""The vLLM toy (examples/vllm_toy): its reference is context-dependent as issue 39 asks (layer 2's K
and V at a position change with any earlier token; a wrong K changes what is read, so the answer), and
the plugin's model computes the reference's tokens through an attention with vLLM's interface (a plain
float32 softmax attention stands in for vLLM's; skipped where torch is not installed: vLLM's own run
is `e2e --engine vllm`, docs/results-measured.md)."""

from __future__ import annotations

import importlib.util
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent.parent / "examples" / "vllm_toy"


def _reference():
    spec = importlib.util.spec_from_file_location("vllm_toy_reference", HERE / "toy_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


R = _reference()


def _state(ids):
    pos = np.arange(len(ids))
    s = np.cumsum(R.h(ids, pos), axis=0)
    return s, *R.layer2(s, pos)


def test_the_paged_toy_reads_layer_1_alone_and_the_other_does_not():
    """A manifest saying paged (manifest-paged.json) gives the answer of layer 1's sums alone: a prompt
    whose prefix sums at its last position match another's answers alike there, while the two-layer toy,
    which reads layer 2 too, answers most prompts otherwise than the paged one."""
    rng = random.Random(5)
    differ = 0
    for _ in range(12):
        ids = [rng.randrange(256) for _ in range(rng.randrange(2, 60))]
        paged, full = R.generate(ids, 8, {"paged": True}), R.generate(ids, 8)
        differ += paged != full
        pos = np.arange(len(ids))
        S = np.cumsum(R.h(ids, pos), axis=0)
        assert (paged or [R.EOS])[0] == R.readout(S[-1], None, None, len(ids) - 1, paged=True)
    assert differ >= 10, differ


def test_layer2_entries_change_with_any_earlier_token():
    """Strength: for 300 random prompts and one changed earlier token each, the K bits and the V of
    every later position differ (K alone: 128 bits, V: 128 values below 16); position 0's K is all 0
    by design (every query reads it), its V still differs."""
    rng = random.Random(39)
    for _ in range(300):
        ids = [rng.randrange(256) for _ in range(rng.randrange(2, 60))]
        at = rng.randrange(len(ids) - 1)
        other = list(ids)
        other[at] = (ids[at] + rng.randrange(1, 256)) % 256
        _, k1, v1, _ = _state(ids)
        _, k2, v2, _ = _state(other)
        later = max(at, 1)
        assert (k1[later:] != k2[later:]).any(axis=1).all() and (v1[at:] != v2[at:]).any(axis=1).all()
        assert (k1[:at] == k2[:at]).all() and (v1[:at] == v2[:at]).all()


def test_position_zero_is_always_read_and_counts_the_reads():
    """Position 0's K is all 0 (every query reads it) and its V carries the marker whose mean is 1/n."""
    rng = random.Random(7)
    ids = [rng.randrange(256) for _ in range(50)]
    s, k, v, q = _state(ids)
    assert (k[0] == 0).all() and v[0, 0] == 1 and v[0, R.HEAD] == 1 and (v[1:, [0, R.HEAD]] == 0).all()
    T, n = R._read(k, v, q[-1])
    assert T[0] == 1 and T[R.HEAD] == 1 and (n >= 1).all() and (n <= len(ids)).all()


def test_a_wrong_k_changes_the_next_tokens():
    """Propagation through K: the K bits of one earlier block (16 positions) flipped, V kept: over 200
    prompts, the next 8 tokens change in all but a few (each query reads 2 of 64 bits per head)."""
    rng = random.Random(11)
    changed = 0
    for _ in range(200):
        ids = [rng.randrange(256) for _ in range(rng.randrange(40, 80))]
        s, k, v, q = _state(ids)
        bad = k.copy()
        bad[16:32] ^= 1
        bad[0] = 0
        outs = []
        for kk in (k, bad):
            T, n = R._read(kk, v, q[-1])
            outs.append(R.readout(s[-1], T, n, len(ids) - 1))
        changed += outs[0] != outs[1]
    assert changed >= 190, changed


def _model_with_plain_attention():
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (its venv: examples/vllm_toy/README.md)")
    sys.path.insert(0, str(HERE))
    import kern_vllm_toy.model as M

    class PlainAttention:
        """vLLM's Attention for one sequence fed in order: keys and values appended, causal softmax."""

        def __init__(self, num_heads, head_dim, scale, num_kv_heads, **_):
            self.h, self.d, self.s, self.kvh = num_heads, head_dim, scale, num_kv_heads
            self.K = torch.zeros(0, num_kv_heads, head_dim)
            self.V = torch.zeros(0, num_kv_heads, head_dim)
            self.kv_cache = None

        def __call__(self, q, k, v):
            n, start = q.shape[0], self.K.shape[0]
            self.K = torch.cat([self.K, k.reshape(n, self.kvh, self.d)])
            self.V = torch.cat([self.V, v.reshape(n, self.kvh, self.d)])
            q = q.reshape(n, self.h, self.d)
            out = torch.zeros(n, self.h, self.d)
            for r in range(n):
                for head in range(self.h):
                    g = head // (self.h // self.kvh)
                    w = torch.softmax((self.K[:start + r + 1, g] @ q[r, head]) * self.s, 0)
                    out[r, head] = w @ self.V[:start + r + 1, g]
            return out.reshape(n, self.h * self.d)

    M.Attention = PlainAttention
    hf = types.SimpleNamespace(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf), cache_config=None, quant_config=None)
    return torch, M, cfg


@pytest.mark.parametrize("paged", [False, True])
def test_the_plugins_model_computes_the_references_tokens(paged):
    """Both toys the plugin serves: the two-layer one, and with kern_paged in its config (model-paged/)
    the one whose answer reads layer 1 alone, as the reference computes it for a manifest saying paged."""
    torch, M, cfg = _model_with_plain_attention()
    cfg.model_config.hf_config.kern_paged = paged
    manifest = {"paged": True} if paged else None
    rng = random.Random(1)
    for _ in range(4):
        ids = [rng.randrange(256) for _ in range(rng.randrange(1, 80))]
        model = M.KernToyForCausalLM(vllm_config=cfg)
        nxt, p, out = int(model.forward(torch.tensor(ids), torch.arange(len(ids)))[-1, 0]), len(ids) - 1, []
        while len(out) < 40 and nxt != R.EOS:
            out.append(nxt)
            p += 1
            nxt = int(model.forward(torch.tensor([nxt]), torch.tensor([p]))[-1, 0])
        assert out == R.generate(ids, 40, manifest)
        assert model.max_err < 0.01


def test_with_eos_masked_the_plugins_logits_pick_the_references_eos_masked_token():
    """vLLM's min_tokens masks EOS in the logits; the token then chosen is EOS's runner-up, which the
    reference's `eos_masked` names (and which is the model's own token wherever that is not EOS)."""
    torch, M, cfg = _model_with_plain_attention()
    ids = [random.Random(7).randrange(256) for _ in range(400)]
    model = M.KernToyForCausalLM(vllm_config=cfg)
    logits = model.compute_logits(model.forward(torch.tensor(ids), torch.arange(len(ids))))
    top = logits.argmax(dim=1).tolist()
    logits[:, R.EOS] = float("-inf")
    masked = logits.argmax(dim=1).tolist()
    eos_rows = [i for i, t in enumerate(top) if t == R.EOS]
    assert eos_rows, "no position of this prompt is followed by EOS: pick another seed"
    for i in eos_rows + list(range(0, len(ids), 37)):
        assert masked[i] == R.eos_masked(ids[:i + 1]), i
        assert masked[i] == top[i] or top[i] == R.EOS

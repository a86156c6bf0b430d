"""KernToyForCausalLM for SGLang: the same arithmetic as examples/vllm_toy/kern_vllm_toy/model.py
(the vLLM plugin; exact reference: toy_reference.py), with SGLang's RadixAttention in place of vLLM's
Attention, so all context goes through SGLang's paged KV pool (and its radix prefix cache)."""

import logging
from collections.abc import Iterable

import torch
from torch import nn

from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.radix_attention import RadixAttention
# the toy's constants are the exact reference's (examples/vllm_toy/toy_reference.py, on serve.sh's PYTHONPATH)
from toy_reference import EOS, EOS_EVERY, HEAD, K_BIT, NV, P, VOCAB, K as _K

logger = logging.getLogger("kern_sgl_toy")

L = 1024.0
MARGIN = 0.25


def _constants():
    return {k: torch.from_numpy(v.copy()) if hasattr(v, "shape") else v for k, v in _K.items()}


class MarginExceeded(RuntimeError):
    pass


class _OneHotHead(nn.Module):
    """lm_head: hidden states are one-hot rows over the 257 ids, so logits = hidden @ I."""

    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.eye(VOCAB, dtype=torch.float32), persistent=False)


class KernToyForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size  # 256
        self.num_heads = config.num_attention_heads  # 4
        self.num_kv_heads = config.num_key_value_heads  # 2
        self.head_dim = config.head_dim  # 64
        assert self.num_kv_heads * self.head_dim == NV and self.head_dim == HEAD
        self.group = self.num_heads // self.num_kv_heads
        for name, value in _constants().items():
            if isinstance(value, torch.Tensor):
                self.register_buffer(name, value, persistent=False)
            else:
                setattr(self, name, value)
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads,
                                   layer_id=0, prefix=f"{prefix}model.layers.0.self_attn.attn")
        self.attn2 = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads,
                                    layer_id=1, prefix=f"{prefix}model.layers.1.self_attn.attn")
        self.lm_head = _OneHotHead()
        self.logits_processor = LogitsProcessor(config)
        self.max_err = 0.0

    def _per_kv_head(self, o, n):
        return o.reshape(n, self.num_heads, self.head_dim)[:, :: self.group, :].reshape(n, NV)

    def _check(self, err, what):
        e = float(err.max()) if err.numel() else 0.0
        if e >= MARGIN:
            raise MarginExceeded(f"kern toy: {what} is {e:.3g} from its integer (margin {MARGIN})")
        return e

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, input_embeds=None, get_embedding=False, **kw):
        n = positions.shape[0]
        dev = positions.device
        t1 = input_ids.to(torch.int64).reshape(n, 1) + 1
        p1 = positions.to(torch.int64).reshape(n, 1) + 1
        v = (((t1 * self.A + p1 * self.B + (t1 * p1) * self.C) % P) % 16).to(torch.float32)
        zero = torch.zeros(n, NV, dtype=torch.float32, device=dev)
        q0 = torch.zeros(n, self.hidden_size, dtype=torch.float32, device=dev)
        o1 = self._per_kv_head(self.attn(q0, zero, v, forward_batch), n)
        s_f = o1 * p1.to(torch.float32)
        S = torch.round(s_f).to(torch.int64)
        e1 = self._check((s_f - S).abs(), "layer 1's sum")
        first = positions.reshape(n) == 0
        k2 = (((S @ self.Wk.T + p1 * self.Yk) % P) >> K_BIT) & 1
        v2 = ((S @ self.Wv.T + p1 * self.Yv) % P) % 16
        dims = ((S @ self.Wq.T + p1 * self.Yq) % P) % HEAD
        k2[first] = 0
        v2[:, 0] = first.to(torch.int64)
        v2[:, HEAD] = first.to(torch.int64)
        q2 = torch.zeros(n, self.num_kv_heads, HEAD, dtype=torch.float32, device=dev)
        for g in range(self.num_kv_heads):
            for c in (2 * g, 2 * g + 1):
                q2[torch.arange(n, device=dev), g, dims[:, c]] = -L
        q2 = q2.repeat_interleave(self.group, dim=1).reshape(n, self.hidden_size)
        o2 = self._per_kv_head(self.attn2(q2, k2.to(torch.float32), v2.to(torch.float32), forward_batch), n)
        inv = 1.0 / o2[:, [0, HEAD]]
        cnt = torch.round(inv)
        e2 = self._check((inv - cnt).abs(), "layer 2's count")
        t_f = o2 * cnt.repeat_interleave(HEAD, dim=1)
        T = torch.round(t_f)
        e3 = self._check((t_f - T).abs(), "layer 2's sum")
        z = ((S * self.D).sum(dim=1) + (T.to(torch.int64) * self.D2).sum(dim=1)
             + (cnt.to(torch.int64) * self.E2).sum(dim=1) + p1.reshape(n) * self.E) % P
        nxt = torch.where((z // VOCAB) % EOS_EVERY == 0, torch.full_like(z, EOS), z % 256)
        e = max(e1, e2, e3)
        if e > self.max_err:
            self.max_err = e
            logger.info("kern toy: new max float error of a rounded value = %.3g", e)
        hidden = torch.zeros(n, VOCAB, dtype=torch.float32, device=dev)
        hidden[torch.arange(n, device=dev), nxt] = 1.0
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        for _ in weights:
            pass


EntryClass = KernToyForCausalLM

"""KernToyForCausalLM: a parameter-free vLLM model whose greedy tokens are exactly
predictable in pure Python (see ../toy_reference.py), while still routing all
context through vLLM's paged KV cache via vLLM's own `Attention` layer.

Per token t at absolute position p:
  V[j] = h(t, p, j) = (((t+1)*A_j + (p+1)*B_j + (t+1)*(p+1)*C_j) mod P) mod 16,  j < 128
  K = 0, Q = 0  ->  uniform causal attention: o[j] = mean_{i<=p} V_i[j]
  S_j = round(o[j] * (p+1)) = sum_{i<=p} h(t_i, i, j)
  z = (sum_j S_j*D_j + (p+1)*E) mod P
  next = 256 (EOS) if (z // 257) % 96 == 0 else z % 256
"""

import os
from collections.abc import Iterable

import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.attention import Attention

logger = init_logger("vllm.kern_vllm_toy")  # under vllm's configured logger

P = 2**31 - 1
NV = 128  # 2 KV heads x 64
EOS = 256
VOCAB = 257
EOS_EVERY = 96


def _constants():
    """Same generator as toy_reference._constants (64-bit LCG, pure Python)."""
    x = 0x4B45524E  # "KERN"
    out = []
    for _ in range(3 * NV + NV + 1):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((x >> 33) % P)
    A, B, C = out[0:NV], out[NV:2 * NV], out[2 * NV:3 * NV]
    D, E = out[3 * NV:4 * NV], out[4 * NV]
    return A, B, C, D, E


class KernToyForCausalLM(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.hidden_size = config.hidden_size  # 256
        self.num_heads = config.num_attention_heads  # 4
        self.num_kv_heads = config.num_key_value_heads  # 2
        self.head_dim = config.head_dim  # 64
        assert self.num_kv_heads * self.head_dim == NV
        assert self.num_heads * self.head_dim == self.hidden_size
        self.group = self.num_heads // self.num_kv_heads
        A, B, C, D, E = _constants()
        self.register_buffer("A", torch.tensor(A, dtype=torch.int64), persistent=False)
        self.register_buffer("B", torch.tensor(B, dtype=torch.int64), persistent=False)
        self.register_buffer("C", torch.tensor(C, dtype=torch.int64), persistent=False)
        self.register_buffer("D", torch.tensor(D, dtype=torch.int64), persistent=False)
        self.E = E
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=vllm_config.cache_config,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.model.layers.0.self_attn.attn" if prefix
            else "model.layers.0.self_attn.attn",
        )
        self.max_err = 0.0
        # Negative control only: KERN_TOY_FAULT=N corrupts (V += 1) one whole KV-cache
        # block every N-th forward call, to show the check catches a bad cache block.
        self.fault_every = int(os.environ.get("KERN_TOY_FAULT", "0") or 0)
        self.calls = 0

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(
            input_ids.shape[0], self.hidden_size, dtype=torch.float32,
            device=input_ids.device,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds=None,
    ) -> torch.Tensor:
        n = positions.shape[0]
        t1 = input_ids.to(torch.int64).reshape(n, 1) + 1
        p1 = positions.to(torch.int64).reshape(n, 1) + 1
        h = ((t1 * self.A + p1 * self.B + (t1 * p1) * self.C) % P) % 16  # [n,128]
        v = h.to(torch.float32)
        q = torch.zeros(n, self.num_heads * self.head_dim, dtype=torch.float32,
                        device=v.device)
        k = torch.zeros(n, NV, dtype=torch.float32, device=v.device)
        o = self.attn(q, k, v)  # [n, num_heads*head_dim]
        if self.fault_every:
            self._inject_fault()
        o = o.view(n, self.num_heads, self.head_dim)
        # one query head per KV head (GQA: q head g*group .. uses kv head g)
        o = o[:, :: self.group, :].reshape(n, NV)
        s_f = o * p1.to(torch.float32)
        s = torch.round(s_f)
        err = (s_f - s).abs().amax(dim=1) if n else s_f.new_zeros(0)
        if n:
            e = float(err.max())
            if e > self.max_err:
                # float error of the attention kernel; must stay < 0.5 for exactness
                if e > 1.25 * self.max_err or e > 0.05:
                    logger.info("kern toy: new max |o*(p+1) - round(.)| = %.3g", e)
                self.max_err = e
        z = ((s.to(torch.int64) * self.D).sum(dim=1) + p1.reshape(n) * self.E) % P
        nxt = torch.where((z // VOCAB) % EOS_EVERY == 0,
                          torch.full_like(z, EOS), z % 256)
        hidden = torch.zeros(n, self.hidden_size, dtype=torch.float32, device=v.device)
        hidden[:, 0] = nxt.to(torch.float32)
        hidden[:, 1] = err
        return hidden

    def _inject_fault(self):
        self.calls += 1
        kv = self.attn.kv_cache
        if isinstance(kv, (list, tuple)):
            kv = kv[0] if kv else None
        if kv is None or kv.numel() == 0 or self.calls % self.fault_every:
            return
        # CPU_ATTN cache seen on vLLM 0.32 CPU: [blocks, kv_heads, block_size, 2*head_dim]
        # (K and V side by side); other layouts put K/V first: [2, blocks, ...].
        kv_first = kv.shape[0] == 2 and kv.dim() == 5
        nb = kv.shape[1] if kv_first else kv.shape[0]
        blk = (self.calls // self.fault_every) % nb
        if self.calls == self.fault_every:
            logger.warning("kern toy: FAULT INJECTION on, kv_cache shape %s", tuple(kv.shape))
        if kv_first:
            kv[1, blk] += 1.0
        else:
            kv[blk] += 1.0  # K and V of one block; only the V half changes the answer

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        n = hidden_states.shape[0]
        nxt = hidden_states[:, 0].round().to(torch.int64).clamp(0, VOCAB - 1)
        if n and float(hidden_states[:, 1].max()) > 0.25:
            logger.warning("kern toy: sampled row has |o*(p+1) - round| = %.4f",
                           float(hidden_states[:, 1].max()))
        logits = torch.full((n, VOCAB), -1e4, dtype=torch.float32,
                            device=hidden_states.device)
        logits.scatter_(1, nxt.reshape(n, 1), 0.0)
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        for _ in weights:
            pass
        return set()

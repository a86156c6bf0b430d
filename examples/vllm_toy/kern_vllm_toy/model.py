"""KernToyForCausalLM: a parameter-free vLLM model whose greedy tokens are exactly
predictable in integer arithmetic (see ../toy_reference.py), while routing all context
through vLLM's paged KV cache via two of vLLM's own `Attention` layers. Layer 2's K and V
are functions of the whole prefix, and its K decides what each position reads, so a cache
block reused under the wrong prefix, or with a wrong K, changes the answer.

Per token t at absolute position p:
  layer 1: V[j] = h(t, p, j) = (((t+1)*A_j + (p+1)*B_j + (t+1)*(p+1)*C_j) mod P) mod 16,  j < 128
           K = 0, Q = 0  ->  uniform causal attention: o[j] = mean_{i<=p} V_i[j]
           S_j = round(o[j] * (p+1)) = sum_{i<=p} h(t_i, i, j)       (the whole prefix's sum)
  layer 2, per KV head g (64 dims):
           K[d] = bit 7 of ((S . Wk_d + (p+1)*Yk_d) mod P), all 0 at p = 0
           V[d] = ((S . Wv_d + (p+1)*Yv_d) mod P) mod 16, but V[0] = [p == 0]
           Q = -L at the query's two dims d1, d2 = ((S . Wq + (p+1)*Yq) mod P) mod 64, else 0
           scores -L/8 per key bit set at d1 or d2: a key with one is weighted exp(-128) = 0 in
           float32, so o = the mean of V over the n keys with neither (position 0 always one):
           n = round(1 / o[0]), T[d] = round(o[d] * n) = their V's sum
  z = (S . D + T . D2 + n . E2 + (p+1)*E) mod P     (kern_paged in the config: z = (S . D + (p+1)*E) mod P,
                                                    layer 1 alone: each cached entry a function of (token, position))
  next = 256 (EOS) if (z // 257) % 96 == 0 else z % 256
  logits: 0 at next, -1 at z % 256 when next is EOS (what it emits with EOS masked: vLLM's min_tokens),
  -1e4 elsewhere

Exact by construction: every rounded float32 value is a sum of at most max_model_len integers
below 16 (or 1 / n, n <= max_model_len), within 0.01 of its integer at 1,024 tokens; the model
refuses to go on (raises) when any is 0.25 or more from it (`MARGIN`), rather than answer wrongly.
Integer parts are int64 with no overflow: S < 2^14 at 1,024 tokens, S . W < 2^52.
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
HEAD = 64
K_BIT = 7
L = 1024.0  # layer 2's query weight: a key bit at d1 or d2 scores -L / sqrt(64) = -128
MARGIN = 0.25  # the most a rounded value may be from its integer before the model refuses


def _constants():
    """Same generator and order as toy_reference._constants (64-bit LCG, pure Python)."""
    x = 0x4B45524E  # "KERN"

    def take(n):
        nonlocal x
        out = []
        for _ in range(n):
            x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            out.append((x >> 33) % P)
        return out

    A, B, C, D = take(NV), take(NV), take(NV), take(NV)
    E = take(1)[0]
    Wv, Yv = take(NV * NV), take(NV)
    Wk, Yk = take(NV * NV), take(NV)
    Wq, Yq = take(4 * NV), take(4)
    D2, E2 = take(NV), take(2)
    t = lambda v, *shape: torch.tensor(v, dtype=torch.int64).reshape(*shape) if shape else torch.tensor(v, dtype=torch.int64)
    return dict(A=t(A), B=t(B), C=t(C), D=t(D), E=E, Wv=t(Wv, NV, NV), Yv=t(Yv), Wk=t(Wk, NV, NV), Yk=t(Yk),
                Wq=t(Wq, 4, NV), Yq=t(Yq), D2=t(D2), E2=t(E2))


class MarginExceeded(RuntimeError):
    """A float32 attention output too far from the integer it stands for: the answer would not be exact."""


class KernToyForCausalLM(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.hidden_size = config.hidden_size  # 256
        self.num_heads = config.num_attention_heads  # 4
        self.num_kv_heads = config.num_key_value_heads  # 2
        self.head_dim = config.head_dim  # 64
        assert self.num_kv_heads * self.head_dim == NV and self.head_dim == HEAD
        assert self.num_heads * self.head_dim == self.hidden_size
        self.group = self.num_heads // self.num_kv_heads
        # kern_paged (model-paged/config.json): the answer reads layer 1 alone, whose cached entries are
        # functions of (token, position): a block reused under the wrong prefix still answers right, as on
        # kern's toy-paged (layer 2 still runs, its cache kept, its output unread)
        self.paged = bool(getattr(config, "kern_paged", False))
        for name, value in _constants().items():
            if isinstance(value, torch.Tensor):
                self.register_buffer(name, value, persistent=False)
            else:
                setattr(self, name, value)
        base = f"{prefix}.model.layers" if prefix else "model.layers"
        self.attn, self.attn2 = (
            Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, num_kv_heads=self.num_kv_heads,
                      cache_config=vllm_config.cache_config, quant_config=vllm_config.quant_config,
                      prefix=f"{base}.{i}.self_attn.attn")
            for i in range(2))
        self.max_err = 0.0
        # Negative control only: KERN_TOY_FAULT=N corrupts (+= 1) one whole block of layer 2's
        # KV cache every N-th forward call (KERN_TOY_FAULT_HALF=k: its K only, v: its V only),
        # to show the gate catches a bad cache block, and that K is read.
        self.fault_every = int(os.environ.get("KERN_TOY_FAULT", "0") or 0)
        self.fault_half = os.environ.get("KERN_TOY_FAULT_HALF", "").strip().lower()
        if self.fault_half not in ("", "k", "v"):
            raise ValueError(f"KERN_TOY_FAULT_HALF={self.fault_half!r}: want k, v or nothing (both)")
        self.calls = 0

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(
            input_ids.shape[0], self.hidden_size, dtype=torch.float32,
            device=input_ids.device,
        )

    def _per_kv_head(self, o: torch.Tensor, n: int) -> torch.Tensor:
        """One query head per KV head (GQA: q head g*group .. reads kv head g): [n, 128]."""
        return o.view(n, self.num_heads, self.head_dim)[:, :: self.group, :].reshape(n, NV)

    def _check(self, err: torch.Tensor, what: str) -> float:
        e = float(err.max()) if err.numel() else 0.0
        if e >= MARGIN:
            raise MarginExceeded(f"kern toy: {what} is {e:.3g} from its integer (the margin is {MARGIN}): "
                                 "the answer would not be exact, so the model refuses to go on")
        return e

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds=None,
    ) -> torch.Tensor:
        n = positions.shape[0]
        dev = positions.device
        t1 = input_ids.to(torch.int64).reshape(n, 1) + 1
        p1 = positions.to(torch.int64).reshape(n, 1) + 1
        # layer 1: the uniform causal mean of h, times p + 1: the prefix's sum S
        v = (((t1 * self.A + p1 * self.B + (t1 * p1) * self.C) % P) % 16).to(torch.float32)
        zero = torch.zeros(n, NV, dtype=torch.float32, device=dev)
        o1 = self._per_kv_head(self.attn(torch.zeros(n, self.hidden_size, device=dev), zero, v), n)
        s_f = o1 * p1.to(torch.float32)
        S = torch.round(s_f).to(torch.int64)
        e1 = self._check((s_f - S).abs(), "layer 1's sum")
        # layer 2: K bits, V and the query's two dims from S; position 0's K all 0, its V[0] the marker
        first = positions.reshape(n) == 0
        k2 = (((S @ self.Wk.T + p1 * self.Yk) % P) >> K_BIT) & 1
        v2 = ((S @ self.Wv.T + p1 * self.Yv) % P) % 16
        dims = ((S @ self.Wq.T + p1 * self.Yq) % P) % HEAD  # [n, 4]: head g's d1, d2 at 2g, 2g + 1
        k2[first] = 0
        v2[:, 0] = first.to(torch.int64)
        v2[:, HEAD] = first.to(torch.int64)
        q2 = torch.zeros(n, self.num_kv_heads, HEAD, dtype=torch.float32, device=dev)
        for g in range(self.num_kv_heads):
            for c in (2 * g, 2 * g + 1):
                q2[torch.arange(n, device=dev), g, dims[:, c]] = -L
        q2 = q2.repeat_interleave(self.group, dim=1).reshape(n, self.hidden_size)
        if self.fault_every:
            self._inject_fault()
        o2 = self._per_kv_head(self.attn2(q2, k2.to(torch.float32), v2.to(torch.float32)), n)
        inv = 1.0 / o2[:, [0, HEAD]]  # [n, 2]: each head's count of keys read
        cnt = torch.round(inv)
        e2 = self._check((inv - cnt).abs(), "layer 2's count")
        t_f = o2 * cnt.repeat_interleave(HEAD, dim=1)
        T = torch.round(t_f)
        e3 = self._check((t_f - T).abs(), "layer 2's sum")
        z = ((S * self.D).sum(dim=1) + (T.to(torch.int64) * self.D2).sum(dim=1)
             + (cnt.to(torch.int64) * self.E2).sum(dim=1) + p1.reshape(n) * self.E) % P
        if self.paged:
            z = ((S * self.D).sum(dim=1) + p1.reshape(n) * self.E) % P
        nxt = torch.where((z // VOCAB) % EOS_EVERY == 0, torch.full_like(z, EOS), z % 256)
        e = max(e1, e2, e3)
        if e > self.max_err:
            if e > 1.25 * self.max_err or e > 0.05:
                logger.info("kern toy: new max float error of a rounded value = %.3g", e)
            self.max_err = e
        hidden = torch.zeros(n, self.hidden_size, dtype=torch.float32, device=dev)
        hidden[:, 0] = nxt.to(torch.float32)
        hidden[:, 1] = (z % 256).to(torch.float32)  # the second choice: what it emits with EOS masked
        return hidden

    def _inject_fault(self):
        self.calls += 1
        kv = self.attn2.kv_cache
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
            logger.warning("kern toy: FAULT INJECTION on (%s), kv_cache shape %s",
                           self.fault_half or "k and v", tuple(kv.shape))
        halves = {"k": [0], "v": [1], "": [0, 1]}[self.fault_half]
        for h in halves:
            if kv_first:
                kv[h, blk] += 1.0
            else:
                kv[blk, ..., h * self.head_dim:(h + 1) * self.head_dim] += 1.0

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        n = hidden_states.shape[0]
        nxt = hidden_states[:, 0].round().to(torch.int64).clamp(0, VOCAB - 1)
        logits = torch.full((n, VOCAB), -1e4, dtype=torch.float32,
                            device=hidden_states.device)
        second = hidden_states[:, 1].round().to(torch.int64).clamp(0, 255)
        # EOS's runner-up is z % 256, so a sampler that masks EOS (min_tokens) emits it, not a tie
        logits.scatter_(1, second.reshape(n, 1), torch.where(nxt == EOS, -1.0, -1e4).reshape(n, 1))
        logits.scatter_(1, nxt.reshape(n, 1), 0.0)
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        for _ in weights:
            pass
        return set()

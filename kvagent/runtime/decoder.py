"""The model as kvagent runs it: the Llama family's layers written once, over the model's own
weights, in two entry points. `forward` is the eager forward of a packed row (forward.py: prefill
chunks, tool outputs, re-prefill rebuilds, decode tokens the static step does not take), attending
through the sessions' caches as transformers' attention hook would. `__call__` is the static decode
step: one token for each of B rows, against the slabs of B consecutive slots of a pool block
(pool.py). One model path: transformers' modules run only for architectures this file does not
know (`decoder_for` is None), and the oracle (oracle.py) runs them as the independent reference.

Every shape in the static step is fixed by (B, the pool's capacities): a row's key length is not
one of them. Each row's new K/V and position are written at its layer's entry count `lens[l, row]`
(an index tensor), its queries at `ridx[row]` of the window ring, and attention covers a slot's
whole capacity under the mask `positions >= 0` (the slab keeps -1 past the live entries, and
ragged heads start with -1). A row that carries no session writes to the scratch column (index C_l,
W) with position -1 and its output is ignored. So the same ops run every step, nothing reads a
value back to the host, and the step can be compiled once (torch.compile, fullgraph) or captured
once per batch size (a CUDA graph) and replayed.

The layers are the Llama family's (Llama, Mistral, Qwen2, Qwen3: pre-norm, RoPE, GQA, SiLU-gated
MLP; Qwen3's per-head q/k norms), computed as transformers' modules compute them. q/k/v and gate/up
are fused at load: one matmul each, with the original modules' weights rebound to views of the
fused ones, so fusing holds no weight twice. On a CPU both entry points read oneDNN-packed copies
besides (linear.py; `packed` makes the twin). RMSNorm, RoPE and the gated activation are small
functions of their own: `compile_parts` compiles each for the captured CUDA step (step.py), so each
runs as one kernel instead of five to eight; a kernel in a graph costs GPU time even with no launch.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from kvagent.runtime import attention_step

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class LayerWeights:
    ln1: torch.Tensor
    qkv: torch.Tensor  # (H_q D + 2 H_kv D, hidden)
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # Qwen3: RMSNorm over each head's D
    k_norm: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    ln2: torch.Tensor
    gate_up: torch.Tensor  # (2 I, hidden)
    down: torch.Tensor


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm, op for op: float32 statistics, the weight applied in x's dtype."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def gated(gate_up: torch.Tensor, act) -> torch.Tensor:
    """act(gate) * up of the fused gate/up projection's output."""
    gate, up = gate_up.chunk(2, dim=-1)
    return act(gate) * up


def _fuse(modules, name: str = "weight") -> torch.Tensor | None:
    """One tensor holding the modules' `name` row after row; each module's parameter becomes a view
    of its rows (same values, so anything still calling the module computes as before)."""
    parts = [getattr(m, name) for m in modules]
    if any(p is None for p in parts):
        return None
    fused = torch.cat([p.detach() for p in parts])
    row = 0
    for m, p in zip(modules, parts, strict=True):
        n = p.shape[0]
        getattr(m, name).data = fused[row : row + n]
        row += n
    return fused


class Decoder:
    """The model's weights as kvagent reads them: the eager forward (`forward`) and the static step
    (`__call__`)."""

    def __init__(self, model, scaling: float) -> None:
        cfg = model.config
        inner = model.model
        self.hidden = int(cfg.hidden_size)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or self.hidden // self.n_heads)
        self.eps = float(cfg.rms_norm_eps)
        self.scaling = scaling
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        self.lm_head = model.lm_head.weight
        self.rotary = inner.rotary_emb
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_mods = (attn.q_proj, attn.k_proj, attn.v_proj)
            self.layers.append(
                LayerWeights(
                    ln1=layer.input_layernorm.weight,
                    qkv=_fuse(qkv_mods),
                    qkv_bias=_fuse(qkv_mods, "bias"),
                    q_norm=attn.q_norm.weight if hasattr(attn, "q_norm") else None,
                    k_norm=attn.k_norm.weight if hasattr(attn, "k_norm") else None,
                    o=attn.o_proj.weight,
                    o_bias=attn.o_proj.bias,
                    ln2=layer.post_attention_layernorm.weight,
                    gate_up=_fuse((mlp.gate_proj, mlp.up_proj)),
                    down=mlp.down_proj.weight,
                )
            )
        self.act = inner.layers[0].mlp.act_fn
        self.rms_norm, self.rope, self.gated = rms_norm, rope, gated
        self.linear = F.linear
        self.parts_compiled = False
        self.split_parts = None  # the split attention's softmax and merge, once compiled
        self.set_attention("auto", model.device)

    def packed(self, packs) -> Decoder:
        """The same step over oneDNN-packed weights (linear.py's `Packs`), as the packed modules'
        eager forward computes: a twin sharing everything else with this decoder."""
        from kvagent.runtime import linear

        twin = copy.copy(self)
        twin.layers = [
            replace(w, qkv=packs(w.qkv), o=packs(w.o), gate_up=packs(w.gate_up), down=packs(w.down))
            for w in self.layers
        ]
        twin.lm_head, twin.linear = packs(self.lm_head), linear.linear
        return twin

    def compile_parts(self) -> None:
        """Compile RMSNorm, RoPE, the gated activation and the split attention's softmax and merge on
        first use (step.py's warm-up call, before
        a CUDA graph captures them). Shapes left to torch.compile's default: a second batch size
        recompiles with a dynamic batch dimension, so a third compiles nothing."""
        if self.parts_compiled:
            return
        opts = dict(fullgraph=True)
        self.rms_norm = torch.compile(rms_norm, **opts)
        self.rope = torch.compile(rope, **opts)
        self.gated = torch.compile(gated, **opts)
        self.split_parts = (
            torch.compile(attention_step.masked_softmax, **opts),
            torch.compile(attention_step.merge, **opts),
        )
        self.parts_compiled = True

    def set_attention(self, backend: str, device: torch.device, kv_chunk: int | None = None) -> None:
        """The step's attention (attention_step.py): `split` or `sdpa`; `auto` is split on CUDA and
        sdpa on a CPU (docs/architecture.md: what each measured). `kv_chunk`: keys per split."""
        self.attention = attention_step.resolve(backend, device)
        self.kv_chunk = kv_chunk or attention_step.KV_CHUNK
        self.wide_scores = attention_step.wide_scores_supported(device, self.embed.dtype)

    def attend(self, q, keys, values, valid) -> torch.Tensor:
        if self.attention == "sdpa":
            return attention_step.masked_sdpa(q, keys, values, valid, self.scaling)
        return attention_step.split_kv(
            q, keys, values, valid, self.scaling, self.kv_chunk, self.wide_scores, self.split_parts
        )

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(x, weight, self.eps)

    def __call__(self, ids, pos, wpos, lens, ridx, keys, values, positions, ring) -> torch.Tensor:
        """(B, vocab) float32 logits. ids, pos (B,): the token and its logical position (RoPE);
        wpos (B,): the position recorded in the slab (-1 for an empty row); lens (L, B): where
        each row writes in each layer; ridx (B,): where its queries go in the ring. keys, values,
        positions: per layer the B slots' slabs (B, H_kv, W_l, ...); ring (B, L, H_q, W + 1, D)."""
        b = ids.shape[0]
        h_q, h_kv, d = self.n_heads, self.n_kv_heads, self.head_dim
        group = h_q // h_kv
        q_size, kv_size = h_q * d, h_kv * d
        rows = torch.arange(b, device=ids.device)[:, None]
        kv_heads = torch.arange(h_kv, device=ids.device)[None, :]
        q_heads = torch.arange(h_q, device=ids.device)[None, :]
        hidden = F.embedding(ids, self.embed)
        cos, sin = self.rotary(hidden, pos[None])
        cos, sin = cos[0, :, None], sin[0, :, None]  # (B, 1, D)
        written = wpos[:, None].expand(b, h_kv)
        for li, w in enumerate(self.layers):
            x = self._rms(hidden, w.ln1)
            q, k, v = self.linear(x, w.qkv, w.qkv_bias).split((q_size, kv_size, kv_size), dim=-1)
            q, k, v = q.view(b, h_q, d), k.view(b, h_kv, d), v.view(b, h_kv, d)
            if w.q_norm is not None:
                q, k = self._rms(q, w.q_norm), self._rms(k, w.k_norm)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            at = lens[li][:, None]
            keys[li].index_put_((rows, kv_heads, at), k)
            values[li].index_put_((rows, kv_heads, at), v)
            positions[li].index_put_((rows, kv_heads, at), written)
            ring[:, li].index_put_((rows, q_heads, ridx[:, None]), q)
            # The whole slab: live entries, then -1 (past them, the scratch column, padding).
            valid = (positions[li] >= 0).unsqueeze(2)  # (B, H_kv, 1, W)
            out = self.attend(q.view(b, h_kv, group, d), keys[li], values[li], valid)
            hidden = hidden + self.linear(out.reshape(b, q_size), w.o, w.o_bias)
            x = self._rms(hidden, w.ln2)
            hidden = hidden + self.linear(self.gated(self.linear(x, w.gate_up), self.act), w.down)
        return self.linear(self._rms(hidden, self.norm), self.lm_head).float()

    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor, cache, keep) -> torch.Tensor:
        """The eager forward of a packed row (forward.py): (1, T) ids at (1, T) logical positions,
        computed as transformers' modules compute them, with the sessions' caches behind `cache`
        (a `PackedCache`: its `update` writes each chunk's K/V, `record_queries` hands the policies
        their queries, `attend` attends each session as the attention hook would). (1, rows, vocab)
        logits of the rows `keep` names: an int n, the last n (0: all), or a tensor of indices. Its
        norms, RoPE and activation stay uncompiled (`compile_parts` is for the step's fixed shapes;
        a prefill's length varies)."""
        t, eps = ids.shape[1], self.eps
        h_q, h_kv, d = self.n_heads, self.n_kv_heads, self.head_dim
        q_size, kv_size = h_q * d, h_kv * d
        hidden = F.embedding(ids, self.embed)
        cos, sin = self.rotary(hidden, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (1, 1, T, D): over the heads
        for li, w in enumerate(self.layers):
            x = rms_norm(hidden, w.ln1, eps)
            q, k, v = self.linear(x, w.qkv, w.qkv_bias).split((q_size, kv_size, kv_size), dim=-1)
            q, k, v = q.view(1, t, h_q, d), k.view(1, t, h_kv, d), v.view(1, t, h_kv, d)
            if w.q_norm is not None:
                q, k = rms_norm(q, w.q_norm, eps), rms_norm(k, w.k_norm, eps)
            q, k = rope(q.transpose(1, 2), cos, sin), rope(k.transpose(1, 2), cos, sin)
            key, value = cache.update(k, v.transpose(1, 2), li)
            cache.record_queries(li, q)
            out = cache.attend(li, q, key, value, self.scaling)  # (1, T, H_q, D)
            hidden = hidden + self.linear(out.reshape(1, t, q_size), w.o, w.o_bias)
            x = rms_norm(hidden, w.ln2, eps)
            hidden = hidden + self.linear(gated(self.linear(x, w.gate_up), self.act), w.down)
        if not isinstance(keep, int) or keep:  # 0: every row
            hidden = hidden[:, -keep:] if isinstance(keep, int) else hidden[:, keep]
        return self.linear(rms_norm(hidden, self.norm, eps), self.lm_head)


def decoder_for(model, scaling: float) -> Decoder | None:
    """The decoder of `model`, or None where its architecture is not the Llama family's (then
    transformers' modules run every forward, and decode has no static step)."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED:
        return None
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return None  # sliding-window layers: kvagent attention refuses them anyway
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return None
    return Decoder(model, scaling)

"""A lean decode step for Qwen2- and Llama-shaped Hugging Face models, on a static KV cache.

A Hugging Face decode step dispatches ~160 aten operations per layer (module calls, cache
bookkeeping, mask building, views); on a GPU each is a kernel launch, so a step is launch-bound long
before it is bound by reading the weights (issue 38). `LeanDecoder.step` computes the same layer
arithmetic (RMSNorm in float32, RoPE, grouped-query SDPA, SiLU MLP) in ~40 operations per layer, on
the model's own parameter tensors (no copy: `bind` takes transposed views, and is called again after
every weight load), with only static shapes, so a step can be captured as one CUDA graph
(engines/graphs.py). Its logits equal the model's own forward up to float noise of the kernels.

The KV cache (`StaticKV`) is preallocated: per layer keys and values [S, H_kv, T, d] (a slot per
row, a column per position); a row's prompt occupies columns 0..L-1 of its slot and its generated
tokens follow. A step writes each row's new key/value at its position and attends over columns
0..Tb-1 of slots 0..B-1 (a bucket: `Bucket`), an additive bias [S, 1, 1, T] (0 where a row reads,
-inf where not) masking what a row does not own.

Grouped-query attention without a repeat: a row's H query heads are laid out as [H_kv, n_rep] (HF's
head order, h = kv * n_rep + r) and given to SDPA as n_rep query positions per key head, so the keys
are read once per key head.

Supported: Qwen2 and Llama configurations with SiLU MLPs, full attention (no sliding window) and a
static RoPE (default, linear, llama3, yarn). `lean_support` says why a model is not; the engine then
keeps its Hugging Face path. A linear layer with forward hooks (a LoRA adapter: model/lora.py) is
called as its module, so the hook applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

FAMILIES = ("qwen2", "llama")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def lean_support(model: torch.nn.Module) -> tuple[bool, str]:
    """(supported, why) for `LeanDecoder` on `model`."""
    config: Any = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return False, f"model type {kind!r} (the lean decoder knows {', '.join(FAMILIES)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return False, f"activation {config.hidden_act!r} (the lean decoder knows silu)"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return False, "sliding-window attention"
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return False, "sliding-window attention layers"
    if getattr(config, "pretraining_tp", 1) != 1:
        return False, "pretraining_tp > 1"
    inner = getattr(model, "model", None)
    rope = getattr(getattr(inner, "rotary_emb", None), "rope_type", None)
    if rope not in ROPE_TYPES:
        return False, f"rope type {rope!r} (the lean decoder knows {', '.join(ROPE_TYPES)})"
    return True, f"{kind}: lean static-cache decode"


class Proj:
    """One linear layer as the step computes it: x [B, in] -> [B, out] with a single addmm/mm on
    the weight's transposed view; a layer with forward hooks (LoRA) is called as its module."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.hooked = bool(getattr(module, "_forward_hooks", None))
        self.wt: torch.Tensor = module.weight.t()  # [in, out], a view of the parameter
        self.bias: torch.Tensor | None = module.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.hooked:
            return self.module(x)  # type: ignore[no-any-return]
        if self.bias is not None:
            return torch.addmm(self.bias, x, self.wt)
        return torch.mm(x, self.wt)

    def key(self) -> tuple[int, ...]:
        """What a captured graph reads of this layer: its tensors' storage (hooks: see LeanDecoder.hooked)."""
        return (self.wt.data_ptr(), self.bias.data_ptr() if self.bias is not None else 0, int(self.hooked))


@dataclass
class Layer:
    ln1: torch.Tensor
    eps1: float
    q: Proj
    k: Proj
    v: Proj
    o: Proj
    ln2: torch.Tensor
    eps2: float
    gate: Proj
    up: Proj
    down: Proj


@dataclass
class Bucket:
    """The views one step shape reads: slots 0..B-1, columns 0..Tb-1 (static for a captured graph)."""

    rows: int
    width: int
    keys: list[torch.Tensor]  # per layer [B, H_kv, Tb, d]
    values: list[torch.Tensor]
    bias: torch.Tensor  # [B, Tb]: 0 where a row reads, -inf where not
    mask: torch.Tensor  # the same, [B, 1, 1, Tb] (SDPA's additive mask)
    zero: torch.Tensor  # a 0-d zero of the bias's dtype
    slot: torch.Tensor  # [B]: 0..B-1
    slot_col: torch.Tensor  # [B, 1]: the same
    head_row: torch.Tensor  # [1, H_kv]


class StaticKV:
    """Preallocated keys/values for `slots` rows of `width` positions each (see module docstring)."""

    def __init__(self, layers: int, slots: int, kv_heads: int, width: int, head_dim: int, like: torch.Tensor) -> None:
        shape = (slots, kv_heads, width, head_dim)
        self.keys = [like.new_zeros(shape) for _ in range(layers)]
        self.values = [like.new_zeros(shape) for _ in range(layers)]
        self.bias = torch.full((slots, width), float("-inf"), dtype=like.dtype, device=like.device)  # [S, T]
        self.bias[:, 0] = 0  # a slot nobody holds reads its column 0: never an all -inf row (NaN)
        self.zero = torch.zeros((), dtype=like.dtype, device=like.device)
        self.slots, self.width, self.kv_heads = slots, width, kv_heads
        self._slot = torch.arange(slots, device=like.device)[:, None]  # [S, 1]
        self._head = torch.arange(kv_heads, device=like.device)[None, :]  # [1, H_kv]

    def bucket(self, rows: int, width: int) -> Bucket:
        return Bucket(
            rows,
            width,
            [k[:rows, :, :width] for k in self.keys],
            [v[:rows, :, :width] for v in self.values],
            self.bias[:rows, :width],
            self.bias[:rows, None, None, :width],
            self.zero,
            self._slot[:rows, 0],
            self._slot[:rows],
            self._head,
        )

    def write_prompts(self, kv: list[tuple[torch.Tensor, torch.Tensor]], index: torch.Tensor) -> None:
        """Copy prefilled prompt keys/values into slots: per layer (keys, values) [k, H_kv, P, d];
        index [4, N] long, one column per (row, prompt position): its slot, its position there, the
        prompt it comes from (0..k-1) and that prompt's padded column."""
        slots, positions, src, cols = index
        at = (slots[:, None], self._head, positions[:, None])
        for layer, (k, v) in enumerate(kv):
            self.keys[layer].index_put_(at, k[src, :, cols])  # [N, H_kv, d]
            self.values[layer].index_put_(at, v[src, :, cols])

    def open_rows(self, slots: torch.Tensor, lengths: torch.Tensor) -> None:
        """Slots `slots` [n] now hold prompts of `lengths` [n] tokens: they read columns 0..L-1."""
        cols = torch.arange(self.width, device=slots.device)[None, :]
        rows = torch.where(cols < lengths[:, None], 0.0, float("-inf")).to(self.bias.dtype)
        self.bias[slots] = rows

    def grown(self, width: int) -> StaticKV:
        """A copy `width` positions wide (the same slots and contents)."""
        new = StaticKV(len(self.keys), self.slots, self.kv_heads, width, self.keys[0].shape[-1], self.keys[0])
        for mine, theirs in ((new.keys, self.keys), (new.values, self.values)):
            for a, b in zip(mine, theirs, strict=True):
                a[:, :, : self.width] = b
        new.bias[:, : self.width] = self.bias
        return new


class LeanDecoder:
    """The decode step of a supported model (see module docstring); `bind` after any weight change."""

    def __init__(self, model: torch.nn.Module) -> None:
        ok, why = lean_support(model)
        if not ok:
            raise ValueError(f"the lean decoder cannot run this model: {why}")
        self.model: Any = model
        c: Any = self.model.config
        self.heads, self.kv_heads = int(c.num_attention_heads), int(c.num_key_value_heads)
        self.head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
        self.scale = self.head_dim**-0.5
        self.layers: list[Layer] = []
        self.bind()
        self.cos = self.sin = torch.zeros(0)
        self.table_width = 0

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def bind(self) -> None:
        """Take the model's current parameter tensors (views, no copies) and linear hooks."""
        inner: Any = self.model.model
        self.embed = inner.embed_tokens.weight
        self.norm, self.norm_eps = inner.norm.weight, float(inner.norm.variance_epsilon)
        self.head = Proj(self.model.lm_head)
        self.layers = [self._layer(x) for x in inner.layers]

    @staticmethod
    def _layer(block: Any) -> Layer:
        a, m = block.self_attn, block.mlp
        n1, n2 = block.input_layernorm, block.post_attention_layernorm
        return Layer(
            n1.weight, float(n1.variance_epsilon), Proj(a.q_proj), Proj(a.k_proj), Proj(a.v_proj), Proj(a.o_proj),
            n2.weight, float(n2.variance_epsilon), Proj(m.gate_proj), Proj(m.up_proj), Proj(m.down_proj),
        )  # fmt: skip

    def key(self) -> tuple[int, ...]:
        """Changes whenever a captured step would read other tensors (engines/graphs.py)."""
        parts = [self.embed.data_ptr(), self.norm.data_ptr(), *self.head.key(), self.cos.data_ptr()]
        for x in self.layers:
            parts += [x.ln1.data_ptr(), x.ln2.data_ptr()]
            for p in (x.q, x.k, x.v, x.o, x.gate, x.up, x.down):
                parts += p.key()
        return tuple(parts)

    @property
    def hooked(self) -> bool:
        """Does some linear layer run forward hooks (a LoRA adapter)? Their tensors are not in `key`."""
        return any(p.hooked for x in self.layers for p in (x.q, x.k, x.v, x.o, x.gate, x.up, x.down))

    def rope_table(self, width: int) -> None:
        """cos/sin for positions 0..width-1 from the model's own rotary module ([T, 1, d] each; sin
        signed so that rotate_half(x) * sin == roll(x, d/2) * signed sin)."""
        if width <= self.table_width:
            return
        rotary: Any = self.model.model.rotary_emb
        positions = torch.arange(width, device=self.device)[None, :]
        cos, sin = rotary(self.embed[:1][None], positions)  # [1, T, d], the model's dtype
        half = self.head_dim // 2
        sign = torch.ones(self.head_dim, dtype=sin.dtype, device=self.device)
        sign[:half] = -1
        self.cos, self.sin = cos[0][:, None, :].contiguous(), (sin[0] * sign)[:, None, :].contiguous()
        self.table_width = width

    def step(self, ids: torch.Tensor, pos: torch.Tensor, pos_col: torch.Tensor, b: Bucket) -> torch.Tensor:
        """Logits [B, V] of one token per row: ids, pos [B] (the token and the position it is at;
        pos_col: the same positions as [B, 1]). Writes each row's key/value at its position and opens
        that column of its bias row."""
        x = F.embedding(ids, self.embed)  # [B, h]
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)  # [B, 1, d]
        at = (b.slot_col, b.head_row, pos_col)
        b.bias.index_put_((b.slot, pos), b.zero)
        for layer, keys, values in zip(self.layers, b.keys, b.values, strict=True):
            x = self._block(layer, x, cos, sin, keys, values, b.mask, at)
        return self.head(_rms(x, self.norm, self.norm_eps))  # [B, V]

    def _block(
        self,
        w: Layer,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        at: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        rows, h, hkv, d = x.shape[0], self.heads, self.kv_heads, self.head_dim
        n = _rms(x, w.ln1, w.eps1)
        qk = torch.cat([w.q(n), w.k(n)], dim=1).view(rows, h + hkv, d)  # one RoPE for queries and keys
        qk = qk * cos + torch.roll(qk, d // 2, dims=-1) * sin
        q, k = qk.split([h, hkv], dim=1)
        keys.index_put_(at, k)  # into the cache itself (a view's writes land in its base)
        values.index_put_(at, w.v(n).view(rows, hkv, d))
        out = F.scaled_dot_product_attention(
            q.view(rows, hkv, h // hkv, d), keys, values, attn_mask=mask, scale=self.scale
        )  # [B, H_kv, n_rep, d]
        x = x + w.o(out.reshape(rows, h * d))
        n = _rms(x, w.ln2, w.eps2)
        return x + w.down(F.silu(w.gate(n)) * w.up(n))


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm (Qwen2/Llama): in float32, scaled by the weight in the input's dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)

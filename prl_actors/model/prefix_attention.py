"""Shared-prefix decode attention: a group's prompt keys and values are held once, not once per sample.

The engine (engines/batching.py) decodes the G samples of a prompt side by side. With an ordinary KV
cache every row holds its own copy of the prompt's keys and values, and each decode step reads all
of them: at the chat shape (~160-token prompts, G = 8) the prompt is most of what attention reads,
and the per-row copies are what the cache's row selections copy. `PrefixKV` keeps, per layer:

    prefix   one entry per group: its prompt's keys/values [Gp, H_kv, P, d] (RoPE applied), valid [Gp, P]
    suffix   one entry per row: the tokens it generated, [R, H_kv, S, d] in a buffer with spare room

and a decode step's attention (`attend`) scores a row's query against both: the prompt part as one
matrix product per group (the group's G queries, times its H / H_kv query heads, against one prompt:
a real matrix product instead of G matrix-vector products), the suffix part per row. Each part is
normalised on its own and the two are merged by their log-sum-exp (as cascade attention kernels do),
which is exactly the softmax over [prompt | own tokens].

It runs through transformers' attention interface: the model is called with `use_cache=False` and a
`prl_prefix` keyword (model/block_attention.py's implementation dispatches it here); each layer's
attention appends its new key/value to the suffix at the step's column and attends. A model whose
attention does not pass the keyword on (or computes attention differently: soft-capping, sinks) is
found by `prefix_check` (engines/batching.py), which compares a few steps of both paths once per model; the engine then
keeps its ordinary cache.
"""

from __future__ import annotations

import torch

ROOM = 64
"""The suffix buffer grows by at least this many positions (a quarter of its length if more)."""


class PrefixKV:
    """The decode keys/values of a running batch: one prompt per group, a growing suffix per row.

    Rows are the batch rows of the engine, in order; `owner[r]` is row r's prefix. Between steps the
    engine adds groups (`add`) and keeps rows (`select`); during a model call each layer calls
    `attend` once (`begin` / `end` around the call open the step's column and check every layer came).
    Masks are additive biases (float32; float64 for a float64 model): 0 where a key is read, -inf
    where not (padding)."""

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.pk: list[torch.Tensor] = []  # per layer [Gp, H_kv, P, d]
        self.pv: list[torch.Tensor] = []
        self.prefix_bias = torch.zeros((0, 1, 1, 0))  # [Gp, 1, 1, P]
        self.sk: list[torch.Tensor] = []  # per layer [R, H_kv, cap, d]: the suffix buffers
        self.sv: list[torch.Tensor] = []
        self.suffix_bias = torch.zeros((0, 0))  # [R, S]
        self.owner = torch.zeros(0, dtype=torch.long)  # [R] the row's prefix
        self.slots = torch.zeros((0, 0), dtype=torch.long)  # [Gp, m] rows of each prefix (R: none)
        self.place = torch.zeros(0, dtype=torch.long)  # [R] the row's index in slots.flatten()
        self.whole = True  # slots.flatten() is the rows in order (every prefix has m rows)
        self.calls = 0  # layers that attended in the open step

    @property
    def rows(self) -> int:
        return int(self.owner.numel())

    @property
    def width(self) -> int:
        """S: suffix positions in use."""
        return int(self.suffix_bias.shape[1])

    # --- between steps ---------------------------------------------------------------------------

    def add(self, kv: list[tuple[torch.Tensor, torch.Tensor]], valid: torch.Tensor, sizes: list[int]) -> None:
        """New groups: per layer their prompts' (keys, values) [k, H_kv, P, d], valid [k, P] bool, and
        each group's row count (its rows go after the existing rows, group after group)."""
        if len(kv) != self.layers:
            raise ValueError(f"{len(kv)} layers of prompt keys for a {self.layers}-layer store")
        device = valid.device
        bias = torch.zeros(valid.shape, device=device, dtype=_acc(kv[0][0])).masked_fill(~valid, float("-inf"))
        bias = bias[:, None, None, :]  # [k, 1, 1, P]
        first = int(self.prefix_bias.shape[0]) if self.rows else 0
        owners = torch.arange(first, first + len(sizes), device=device).repeat_interleave(
            torch.tensor(sizes, device=device)
        )
        n = int(owners.numel())
        if first:  # prompts side by side, padded on the right (RoPE is in the keys: order is free)
            width = max(self.prefix_bias.shape[-1], bias.shape[-1])
            self.pk = [torch.cat([_pad(a, width), _pad(b, width)]) for a, (b, _) in zip(self.pk, kv, strict=True)]
            self.pv = [torch.cat([_pad(a, width), _pad(b, width)]) for a, (_, b) in zip(self.pv, kv, strict=True)]
            self.prefix_bias = torch.cat(
                [_pad(self.prefix_bias, width, 3, float("-inf")), _pad(bias, width, 3, float("-inf"))]
            )
            self.sk = [torch.cat([b, b.new_zeros((n, *b.shape[1:]))]) for b in self.sk]
            self.sv = [torch.cat([b, b.new_zeros((n, *b.shape[1:]))]) for b in self.sv]
        else:  # an empty batch starts afresh
            self.pk, self.pv, self.prefix_bias = [k for k, _ in kv], [v for _, v in kv], bias
            self.sk = [k.new_zeros((n, k.shape[1], ROOM, k.shape[3])) for k, _ in kv]
            self.sv = [v.new_zeros((n, v.shape[1], ROOM, v.shape[3])) for _, v in kv]
            self.suffix_bias = torch.zeros((0, 0), device=device, dtype=bias.dtype)
            self.owner = torch.zeros(0, dtype=torch.long, device=device)
        unread = torch.full((n, self.width), float("-inf"), device=device, dtype=bias.dtype)  # earlier columns
        self.suffix_bias = torch.cat([self.suffix_bias, unread])
        self.owner = torch.cat([self.owner, owners])
        self._index()

    def select(self, keep: torch.Tensor) -> None:
        """Keep batch rows `keep` [n] (in that order); prefixes nobody reads any more are dropped, and
        suffix columns that no kept row reads (on the left) with them."""
        self.sk = [b[keep] for b in self.sk]
        self.sv = [b[keep] for b in self.sv]
        self.suffix_bias, owner = self.suffix_bias[keep], self.owner[keep]
        used = torch.unique(owner)  # sorted
        self.pk = [k[used] for k in self.pk]
        self.pv = [v[used] for v in self.pv]
        self.prefix_bias = self.prefix_bias[used]
        self.owner = torch.searchsorted(used, owner)
        if self.rows and self.width:
            first = int((self.suffix_bias == 0).any(dim=0).int().argmax())  # the first column some row reads
            if first:
                self.suffix_bias = self.suffix_bias[:, first:]
                self.sk = [b[:, :, first:] for b in self.sk]
                self.sv = [b[:, :, first:] for b in self.sv]
        self._index()

    def _index(self) -> None:
        """slots [Gp, m]: each prefix's rows (R pads); place [R]: each row's index in slots.flatten()."""
        r, gp = self.rows, int(self.prefix_bias.shape[0])
        device = self.owner.device
        counts = torch.bincount(self.owner, minlength=gp)
        m = int(counts.max()) if gp else 0
        order = torch.argsort(self.owner, stable=True)  # rows by prefix
        starts = torch.cumsum(counts, 0) - counts  # [Gp] first of each prefix in `order`
        rank = torch.arange(r, device=device) - starts[self.owner[order]]  # a row's rank within its prefix
        self.slots = torch.full((gp, m), r, dtype=torch.long, device=device)
        self.slots[self.owner[order], rank] = order
        self.place = torch.empty(r, dtype=torch.long, device=device)
        self.place[order] = self.owner[order] * m + rank
        self.whole = r == gp * m and torch.equal(self.place, torch.arange(r, device=device))  # slots = rows

    # --- one decode step ---------------------------------------------------------------------------

    def begin(self) -> None:
        """Open the step's suffix column (every row writes its new token there)."""
        s = self.width
        if self.sk and s >= self.sk[0].shape[2]:
            room = s + max(ROOM, s // 4)
            self.sk = [_with_room(b, s, room) for b in self.sk]
            self.sv = [_with_room(b, s, room) for b in self.sv]
        self.suffix_bias = torch.cat([self.suffix_bias, self.suffix_bias.new_zeros((self.rows, 1))], dim=1)
        self.calls = 0

    def end(self) -> None:
        """Close the step: every layer must have attended here (else the model bypassed the store)."""
        if self.calls != self.layers:
            raise RuntimeError(f"{self.calls} of {self.layers} layers used the shared-prefix attention")

    def attend(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None
    ) -> torch.Tensor:
        """One layer of one decode step. query [R, H, 1, d]; key, value [R, H_kv, 1, d] (the new token,
        RoPE applied). Returns the attention output [R, 1, H, d] (transformers' layout).

        The two parts are normalised apart and merged by their log-sum-exp (as cascade/split-k
        attention kernels do), so only [R, H, d]-sized tensors move between the group layout and the
        row layout, never scores."""
        if query.shape[2] != 1:
            raise ValueError("shared-prefix attention decodes one token per row")
        r, h, _, d = query.shape
        hkv = key.shape[1]
        s = self.width  # the new token's column is s - 1
        self.sk[layer][:, :, s - 1 : s] = key
        self.sv[layer][:, :, s - 1 : s] = value
        ks, vs = self.sk[layer][:, :, :s], self.sv[layer][:, :, :s]  # [R, H_kv, S, d]
        kp, vp = self.pk[layer], self.pv[layer]  # [Gp, H_kv, P, d]
        scale = d**-0.5 if scale is None else scale
        n_rep, gp, m = h // hkv, kp.shape[0], self.slots.shape[1]
        q = query.reshape(r, hkv, n_rep, d) * scale  # a row's query heads, by the key head they read
        full = self.whole  # every prefix has m rows, in order: the slots are the rows themselves
        # the prompt part, per prefix: its rows' queries [Gp, H_kv, m * n_rep, d] against its prompt
        qg = q if full else torch.cat([q, q.new_zeros((1, hkv, n_rep, d))])[self.slots.flatten()]
        qg = qg.reshape(gp, m, hkv, n_rep, d).transpose(1, 2).reshape(gp, hkv, m * n_rep, d)
        prompt = torch.cat(_part(qg, kp, vp, self.prefix_bias), dim=-1)  # [Gp, H_kv, m * n_rep, d + 2]
        prompt = prompt.reshape(gp, hkv, m, n_rep, d + 2).transpose(1, 2).reshape(gp * m, hkv, n_rep, d + 2)
        if not full:
            prompt = prompt[self.place]  # [R, H_kv, n_rep, d + 2]
        op, mp, lp = prompt[..., :d], prompt[..., d : d + 1], prompt[..., d + 1 :]
        # the row's own tokens
        os_, ms, ls = _part(q, ks, vs, self.suffix_bias[:, None, None, :])
        top = torch.maximum(mp, ms)
        a, b = torch.exp(mp - top), torch.exp(ms - top)
        out = (op * a + os_ * b) / (lp * a + ls * b)  # [R, H_kv, n_rep, d], float32 or float64
        self.calls += 1
        return out.to(query.dtype).reshape(r, 1, h, d)


def _part(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalised attention of q [..., n, d] (scaled) over k, v [..., L, d] with an additive bias
    (0 / -inf): (exp-weighted values [..., n, d], the row max [..., n, 1], the exp sum [..., n, 1]), in
    float32 (float64 for a float64 model)."""
    acc = _acc(q)
    scores = torch.matmul(q, k.transpose(-1, -2)).to(acc) + bias
    top = scores.amax(dim=-1, keepdim=True).clamp(min=-1e30)  # a row with no key left: weights 0, not NaN
    e = torch.exp(scores - top)
    return torch.matmul(e.to(v.dtype), v).to(acc), top, e.sum(dim=-1, keepdim=True)


def _acc(t: torch.Tensor) -> torch.dtype:
    """The dtype scores and masks are kept in: float32, or float64 for a float64 model."""
    return torch.promote_types(t.dtype, torch.float32)


def _pad(t: torch.Tensor, width: int, dim: int = 2, fill: float = 0.0) -> torch.Tensor:
    """Keys/values [k, H, P, d] (or a bias [k, 1, 1, P], dim 3) -> `width` positions along `dim`,
    `fill` after the real ones."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t, t.new_full(shape, fill)], dim=dim)


def _with_room(buf: torch.Tensor, used: int, room: int) -> torch.Tensor:
    """A new [R, H, room, d] buffer holding buf's first `used` positions."""
    grown = buf.new_zeros((buf.shape[0], buf.shape[1], room, buf.shape[3]))
    grown[:, :, :used] = buf[:, :, :used]
    return grown


def prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    store: PrefixKV,
    scale: float | None,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface, for one layer (`module.layer_idx`) of a decode step."""
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise ValueError("shared-prefix attention needs the layer's index (module.layer_idx)")
    return store.attend(int(layer), query, key, value, scale), None

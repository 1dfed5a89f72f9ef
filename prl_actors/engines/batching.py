"""Continuous batching for a Hugging Face causal LM: a running KV-cache batch that admits groups as
rows finish and hands back each group the moment its last sample is done.

One step of `RunningBatch.step()`:
1. admit pending groups while G rows are free: their prompts are encoded once per group (one
   prefill forward for all admitted prompts), the KV cache is repeated G times and merged into the
   running cache (left-padded to a common length), and each new row draws its first token;
2. one decode forward for every running row (its last token at its own position id);
3. every group whose G rows are all done (eos or `max_new_tokens`) is returned; done rows leave the
   batch (the KV cache) as soon as they are at least 1/COMPACT of it, not when their group ends.

A model whose attention runs through transformers' interface (checked once per model: `prefix_check`)
decodes prompts of SHARE_FROM tokens or more from a shared-prefix store (model/prefix_attention.py):
each group's prompt keys/values are held once and its G rows each keep only the tokens they
generated, instead of G copies of the prompt in the KV cache. Otherwise the batch keeps that ordinary
cache; where its rows can grow long, it is written in place (`GrowingLayer`), not concatenated.

Sampling is counter-based: row r of group g draws its t-th token from a uniform that is a hash of
(the group's key, r, t), the key being (run seed, weight version, group id). A group's samples
therefore do not depend on which other groups share the batch or when it was admitted (up to float
noise of batched matmuls), so a requeued group regenerates the same samples. Log-probs are the
behaviour log-probs of `training.behaviour` (the distribution the token was drawn from), the same
function the trainer scores tokens with.

A batch holds one weight version: `RunningBatch` never sees a weight swap (the engine refuses to
load weights while rows run). With a sliding-window model, caches are merged only while every row
stays inside the window (the cache is then an ordinary full cache); past it, groups are admitted into
an empty batch only (waves).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

from prl_actors.engines.sampling import left_pad
from prl_actors.model.block_attention import use_blocks
from prl_actors.model.prefix_attention import PrefixKV
from prl_actors.training.behaviour import Behaviour, as_behaviour, behaviour_logprobs, context_matrix, shaped_logits

COMPACT = 8
"""Done rows leave the running batch once they are at least 1/COMPACT of it (RunningBatch._finish)."""
GROW_FROM = 64
"""A prefill whose rows can reach this many positions gets an in-place cache (GrowingLayer); below it,
concatenation costs less than the buffer's bookkeeping (demo shape: 12.7 vs 19.7 ms per epoch)."""
SHARE_FROM = 48
"""An empty batch whose first prompts are this wide (padded) decodes from the shared-prefix store; with
shorter prompts the per-row cache costs less than the store's extra small operations (chat model, 8
groups x 8: 0.93x at 32 tokens, 1.25x at 64, 1.42x at 128; BENCHMARKS §11, fourth round)."""
_M1, _M2, _ROW = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrap-around arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def uniforms(keys: Sequence[int], rows: Sequence[int], steps: Sequence[int]) -> np.ndarray:
    """One uniform in [0, 1) per (key, row, step), a pure function of the three (float64, [B])."""
    k = np.asarray(keys, dtype=np.uint64)
    counter = np.asarray(rows, dtype=np.uint64) * _ROW + np.asarray(steps, dtype=np.uint64)
    return (_mix64(k ^ _mix64(counter)) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def draw(
    logits: torch.Tensor,
    u: np.ndarray,
    temperature: float | Behaviour,
    top_p: float = 1.0,
    context: torch.Tensor | None = None,
) -> torch.Tensor:
    """Next token per row, [B]: argmax (of the penalised logits) for temperature 0, else the inverse
    CDF at the row's uniform `u` of q, the behaviour distribution (training/behaviour.py: penalty,
    temperature, min_p, top_k, top_p). logits: [B, V] float32; context: [B, C] (with a penalty)."""
    b = as_behaviour(temperature, top_p)
    shaped = shaped_logits(logits, b, context)  # [B, V]
    if b.temperature == 0:
        return shaped.argmax(dim=-1)
    cdf = torch.softmax(shaped, dim=-1).double().cumsum(dim=-1)  # [B, V]
    target = torch.as_tensor(u, device=cdf.device)[:, None] * cdf[:, -1:]  # [B, 1]
    token = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # [B]
    return token.clamp(max=logits.shape[-1] - 1)


@dataclass
class Row:
    key: int  # the group's sampling key
    index: int  # 0..G-1 within its group
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    eos: bool = False  # ended: an eos token, or a stop string (`RunningBatch.stopper`)
    offset: int = 0  # draws made before this row (a later turn of a multi-turn episode), for the counter
    prompt_ids: list[int] = field(default_factory=list, repr=False)  # the repetition penalty's context


@dataclass
class Running:
    """A group in the batch (or waiting to enter it)."""

    group_id: int
    prompt_ids: list[int]
    key: int
    size: int
    tag: Any = None  # the caller's (e.g. the Prompt); handed back with the finished group
    rows: list[Row] = field(default_factory=list)
    t_admit: float = 0.0
    index: int = 0  # the first row's sample index (a later turn of episode i is one row of index i)
    offset: int = 0  # the rows' sampling counters start here (engines/multiturn.py)


@dataclass
class Finished:
    group_id: int
    prompt_ids: list[int]
    tag: Any
    rows: list[Row]
    seconds: float  # from admission to its last token


class GroupQueue:
    """What every running batch shares (RunningBatch here, StaticBatch on the accelerator path): the
    queue of groups waiting for rows, the groups in the batch, notes for the worker's log, and when a
    row is done. Not thread-safe: one caller (the worker's actor thread)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_rows: int,
        eos_ids: set[int],
        pad_id: int,
        max_new_tokens: int,
        stopper: Callable[[list[int]], bool] | None = None,
    ) -> None:
        self.model, self.max_rows = model, max_rows
        self.eos_ids, self.pad_id = eos_ids, pad_id
        self.max_new_tokens = max_new_tokens
        self.stopper = stopper  # tokens so far -> has a stop string appeared (ends the row, finished)
        self.pending: deque[Running] = deque()
        self.groups: list[Running] = []  # in the batch
        self.notes: list[tuple[str, dict[str, Any]]] = []  # for the worker's log (drain_notes)

    def add(
        self,
        group_id: int,
        prompt_ids: list[int],
        key: int,
        size: int,
        tag: Any = None,
        index: int = 0,
        offset: int = 0,
    ) -> None:
        """Queue a group of `size` samples (one larger than `max_rows` runs alone in an empty batch).
        Its rows are samples index..index+size-1 and draw their t-th token with counter offset + t,
        so a multi-turn episode's later turn (one row, re-entering with its whole context) never
        reuses an earlier turn's uniforms."""
        self.pending.append(Running(group_id, list(prompt_ids), key, size, tag, index=index, offset=offset))

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.groups)

    def drain_notes(self) -> list[tuple[str, dict[str, Any]]]:
        """What the batch learned about its model since the last call (engines/base.py engine_notes)."""
        notes, self.notes = self.notes, []
        return notes

    def row_done(self, row: Row) -> bool:
        """Has `row` ended (eos or max_new_tokens)?"""
        return row.eos or len(row.tokens) >= self.max_new_tokens

    def _drop_all(self) -> list[int]:
        """Empty the queue and the batch's group list; returns the dropped groups' ids."""
        dropped = [g.group_id for g in self.groups] + [g.group_id for g in self.pending]
        self.pending.clear()
        self.groups = []
        return dropped


class RunningBatch(GroupQueue):
    """The running batch of one model. Not thread-safe: one caller (the worker's actor thread)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_rows: int,
        eos_ids: set[int],
        pad_id: int,
        behaviour: Behaviour,
        max_new_tokens: int,
        stopper: Callable[[list[int]], bool] | None = None,
    ) -> None:
        super().__init__(
            model, max_rows=max_rows, eos_ids=eos_ids, pad_id=pad_id, max_new_tokens=max_new_tokens, stopper=stopper
        )
        self.behaviour = behaviour
        self.device = next(model.parameters()).device
        self._eos = torch.tensor(sorted(eos_ids), device=self.device)
        self.rows: list[Row] = []  # aligned with the batch dimension
        self.cache: Any = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)  # [B, T]
        self.pos = torch.zeros(0, dtype=torch.long, device=self.device)  # [B] next position id
        self.window = _sliding_window(model)
        self.can_share: bool | None = None  # the model routes the shared-prefix store (checked when first wanted)
        self.store: PrefixKV | None = None  # the running batch's shared-prefix store (None: it uses `cache`)

    # --- the caller's API (add, busy, drain_notes, row_done: GroupQueue) -------------------------

    @property
    def shared(self) -> bool:
        """Does the running batch decode from the shared-prefix store (not from `cache`)?"""
        return self.store is not None

    @property
    def running_rows(self) -> int:
        return len(self.rows)

    def weights_changed(self) -> None:
        """Nothing to redo: every step calls the model afresh (StaticBatch keeps views of its tensors)."""

    def abort(self) -> list[int]:
        """Drop every group (running and pending); returns their ids."""
        dropped = self._drop_all()
        self._select([])
        return dropped

    @torch.no_grad()
    def step(self) -> list[Finished]:
        """Admit what fits, decode one token for every running row, return the finished groups."""
        self._admit()
        done = self._finish()
        if self.rows:
            self._decode()
            done += self._finish()
        return done

    # --- admission -------------------------------------------------------------------------------

    def _admit(self) -> None:
        free = self.max_rows - len(self.rows)
        new: list[Running] = []
        width = self.mask.shape[1]
        while self.pending:
            width = max(width, len(self.pending[0].prompt_ids))
            joining = bool(self.rows or new)  # else the batch is empty: the next group always fits
            if joining and (self.pending[0].size > free or not self._inside_window(width)):
                break
            group = self.pending.popleft()
            free -= group.size
            new.append(group)
        if new:
            self._prefill(new)

    def _inside_window(self, width: int) -> bool:
        """Would a cache `width` wide stay inside the sliding window until every row is done?"""
        return self.window is None or width + self.max_new_tokens < self.window

    def _prefill(self, new: list[Running]) -> None:
        """Encode each new prompt once, repeat its cache G times, merge, draw the first tokens."""
        ids, mask = (t.to(self.device) for t in left_pad([g.prompt_ids for g in new], self.pad_id))  # [k, P]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [k, P]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        sizes = torch.tensor([g.size for g in new], device=self.device)
        cache = out.past_key_values
        wide = ids.shape[1] >= SHARE_FROM and any(g.size > 1 for g in new)
        if not self.rows and wide and self._can_share():  # an empty batch picks its cache: the store where it pays
            self.store = PrefixKV(len(cache.layers))
        if self.store is not None:  # the prompts' keys/values once per group (model/prefix_attention.py)
            self.store.add([(x.keys, x.values) for x in cache.layers], mask.bool(), sizes.tolist())
        else:  # G copies of each prompt's cache
            if ids.shape[1] + self.max_new_tokens >= GROW_FROM:
                cache = _growing(cache)
            if any(g.size != new[0].size for g in new):
                cache.batch_select_indices(torch.repeat_interleave(torch.arange(len(new), device=self.device), sizes))
            else:
                cache.batch_repeat_interleave(new[0].size)
        logits = out.logits[:, -1, :].float().repeat_interleave(sizes, dim=0)  # [k*G, V]
        now = time.monotonic()
        rows = []
        for g in new:
            g.rows = [Row(g.key, g.index + i, offset=g.offset, prompt_ids=g.prompt_ids) for i in range(g.size)]
            g.t_admit = now
            rows += g.rows
        self._merge(cache, mask.repeat_interleave(sizes, dim=0), mask.sum(-1).repeat_interleave(sizes, dim=0))
        self.groups += new
        start = len(self.rows)
        self.rows += rows
        self._sample(logits, list(range(start, len(self.rows))))

    def _can_share(self) -> bool:
        """Does the model route the shared-prefix store? Checked at the first batch that would use it
        (`prefix_check`, a few tiny forwards), so a run of short prompts never pays for the check."""
        if self.can_share is None:
            self.can_share, why = prefix_check(self.model)  # a sliding window says no there
            self.notes.append(("decode_attention", {"shared_prefix": self.can_share, "why": why}))
        return self.can_share

    def _merge(self, cache: Any, mask: torch.Tensor, pos: torch.Tensor) -> None:
        """Append rows (their cache, mask [n, P], next positions [n]) to the batch (with the shared
        store, the rows are in it already: only their positions)."""
        if self.store is not None:
            self.pos = pos if not self.rows else torch.cat([self.pos, pos])
            return
        if self.cache is None or not self.rows:
            self.cache, self.mask, self.pos = cache, mask, pos
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)])
            mine.values = torch.cat([_pad_left(mine.values, width), _pad_left(theirs.values, width)])
        self.mask = torch.cat([_pad_left_2d(self.mask, width), _pad_left_2d(mask, width)])
        self.pos = torch.cat([self.pos, pos])

    # --- decoding --------------------------------------------------------------------------------

    def _decode(self) -> None:
        last = [r.tokens[-1] if r.tokens else self.pad_id for r in self.rows]
        ids = torch.tensor(last, dtype=torch.long, device=self.device)[:, None]  # [B, 1]
        if self.store is not None:
            out = _decode_shared(self.model, ids, self.pos, self.store)
        else:
            self.mask = torch.cat([self.mask, torch.ones_like(ids)], dim=1)  # [B, T + 1]
            out = self.model(
                input_ids=ids,
                attention_mask=self.mask,
                position_ids=self.pos[:, None],
                past_key_values=self.cache,
                use_cache=True,
            )
            self.cache = out.past_key_values
        self.pos = self.pos + 1
        live = [i for i, r in enumerate(self.rows) if not self.row_done(r)]
        if live:
            self._sample(out.logits[live, -1, :].float(), live)

    def _sample(self, logits: torch.Tensor, index: list[int]) -> None:
        """Draw the next token of rows `index` (logits [n, V]) and record token and log-prob."""
        rows = [self.rows[i] for i in index]
        u = uniforms([r.key for r in rows], [r.index for r in rows], [r.offset + len(r.tokens) for r in rows])
        b = self.behaviour
        context = context_matrix([r.prompt_ids + r.tokens for r in rows], logits.device) if b.penalised else None
        token = draw(logits, u, b, context=context)  # [n]
        logp = behaviour_logprobs(logits, token, b, context=context)  # [n]
        eos = torch.isin(token, self._eos)
        for r, t, lp, e in zip(rows, token.tolist(), logp.tolist(), eos.tolist(), strict=True):
            r.tokens.append(t)
            r.logprobs.append(lp)
            r.eos = e or (self.stopper is not None and self.stopper(r.tokens))

    # --- leaving ---------------------------------------------------------------------------------

    def _finish(self) -> list[Finished]:
        """Hand back every group whose rows are all done, and drop done rows from the batch.

        A row leaves the batch once its answer ended, not when its group does: a group ends with its
        longest answer (with long-tailed lengths often the cap), and a row that kept decoding after
        its eos until then would cost attention and matmuls for nothing (at the chat shape ~2/3 of
        the row-steps). Dropping rows copies the cache once, so it waits until at least 1/COMPACT of
        the batch is done (or the batch is all done)."""
        done = [g for g in self.groups if all(self.row_done(r) for r in g.rows)]
        if done:
            gone = {id(g) for g in done}
            self.groups = [g for g in self.groups if id(g) not in gone]
        live = [i for i, r in enumerate(self.rows) if not self.row_done(r)]
        dead = len(self.rows) - len(live)
        if dead and (dead * COMPACT >= len(self.rows) or not self.groups):
            self._select(live)
        now = time.monotonic()
        return [Finished(g.group_id, g.prompt_ids, g.tag, g.rows, now - g.t_admit) for g in done]

    def _select(self, keep: list[int]) -> None:
        """Keep only batch rows `keep`, and drop the left padding nobody needs any more."""
        if not keep:
            self.cache, self.store, self.rows = None, None, []
            self.mask = self.mask[:0, :0]
            self.pos = self.pos[:0]
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        if self.store is not None:
            self.store.select(index)
            self.rows = [self.rows[i] for i in keep]
            self.pos = self.pos[index]
            return
        self.cache.batch_select_indices(index)
        self.rows = [self.rows[i] for i in keep]
        self.mask, self.pos = self.mask[index], self.pos[index]
        first = int(self.mask.any(dim=0).int().argmax())  # the first column some row attends to
        if first > 0 and self._inside_window(self.mask.shape[1]):  # a cropped sliding cache stays as it is
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer whose keys/values are a prefix view of a buffer with room to spare.

    Hugging Face's DynamicLayer concatenates the whole cache with each new token, so a decode step
    copies every cached key and value: O(T) per step, O(T^2) per answer. That copying was 61% of the
    engine's CPU time at the chat shape (BENCHMARKS §11). Here a step writes its token into the spare
    room; the buffer grows by a quarter (at least 64 positions) when full. Anything that replaces
    `keys`/`values` from outside (the batch selection, merge and crop of RunningBatch) is noticed by
    identity and re-buffered at the next update, so those paths stay plain tensor code."""

    def __init__(self) -> None:
        super().__init__()
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None
        self._view_k: torch.Tensor | None = None  # the views last handed out (replaced from outside: re-buffer)
        self._view_v: torch.Tensor | None = None

    @classmethod
    def of(cls, layer: DynamicLayer) -> GrowingLayer:
        grown = cls()
        grown.__dict__.update(layer.__dict__)  # its keys/values (a plain DynamicLayer has no buffer)
        return grown

    def _owns(self) -> bool:
        """Are keys/values still the views of the buffers this layer handed out last?"""
        return (
            self._kbuf is not None
            and self._vbuf is not None
            and self._view_k is self.keys
            and self._view_v is self.values
        )

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        keys, values = self.keys, self.values
        if not self.is_initialized or keys is None or values is None or keys.numel() == 0:
            return super().update(key_states, value_states, *args, **kwargs)
        n, m = keys.shape[-2], key_states.shape[-2]
        kbuf, vbuf = self._kbuf, self._vbuf
        if not self._owns() or kbuf is None or vbuf is None or n + m > kbuf.shape[-2]:
            room = n + m + max(64, (n + m) // 4)
            kbuf, vbuf = _with_room(keys, room), _with_room(values, room)
            self._kbuf, self._vbuf = kbuf, vbuf
        kbuf[:, :, n : n + m] = key_states
        vbuf[:, :, n : n + m] = value_states
        self.keys, self.values = kbuf[:, :, : n + m], vbuf[:, :, : n + m]
        self._view_k, self._view_v = self.keys, self.values
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows `indices`, with their spare room (one copy, none again at the next update)."""
        keys, kbuf, vbuf = self.keys, self._kbuf, self._vbuf
        if not self._owns() or keys is None or kbuf is None or vbuf is None:
            super().batch_select_indices(indices)
            return
        n = keys.shape[-2]
        self._kbuf, self._vbuf = kbuf[indices], vbuf[indices]
        self.keys, self.values = self._kbuf[:, :, :n], self._vbuf[:, :, :n]
        self._view_k, self._view_v = self.keys, self.values


def _with_room(t: torch.Tensor, room: int) -> torch.Tensor:
    """[B, H, T, D] -> a new [B, H, room, D] buffer holding t in its first T positions."""
    buf = t.new_empty(t.shape[0], t.shape[1], room, t.shape[3])
    buf[:, :, : t.shape[2]] = t
    return buf


def _growing(cache: Any) -> Any:
    """The cache with each plain full-attention layer made a GrowingLayer (other layer types, e.g.
    sliding windows, stay as the model made them)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        cache.layers = [GrowingLayer.of(x) if type(x) is DynamicLayer else x for x in layers]
    return cache


def _decode_shared(model: torch.nn.Module, ids: torch.Tensor, pos: torch.Tensor, store: PrefixKV) -> Any:
    """One decode step from the shared-prefix store: ids [B, 1] at positions pos [B]. The model keeps
    no cache of its own (use_cache=False); each layer's attention appends to and reads the store."""
    store.begin()
    out = model(input_ids=ids, position_ids=pos[:, None], use_cache=False, prl_prefix=store)
    store.end()
    return out


PROBE_PROMPTS = ([1, 2, 3, 1, 2], [3, 2])
"""Two prompts of different lengths (left padding) with two rows each: `prefix_check`'s check."""


def prefix_check(model: torch.nn.Module) -> tuple[bool, str]:
    """(routed, why): does `model` decode from the shared-prefix store exactly as from its own KV cache?
    Checked once per model (two prompts, two rows each, three steps, both ways, the same logits up to
    float noise): a model whose attention does not run through transformers' interface with its
    keywords, or adds to it (soft-capping, sinks), fails and keeps the ordinary cache. Needs an SDPA
    model (switched to "prl_blocks", which is SDPA without the keyword)."""
    known = getattr(model, "_prl_prefix_check", None)
    if known is not None:
        return known
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if config is None:
        found = (False, "not a transformers model (no config)")
    elif _sliding_window(model) is not None:
        found = (False, "sliding-window attention")
    elif not use_blocks(model):
        found = (False, f"attention implementation {before!r} (the store needs sdpa)")
    else:
        try:
            worst, tolerance = _both_ways(model)
            ok = worst <= tolerance
            found = (ok, f"logits {'match' if ok else 'differ'}: {worst:.2e} (tolerance {tolerance:.2e})")
        except Exception as exc:  # noqa: BLE001 - any failure means: not routed (the ordinary cache serves)
            found = (False, f"the check failed: {type(exc).__name__}: {exc}"[:300])
        if not found[0]:
            config._attn_implementation = before
    setattr(model, "_prl_prefix_check", found)  # noqa: B010 - nn.Module types its attributes as tensors or modules
    return found


@torch.no_grad()
def _both_ways(model: torch.nn.Module) -> tuple[float, float]:
    """The largest logit difference between the store and the KV cache over a few steps, and the
    tolerance for the model's dtype."""
    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in left_pad([list(p) for p in PROBE_PROMPTS], 0))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    pos = mask.sum(-1).repeat_interleave(2)  # [4] next position per row
    plain = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True).past_key_values
    store = PrefixKV(len(plain.layers))
    store.add([(x.keys, x.values) for x in plain.layers], mask.bool(), [2, 2])  # before the repeat replaces them
    plain.batch_repeat_interleave(2)
    full = mask.repeat_interleave(2, dim=0)
    worst, scale = 0.0, 0.0
    for step in range(3):
        tok = (step + 1 + torch.arange(4, device=device) % 2)[:, None]  # [4, 1]: tokens 1 2 / 2 3 / 3 4
        full = torch.cat([full, torch.ones_like(tok)], dim=1)
        a = model(
            input_ids=tok,
            attention_mask=full,
            position_ids=(pos + step)[:, None],
            past_key_values=plain,
            use_cache=True,
        )
        plain = a.past_key_values
        b = _decode_shared(model, tok, pos + step, store)
        worst = max(worst, float((a.logits.float() - b.logits.float()).abs().max()))
        scale = max(scale, float(a.logits.float().abs().max()))
    dtype = next(model.parameters()).dtype
    return worst, (1e-4 if dtype == torch.float32 else 3e-2) * (1.0 + scale)


def _sliding_window(model: torch.nn.Module) -> int | None:
    """The model's sliding attention window, if it uses one."""
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    return int(window) if window and getattr(config, "use_sliding_window", True) else None


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """[B, H, T, D] -> [B, H, width, D], zeros on the left (masked out)."""
    missing = width - t.shape[2]
    if missing <= 0:
        return t
    return torch.cat([t.new_zeros(t.shape[0], t.shape[1], missing, t.shape[3]), t], dim=2)


def _pad_left_2d(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    if missing <= 0:
        return mask
    return torch.cat([mask.new_zeros(mask.shape[0], missing), mask], dim=1)

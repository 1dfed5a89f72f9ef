"""The running batch on an accelerator: a static KV cache, decode steps of static shapes (captured as
CUDA graphs on CUDA), sampling on the device, and the host reading results once per chunk of steps.

A drop-in for `RunningBatch` (engines/batching.py: the same `add`/`step`/`abort` and the same
`Row`/`Finished`), chosen by `worker.impl` (gpu; auto on cuda/npu) for a model `lean_support` accepts.
What differs is how a step runs:

- Slots, not a rectangle. Each row holds a slot of a preallocated cache (model/lean.py `StaticKV`,
  slots = `max_rows`); its prompt is at columns 0..L-1 and its tokens follow, so nothing is padded,
  concatenated or re-selected while rows come and go. A group's prompt is prefilled once (one Hugging
  Face forward for all admitted prompts) and its keys/values are copied into its G slots.
- Buckets. A step runs on slots 0..B-1 and columns 0..Tb-1, B and Tb rounded up (`ROW_BUCKETS`,
  `width_bucket`): a handful of shapes, each captured once (engines/graphs.py). New rows take the
  lowest free slots, so B follows the number of rows.
- A chunk of steps per `step()` call. `step()` admits what fits, then runs k <= CHUNK decode steps
  back to back on the device (the uniforms for all k are computed on the host beforehand: they are
  a pure function of (group key, sample, position), engines/batching.py `uniforms`), and reads the
  k tokens and log-probs of every row in one transfer. Eos, `max_new_tokens` and stop strings are
  checked then: a row that ended inside the chunk keeps its tokens up to its end (the steps after
  are discarded, its slot freed for the next admission). One host sync per chunk, none per step.

Tokens and log-probs equal the running batch's for the same weights and prompts: the same uniforms,
the same behaviour transform (engines/device_sampling.py), logits equal up to float noise (the lean
decoder computes each layer as the model does).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from prl_actors.engines.batching import Finished, GroupQueue, Row, Running, uniforms
from prl_actors.engines.device_sampling import DeviceSampler
from prl_actors.engines.graphs import StepRunner
from prl_actors.engines.sampling import left_pad
from prl_actors.model.lean import Bucket, LeanDecoder, StaticKV

if TYPE_CHECKING:
    from prl_actors.training.behaviour import Behaviour

CHUNK = 8
"""Decode steps between two host reads: at most 1/CHUNK host syncs per step; a row that ends inside
a chunk idles for the rest of it (at most CHUNK - 1 steps)."""
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
"""Batch sizes a step runs at (rounded up; past the last, multiples of 128)."""


def row_bucket(rows: int) -> int:
    for b in ROW_BUCKETS:
        if rows <= b:
            return b
    return -(-rows // 128) * 128


def width_bucket(width: int) -> int:
    """Columns a step attends over: multiples of 64 up to 256, then of 128."""
    step = 64 if width <= 256 else 128
    return -(-width // step) * step


@dataclass
class Views:
    """The step's static inputs and outputs at one bucket (views of the batch's buffers)."""

    cache: Bucket
    ids: torch.Tensor  # [B, 1] the token each row decodes
    pos: torch.Tensor  # [B, 1] its position
    ids_flat: torch.Tensor  # [B] the same tokens
    pos_flat: torch.Tensor  # [B] the same positions
    u: torch.Tensor  # [B, K] the uniforms of the chunk's steps
    tokens: torch.Tensor  # [B, K] drawn tokens
    logprobs: torch.Tensor  # [B, K]
    seen: torch.Tensor | None  # [B, V] (repetition penalty)


class StaticBatch(GroupQueue):
    """The running batch of one model on a static cache (see module docstring). One caller."""

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
        capture: bool | None = None,
    ) -> None:
        super().__init__(
            model, max_rows=max_rows, eos_ids=eos_ids, pad_id=pad_id, max_new_tokens=max_new_tokens, stopper=stopper
        )
        self.decoder = LeanDecoder(model)
        self.device = self.decoder.device
        self.runner = StepRunner(self.device, capture)
        self._behaviour = behaviour
        self.sampler = DeviceSampler(behaviour)
        self.slot_rows: list[Row | None] = []  # the row holding each slot (None: free)
        self.pos_host = np.zeros(0, dtype=np.int64)  # [S] each slot's next position
        self.kv: StaticKV | None = None
        self.seen: torch.Tensor | None = None  # [S, V] with a repetition penalty
        self._said: set[bool] = set()  # "captured" of each decode_graphs note made so far (each said once)
        self.steps = 0  # decode steps run (for tests and the bench)

    # --- RunningBatch's API (add, busy, drain_notes, row_done: GroupQueue) ---------------------

    @property
    def behaviour(self) -> Behaviour:
        return self._behaviour

    @behaviour.setter
    def behaviour(self, b: Behaviour) -> None:
        """Other settings (an evaluation's, and back): steps captured for either stay (keyed by them)."""
        if b != self._behaviour:
            self._behaviour, self.sampler = b, DeviceSampler(b)
            if b.penalised and self.seen is None and self.kv is not None:
                self.seen = self._seen_buffer(self.kv.slots)

    @property
    def running_rows(self) -> int:
        return sum(r is not None for r in self.slot_rows)

    def abort(self) -> list[int]:
        dropped = self._drop_all()
        self.slot_rows = [None] * len(self.slot_rows)
        return dropped

    def weights_changed(self) -> None:
        """The model's parameters (or its LoRA hooks) changed: take the new tensors. Captured steps
        stay when they read the same tensors (new values copied in place, as on an accelerator); new
        tensors or adapter hooks (whose tensors the key does not see) mean capturing again."""
        before = self.decoder.key()
        self.decoder.bind()
        if self.decoder.key() != before or self.decoder.hooked:
            self.runner.reset()

    @torch.no_grad()
    def step(self) -> list[Finished]:
        """Admit what fits, run a chunk of decode steps, return the finished groups."""
        self._admit()
        done = self._finish()
        if any(r is not None for r in self.slot_rows):
            self._chunk()
            done += self._finish()
        return done

    # --- admission ---------------------------------------------------------------------------------

    def _admit(self) -> None:
        free = self.max_rows - self.running_rows
        new: list[Running] = []
        while self.pending:
            joining = bool(self.running_rows or new)
            if joining and self.pending[0].size > free:
                break
            group = self.pending.popleft()
            free -= group.size
            new.append(group)
        if new:
            self._prefill(new)

    def _prefill(self, new: list[Running]) -> None:
        """Encode each new prompt once, copy its keys/values into its G slots, draw the first tokens."""
        sizes = [g.size for g in new]
        lengths = [len(g.prompt_ids) for g in new]
        self._reserve(sum(sizes), max(lengths) + self.max_new_tokens + CHUNK)
        ids, mask = (t.to(self.device) for t in left_pad([g.prompt_ids for g in new], self.pad_id))  # [k, P]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        slots = self._take_slots(new)  # [n] in group order
        owner = np.repeat(np.arange(len(new)), sizes)  # [n] each new row's prompt
        length = np.asarray(lengths)[owner]  # [n]
        self._copy_prompts(out.past_key_values, slots, owner, length, ids.shape[1])
        assert self.kv is not None
        slot_t = torch.as_tensor(slots, device=self.device)
        self.kv.open_rows(slot_t, torch.as_tensor(length, device=self.device))
        self.pos_host[slots] = length
        rows: list[Row | None] = [r for g in new for r in g.rows]
        seen = self._open_seen(slot_t, new, sizes) if self.sampler.penalised else None
        logits = out.logits[:, -1, :].index_select(0, torch.as_tensor(owner, device=self.device))  # [n, V]
        u = uniforms([r.key for r in rows if r], [r.index for r in rows if r], [r.offset for r in rows if r])
        token, logp = self.sampler(logits, torch.as_tensor(u, device=self.device)[:, None], seen)  # [n, 1]
        self.ids[slot_t] = token
        if seen is not None and self.seen is not None:
            self.seen[slot_t, token[:, 0]] = True
        got = torch.cat([token.double(), logp.double()], dim=1).tolist()  # one host read: [n, 2]
        self._record(rows, [[int(t)] for t, _ in got], [[lp] for _, lp in got])

    def _reserve(self, rows: int, width: int) -> None:
        """A cache with room for `rows` more rows `width` wide (new when none or too small)."""
        slots = max(self.max_rows, rows + self.running_rows)
        if self.kv is not None and self.kv.slots >= slots and self.kv.width >= width:
            return
        if self.kv is not None and self.running_rows and self.kv.slots >= slots:
            self.kv = self.kv.grown(width_bucket(width))
        else:
            self._allocate(slots, width_bucket(max(width, self.kv.width if self.kv is not None else 0)))
        self.decoder.rope_table(self.kv.width)  # type: ignore[union-attr]
        self.runner.reset()

    def _allocate(self, slots: int, width: int) -> None:
        d = self.decoder
        self.kv = StaticKV(len(d.layers), slots, d.kv_heads, width, d.head_dim, d.embed)
        self.ids = torch.full((slots, 1), self.pad_id, dtype=torch.long, device=self.device)
        self.pos = torch.zeros((slots, 1), dtype=torch.long, device=self.device)
        self.u = torch.zeros((slots, CHUNK), dtype=torch.float64, device=self.device)
        self.tokens = torch.zeros((slots, CHUNK), dtype=torch.long, device=self.device)
        acc = torch.promote_types(d.dtype, torch.float32)
        self.logprobs = torch.zeros((slots, CHUNK), dtype=acc, device=self.device)
        self.at = torch.zeros(1, dtype=torch.long, device=self.device)  # the step within the chunk
        self.seen = self._seen_buffer(slots) if self.sampler.penalised else None
        self.slot_rows = self.slot_rows + [None] * (slots - len(self.slot_rows))
        self.pos_host = np.concatenate([self.pos_host, np.zeros(slots - len(self.pos_host), dtype=np.int64)])

    def _seen_buffer(self, slots: int) -> torch.Tensor:
        """[slots, vocab] bool: the tokens in each row's context (the repetition penalty's)."""
        return torch.zeros((slots, int(self.decoder.embed.shape[0])), dtype=torch.bool, device=self.device)

    def _take_slots(self, new: list[Running]) -> np.ndarray:
        """The lowest free slots for the new groups' rows (their Row objects made here)."""
        free = [s for s, r in enumerate(self.slot_rows) if r is None]
        now, slots = time.monotonic(), []
        for g in new:
            g.rows = [Row(g.key, g.index + i, offset=g.offset, prompt_ids=g.prompt_ids) for i in range(g.size)]
            g.t_admit = now
            for row in g.rows:
                s = free.pop(0)
                self.slot_rows[s] = row
                slots.append(s)
        self.groups += new
        return np.asarray(slots, dtype=np.int64)

    def _copy_prompts(self, cache: Any, slots: np.ndarray, owner: np.ndarray, length: np.ndarray, width: int) -> None:
        """Each new row's prompt keys/values (left-padded, `width` wide) into columns 0..L-1 of its slot."""
        n = length.sum()
        slot = np.repeat(slots, length)  # [N]
        start = np.repeat(np.cumsum(length) - length, length)
        position = np.arange(n) - start  # [N] 0..L-1 per row
        src = np.repeat(owner, length)
        col = width - np.repeat(length, length) + position  # right-aligned prompts
        index = torch.as_tensor(np.stack([slot, position, src, col]), device=self.device)  # [4, N]
        assert self.kv is not None
        self.kv.write_prompts([(x.keys, x.values) for x in cache.layers], index)

    def _open_seen(self, slots: torch.Tensor, new: list[Running], sizes: list[int]) -> torch.Tensor:
        """Mark each new row's prompt tokens as seen (the penalty's context); returns their rows [n, V]."""
        assert self.seen is not None
        self.seen[slots] = False
        rows = np.repeat(np.arange(len(slots)), np.repeat([len(g.prompt_ids) for g in new], sizes))
        toks = np.concatenate([g.prompt_ids for g, k in zip(new, sizes, strict=True) for _ in range(k)])
        self.seen[slots[torch.as_tensor(rows, device=self.device)], torch.as_tensor(toks, device=self.device)] = True
        return self.seen[slots]

    # --- decoding ----------------------------------------------------------------------------------

    def _chunk(self) -> None:
        """k decode steps on the device for slots 0..B-1, then one read of their tokens."""
        live = [s for s, r in enumerate(self.slot_rows) if r is not None]
        rows = [self.slot_rows[s] for s in live]
        k = min(CHUNK, max(self.max_new_tokens - len(r.tokens) for r in rows if r is not None))
        b = min(row_bucket(live[-1] + 1), len(self.slot_rows))
        assert self.kv is not None
        width = min(width_bucket(int(self.pos_host[live].max()) + k + 1), self.kv.width)
        views = self._views(b, width)
        pos = np.zeros(b, dtype=np.int64)
        pos[live] = self.pos_host[live]
        views.pos_flat.copy_(torch.as_tensor(pos))
        views.u[:, :k] = torch.as_tensor(self._uniforms(live, rows, b, k), device=self.device)
        self.at.zero_()
        key, shape = (self.decoder.key(), id(self.kv)), (b, width, self.sampler.behaviour)
        for _ in range(k):
            self.runner.run(shape, lambda: self._decode(views), key, lambda: self._state(b))
        self.steps += k
        self._note_graphs()
        got = torch.cat([views.tokens[:, :k].double(), views.logprobs[:, :k].double()], dim=1).tolist()  # one read
        self.pos_host[live] += k
        self._record(rows, [[int(t) for t in got[s][:k]] for s in live], [got[s][k:] for s in live])

    def _note_graphs(self) -> None:
        """Say once that steps run as CUDA graphs, and once if capturing them was given up."""
        r = self.runner
        for captured, ok in ((True, r.captures > 0), (False, bool(r.failed))):
            if ok and captured not in self._said:
                why = r.failed or f"{r.captures} step shapes"
                self.notes.append(("decode_graphs", {"captured": captured, "why": why}))
                self._said.add(captured)

    def _uniforms(self, live: list[int], rows: list[Row | None], b: int, k: int) -> np.ndarray:
        """[b, k] the uniform of each live slot's next k draws (free slots: 0.5)."""
        u = np.full((b, k), 0.5)
        held = [r for r in rows if r is not None]
        keys = [r.key for r in held for _ in range(k)]
        index = [r.index for r in held for _ in range(k)]
        steps = [r.offset + len(r.tokens) + i for r in held for i in range(k)]
        u[live] = uniforms(keys, index, steps).reshape(len(live), k)
        return u

    def _views(self, b: int, width: int) -> Views:
        assert self.kv is not None
        cache = self.kv.bucket(b, width)
        seen = self.seen[:b] if self.seen is not None and self.sampler.penalised else None
        ids, pos = self.ids[:b], self.pos[:b]
        return Views(cache, ids, pos, ids[:, 0], pos[:, 0], self.u[:b], self.tokens[:b], self.logprobs[:b], seen)

    def _decode(self, v: Views) -> None:
        """One step on static buffers (what a graph captures): decode, sample, record, advance."""
        logits = self.decoder.step(v.ids_flat, v.pos_flat, v.pos, v.cache)  # [B, V]
        token, logp = self.sampler(logits, v.u.index_select(1, self.at), v.seen)  # [B, 1] each
        v.tokens.index_copy_(1, self.at, token)
        v.logprobs.index_copy_(1, self.at, logp)
        if v.seen is not None:
            v.seen.scatter_(1, token, True)
        v.ids.copy_(token)
        v.pos.add_(1)
        self.at.add_(1)

    def _state(self, b: int) -> list[torch.Tensor]:
        """The buffers a step changes (graphs.py restores them after a capture's warm-up)."""
        assert self.kv is not None
        extra = [self.seen] if self.seen is not None and self.sampler.penalised else []
        return [self.ids, self.pos, self.at, self.kv.bias, *extra]

    # --- results -----------------------------------------------------------------------------------

    def _record(self, rows: list[Row | None], tokens: list[list[int]], logprobs: list[list[float]]) -> None:
        """Append each row's new tokens until it ends (eos, cap, stop string); ended rows free their slot."""
        for row, toks, lps in zip(rows, tokens, logprobs, strict=True):
            if row is None:
                continue
            for t, lp in zip(toks, lps, strict=True):
                row.tokens.append(t)
                row.logprobs.append(lp)
                row.eos = t in self.eos_ids or (self.stopper is not None and self.stopper(row.tokens))
                if self.row_done(row):
                    break

    def _finish(self) -> list[Finished]:
        """Free the slots of ended rows; hand back every group whose rows all ended."""
        for s, row in enumerate(self.slot_rows):
            if row is not None and self.row_done(row):
                self.slot_rows[s] = None
        done = [g for g in self.groups if all(self.row_done(r) for r in g.rows)]
        if done:
            gone = {id(g) for g in done}
            self.groups = [g for g in self.groups if id(g) not in gone]
        now = time.monotonic()
        return [Finished(g.group_id, g.prompt_ids, g.tag, g.rows, now - g.t_admit) for g in done]

"""The accelerator path's micro-batch: whole segments packed into rows, every tensor made in one go.

A segment is a group laid out as [p | r_1 | ... | r_G] (shared prompt: the prompt is encoded once
per group) or, without a shared prompt, one sample [p | r]. Segments are packed first-fit
decreasing into rows of one width T (the longest segment, rounded up to `ALIGN`), so a row may hold
several short segments and padding stays small. Per token the row carries its segment and its
sample (-1 for a prompt token, -2 for padding); `allowed_mask` turns these into the attention
pattern with a constant number of tensor ops (no per-row Python):

    token q sees token k  <=>  k <= q  and  same segment  and  (k is a prompt token or q's own sample)

so a response sees its prompt and its own past, never another response, and nothing crosses a
segment. Padding tokens see earlier padding of their row (no empty softmax row) and no real token
sees them. Position ids: 0..P-1 for the prompt, P..P+L_i-1 for every r_i (as in packing.py).

Everything is built on the host from Python lists (no torch op per row or per sample) and moved to
the device as two tensors (one int64, one float64), so a micro-batch costs a constant number of
dispatched ops and transfers whatever its size. Response tokens are listed in (group, sample,
position) order, as `packing.ModelBatch`, so both training paths compare element-wise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group, Sample

ALIGN = 16
"""Row width is a multiple of this (kernel-friendly shapes; fewer distinct shapes for the allocator)."""
PROMPT, PAD = -1, -2  # `sample` of a prompt token, of a padding token


@dataclass
class DeviceBatch:
    """One micro-batch on the device. input_ids, position_ids, segment, sample: [B, T];
    predict_index [N] (flat index into B*T of the position predicting each response token), targets
    [N], sample_index [N] (0..S-1), keep [N] bool (the token enters the loss), model [N] bool (the
    model sampled it), engine [N] float64 (the engine's log-prob, NaN where none), adv [S] float64.
    Host-side counts (`kept_tokens`, `model_tokens`, `kept_samples`, `samples`) need no sync."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment: torch.Tensor
    sample: torch.Tensor
    predict_index: torch.Tensor
    targets: torch.Tensor
    sample_index: torch.Tensor
    keep: torch.Tensor
    model: torch.Tensor
    engine: torch.Tensor
    adv: torch.Tensor
    samples: int
    kept_samples: int
    kept_tokens: int
    model_tokens: int

    @property
    def tokens(self) -> int:
        """N: response tokens."""
        return int(self.targets.shape[0])


def segments(groups: list[Group], shared_prompt: bool) -> list[tuple[list[int], list[list[int]]]]:
    """(prompt, responses) per segment: one per group (shared prompt) or one per sample."""
    if any(not g.prompt_ids for g in groups):
        raise ValueError("a group needs a non-empty prompt (the first response token is predicted from it)")
    if shared_prompt:
        return [(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups]
    return [(g.prompt_ids, [s.token_ids]) for g in groups for s in g.samples]


def pack_rows(lengths: list[int], align: int = ALIGN) -> tuple[int, list[list[int]]]:
    """(width T, rows): segment indices per row, first-fit decreasing into rows of the longest
    segment rounded up to `align`. Each row lists its segments in the order they were placed."""
    width = -(-max(lengths) // align) * align
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if row is None:
            rows.append([])
            room.append(width)
            row = len(rows) - 1
        rows[row].append(i)
        room[row] -= lengths[i]
    return width, rows


def build(
    groups: list[Group],
    advantages: list[float],
    shared_prompt: bool,
    mask_truncated: bool,
    device: torch.device,
) -> DeviceBatch:
    """The micro-batch of `groups` (advantages: one per sample, group then sample order)."""
    segs = segments(groups, shared_prompt)
    lengths = [len(p) + sum(len(r) for r in rs) for p, rs in segs]
    width, rows = pack_rows(lengths)
    flat = [s for g in groups for s in g.samples]
    first_sample = _first_samples(segs)
    n_rows, cells = len(rows), len(rows) * width
    ids, pos, seg, smp = [0] * cells, [0] * cells, [-1] * cells, [PAD] * cells
    start = [0] * len(segs)  # flat offset of each segment
    for r, members in enumerate(rows):
        at = r * width
        for i in members:
            start[i] = at
            at = _lay(segs[i], i, first_sample[i], at, ids, pos, seg, smp)
    predict, targets, sample_index = _responses(segs, start, first_sample)
    keep_s = [s.finished or not mask_truncated for s in flat]
    model: list[int] = [m for s in flat for m in s.model_mask()]
    keep = [int(keep_s[sample_index[t]] and model[t]) for t in range(len(targets))]
    engine = [x for s in flat for x in _engine_row(s)]
    ints = torch.tensor(ids + pos + seg + smp + predict + targets + sample_index + keep + model, dtype=torch.long)
    floats = torch.tensor(engine + list(advantages), dtype=torch.float64)
    ints, floats = _to_device(ints, device), _to_device(floats, device)
    n = len(targets)
    grid = ints[: 4 * cells].view(4, n_rows, width)  # [4, B, T]
    tok = ints[4 * cells :].view(5, n)  # [5, N]
    return DeviceBatch(
        grid[0],
        grid[1],
        grid[2],
        grid[3],
        tok[0],
        tok[1],
        tok[2],
        tok[3] > 0,
        tok[4] > 0,
        floats[:n],
        floats[n:],
        samples=len(flat),
        kept_samples=sum(keep_s),
        kept_tokens=sum(keep),
        model_tokens=sum(model),
    )


def _first_samples(segs: list[tuple[list[int], list[list[int]]]]) -> list[int]:
    """The global index of each segment's first sample."""
    out, n = [], 0
    for _, rs in segs:
        out.append(n)
        n += len(rs)
    return out


def _lay(
    segment: tuple[list[int], list[list[int]]],
    index: int,
    first: int,
    at: int,
    ids: list[int],
    pos: list[int],
    seg: list[int],
    smp: list[int],
) -> int:
    """Write one segment's tokens from flat offset `at`; returns the offset after it."""
    prompt, responses = segment
    p = len(prompt)
    ids[at : at + p] = prompt
    pos[at : at + p] = range(p)
    seg[at : at + p] = [index] * p
    smp[at : at + p] = [PROMPT] * p
    at += p
    for k, resp in enumerate(responses):
        n = len(resp)
        ids[at : at + n] = resp
        pos[at : at + n] = range(p, p + n)
        seg[at : at + n] = [index] * n
        smp[at : at + n] = [first + k] * n
        at += n
    return at


def _responses(
    segs: list[tuple[list[int], list[list[int]]]], start: list[int], first: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """predict_index, targets and sample_index of every response token, in (segment, sample,
    position) order: r[0] is predicted at the prompt's last position, r[j] at r[j-1]'s."""
    predict: list[int] = []
    targets: list[int] = []
    sample_index: list[int] = []
    for i, (prompt, responses) in enumerate(segs):
        at = start[i] + len(prompt)
        last_prompt = at - 1
        for k, resp in enumerate(responses):
            n = len(resp)
            if n:
                predict.append(last_prompt)
                predict += range(at, at + n - 1)
            targets += resp
            sample_index += [first[i] + k] * n
            at += n
    return predict, targets, sample_index


def _engine_row(s: Sample) -> list[float]:
    """The engine's log-prob per token of a sample (NaN where it gave none: see grpo.engine_logprobs)."""
    mask = s.model_mask()
    if len(s.logprobs) != sum(mask):
        return [float("nan")] * len(mask)
    given = iter(s.logprobs)
    return [next(given) if m else float("nan") for m in mask]


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without blocking the host: through pinned memory on CUDA."""
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def allowed_mask(segment: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool from segment, sample [B, T] (see module docstring): a constant number of ops."""
    width = segment.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool, device=segment.device).tril()  # [T, T]
    same = segment[:, :, None] == segment[:, None, :]  # [B, T, T]
    visible = (sample[:, None, :] == PROMPT) | (sample[:, :, None] == sample[:, None, :])  # [B, T, T]
    return (same & visible & causal)[:, None]

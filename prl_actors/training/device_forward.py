"""The accelerator path's forward: hidden states once over the packed rows, log-probs in vocabulary chunks.

`device_logprobs` runs the model's decoder body on a `DeviceBatch` (training/device_batch.py) with
the block mask, gathers the N hidden states that predict a response token, and scores them with the
LM head in chunks of `VOCAB_CHUNK` vocabulary rows (`head_logprobs`): a running log-sum-exp and the
target's logit, never the [N, V] logits at once, and a backward that recomputes each chunk instead of
keeping it. With a 150k vocabulary and 15k tokens the logits would be 9 GB in float32; here a chunk
is N x 8192. The number of ops is the number of chunks (fixed by the vocabulary), not the tokens.

The chunked head serves the plain behaviour (temperature only: no top-p / top-k / min-p / penalty)
without the entropy bonus, and gives the entropy metric from its own chunks (a running E_q[z] beside
the running log-sum-exp: a constant number of ops per chunk, no gradient); otherwise the [N, V]
logits of the predicting rows are made once and go through training/behaviour.py as on the CPU path.
A model whose head is not a plain `nn.Linear` under its decoder body (logit soft-capping or scaling,
an adapter on the head) is found by `head_split`'s one-time check (body + head == the model's own
logits) and runs whole.

Precision: under autocast the head's matmuls run in the autocast dtype (as `lm_head` would), the
log-sum-exp and the output in float32 (float64 for a float64 model), as behaviour_logprobs.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

from prl_actors.training.behaviour import Behaviour, behaviour_logprobs
from prl_actors.training.losses import optional_entropy

if TYPE_CHECKING:
    from prl_actors.training.device_batch import DeviceBatch

VOCAB_CHUNK = 8192
"""Vocabulary rows per chunk of the head (the Qwen2.5 vocabulary, 151,936 rows: 19 chunks)."""
_SPLITS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, torch.nn.Linear] | None] = weakref.WeakKeyDictionary()


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    kind = t.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else t.dtype


class _HeadLogprob(torch.autograd.Function):
    """log softmax(h W^T + b)[target] / temperature, chunked over W's rows (see module docstring); and,
    `with_entropy`, the distribution's entropy per row, from the same chunks (no gradient: a metric):
    H = lse - E_q[z], E_q[z] kept as a running softmax-weighted sum rescaled as the lse grows."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        compute: torch.dtype,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        whole = weight.shape[0] <= VOCAB_CHUNK
        with torch.autocast(hidden.device.type, enabled=False):
            h = hidden.to(compute)
            lse: torch.Tensor | None = None  # [N] running log-sum-exp
            picked: torch.Tensor | None = None  # [N] the target's logit
            mean_z: torch.Tensor | None = None  # [N] E_q[z] over the chunks so far (with_entropy)
            for start in range(0, weight.shape[0], VOCAB_CHUNK):
                z = _chunk(h, weight, bias, start, temperature, compute)  # [N, c]
                part, mine = torch.logsumexp(z, dim=-1), _target_logit(z, targets, start, whole)
                if with_entropy:
                    mean_z = _mean_logit(mean_z, lse, z, part)
                lse = part if lse is None else torch.logaddexp(lse, part)
                picked = mine if picked is None else picked + mine
        assert lse is not None and picked is not None, "a head with no rows"
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.compute = temperature, compute
        entropy = lse - mean_z if mean_z is not None else lse.new_empty(0)  # [N] or [0]
        ctx.mark_non_differentiable(entropy)
        return picked - lse, entropy  # [N], [N]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _entropy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        t, compute = ctx.temperature, ctx.compute
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros(hidden.shape, dtype=_acc(compute), device=hidden.device) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b else None
        g = grad.to(lse.dtype)  # [N]
        whole = weight.shape[0] <= VOCAB_CHUNK
        with torch.autocast(hidden.device.type, enabled=False):
            h = hidden.to(compute)
            for start in range(0, weight.shape[0], VOCAB_CHUNK):
                z = _chunk(h, weight, bias, start, t, compute)  # [N, c]
                dz = -g[:, None] * torch.exp(z - lse[:, None])  # d(z_t - lse) / dz = onehot - softmax
                dz = _add_target(dz, targets, start, g, whole)
                if t != 1.0:
                    dz = dz / t
                stop = start + dz.shape[1]
                low = dz.to(compute)
                if grad_h is not None:
                    grad_h += (low @ weight[start:stop].to(compute)).to(grad_h.dtype)
                if grad_w is not None:
                    grad_w[start:stop] = (low.T @ h).to(weight.dtype)
                if grad_b is not None:
                    grad_b[start:stop] = dz.sum(0).to(bias.dtype)
        grad_h = None if grad_h is None else grad_h.to(hidden.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def _mean_logit(
    mean_z: torch.Tensor | None, lse: torch.Tensor | None, z: torch.Tensor, part: torch.Tensor
) -> torch.Tensor:
    """[N] E_q[z] over the chunks so far and chunk `z` ([N, c], its log-sum-exp `part`): each side
    weighted by its share of the probability mass, exp(its lse - the joint lse)."""
    mine = (torch.exp(z - part[:, None]) * z).sum(-1)  # [N] E[z] within the chunk
    if mean_z is None or lse is None:
        return mine
    joint = torch.logaddexp(lse, part)
    return mean_z * torch.exp(lse - joint) + mine * torch.exp(part - joint)


def _chunk(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, start: int, t: float, compute: torch.dtype
) -> torch.Tensor:
    """[N, c] the logits of vocabulary rows start.. (at most VOCAB_CHUNK), in the accumulation dtype."""
    w = weight[start : start + VOCAB_CHUNK].to(compute)
    z = h @ w.T if bias is None else torch.addmm(bias[start : start + VOCAB_CHUNK].to(compute), h, w.T)
    z = z.to(_acc(compute))
    return z / t if t != 1.0 else z


def _target_logit(z: torch.Tensor, targets: torch.Tensor, start: int, whole: bool) -> torch.Tensor:
    """[N] each row's target logit if the target is in this chunk (always, for the `whole` vocabulary), else 0."""
    if whole:
        return z.gather(1, targets[:, None])[:, 0]
    local = targets - start
    inside = (local >= 0) & (local < z.shape[1])
    value = z.gather(1, local.clamp(0, z.shape[1] - 1)[:, None])[:, 0]
    return torch.where(inside, value, torch.zeros_like(value))


def _add_target(dz: torch.Tensor, targets: torch.Tensor, start: int, g: torch.Tensor, whole: bool) -> torch.Tensor:
    """dz with +g added at each row's target column, where the target is in this chunk."""
    if whole:
        return dz.scatter_add(1, targets[:, None], g[:, None])
    local = targets - start
    inside = (local >= 0) & (local < dz.shape[1])
    return dz.scatter_add(1, local.clamp(0, dz.shape[1] - 1)[:, None], torch.where(inside, g, 0.0)[:, None])


def head_logprobs(
    hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[N] log q(target) of hidden states [N, H] under `head` and a temperature, chunked (differentiable
    through hidden and the head's parameters)."""
    return head_scores(hidden, head, targets, temperature)[0]


def head_scores(
    hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(`head_logprobs`, and with `with_entropy` the entropy of q per row [N], without gradient)."""
    logp, ent = _HeadLogprob.apply(
        hidden, head.weight, head.bias, targets, float(temperature), _compute_dtype(hidden), with_entropy
    )
    return logp, (ent if with_entropy else None)


def plain(b: Behaviour) -> bool:
    """Is the behaviour a temperature alone (what the chunked head computes)?"""
    return b.temperature > 0 and b.top_p >= 1.0 and b.top_k == 0 and b.min_p == 0 and not b.penalised


def head_split(model: torch.nn.Module) -> tuple[Any, torch.nn.Linear] | None:
    """(decoder body, LM head) when body(x) then head gives the model's own logits (checked once per
    model on a few tokens), else None: the model then runs whole."""
    if model in _SPLITS:
        return _SPLITS[model]
    get_base = getattr(model, "get_base_model", None)  # a PEFT wrapper: the model it wraps
    inner: Any = get_base() if callable(get_base) else model
    body = getattr(inner, "base_model", None)
    get_head = getattr(inner, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    split = (body, head) if body is not None and body is not inner and type(head) is torch.nn.Linear else None
    if split is not None and not _agrees(model, body, split[1]):
        split = None
    _SPLITS[model] = split
    return split


@torch.no_grad()
def _agrees(model: torch.nn.Module, body: Any, head: torch.nn.Linear) -> bool:
    """Does head(body(x)) reproduce model(x).logits on a few tokens?"""
    ids = torch.arange(1, 7, device=head.weight.device)[None] % head.weight.shape[0]  # [1, 6]
    with torch.autocast(ids.device.type, enabled=False):  # in the master weights' own precision
        whole = model(input_ids=ids, use_cache=False).logits.float()
        parts = head(body(input_ids=ids, use_cache=False)[0]).float()
    return bool(whole.shape == parts.shape and torch.allclose(whole, parts, rtol=1e-4, atol=1e-4))


def attention_mask(model: torch.nn.Module, allowed: torch.Tensor, position_ids: torch.Tensor) -> Any:
    """The [B, 1, T, T] bool block mask as `model` takes it: bool for SDPA, additive float for other
    attention; with a sliding window (Mistral, Qwen2 with use_sliding_window) the window applied here
    (HF applies it only to masks it builds itself), by layer type where the model mixes both."""
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or [])
    mask: Any = allowed
    if window and (not types or "sliding_attention" in types):
        distance = position_ids[:, None, :, None] - position_ids[:, None, None, :]  # [B, 1, T, T]
        windowed = allowed & (distance < window)
        mask = {"full_attention": allowed, "sliding_attention": windowed} if "full_attention" in types else windowed
    if getattr(config, "_attn_implementation", "sdpa") in ("sdpa", "prl_blocks"):
        return mask
    dtype = next(model.parameters()).dtype
    if isinstance(mask, dict):
        return {k: _additive(v, dtype) for k, v in mask.items()}
    return _additive(mask, dtype)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))


def device_logprobs(
    model: torch.nn.Module,
    batch: DeviceBatch,
    mask: Any,
    behaviour: Behaviour,
    context: torch.Tensor | None = None,
    with_entropy: bool = False,
    measure_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log q(target) [N], entropy [N] or None) of every response token of `batch` under `model`:
    the entropy with its gradient (`with_entropy`: the bonus) or, `measure_entropy` alone, its value
    (the metric: from the chunked head's own chunks, or the logits already made, under no_grad)."""
    split = head_split(model)
    inputs = {"input_ids": batch.input_ids, "attention_mask": mask, "position_ids": batch.position_ids}
    if split is None:
        logits = model(**inputs, use_cache=False).logits  # [B, T, V]
        picked = logits.flatten(0, 1)[batch.predict_index]  # [N, V]
    else:
        body, head = split
        hidden = body(**inputs, use_cache=False)[0].flatten(0, 1)[batch.predict_index]  # [N, H]
        if plain(behaviour) and not with_entropy:
            return head_scores(hidden, head, batch.targets, behaviour.temperature, measure_entropy)
        picked = head(hidden)  # [N, V]
    logp = behaviour_logprobs(picked, batch.targets, behaviour, context=context)
    return logp, optional_entropy(picked, behaviour, context, with_entropy, measure_entropy)

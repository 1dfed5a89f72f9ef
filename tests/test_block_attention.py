"""The "prl_blocks" attention (model/block_attention.py): the flat shared-prompt row without a dense
mask gives the dense packed path's log-probs *and gradients*, for every family it serves, and falls
back to the dense mask where it cannot serve (eager attention, sliding windows)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prl_actors.model import block_attention
from prl_actors.model.block_attention import BUCKET_SLACK, NAME, build_blocks, dense_allowed, use_blocks
from prl_actors.model.builtin import load_model
from prl_actors.model.tiny import FAMILIES
from prl_actors.training.packing import (
    DENSE_MAX_ROW,
    collate,
    collate_blocks,
    collate_packed,
    collate_unpacked,
    pack_group,
    response_logprobs,
)
from tests.learning_utils import tiny_model

pytestmark = pytest.mark.fast

GROUPS = [
    ([1, 5, 14, 6, 16], [[7, 2], [8, 9, 10, 2], [11]]),
    ([1, 4, 14, 4, 16, 7, 7], [[8, 2], [], [9, 9, 9, 9, 2]]),  # an empty response, a long one
    ([1, 13, 16], [[5, 6, 2]]),
    ([1, 9], []),  # a group without samples
    ([1, 8, 8, 8, 8, 8, 8, 8, 8, 16], [[5] * 12, [6] * 3, [7, 2]]),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("blocks"))[1]


def weighted_backward(model: torch.nn.Module, batch: object) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [N], every parameter's gradient flat) of sum_t w_t logp_t, w_t distinct per token
    (so a gradient routed to the wrong token, or lost, shows)."""
    logp = response_logprobs(model, batch)  # type: ignore[arg-type]
    weights = torch.linspace(-1.0, 2.0, logp.numel(), dtype=logp.dtype)
    (weights * logp).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logp.detach(), grads


def test_flat_row_layout() -> None:
    batch = collate_blocks([([1, 2, 3], [[4, 5], [6]])])
    row = pack_group([1, 2, 3], [[4, 5], [6]])
    assert batch.input_ids.tolist() == [row.ids] and batch.position_ids.tolist() == [row.positions]
    assert batch.predict_index.tolist() == row.predict and batch.targets.tolist() == row.targets
    assert batch.attention_mask is None
    assert torch.equal(dense_allowed([3], [[2, 1]]), row.allowed)


def test_blocks_cover_every_token_once_within_the_slack() -> None:
    prompts, responses = [len(p) for p, _ in GROUPS], [[len(r) for r in rs] for _, rs in GROUPS]
    blocks = build_blocks(prompts, responses)
    n = sum(prompts) + sum(map(sum, responses))
    rows = torch.cat([b.queries.flatten() for b in blocks.buckets])  # flat position held by each query slot
    assert torch.equal(rows[blocks.back], torch.arange(n))  # every token reads back its own slot
    assert blocks.back.unique().numel() == n  # ... and no two tokens the same one
    assert sum(b.mask is None for b in blocks.buckets) >= 1  # the prompts: square causal rows, no mask
    for b in blocks.buckets:
        if b.mask is None:
            assert torch.equal(b.queries, b.keys)
            continue
        # a response row's queries are the last of its keys, and query i sees the keys up to its own
        lq = (b.queries != 0).sum(1)
        lk = (b.keys != 0).sum(1) + (b.keys[:, 0] == 0)  # position 0 only opens a row
        real = int((lq * lk).sum())
        assert b.queries.numel() * b.keys.shape[1] <= BUCKET_SLACK * real or b.queries.shape[0] == 1
        for i in range(b.queries.shape[0]):
            q, k = int(lq[i]), int(lk[i])
            assert torch.equal(b.queries[i, :q], b.keys[i, k - q : k])
            assert b.mask[i, 0, :q, :].sum(1).tolist() == list(range(k - q + 1, k + 1))


@pytest.mark.parametrize("mask_max", [block_attention.MASK_MAX, 0], ids=["response-queries", "whole-rows"])
def test_blocks_equal_the_dense_packed_row_and_unpacked(
    model_dir: Path, mask_max: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float64: log-probs and gradients of every parameter equal the dense-mask packed path (with
    response rows querying only their own tokens, and as whole causal rows past MASK_MAX)."""
    monkeypatch.setattr(block_attention, "MASK_MAX", mask_max)
    model = load_model(model_dir, dtype="float64")
    assert use_blocks(model) and model.config._attn_implementation == NAME
    logp_b, grad_b = weighted_backward(model, collate_blocks(GROUPS))
    dense = load_model(model_dir, dtype="float64")
    logp_d, grad_d = weighted_backward(dense, collate_packed(GROUPS))
    assert dense.config._attn_implementation == "sdpa"  # the dense path never switches a model
    logp_u = response_logprobs(dense, collate_unpacked(GROUPS)).detach()
    assert logp_b.numel() == 34
    assert (logp_b - logp_d).abs().max().item() < 1e-12
    assert (logp_b - logp_u).abs().max().item() < 1e-12
    assert (grad_b - grad_d).abs().max().item() < 1e-10 * grad_d.abs().max().item()


def test_the_prompt_gets_gradient_from_every_response(model_dir: Path) -> None:
    """Cutting the responses' path to the prompt's keys/values changes the gradient: the test above
    checks the gradient through the prompt, not only the log-probs."""
    model = load_model(model_dir, dtype="float64")
    batch = collate_blocks(GROUPS)
    _, full = weighted_backward(model, batch)
    model.zero_grad()
    embed = model.get_input_embeddings()
    n_prompt = [len(p) for p, _ in GROUPS]
    starts = torch.tensor([0, *torch.cumsum(torch.tensor([len(p) + sum(map(len, rs)) for p, rs in GROUPS]), 0)[:-1]])
    is_prompt = torch.zeros(batch.input_ids.shape[1], dtype=torch.bool)
    for s, n in zip(starts.tolist(), n_prompt, strict=True):
        is_prompt[s : s + n] = True
    handle = embed.register_forward_hook(lambda _m, _i, out: torch.where(is_prompt[None, :, None], out.detach(), out))
    try:
        _, cut = weighted_backward(model, batch)
    finally:
        handle.remove()
    assert (full - cut).abs().max().item() > 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_families(family: str, family_dirs: dict[str, Path]) -> None:
    """Rotary (GQA) and absolute positions take the blocks; Mistral's sliding window keeps a dense
    mask (built from the flat row); both equal the unpacked log-probs."""
    model = load_model(family_dirs[family], dtype="float64")
    groups = [([5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [[20, 21, 22], [23] * 9, [24]]), ([30, 31], [[40, 41]])]
    with torch.no_grad():
        blocks = response_logprobs(model, collate_blocks(groups))
        unpacked = response_logprobs(model, collate_unpacked(groups))
    assert model.config._attn_implementation == ("sdpa" if family == "mistral" else NAME)
    assert (blocks - unpacked).abs().max().item() < 1e-10


def test_eager_models_use_the_dense_mask(model_dir: Path) -> None:
    model = load_model(model_dir, attn_implementation="eager", dtype="float64")
    with torch.no_grad():
        flat = response_logprobs(model, collate_blocks(GROUPS))
        dense = response_logprobs(model, collate_packed(GROUPS))
    assert model.config._attn_implementation == "eager"
    assert (flat - dense).abs().max().item() < 1e-12


def test_a_switched_model_is_sdpa_everywhere_else(model_dir: Path) -> None:
    """Generation and padded batches on a "prl_blocks" model: the SDPA results, bit for bit."""
    plain, switched = load_model(model_dir), load_model(model_dir)
    assert use_blocks(switched)
    batch = collate_unpacked(GROUPS)
    with torch.no_grad():
        assert torch.equal(response_logprobs(plain, batch), response_logprobs(switched, batch))
        ids = torch.tensor([[0, 0, 1, 5, 14], [1, 4, 14, 4, 16]])
        mask = (ids != 0).long()
        kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": 6, "pad_token_id": 0}
        assert torch.equal(plain.generate(input_ids=ids, **kwargs), switched.generate(input_ids=ids, **kwargs))


def test_the_trainer_takes_blocks_for_long_rows_only() -> None:
    long = [([1] * 100, [[2] * (DENSE_MAX_ROW - 100), [3]])]  # one token over the threshold
    assert collate(long, shared_prompt=True).blocks is not None
    assert collate(GROUPS, shared_prompt=True).blocks is None  # short rows: the dense packed rows
    assert collate(GROUPS, shared_prompt=True).attention_mask is not None
    assert collate(long, shared_prompt=False).blocks is None

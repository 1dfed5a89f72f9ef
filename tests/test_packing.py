"""Shared-prompt packing: layout by hand, and packed log-probs == unpacked log-probs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prl_actors.model.builtin import load_model
from prl_actors.training.packing import collate_packed, collate_unpacked, pack_group, response_logprobs
from tests.learning_utils import tiny_model

pytestmark = pytest.mark.fast

PROMPT = [1, 5, 14, 6, 16]
GROUPS = [
    (PROMPT, [[7, 2], [8, 9, 10, 2], [11]]),
    ([1, 4, 14, 4, 16], [[8, 2], [], [9, 9, 9, 9, 2]]),  # an empty response, and a long one
    ([1, 13, 16], [[5, 6, 2]]),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("packing"))[1]


def test_pack_group_layout() -> None:
    row = pack_group([1, 2, 3], [[4, 5], [6]])
    assert row.ids == [1, 2, 3, 4, 5, 6]
    assert row.positions == [0, 1, 2, 3, 4, 3]  # responses restart at len(prompt)
    assert row.predict == [2, 3, 2]  # r1[0] <- last prompt pos, r1[1] <- r1[0], r2[0] <- last prompt pos
    assert row.targets == [4, 5, 6]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 0, 0, 1],  # r2 sees the prompt and itself, never r1
        ],
        dtype=torch.bool,
    )
    assert torch.equal(row.allowed, expected)


def test_batches_list_tokens_in_the_same_order() -> None:
    packed, unpacked = collate_packed(GROUPS), collate_unpacked(GROUPS)
    assert torch.equal(packed.targets, unpacked.targets)
    assert torch.equal(packed.sample_index, unpacked.sample_index)
    assert packed.attention_mask.shape == (3, 1, packed.input_ids.shape[1], packed.input_ids.shape[1])
    assert packed.sample_index.tolist() == [0, 0, 1, 1, 1, 1, 2, 3, 3, 5, 5, 5, 5, 5, 6, 6, 6]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_unpacked(model_dir: Path, attn: str) -> None:
    model = load_model(model_dir, attn_implementation=attn)
    with torch.no_grad():
        packed = response_logprobs(model, collate_packed(GROUPS))  # [N]
        unpacked = response_logprobs(model, collate_unpacked(GROUPS))  # [N]
        single = torch.cat([response_logprobs(model, collate_unpacked([g])) for g in GROUPS])
    assert packed.shape == (17,)
    assert torch.allclose(packed, unpacked, atol=1e-5, rtol=0)
    assert torch.allclose(unpacked, single, atol=1e-5, rtol=0)


def test_the_mask_matters(model_dir: Path) -> None:
    """Letting responses see each other changes the log-probs: the test above is not vacuous."""
    model = load_model(model_dir)
    batch = collate_packed(GROUPS[:1])
    leaky = collate_packed(GROUPS[:1])
    t = leaky.input_ids.shape[1]
    leaky.attention_mask = torch.zeros(1, 1, t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -torch.inf)
    with torch.no_grad():
        diff = (response_logprobs(model, batch) - response_logprobs(model, leaky)).abs().max()
    assert diff > 1e-3


def test_packed_gradients_equal_unpacked(model_dir: Path) -> None:
    grads = []
    for collate in (collate_packed, collate_unpacked):
        model = load_model(model_dir)
        response_logprobs(model, collate(GROUPS)).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)

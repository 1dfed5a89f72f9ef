"""Continuous batching: the running batch admits groups as rows free up, streams finished groups, and
gives every group the samples it would get alone (counter-based sampling)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from prl_actors.config import load_config
from prl_actors.engines.base import EngineBusy
from prl_actors.engines.batching import draw, prefix_check, uniforms
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.protocol.messages import Prompt

pytestmark = pytest.mark.fast

TEXTS = ["1+2=", "13+4=", "10+11=", "7+0=", "19+20=", "5+5=", "0+0=", "12+9="]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("batching")
    cfg = load_config(None, {"run.run_dir": str(run), "model.warm_start_steps": 40})
    return build.model_dir(cfg, run)


def engine(model_dir: Path, max_rows: int, **sampling: float) -> TorchEngine:
    overrides = {"worker.max_batch_rows": max_rows, "worker.sampling.max_new_tokens": 6}
    overrides.update({f"worker.sampling.{k}": v for k, v in sampling.items()})
    e = TorchEngine(build.engine_settings(load_config(None, overrides)), model_dir)
    e.version = 3
    return e


def prompts(texts: list[str]) -> list[Prompt]:
    return [Prompt(group_id=i, prompt=t) for i, t in enumerate(texts)]


def samples(groups: list) -> dict[int, list[tuple[list[int], list[float]]]]:  # type: ignore[type-arg]
    return {g.group_id: [(s.token_ids, s.logprobs) for s in g.samples] for g in groups}


def assert_same_samples(
    a: dict[int, list[tuple[list[int], list[float]]]], b: dict[int, list[tuple[list[int], list[float]]]]
) -> None:
    """The same tokens in every group, and log-probs equal up to float noise of batched matmuls."""
    assert {g: [t for t, _ in rows] for g, rows in a.items()} == {g: [t for t, _ in rows] for g, rows in b.items()}
    diff = max(
        abs(x - y) for g in a for (_, la), (_, lb) in zip(a[g], b[g], strict=True) for x, y in zip(la, lb, strict=True)
    )
    assert diff < 1e-4


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.6, "top_p": 0.8}], ids=["t1", "t0.6-p0.8"])
def test_a_group_gets_the_same_samples_whatever_shares_the_batch(model_dir: Path, sampling: dict) -> None:  # type: ignore[type-arg]
    together = samples(engine(model_dir, 1000, **sampling).generate(prompts(TEXTS), 8))
    streamed = samples(engine(model_dir, 16, **sampling).generate(prompts(TEXTS), 8))  # 2 groups at a time
    alone = samples(engine(model_dir, 8, **sampling).generate([Prompt(group_id=5, prompt=TEXTS[5])], 8))
    assert_same_samples(together, streamed)
    tokens = {g: [t for t, _ in rows] for g, rows in together.items()}
    assert tokens[5] == [t for t, _ in alone[5]]
    assert len({tuple(t) for rows in tokens.values() for t in rows}) > len(TEXTS)  # samples do differ


def test_groups_stream_out_while_later_groups_wait(model_dir: Path) -> None:
    e = engine(model_dir, 16)
    e.admit(prompts(TEXTS), 8)
    seen: list[tuple[int, int]] = []  # (group id, rows still queued when it finished)
    while e.busy:
        seen += [(g.group_id, len(e.batch.pending)) for g in e.step()]
    assert sorted(g for g, _ in seen) == list(range(len(TEXTS)))
    assert seen[0][1] >= len(TEXTS) - 4, "the first group must finish while most groups still wait"
    assert e.batch.running_rows == 0


def test_weights_never_change_under_a_running_batch(model_dir: Path) -> None:
    e = engine(model_dir, 16)
    state = {k: v.clone() for k, v in e.model.state_dict().items()}
    e.admit(prompts(TEXTS[:3]), 8)
    e.step()
    with pytest.raises(EngineBusy):
        e.load_weights(4, state)
    assert sorted(e.abort()) == [0, 1, 2] and not e.busy
    e.load_weights(4, state)
    assert e.version == 4


def test_uniforms_are_a_pure_function_of_key_row_and_step() -> None:
    keys, rows, steps = [7] * 4000, list(range(4000)), [3] * 4000
    u = uniforms(keys, rows, steps)
    assert np.array_equal(u, uniforms(keys, rows, steps))
    assert np.array_equal(u[::-1], uniforms(keys[::-1], rows[::-1], steps[::-1]))  # order does not matter
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.02
    assert not np.array_equal(u, uniforms([8] * 4000, rows, steps))


def test_draw_follows_the_tempered_nucleus() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]]).repeat(20000, 1)  # [N, 5]
    u = uniforms([11] * 20000, list(range(20000)), [0] * 20000)
    token = draw(logits, u, temperature=0.7, top_p=0.9)
    probs = torch.softmax(logits[0] / 0.7, dim=-1)
    kept = probs.cumsum(0) - probs < 0.9  # the nucleus: tokens 0, 1 (and 2 if needed)
    want = torch.where(kept, probs, 0.0)
    want = want / want.sum()
    got = torch.bincount(token, minlength=5).double() / len(token)
    assert torch.allclose(got, want.double(), atol=0.01), (got, want)
    assert got[~kept].sum() == 0


def test_done_rows_leaving_early_the_shared_prefix_and_the_in_place_cache_change_no_sample(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prl_actors.engines import batching

    def run(shared: bool) -> tuple[dict[int, list[tuple[list[int], list[float]]]], int, int]:
        e = engine(model_dir, 1000)
        assert prefix_check(e.model)[0]  # the built-in model routes the shared-prefix store
        e.batch.can_share = shared
        e.batch.max_new_tokens = 24
        e.admit(prompts(TEXTS), 8)
        out, early, prompts_held = [], 0, 0
        while e.busy:
            out += e.step()
            in_groups = sum(len(g.rows) for g in e.batch.groups)
            early = max(early, in_groups - e.batch.running_rows)  # rows gone before their group ended
            if e.batch.store is not None:
                prompts_held = max(prompts_held, e.batch.store.pk[0].shape[0])
        return samples(out), early, prompts_held

    monkeypatch.setattr(batching, "SHARE_FROM", 0)  # the store for these short prompts too
    shared, early_shared, held = run(True)  # one prompt per group in the store, done rows leave
    assert 0 < held <= len(TEXTS) and early_shared > 0
    monkeypatch.setattr(batching, "GROW_FROM", 0)  # the ordinary cache, written in place
    left, early, none = run(False)
    monkeypatch.setattr(batching, "COMPACT", 0)  # done rows stay until their group ends (the old way)
    monkeypatch.setattr(batching, "GROW_FROM", 10**9)  # and the cache grows by concatenation
    stayed, never, _ = run(False)
    assert early > 0 and never == 0 and none == 0
    assert_same_samples(left, stayed)
    assert_same_samples(shared, stayed)


def test_the_growing_cache_holds_what_concatenation_would_without_copying_each_step() -> None:
    from transformers.cache_utils import DynamicLayer

    from prl_actors.engines.batching import GrowingLayer

    torch.manual_seed(0)
    plain, grown = DynamicLayer(), GrowingLayer()

    def both(k: torch.Tensor, v: torch.Tensor) -> None:
        a, b = plain.update(k, v), grown.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    both(torch.randn(4, 2, 5, 3), torch.randn(4, 2, 5, 3))  # a prefill
    both(torch.randn(4, 2, 1, 3), torch.randn(4, 2, 1, 3))  # the first decode moves it into a buffer
    where = grown.keys.data_ptr()
    for _ in range(40):  # decode steps inside the room: written in place, nothing copied
        both(torch.randn(4, 2, 1, 3), torch.randn(4, 2, 1, 3))
        assert grown.keys.data_ptr() == where
    index = torch.tensor([3, 1])
    plain.batch_select_indices(index)
    grown.batch_select_indices(index)
    both(torch.randn(2, 2, 1, 3), torch.randn(2, 2, 1, 3))
    for layer in (plain, grown):  # replaced from outside (RunningBatch crops left padding): noticed
        layer.keys, layer.values = layer.keys[:, :, 4:], layer.values[:, :, 4:]
    for _ in range(80):  # past the room: the buffer grows
        both(torch.randn(2, 2, 1, 3), torch.randn(2, 2, 1, 3))
    assert grown.keys.shape == plain.keys.shape == (2, 2, 5 + 41 + 1 - 4 + 80, 3)


def test_short_prompts_keep_the_per_row_cache_and_never_pay_for_the_store_check(model_dir: Path) -> None:
    e = engine(model_dir, 1000)
    groups = e.generate(prompts(TEXTS), 4)  # prompts of a few tokens: below SHARE_FROM
    assert len(groups) == len(TEXTS)
    assert e.batch.can_share is None and not e.batch.shared  # the model was never checked
    assert e.model.config._attn_implementation == "sdpa"


def test_the_engine_says_once_which_decode_attention_its_model_got(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prl_actors.engines import batching
    from prl_actors.engines.base import engine_notes

    monkeypatch.setattr(batching, "SHARE_FROM", 0)
    e = engine(model_dir, 1000)
    e.generate(prompts(TEXTS[:2]), 4)
    ((event, fields),) = engine_notes(e)
    assert event == "decode_attention" and fields["shared_prefix"] is True
    assert fields["why"].startswith("logits match"), fields
    e.generate(prompts(TEXTS[2:4]), 4)
    assert engine_notes(e) == []  # said once

"""Shared-prefix decode attention (model/prefix_attention.py): one prompt per group in the store, the
same attention as SDPA over each row's [prompt | own tokens], and the engine's check that a model
routes it (engines/batching.py `prefix_check`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from prl_actors.engines.batching import prefix_check
from prl_actors.model.builtin import load_model
from prl_actors.model.prefix_attention import PrefixKV
from prl_actors.model.tiny import build_family

H, HKV, D = 4, 2, 8  # GQA: two query heads per key head


def prompt(n: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prompt of n real positions in `width` (left padding): keys, values [1, H_kv, width, d], valid."""
    valid = torch.zeros(1, width, dtype=torch.bool)
    valid[0, width - n :] = True
    return torch.randn(1, HKV, width, D, dtype=torch.float64), torch.randn(1, HKV, width, D, dtype=torch.float64), valid


def reference(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """SDPA per row over its own [prompt | tokens] (padding dropped): [R, 1, H, d]."""
    out = []
    for i in range(q.shape[0]):
        k = keys[i].repeat_interleave(H // HKV, dim=0)[None]  # [1, H, L, d]
        v = values[i].repeat_interleave(H // HKV, dim=0)[None]
        out.append(F.scaled_dot_product_attention(q[i : i + 1], k, v).transpose(1, 2))
    return torch.cat(out)


def test_the_store_attends_like_sdpa_over_each_rows_prompt_and_tokens() -> None:
    """Groups of different prompt lengths and sizes join a running store, rows leave, a group leaves
    whole, the suffix buffer outgrows its room: every step equals SDPA over the row's own keys (float64)."""
    torch.manual_seed(0)
    store = PrefixKV(layers=1)
    rows: list[tuple[torch.Tensor, torch.Tensor]] = []  # per row: its real keys / values so far [H_kv, L, d]

    def join(lengths: list[int], sizes: list[int]) -> None:
        width = max(lengths)
        parts = [prompt(n, width) for n in lengths]
        k, v, valid = (torch.cat([p[i] for p in parts]) for i in range(3))
        store.add([(k, v)], valid, sizes)
        for g, size in enumerate(sizes):
            real = valid[g]
            rows.extend([(k[g][:, real], v[g][:, real])] * size)

    def step() -> None:
        r = len(rows)
        q = torch.randn(r, H, 1, D, dtype=torch.float64)
        nk, nv = torch.randn(r, HKV, 1, D, dtype=torch.float64), torch.randn(r, HKV, 1, D, dtype=torch.float64)
        for i in range(r):
            rows[i] = (torch.cat([rows[i][0], nk[i]], 1), torch.cat([rows[i][1], nv[i]], 1))
        store.begin()
        got = store.attend(0, q, nk, nv, None)
        store.end()
        want = reference(q, [k for k, _ in rows], [v for _, v in rows])
        assert (got - want).abs().max().item() < 1e-12

    def keep(index: list[int]) -> None:
        store.select(torch.tensor(index))
        rows[:] = [rows[i] for i in index]

    join([5, 3], [3, 3])  # every group whole: the rows are the slots
    for _ in range(4):
        step()
    join([7], [4])  # joins a running batch: a wider prompt, more rows, rows with fewer tokens
    step()
    keep([0, 2, 3, 5, 6, 9])  # rows of every group leave
    step()
    keep([3, 4, 5])  # group 0 leaves whole: its prompt is dropped
    assert store.pk[0].shape[0] == 2 and store.rows == 3
    for _ in range(70):  # past the buffer's room
        step()
    assert store.pk[0].shape[0] == 2  # one prompt per group, whatever its rows


def test_a_step_that_bypasses_the_store_is_an_error() -> None:
    store = PrefixKV(layers=2)
    k, v, valid = prompt(3, 3)
    store.add([(k, v), (k, v)], valid, [2])
    store.begin()
    store.attend(
        0,
        torch.randn(2, H, 1, D, dtype=torch.float64),
        k[:, :, :1].repeat(2, 1, 1, 1),
        v[:, :, :1].repeat(2, 1, 1, 1),
        None,
    )
    with pytest.raises(RuntimeError, match="1 of 2 layers"):
        store.end()


class Swallows(torch.nn.Module):
    """A model that drops unknown keywords before its layers (as a wrapper may): the store never sees a step."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, **kwargs: object) -> object:
        kwargs.pop("prl_prefix", None)
        return self.inner(**kwargs)


def test_only_models_that_route_the_store_use_it(tmp_path: Path) -> None:
    qwen = load_model(build_family("qwen2", tmp_path / "qwen2"), dtype="float32")
    routed, why = prefix_check(qwen)
    assert routed and why.startswith("logits match"), why
    mistral = load_model(build_family("mistral", tmp_path / "mistral"), dtype="float32")
    assert prefix_check(mistral) == (False, "sliding-window attention")  # the ordinary cache
    other = load_model(build_family("llama", tmp_path / "llama"), dtype="float32")
    routed, why = prefix_check(Swallows(other))
    assert not routed and "0 of 2 layers used the shared-prefix attention" in why, why
    assert other.config._attn_implementation == "sdpa"  # switched back after the failed check
    eager = load_model(build_family("gpt2", tmp_path / "gpt2"), dtype="float32")
    eager.config._attn_implementation = "eager"
    assert prefix_check(eager) == (False, "attention implementation 'eager' (the store needs sdpa)")

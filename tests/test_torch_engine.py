"""The torch engine: log-probs agree with the trainer, weights swap by version, sampling controls."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from prl_actors.engines.batching import RunningBatch
from prl_actors.engines.sampling import top_p_filter
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.model.builtin import load_model
from prl_actors.model.tokenizer import EOS_ID
from prl_actors.sections import ConfigError
from prl_actors.training.behaviour import Behaviour
from prl_actors.training.packing import collate_packed
from prl_actors.training.trimodel import TriModel
from tests.learning_utils import prompts, tiny_model

pytestmark = pytest.mark.fast

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0="]  # different lengths: left padding is exercised


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    return tiny_model(tmp_path_factory.mktemp("engine"))


@pytest.fixture
def engine(setup) -> TorchEngine:
    cfg, model_dir = setup
    eng = TorchEngine(build.engine_settings(cfg), model_dir)
    eng.load_weights(0, load_model(model_dir).state_dict())
    return eng


def flat_logprobs(groups) -> torch.Tensor:
    return torch.tensor([lp for g in groups for s in g.samples for lp in s.logprobs])


def test_engine_logprobs_equal_trimodel_forward(setup, engine: TorchEngine) -> None:
    groups = engine.generate(prompts(TEXTS), 4)
    batch = collate_packed([(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups])
    tri = TriModel(load_model(setup[1]), with_reference=True)
    with torch.no_grad():
        out = tri(batch)
    engine_lp = flat_logprobs(groups)
    assert engine_lp.numel() > len(TEXTS) * 4  # some responses longer than one token
    assert torch.allclose(out.policy, engine_lp, atol=1e-4, rtol=0)
    assert out.ref is not None and torch.equal(out.ref, out.policy)  # nothing trained yet


def test_responses_stop_on_eos_or_length(engine: TorchEngine) -> None:
    groups = engine.generate(prompts(TEXTS), 4)
    assert [g.group_id for g in groups] == [0, 1, 2, 3]
    assert all(g.prompt_ids[0] == 1 for g in groups)  # <bos>
    for s in (s for g in groups for s in g.samples):
        assert len(s.token_ids) == len(s.logprobs) >= 1
        if s.finished:
            assert s.token_ids[-1] == EOS_ID and EOS_ID not in s.token_ids[:-1]
        else:
            assert len(s.token_ids) == 5 and EOS_ID not in s.token_ids
    assert any(s.finished for g in groups for s in g.samples)


def test_same_version_and_group_is_deterministic_and_batch_independent(engine: TorchEngine) -> None:
    a = engine.generate(prompts(TEXTS), 4)
    b = engine.generate(prompts(TEXTS), 4)
    alone = engine.generate(prompts(TEXTS)[2:3], 4)
    assert [s.token_ids for g in a for s in g.samples] == [s.token_ids for g in b for s in g.samples]
    assert [s.token_ids for s in alone[0].samples] == [s.token_ids for s in a[2].samples]


def test_load_weights_swaps_by_version(setup, engine: TorchEngine) -> None:
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    before = engine.generate(prompts(TEXTS), 4)
    noisy = {k: (v + 0.05 * torch.randn_like(v)).numpy() for k, v in original.items()}  # numpy works too
    for arr in noisy.values():
        arr.flags.writeable = False  # like arrays viewing a received frame
    engine.load_weights(0, noisy)
    assert engine.version == 0
    changed = engine.generate(prompts(TEXTS), 4)
    assert not torch.allclose(flat_logprobs(before)[:8], flat_logprobs(changed)[:8])
    engine.load_weights(0, original)
    again = engine.generate(prompts(TEXTS), 4)
    assert torch.equal(flat_logprobs(before), flat_logprobs(again))
    engine.load_weights(7, original)
    assert engine.version == 7  # a new version also draws new random numbers


def test_a_snapshot_becomes_the_parameters_without_a_copy_and_generates_as_a_copy_would(
    setup, engine: TorchEngine
) -> None:
    """CPU, same dtypes: the engine's parameters view the received snapshot's buffer (same-host workers
    then share one /dev/shm file's pages); the samples equal those of an engine that copied them in."""
    from prl_actors.weights.tensors import unpack
    from prl_actors.weights.transfer import Snapshot

    cfg, model_dir = setup
    noisy = {k: v + 0.05 * torch.randn_like(v) for k, v in load_model(model_dir).state_dict().items()}
    snap = Snapshot.from_tensors(3, noisy)
    engine.load_weights(3, unpack(snap.metas, snap.data, as_torch=True))
    base = np.frombuffer(snap.data, dtype=np.uint8).ctypes.data
    inside = [base <= p.data_ptr() < base + snap.nbytes for p in engine.model.parameters()]
    assert all(inside), "a parameter was copied"
    copied = TorchEngine(build.engine_settings(cfg), model_dir)
    copied.model.load_state_dict(noisy)  # the copying path
    copied.version = 3
    a, b = engine.generate(prompts(TEXTS), 4), copied.generate(prompts(TEXTS), 4)
    assert [s.token_ids for g in a for s in g.samples] == [s.token_ids for g in b for s in g.samples]
    assert torch.equal(flat_logprobs(a), flat_logprobs(b))


def test_load_weights_rejects_mismatch(engine: TorchEngine) -> None:
    state = dict(engine.model.state_dict())
    name = next(iter(state))
    missing = {k: v for k, v in state.items() if k != name}
    with pytest.raises(ValueError, match="do not fit"):
        engine.load_weights(3, missing)
    before = {k: v.clone() for k, v in state.items()}
    broken = {k: v + 1.0 for k, v in state.items()}
    broken[name] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights(3, broken)
    assert engine.version == 0  # and nothing was half-loaded:
    assert all(torch.equal(v, before[k]) for k, v in engine.model.state_dict().items())


def test_temperature_zero_and_tiny_top_p_are_greedy(setup, engine: TorchEngine) -> None:
    engine.sampling = setup[0].worker.sampling.model_copy(update={"temperature": 0.0})
    greedy = engine.generate(prompts(TEXTS), 3)
    for g in greedy:
        assert len({tuple(s.token_ids) for s in g.samples}) == 1
    engine.sampling = setup[0].worker.sampling.model_copy(update={"top_p": 1e-6})
    nucleus = engine.generate(prompts(TEXTS), 3)
    assert [s.token_ids for g in nucleus for s in g.samples] == [s.token_ids for g in greedy for s in g.samples]


def test_top_p_filter() -> None:
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    assert torch.equal(top_p_filter(probs, 0.7), torch.tensor([[0.0, 0.5, 0.0, 0.3]]))
    assert torch.equal(top_p_filter(probs, 0.5), torch.tensor([[0.0, 0.5, 0.0, 0.0]]))
    assert torch.equal(top_p_filter(probs, 1.0), probs)


class ScriptedLM(torch.nn.Module):
    """Logits that put (almost) all mass on script[row][step]; counts its forward calls."""

    def __init__(self, script: list[list[int]], vocab: int = 8) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.script, self.vocab, self.calls = script, vocab, 0

    def forward(self, input_ids: torch.Tensor, **_: object) -> SimpleNamespace:
        logits = torch.full((input_ids.shape[0], input_ids.shape[1], self.vocab), -30.0)
        for row in range(input_ids.shape[0]):  # the prefill sees one row per prompt: script row 0
            tokens = self.script[row]
            logits[row, -1, tokens[min(self.calls, len(tokens) - 1)]] = 30.0
        self.calls += 1
        return SimpleNamespace(logits=logits, past_key_values=NoCache())


class NoCache:
    """Stands in for a KV cache: the scripted model keeps no state."""

    layers: list[object] = []

    def batch_repeat_interleave(self, n: int) -> None: ...

    def batch_select_indices(self, index: torch.Tensor) -> None: ...


def scripted_batch(lm: torch.nn.Module, max_new_tokens: int, temperature: float = 1.0) -> RunningBatch:
    return RunningBatch(
        lm, max_rows=8, eos_ids={2}, pad_id=0, behaviour=Behaviour(temperature), max_new_tokens=max_new_tokens
    )


def test_rows_stop_on_eos_and_a_group_leaves_when_all_its_rows_stopped() -> None:
    lm = ScriptedLM([[5, 6, 2, 7], [5, 2, 7, 7]])
    batch = scripted_batch(lm, max_new_tokens=6)
    batch.add(0, [1, 3], key=1, size=2)
    done = []
    while batch.busy:
        done += batch.step()
    (group,) = done
    assert [r.tokens for r in group.rows] == [[5, 6, 2], [5, 2]]
    assert [r.eos for r in group.rows] == [True, True]
    assert lm.calls == 3  # one prefill (the prompt once for both rows), two decodes, then nothing
    assert all(abs(lp) < 1e-6 for r in group.rows for lp in r.logprobs)


def test_rows_are_cut_at_max_new_tokens() -> None:
    lm = ScriptedLM([[4, 4, 4, 4, 4]])
    batch = scripted_batch(lm, max_new_tokens=3, temperature=0.0)
    batch.add(0, [1], key=1, size=1)
    (group,) = batch.step() + batch.step() + batch.step()
    assert group.rows[0].tokens == [4, 4, 4] and not group.rows[0].eos and not batch.busy


def test_make_engine_dispatch(setup) -> None:
    cfg, model_dir = setup
    assert isinstance(build.engine(cfg, model_dir), TorchEngine)
    with pytest.raises(ConfigError, match="model directory"):
        build.engine(cfg, None)

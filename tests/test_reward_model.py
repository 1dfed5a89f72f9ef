"""A local Hugging Face sequence-classification checkpoint as a reward: a tiny random-init Qwen2
classifier with the built-in tokenizer, scored a group at a time, equal to one-by-one forwards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prl_actors.engines.base import Generated
from prl_actors.launch import build
from prl_actors.rewards import RewardError
from prl_actors.rewards.model import ModelReward
from prl_actors.rewards.record import RewardInput
from prl_actors.sections import ConfigError
from tests.learning_utils import tiny_config

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from prl_actors.model.tokenizer import PAD_ID, build_tokenizer

    out = tmp_path_factory.mktemp("rm")
    tok = build_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, num_labels=1, pad_token_id=PAD_ID,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def one_by_one(path: Path, prompt: str, texts: list[str]) -> list[float]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model, tok = AutoModelForSequenceClassification.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return [float(model(**tok(prompt, t, return_tensors="pt")).logits[0, 0]) for t in texts]


def test_a_reward_model_scores_a_group_batched(classifier_dir: Path) -> None:
    cfg = tiny_config(
        task__max_operand=5,
        task__rewards=[{"model": str(classifier_dir), "threads": 1, "batch_size": 3, "name": "rm"}],
    )
    task = build.task(cfg)
    prompt = task.prompts_for_epoch(0, 1)[0]
    texts = ["1", "12", "3 4 5", "9", "10"]  # uneven lengths: padding must not change a score
    samples = [Generated(text=t, token_ids=[1], logprobs=[0.0]) for t in texts]
    threads = torch.get_num_threads()
    scored = task.score_group(prompt, [], samples)
    assert torch.get_num_threads() == threads  # the reward's thread setting does not leak
    assert scored.totals == pytest.approx(one_by_one(classifier_dir, prompt.prompt, texts), abs=1e-5)
    assert len(set(scored.totals)) > 1 and all(set(p) == {"rm"} for p in scored.parts)


def test_a_model_dir_that_is_not_a_checkpoint_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"task.rewards\[0\].model .*\(no config.json\)"):
        build.task(tiny_config(task__rewards=[{"model": str(tmp_path)}]))


def test_a_label_past_num_labels_names_the_model(classifier_dir: Path) -> None:
    from prl_actors.rewards import Reward, RewardSet

    rs = RewardSet([Reward("rm", ModelReward(classifier_dir, label=3), batched=True, source=f"model {classifier_dir}")])
    with pytest.raises(RewardError, match=r"reward 'rm' \(model .*\) raised on prompt 0: ConfigError: .*label 3"):
        rs.score([RewardInput(prompt="1+1=", completion="2")])

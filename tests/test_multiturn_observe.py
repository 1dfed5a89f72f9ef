"""Multi-turn runs can be inspected: completions keep an episode's turns (role, trained or not, token
ids), the epoch metrics count turns, tool calls and tool errors per episode, and `replay
--completions` renders each turn (the end-to-end version: tests/test_tools_e2e.py)."""

from __future__ import annotations

import pytest

from prl_actors.engines.multiturn import Episode, episode_stats
from prl_actors.envs_llm.calculator import BUILTIN_TOOLS
from prl_actors.envs_llm.tools import ToolEnv
from prl_actors.protocol.messages import EpisodeStats, Group, Prompt, Sample
from prl_actors.rewards.metrics import RewardMeans
from prl_actors.trainer.completions import CompletionPicker, render, segments

pytestmark = pytest.mark.fast

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'


def episode(mask: list[int], turns: int, calls: int, errors: int, reward: float = 1.0) -> Sample:
    ids = list(range(10, 10 + len(mask)))
    return Sample(
        text="t",
        token_ids=ids,
        logprobs=[-0.1] * sum(mask),
        reward=reward,
        loss_mask=mask,
        episode=EpisodeStats(turns=turns, tool_calls=calls, tool_errors=errors),
    )


def group(*samples: Sample) -> Group:
    return Group(group_id=0, prompt="p", prompt_ids=[1], samples=list(samples), worker="w")


def test_episode_metrics_are_per_episode_means_of_the_epoch() -> None:
    means = RewardMeans()
    means.add(group(episode([1, 1, 0, 0, 0, 1], 2, 1, 0), episode([1, 1, 1, 1], 1, 0, 0)))
    means.add(group(episode([1, 0, 1, 0, 1, 0, 1], 4, 3, 2)))
    m = means.metrics()
    assert m["episode/turns"] == pytest.approx(7 / 3)
    assert m["episode/tool_calls"] == pytest.approx(4 / 3) and m["episode/tool_errors"] == pytest.approx(2 / 3)
    assert m["episode/env_tokens"] == pytest.approx((3 + 0 + 3) / 3)
    assert m["episode/turn_tokens"] == pytest.approx((3 / 2 + 4 / 1 + 4 / 4) / 3)
    means.reset()
    single = Sample(text="t", token_ids=[1, 2], logprobs=[0.0, 0.0], reward=0.0)
    means.add(group(single))
    assert means.metrics() == {}  # single-turn runs: no episode/* keys


def test_a_completion_row_keeps_the_turns_roles_and_what_was_trained() -> None:
    (row,) = CompletionPicker(1).rows(0, 0, 1, group(episode([1, 1, 0, 0, 1], 2, 1, 1)))
    assert row["episode"] == {"turns": 2, "tool_calls": 1, "tool_errors": 1}
    assert row["turns"] == [
        {"role": "assistant", "trained": True, "ids": [10, 11]},
        {"role": "environment", "trained": False, "ids": [12, 13]},
        {"role": "assistant", "trained": True, "ids": [14]},
    ]
    text = render([row], decode=lambda ids: "".join(chr(96 + i - 9) for i in ids))
    lines = text.splitlines()
    assert "turns 2 tool calls 1 errors 1" in lines[1]
    assert lines[2:] == [
        "      [assistant   trained        2 tokens]  'ab'",
        "      [environment not trained    2 tokens]  'cd'",
        "      [assistant   trained        1 tokens]  'e'",
    ]
    assert "tokens]" in render([row]).splitlines()[2]  # no tokenizer: counts only
    single = Sample(text="4", token_ids=[5], logprobs=[0.0], reward=1.0)
    (flat,) = CompletionPicker(1).rows(0, 0, 1, group(single))
    assert "turns" not in flat and "episode" not in flat and "-> '4'" in render([flat])
    assert segments([], []) == []


def test_tool_env_counts_its_calls_and_errors_and_the_engine_reports_them() -> None:
    env = ToolEnv([BUILTIN_TOOLS["calculator"]], lambda p, r, a: 1.0)
    env.reset(Prompt(group_id=0, prompt="q", answer="42"))
    env.step(CALL + '<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    env.step("<tool_call>not json</tool_call>")
    env.step("42")
    assert (env.tool_calls, env.tool_errors) == (3, 2)
    e = Episode(0, env, turns=3)  # type: ignore[arg-type]
    assert episode_stats(e) == EpisodeStats(turns=3, tool_calls=3, tool_errors=2)

    class Odd:
        tool_calls = "many"

    assert episode_stats(Episode(0, Odd(), turns=1)) == EpisodeStats(turns=1)  # type: ignore[arg-type]


def test_eval_takes_multi_turn_tasks_with_worker_sampling_only_as_observe_md_says() -> None:
    from pathlib import Path

    from prl_actors.config import load_config
    from prl_actors.sections import ConfigError

    guess = Path(__file__).resolve().parent.parent / "configs/guess.yaml"
    assert load_config(guess, {"eval.every_epochs": 1}).eval.every_epochs == 1  # episodes, worker.sampling
    with pytest.raises(ConfigError, match="eval.sampling needs worker.engine torch and single-turn"):
        load_config(guess, {"eval.every_epochs": 1, "eval.sampling": {"temperature": 0.0}})
    page = (guess.parent.parent / "docs/OBSERVE.md").read_text()
    assert "Multi-turn tasks are evaluated too" in page

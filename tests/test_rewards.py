"""The reward API: records, weighted rewards and their parts, batched and async rewards, built-ins,
the dataset row's extra columns, config errors, and the reward error policy."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest

from prl_actors.engines.base import Generated
from prl_actors.launch import build
from prl_actors.protocol.messages import Prompt
from prl_actors.rewards import Reward, RewardError, RewardInput, RewardSet
from prl_actors.rewards.builtins import BUILTINS
from prl_actors.sections import ConfigError
from tests import reward_plugins
from tests.learning_utils import tiny_config

pytestmark = pytest.mark.fast


def records(texts: list[str], answer: str = "", group_id: int = 0, **kw: object) -> list[RewardInput]:
    return [
        RewardInput(prompt="p", completion=t, answer=answer, group_id=group_id, sample=i, **kw)  # type: ignore[arg-type]
        for i, t in enumerate(texts)
    ]


def gens(texts: list[str], finished: bool = True) -> list[Generated]:
    return [Generated(text=t, token_ids=list(range(len(t))), logprobs=[0.0] * len(t), finished=finished) for t in texts]


def test_the_record_is_frozen_and_its_row_read_only() -> None:
    task = build.task(tiny_config(task__max_operand=3))
    rec = records(["x"])[0]
    with pytest.raises(AttributeError):
        rec.completion = "y"  # type: ignore[misc]
    assert rec.truncated is False and rec.messages == () and dict(rec.row) == {}
    assert json.loads(json.dumps(rec.to_json()))["truncated"] is False
    assert task.prompts_for_epoch(0, 2)[0].item >= 0  # prompts carry their row index


def test_builtins() -> None:
    math_r, fmt, length, add = (BUILTINS[n] for n in ("math", "format", "length", "add"))
    r = records(["so \\boxed{12}", "it is 12", "#### 13", "12 "], answer="12")
    assert [math_r(x) for x in r] == [1.0, 1.0, 0.0, 1.0]
    assert [fmt(x) for x in r] == [1.0, 0.0, 1.0, 0.0]
    assert [add(x) for x in r] == [0.0, 0.0, 0.0, 1.0]
    short = RewardInput(prompt="p", completion="ab", completion_ids=(1, 2))
    assert length(short, max_tokens=4) == 0.5
    assert length(RewardInput(prompt="p", completion="ab", completion_ids=(1, 2), finished=False)) == 0.0


def test_weighted_rewards_from_config_total_and_parts() -> None:
    cfg = tiny_config(
        task__max_operand=3,
        task__rewards=[
            {"fn": "add", "name": "acc", "weight": 1.0},
            {"fn": "tests.reward_plugins:half", "weight": 0.5},
            {"fn": "length", "weight": -1.0, "args": {"max_tokens": 4}},
        ],
    )
    task = build.task(cfg)
    prompt = task.prompts_for_epoch(0, 1)[0]
    scored = task.score_group(prompt, [1, 2], gens([prompt.answer, "nope"]))
    assert task.reward_set().names == ["acc", "half", "length"] and task.reward_set().report_parts
    n = len(prompt.answer)
    assert scored.parts[0] == {"acc": 1.0, "half": 0.5, "length": 1 - min(n, 4) / 4}
    assert scored.parts[1] == {"acc": 0.0, "half": 0.5, "length": 0.0}
    assert scored.totals == [pytest.approx(1 + 0.25 - (1 - min(n, 4) / 4)), pytest.approx(0.25)]


def test_the_default_reward_is_the_tasks_own_and_reports_no_parts() -> None:
    task = build.task(tiny_config(task__max_operand=3))
    prompt = task.prompts_for_epoch(0, 1)[0]
    scored = task.score_group(prompt, [], gens([prompt.answer, "x"]))
    assert scored.totals == [1.0, 0.0] and not task.reward_set().report_parts
    legacy = build.task(tiny_config(task__max_operand=3, task__reward="tests.reward_plugins:legacy_three"))
    assert legacy.score(Prompt(group_id=0, prompt="1+1=", answer="2"), "it is 2") == 1.0


def test_async_rewards_run_concurrently() -> None:
    n = 8
    rs = RewardSet([Reward("slow", reward_plugins.slow)])
    t0 = time.monotonic()
    scored = rs.score(records(["x"] * n))
    took = time.monotonic() - t0
    assert scored.totals == [1.0] * n
    assert took < 3 * reward_plugins.SLEEP_S, f"{n} samples of a {reward_plugins.SLEEP_S}s reward took {took:.2f}s"


def test_two_async_rewards_of_a_group_overlap_too() -> None:
    rs = RewardSet([Reward("a", reward_plugins.slow), Reward("b", reward_plugins.slow)], report_parts=True)
    t0 = time.monotonic()
    assert rs.score(records(["x"] * 4)).parts[0] == {"a": 1.0, "b": 1.0}
    assert time.monotonic() - t0 < 3 * reward_plugins.SLEEP_S


@pytest.mark.parametrize("fn", ["tests.reward_plugins:ranks", "tests.reward_plugins:async_ranks"])
def test_a_batched_reward_sees_the_whole_group(fn: str) -> None:
    task = build.task(tiny_config(task__max_operand=3, task__rewards=[{"fn": fn, "batched": True, "name": "rank"}]))
    prompt = task.prompts_for_epoch(0, 1)[0]
    assert task.score_group(prompt, [], gens(["ccc", "a", "bb"])).totals == [2.0, 0.0, 1.0]


def test_a_batched_reward_of_the_wrong_length_is_an_error() -> None:
    rs = RewardSet([Reward("w", reward_plugins.wrong_length, batched=True, source="tests.reward_plugins:wrong_length")])
    with pytest.raises(RewardError, match=r"reward 'w' .*returned 1 values for the 3 samples of prompt 4"):
        rs.score(records(["a", "b", "c"], group_id=4))


def test_extra_columns_reach_the_reward_jsonl_parquet_and_datasets(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "answer": str(i), "difficulty": i / 10} for i in range(4)]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    import datasets

    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    for path in (jsonl, parquet, saved):
        cfg = tiny_config(
            task__name="jsonl", task__prompts_file=str(path), task__rewards=[{"fn": "tests.reward_plugins:difficulty"}]
        )
        task = build.task(cfg)
        for prompt in task.prompts_for_epoch(0, 4):
            expected = int(prompt.answer) / 10
            assert task.score_group(prompt, [], gens(["x"])).totals == [expected]


def test_a_prompt_whose_row_differs_from_this_workers_data_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "q", "answer": "1", "difficulty": 1}) + "\n")
    task = build.task(tiny_config(task__name="jsonl", task__prompts_file=str(path)))
    with pytest.raises(RewardError, match="is not that row of this worker's data"):
        task.score_group(Prompt(group_id=3, prompt="other", answer="1", item=0), [], gens(["x"]))


@pytest.mark.parametrize(
    ("rewards", "message"),
    [
        ([{"fn": "poetry"}], "must look like a builtin .* or 'module:function'"),
        ([{"fn": "no_such_module:f"}], "cannot import module 'no_such_module'"),
        ([{"fn": "tests.reward_plugins:missing"}], "has no attribute 'missing'"),
        ([{"fn": "length", "args": {"max_token": 3}}], r"task.rewards\[0\].args"),
        ([{"fn": "add"}, {"fn": "add"}], "two rewards named 'add'"),
        ([{"fn": "add", "url": "http://x"}], "exactly one of fn, model, url"),
        ([{"url": "http://x", "batched": True}], "batched applies to fn rewards"),
        ([{"url": "ftp://x"}], "must start with http"),
        ([{"url": "http://x", "args": {"a": 1}}], "args applies to fn rewards"),
        ([{"model": "/nonexistent/rm"}], "not a Hugging Face checkpoint directory"),
        ([{"fn": "add", "weight": float("nan")}], "weight"),
    ],
)
def test_reward_config_mistakes_are_one_line(rewards: list[dict], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        build.task(tiny_config(task__max_operand=3, task__rewards=rewards))
    assert "\n" not in str(info.value).strip()


def test_reward_and_rewards_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="set task.reward or task.rewards, not both"):
        tiny_config(task__reward="tests.reward_plugins:legacy_three", task__rewards=[{"fn": "add"}])


# --- errors: on_reward_error -----------------------------------------------------------------------


def flaky_set(on_error: str, fn: object = reward_plugins.flaky, name: str = "flaky") -> RewardSet:
    reward = Reward(name, fn, source=f"tests.reward_plugins:{name}")  # type: ignore[arg-type]
    return RewardSet([reward, Reward("ok", reward_plugins.half)], on_error, report_parts=True)  # type: ignore[arg-type]


def test_fail_names_the_plugin_prompt_sample_and_exception() -> None:
    with pytest.raises(RewardError) as info:
        flaky_set("fail").score(records(["a", "b", "c", "d", "e"], group_id=0, item=17))
    assert str(info.value) == (
        "reward 'flaky' (tests.reward_plugins:flaky) raised on prompt 0 (row 17) sample 2: ValueError: cannot score 'c'"
        " (reward_plugins.py:52)"  # where the plugin raised: file:line on the console
    )
    assert 'reward_plugins.py", line 52, in flaky' in info.value.trace  # the whole traceback: the worker's log


def test_zero_scores_only_the_failing_samples_zero_and_reports_them() -> None:
    scored = flaky_set("zero").score(records(["a", "b", "c", "d", "e"]))
    assert [p["flaky"] for p in scored.parts] == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert scored.totals == [1.5, 1.5, 0.5, 1.5, 1.5]
    assert len(scored.errors) == 1 and "sample 2: ValueError" in scored.errors[0]


def test_always_raising_under_zero_gives_zeros_never_nan() -> None:
    scored = flaky_set("zero", reward_plugins.always_raises, "always_raises").score(records(["a"] * 4))
    assert scored.totals == [0.5] * 4 and len(scored.errors) == 4


def test_nan_is_an_error_naming_the_value() -> None:
    with pytest.raises(RewardError, match=r"reward 'nan_sometimes' .*returned nan on prompt 0 sample 1"):
        flaky_set("fail", reward_plugins.nan_sometimes, "nan_sometimes").score(records(["a", "b"]))
    scored = flaky_set("zero", reward_plugins.nan_sometimes, "nan_sometimes").score(records(["a", "b"]))
    assert all(math.isfinite(t) for t in scored.totals) and scored.totals == [1.5, 0.5]


def test_an_async_reward_past_its_timeout_is_an_error_not_a_hang() -> None:
    rs = RewardSet([Reward("slow", reward_plugins.slow, timeout_s=0.05)])
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"reward 'slow' timed out after 0.05s on prompt 0 sample 0"):
        rs.score(records(["x"]))
    assert time.monotonic() - t0 < reward_plugins.SLEEP_S


def test_scoring_works_inside_a_running_event_loop_free_thread() -> None:
    """score() runs its own loop: calling it from a thread with no loop (the worker's) is fine."""
    out = asyncio.run(asyncio.to_thread(RewardSet([Reward("h", reward_plugins.half)]).score, records(["a"])))
    assert out.totals == [0.5]


def test_a_multi_turn_sample_brings_its_conversation_and_async_callers_can_score() -> None:
    """What the multi-turn engine hands over: samples with `messages`; scored from its own loop."""
    from dataclasses import dataclass, field

    @dataclass
    class Episode:
        text: str
        token_ids: list[int] = field(default_factory=list)
        finished: bool = True
        messages: list[dict[str, str]] = field(default_factory=list)

    seen: list[RewardInput] = []

    def turns(record: RewardInput) -> float:
        seen.append(record)
        return float(sum(m["role"] == "assistant" for m in record.messages))

    task = build.task(tiny_config(task__max_operand=3))
    task.rewards = RewardSet([Reward("turns", turns)])
    convo = [
        {"role": "user", "content": "guess"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "higher"},
    ]
    convo.append({"role": "assistant", "content": "7"})
    prompt = task.prompts_for_epoch(0, 1)[0]
    scored = asyncio.run(task.score_group_async(prompt, [], [Episode("7", messages=convo), Episode("x")]))
    assert scored.totals == [2.0, 0.0]
    assert seen[0].messages[3]["content"] == "7" and seen[1].messages == ()
    with pytest.raises(TypeError):
        seen[0].messages[0]["role"] = "system"  # type: ignore[index]


def test_a_batched_reward_with_one_nan_fails_only_that_sample_under_zero() -> None:
    def one_nan(records: list[RewardInput]) -> list[float]:
        return [float("nan") if r.sample == 1 else 1.0 for r in records]

    scored = RewardSet([Reward("b", one_nan, batched=True)], "zero").score(records(["a", "b", "c"]))
    assert scored.totals == [1.0, 0.0, 1.0] and len(scored.errors) == 1 and "returned nan" in scored.errors[0]


def test_a_plugin_raising_timeout_error_itself_is_named_as_such() -> None:
    def raises_timeout(record: RewardInput) -> float:
        raise TimeoutError("db lock")

    with pytest.raises(RewardError, match=r"raised on prompt 0 sample 0: TimeoutError: db lock"):
        RewardSet([Reward("t", raises_timeout)]).score(records(["a"]))


def test_rows_stay_with_their_prompts_when_long_prompts_are_left_out(tmp_path: Path) -> None:
    rows = [{"prompt": "1+1=" * (1 + 10 * (i % 2)), "answer": str(i), "difficulty": i} for i in range(6)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = tiny_config(
        task__name="jsonl",
        task__prompts_file=str(path),
        task__max_prompt_tokens=10,
        task__rewards=[{"fn": "tests.reward_plugins:difficulty"}],
    )
    task = build.task(cfg)
    assert [a for _, a in task.items] == ["0", "2", "4"] and "left out 3 of 6" in task.note
    for prompt in task.prompts_for_epoch(0, 3):
        assert task.score_group(prompt, [], gens(["x"])).totals == [float(prompt.answer)]


def test_an_episodes_own_reward_is_its_total_or_the_env_part() -> None:
    """Multi-turn samples bring their environment's reward: alone it is the total (the task's reward
    is not asked); with task.rewards it is added as the part `env`."""
    own = [Generated(text="7", token_ids=[1], logprobs=[0.0], reward=r) for r in (1.0, 0.25)]
    task = build.task(tiny_config(task__max_operand=3, task__reward="tests.reward_plugins:always_raises"))
    prompt = task.prompts_for_epoch(0, 1)[0]
    assert task.score_generated(prompt, [], own).totals == [1.0, 0.25]  # the raising reward never ran
    task = build.task(tiny_config(task__max_operand=3, task__rewards=[{"fn": "tests.reward_plugins:half"}]))
    scored = task.score_generated(prompt, [], own)
    assert scored.totals == [1.5, 0.75] and scored.parts[0] == {"half": 0.5, "env": 1.0}
    with pytest.raises(ConfigError, match="the name 'env' is the multi-turn environment's own reward"):
        tiny_config(task__rewards=[{"fn": "add", "name": "env"}])


def test_async_fn_rewards_have_a_deadline_by_default() -> None:
    task = build.task(tiny_config(task__max_operand=3, task__rewards=[{"fn": "tests.reward_plugins:slow"}]))
    assert task.reward_set().rewards[0].timeout_s == 300.0

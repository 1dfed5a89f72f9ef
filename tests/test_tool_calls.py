"""Tool calls as the model writes them: whatever a turn holds (deep nesting, huge or many calls, lone
surrogates, a tool that raises anything) is answered with an error message, never an exception out
of ToolEnv.step (issue 39: a call nested 1000 levels deep raised RecursionError and failed the run)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prl_actors.envs_llm.calculator import BUILTIN_TOOLS
from prl_actors.envs_llm.tools import MAX_CALLS, MAX_RESULT_CHARS, ToolEnv, parse_tool_calls, tool
from prl_actors.protocol.messages import Prompt

pytestmark = pytest.mark.fast


def call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


def boom(kind: str) -> str:
    """A tool that fails in the way it is told."""
    if kind == "recursion":
        return boom(kind)
    if kind == "unprintable":
        raise Unprintable
    if kind == "huge":
        return "x" * 10_000_000
    if kind == "surrogate":
        return "a\ud800b"
    if kind == "exit":
        raise SystemExit(2)
    if kind == "bigint":
        return 10**100_000  # type: ignore[return-value]  # str() of it raises ValueError
    raise KeyError(kind)


def env() -> ToolEnv:
    e = ToolEnv([BUILTIN_TOOLS["calculator"], tool(boom)], lambda p, r, a: 1.0)
    e.reset(Prompt(group_id=0, prompt="q", answer="1"))
    return e


HOSTILE = {
    "nested arguments": call('{"name": "calculator", "arguments": ' + "[" * 1000 + "]" * 1000 + "}"),
    "nested call": call('{"a": ' * 1000 + "1" + "}" * 1000),
    "nested string arguments": call(json.dumps({"name": "calculator", "arguments": "[" * 1000 + "]" * 1000})),
    "huge call": call('{"name": "calculator", "arguments": {"expression": "' + "1+" * 50_000 + '1"}}'),
    "surrogate": call('{"name": "calculator", "arguments": {"expression": "\\ud800"}}'),
    "surrogate name": call('{"name": "\\udc00' + "n" * 500 + '", "arguments": {}}'),
    "wrong arguments": call('{"name": "calculator", "arguments": {"nope": 1}}'),
    "not an object": call("[1, 2]"),
    "many calls": call('{"name": "calculator", "arguments": {"expression": "1"}}') * 50,
    **{
        f"tool {k}": call(json.dumps({"name": "boom", "arguments": {"kind": k}}))
        for k in ("recursion", "unprintable", "huge", "surrogate", "bigint", "exit", "other")
    },
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_any_tool_call_is_answered_by_a_bounded_clean_message(name: str) -> None:
    messages, reward, done = env().step(HOSTILE[name])
    assert messages and reward == 0.0 and not done  # answered as tool results: the model may try again
    assert len(messages) <= MAX_CALLS + 1
    for m in messages:
        assert m["role"] == "tool" and len(m["content"]) <= MAX_RESULT_CHARS and len(m["name"]) <= 64
        m["content"].encode("utf-8")  # no lone surrogate: the tokenizer can take it
        m["name"].encode("utf-8")


def test_the_errors_say_what_was_wrong() -> None:
    said = {name: " ".join(m["content"] for m in env().step(text)[0]) for name, text in HOSTILE.items()}
    assert "nested deeper than 32" in said["nested arguments"] and "nested deeper" in said["nested call"]
    assert "longer than" in said["huge call"]
    assert "at most 8 tool calls" in said["many calls"]
    assert "RecursionError" in said["tool recursion"] and "Unprintable" in said["tool unprintable"]
    assert said["tool huge"] == "x" * MAX_RESULT_CHARS


def test_well_formed_calls_still_parse() -> None:
    text = call('{"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}')
    assert parse_tool_calls(text) == [("calculator", {"expression": "2*3"})]
    messages, _, _ = env().step(text)
    assert messages == [{"role": "tool", "name": "calculator", "content": "6"}]
    answer: Any = env().step("the answer is 6")
    assert answer == ([], 1.0, True)


@pytest.mark.parametrize("value", ["1.0", None, [1.0], float("nan")])
def test_an_environment_reward_that_is_not_a_finite_real_number_is_refused(value: Any) -> None:
    from prl_actors.envs_llm.base import EnvError, step_result

    e = ToolEnv([], lambda p, r, a: value)
    e.reset(Prompt(group_id=0, prompt="q", answer="1"))
    with pytest.raises(EnvError, match="environment step reward must be"):
        step_result(e, "the answer")
    e.reward = lambda p, r, a: True
    assert step_result(e, "the answer").reward == 1.0


def test_the_buffer_checks_a_tool_episode_against_its_rendered_prompt(tmp_path: Any) -> None:
    """The buffer's prompt check for a multi-turn run: the group's prompt_ids must be the episode's
    initial prompt as the engine renders it (system prompt, tools' schemas, chat template), not the
    row's plain text (every honest tools.yaml group was refused as wrong_prompt)."""
    from pathlib import Path

    from prl_actors.config import load_config
    from prl_actors.envs_llm.registry import episode_prompt_ids
    from prl_actors.launch import build
    from prl_actors.model.tiny import build_family
    from prl_actors.model.tokenizer import encode_prompt, load_tokenizer
    from prl_actors.protocol.messages import Group, RejectReason, Sample

    model = build_family("qwen2", Path(tmp_path) / "qwen2")
    root = Path(__file__).resolve().parent.parent
    cfg = load_config(root / "configs/tools.yaml", {"model.path": str(model)})
    checker, task, tok = build.group_checker(cfg, model), build.task(cfg), load_tokenizer(model)
    prompt = task.prompts_for_epoch(3, cfg.coordinator.groups_per_epoch)[0]  # the coordinator's group 0
    rendered = episode_prompt_ids(cfg.task, tok, task.reward)(prompt)
    sample = Sample(text="", token_ids=[], logprobs=[], reward=0.0, loss_mask=[])

    def group(ids: list[int]) -> Group:
        return Group(group_id=0, prompt=prompt.prompt, prompt_ids=ids, samples=[sample], worker="w")

    assert "calculator" in tok.decode(rendered) and "<|im_start|>system" in tok.decode(rendered)
    assert checker.check(3, group(rendered)) is None
    refused = checker.check(3, group(encode_prompt(tok, prompt.prompt, True)))
    assert refused is not None and refused[0] == RejectReason.WRONG_PROMPT


def test_an_environment_step_or_reset_that_exits_is_an_env_error() -> None:
    from prl_actors.engines.multiturn import _make_envs
    from prl_actors.envs_llm.base import EnvError, step_result

    class Exits(ToolEnv):
        def reset(self, row: Prompt) -> list[dict[str, Any]]:
            raise SystemExit(1)

        def step(self, text: str) -> Any:
            raise SystemExit(1)

    with pytest.raises(EnvError, match="environment step raised SystemExit"):
        step_result(Exits([], lambda p, r, a: 1.0), "x")
    with pytest.raises(EnvError, match="factory or reset raised SystemExit"):
        _make_envs(lambda: Exits([], lambda p, r, a: 1.0), Prompt(group_id=0, prompt="q"), 2)

"""Tasks: built-in add, the JSONL loader and its errors, reward plugins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prl_actors.launch import build
from prl_actors.protocol.messages import Prompt
from prl_actors.sections import ConfigError
from prl_actors.tasks.arith import add_items, add_reward
from prl_actors.tasks.plugins import load_reward
from tests.learning_utils import tiny_config

pytestmark = pytest.mark.fast


def test_add_items_and_reward() -> None:
    items = add_items(3)
    assert len(items) == 16 and items[0] == ("0+0=", "0") and ("3+2=", "5") in items
    assert add_reward("3+2=", "5", "5") == 1.0
    assert add_reward("3+2=", " 5 ", "5") == 1.0
    assert add_reward("3+2=", "6", "5") == 0.0
    assert add_reward("3+2=", "55", "5") == 0.0


def test_load_add_task_prompts_are_deterministic() -> None:
    task = build.task(tiny_config(task__max_operand=9, run__seed=3))
    a, b = task.prompts_for_epoch(2, 5), task.prompts_for_epoch(2, 5)
    assert a == b and [p.group_id for p in a] == [0, 1, 2, 3, 4]
    for p in a:
        x, y = p.prompt.rstrip("=").split("+")
        assert p.answer == str(int(x) + int(y)) and int(x) <= 9 and int(y) <= 9
    assert task.score(a[0], a[0].answer) == 1.0


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_task(tmp_path: Path) -> None:
    f = write_jsonl(
        tmp_path / "p.jsonl",
        [json.dumps({"prompt": "2*3=", "answer": "6"}), "", json.dumps({"prompt": "1+1=", "answer": 2, "x": 1})],
    )
    task = build.task(tiny_config(task__name="jsonl", task__prompts_file=str(f)))
    assert task.items == [("2*3=", "6"), ("1+1=", "2")]
    assert task.score(Prompt(group_id=0, prompt="1+1=", answer="2"), " 2\n") == 1.0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"answer": "1"}', "'prompt' must be a non-empty string"),
        ('{"prompt": "a", "answer": null}', "'answer' must be a string or a number"),
        ('{"prompt": "a", "answer": true}', "'answer' must be a string or a number"),
    ],
)
def test_jsonl_bad_line_names_its_line(tmp_path: Path, line: str, message: str) -> None:
    f = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": "ok", "answer": "1"}), line])
    with pytest.raises(ConfigError, match=message) as info:
        build.task(tiny_config(task__name="jsonl", task__prompts_file=str(f)))
    assert f"{f}:2:" in str(info.value)


def test_jsonl_missing_or_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        build.task(tiny_config(task__name="jsonl", task__prompts_file=str(tmp_path / "nope.jsonl")))
    with pytest.raises(ConfigError, match="holds no prompts"):
        build.task(tiny_config(task__name="jsonl", task__prompts_file=str(write_jsonl(tmp_path / "e.jsonl", [""]))))
    with pytest.raises(ConfigError, match="needs task.prompts_file"):
        build.task(tiny_config(task__name="jsonl"))


def test_unknown_task() -> None:
    with pytest.raises(ConfigError, match="unknown task 'poetry'"):
        build.task(tiny_config(task__name="poetry"))


def test_reward_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rewards.py").write_text(
        "def length_match(prompt: str, response: str, answer: str) -> float:\n"
        "    return 0.5 if len(response) == len(answer) else 0.0\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    task = build.task(tiny_config(task__reward="my_rewards:length_match"))
    assert task.score(Prompt(group_id=0, prompt="1+1=", answer="2"), "7") == 0.5
    with pytest.raises(ConfigError, match="has no attribute 'missing'"):
        load_reward("my_rewards:missing")
    with pytest.raises(ConfigError, match="is not callable"):
        load_reward("my_rewards:NOT_CALLABLE")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("just_a_module", "must look like 'module:function'"),
        (":f", "must look like 'module:function'"),
    ],
)
def test_reward_plugin_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build.task(tiny_config(task__reward=spec))

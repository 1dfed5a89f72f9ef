"""DAPO's soft overlong penalty (task.overlong_buffer / overlong_penalty), added to the task's reward."""

from __future__ import annotations

import pytest

from prl_actors.config import load_config
from prl_actors.launch import build
from prl_actors.protocol.messages import Prompt
from prl_actors.sections import ConfigError
from prl_actors.tasks.shaping import Overlong

pytestmark = pytest.mark.fast


def test_penalty_values() -> None:
    f = Overlong(max_new_tokens=20, buffer=4, penalty=1.0)  # free up to 16 tokens
    assert [f(n) for n in (0, 10, 16)] == [0.0, 0.0, 0.0]
    assert [f(n) for n in (17, 18, 19, 20)] == [-0.25, -0.5, -0.75, -1.0]
    assert f(25) == -1.0  # capped
    assert Overlong(20, 4, 0.5)(18) == -0.25
    assert Overlong(20, 0, 1.0)(20) == 0.0  # off
    assert Overlong(8, 8, 2.0)(2) == pytest.approx(-0.5)  # the buffer is the whole length


def test_the_task_adds_it_to_the_reward() -> None:
    cfg = load_config(
        None, {"worker.sampling.max_new_tokens": 10, "task.overlong_buffer": 5, "task.overlong_penalty": 0.5}
    )
    task = build.task(cfg)
    right = Prompt(group_id=0, prompt="1+2=", answer="3")

    def reward(response: str, length: int, t=task) -> float:  # what the worker computes  # type: ignore[no-untyped-def]
        return t.score(right, response) + t.length_penalty(length)

    assert reward("3", 5) == 1.0
    assert reward("3", 8) == pytest.approx(1.0 - 0.3)
    assert reward("4", 10) == pytest.approx(-0.5)
    assert reward("3", 10, build.task(load_config(None, {}))) == 1.0  # off by default


def test_a_buffer_longer_than_max_new_tokens_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"task.overlong_buffer \(9\) exceeds worker.sampling.max_new_tokens \(8\)"):
        load_config(None, {"task.overlong_buffer": 9})

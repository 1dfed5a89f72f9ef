"""A reward plugin that always raises (tests/test_failing_prompt.py): `task.reward: tests.failing_reward:always`."""


def always(prompt: str, response: str, answer: str) -> float:
    raise ValueError("this reward plugin is broken on purpose")

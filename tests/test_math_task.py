"""The math task: answer extraction, reward, the shipped sample, GSM8K-style files."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from prl_actors.launch import build
from prl_actors.protocol.messages import Prompt
from prl_actors.rewards.math_answer import canonical, extract_answer
from prl_actors.sections import ConfigError
from prl_actors.tasks.math_task import math_reward, sample_path
from tests.learning_utils import tiny_config

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("She has 36 - 7 = 29 pens left.", 29),  # last number
        ("#### 1,234", 1234),  # GSM8K form, thousands comma
        ("So 48/2 = 24 in May and 72 in all.\n#### 72\nCheck: 3 more", 72),  # #### wins over the last number
        (r"So it is \boxed{18}. (Earlier I wrote 17.)", 18),  # boxed wins over everything
        (r"\boxed{12} no wait \boxed{\$1{,}200.50}", Fraction(2401, 2)),  # the last box; LaTeX comma, $
        (r"The answer is \boxed{\frac{3}{4}} of the cake", Fraction(3, 4)),
        (r"\boxed{18 \text{ dollars}}", 18),  # units inside the box
        ("The answer is $18.00, and 5 apples remain.", 18),  # 'answer is' wins over the last number
        ("Answer: -3 degrees", -3),
        ("It went from 5-3 to 2", 2),  # a minus after a digit is an operator
        ("The price rose 20%.", 20),
        ("It is 0.75, i.e. 3/4", Fraction(3, 4)),
        ("no numbers here", None),
        ("divide 3/0", None),
    ],
)
def test_extract_answer(text: str, value: int | Fraction | None) -> None:
    assert extract_answer(text) == value


def test_canonical() -> None:
    assert [canonical(Fraction(x)) for x in ("18", "18.0", "-2.5", "1/3", "1/8")] == [
        "18",
        "18",
        "-2.5",
        "1/3",
        "0.125",
    ]


def test_math_reward_and_format_bonus() -> None:
    assert math_reward("", "The total is 72.", "72") == 1.0
    assert math_reward("", "The total is 72.0 clips", "72") == 1.0
    assert math_reward("", "The total is 71.", "72") == 0.0
    assert math_reward("", "#### 72", "72", format_reward=0.1) == pytest.approx(1.1)
    assert math_reward("", r"\boxed{71}", "72", format_reward=0.1) == pytest.approx(0.1)  # below 1: not 'correct'
    assert math_reward("", "72", "72", format_reward=0.1) == 1.0  # right, but no explicit form
    assert math_reward("", "", "72", format_reward=0.1) == 0.0


def test_shipped_sample_is_consistent() -> None:
    """Every worked step of the shipped solutions computes what it says, and #### is the last step."""
    rows = [json.loads(line) for line in Path(sample_path()).read_text().splitlines()]
    assert len(rows) == 40 and len({r["question"] for r in rows}) == 40
    for r in rows:
        steps = re.findall(r" ([-\d*/+() ]+) = (-?[\d.]+)\.", r["answer"])
        assert steps, r
        for expr, shown in steps:
            assert Fraction(eval(expr, {"__builtins__": {}}, {})) == Fraction(shown), (expr, shown)  # our literals
        assert r["answer"].endswith(f"#### {steps[-1][1]}")


def test_math_task_default_sample() -> None:
    task = build.task(tiny_config(task__name="math", task__format_reward=0.2))
    assert len(task.items) == 40 and task.items[0][1] == "29"
    first = task.prompts_for_epoch(0, 4)[0]
    assert task.score(first, f"so \\boxed{{{first.answer}}}") == pytest.approx(1.2)
    assert task.score(first, "I do not know") == 0.0


def test_gsm8k_style_parquet_with_field_mapping(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"problem": "Natalia sold 48 clips in April and half as many in May. How many in all?", "solution": "#### 72"},
        {"problem": "A car costs 1,250 cents. How many dollars is that?", "solution": "1,250 / 100 = 12.5\n#### 12.5"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    cfg = tiny_config(
        task__name="math", task__prompts_file=str(tmp_path / "train.parquet"), task__prompt_field="problem",
        task__answer_field="solution",
    )  # fmt: skip
    task = build.task(cfg)
    assert [a for _, a in task.items] == ["72", "12.5"]
    assert task.score(Prompt(group_id=0, prompt="", answer="12.5"), "It is 12.50 dollars") == 1.0


def test_answer_without_a_number_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        json.dumps({"question": "q1", "answer": "#### 3"})
        + "\n"
        + json.dumps({"question": "q2", "answer": "n/a"})
        + "\n"
    )
    with pytest.raises(ConfigError, match=r"m.jsonl:2: 'answer' has no number: 'n/a'"):
        build.task(tiny_config(task__name="math", task__prompts_file=str(path)))

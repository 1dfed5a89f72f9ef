r"""Built-in rewards, by name in `task.rewards: [{fn: NAME}]`. Each takes one RewardInput.

- `math`: 1.0 when the completion's final number equals the answer's (rewards/math_answer.py), else 0.0.
- `format`: 1.0 when the completion marks its final answer with `\boxed{...}` or `#### x`, else 0.0.
- `length`: 1 - min(n, max_tokens) / max_tokens for n completion tokens (args: max_tokens, default
  256): shorter is better; 0.0 for a truncated completion.
- `add` (alias `exact`): 1.0 when the completion equals the answer after stripping whitespace.
- `code`: the fraction of the row's tests the completion's program passes (rewards/code.py, in
  bubblewrap; args: timeout_s, memory_mb, tests_field, unsafe_local).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prl_actors.rewards.math_answer import extract_answer, has_final_answer_form, numbers

if TYPE_CHECKING:
    from prl_actors.rewards.record import RewardInput


def math_answer(record: RewardInput) -> float:
    gold = numbers(record.answer)
    pred = extract_answer(record.completion)
    return float(pred is not None and len(gold) == 1 and pred == gold[0])


def answer_format(record: RewardInput) -> float:
    return float(has_final_answer_form(record.completion))


def length(record: RewardInput, max_tokens: int = 256) -> float:
    if not record.finished:
        return 0.0
    return 1.0 - min(len(record.completion_ids), max_tokens) / max_tokens


def exact(record: RewardInput) -> float:
    return float(record.completion.strip() == record.answer.strip())


async def code(
    record: RewardInput, timeout_s: float = 5.0, memory_mb: int = 512, tests_field: str = "tests",
    unsafe_local: bool = False,
) -> float:  # fmt: skip
    from prl_actors.rewards.code import code_reward

    return await code_reward(record, timeout_s, memory_mb, tests_field, unsafe_local)


BUILTINS: dict[str, Callable[..., Any]] = {
    "math": math_answer,
    "format": answer_format,
    "length": length,
    "add": exact,
    "exact": exact,
    "code": code,
}

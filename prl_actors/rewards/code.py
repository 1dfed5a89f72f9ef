"""The code reward: run the completion's program against the row's tests in a sandbox.

reward = (tests passed) / (tests); 0.0 when the completion has no code block, the program fails to
run, or the row has no tests. One sandbox per sample, started with asyncio (the G samples of a group
run concurrently).

The program runs in bubblewrap (rewards/sandbox.py: its own namespaces, a read-only view of the
interpreter, a private tmpfs, seccomp, rlimits, every process killed with its pid namespace at the
time limit). Where bubblewrap is missing or cannot make namespaces, the reward refuses to start
(`sandbox.require`), unless `unsafe_local` (trusted code only: a plain subprocess with rlimits).
Pass or fail is decided outside the program's sandbox (rewards/sandbox_verdict.py): it only
reports the values of the expressions of the tests that need the program. docs/SECURITY.md.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prl_actors.rewards import sandbox
from prl_actors.rewards.sandbox_values import encode
from prl_actors.rewards.sandbox_verdict import Split, decode_line, judge, judgeable_here, split_tests

if TYPE_CHECKING:
    from prl_actors.rewards.record import RewardInput

FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
FILE_LIMIT = 1 << 20  # bytes any file the program writes may hold


def extract_code(text: str) -> str | None:
    """The last fenced code block (```python ... ``` or a bare ```), or None when there is none."""
    blocks = FENCE.findall(text)
    return blocks[-1] if blocks else None


def network_isolation() -> tuple[str, ...]:
    """The sandbox's isolation, in words for benchmarks: ("bwrap", "--unshare-all"), or () when
    bubblewrap does not work here."""
    _, why = sandbox.launcher()
    return () if why else ("bwrap", "--unshare-all")


async def run_tests(
    code: str,
    tests: Sequence[str],
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    setup: str = "",
    unsafe_local: bool = False,
) -> list[bool]:
    """Run `code`, then `setup`, then each test (a Python statement, usually an assert) against it;
    one bool per test. A test not answered before the time limit (or after a crash) fails."""
    if not tests:
        return []
    if not _parses(code):
        return [False] * len(tests)
    splits = split_tests(code, setup, tests)
    limits = {"as": memory_mb << 20, "fsize": FILE_LIMIT, "cpu": int(timeout_s) + 1}
    tests_job = [{"probes": s.probes, "inside": s.inside, "prelude": s.prelude} for s in splits]
    job: dict[str, Any] = {"mode": "run", "code": code, "setup": setup, "limits": limits, "tests": tests_job}
    lines = await sandbox.run_job(job, timeout_s, unsafe_local=unsafe_local)
    values = [decode_line(line, len(s.probes)) for line, s in zip(lines, splits, strict=False)]
    values += [None] * (len(splits) - len(values))
    return await _verdicts(splits, values, {**job, "mode": "judge"}, timeout_s, unsafe_local)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


async def _verdicts(
    splits: list[Split], values: list[list[Any] | None], job: dict[str, Any], timeout_s: float, unsafe_local: bool
) -> list[bool]:
    """Each test's verdict: here when it only compares plain data, else in a judge sandbox that runs
    the row's setup (in `job`) and the verdicts, never the program. A test without values fails."""
    passed = [False] * len(splits)
    remote: list[int] = []
    for i, (s, v) in enumerate(zip(splits, values, strict=True)):
        if v is None:
            continue
        if judgeable_here(s.verdict):
            passed[i] = judge(s.verdict, v)
        else:
            remote.append(i)
    if remote:
        job["code"] = ""
        job["tests"] = [_judge_test(splits[i], values[i]) for i in remote]
        lines = await sandbox.run_job(job, timeout_s, unsafe_local=unsafe_local)
        for i, line in zip(remote, lines, strict=False):
            passed[i] = line == b"1"
    return passed


def _judge_test(split: Split, values: list[Any] | None) -> dict[str, Any] | None:
    try:
        return {"verdict": split.verdict, "prelude": split.prelude, "values": [encode(v) for v in values or []]}
    except TypeError:
        return None


def row_tests(record: RewardInput, tests_field: str = "tests") -> list[str]:
    """The row's tests: a list of Python statements (a single string is one test)."""
    tests: Any = record.row.get(tests_field, [])
    if isinstance(tests, str):
        return [tests]
    return [str(t) for t in tests]


async def code_reward(
    record: RewardInput,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    tests_field: str = "tests",
    unsafe_local: bool = False,
) -> float:
    """The fraction of the row's tests the completion's program passes (0.0 without a code block)."""
    sandbox.require(unsafe_local)
    tests = row_tests(record, tests_field)
    code = extract_code(record.completion)
    if code is None or not tests:
        return 0.0
    setup = str(record.row.get("test_setup", "") or "")
    results = await run_tests(code, tests, timeout_s, memory_mb, setup, unsafe_local)
    return sum(results) / len(tests)

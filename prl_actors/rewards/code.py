"""The code reward: run the completion's program against the row's tests in a sandboxed subprocess.

reward = (tests passed) / (tests); 0.0 when the completion has no code block, the program fails to
run, or the row has no tests. One subprocess per sample, started with asyncio (the G samples of a
group run concurrently). What the sandbox does and does not isolate: docs/SECURITY.md.

The child (sandbox_harness.py, run with `python -I -S`) gets:
- a private temp dir as cwd (0700, removed afterwards) and a clean environment (PATH, HOME=cwd,
  LANG; nothing inherited: no tokens, no keys);
- rlimits, set by the harness before it reads the program: RLIMIT_AS (memory), RLIMIT_FSIZE (1 MiB
  per file), RLIMIT_CPU, RLIMIT_NOFILE, RLIMIT_CORE=0, RLIMIT_NPROC; its own session, so the whole
  process group is killed at the time limit (no preexec_fn: the worker has threads);
- network off with `unshare -n` (a new, empty network namespace) when that works here
  (`network_isolation()` says which), else `unshare -rn`, else none;
- as root: the uid `nobody` after start-up; always: an audit hook refusing writes outside its cwd,
  subprocesses, fork, signals, ctypes and sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prl_actors.rewards.record import RewardInput

HARNESS = Path(__file__).with_name("sandbox_harness.py")
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
FILE_LIMIT = 1 << 20  # bytes any file the program writes may hold
MAX_RESULT_BYTES = 1 << 16
NOBODY = 65534
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def extract_code(text: str) -> str | None:
    """The last fenced code block (```python ... ``` or a bare ```), or None when there is none."""
    blocks = FENCE.findall(text)
    return blocks[-1] if blocks else None


@functools.cache
def network_isolation() -> tuple[str, ...]:
    """The command prefix that turns the network off here: ("unshare", "-n"), ("unshare", "-rn")
    (an unprivileged user namespace), or () when neither works on this platform."""
    if shutil.which("unshare") is None:
        return ()
    for prefix in (("unshare", "-n"), ("unshare", "-rn")):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return ()


async def run_tests(code: str, tests: Sequence[str], timeout_s: float = 5.0, memory_mb: int = 512) -> list[bool]:
    """Run `code` then each test (a Python statement, usually an assert) in the sandbox; one bool
    per test. A test that did not report before the time limit (or a crash) counts as failed."""
    if not tests:
        return []
    workdir = tempfile.mkdtemp(prefix="prl-code-")
    try:
        os.chmod(workdir, 0o700)
        _write_job(workdir, code, tests, {"as": memory_mb << 20, "fsize": FILE_LIMIT, "cpu": int(timeout_s) + 1})
        lines = await _run_child(workdir, timeout_s)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    passed = [line == b"1" for line in lines[: len(tests)]]
    return passed + [False] * (len(tests) - len(passed))


def _write_job(workdir: str, code: str, tests: Sequence[str], limits: dict[str, int]) -> None:
    uid = NOBODY if os.getuid() == 0 else 0
    with open(os.path.join(workdir, "job.json"), "w", encoding="utf-8") as f:
        json.dump({"code": code, "tests": list(tests), "uid": uid, "limits": limits}, f)
    shutil.copy(HARNESS, os.path.join(workdir, "harness.py"))
    if uid:
        os.chown(workdir, uid, uid)


async def _run_child(workdir: str, timeout_s: float) -> list[bytes]:
    argv = [*network_isolation(), sys.executable, "-I", "-S", "harness.py"]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=workdir,
        env={**CLEAN_ENV, "HOME": workdir, "TMPDIR": workdir},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdout is not None
    out = bytearray()
    try:
        await asyncio.wait_for(_read_bounded(proc.stdout, out), timeout_s)
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        pass
    finally:
        _kill_group(proc.pid)
        await proc.wait()
    return bytes(out).split(b"\n")


async def _read_bounded(stream: asyncio.StreamReader, out: bytearray) -> None:
    while len(out) < MAX_RESULT_BYTES:
        chunk = await stream.read(4096)
        if not chunk:
            return
        out.extend(chunk)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def row_tests(record: RewardInput, tests_field: str = "tests") -> list[str]:
    """The row's tests: a list of Python statements (a single string is one test)."""
    tests: Any = record.row.get(tests_field, [])
    if isinstance(tests, str):
        return [tests]
    return [str(t) for t in tests]


async def code_reward(
    record: RewardInput, timeout_s: float = 5.0, memory_mb: int = 512, tests_field: str = "tests"
) -> float:
    """The fraction of the row's tests the completion's program passes (0.0 without a code block)."""
    tests = row_tests(record, tests_field)
    code = extract_code(record.completion)
    if code is None or not tests:
        return 0.0
    setup = str(record.row.get("test_setup", "") or "")
    results = await run_tests(code + ("\n" + setup if setup else ""), tests, timeout_s, memory_mb)
    return sum(results) / len(tests)

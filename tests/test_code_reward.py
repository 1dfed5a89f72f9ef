"""The code task and its sandboxed reward: pass, fail, an infinite loop killed, a memory bomb
refused, writes outside the private dir kept from the host, no inherited secrets, no network.
The hostile-program suite is tests/test_code_sandbox.py."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import pytest

from prl_actors.engines.base import Generated
from prl_actors.launch import build
from prl_actors.rewards import sandbox
from prl_actors.rewards.code import extract_code, run_tests
from tests.learning_utils import tiny_config

pytestmark = pytest.mark.skipif(
    sandbox.launcher()[1] is not None, reason=f"no sandbox here: {sandbox.launcher()[1]} (make install)"
)
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
GOOD = "def add(a, b):\n    return a + b\n"


def run(code: str, tests: list[str] = TESTS, **kw: float) -> list[bool]:
    return asyncio.run(run_tests(code, tests, **kw))  # type: ignore[arg-type]


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\n"


def test_extract_the_last_code_block() -> None:
    assert extract_code("no code") is None
    assert extract_code("```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nc = 3\n```") == "c = 3\n"


def test_a_correct_program_passes_and_a_wrong_one_fails_per_test() -> None:
    assert run(GOOD) == [True, True, True]
    assert run("def add(a, b):\n    return a + b if a >= 0 else 5\n") == [True, True, False]
    assert run("this is not python") == [False, False, False]


def test_an_infinite_loop_is_killed_at_the_time_limit() -> None:
    t0 = time.monotonic()
    assert run("while True:\n    pass\n", timeout_s=1.0) == [False, False, False]
    assert time.monotonic() - t0 < 5.0
    t0 = time.monotonic()
    looping_test = run(GOOD, [TESTS[0], "while True: pass", TESTS[1]], timeout_s=1.0)
    assert looping_test == [True, False, False] and time.monotonic() - t0 < 5.0  # tests before it still count


def test_a_memory_bomb_is_refused_by_rlimit_as() -> None:
    assert run(GOOD + "x = bytearray(8 * 2**30)\n", memory_mb=256) == [False, False, False]
    assert run(GOOD + "x = bytearray(2**20)\n", memory_mb=256) == [True, True, True]  # a small one is fine


def test_writes_outside_the_private_dir_do_not_reach_the_host(tmp_path: Path) -> None:
    target = tmp_path / "open"
    target.mkdir()
    target.chmod(0o777)  # the kernel would allow it for anyone: only the sandbox keeps it out
    victim = target / "escape.txt"
    for attempt in (
        f"open({str(victim)!r}, 'w').write('x')",
        f"import os\nos.close(os.open({str(victim)!r}, os.O_WRONLY | os.O_CREAT))",
        f"import os\nos.mkdir({str(target / 'd')!r})",
    ):
        assert run(GOOD + attempt + "\n") == [False] * 3, attempt  # the host's dir does not exist inside
    assert run(GOOD + "open('/tmp/prl-sandbox-escape.txt', 'w').write('x')\n") == [True] * 3  # its own /tmp
    assert not victim.exists() and not (target / "d").exists() and not Path("/tmp/prl-sandbox-escape.txt").exists()
    inside = "open('mine.txt', 'w').write('ok')\nassert open('mine.txt').read() == 'ok'\n"
    assert run(GOOD + inside) == [True] * 3  # its own dir is writable


def test_file_size_is_limited() -> None:
    assert run(GOOD + "open('big', 'w').write('x' * (4 << 20))\n") == [False] * 3


def test_subprocesses_and_sockets_are_refused() -> None:
    assert run(GOOD + "import subprocess\nsubprocess.run(['true'])\n") == [False] * 3
    assert run(GOOD + "import os\nassert os.system('true') == 0\n") == [False] * 3  # no process starts
    assert run(GOOD + "import socket\nsocket.socket()\n") == [False] * 3


def test_no_inherited_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRL_TEST_SECRET", "hunter2")
    check = "import os\nassert 'hunter2' not in repr(dict(os.environ))\nassert os.environ['HOME'] == os.getcwd()\n"
    assert run(GOOD + check) == [True] * 3


def test_the_network_is_off_at_the_kernel_level() -> None:
    """A listening port on this host's loopback: the program cannot connect (a new network
    namespace; seccomp refuses non-unix sockets too), and sees only its own `lo`."""
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    connect = f"import socket\nsocket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=2)\n"
    try:
        assert run(GOOD + connect) == [False] * 3
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert run(GOOD + "assert open('/proc/net/dev').read().count(':') == 1\n") == [True] * 3  # only lo


def test_the_program_runs_as_nobody_in_its_own_namespaces() -> None:
    check = "import os\nassert os.getuid() == 65534 and os.getgid() == 65534 and os.getpid() < 10\n"
    assert run(GOOD + check) == [True] * 3
    kinds = ["user", "pid", "mnt", "net", "ipc", "uts", "cgroup"]
    program = "import os\ndef ns(kind):\n    return os.readlink('/proc/self/ns/' + kind)\n"
    tests = [f"assert ns({kind!r}) != {os.readlink(f'/proc/self/ns/{kind}')!r}" for kind in kinds]
    assert run(program, tests) == [True] * len(kinds)  # every namespace its own
    assert run(program, [f"assert ns('time') != {os.readlink('/proc/self/ns/time')!r}"]) == [False]  # the control


def test_verdicts_beyond_equality_are_judged_without_the_program() -> None:
    """set(), math.isclose, abs(...) < eps: the judge sandbox evaluates them on the program's values."""
    tests = ["assert set([add(1, 2), 3]) == {3}", "import math as m\nassert m.isclose(add(0.1, 0.2), 0.3)",
             "assert abs(add(1, 1) - 2) < 1e-9", "assert sorted([add(2, 2), 1]) == [1, 5]"]  # fmt: skip
    assert run(GOOD, tests) == [True, True, True, False]  # `math`: the judge imports stdlib modules it names
    scopes = ["assert all(x > 0 for x in add([1], [2]))", "assert all(x > 1 for x in add([1], [2]))",
              "assert max(add([(1, 'b')], [(0, 'c')]), key=lambda t: t[1]) == (0, 'c')"]  # fmt: skip
    assert run(GOOD, scopes) == [True, False, True]  # lambdas and comprehensions in the judge
    fact = "import math\ndef fact(n):\n    return math.factorial(n)\n"
    big = ["assert fact(2000) == math.factorial(2000)", "assert fact(3) == 6"]  # 5736 digits: past int(str)
    assert run(fact, big) == [True, True]


def test_the_code_task_scores_the_fraction_of_tests_passed() -> None:
    task = build.task(tiny_config(task__name="code", task__code_timeout_s=2.0))
    assert len(task.items) >= 6 and all(row["tests"] for row in task.rows)
    prompt = next(p for p in task.prompts_for_epoch(0, len(task.items)) if "add_numbers" in p.prompt)
    samples = [
        Generated(text=fenced("def add_numbers(a, b):\n    return a + b\n"), token_ids=[1], logprobs=[0.0]),
        Generated(text=fenced("def add_numbers(a, b):\n    return 3\n"), token_ids=[1], logprobs=[0.0]),
        Generated(text="no code at all", token_ids=[1], logprobs=[0.0]),
        Generated(text=fenced("while True: pass\n"), token_ids=[1], logprobs=[0.0]),
    ]
    t0 = time.monotonic()
    scored = task.score_group(prompt, [], samples)
    assert scored.totals == [1.0, pytest.approx(1 / 3), 0.0, 0.0]
    assert time.monotonic() - t0 < 2.0 + 3.0  # the samples run concurrently: one time limit, not four


def test_a_code_row_without_tests_is_refused_at_load(tmp_path: Path) -> None:
    from prl_actors.sections import ConfigError

    bad = tmp_path / "c.jsonl"
    bad.write_text('{"prompt": "write f", "tests": []}\n')
    with pytest.raises(ConfigError, match=r"c.jsonl:1: 'tests' must be a non-empty list"):
        build.task(tiny_config(task__name="code", task__prompts_file=str(bad)))


def test_the_sandbox_runs_from_worker_threads() -> None:
    """Workers score on an actor thread, not the main one: subprocesses must still be reaped."""
    import threading

    out: list[list[bool]] = []
    threads = [threading.Thread(target=lambda: out.append(run(GOOD))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert out == [[True] * 3] * 3

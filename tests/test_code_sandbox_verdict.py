"""Where the code reward's verdicts are decided (rewards/sandbox_verdict.py, sandbox_values.py), and
the seccomp filter's table, the refusal without bubblewrap: no sandbox needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prl_actors.rewards import sandbox_seccomp
from prl_actors.rewards.sandbox_values import decode, encode
from prl_actors.rewards.sandbox_verdict import Split, decode_line, judge, judgeable_here, split_tests

pytestmark = pytest.mark.fast

LOOP = "assert all(add(i, 0) == i for i in range(3))"  # a comprehension's own variable: run whole inside
PROGRAM = "import math\ndef add(a, b):\n    return a + b\ndef sorted(x):\n    return x\nCONST = 5\n"


@pytest.mark.parametrize(
    ("test", "split"),
    [
        ("assert add(1, 2) == 3", Split(["add(1, 2)"], "__v0 == 3")),
        ("assert add(1, 2) == 3, 'message'", Split(["add(1, 2)"], "__v0 == 3")),
        ("assert set(add((1,), (2,))) == {1, 2}", Split(["add((1,), (2,))"], "set(__v0) == {1, 2}")),
        ("assert math.isclose(add(0.1, 0.2), 0.3)", Split(["add(0.1, 0.2)"], "math.isclose(__v0, 0.3)")),
        ("assert add(1, 2)[0] == CONST", Split(["add(1, 2)[0]", "CONST"], "__v0 == __v1")),
        ("assert sorted([2, 1]) == [1, 2]", Split(["sorted([2, 1])"], "__v0 == [1, 2]")),  # the program's sorted
        ("assert all(add(i, 0) == i for i in range(3))", Split([LOOP], inside=True)),
        ("assert all(x > 0 for x in add([1], [2]))", Split(["add([1], [2])"], "all((x > 0 for x in __v0))")),
        ("assert max(add([(1, 'b')], [(0, 'c')]), key=lambda t: t[1]) == (0, 'c')",
         Split(["add([(1, 'b')], [(0, 'c')])"], "max(__v0, key=lambda t: t[1]) == (0, 'c')")),
        ("assert [y for y in range(3) if add(y, 0)] == [1, 2]",
         Split(["assert [y for y in range(3) if add(y, 0)] == [1, 2]"], inside=True)),
        ("x = add(1, 2)", Split(["x = add(1, 2)"], inside=True)),
        ("import cmath\nassert cmath.sqrt(add(-1, 0)) == 1j",
         Split(["add(-1, 0)"], "cmath.sqrt(__v0) == 1j", prelude="import cmath")),
        ("from fractions import Fraction as F\nassert F(add(1, 1)) == 2",
         Split(["add(1, 1)"], "F(__v0) == 2", prelude="from fractions import Fraction as F")),
        ("import os\nx = add(1, 2)", Split(["import os\nx = add(1, 2)"], inside=True)),
        ("assert add(1,", Split([], "False")),
    ],
)  # fmt: skip
def test_a_test_is_split_so_its_expected_values_stay_outside(test: str, split: Split) -> None:
    assert split_tests(PROGRAM, "", [test]) == [split]


def test_names_the_setup_binds_are_the_judges() -> None:
    """`helper` comes from the row's setup: the judge runs it, the program's sandbox is not asked."""
    assert split_tests(PROGRAM, "def helper(x):\n    return x", ["assert helper(add(1, 2)) == 3"]) == [
        Split(["add(1, 2)"], "helper(__v0) == 3")
    ]


def test_values_round_trip_as_plain_data_only() -> None:
    value = {1: [1.5, (2, "a"), {3}, frozenset({4})], "b": b"\x00x", "n": None, "c": 1j, "t": True}
    assert decode(encode(value)) == value
    assert str(decode(encode(float("nan")))) == "nan"
    assert decode(encode(-(7**9000))) == -(7**9000)  # 7606 digits: more than int(str) takes

    class Liar(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    assert type(decode(encode(Liar(3)))) is int and decode(encode(Liar(3))) != 4  # the program's __eq__ is gone
    with pytest.raises(TypeError):
        encode(object())
    with pytest.raises(TypeError):
        encode(iter(()))


@pytest.mark.parametrize(
    "line",
    [b"", b"null", b"{}", b"[1]", b'[["i"]]', b'[["zz", "1"]]', b'[["i", "x"]]', b'[["i", 12]]', b"[" * 100000,
     b'[["S", [["l", []]]]]', b'[["d", [[["l", []], ["n"]]]]]', b'[["f", "1.5x"]]'],
)  # fmt: skip
def test_a_malformed_answer_fails_the_test_without_raising(line: bytes) -> None:
    assert decode_line(line, 1) is None


def test_the_verdict_is_judged_here_when_it_only_compares_data() -> None:
    assert judge("__v0 == 3", [3]) and not judge("__v0 == 3", [4])
    assert judge("__v0 is True", [True]) and not judge("__v0 is True", [1])
    assert judge("__v0 == [1, 2] and not __v1", [[1, 2], 0])
    assert judge("1 < __v0 <= 3", [3]) and not judge("__v0 < 'a'", [1])  # a TypeError is a failure
    assert judgeable_here("__v0 == (1, -2.5, None)")
    assert not judgeable_here("set(__v0) == {1}") and not judgeable_here("__v0.count(1) == 2")


HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}


@pytest.mark.parametrize("machine", sorted(sandbox_seccomp.ARCHES))
def test_the_seccomp_table_matches_the_kernel_headers(machine: str) -> None:
    header = HEADERS[machine]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    numbers = {m[0]: int(m[1]) for m in re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text())}
    table = sandbox_seccomp.ARCHES[machine][1]
    assert {name: numbers.get(name) for name in table} == table
    filt = sandbox_seccomp.build(machine)
    assert len(filt) % 8 == 0 and len(filt) // 8 < 255  # one sock_filter each; jumps stay short


def test_the_code_task_refuses_to_load_without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """bwrap missing: the code task fails at load with one line saying what to install, and loads
    with the explicit opt-out `task.code_unsafe_local`."""
    from prl_actors.launch import build
    from prl_actors.rewards import sandbox
    from prl_actors.sections import ConfigError
    from tests.learning_utils import tiny_config

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.launcher.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"^the code reward needs bubblewrap: apt-get install bubblewrap") as err:
            build.task(tiny_config(task__name="code"))
        assert "\n" not in str(err.value) and "task.code_unsafe_local: true" in str(err.value)
        assert build.task(tiny_config(task__name="code", task__code_unsafe_local=True)).name == "code"
    finally:
        sandbox.launcher.cache_clear()

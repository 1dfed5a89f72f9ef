"""Runs INSIDE the sandbox (`python -I -S harness.py`, beside sandbox_values.py): never imported by
prl-actors. Stdlib only.

Reads one job (JSON) from stdin, sets its rlimits, points stdout/stderr of the program at /dev/null
and keeps the original stdout as the answer pipe, one line per test:
- mode "run": runs the model's program, then the row's `setup`, then each test's probes (expressions,
  sandbox_verdict.py), answering `[encoded value, ...]` (sandbox_values.py), or `null` when a probe
  raised or the program did not run; a test marked `inside` is a statement run whole, answered
  `[["B", passed]]`.
- mode "judge": runs only `setup` (never the program), then each test's verdict on the values it is
  given, answering `1` or `0`.
Anything in this process can be changed by the program it runs: the answers of a "run" are its
answers, not a verdict (sandbox_verdict.py says why that suffices).
"""

import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sandbox_values import decode, encode  # noqa: E402 - beside this file, not a package

NOFILE, NPROC = 64, 64


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    os.close(0)
    _limit(job["limits"])
    answers = os.dup(1)
    sink = os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    namespace = {"__name__": "__main__"}
    tests = job["tests"]
    if job["mode"] == "judge":
        lines = _judged(job["setup"], tests, namespace)
    else:
        ran = _run(job["code"], "solution.py", namespace) and _run(job["setup"], "setup", namespace)
        lines = (_answer(test, namespace) if ran else "null" for test in tests)
    for line in lines:
        os.write(answers, line.encode() + b"\n")
    os._exit(0)


def _limit(limits: dict) -> None:
    for res, value in (
        (resource.RLIMIT_AS, limits["as"]),
        (resource.RLIMIT_FSIZE, limits["fsize"]),
        (resource.RLIMIT_CPU, limits["cpu"]),
        (resource.RLIMIT_NOFILE, NOFILE),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, NPROC),
    ):
        resource.setrlimit(res, (value, value))


def _run(source: str, name: str, namespace: dict) -> bool:
    try:
        exec(compile(source, name, "exec"), namespace)
        return True
    except BaseException:  # noqa: BLE001 - any failure of the program is a failed test
        return False


def _answer(test: dict, namespace: dict) -> str:
    if test["inside"]:
        return json.dumps([encode(_run(test["probes"][0], "test", namespace))])
    try:
        exec(compile(test["prelude"], "test", "exec"), namespace)
        return json.dumps([encode(eval(compile(p, "test", "eval"), namespace)) for p in test["probes"]])
    except BaseException:  # noqa: BLE001 - a probe that raised, or a value that is not plain data
        return "null"


def _judged(setup: str, tests: list, namespace: dict):
    ready = _run(setup, "setup", namespace)
    for test in tests:
        yield "1" if ready and test is not None and _holds(test, namespace) else "0"


def _holds(test: dict, namespace: dict) -> bool:
    import ast  # only the judge needs it: ~15 ms less at the start of every program's sandbox

    try:
        exec(compile(test["prelude"], "test", "exec"), namespace)
        verdict = ast.parse(test["verdict"], "verdict", "eval")
        for node in ast.walk(verdict):  # `math.isclose(...)`: stdlib modules the setup did not import
            if isinstance(node, ast.Name) and node.id not in namespace and node.id in sys.stdlib_module_names:
                namespace[node.id] = __import__(node.id)
        values = {f"__v{i}": decode(v) for i, v in enumerate(test["values"])}
        return bool(eval(compile(verdict, "verdict", "eval"), {**namespace, **values}))
    except BaseException:  # noqa: BLE001 - a verdict that raised is a failed test
        return False


if __name__ == "__main__":
    main()

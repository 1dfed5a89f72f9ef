"""Rewards under guard (issue 39 / 40): a reward is a real number (a string "1.0" is refused, naming
the plugin); a sync plugin that hangs runs into its deadline, and a stop ends the wait at once with
no made-up value; an HTTP reward never reads a huge body whole; a plugin that raises is reported
with its file:line (the console's line) and its whole traceback (the worker's log)."""

from __future__ import annotations

import http.server
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from prl_actors.plugins import STOPPING
from prl_actors.rewards import Reward, RewardError, RewardInput, RewardSet
from prl_actors.rewards.errors import RewardStopped
from prl_actors.rewards.http import MAX_RESPONSE_BYTES, HttpReward
from prl_actors.rewards.reward import legacy
from tests import guard_plugins


def records(n: int = 3) -> list[RewardInput]:
    return [RewardInput(prompt="p", completion=f"c{i}", answer="1", group_id=4, item=9, sample=i) for i in range(n)]


def constant(value: Any) -> Reward:
    return Reward("r", lambda record: value, source="my_module:r", isolated=True, timeout_s=5.0)


@pytest.mark.parametrize("value", [True, 1, 1.0, np.float32(1.0), np.int64(1), torch.tensor(1.0), np.array(1.0)])
def test_real_numbers_are_rewards(value: Any) -> None:
    assert RewardSet([constant(value)]).score(records()).totals == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("value", ["1.0", b"1", None, [1.0], 1 + 0j, float("nan"), torch.tensor([1.0])])
def test_anything_else_is_refused_naming_the_plugin(value: Any) -> None:
    with pytest.raises(RewardError) as info:
        RewardSet([constant(value)]).score(records())
    assert "reward 'r' (my_module:r) returned" in str(info.value) and "prompt 4 (row 9) sample 0" in str(info.value)
    assert "rewards must be real numbers: bool, int or float" in str(info.value) or "finite numbers" in str(info.value)


def test_a_string_from_a_batched_plugin_is_refused_too() -> None:
    batched = Reward("b", lambda recs: ["1.0"] * len(recs), batched=True, source="m:b")
    with pytest.raises(RewardError, match=r"reward 'b' \(m:b\) returned '1.0' of type str"):
        RewardSet([batched]).score(records())


def test_a_hanging_sync_plugin_runs_into_its_deadline() -> None:
    guard_plugins.RELEASE.clear()
    hang = Reward("h", legacy(guard_plugins.hangs), source="tests.guard_plugins:hangs", isolated=True, timeout_s=0.3)
    t0 = time.monotonic()
    try:
        with pytest.raises(RewardError, match=r"reward 'h' \(tests.guard_plugins:hangs\) timed out after 0.3s"):
            RewardSet([hang]).score(records())
        assert time.monotonic() - t0 < 2.0  # one deadline for the group, not one per sample
        scored = RewardSet([hang], "zero").score(records())  # under zero: 0, and said
        assert scored.totals == [0.0, 0.0, 0.0] and "timed out" in scored.errors[0]
        stuck = [t for t in threading.enumerate() if t.name == "reward-h"]
        assert stuck and all(t.daemon for t in stuck)  # abandoned threads never keep the process alive
    finally:
        guard_plugins.RELEASE.set()


@pytest.mark.parametrize("policy", ["fail", "zero"])
def test_a_stop_ends_a_hanging_plugin_wait_at_once_with_no_value(policy: str) -> None:
    guard_plugins.RELEASE.clear()
    hang = Reward("h", guard_plugins.hangs_record, source="tests.guard_plugins:hangs_record", isolated=True)
    threading.Timer(0.2, STOPPING.set).start()  # what process.py does on a stop signal
    t0 = time.monotonic()
    try:
        with pytest.raises(RewardStopped, match="this process is stopping"):
            RewardSet([hang], policy).score(records())  # type: ignore[arg-type]
        assert time.monotonic() - t0 < 1.0  # no deadline set: only the stop ends it
    finally:
        STOPPING.clear()
        guard_plugins.RELEASE.set()


def test_an_isolated_sync_plugin_scores_a_group_in_order_in_one_thread() -> None:
    seen: list[tuple[str, str]] = []

    def fn(record: RewardInput) -> float:
        seen.append((threading.current_thread().name, record.completion))
        if record.sample == 1:
            raise KeyError("x")
        return 0.5

    scored = RewardSet([Reward("s", fn, source="m:s", isolated=True, timeout_s=5)], "zero").score(records())
    assert scored.totals == [0.5, 0.0, 0.5] and "KeyError" in scored.errors[0]
    assert [c for _, c in seen] == ["c0", "c1", "c2"] and len({t for t, _ in seen}) == 1 and seen[0][0] == "reward-s"


def test_a_plugin_that_raises_is_named_with_its_file_and_line_and_traced() -> None:
    bad = Reward("d", legacy(guard_plugins.divides), source="tests.guard_plugins:divides", isolated=True)
    with pytest.raises(RewardError) as info:
        RewardSet([bad]).score(records())
    line = guard_plugins.divides.__code__.co_firstlineno + 3
    assert str(info.value).endswith(f"ZeroDivisionError: division by zero (guard_plugins.py:{line})")
    assert f'guard_plugins.py", line {line}, in divides' in info.value.trace
    scored = RewardSet([bad], "zero").score(records())
    assert f"line {line}, in divides" in scored.traces[scored.errors[0]]  # under zero too (the worker logs it)


# --- HTTP: a body too large is refused, never read whole ----------------------------------------


class _Huge(http.server.BaseHTTPRequestHandler):
    sent = 0

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        if self.path == "/declared":
            self.send_header("Content-Length", str(500 << 20))
        self.end_headers()
        chunk = b"9" * (1 << 20)
        try:
            for _ in range(500):  # 500 MB, unless the client hangs up first
                self.wfile.write(chunk)
                type(self).sent += len(chunk)
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def huge() -> Iterator[str]:
    _Huge.sent = 0
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Huge)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", ["/declared", "/streamed"])
def test_a_huge_http_answer_is_refused_without_reading_it(huge: str, path: str) -> None:
    svc = Reward("svc", HttpReward(huge + path, timeout_s=10.0, retries=0), batched=True, source="url")
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=f"more than {MAX_RESPONSE_BYTES}"):
        RewardSet([svc]).score(records())
    assert time.monotonic() - t0 < 5.0
    assert _Huge.sent < 100 << 20  # the client hung up after ~1 MiB (plus socket buffers), not 500 MB


def test_a_plugin_that_calls_sys_exit_is_a_reward_error_not_the_workers_exit() -> None:
    import sys

    def bye(record: RewardInput) -> float:
        sys.exit(3)

    with pytest.raises(RewardError, match=r"reward 'x' \(m:x\) raised on prompt 4 \(row 9\): SystemExit: 3"):
        RewardSet([Reward("x", bye, source="m:x", isolated=True, timeout_s=5)]).score(records())

"""The remote reward service against a real HTTP server on 127.0.0.1: up, slow (timeout then
retry), failing (5xx then retry), down (a clear error, or 0 under on_reward_error: zero), bounded
concurrency; never a hang."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from prl_actors.rewards import Reward, RewardError, RewardInput, RewardSet
from prl_actors.rewards.http import HttpReward
from prl_actors.tasks.config import RewardSpec


class Service(ThreadingHTTPServer):
    """Scores len(completion); `slow_first` requests sleep `delay_s` first, `fail_first` answer 503."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict[str, Any]] = []
        self.slow_first, self.delay_s, self.fail_first = 0, 0.0, 0
        self.in_flight = self.max_in_flight = 0
        self.malformed = False
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/score"


class Handler(BaseHTTPRequestHandler):
    server: Service

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        s = self.server
        with s.lock:
            s.requests.append(body)
            n = len(s.requests)
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)
        counted = True
        try:
            if n <= s.slow_first:
                time.sleep(s.delay_s)
            if n <= s.fail_first:
                self.send_response(503)
                self.end_headers()
                return
            data = json.dumps({"rewards": [float(len(r["completion"])) for r in body["records"]]}).encode()
            if s.malformed:
                data = b'{"oops": 1}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            with s.lock:  # before the body: the client cannot have its answer (and send again) before this
                s.in_flight -= 1
                counted = False
            self.end_headers()
            self.wfile.write(data)
        finally:
            if counted:
                with s.lock:
                    s.in_flight -= 1

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def service() -> Iterator[Service]:
    srv = Service()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def records(texts: list[str], group_id: int = 0) -> list[RewardInput]:
    return [
        RewardInput(prompt="p", completion=t, answer="a", group_id=group_id, sample=i, row={"k": [1, 2]})
        for i, t in enumerate(texts)
    ]


def service_set(url: str, on_error: str = "fail", **kw: Any) -> RewardSet:
    spec = RewardSpec(url=url, **kw)
    reward = Reward("svc", HttpReward.from_spec(spec), batched=True, source=f"url {url}")
    return RewardSet([reward], on_error)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_service_that_is_up_scores_a_group_in_one_request(service: Service) -> None:
    scored = service_set(service.url).score(records(["a", "bbb", "cc"]))
    assert scored.totals == [1.0, 3.0, 2.0]
    assert len(service.requests) == 1
    sent = service.requests[0]["records"]
    assert [r["sample"] for r in sent] == [0, 1, 2] and sent[0]["row"] == {"k": [1, 2]}
    assert set(sent[0]) >= {"prompt", "completion", "answer", "finished", "truncated", "messages", "group_id"}


def test_a_slow_service_times_out_then_the_retry_answers(service: Service) -> None:
    service.slow_first, service.delay_s = 1, 1.5
    t0 = time.monotonic()
    scored = service_set(service.url, timeout_s=0.3, retries=2).score(records(["ab"]))
    assert scored.totals == [2.0] and len(service.requests) == 2
    assert time.monotonic() - t0 < 1.5  # did not wait for the slow answer


def test_a_failing_service_is_retried(service: Service) -> None:
    service.fail_first = 2
    assert service_set(service.url, retries=2).score(records(["abc"])).totals == [3.0]
    assert len(service.requests) == 3


def test_a_service_that_stays_slow_is_a_clear_error_within_the_bound(service: Service) -> None:
    service.slow_first, service.delay_s = 10, 2.0
    t0 = time.monotonic()
    with pytest.raises(RewardError) as info:
        service_set(service.url, timeout_s=0.2, retries=1).score(records(["a"], group_id=5))
    assert time.monotonic() - t0 < 0.2 * 2 + 0.2 + 1.0  # (retries + 1) * timeout + backoff, and slack
    message = str(info.value)
    assert message.startswith(f"reward 'svc' (url {service.url}) raised on prompt 5: ServiceError:")
    assert "no answer after 2 attempts (timed out after 0.2s; timed out after 0.2s)" in message


def test_a_service_that_is_down_is_a_clear_error_or_zero() -> None:
    url = f"http://127.0.0.1:{free_port()}/score"
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"no answer after 3 attempts \(ConnectionRefusedError"):
        service_set(url, timeout_s=1.0, retries=2).score(records(["a"]))
    assert time.monotonic() - t0 < 3.0
    scored = service_set(url, on_error="zero", retries=0).score(records(["a", "b"]))
    assert scored.totals == [0.0, 0.0] and len(scored.errors) == 1


def test_a_malformed_answer_is_an_error_at_once(service: Service) -> None:
    service.malformed = True
    with pytest.raises(RewardError, match=r'must answer \{"rewards": \[2 numbers\]\}, got b\'\{"oops": 1\}\''):
        service_set(service.url, retries=3).score(records(["a", "b"]))
    assert len(service.requests) == 1  # not retried: another attempt would not fix it


def test_concurrency_is_bounded(service: Service) -> None:
    service.slow_first, service.delay_s = 100, 0.2
    rs = service_set(service.url, concurrency=2, timeout_s=5.0)

    async def many() -> None:
        import asyncio

        await asyncio.gather(*(rs.score_async(records(["a"], group_id=g)) for g in range(6)))

    import asyncio

    t0 = time.monotonic()
    asyncio.run(many())
    assert service.max_in_flight == 2 and len(service.requests) == 6
    assert time.monotonic() - t0 >= 0.2 * 3 - 0.05  # 6 requests, 2 at a time

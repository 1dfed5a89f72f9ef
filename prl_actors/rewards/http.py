"""A remote reward service: one HTTP POST per group, JSON in and out (contract: docs/TASKS.md).

Request:  POST <url>, Content-Type: application/json, body {"records": [record, ...]} with the G
          records of one group (RewardInput.to_json: prompt, completion, answer, ids, finished,
          truncated, row, messages, group_id, item, sample).
Response: 200 with {"rewards": [float, ...]}, one finite number per record, in order.
Each attempt is bounded by `timeout_s`; a timeout, a refused connection, a 5xx or a 429 is retried
up to `retries` times (backoff 0.2 s, 0.4 s, ...); any other status, or a malformed body, fails at
once. At most `concurrency` requests are in flight per worker. The total wait is bounded by
(retries + 1) * timeout_s + the backoff: never a hang. A body larger than MAX_RESPONSE_BYTES (1 MiB)
fails at once, without being read whole (a 500 MB answer costs one chunk past the limit).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prl_actors.rewards.record import RewardInput
    from prl_actors.tasks.config import RewardSpec

DEFAULT_TIMEOUT_S = 30.0
BACKOFF_S = 0.2
MAX_RESPONSE_BYTES = (
    1 << 20
)  # {"rewards": [G floats]} is a few hundred bytes: a bigger body is refused, never read whole
READ_CHUNK = 64 << 10


class ServiceError(Exception):
    """The service did not answer usefully; str() says what happened on each attempt."""


class _Retryable(Exception):
    pass


@dataclass
class HttpReward:
    url: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int = 2
    concurrency: int = 4
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_spec(cls, spec: RewardSpec) -> HttpReward:
        assert spec.url is not None
        return cls(spec.url, spec.timeout_s or DEFAULT_TIMEOUT_S, spec.retries, spec.concurrency)

    async def __call__(self, records: Sequence[RewardInput]) -> list[Any]:
        body = json.dumps({"records": [r.to_json() for r in records]}, default=str).encode()  # dates: text
        loop = asyncio.get_running_loop()
        failures: list[str] = []
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                future = loop.run_in_executor(self._executor(), self._post, body)
                return _rewards(await asyncio.wait_for(future, self.timeout_s), len(records))
            except TimeoutError:
                failures.append(f"timed out after {self.timeout_s}s")
            except _Retryable as exc:
                failures.append(str(exc))
        raise ServiceError(f"{self.url}: no answer after {self.retries + 1} attempts ({'; '.join(failures)})")

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="reward-http")
        return self._pool

    def _post(self, body: bytes) -> bytes:
        """One attempt (runs in the pool). _Retryable for what another attempt may fix."""
        req = urllib.request.Request(self.url, data=body, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - the configured url
                return _bounded_body(resp, self.url)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500 or exc.code == 429:
                raise _Retryable(f"HTTP {exc.code}") from None
            raise ServiceError(f"{self.url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise _Retryable(f"timed out after {self.timeout_s}s") from None
            raise _Retryable(f"{type(reason).__name__}: {reason}") from None


def _bounded_body(resp: Any, url: str) -> bytes:
    """The response body, read in chunks up to MAX_RESPONSE_BYTES; a larger one (by its
    Content-Length or as read) is a ServiceError, and at most one chunk past the limit is read."""
    length = resp.headers.get("Content-Length")
    if length is not None and length.isdigit() and int(length) > MAX_RESPONSE_BYTES:
        raise ServiceError(f"{url}: the answer is {int(length)} bytes, more than {MAX_RESPONSE_BYTES}")
    body = bytearray()
    while chunk := resp.read(READ_CHUNK):
        body += chunk
        if len(body) > MAX_RESPONSE_BYTES:
            raise ServiceError(f"{url}: the answer is more than {MAX_RESPONSE_BYTES} bytes")
    return bytes(body)


def _rewards(raw: bytes, n: int) -> list[Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        raise ServiceError(f"the service's answer is not JSON: {raw[:80]!r}") from None
    values = data.get("rewards") if isinstance(data, dict) else None
    if not isinstance(values, list) or len(values) != n:
        raise ServiceError(f'the service must answer {{"rewards": [{n} numbers]}}, got {raw[:80]!r}')
    return values

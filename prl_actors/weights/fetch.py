"""The weight-fetch state machine that inference workers and env actors share (socket-free).

    idle --request--> requested --WeightsBegin--> receiving --WeightsEnd--> idle (a Snapshot)
      ^                   |                           |
      +-- retry_at <------+---- failure / timeout ----+

The actor sends FetchWeights and installs the Snapshot; this part only says what state the fetch is
in. Invariants: at most one fetch is out (`busy`; the actor asks again only once it is idle); every
failure (a broken transfer, an Error answering the request, a snapshot the actor cannot load, no
complete transfer within `timeout_s`) leaves it idle with a retry due at `retry_at`, never busy
forever. The deadline runs from the request while waiting for WeightsBegin and from WeightsBegin
while chunks arrive, so a slow publisher and a slow transfer each get the whole `timeout_s`.
A newer version announced mid-fetch starts nothing: the actor compares what it loaded with what it
wants once this fetch ends (or fails) and asks again then.

`FetchingCore` is the part of an actor's Core that turns WeightsBegin / WeightChunk / WeightsEnd into
calls on its `fetch` and logs every failure as `weight_sync_failed` (counted under the same name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.protocol.messages import WeightChunk, WeightsBegin, WeightsEnd
from prl_actors.runtime.core import Core, handles
from prl_actors.weights.transfer import Assembler, Snapshot, TransferError

if TYPE_CHECKING:
    from prl_actors.protocol.codec import Frame
    from prl_actors.transport.port import Inbound

# Ask again this long after a failed fetch. 0.2 s, the interval both actors already waited after an
# Error answering a fetch (e.g. nothing published yet): one pace for every failure, and a failing
# publisher is asked at most 5 times a second by each member (a broken transfer is rare, so the
# 0.1 s the worker used there bought nothing measurable).
RETRY_S = 0.2


class WeightFetch:
    """One member's fetch: idle, requested (`sent`) or receiving (`assembler`); `retry_at` once failed."""

    def __init__(self, timeout_s: float, retry_s: float = RETRY_S) -> None:
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self.sent: float | None = None  # when the FetchWeights out was sent; None: none is out
        self.assembler: Assembler | None = None  # the transfer arriving (after its WeightsBegin)
        self.retry_at: float | None = None  # when to ask again after a failure

    @property
    def busy(self) -> bool:
        """A fetch is out or a transfer is arriving: send no other FetchWeights."""
        return self.sent is not None or self.assembler is not None

    @property
    def started(self) -> float | None:
        """When the current stage began: the transfer's WeightsBegin, else the request."""
        return self.assembler.started if self.assembler is not None else self.sent

    def request(self, now: float) -> None:
        self.sent, self.retry_at = now, None

    def begin(self, now: float, msg: WeightsBegin) -> str | None:
        """A transfer starts (it replaces one still arriving); the reason when its table is invalid."""
        try:
            self.assembler = Assembler(msg, now)
        except TransferError as exc:
            return self.fail(now, str(exc))
        return None

    def chunk(self, now: float, msg: WeightChunk, payloads: list[Frame]) -> str | None:
        """One chunk (ignored when no transfer is arriving); the reason when it does not fit."""
        if self.assembler is None:
            return None
        try:
            self.assembler.chunk(msg, payloads)
        except TransferError as exc:
            return self.fail(now, str(exc))
        return None

    def end(self, now: float, msg: WeightsEnd) -> Snapshot | str | None:
        """The finished Snapshot (the fetch stays `busy` until `clear` or `fail`), the reason when
        chunks are missing (idle, retry due), or None when no transfer was arriving."""
        assembler, self.assembler = self.assembler, None
        if assembler is None:
            return None
        try:
            return assembler.end(msg)
        except TransferError as exc:
            return self.fail(now, str(exc))

    def clear(self) -> None:
        """Idle, nothing due: the snapshot is installed (or ignored), or the member joined a new core."""
        self.sent, self.assembler, self.retry_at = None, None, None

    def fail(self, now: float, why: str, retry_s: float | None = None) -> str:
        """Give this fetch up: idle, ask again after `retry_s` (default `self.retry_s`). Returns `why`."""
        self.sent, self.assembler = None, None
        self.retry_at = now + (self.retry_s if retry_s is None else retry_s)
        return why

    def refused(self, now: float) -> bool:
        """An Error arrived: when the fetch still waits for its WeightsBegin, that is its answer
        (e.g. nothing published yet): give it up and ask again later. True when it did."""
        if self.sent is None or self.assembler is not None:
            return False
        self.fail(now, "refused")
        return True

    def expired(self, now: float) -> str | None:
        """Called every tick: the reason when the current stage ran past `timeout_s` (then failed)."""
        started = self.started
        if started is None or now - started <= self.timeout_s:
            return None
        return self.fail(now, f"no complete transfer in {self.timeout_s}s")

    def due(self, now: float) -> bool:
        """True once, when the retry after a failure is due."""
        if self.retry_at is None or now < self.retry_at:
            return False
        self.retry_at = None
        return True


class FetchingCore(Core):
    """A Core that fetches weights (the worker, the env actor): it sends FetchWeights itself (after
    `fetch.request`) and installs what `weights_arrived` hands it, calling `fetch.clear` or `fetch.fail`."""

    fetch: WeightFetch

    @handles(WeightsBegin)
    def on_weights_begin(self, now: float, inbound: Inbound[WeightsBegin]) -> None:
        self.fetch_failed(self.fetch.begin(now, inbound.msg))

    @handles(WeightChunk)
    def on_weight_chunk(self, now: float, inbound: Inbound[WeightChunk]) -> None:
        self.fetch_failed(self.fetch.chunk(now, inbound.msg, inbound.payloads))

    @handles(WeightsEnd)
    def on_weights_end(self, now: float, inbound: Inbound[WeightsEnd]) -> None:
        started = self.fetch.started
        snap = self.fetch.end(now, inbound.msg)
        if isinstance(snap, Snapshot):
            self.weights_arrived(now, snap, now if started is None else started)
        else:
            self.fetch_failed(snap)

    def weights_arrived(self, now: float, snap: Snapshot, started: float) -> None:
        """Install `snap` (its transfer began at `started`); then `fetch.clear()`, or `fetch.fail`."""
        raise NotImplementedError

    def fetch_failed(self, why: str | None) -> None:
        if why is not None:
            self.count("weight_sync_failed")
            self.log("weight_sync_failed", reason=why)

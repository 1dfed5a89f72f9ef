"""WeightPublisher: stores the newest weight version and serves full snapshots to workers.

Upload (Trainer -> Publisher): WeightsBegin, chunks, WeightsEnd -> reply WeightsStored, and
WeightsAvailable to the Coordinator. Versions only move forward: an upload of an older version than
the stored one is refused. Fetch (worker -> Publisher): FetchWeights -> the current snapshot as
WeightsBegin/chunks/WeightsEnd (replying to the fetch's id), or Error `rejected` if none is stored yet.
A late joiner therefore always gets the current snapshot. An upload not finished within
`transfer_timeout_s` is dropped and logged as `transfer_failed`.

Same host: with a `ShmPublisher` (publisher.shm), each stored version is also written once to
/dev/shm and served from that mapping; a fetch whose `host_proof` matches the publisher's host file is
answered with WeightsBegin(shm_path, chunks 0) + WeightsEnd instead of chunks (weights/shm.py). A
trainer on this host uploads the same way: WeightsBegin(shm_path, chunks 0) + WeightsEnd, the file
written by the trainer, validated and adopted here (no bytes cross the socket); a refused one is
answered with Error `rejected` and the trainer sends chunks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.protocol.messages import (
    Error,
    ErrorCode,
    FetchWeights,
    Msg,
    Role,
    WeightChunk,
    WeightsAvailable,
    WeightsBegin,
    WeightsEnd,
    WeightsStored,
    Welcome,
)
from prl_actors.runtime.core import Core, handles
from prl_actors.runtime.faults import kill_point
from prl_actors.transport.port import Dest, Inbound
from prl_actors.weights.shm import ShmPublisher, ShmRefused, ShmUnavailable
from prl_actors.weights.transfer import Assembler, Snapshot, TransferError, transfer_messages

if TYPE_CHECKING:
    from prl_actors.records.logs import EventLog


class PublisherCore(Core):
    role = Role.PUBLISHER

    def __init__(
        self, name: str, log: EventLog, chunk_bytes: int, transfer_timeout_s: float, shm: ShmPublisher | None = None
    ) -> None:
        super().__init__(name, log)
        self.chunk_bytes, self.transfer_timeout_s = chunk_bytes, transfer_timeout_s
        self.current: Snapshot | None = None
        self.uploads: dict[bytes, Assembler | WeightsBegin] = {}  # by uploader identity (a begin: via shm)
        self.shm = shm

    def start(self, now: float) -> None:
        self.register()

    def on_welcome(self, now: float, inbound: Inbound[Welcome]) -> None:
        super().on_welcome(now, inbound)
        self._open_shm(inbound.msg.run_id)
        if self.current is not None:  # re-registered after a coordinator restart: re-announce
            self.emit(Dest.peer("coordinator"), WeightsAvailable(version=self.current.version))

    # --- same-host shared memory ---------------------------------------------------------------

    def _open_shm(self, run_id: str) -> None:
        if self.shm is None or run_id == self.shm.run_id:
            return
        try:
            self.shm.open_run(run_id)
        except OSError as exc:
            self.log("shm_unavailable", reason=f"cannot write the host file: {exc}")
            self.shm = None
            return
        if self.current is not None:
            self.current = self._to_shm(self.current)

    def _to_shm(self, snap: Snapshot) -> Snapshot:
        """`snap`, also written to shared memory and served from that mapping (one copy in RAM)."""
        if self.shm is None or not self.shm.run_id:
            return snap
        try:
            mapped = self.shm.publish(snap.version, snap.data)
        except ShmUnavailable as exc:
            self.count("shm_unavailable")
            self.log("shm_unavailable", reason=str(exc), new_version=snap.version)
            return snap
        self.log("shm_published", new_version=snap.version, path=self.shm.path(snap.version), bytes=snap.nbytes)
        return Snapshot(snap.version, snap.metas, mapped)

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()

    # --- upload ------------------------------------------------------------------------------

    @handles(WeightsBegin)
    def on_weights_begin(self, now: float, inbound: Inbound[WeightsBegin]) -> None:
        msg = inbound.msg
        if self.current is not None and msg.version <= self.current.version:
            detail = f"version {msg.version} is not newer than stored {self.current.version}"
            self._fail(inbound, msg.id, detail)
            return
        if msg.shm_path:  # the trainer wrote the file: adopted at WeightsEnd
            try:
                if self.shm is None:
                    raise ShmRefused("this publisher has no shared memory")
                self.shm.check_upload(msg)
            except ShmRefused as exc:
                self._fail(inbound, msg.id, f"shared memory: {exc}")
                return
            self.uploads[inbound.identity] = msg
            self.log("upload_begin", msg_id=msg.id, new_version=msg.version, bytes=msg.total_bytes, via="shm")
            return
        try:
            self.uploads[inbound.identity] = Assembler(msg, now)
        except TransferError as exc:
            self._fail(inbound, msg.id, str(exc))
            return
        self.log("upload_begin", msg_id=msg.id, new_version=msg.version, bytes=msg.total_bytes, chunks=msg.chunks)

    @handles(WeightChunk)
    def on_weight_chunk(self, now: float, inbound: Inbound[WeightChunk]) -> None:
        upload = self.uploads.get(inbound.identity)
        if not isinstance(upload, Assembler):
            self.count("orphan_chunk")
            return
        try:
            upload.chunk(inbound.msg, inbound.payloads)
        except TransferError as exc:
            del self.uploads[inbound.identity]
            self._fail(inbound, upload.begin.id, str(exc))

    @handles(WeightsEnd)
    def on_weights_end(self, now: float, inbound: Inbound[WeightsEnd]) -> None:
        upload = self.uploads.pop(inbound.identity, None)
        if upload is None:
            self._fail(inbound, inbound.msg.id, "weights_end without weights_begin")
            return
        if isinstance(upload, WeightsBegin):
            self._adopt(inbound, upload)
            return
        try:
            snap = upload.end(inbound.msg)
        except TransferError as exc:
            self._fail(inbound, upload.begin.id, str(exc))
            return
        self._store(inbound, upload.begin.id, self._to_shm(snap), now - upload.started)

    def _adopt(self, inbound: Inbound[WeightsEnd], begin: WeightsBegin) -> None:
        """A same-host upload: take over the trainer's file (validated) as the stored snapshot."""
        if inbound.msg.transfer != begin.id:
            self._fail(inbound, begin.id, f"end of transfer {inbound.msg.transfer!r}, expected {begin.id!r}")
            return
        if self.current is not None and begin.version <= self.current.version:
            self._fail(inbound, begin.id, f"version {begin.version} is not newer than stored {self.current.version}")
            return
        assert self.shm is not None  # checked at WeightsBegin; shm is never switched back on
        try:
            mapped = self.shm.adopt(begin.version, begin.total_bytes)
        except ShmRefused as exc:
            self.count("shm_refused")
            self._fail(inbound, begin.id, f"shared memory: {exc}")
            return
        path = self.shm.path(begin.version)
        self.log("shm_published", new_version=begin.version, path=path, bytes=begin.total_bytes, via="trainer")
        self._store(inbound, begin.id, Snapshot(begin.version, begin.tensors, mapped), 0.0)

    def _store(self, inbound: Inbound[WeightsEnd], begin_id: str, snap: Snapshot, upload_s: float) -> None:
        kill_point(self.name, "before_ack", snap.version - 1)  # the epoch that made it
        self.current = snap
        self.version = snap.version
        self.log("weights_stored", new_version=snap.version, bytes=snap.nbytes, upload_s=round(upload_s, 6))
        self.reply(inbound, WeightsStored(reply_to=begin_id, version=snap.version))
        self.emit(Dest.peer("coordinator"), WeightsAvailable(version=snap.version))

    def _fail(self, inbound: Inbound[Msg], reply_to: str, detail: str) -> None:
        self.count("transfer_failed")
        self.log("transfer_failed", detail=detail, msg_id=reply_to)
        self.reply(inbound, Error(reply_to=reply_to, code=ErrorCode.REJECTED, detail=detail))

    def tick(self, now: float) -> None:
        super().tick(now)
        for ident, upload in list(self.uploads.items()):
            if isinstance(upload, Assembler) and upload.expired(now, self.transfer_timeout_s):
                del self.uploads[ident]
                self.count("transfer_failed")
                self.log("transfer_failed", detail="upload timed out", msg_id=upload.begin.id)

    # --- fetch -------------------------------------------------------------------------------

    @handles(FetchWeights)
    def on_fetch_weights(self, now: float, inbound: Inbound[FetchWeights]) -> None:
        msg = inbound.msg
        if self.current is None:
            self.refuse(inbound, "no weights published yet")
            return
        snap = self.current
        kill_point(self.name, "after_ack", snap.version - 1)  # a worker fetches it: the ack is long out
        path = self._shm_path_for(msg)
        if path:
            self._serve_shared(inbound, snap, path)
        else:
            for part, payloads in transfer_messages(snap, self.chunk_bytes, reply_to=msg.id):
                self.reply(inbound, part, payloads)  # chunks are not logged one by one (QUIET_TYPES)
        served = {"served_version": snap.version, "bytes": snap.nbytes, "via": "shm" if path else "chunks"}
        self.log("weights_served", to=msg.sender, msg_id=msg.id, **served)

    def _serve_shared(self, inbound: Inbound[FetchWeights], snap: Snapshot, path: str) -> None:
        metas, n = snap.metas, snap.nbytes
        begin = WeightsBegin(version=snap.version, tensors=metas, total_bytes=n, chunks=0, reply_to=inbound.msg.id)
        begin.shm_path = path
        self.reply(inbound, begin)
        self.reply(inbound, WeightsEnd(version=snap.version, transfer=begin.id))

    def _shm_path_for(self, msg: FetchWeights) -> str:
        """The current version's shared-memory file, for a fetcher that proved it shares this host."""
        if self.shm is None or self.current is None or not msg.host_proof:
            return ""
        if not self.shm.proves(msg.host_proof):
            self.count("shm_proof_refused")
            return ""
        return self.shm.path(self.current.version)

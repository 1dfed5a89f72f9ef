"""Weights, a part of the worker: fetching (floor and drift pulls, weights/pulls.py), same-host snapshots
(weights/shm.py), installing a snapshot in the idle engine, and what the coordinator announces of the
published versions. The state it reads and writes is the worker's (`target`, `newest`, `step_kls`,
`pull_due`, `pull_reason`, `fetch`, `shm`...); it sends only through the worker's methods."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prl_actors.engines.base import IncompatibleWeights
from prl_actors.protocol.messages import FetchWeights
from prl_actors.transport.port import Dest
from prl_actors.weights.pulls import announced, drift_estimate, should_pull
from prl_actors.weights.shm import ShmRefused
from prl_actors.weights.tensors import unpack
from prl_actors.weights.transfer import Snapshot

if TYPE_CHECKING:
    from prl_actors.protocol.messages import WeightsBegin
    from prl_actors.worker.core import WorkerCore


class Weights:
    def __init__(self, core: WorkerCore) -> None:
        self.core = core

    def fetch(self, reason: str) -> None:
        c = self.core
        c.log("span_begin", span="weight_sync", target=c.target)
        c.pull_reason = reason
        c.fetch.request(c.now)
        proof = c.shm.proof(c.run_id) if c.shm is not None else ""
        c.emit(Dest.peer("publisher"), FetchWeights(version=c.engine.version, host_proof=proof))

    def load_shared(self, now: float, begin: WeightsBegin) -> None:
        """A same-host snapshot: validated and mapped, never trusted (a refusal means chunks from now on)."""
        c = self.core
        try:
            if c.shm is None:
                raise ShmRefused("a shared-memory reply to a fetch that offered no host proof")
            data = c.shm.open(c.run_id, begin)
        except ShmRefused as exc:
            c.count("shm_refused")
            c.shm = None  # at once: the next fetch asks for chunks
            why = c.fetch.fail(now, f"shared memory: {exc}; fetching chunks instead", retry_s=0.01)
            c.log("weight_sync_failed", reason=why)  # not counted as one: the fallback, not a failure
            return
        self.install(Snapshot(begin.version, begin.tensors, data), now, via="shm")

    def install(self, snap: Snapshot, started: float, via: str) -> None:
        c = self.core
        c.fetch.clear()
        if snap.version <= c.engine.version and not c.stale_weights:  # a late answer to an earlier fetch
            c.log("weights_ignored", new_version=snap.version, held=c.engine.version)
            c.pull_due = False
            c._next()
            return
        held = c.engine.version
        c._drop_running("weights swap")
        try:
            c.engine.load_weights(snap.version, unpack(snap.metas, snap.data, as_torch=c.as_torch))
        except IncompatibleWeights as exc:  # another model than the trainer's: no fetch can fix that
            c.fail(f"cannot load the published weights: {exc}")
            return
        c.version, c.stale_weights = snap.version, False
        if c.threads is not None:
            c.threads.take_all()  # a new epoch: the trainer has nothing to train until our first group
        seconds = round(time.monotonic() - started, 6)
        c.log("span_end", span="weight_sync", new_version=snap.version, bytes=snap.nbytes, seconds=seconds, via=via)
        self.pulled(held, snap.version)
        c._next()

    def pulled(self, held: int, loaded: int) -> None:
        """Count a load: why it was paid, and how many published versions were never loaded here."""
        c = self.core
        skipped = max(0, loaded - held - 1) if held >= 0 else 0
        c.count("weight_loads")
        c.count("versions_skipped", skipped)
        c.log(
            "weights_pulled",
            held=held,
            new_version=loaded,
            newest=c.newest,
            reason=c.pull_reason,
            skipped=skipped,
        )
        c.pull_due, c.pull_reason = False, ""
        c.step_kls = {i: kl for i, kl in c.step_kls.items() if i >= loaded}
        self.check_drift()

    def learn_news(self, newest: int, step_kls: list[float]) -> None:
        """Bounded mode: note the newest published version and the steps' KLs; decide a drift pull."""
        c = self.core
        if newest < 0:
            return
        c.newest = max(c.newest, newest)
        c.step_kls.update(announced(newest, step_kls))
        self.check_drift()

    def check_drift(self) -> None:
        """A drift pull is due when the weights held are within the floor (else the floor rule fetches)
        and their estimated KL from the newest published ones crosses worker.sync_kl_threshold."""
        c = self.core
        held = c.engine.version
        if c.pull_due or c.sync_kl_threshold is None or held < max(c.target, 0):
            return
        estimate = drift_estimate(held, c.newest, c.step_kls)
        if should_pull(c.sync_kl_threshold, estimate, held, c.newest):
            c.pull_due = True
            kl = None if estimate is None else round(estimate, 9)
            c.log("pull_due", held=held, newest=c.newest, drift_kl=kl, threshold=c.sync_kl_threshold)

    def learn_target(self, version: int) -> None:
        c = self.core
        c.target = max(c.target, version)
        c._ask_again()

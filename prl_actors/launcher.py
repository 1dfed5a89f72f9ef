"""`prl-actors up`: every actor as a local OS process, supervised.

The launcher starts coordinator, publisher, buffer, trainer and N workers (`prl-actors actor ROLE`),
polls the coordinator's Status to show progress and to follow `prl-actors scale` (it starts or stops
worker processes to match the wanted count; a worker that crashes or is killed is replaced, one that
exits cleanly is not), and stops everything on Ctrl-C (RequestStop, then SIGTERM, then SIGKILL).
A core actor that dies ends the run with an error. It speaks to the coordinator with the run's
operator key (RUN_DIR/keys, created by `up`); the actors it starts find their keys there too.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

from prl_actors.client import RequestFailed, request
from prl_actors.config import Config
from prl_actors.logs import console
from prl_actors.protocol.messages import Phase, RequestStop, Status, StatusRequest
from prl_actors.rundir import RunDir
from prl_actors.topology import ensure_key
from prl_actors.transport.auth import KeyStore

CORE = ("coordinator", "publisher", "buffer", "trainer")


class RunFailed(Exception):
    pass


class Launcher:
    def __init__(self, cfg: Config, config_path: Path, progress: bool = True) -> None:
        self.cfg, self.config_path, self.progress = cfg, config_path, progress
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.next_worker = 0
        self.desired = cfg.run.workers
        self.t0 = time.monotonic()
        self.last_stall = ""
        self.keys = KeyStore(cfg.keys_path()) if cfg.authenticated() else None  # `up` created them

    def spawn(self, name: str) -> None:
        role = name.split("-", 1)[0]
        cmd = [sys.executable, "-m", "cli.main", "actor", role, "--config", str(self.config_path), "--name", name]
        self.procs[name] = subprocess.Popen(cmd)

    def add_worker(self) -> None:
        ensure_key(f"worker-{self.next_worker}", self.cfg)  # its own key: no other worker can speak as it
        self.spawn(f"worker-{self.next_worker}")
        self.next_worker += 1

    def workers(self) -> list[str]:
        return sorted(n for n in self.procs if n.startswith("worker-"))

    def run(self) -> int:
        for name in CORE:
            self.spawn(name)
        for _ in range(self.desired):
            self.add_worker()
        try:
            self._supervise()
        except KeyboardInterrupt:
            console("\ninterrupted: stopping every actor ...")
            self._stop_all("interrupted by user")
            return 130
        finally:
            self._reap()
        return 0

    def _supervise(self) -> None:
        last_poll = 0.0
        while True:
            coord = self.procs["coordinator"].poll()
            if coord is not None:
                if coord != 0:
                    raise RunFailed(f"the coordinator exited with code {coord}; see {self.cfg.run.run_dir}/logs")
                return
            for name in CORE[1:]:
                rc = self.procs[name].poll()
                if rc:  # 0 is a clean exit on the coordinator's Shutdown, which may beat its own exit
                    self._stop_all(f"{name} died")
                    raise RunFailed(f"{name} exited with code {rc}; see {self.cfg.run.run_dir}/logs/{name}.jsonl")
            self._replace_dead_workers()
            if time.monotonic() - last_poll > 0.5:
                last_poll = time.monotonic()
                self._poll_status()
            time.sleep(0.05)

    def _replace_dead_workers(self) -> None:
        """Replace a worker that crashed or was killed. Exit code 0 means it was shut down or left on
        purpose (at the end of a run workers exit before the coordinator does): that one stays gone."""
        for name in self.workers():
            rc = self.procs[name].poll()
            if rc is None:
                continue
            del self.procs[name]
            if rc == 0:
                continue
            how = f"signal {-rc}" if rc < 0 else f"code {rc}"
            console(f"{name} exited ({how})")
            self.add_worker()
            console(f"started {self.workers()[-1]} (wanted {self.desired} workers)")

    def _poll_status(self) -> None:
        try:
            st = request(self.cfg.address("coordinator"), StatusRequest(), timeout_s=1.0, keys=self.keys)
        except RequestFailed:
            return
        if not isinstance(st, Status):
            return
        if st.desired_workers >= 0 and st.desired_workers != self.desired:  # `prl-actors scale` was asked
            self._scale_to(st.desired_workers)
        if st.waiting_for and st.waiting_for != self.last_stall:
            console(f"stalled: {st.waiting_for}")
        self.last_stall = st.waiting_for
        if self.progress and st.state in (Phase.RUNNING, Phase.TRAINING):
            bar = progress_bar(st.groups_done, st.groups_per_epoch)
            sys.stderr.write(
                f"\r  epoch {st.epoch + 1}/{st.epochs_total} {bar} {st.groups_done}/{st.groups_per_epoch} groups"
                f"  workers {sum(m.role == 'worker' for m in st.members)}  {time.monotonic() - self.t0:6.1f}s\x1b[K\r"
            )
            sys.stderr.flush()

    def _scale_to(self, n: int) -> None:
        console(f"scaling workers {self.desired} -> {n}")
        self.desired = n
        for name in self.workers()[n:]:
            self.procs[name].send_signal(signal.SIGTERM)  # graceful: Leave, work is requeued
            self.procs.pop(name)
        while len(self.workers()) < n:
            self.add_worker()

    def _stop_all(self, reason: str) -> None:
        with contextlib.suppress(RequestFailed):
            request(self.cfg.address("coordinator"), RequestStop(reason=reason), timeout_s=2.0, keys=self.keys)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.05)

    def _reap(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
            alive = [p for p in self.procs.values() if p.poll() is None]
            for p in alive:
                p.send_signal(sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(p.poll() is None for p in alive):
                time.sleep(0.05)


def progress_bar(done: int, total: int, width: int = 20) -> str:
    filled = int(width * done / max(1, total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def summary(run_dir: Path, wall_s: float) -> str:
    """The final lines `up` prints, from RUN_DIR/metrics.jsonl."""
    rows = RunDir(run_dir).metrics_rows()
    if not rows:
        return f"no epoch finished (wall {wall_s:.1f}s); logs in {run_dir}/logs"
    first, last = rows[0], rows[-1]
    sps = sum(r.get("samples", 0) for r in rows) / max(1e-9, sum(r.get("wall_s", 0) for r in rows))
    return (
        f"done: {len(rows)} epochs in {wall_s:.1f}s  reward {first.get('reward_mean', 0):.3f} -> "
        f"{last.get('reward_mean', 0):.3f}  samples/s {sps:.1f}\n"
        f"run dir: {run_dir} (metrics.jsonl, logs/, checkpoints/)"
    )

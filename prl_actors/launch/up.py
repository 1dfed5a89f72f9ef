"""`prl-actors up`: every actor as a local OS process, supervised.

The whole topology, in start order (wiring.members, started by `Launcher._start`):

    trainer, worker-0..N-1   start first and load their model, then wait for the start gate
    coordinator              binds first; `up` waits until it is bound (its `actor_ready` event)
    publisher, buffer        bind, then register with this run's coordinator; waited for likewise
    (start gate opens)       trainer and workers connect, only to ports this run holds

The gate (RUN_DIR/.start-gate, named to them by PRL_START_GATE) is a file `up` creates once the
servers are bound: the slow part of a start (torch imports, model loads) runs beside the servers'
start instead of after it, and nothing connects before this run holds its ports. Until the first
epoch opens, `up` says every few seconds which actors it is still waiting for.

So a second `up` on ports already in use stops at its coordinator ("address in use") before any of
its actors has said a word to the first run; `check_ports` says so plainly before anything starts.
Without `transport.base_port`, `pick_ports` takes the first free set from 27500 up.

Supervision:
- each actor runs in its own process group (with any subprocess of its engine) and knows `up`'s pid
  (PRL_SUPERVISOR_PID): if `up` is killed outright, the actors stop by themselves;
- SIGINT, SIGTERM or SIGHUP to `up`: RequestStop (every actor gets Shutdown), after run.stop_grace_s
  SIGTERM to every actor's group, then SIGKILL; `up` exits 128 + the signal. A second signal skips
  the grace periods;
- a core actor that crashes once the run is up (a signal, or an exit without a reason of its own)
  makes `up` restart the whole core from the last checkpoint, the workers staying up and rejoining
  (`_heal`; at most run.max_restarts times, docs/ARCHITECTURE.md "Self-healing"); one that fails with
  its own one-line error (its log's `actor_crashed`), at start or past the budget, ends the run;
- a worker that crashes is replaced. One that crashes before it registered (an engine that fails
  to load) is restarted with back-off (0.5 s, 1 s, 2 s ...) at most run.worker_restarts times in a
  row, then the run fails with its error. One that exits 0 left on purpose and stays gone;
- `prl-actors scale` is followed through the coordinator's Status.

Keys (docs/SECURITY.md): `up` speaks to the coordinator with the run's operator key (RUN_DIR/keys,
created by `up` before the launcher starts); every worker it starts gets its own key there first
(`worker-N`; a replacement is a new name with a new key); `--resume` keeps RUN_DIR/keys.

Exit codes (`run` returns them): 0 every epoch done; 3 the run was stopped before its last epoch
(`prl-actors stop`; `--resume` continues it); 128+N `up` got signal N. A failure raises RunFailed
(`up` exits 1).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from prl_actors.config import DEFAULT_BASE_PORT, Config
from prl_actors.launch.client import RequestFailed, request
from prl_actors.launch.supervisor import (
    FAILED_STOP_S,
    STANDBY_ENV,
    START_GATE_ENV,
    Healing,
    Interrupted,
    Supervisor,
    actor_argv,
    restart_delay,
)
from prl_actors.launch.supervisor import RESTART_BACKOFF_S as RESTART_BACKOFF_S  # re-exported for its users
from prl_actors.launch.supervisor import RunFailed as RunFailed
from prl_actors.launch.wiring import Member, core_names, members
from prl_actors.launch.zygote import Zygote, ZygoteError
from prl_actors.protocol.messages import Phase, RequestStop, Role, Status, StatusRequest, role_prefix
from prl_actors.records.logs import console
from prl_actors.records.rundir import FINAL, CheckpointError, RunDir
from prl_actors.runtime.processes import KILL_WAIT_S, Proc, spawn, start_process, stop_children, wait_exit
from prl_actors.runtime.processes import Child as Child
from prl_actors.runtime.threads import LOCAL_WORKERS_ENV
from prl_actors.transport.auth import KeyStore, ensure_key

EXIT_STOPPED = 3
PORT_STEP, PORT_TRIES = 10, 200  # pick_ports tries 27500, 27510, ...
START_GATE = ".start-gate"
STANDBY_GATE = ".standby-gate"  # created when the spare core is needed (run.standby_core)
WAITING_NOTE_S = 5.0  # during start-up, `up` says what it waits for this often
LONG_EPOCH_NOTE_S = 10.0  # without a terminal, a long epoch's progress is a line this often


class ChildLogs:
    """What an actor process logged (since its start: not an earlier process of a resumed run), read
    back from the run directory: why it exited, what it was doing."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir

    def find(self, child: Child, event: str) -> dict[str, Any] | None:
        """The last `event` that this process (not an earlier one of a resumed run) logged."""
        try:
            with open(self.run_dir.log_path(child.name), "rb") as f:
                f.seek(child.log_from)
                data = f.read()
        except FileNotFoundError:
            return None
        needle = f'"event":"{event}"'.encode()
        for line in reversed(data.splitlines()):
            if needle in line:
                with contextlib.suppress(ValueError):
                    found: dict[str, Any] = json.loads(line)
                    return found
        return None

    def cause(self, child: Child, rc: int) -> str:
        how = f"signal {-rc}" if rc < 0 else f"code {rc}"
        crashed = self.find(child, "actor_crashed")
        return f"{how}: {crashed['error']}" if crashed else how

    def failure(self, child: Child) -> str:
        rc = child.exit_code
        return f"{child.name} exited ({self.cause(child, rc)}); see {self.run_dir.log_path(child.name)}"

    def doing(self, child: Child) -> str:
        """What a starting actor last did, from its log."""
        if self.find(child, "actor_ready") is not None:
            return "registering"
        if self.find(child, "actor_start") is not None:
            return "loading its model" if role_prefix(child.name) in ("trainer", "worker") else "starting"
        return "importing"


class StandbyCore:
    """run.standby_core: spares of the core actors, started with run.resume; each imports, then
    waits (process.await_standby) for the file `gate`, logging nothing till then."""

    def __init__(self, gate: Path) -> None:
        self.gate = gate
        self.waiting: dict[str, Child] = {}  # a waiting core, by name (Launcher._spawn_spares)

    def take(self, plan: list[Member], sup: Supervisor, run_dir: RunDir) -> bool:
        """Make the waiting spares `plan`'s members (their lines start at the logs' ends now) and let
        them go; False (none taken, the spares are stopped) when there are none or one has died."""
        spares, self.waiting = self.waiting, {}
        if not spares or not all(c.alive() for c in spares.values()):
            stop_children(list(spares.values()), 0.0)
            return False
        for m in plan:
            child = spares[m.name]
            log = run_dir.log_path(m.name)
            child.log_from = log.stat().st_size if log.exists() else 0
            sup.start(child)
        self.gate.touch()
        return True

    def drop(self) -> None:
        spares, self.waiting = list(self.waiting.values()), {}
        for c in spares:
            c.signal(signal.SIGTERM)
        stop_children(spares, KILL_WAIT_S)


class Launcher:
    """The GRPO run as a plug-in of the supervisor: which actors start in which order, what an
    actor's exit means (a core actor's crash restarts the core or ends the run, a worker's is
    replaced), scaling, start-up notes."""

    def __init__(self, cfg: Config, config_path: Path, progress: bool = True, zygote: Zygote | None = None) -> None:
        self.cfg, self.config_path, self.progress = cfg, config_path, progress
        self.run_dir = RunDir(cfg.run.run_dir)
        self.plan: list[Member] = members(cfg)  # what runs (the composition root)
        self.core = core_names(self.plan)  # restarted together when one crashes (run.max_restarts)
        self.heal = Healing()
        self.standby = StandbyCore(self.run_dir.root / STANDBY_GATE)  # run.standby_core (`_spawn_spares`)
        self.sup = Supervisor(cfg.run.stop_grace_s)
        self.children = self.sup.children  # name -> running actor process
        self.pending: list[tuple[float, int]] = []  # (when, restarts) of workers to start
        self.next_worker = 0
        self.desired = cfg.run.workers
        self.t0 = time.monotonic()
        self.last_stall = ""
        self.notices_seen = 0
        self.logs = ChildLogs(self.run_dir)  # what each actor logged: why it exited, what it does
        self.keys = KeyStore(cfg.keys_path()) if cfg.authenticated() else None  # `up` created them
        self.gate = self.run_dir.root / START_GATE
        self.started_up = False  # every actor started here has joined, or the first epoch opened
        self.last_note = time.monotonic()
        self.long_epoch = LongEpochNotes()  # without a terminal: progress lines inside a long epoch
        self.zygote = zygote  # run.fork_server: forks the actors, imported once (`up` starts and closes it)

    # --- the run -----------------------------------------------------------------------------

    def run(self) -> int:
        """Start the topology and supervise it until the coordinator exits; the exit code. Once every
        actor has exited, a completed run's logs are gzipped when large (RunDir.compress_logs; a
        failed or stopped run's stay as they are, to be read)."""
        code = self._run()
        if code == 0:
            self.run_dir.compress_logs()
        return code

    def _run(self) -> int:
        follower = self._trackers()
        with self.sup.signals.installed():
            try:
                self._start()
                self._spawn_spares()
                self._supervise()
                return self._outcome()
            except Interrupted as sig:
                console(f"\n{sig}: stopping every actor ...")
                self._stop_all(f"{sig} to prl-actors up")
                if self.run_dir.has_checkpoint():  # else there is nothing to resume from
                    console(
                        f"stopped: {self._epochs_done()} of {self.cfg.run.epochs} epochs done. {self._resume_hint()}"
                    )
                return 128 + sig.signum
            except RunFailed as exc:
                self.sup.failed = True  # a core actor is gone: nobody waits on a grace period it cannot use
                self._stop_all(f"the run failed: {exc}")
                raise
            finally:
                self.standby.drop()
                self.sup.reap()
                if follower is not None:
                    follower.stop()

    def _trackers(self) -> Any:
        """run.report_to: one thread of this process follows metrics.jsonl (prl_actors/records/tracking.py)."""
        if not self.cfg.run.report_to:
            return None
        from prl_actors.records.tracking import MetricsFollower

        config = self.cfg.model_dump(mode="json")
        return MetricsFollower(self.run_dir.root, list(self.cfg.run.report_to), self.cfg.run.name, config).start()

    def _start(self) -> None:
        """The plan's members in start order (`_start_members`), then the gate opens."""
        self._start_members(self.plan)

    def _start_members(self, plan: list[Member], resume: bool = False) -> None:
        """`plan`'s members in start order: the gated ones first (trainer and workers load while the
        servers start, behind the gate); then the servers, each tier bound before the next starts;
        then the gate opens. `resume`: they start from the last intact checkpoint (a restart of
        the core, whose ports were this run's a moment ago: every server starts at once, their
        imports overlap; each tier is still bound before the gate opens); a crash meanwhile stops
        the start there, and `_supervise` heals it (or fails the run)."""
        self.gate.unlink(missing_ok=True)
        spared = resume and self.standby.take(plan, self.sup, self.run_dir)  # the spares build, bind and connect now
        for m in plan if not spared else []:
            if m.gated and m.role == "worker":
                self._add_worker()  # its key first
            elif m.gated or resume:
                self._spawn(m.name, resume=resume)
        for tier in sorted({m.tier for m in plan if not m.gated}):
            names = [m.name for m in plan if m.tier == tier and not m.gated]
            for name in names if not resume else []:
                self._spawn(name)
            if not all(self._await_ready(self.children[name]) for name in names):
                return
            console(f"up: {', '.join(names)} ready ({time.monotonic() - self.t0:.1f}s)")
        self.gate.touch()

    def _supervise(self) -> None:
        """Until the coordinator exits (the run's outcome). A core actor that crashes meanwhile is
        healed (`_heal`: the core restarts from the last checkpoint) or fails the run."""
        last_poll = 0.0
        while True:
            self.sup.signals.check()
            coordinator = self.children["coordinator"]
            if coordinator.proc.poll() == 0 and not coordinator.stopped:
                return  # it ended the run: its outcome (`_outcome`); nothing is healed after that
            crashed = self._crashed_core()
            if crashed is not None:
                self._heal(crashed)
                continue
            self._check_workers()
            self._start_due_workers()
            if time.monotonic() - last_poll > 0.5:
                last_poll = time.monotonic()
                self._poll_status()
            time.sleep(0.05)

    # --- self-healing (run.max_restarts) -----------------------------------------------------

    def _crashed_core(self) -> Child | None:
        """A core actor (wiring.core_names) that exited non-zero; 0 is a clean exit on Shutdown,
        which may beat the coordinator's own."""
        found = (self.children[n] for n in self.core if not self.children[n].stopped and self.children[n].proc.poll())
        return next(found, None)

    def _heal(self, child: Child) -> None:
        """`child`, a core actor, crashed: restart the whole core (coordinator, publisher, buffer,
        trainer) from the last intact checkpoint, the workers staying up (they rejoin the new core
        at the same addresses with the same keys, and drop what the old core gave them), or fail the
        run with one line when it may not (`_not_healable`).

        Why the whole core: the epoch in progress lives in four processes at once (the coordinator's
        done set, the buffer's accepted groups, the trainer's accumulated gradients, the publisher's
        snapshot); none of them can be rebuilt alone, all of them from the checkpoint. Invariants:
        the epoch in progress is redone from its start (at most trainer.checkpoint_every epochs are
        lost, one by default), no group of the dead core is trained (their tickets die with it), and
        `replay --check` reads the restart as a resume (a new coordinator segment)."""
        why = self._not_healable(child)
        if why:
            raise RunFailed(why)
        cause = self.logs.cause(child, child.exit_code)
        delay = self.heal.crashed(self.logs.find(self.children["coordinator"], "epoch_done") is not None)
        self._stop_core()
        version = restart_version(self.run_dir)
        console(
            f"{child.name} exited ({cause}); restarting from v{version} "
            f"(restart {self.heal.used} of {self.cfg.run.max_restarts})" + (f" in {delay:g}s" if delay else "")
        )
        self._pause(delay)
        self.notices_seen = 0  # the new coordinator counts its notices from 0
        self._start_members([m for m in self.plan if m.name in self.core], resume=True)
        self._spawn_spares()  # for the next crash: they import while this core runs

    def _not_healable(self, child: Child) -> str:
        """Why a crashed core actor ends the run ('' when the core is restarted): run.max_restarts
        is 0 or used up; the actor failed on purpose, with a reason of its own (a restart would
        fail the same way: a damaged checkpoint, trainer.on_nonfinite fail, a refused key); the run
        never opened its first epoch (a start-up failure); or there is no checkpoint to go back to."""
        failure, limit = self.logs.failure(child), self.cfg.run.max_restarts
        if limit == 0:
            return failure
        if child.exit_code > 0 and self.logs.find(child, "actor_crashed") is not None:
            return failure
        if not self.heal.used and self.logs.find(self.children["coordinator"], "epoch_open") is None:
            return failure
        if self.cfg.trainer.checkpoint_every == 0:
            return f"{failure}; not restarted: no checkpoints to restart from (trainer.checkpoint_every 0)"
        if self.heal.used >= limit:
            return f"{failure}; not restarted: the core was restarted {self.heal.used} times (run.max_restarts)"
        return ""

    def _spawn_spares(self) -> None:
        """run.standby_core: a spare of each core actor, started now with run.resume; each imports,
        then waits (process.await_standby) for the file `standby.gate`, logging nothing till then."""
        if not self.cfg.run.standby_core or self.standby.waiting:
            return
        self.standby.gate.unlink(missing_ok=True)
        for name in self.core:
            self._spawn(name, resume=True, spare=True)

    def _stop_core(self) -> None:
        """Every core actor still running: SIGTERM (a clean stop that tells no worker anything: only
        a RequestStop makes the coordinator send Shutdown), then SIGKILL; bounded."""
        core = [self.children[n] for n in self.core]
        for c in core:
            c.stopped, c.ready = True, False
            if c.alive():
                c.signal(signal.SIGTERM)
        stop_children(core, KILL_WAIT_S)

    def _pause(self, seconds: float) -> None:
        """The restart back-off: stop signals and worker crashes are still heard meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sup.signals.check()
            self._check_workers()
            time.sleep(0.05)

    def _outcome(self) -> int:
        """0 when the coordinator completed every epoch; else why it ended early (EXIT_STOPPED)."""
        done = self.logs.find(self.children["coordinator"], "run_done")
        if done is None:
            raise RunFailed(
                f"the coordinator exited without ending the run; see {self.run_dir.log_path('coordinator')}"
            )
        if done.get("reason") == "completed":
            return 0
        console(
            f"the run ended before its last epoch: {done.get('reason')}; {self._epochs_done()} of "
            f"{self.cfg.run.epochs} epochs done. {self._resume_hint()}"
        )
        return EXIT_STOPPED

    def _epochs_done(self) -> int:
        return max((int(r.get("epoch", -1)) for r in self.run_dir.metrics_rows()), default=-1) + 1

    def _resume_hint(self) -> str:
        """What continues this run (a `stop`, or Ctrl-C / a stop signal to `up`)."""
        return f"Continue it with: prl-actors up --resume --run-dir {self.run_dir.root}"

    # --- processes ---------------------------------------------------------------------------

    def _spawn(self, name: str, restarts: int = 0, resume: bool = False, spare: bool = False) -> None:
        """Start actor `name`; `resume`: from the last intact checkpoint, for `desired` workers (a
        restarted core: the coordinator must not scale back to run.workers); `spare`: as a spare
        (`_spawn_spares`), kept apart from the running members."""
        role = role_prefix(name)
        cmd = actor_argv(name, self.config_path)
        if resume:
            cmd += ["--set", "run.resume=true", "--set", f"run.workers={self.desired}"]
        log = self.run_dir.log_path(name)
        offset = log.stat().st_size if log.exists() else 0
        env = {LOCAL_WORKERS_ENV: str(self.desired)}  # threads: auto
        if role in ("trainer", "worker"):
            env[START_GATE_ENV] = str(self.gate)
        fork = self._fork if self.zygote is not None else None
        if spare:
            self.standby.waiting[name] = spawn(name, cmd, {**env, STANDBY_ENV: str(self.standby.gate)}, fork=fork)
            return
        self.sup.start(spawn(name, cmd, env, log_from=offset, restarts=restarts, fork=fork))

    def _fork(self, argv: list[str], variables: dict[str, str]) -> Proc:
        """An actor forked by the fork server; if the server fails, by a new process (and every later
        one too), with one console line."""
        if self.zygote is not None:
            try:
                return self.zygote.spawn(argv, variables)
            except ZygoteError as exc:
                console(f"up: the fork server failed ({exc}); starting actors as new processes")
                self.zygote = None  # whoever started it closes it
        return start_process(argv, variables)

    def _add_worker(self, restarts: int = 0) -> str:
        name = f"worker-{self.next_worker}"
        self.next_worker += 1
        ensure_key(name, self.cfg.keys_path(), self.cfg.authenticated())  # its own key: no other worker can speak as it
        self._spawn(name, restarts)
        return name

    def _workers(self) -> list[str]:
        return sorted(n for n in self.children if Role.of_name(n) is Role.WORKER)

    def _await_ready(self, child: Child) -> bool:
        """Until `child` has bound its port: True. Its exit meanwhile, or the trainer's crash (it loads
        meanwhile: a damaged checkpoint ends the run now), fails the run at its start (e.g. the
        address is in use); in a restart a crash is `_supervise`'s to heal: False."""
        deadline = time.monotonic() + self.cfg.transport.join_timeout_s
        while self.logs.find(child, "actor_ready") is None:
            self.sup.signals.check()
            trainer = self.children["trainer"]
            crashed = child if child.proc.poll() is not None else trainer if trainer.proc.poll() else None
            if crashed is not None and self.heal.used:
                return False
            if crashed is not None:
                raise RunFailed(self.logs.failure(crashed))
            self._check_workers()
            if time.monotonic() > deadline:
                raise RunFailed(f"{child.name} did not bind {self.cfg.address(child.name)} in time")
            time.sleep(0.05)
        child.ready = True
        return True

    def _check_workers(self) -> None:
        """Replace a worker that crashed or was killed; exit code 0 means it was shut down or left on
        purpose (at the end of a run workers exit before the coordinator does): that one stays gone."""
        for name in self._workers():
            child = self.children[name]
            rc = child.proc.poll()
            if rc is None:
                continue
            del self.children[name]
            if rc != 0:
                self._worker_crashed(child, rc)

    def _worker_crashed(self, child: Child, rc: int) -> None:
        """Queue its replacement: at once, or after a back-off when it died before registering."""
        at_start = rc > 0 and self.logs.find(child, "registered") is None
        restarts = child.restarts + 1 if at_start else 0
        cause = self.logs.cause(child, rc)
        if self.logs.find(child, "reward_failed") is not None:  # task.on_reward_error: fail ends the run
            raise RunFailed(f"{child.name} exited ({cause})")
        console(f"{child.name} exited ({cause})")
        if restarts > self.cfg.run.worker_restarts:
            raise RunFailed(
                f"{child.name} failed before registering, {restarts} times in a row "
                f"(run.worker_restarts = {self.cfg.run.worker_restarts}): {cause}"
            )
        delay = restart_delay(restarts)
        if delay:
            console(f"restarting it in {delay:g}s (start-up failure {restarts} of {self.cfg.run.worker_restarts})")
        self.pending.append((time.monotonic() + delay, restarts))

    def _start_due_workers(self) -> None:
        now = time.monotonic()
        for item in [p for p in self.pending if p[0] <= now]:
            self.pending.remove(item)
            name = self._add_worker(item[1])
            console(f"started {name} (wanted {self.desired} workers)")

    # --- what an actor's log says ------------------------------------------------------------

    # --- status and scaling ------------------------------------------------------------------

    def _poll_status(self) -> None:
        try:
            st = request(self.cfg.address("coordinator"), StatusRequest(), timeout_s=1.0, keys=self.keys)
        except RequestFailed:
            return
        if not isinstance(st, Status):
            return
        if st.desired_workers >= 0 and st.desired_workers != self.desired:  # `prl-actors scale` was asked
            self._scale_to(st.desired_workers)
        fresh = min(st.notices_total - self.notices_seen, len(st.notices))
        for line in st.notices[len(st.notices) - fresh :] if fresh > 0 else []:
            console(line)  # groups given up, workers expelled (the coordinator's notices)
        self.notices_seen = max(self.notices_seen, st.notices_total)
        self._note_start_up(st)  # until every actor joined, `up` says whom it waits for instead
        self._note_back(st)
        if self.started_up:
            if st.waiting_for and st.waiting_for != self.last_stall:
                console(f"stalled: {st.waiting_for}")
            self.last_stall = st.waiting_for
        if st.state not in (Phase.RUNNING, Phase.TRAINING):
            return
        workers = sum(m.role == "worker" for m in st.members)
        if not self.progress:  # no terminal: a line now and then inside a long epoch
            args = (st.epoch, st.epochs_total, st.groups_done, st.groups_per_epoch, workers)
            note = self.long_epoch.line(time.monotonic(), *args)
            if note:
                console(note)
            return
        bar = progress_bar(st.groups_done, st.groups_per_epoch)
        sys.stderr.write(
            f"\r  epoch {st.epoch + 1}/{st.epochs_total} {bar} {st.groups_done}/{st.groups_per_epoch} groups"
            f"  workers {workers}  {time.monotonic() - self.t0:6.1f}s\x1b[K\r"
        )
        sys.stderr.flush()

    def _note_back(self, st: Status) -> None:
        """After a restart: one line once the new core runs an epoch with every local worker back."""
        joined = {m.name for m in st.members}
        if not self.heal.since or st.state not in (Phase.RUNNING, Phase.TRAINING):
            return
        if all(w in joined for w in self._workers()):
            took = self.heal.back()
            console(
                f"up: the core is back: epoch {st.epoch + 1} open, every worker rejoined ({took:.1f}s after the crash)"
            )

    def _note_start_up(self, st: Status) -> None:
        """Until every actor started here has joined (or the first epoch opened): every
        WAITING_NOTE_S, which actors `up` is still waiting for, and what each last did."""
        if self.started_up:
            return
        joined = {m.name for m in st.members}
        missing = [n for n in self.children if n != "coordinator" and n not in joined]
        if not missing or st.epoch > 0:
            self.started_up = True
            console(f"up: every actor joined ({time.monotonic() - self.t0:.1f}s)")
            return
        if time.monotonic() - self.last_note < WAITING_NOTE_S:
            return
        self.last_note = time.monotonic()
        doing = ", ".join(f"{n} ({self.logs.doing(self.children[n])})" for n in missing)
        console(f"up: waiting for {doing}; {time.monotonic() - self.t0:.0f}s since start")

    def _scale_to(self, n: int) -> None:
        console(f"scaling workers {self.desired} -> {n}")
        self.desired = n
        if self.standby.waiting:  # their coordinator would scale back to the old count
            self.standby.drop()
            self._spawn_spares()
        while self.pending and len(self._workers()) + len(self.pending) > n:
            self.pending.pop()
        for name in self._workers()[n:]:
            self.sup.retire(name)  # SIGTERM: graceful, it says Leave and its work is requeued
        while len(self._workers()) + len(self.pending) < n:
            self._add_worker()

    # --- stopping ----------------------------------------------------------------------------

    def _stop_all(self, reason: str) -> None:
        """RequestStop: the coordinator sends every member Shutdown; then wait for them a while.
        Before the gate opened, the trainer and workers hold nothing: they are stopped at once."""
        if not self.gate.exists():
            for child in self.sup.all():
                if role_prefix(child.name) in ("trainer", "worker") and child.alive():
                    child.signal(signal.SIGTERM)
        coordinator = self.children.get("coordinator")
        live = coordinator is not None and coordinator.ready and coordinator.proc.poll() is None  # else: not ours
        if live:
            with contextlib.suppress(RequestFailed):
                timeout = FAILED_STOP_S if self.sup.failed else 2.0
                request(self.cfg.address("coordinator"), RequestStop(reason=reason), timeout_s=timeout, keys=self.keys)
        wait_exit(self.sup.all(), self.sup.grace(carried=live))


def restart_version(run_dir: RunDir) -> int:
    """The version a restarted core resumes from: the newest intact checkpoint's (0: none yet, the
    initial weights). A damaged newest one is skipped, as the trainer itself skips it."""
    try:
        ckpt = run_dir.latest_checkpoint()
    except CheckpointError:
        return 0  # none intact: the trainer fails at its start with the cause
    return int(ckpt.name[1:]) if ckpt is not None else 0


# --- ports -------------------------------------------------------------------------------------


def bound_ports(cfg: Config) -> dict[str, tuple[str, int]]:
    """role -> (host, port) of every tcp port this run's actors bind."""
    out = {}
    for role in cfg.bound_roles():
        addr = cfg.bind_address(role)
        if addr.startswith("tcp://"):
            host, port = addr.removeprefix("tcp://").rsplit(":", 1)
            out[role] = ("0.0.0.0" if host == "*" else host, int(port))
    return out


def port_in_use(host: str, port: int) -> bool:
    """Something listens there. SO_REUSEADDR as ZeroMQ sets it: a port whose old connections wait
    in TIME_WAIT (a run that just ended) is free to bind."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def pick_ports(cfg: Config) -> None:
    """tcp without a base_port (and no explicit addresses): take the first free set from 27500 up."""
    if cfg.transport.kind != "tcp" or cfg.transport.base_port is not None or cfg.transport.addresses:
        return
    host = "0.0.0.0" if cfg.transport.bind_all else cfg.transport.host
    offsets = [
        o for r in cfg.bound_roles() if (o := Role(r).port_offset) is not None
    ]  # the learner of a classic-RL run binds base + 5
    for base in range(DEFAULT_BASE_PORT, DEFAULT_BASE_PORT + PORT_STEP * PORT_TRIES, PORT_STEP):
        if not any(port_in_use(host, base + i) for i in offsets):
            cfg.transport.base_port = base
            return
    raise RunFailed(f"no free ports for a run on {host} from {DEFAULT_BASE_PORT} up; set transport.base_port")


def check_ports(cfg: Config) -> None:
    """One run per port set: refuse, before any actor starts, ports some other process holds."""
    for role, (host, port) in bound_ports(cfg).items():
        if port_in_use(host, port):
            raise RunFailed(
                f"port {port} on {host} ({role}) is in use, by another run? Choose other ports "
                "(transport.base_port), or leave transport.base_port unset to pick free ones"
            )


class LongEpochNotes:
    """Progress inside a long epoch where no live bar is drawn (no terminal: a log, the Python API):
    one line every `every_s` seconds while the same epoch stays open, none for short epochs."""

    def __init__(self, every_s: float = LONG_EPOCH_NOTE_S) -> None:
        self.every_s, self.epoch, self.since, self.last = every_s, -1, 0.0, 0.0

    def line(self, now: float, epoch: int, epochs: int, done: int, groups: int, workers: int) -> str | None:
        if epoch != self.epoch:
            self.epoch, self.since, self.last = epoch, now, now
            return None
        if now - self.last < self.every_s:
            return None
        self.last = now
        return f"  epoch {epoch}/{epochs}: {done}/{groups} groups done, {workers} workers, {now - self.since:.0f}s in"


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
    epochs = len({r.get("epoch") for r in rows})  # one per epoch, even in a metrics file written before rollback
    return (
        f"done: {epochs} epochs in {wall_s:.1f}s  reward {first.get('reward_mean', 0):.3f} -> "
        f"{last.get('reward_mean', 0):.3f}  samples/s {sps:.1f}\n"
        f"{eval_line(run_dir)}run dir: {run_dir} (metrics.jsonl, logs/, checkpoints/)" + final_model_line(run_dir)
    )


def eval_line(run_dir: Path) -> str:
    """'eval v0 -> vN: eval_pass@k a -> b  eval_mean@k c -> d' + newline ('' without evaluations)."""
    rows = RunDir(run_dir).eval_rows()
    if not rows:
        return ""
    first, last = rows[0], rows[-1]
    keys = [k for k in first if k.startswith("eval_") and k != "eval_s" and k in last]
    scores = "  ".join(f"{k} {first[k]:.3f} -> {last[k]:.3f}" for k in keys)
    return f"eval v{first.get('version')} -> v{last.get('version')}: {scores}\n"


def final_model_line(run_dir: Path) -> str:
    """'final model: DIR' naming RUN_DIR/final (the final model in the model's dtype), else the
    newest complete checkpoint's model directory ('' when none)."""
    if (Path(run_dir) / FINAL / "config.json").is_file():
        return f"\nfinal model: {Path(run_dir) / FINAL} (a Hugging Face directory, in the model's dtype)"
    ckpts = RunDir(run_dir).checkpoints
    done = [p for p in ckpts.glob("v*") if p.name[1:].isdigit() and (p / "DONE").exists()] if ckpts.is_dir() else []
    if not done:
        return ""
    newest = max(done, key=lambda p: int(p.name[1:]))
    for sub in ("model", "merged", "adapter", "policy.pt"):
        if (newest / sub).exists():
            return f"\nfinal model: {newest / sub} (prl-actors export {run_dir} --out DIR: a Hugging Face directory)"
    return f"\nfinal checkpoint: {newest}"

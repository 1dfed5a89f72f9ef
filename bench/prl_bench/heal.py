"""Benchmark: self-healing under failures (issue 23 item 7). Effective training time ratio (ETTR):
the same run's epochs per second with an actor SIGKILLed at random every ~N s, against the run
undisturbed; goal >= 0.90 (the field's reference, RobustRL: > 0.80 at 10% failure injection).
Measured twice: restarts by new processes (the default), and by a spare core (run.standby_core).

Both runs are `prl-actors up` on the sim engine (the control plane: real processes, tcp, CURVE),
with run.max_restarts high enough never to run out. The clock of a run is its training time: from
the first coordinator's first `epoch_open` to the `epoch_done` of the last epoch (start-up left out
of both). The disturbed run kills one actor process every U(0.5 N, 1.5 N) s (seeded), chosen
uniformly among the live ones: coordinator, publisher, buffer, trainer (a core crash: `up` restarts
the core from the last checkpoint, the workers stay and rejoin) and the workers (a worker crash:
its groups are requeued, `up` starts a replacement). Reported: ETTR = disturbed epochs/s ÷
undisturbed epochs/s, the kills (core / worker), the core restarts, the recovery time (crash ->
the new core runs an epoch with every worker back, from `up`'s own line), the epochs redone (steps
of a dead core past the checkpoint it went back to: 0 with trainer.checkpoint_every 1; every
restart also throws away the part of the epoch in progress), and `replay --check` of the
disturbed run. The failure interval is stated in epochs of the undisturbed run (N / epoch time):
the issue's "every ~30 s" is scaled down so the benchmark ends in minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prl_bench.common import BenchContext, Entry, dies_with_us, free_port

GOAL = 0.90
SEED = 23
CORE = ("coordinator", "publisher", "buffer", "trainer")


def run(ctx: BenchContext) -> list[Entry]:
    epochs = ctx.size(150, 60, 6)
    interval_s = ctx.size(30.0, 15.0, 4.0)
    calm = _run(ctx, "undisturbed", epochs, None, standby=False)
    entries = []
    for standby in (False, True):
        name = "disturbed-standby" if standby else "disturbed"
        hit = _run(ctx, name, epochs, interval_s, standby=standby)
        entries += _entries(ctx, calm, hit, epochs, interval_s, standby)
    return entries


def _entries(
    ctx: BenchContext, calm: dict[str, Any], hit: dict[str, Any], epochs: int, interval_s: float, standby: bool
) -> list[Entry]:
    ettr = calm["train_s"] / max(hit["train_s"], 1e-9)
    epoch_s = calm["train_s"] / epochs
    how = "a spare core (run.standby_core)" if standby else "new processes"
    raw = {"undisturbed": calm, "disturbed": hit, "epochs": epochs, "interval_s": interval_s, "epoch_s": epoch_s}
    recov = hit["recovery_s"]
    note = (
        f"restarts take {how}; {epochs} epochs, sim engine, 2 workers; a kill every ~{interval_s:g}s = "
        f"{interval_s / epoch_s:.0f} undisturbed epochs ({epoch_s:.2f}s each); {hit['kills_core']} core + "
        f"{hit['kills_worker']} worker kills, {hit['restarts']} core restarts, recovery median {_median(recov)}s, "
        f"{hit['epochs_redone']} epochs redone; replay --check: {hit['replay_check']}"
    )
    ctx.say(f"[heal] ETTR {ettr:.3f}: {note}")
    label = "spare core" if standby else "new processes"
    return [
        Entry(
            "heal",
            f"ETTR, an actor SIGKILLed every ~N s, restart by {label}",
            "disturbed epochs/s / undisturbed epochs/s",
            round(ettr, 3),
            "x",
            round(ettr, 3),
            GOAL,
            raw=raw,
            note=note,
        ),
        Entry(
            "heal",
            f"core restart by {label}: crash -> new core runs an epoch, every worker back",
            "seconds (median)",
            _median(recov),
            "s",
            _median(recov),
            None,
            op="<=",
            raw={"recovery_s": recov},
            note=f"{len(recov)} restarts; each costs this plus the epoch in progress",
        ),
    ]


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2) if xs else float("nan")


def _settings(ctx: BenchContext, run_dir: Path, epochs: int, standby: bool) -> dict[str, Any]:
    return {
        "run.standby_core": standby,
        "run.run_dir": str(run_dir),
        "run.epochs": epochs,
        "run.workers": 2,
        "run.max_restarts": 10_000,  # never runs out here: the benchmark measures the cost of each
        "run.stop_grace_s": 2.0,
        "transport.kind": "tcp",
        "transport.base_port": free_port(5),
        "transport.auth": ctx.auth,
        "coordinator.groups_per_epoch": 8,
        "coordinator.heartbeat_interval_s": 0.1,
        "coordinator.heartbeat_timeout_s": 1.0,
        "worker.engine": "sim",
        "worker.group_size": 4,
        "trainer.learner": "sim",
        "sim.gen_s_per_token": 0.01,
        "sim.tokens_per_sample": 6,
        "sim.train_s_per_sample": 0.002,
        "sim.param_count": 65536,
    }


def _run(ctx: BenchContext, name: str, epochs: int, interval_s: float | None, standby: bool) -> dict[str, Any]:
    run_dir = ctx.work_dir / name
    cmd = [sys.executable, "-m", "prl_actors.cli.main", "up"]
    for key, value in _settings(ctx, run_dir, epochs, standby).items():
        cmd += ["--set", f"{key}={value}"]
    err_path = ctx.work_dir / f"{name}.err"
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, preexec_fn=dies_with_us
        )
        try:
            kills = _disturb(ctx, proc, run_dir, interval_s) if interval_s else []
            proc.wait(timeout=max(600.0, epochs * 20.0))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = err_path.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"prl-actors up ({name}) exited {proc.returncode}: {text.strip().splitlines()[-3:]}")
    return _summary(ctx, run_dir, epochs, kills, text, name)


def _disturb(ctx: BenchContext, proc: subprocess.Popen[bytes], run_dir: Path, interval_s: float) -> list[str]:
    """Until `up` exits: every U(0.5, 1.5) x interval_s, SIGKILL one live actor process at random."""
    rng = random.Random(SEED)
    kills: list[str] = []
    while proc.poll() is None and not _opened(run_dir):
        time.sleep(0.2)
    while proc.poll() is None:
        deadline = time.monotonic() + rng.uniform(0.5, 1.5) * interval_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        live = _live(run_dir)
        if proc.poll() is not None or not live:
            break
        victim = rng.choice(sorted(live))
        with contextlib.suppress(ProcessLookupError):
            os.kill(live[victim], signal.SIGKILL)
            kills.append(victim)
            ctx.say(f"[heal] killed {victim} (pid {live[victim]})")
    return kills


def log_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every event of the run's logs, logs/<actor>.jsonl and the .jsonl.gz an ended run's large logs
    are moved into (rundir.compress_logs), read by replay's reader: a live run's half-written last line
    is skipped; a file replay cannot read is left out (none yet: [])."""
    from prl_actors.replay.events import ReplayError, log_files, read_file

    try:
        files = log_files(run_dir)
    except ReplayError:
        return []
    out: list[dict[str, Any]] = []
    for path in files:
        with contextlib.suppress(ReplayError, OSError, EOFError):
            out += read_file(path, [])
    return out


def _opened(run_dir: Path) -> bool:
    return any(e["event"] == "epoch_open" for e in log_events(run_dir))


def _live(run_dir: Path) -> dict[str, int]:
    """actor name -> pid of its newest process, for those still running."""
    newest = {e["actor"]: int(e["pid"]) for e in log_events(run_dir) if e["event"] == "actor_start"}
    return {a: pid for a, pid in newest.items() if _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _summary(ctx: BenchContext, run_dir: Path, epochs: int, kills: list[str], err: str, name: str) -> dict[str, Any]:
    events = log_events(run_dir)
    first_open = min(e["t_mono"] for e in events if e["event"] == "epoch_open" and e["actor"] == "coordinator")
    last = [e["t_mono"] for e in events if e["event"] == "epoch_done" and e.get("done_epoch") == epochs - 1]
    train_s = max(last) - first_open
    steps = sum(1 for e in events if e["event"] == "optimizer_step" and e["actor"] == "trainer")
    recovery = [float(x) for x in re.findall(r"every worker rejoined \(([\d.]+)s after the crash\)", err)]
    row = {
        "train_s": round(train_s, 3),
        "epochs_per_s": round(epochs / train_s, 4),
        "kills": kills,
        "kills_core": sum(k in CORE for k in kills),
        "kills_worker": sum(k not in CORE for k in kills),
        "restarts": len(re.findall(r"restarting from v\d+ \(restart", err)),
        "worker_replacements": len(re.findall(r"^worker-\d+ exited", err, re.M)),
        "recovery_s": recovery,
        "epochs_redone": steps - epochs,
        "replay_check": _check(run_dir),
    }
    ctx.say(f"[heal] {name}: {epochs} epochs in {train_s:.1f}s of training; {row}")
    return row


def _check(run_dir: Path) -> str:
    """'ok', or the failed checks' names (replay --check, in this process)."""
    from prl_actors.replay.checks import run_checks
    from prl_actors.replay.events import load_run

    failed = [r.name for r in run_checks(load_run(run_dir)) if not r.ok]
    return "ok" if not failed else "FAILED: " + ", ".join(failed)

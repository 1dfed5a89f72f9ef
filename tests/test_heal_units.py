"""Self-healing (run.max_restarts), the parts without processes: a worker that joins a restarted core
(another run id) drops what the old core gave it and fetches the new core's weights even when they
are older than its own; the launcher's restart budget and back-off."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

from prl_actors.engines.sim import SimEngine
from prl_actors.launch import build
from prl_actors.launch.supervisor import RESTART_BACKOFF_S, Healing
from prl_actors.launch.up import Launcher
from prl_actors.protocol import messages as m
from prl_actors.runtime.processes import Child
from prl_actors.weights.transfer import Snapshot, transfer_messages
from prl_actors.worker.core import WorkerCore
from tests.conftest import sim_config
from tests.test_epoch_protocol import assign, inbound, m_inbound, sim_config_for_cores, worker

THETA = (8, 8)


def welcome(core: WorkerCore, run_id: str, epoch: int = -1, version: int = -1) -> list[m.Msg]:
    core.outbox.clear()
    msg = m.Welcome(
        reply_to="reg", run_id=run_id, mode="periodic", group_size=2, groups_per_epoch=4,
        heartbeat_interval_s=0.1, publisher_addr="p", buffer_addr="b", epoch=epoch, version=version,
    )  # fmt: skip
    core.handle(0.0, inbound(msg, "coordinator", peer="coordinator"))
    out, core.outbox = core.outbox, []
    return [x for _, x, _ in out]


def install(core: WorkerCore, version: int, fill: float) -> None:
    snap = Snapshot.from_tensors(version, {"theta": np.full(THETA, fill, dtype=np.float32)})
    for part, payloads in transfer_messages(snap, 1 << 20, epoch=version):
        core.handle(0.0, m_inbound(part, payloads))


def test_a_worker_that_joins_a_restarted_core_drops_its_old_work_and_refetches_older_weights() -> None:
    """It held v3 of the old core and was generating a group of it; the new core went back to its
    checkpoint v2: the group is dropped (its ticket died with the old core), no retry of its send
    survives, and v2 is fetched and installed although it is older than v3 (another line's v3)."""
    engine = SimEngine(build.engine_settings(sim_config_for_cores()))
    engine.load_weights(0, {"theta": np.zeros(THETA, dtype=np.float32)})
    core = worker(engine)
    welcome(core, "run-old", epoch=0, version=0)
    sent = [x for x in assign(core) if isinstance(x, m.GroupResult)]  # a pending GroupAck retry
    assert sent and core.requests.pending
    engine.load_weights(3, {"theta": np.full(THETA, 3.0, dtype=np.float32)})  # the old core's v3
    engine.admit([m.Prompt(group_id=1, prompt="ctx 1", answer="4")], 2)
    core.assigned[1] = (
        m.WorkAssign(reply_to="r", prompts=[], epoch=3, version=3),
        m.Prompt(group_id=1, prompt="ctx 1", answer="4"),
    )
    assert welcome(core, "run-new") == []  # no epoch open yet at the new core: nothing to do
    assert not engine.busy and not core.assigned and core.counters["groups_dropped"] == 1
    assert not core.requests.pending  # no resend of an old core's group to the new buffer
    core.handle(0.0, inbound(m.EpochStart(epoch=2, version=2, groups=4), "coordinator", peer="coordinator"))
    out = [x for _, x, _ in core.outbox]
    assert [m.tag_of(x) for x in out] == ["fetch_weights"]  # v3 is not the new core's: fetch, ask no work
    core.outbox.clear()
    install(core, 2, fill=2.0)
    assert engine.version == 2 and float(engine.theta[0, 0]) == 2.0
    asked = [x for _, x, _ in core.outbox if isinstance(x, m.WorkRequest)]
    assert asked and asked[0].version == 2 and asked[0].epoch == 2


def test_a_worker_welcomed_again_by_the_same_core_keeps_its_weights() -> None:
    """A re-register at the same core (it timed us out) is no restart: the weights stay."""
    engine = SimEngine(build.engine_settings(sim_config_for_cores()))
    engine.load_weights(1, {"theta": np.ones(THETA, dtype=np.float32)})
    core = worker(engine)
    assert [m.tag_of(x) for x in welcome(core, "run-a", epoch=1, version=1)] == ["work_request"]
    no_work = m.NoWork(reply_to="r", reason=m.NoWorkReason.FAIR_SHARE)
    core.handle(0.0, inbound(no_work, "coordinator", peer="coordinator"))
    out = welcome(core, "run-a", epoch=1, version=1)
    assert [m.tag_of(x) for x in out] == ["work_request"] and not core.stale_weights and engine.version == 1


def test_the_restart_back_off_grows_only_for_restarts_in_a_row_without_progress() -> None:
    heal = Healing()
    assert heal.crashed(progressed=True) == 0.0  # the first restart: at once
    assert heal.crashed(progressed=False) == RESTART_BACKOFF_S  # its core died before an epoch was done
    assert heal.crashed(progressed=False) == 2 * RESTART_BACKOFF_S
    assert heal.crashed(progressed=True) == 0.0  # a core that trained an epoch: at once again
    assert heal.used == 4 and heal.back() >= 0.0 and heal.since == 0.0


def exited(name: str, argv: list[str]) -> Child:
    proc = subprocess.Popen(argv)
    proc.wait()
    return Child(name, proc)


def log(run_dir: Path, actor: str, event: str, **fields: object) -> None:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    with open(run_dir / "logs" / f"{actor}.jsonl", "a") as f:
        f.write(json.dumps({"event": event, "actor": actor, **fields}, separators=(",", ":")) + "\n")


def test_what_a_core_crash_means_restart_or_the_end_of_the_run(run_dir: Path) -> None:
    """A crash once the run is up is healed; a start-up failure, a failure with the actor's own
    reason (it would fail the same way again), no checkpoints, or a used-up budget end the run."""
    launcher = Launcher(sim_config(run_dir, run__max_restarts=2), run_dir / "config.yaml")
    killed = exited("trainer", ["sh", "-c", "kill -9 $$"])
    launcher.children["coordinator"] = exited("coordinator", ["true"])
    assert launcher._not_healable(killed).startswith("trainer exited (signal 9); see ")  # no epoch opened yet
    log(run_dir, "coordinator", "epoch_open", epoch=0)
    assert launcher._not_healable(killed) == ""
    failed = exited("trainer", ["false"])
    assert launcher._not_healable(failed) == ""  # exit 1 without a reason of its own: a crash
    log(run_dir, "trainer", "actor_crashed", error="epoch 3: loss is nan (trainer.on_nonfinite: fail)")
    assert "(code 1: epoch 3: loss is nan" in launcher._not_healable(failed)
    launcher.heal.used = 2
    assert launcher._not_healable(killed).endswith("not restarted: the core was restarted 2 times (run.max_restarts)")
    launcher.heal.used = 0
    launcher.cfg.trainer.checkpoint_every = 0
    assert launcher._not_healable(killed).endswith("no checkpoints to restart from (trainer.checkpoint_every 0)")
    launcher.cfg.run.max_restarts = 0
    why = launcher._not_healable(killed)  # today's line: the actor's own failure, nothing more
    assert why.startswith("trainer exited (signal 9") and why.endswith("logs/trainer.jsonl"), why

"""The trainer as a torch.distributed group: rank 0 is the Trainer actor, ranks 1..N-1 follow it.

Rank 0 alone talks ZeroMQ. `DistributedLearner` is the Learner the TrainerCore drives (the actor does
not know it is distributed): it collects arriving groups into rounds of at most world_size x
micro_batch_groups groups or about world_size x micro_batch_tokens tokens, splits each round into
token-balanced shares (a group's samples across ranks where whole groups cannot balance it:
rank_learner.partition), sends every rank the round (`Command`, trainer/rank_group.py) and trains
its own share; at EpochComplete every rank takes the one step (trainer/rank_learner.py). Publishing
and checkpointing run on rank 0 (fsdp2: with every rank's part gathered).

Failure is loud: a rank that dies makes rank 0's next command or collective fail at once (its sockets
close); one that hangs, within `trainer.dist_timeout_s`. Rank 0 then reports the cause through
`on_fatal` (the TrainerCore's `fail`: the actor exits 1 with that line, as a crashed trainer does)
and `up --resume` continues from the last checkpoint. Ranks that rank 0 started exit when rank 0's
process is gone; ranks under torchrun are torn down by torchrun.

A rank other than 0 runs `run_rank`: started by rank 0 as `python -m prl_actors.launch.rank` (with
PRL_RANK_CONFIG), or as `prl-actors actor trainer` under torchrun for RANK > 0.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prl_actors.records.logs import EventLog
from prl_actors.runtime.processes import Child, stop_children, watch_supervisor
from prl_actors.runtime.threads import rank_threads, set_torch_threads
from prl_actors.sections import ConfigError
from prl_actors.trainer.rank_group import (
    RANK_PARENT_ENV,
    Command,
    Joined,
    RankEnv,
    RankGroupError,
    check_world,
    join_group,
    rank_log_dir,
    start_local_group,
)
from prl_actors.trainer.rank_learner import RankLearner, group_cost, partition

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group
    from prl_actors.training.settings import LearnerSettings


def _no_fatal(reason: str) -> None:
    pass


class DistributedLearner:
    """Learner protocol on rank 0 of the trainer group (strategy ddp or fsdp2)."""

    def __init__(
        self, settings: LearnerSettings, model_dir: Path | None, joined: Joined, procs: list[Child], logs: Path
    ) -> None:
        self.env, self.procs, self.channel = joined.env, procs, joined.channel
        self.logs = logs  # rank_log_dir(run_dir): the ranks' own logs, read when one fails
        self.closed = False
        self.on_fatal: Callable[[str], None] = _no_fatal  # set to the TrainerCore's `fail` (topology)
        self.round_size = self.env.world_size * settings.trainer.micro_batch_groups
        self.round_tokens = self.env.world_size * settings.trainer.fixed_micro_batch_tokens()
        self.local = self._guard(lambda: RankLearner(settings, model_dir, joined), "start rank 0")
        self.pending_groups: list[Group] = []
        self.pending_tokens = 0

    @property
    def version(self) -> int:
        version: int = self.local.version
        return version

    def begin_epoch(self, epoch: int, n_groups: int) -> None:
        self.pending_groups, self.pending_tokens = [], 0
        self._everywhere(Command(op="begin", epoch=epoch), lambda: self.local.begin_epoch(epoch, n_groups))

    def accumulate(self, group: Group) -> dict[str, float]:
        """Queue `group`; a full round goes out to the ranks at once: world_size x micro_batch_groups
        groups, or world_size x micro_batch_tokens tokens (each rank trains its share as one
        micro-batch, so the token budget bounds a rank's forward as it bounds one process's)."""
        self.pending_groups.append(group)
        self.pending_tokens += group_cost(group)
        if len(self.pending_groups) >= self.round_size or self.pending_tokens >= self.round_tokens:
            self._round()
        rewards = [s.reward for s in group.samples]
        tokens = sum(len(s.token_ids) for s in group.samples)
        return {"reward_mean": sum(rewards) / max(len(rewards), 1), "tokens": float(tokens)}

    @property
    def pending(self) -> int:
        """Groups queued for the next round."""
        return len(self.pending_groups)

    def flush(self, max_groups: int | None = None) -> int:
        """Train what is queued now, as a (possibly partial) round; returns how many groups. A round
        goes to every rank at once, so `max_groups` (the trainer's pacing) is not applied."""
        n = len(self.pending_groups)
        if n:
            self._round()
        return n

    def _round(self) -> None:
        shares, self.pending_groups = partition(self.pending_groups, self.env.world_size), []
        self.pending_tokens = 0
        self._everywhere(Command(op="round", shares=shares), lambda: self.local.run_round(shares[0]))

    def step(self) -> dict[str, float]:
        self.flush()
        metrics: dict[str, float] = self._everywhere(Command(op="step"), self.local.step)
        return metrics

    def weights(self) -> dict[str, Any]:
        if self.local.strategy == "ddp":
            own: dict[str, Any] = self.local.weights()
            return own
        weights: dict[str, Any] = self._everywhere(Command(op="weights"), self.local.weights)
        return weights

    def save_checkpoint(self, path: Path) -> None:
        if self.local.strategy == "ddp":
            self.local.save_checkpoint(path)
            return
        self._everywhere(Command(op="save", path=str(path)), lambda: self.local.save_checkpoint(path))

    def load_checkpoint(self, path: Path) -> None:
        self._everywhere(Command(op="load", path=str(path)), lambda: self.local.load_checkpoint(path))

    # --- the group ---------------------------------------------------------------------------

    def _everywhere(self, cmd: Command, local: Callable[[], Any]) -> Any:
        """Send `cmd` to every rank, then do rank 0's part; any failure is the group's (fatal)."""
        self._guard(lambda: self.channel.send(cmd), f"send {cmd.op} to the ranks")
        return self._guard(local, cmd.op)

    def _guard(self, fn: Callable[[], Any], what: str) -> Any:
        if self.closed:
            raise RankGroupError("the trainer group is closed")
        try:
            return fn()
        except (RuntimeError, OSError) as exc:  # torch.distributed raises RuntimeError subclasses
            reason = f"trainer rank group failed ({what}): {self._ranks_state()}{_short(exc)}"
            self.on_fatal(reason)
            self.close(graceful=False)
            raise RankGroupError(reason) from exc

    def _ranks_state(self) -> str:
        """Which ranks rank 0 started have exited, and how (the likely cause), as a prefix. A rank
        killed a moment ago may still be exiting when its closed socket is seen: wait a little."""
        deadline = time.monotonic() + 1.0
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(max(0.0, deadline - time.monotonic()))
        gone = [(r, p) for r, p in enumerate(self.procs, start=1) if not p.alive()]
        return "".join(
            f"rank {r} (pid {p.pid}) exited with {_exit_text(p.proc.returncode)}{_last_error(self.logs, r)}; "
            for r, p in gone
        )

    def close(self, graceful: bool = True) -> None:
        """Tell the ranks to exit (graceful), wait for those rank 0 started, leave the group."""
        if self.closed:
            return
        self.closed = True
        if graceful:
            try:
                self.channel.send(Command(op="close"))
            except (RuntimeError, OSError):
                graceful = False
        stop_children(self.procs, 10.0 if graceful else 0.0)
        _destroy_group()


def start_distributed(
    settings: LearnerSettings, model_dir: Path | None, *, join_timeout_s: float, run_dir: Path | str, config_text: str
) -> DistributedLearner:
    """Rank 0: join the torchrun launch this process is part of, or start ranks 1..N-1 here (each
    reads `config_text`, the run's resolved config). `join_timeout_s` is transport.join_timeout_s."""
    env = RankEnv.from_environ()
    procs: list[Child] = []
    trainer, logs = settings.trainer, rank_log_dir(run_dir)
    if env is None:
        joined, procs = start_local_group(trainer, join_timeout_s, logs, config_text)
    else:
        check_world(trainer.world_size, env)
        if env.rank != 0:
            raise ConfigError(f"the trainer actor is rank 0; RANK={env.rank} runs as a follower (`actor trainer`)")
        joined = join_group(trainer, join_timeout_s, env, logs)
    try:
        return DistributedLearner(settings, model_dir, joined, procs, logs)
    except BaseException:
        stop_children(procs, 0.0)
        _destroy_group()
        raise


# --- ranks other than 0 -----------------------------------------------------------------------


def follow(
    settings: LearnerSettings,
    model_dir: Callable[[], Path | None],
    env: RankEnv,
    log: EventLog,
    join_timeout_s: float,
    logs: Path,
) -> int:
    """A rank other than 0: join the group, then do what rank 0 says until `close`. Returns 0, or
    raises with the cause (the caller logs it and exits 1). `model_dir` gives the model directory
    rank 0's `up` built (called once the group is joined)."""
    joined = join_group(settings.trainer, join_timeout_s, env, logs)
    learner = RankLearner(settings, model_dir(), joined)
    channel = joined.channel
    log("rank_ready", rank=env.rank, world_size=env.world_size, pid=os.getpid())
    while True:
        cmd = channel.recv()
        if cmd.op == "close":
            break
        t0 = time.monotonic()
        _apply(learner, cmd, env.rank)
        seconds = round(time.monotonic() - t0, 6)
        log("rank_command", op=cmd.op, rank=env.rank, seconds=seconds, new_version=learner.version)
    _destroy_group()
    return 0


def _apply(learner: RankLearner, cmd: Command, rank: int) -> None:
    if cmd.op == "begin":
        learner.begin_epoch(cmd.epoch, 0)
    elif cmd.op == "round":
        learner.run_round(cmd.shares[rank])
    elif cmd.op == "step":
        learner.step()
    elif cmd.op == "weights":
        learner.weights()
    elif cmd.op == "save":
        learner.save_checkpoint(Path(cmd.path))
    elif cmd.op == "load":
        learner.load_checkpoint(Path(cmd.path))
    else:
        raise RankGroupError(f"unknown command {cmd.op!r} from rank 0")


def run_rank(
    settings: LearnerSettings,
    model_dir: Callable[[], Path | None],
    env: RankEnv,
    *,
    join_timeout_s: float,
    run_dir: Path | str,
) -> int:
    """Process body of a rank other than 0: log to RUN_DIR/logs/ranks/trainer-rank<r>.jsonl."""
    check_world(settings.trainer.world_size, env)
    set_torch_threads(rank_threads(settings.trainer))
    _exit_with_parent()
    logs = rank_log_dir(run_dir)
    log = EventLog(f"trainer-rank{env.rank}", "trainer", logs / f"trainer-rank{env.rank}.jsonl")
    try:
        return follow(settings, model_dir, env, log, join_timeout_s, logs)
    except Exception as exc:
        log("rank_failed", rank=env.rank, error=_short(exc))
        print(f"error: trainer rank {env.rank}: {_short(exc)}", file=sys.stderr, flush=True)
        return 1
    finally:
        log.close()


def _exit_with_parent() -> None:
    """A rank that rank 0 started ends with it (even one stuck in a collective)."""
    parent = int(os.environ.get(RANK_PARENT_ENV, "0") or 0)
    if parent:
        watch_supervisor(lambda: os._exit(1), parent)


def _destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _last_error(logs: Path, rank: int) -> str:
    """The rank's own last `error:` line (its stderr log), in brackets, if it wrote one."""
    try:
        lines = (logs / f"rank{rank}.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    return f" [{errors[-1][:300]}]" if errors else ""


def _exit_text(code: int | None) -> str:
    return f"signal {-code}" if code is not None and code < 0 else f"code {code}"


def _short(exc: BaseException) -> str:
    """One line; without gloo's source location and sign-off."""
    text = re.sub(r"\[[^\]]*\.cc:\d+\] ", "", " ".join(str(exc).split())).replace(" GLHF! 🏖️", "")
    text = text or type(exc).__name__
    return text if len(text) < 400 else text[:400] + " ..."

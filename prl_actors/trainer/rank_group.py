"""The trainer's torch.distributed group: where each rank comes from, and how rank 0 drives the others.

Ranks read torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK). Without it
the trainer actor is rank 0 and starts ranks 1..N-1 on its own host (`start_local_group`), with the
same variables set, so both launches run the same code (docs/DISTRIBUTED.md).

Two process groups, one job each:
* the compute group (timeout `trainer.dist_timeout_s`; nccl on cuda, else gloo) carries the training
  collectives: gradient all-reduce (ddp), FSDP2's all-gather / reduce-scatter, stats. A rank that
  does not join one in time fails it on every other rank: a loud error, never a silent hang.
* the default group (gloo) carries rank 0's commands (`Channel`) and checkpoint coordination. Rank 0
  waits at most `dist_timeout_s` for each command; the other ranks wait for the next one as long as
  the run lasts (an epoch's generation can take long), and see at once when rank 0's process is gone
  (its sockets close).
Ranks count in through the rendezvous store first (within `transport.join_timeout_s`): a rank that
exits before it joined is reported at once, not after a timeout.
Commands are msgspec MessagePack (never pickle), sent as uint8 tensors by broadcast from rank 0.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import torch

from prl_actors.protocol.messages import Group  # noqa: TC001 (Piece.group: msgspec resolves it at run time)
from prl_actors.runtime.processes import Child, spawn, stop_children
from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.trainer.config import TrainerSection

RANK_CONFIG_ENV = "PRL_RANK_CONFIG"  # the resolved config (YAML) for ranks rank 0 starts itself
RANK_PARENT_ENV = "PRL_RANK_PARENT"  # rank 0's pid: a rank it started exits when that process is gone
IDLE_TIMEOUT = datetime.timedelta(days=7)  # the other ranks' wait for rank 0's next command


class RankGroupError(RuntimeError):
    """A rank failed, timed out or disagrees: the step cannot complete (the message is for the user)."""


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, env: dict[str, str] | None = None) -> RankEnv | None:
        """The torchrun variables of this process, or None when RANK is not set."""
        env = dict(os.environ) if env is None else env
        if "RANK" not in env:
            return None
        try:
            return cls(
                rank=int(env["RANK"]),
                world_size=int(env["WORLD_SIZE"]),
                local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
                master_addr=env["MASTER_ADDR"],
                master_port=int(env["MASTER_PORT"]),
            )
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"torchrun environment incomplete or not numbers: {exc}") from None

    def variables(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def check_world(world_size: int, env: RankEnv) -> None:
    """The launch's WORLD_SIZE and RANK fit `world_size` (trainer.world_size)."""
    if env.world_size != world_size:
        raise ConfigError(f"trainer.world_size is {world_size} but the launch says WORLD_SIZE={env.world_size}")
    if not 0 <= env.rank < env.world_size:
        raise ConfigError(f"RANK={env.rank} is outside 0..{env.world_size - 1}")


def rank_log_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / "logs" / "ranks"


@dataclass
class Joined:
    """This rank's place in the group: rank 0's commands, and the group the training collectives use."""

    env: RankEnv
    channel: Channel
    compute: Any  # torch.distributed ProcessGroup (timeout trainer.dist_timeout_s)


def start_local_group(
    trainer: TrainerSection, join_timeout_s: float, logs: Path, config_text: str
) -> tuple[Joined, list[Child]]:
    """Rank 0 of a group on this host: serve the rendezvous store (a loopback port the OS picks), start
    ranks 1..N-1 (stdout and stderr to RUN_DIR/logs/ranks/rank<r>.log; they exit when this process is
    gone), wait until each has joined (one that exits first is reported at once), join. Everything
    listens on loopback only: the store (its own socket) and gloo (GLOO_SOCKET_IFNAME=lo, unless set).
    `logs` is rank_log_dir(run_dir); `config_text` the run's resolved config (Config.dump), which every
    rank started here reads (RANK_CONFIG_ENV)."""
    n = trainer.world_size
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # this process and the ranks it starts
    store, port = serve_store(n, _startup(join_timeout_s))
    env0 = RankEnv(0, n, 0, "127.0.0.1", port)
    procs = [_spawn_rank(RankEnv(r, n, r, env0.master_addr, env0.master_port), logs, config_text) for r in range(1, n)]
    try:
        return _join(trainer, join_timeout_s, env0, store, procs, logs), procs
    except BaseException:
        stop_children(procs, 0.0)
        raise


def serve_store(world_size: int, timeout: datetime.timedelta) -> tuple[Any, int]:
    """A rendezvous store serving on a loopback port the OS picks, and that port. The store owns the
    socket (it closes it when it is freed, with the process group): the fd is detached from Python,
    whose close of the same number later could hit whatever reused it (a zmq context's eventfd, and
    libzmq aborts the process)."""
    import torch.distributed as dist

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = int(listener.getsockname()[1])
        fd = listener.detach()
    try:
        return dist.TCPStore("127.0.0.1", port, world_size, True, timeout, False, master_listen_fd=fd), port
    except BaseException:
        os.close(fd)
        raise


def _spawn_rank(env: RankEnv, logs: Path, config_text: str) -> Child:
    """Rank `env.rank`, supervised by this process (launch/supervisor.py) and in its process group: `up`'s
    stop of the trainer's group reaches every rank too."""
    logs.mkdir(parents=True, exist_ok=True)
    variables = {**env.variables(), RANK_CONFIG_ENV: config_text, RANK_PARENT_ENV: str(os.getpid())}
    with open(logs / f"rank{env.rank}.log", "ab") as out:
        cmd = [sys.executable, "-m", "prl_actors.launch.rank"]
        return spawn(f"rank{env.rank}", cmd, variables, output=out, own_group=False)


def join_group(trainer: TrainerSection, join_timeout_s: float, env: RankEnv, logs: Path) -> Joined:
    """Any rank of a launch made elsewhere (torchrun, or rank 0 for the ranks it started). Rank 0
    serves the store unless torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE)."""
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    master = env.rank == 0 and not agent
    host, port, n = env.master_addr, env.master_port, env.world_size
    store = dist.TCPStore(host, port, n, master, _startup(join_timeout_s), wait_for_workers=False)
    return _join(trainer, join_timeout_s, env, store, [], logs)


def _startup(join_timeout_s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=join_timeout_s)


def _join(
    trainer: TrainerSection, join_timeout_s: float, env: RankEnv, store: Any, procs: list[Child], logs: Path
) -> Joined:
    """Count in through the store (rank 0 waits for the others, watching the ones it started), then
    form the command group (the default one, gloo) and the compute group."""
    import torch.distributed as dist

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"prl-trainer-{restart}/", store)  # a torchrun restart starts a new count
    if env.rank == 0:
        _wait_joined(store, env.world_size - 1, procs, join_timeout_s, logs)
    else:
        store.add("joined", 1)
    dist.init_process_group("gloo", store=store, rank=env.rank, world_size=env.world_size, timeout=IDLE_TIMEOUT)
    timeout = datetime.timedelta(seconds=trainer.dist_timeout_s)
    compute = dist.new_group(backend=backend_for(trainer.device), timeout=timeout)
    return Joined(env, Channel(dist.group.WORLD, trainer.dist_timeout_s), compute)


def _wait_joined(store: Any, others: int, procs: list[Child], timeout_s: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while (joined := int(store.add("joined", 0))) < others:
        for r, p in enumerate(procs, start=1):
            if not p.alive():
                code, log = p.proc.returncode, logs / f"rank{r}.log"
                raise RankGroupError(f"trainer rank {r} exited with code {code} before joining (see {log})")
        if time.monotonic() > deadline:
            raise RankGroupError(f"{joined} of {others} trainer ranks joined within {timeout_s:g}s")
        time.sleep(0.05)


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


class Piece(msgspec.Struct, kw_only=True):
    """A group, or some of its samples, in a rank's share of a round (trainer/rank_learner.py's
    `partition` splits a group across ranks where that shortens the round). `group.samples` are the
    piece's; `rewards` are the whole group's (its advantages need every one) and `first` is the index of
    the piece's first sample among them."""

    group: Group
    rewards: list[float]
    first: int = 0


class Command(msgspec.Struct, kw_only=True):
    """One instruction from rank 0 to every rank. `shares[r]` are rank r's pieces for a round."""

    op: str
    epoch: int = -1
    shares: list[list[Piece]] = []
    path: str = ""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Command)


class Channel:
    """Rank 0 broadcasts a Command (its size, then its bytes); every other rank receives it."""

    def __init__(self, group: Any, timeout_s: float) -> None:
        self.group, self.timeout = group, datetime.timedelta(seconds=timeout_s)

    def send(self, cmd: Command) -> None:
        payload = torch.frombuffer(bytearray(_encoder.encode(cmd)), dtype=torch.uint8)  # [n]
        self._broadcast(torch.tensor([payload.numel()], dtype=torch.int64), self.timeout)
        self._broadcast(payload, self.timeout)

    def recv(self) -> Command:
        size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size, None)
        payload = torch.empty(int(size.item()), dtype=torch.uint8)  # [n]
        self._broadcast(payload, None)
        return _decoder.decode(payload.numpy().tobytes())

    def _broadcast(self, t: torch.Tensor, timeout: datetime.timedelta | None) -> None:
        import torch.distributed as dist

        work = dist.broadcast(t, src=0, group=self.group, async_op=True)
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout)

"""The trainer's torch.distributed group: where each rank comes from, and how rank 0 drives the others.

Ranks read torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK). Without it
the trainer actor is rank 0 and starts ranks 1..N-1 on its own host (`launch_local_ranks`), with the
same variables set, so both launches run the same code (docs/DISTRIBUTED.md).

Two process groups, one job each:
* the default group (timeout `trainer.dist_timeout_s`) carries the training collectives: gradient
  all-reduce (ddp), FSDP2's all-gather / reduce-scatter, stats, state gathering. A rank that does not
  join one in time fails it on every other rank: a loud error, never a silent hang.
* the command group carries rank 0's commands (`Channel`). Rank 0 waits at most `dist_timeout_s` for
  each; the other ranks wait for the next command as long as the run lasts (an epoch's generation
  can take long), and see at once when rank 0's process is gone (its sockets close).
Commands are msgspec MessagePack (never pickle), sent as uint8 tensors by broadcast from rank 0.
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from prl_actors.config import Config, ConfigError
from prl_actors.protocol.messages import Group

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


def check_world(cfg: Config, env: RankEnv) -> None:
    if env.world_size != cfg.trainer.world_size:
        raise ConfigError(
            f"trainer.world_size is {cfg.trainer.world_size} but the launch says WORLD_SIZE={env.world_size}"
        )
    if not 0 <= env.rank < env.world_size:
        raise ConfigError(f"RANK={env.rank} is outside 0..{env.world_size - 1}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def rank_log_dir(cfg: Config) -> Path:
    return Path(cfg.run.run_dir) / "logs" / "ranks"


def launch_local_ranks(cfg: Config) -> tuple[RankEnv, list[subprocess.Popen[bytes]]]:
    """Rank 0's environment, and ranks 1..N-1 started as processes of this host (stdout and stderr
    to RUN_DIR/logs/ranks/rank<r>.log). They are in this process's process group, so `up`'s signals
    reach them, and they exit when this process is gone."""
    env0 = RankEnv(0, cfg.trainer.world_size, 0, "127.0.0.1", free_port())
    logs = rank_log_dir(cfg)
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(1, env0.world_size):
        env = {**os.environ, **RankEnv(rank, env0.world_size, rank, env0.master_addr, env0.master_port).variables()}
        env.update({RANK_CONFIG_ENV: cfg.dump(), RANK_PARENT_ENV: str(os.getpid())})
        with open(logs / f"rank{rank}.log", "ab") as out:
            cmd = [sys.executable, "-m", "prl_actors.training.distributed"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    return env0, procs


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def init_group(cfg: Config, env: RankEnv) -> Any:
    """Join the default group (training collectives) and create the command group; returns the latter."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=cfg.trainer.dist_timeout_s)
    dist.init_process_group(
        backend_for(cfg.trainer.device),
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
    )
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


class Command(msgspec.Struct, kw_only=True):
    """One instruction from rank 0 to every rank. `shares[r]` are rank r's groups for a round."""

    op: str
    epoch: int = -1
    shares: list[list[Group]] = []
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

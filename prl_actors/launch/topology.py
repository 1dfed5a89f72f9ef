"""The whole topology in one place: which actor binds what, who talks to whom, and how each is built.

    coordinator  binds ROUTER  <- everyone (register, heartbeat, work, status)
    publisher    binds ROUTER  <- trainer (upload), workers (fetch);   DEALER -> coordinator
    buffer       binds ROUTER  <- workers (groups), trainer (credits); DEALER -> coordinator
    trainer      -             DEALER -> coordinator, buffer, publisher
    worker-*     -             DEALER -> coordinator, publisher, buffer

The same code runs all actors in one process over inproc:// (fast tests) or one per OS process over
ipc:// or tcp:// (`prl-actors up`, compose, remote hosts).
"""

from __future__ import annotations

import os
import socket
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from prl_actors.buffer.core import BufferCore
from prl_actors.coordinator.core import CoordinatorCore, CoordinatorSettings
from prl_actors.launch import build
from prl_actors.protocol.messages import BINDING_ROLES, role_prefix
from prl_actors.publisher.core import PublisherCore
from prl_actors.records.logs import EventLog
from prl_actors.records.rundir import RunDir
from prl_actors.runtime.core import ActorHost, Core, StartFailed, one_line
from prl_actors.runtime.threads import ThreadPlan, local_workers, set_torch_threads, threads_for
from prl_actors.trainer.core import TrainerCore
from prl_actors.training.base import FatalReporting
from prl_actors.training.settings import LearnerSettings
from prl_actors.transport.auth import KeyStore, Security
from prl_actors.transport.port import ROUTER, Limits
from prl_actors.worker.core import WorkerCore

if TYPE_CHECKING:
    from prl_actors.config import Config
    from prl_actors.engines.base import Engine
    from prl_actors.protocol.messages import GenerationContract
    from prl_actors.tasks.base import Task
    from prl_actors.trainer.distributed import DistributedLearner
    from prl_actors.training.base import Learner

PEERS = {
    "coordinator": (),
    "publisher": ("coordinator",),
    "buffer": ("coordinator",),
    "trainer": ("coordinator", "buffer", "publisher"),
    "worker": ("coordinator", "publisher", "buffer"),
}
BINDS = {r.value for r in BINDING_ROLES if r in PEERS}  # the GRPO roles that bind (the learner is classic RL's)


def role_of(name: str) -> str:
    """The role part of an actor name (one parser: protocol.messages.role_prefix)."""
    return role_prefix(name)


def model_dir(cfg: Config) -> Path | None:
    """The model directory every torch actor loads (built once by `up`, reused by the others)."""
    if cfg.worker.engine == "sim":
        return None
    return build.model_dir(cfg)


def build_core(name: str, cfg: Config, log: EventLog, quiet: bool = False) -> Core:
    role = role_of(name)
    run_dir = Path(cfg.run.run_dir)
    if role == "coordinator":
        task = build.task(cfg)
        settings = CoordinatorSettings(
            run_id=f"{cfg.run.name}-{uuid.uuid4().hex[:8]}",
            mode=cfg.run.mode,
            epochs=cfg.run.epochs,
            groups_per_epoch=cfg.coordinator.groups_per_epoch,
            group_size=cfg.worker.group_size,
            heartbeat_interval_s=cfg.coordinator.heartbeat_interval_s,
            heartbeat_timeout_s=cfg.coordinator.heartbeat_timeout_s,
            max_groups_per_request=cfg.coordinator.max_groups_per_request,
            publisher_addr=cfg.address("publisher"),
            buffer_addr=cfg.address("buffer"),
            request_timeout_s=cfg.transport.request_timeout_s,
            desired_workers=cfg.run.workers,
            max_workers=cfg.run.max_workers,
            hold_factor=cfg.coordinator.hold_factor,
            hold_min_s=cfg.coordinator.hold_min_s,
            max_group_failures=cfg.run.max_group_failures,
            on_error=cfg.task.on_error,
            dynamic_sampling=cfg.coordinator.dynamic_sampling,
            max_sampling_rounds=cfg.coordinator.max_sampling_rounds,
            max_staleness=cfg.run.staleness_bound(),
            expelled_wait_s=cfg.transport.join_timeout_s,
            contract=generation_contract(cfg, task),
        )
        return CoordinatorCore(name, log, settings, task, *_eval_parts(cfg, task, run_dir, quiet))
    if role == "publisher":
        from prl_actors.weights.shm import ShmPublisher

        shm = ShmPublisher() if cfg.publisher.shm else None
        return PublisherCore(name, log, cfg.publisher.chunk_bytes, cfg.publisher.transfer_timeout_s, shm)
    if role == "buffer":
        checker = build.group_checker(cfg, build.checker_model_dir(cfg))
        return BufferCore(
            name,
            log,
            cfg.run.mode,
            cfg.worker.group_size,
            cfg.buffer.max_groups,
            checker,
            cfg.run.max_bad_groups,
            max_staleness=cfg.run.staleness_bound(),
        )
    if role == "trainer":
        from prl_actors.weights.shm import ShmReader

        learner = _make_learner(cfg)
        core = TrainerCore(
            name,
            log,
            learner,
            RunDir(run_dir, echo=not quiet, keep_checkpoints=cfg.trainer.keep_checkpoints),
            credits=cfg.trainer.credits,
            chunk_bytes=cfg.publisher.chunk_bytes,
            request_timeout_s=cfg.transport.request_timeout_s,
            checkpoint_every=cfg.trainer.checkpoint_every,
            resume=cfg.run.resume,
            threads=_trainer_threads(cfg, learner),
            shm=ShmReader() if cfg.publisher.shm else None,
            on_nonfinite=cfg.trainer.on_nonfinite,
            no_signal_epochs=cfg.trainer.no_signal_epochs,
            log_completions=cfg.run.log_completions,
            max_staleness=cfg.run.staleness_bound(),
            drift_probe=cfg.worker.sync_kl_threshold is not None,
        )
        if isinstance(learner, FatalReporting):  # a trainer group (trainer/distributed.py): a lost rank fails the actor
            learner.on_fatal = core.fail
        return core
    if role == "worker":
        from prl_actors.weights.shm import ShmReader

        engine = _make_engine(cfg)
        task = build.task(cfg)
        return WorkerCore(
            name,
            log,
            engine,
            task,
            cfg.worker.group_size,
            fetch_timeout_s=cfg.worker.weight_fetch_timeout_s,
            request_timeout_s=cfg.transport.request_timeout_s,
            as_torch=cfg.worker.engine != "sim",
            prefetch=cfg.worker.prefetch,
            shm=ShmReader() if cfg.worker.shm else None,
            threads=_worker_threads(cfg, engine),
            eval_sampling=(cfg.eval.sampling or cfg.worker.sampling) if cfg.eval.every_epochs > 0 else None,
            max_staleness=cfg.run.staleness_bound(),
            sync_kl_threshold=cfg.worker.sync_kl_threshold,
            contract=generation_contract(cfg, task),
        )
    raise ValueError(f"unknown role {role!r} (expected one of {', '.join(PEERS)})")


def _eval_parts(cfg: Config, task: Any, run_dir: Path, quiet: bool) -> tuple[Any, Any]:
    """The coordinator's EvalPlan and sink (None, None when eval.every_epochs is 0)."""
    if cfg.eval.every_epochs <= 0:
        return None, None
    from prl_actors.coordinator.evaluation import EvalPlan, done_epochs, eval_items

    done = done_epochs(run_dir) if cfg.run.resume else set()
    plan = EvalPlan(
        eval_items(cfg.eval, cfg.task, cfg.model.path, cfg.run.seed, task.items),
        cfg.eval.samples,
        cfg.eval.every_epochs,
        done,
    )
    return plan, RunDir(run_dir, echo=not quiet)


def _make_learner(cfg: Config) -> Learner:
    if cfg.trainer.learner == "sim":
        from prl_actors.training.sim import SimLearner

        return SimLearner(cfg.sim, cfg.run.seed)
    if cfg.trainer.strategy != "single":  # rank 0 of a torch.distributed group (docs/DISTRIBUTED.md)
        return start_trainer_group(cfg, model_dir(cfg))
    from prl_actors.training.grpo import GRPOLearner

    return GRPOLearner(learner_settings(cfg), model_dir(cfg))


def start_trainer_group(cfg: Config, directory: Path | None) -> DistributedLearner:
    """Rank 0 of the trainer's torch.distributed group under `cfg` (trainer/distributed.py): the ranks
    it starts read `cfg`, dumped."""
    from prl_actors.trainer.distributed import start_distributed

    return start_distributed(
        learner_settings(cfg),
        directory,
        join_timeout_s=cfg.transport.join_timeout_s,
        run_dir=cfg.run.run_dir,
        config_text=cfg.dump(),
    )


def learner_settings(cfg: Config) -> LearnerSettings:
    """What a GRPO learner reads of `cfg` (training/settings.py); the task's data identity is read
    when the learner is built."""
    return LearnerSettings(
        trainer=cfg.trainer,
        sampling=cfg.worker.sampling,
        dtype=cfg.model.dtype,
        seed=cfg.run.seed,
        epochs=cfg.run.epochs,
        data_identity=lambda: build.data_identity(cfg),
    )


def generation_contract(cfg: Config, task: Task) -> GenerationContract:
    """The contract a worker built from `cfg` (with `task` loaded from it) generates under
    (runtime/contract.py)."""
    from prl_actors.runtime.contract import contract_of, model_identity

    model = model_identity(cfg.worker.engine, cfg.sim, cfg.model, lambda: build.model_key(cfg))
    return contract_of(cfg.worker, cfg.task, model, cfg.model.dtype, task)


def _make_engine(cfg: Config) -> Engine:
    if cfg.worker.engine == "sim":
        from prl_actors.engines.sim import SimEngine

        return SimEngine(build.engine_settings(cfg))
    return build.engine(cfg, model_dir(cfg))


def socket_limits(role: str, cfg: Config) -> Limits:
    """Frame bounds per socket: weight chunks arrive on the publisher's ROUTER (uploads) and on a
    worker's DEALER to the publisher (fetches); every other socket carries control messages."""
    control, bulk = cfg.message_limits()
    weights = {"publisher": frozenset({ROUTER}), "worker": frozenset({"publisher"})}.get(role, frozenset())
    return Limits(max_msg_bytes=control, bulk_msg_bytes=bulk, bulk=weights)


def start_actor(
    name: str,
    cfg: Config,
    ctx: zmq.Context,
    log_dir: Path | None = None,
    quiet: bool = False,
    gate: Callable[[], None] | None = None,
) -> ActorHost:
    """Build and start one actor; returns its host (the `done` event is set when it has stopped).
    `gate`, when given, is waited on between building the actor (loading its model) and opening its
    sockets: `up` starts the trainer and workers at once, so they load while the servers start, and
    lets them connect only once this run's servers hold their ports. An exception from it is a
    start-up failure like any other."""
    role = role_of(name)
    log = EventLog(name, role, (log_dir / f"{name}.jsonl") if log_dir else None)
    log("actor_start", pid=os.getpid(), host=socket.gethostname(), address=cfg.address(role) if role in BINDS else "")
    try:  # loads the model, engine, task: a user's bad file ends here as one line, not a traceback
        core = build_core(name, cfg, log, quiet=quiet)
        if gate is not None:
            gate()
    except Exception as exc:
        log("start_failed", error=one_line(exc), trace=traceback.format_exc())
        log("actor_crashed", error=f"failed to start: {one_line(exc)}")
        log.close()
        raise StartFailed(f"failed to start: {one_line(exc)}") from None
    core.join_timeout_s, core.coordinator_addr = cfg.transport.join_timeout_s, cfg.address("coordinator")
    bind = cfg.bind_address(role) if role in BINDS else None
    if bind and bind.startswith("ipc://"):
        Path(bind.removeprefix("ipc://")).parent.mkdir(parents=True, exist_ok=True)
    peers = {p: cfg.address(p) for p in PEERS[role]}
    heartbeat = None if role == "coordinator" else cfg.coordinator.heartbeat_interval_s
    security = Security(KeyStore(cfg.keys_path()), name) if cfg.authenticated() else None
    if security is not None:  # a missing key file is a clear error here, not later in the port thread
        for peer in peers:
            security.store.public(peer)
    if not cfg.authenticated() and cfg.transport.kind != "inproc":
        log("auth_disabled", warning="transport.auth is none: any local process can act as any actor")
    limits = socket_limits(role, cfg)
    ref = ActorHost.start(core, ctx, bind, peers, heartbeat_s=heartbeat, limits=limits, security=security)
    host = ref._actor_weakref()  # the running actor object (alive while its thread runs)
    assert host is not None
    return host


BOOST_MIN_PARAMS = 1_000_000
"""Below this many policy parameters the trainer and the worker stay on their share of the cores: for
a model that small, more OpenMP threads mostly wait for each other (on a busy host far worse)."""


def _trainer_threads(cfg: Config, learner: object) -> ThreadPlan | None:
    """With `trainer.threads: auto` under `up` (workers on this host): the share while they generate
    and every core once the epoch is generated (runtime/threads.py); sync mode trains only while the
    workers wait, so on every core. None: a fixed setting, the sim learner, no local workers, a
    trainer group (its ranks split the cores) or a model below BOOST_MIN_PARAMS."""
    local = local_workers()
    if cfg.trainer.threads != "auto" or cfg.trainer.learner == "sim" or not local:
        return None
    if cfg.trainer.world_size > 1:  # the ranks split the cores (trainer/distributed.py)
        return None
    if _params(getattr(learner, "policy", None)) < BOOST_MIN_PARAMS:
        return None
    return _plan(cfg, "trainer", local)


def _worker_threads(cfg: Config, engine: object) -> ThreadPlan | None:
    """With `worker.threads: auto` under `up` and this host's only worker (torch engine): every core
    from the epoch's weights until its first group is sent, then its share (runtime/threads.py); in
    sync mode every core (the trainer waits while it generates). None otherwise: a fixed setting,
    several local workers (they split the cores), another engine, a model below BOOST_MIN_PARAMS."""
    if cfg.worker.threads != "auto" or cfg.worker.engine != "torch" or local_workers() != 1:
        return None
    if _params(getattr(engine, "model", None)) < BOOST_MIN_PARAMS:
        return None
    return _plan(cfg, "worker", 1)


def _params(model: object) -> int:
    parameters = getattr(model, "parameters", None)
    return sum(p.numel() for p in parameters()) if parameters is not None else 0


def _plan(cfg: Config, role: str, local: int) -> ThreadPlan:
    full = threads_for(cfg.worker, cfg.trainer, role, None)
    share = full if cfg.run.mode == "sync" else threads_for(cfg.worker, cfg.trainer, role, local)
    return ThreadPlan(share, full, set_torch_threads)

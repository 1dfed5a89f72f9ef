"""Typed, nested run configuration: one section per actor, validated; the CLI only overrides it.

The resolved config is written to RUN_DIR/config.yaml. `load_config` turns every user mistake into a
`ConfigError` with one readable line per problem (never a traceback).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from prl_actors.buffer.config import BufferSection
from prl_actors.classic.envkit.settings import EnvSection
from prl_actors.coordinator.config import CoordinatorSection, EvalSection
from prl_actors.engines.config import SimSection
from prl_actors.model.config import ModelSection
from prl_actors.protocol.messages import ADDRESSED_ROLES, BINDING_ROLES, Role
from prl_actors.publisher.config import PublisherSection
from prl_actors.sections import GREEDY_REFUSED, ConfigError, Section
from prl_actors.tasks.config import TaskSection
from prl_actors.trainer.config import (
    TrainerSection,
)
from prl_actors.transport.config import TransportSection
from prl_actors.worker.config import WorkerSection

ROLES = tuple(r.value for r in ADDRESSED_ROLES)  # the roles with an address; index = tcp port offset (Role.port_offset)
BINDS = tuple(r.value for r in BINDING_ROLES)  # the roles that bind a socket (learner: classic RL only)
LOOPBACK_NAMES = ("localhost", "ip6-localhost")
VLLM_DTYPES = ("float32", "bfloat16")
DEFAULT_BASE_PORT = 27500

# What `up --resume` may change: where and how fast the run goes, never what it trains. A field is
# safe when every epoch trained under the new value is the epoch the old value would have trained
# (up to float summation order); a prefix ending in "." covers a section.
SAFE_ON_RESUME = (
    "run.name",
    "run.epochs",
    "run.workers",
    "run.max_workers",
    "run.run_dir",
    "run.resume",
    "run.stop_grace_s",
    "run.worker_restarts",
    "run.max_restarts",
    "run.standby_core",
    "run.fork_server",
    "transport.",
    "coordinator.heartbeat_interval_s",
    "coordinator.heartbeat_timeout_s",
    "coordinator.max_groups_per_request",
    "worker.prefetch",
    "worker.threads",
    "worker.device",
    "worker.impl",  # the same tokens either way, up to float noise (docs/ENGINES.md)
    "worker.weight_fetch_timeout_s",
    "buffer.",
    "trainer.threads",
    "trainer.device",
    "trainer.world_size",
    "trainer.dist_timeout_s",
    "worker.shm",
    "worker.tensor_parallel_size",
    "trainer.credits",
    "trainer.checkpoint_every",
    "trainer.gradient_checkpointing",  # recomputes the same forward: the same update
    "trainer.impl",  # the same update either way, up to float summation order (docs/LEARNING.md)
    "trainer.micro_batch_tokens",  # micro-batching does not change the update (periodic == sync)
    "publisher.",
    "eval.",  # evaluation never trains (docs/OBSERVE.md)
    "run.log_completions",
    "run.report_to",
    "trainer.keep_checkpoints",
)


class RunSection(Section):
    name: str = Field("run", description="A label for the run (logs, metrics).")
    seed: int = Field(0, description="Seeds prompts, sampling and model init.")
    epochs: int = Field(
        5,
        ge=1,
        description="Number of iteration-epochs. An epoch generates coordinator.groups_per_epoch groups and "
        "publishes one new weight version; it takes one optimizer step, or trainer.num_minibatches x "
        "trainer.num_iterations steps (e.g. DAPO's recipe: 16).",
    )
    mode: Literal["periodic", "sync", "bounded"] = Field(
        "periodic",
        description="periodic: train groups as they arrive; sync: wait for the whole batch; bounded: as periodic, "
        "but epoch e+1 is generated with weights up to run.max_staleness versions old while epoch e trains "
        "(off-policy, corrected by trainer.is_correction: tis unless given when max_staleness > 0; "
        "docs/LEARNING.md).",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="run.mode bounded: k, the most versions a trained sample's weights may lag its epoch's "
        "(v_{e-j}, j <= k; protocol/versions.py within_bound); 0 = on-policy.",
    )
    workers: int = Field(2, ge=0, description="Inference workers `up` starts.")
    max_workers: int = Field(64, ge=0, description="Upper bound of `prl-actors scale` (more is refused).")
    run_dir: str = Field("runs/latest", description="Where logs, metrics, checkpoints go.")
    resume: bool = Field(False, description="Continue from the last checkpoint in run_dir.")
    stop_grace_s: float = Field(
        5.0,
        gt=0,
        description="Stopping: how long `up` waits for actors to exit after a stop request and again "
        "after SIGTERM (then SIGKILL); how long an actor waits for its own thread after a signal.",
    )
    log_completions: int = Field(
        0, ge=0, description="Write this many trained samples per epoch to RUN_DIR/completions.jsonl (0 = none)."
    )
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        [],
        description="Trackers `up` feeds from metrics.jsonl in one thread (wandb offline, mlflow to RUN_DIR/mlruns).",
    )
    worker_restarts: int = Field(
        3,
        ge=0,
        description="A worker that crashes before registering is restarted this many times in a row "
        "(with back-off), then `up` fails with its error.",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="Self-healing: a core actor (coordinator, publisher, buffer, trainer) that crashes once the "
        "run is up (killed by a signal, or exited without a reason of its own) makes `up` restart the core from "
        "the last intact checkpoint, the workers staying up and rejoining; at most this many times in a run, "
        "then `up` fails as with 0 (today's behaviour: a core actor's crash ends the run). docs/ARCHITECTURE.md.",
    )
    standby_core: bool = Field(
        False,
        description="Self-healing: keep a spare core (four processes, their imports done, nothing built, bound "
        "or logged) that a core restart takes instead of starting new processes. With run.fork_server (the "
        "default) new processes are forks that skip the imports too, and a spare saves little (recovery 0.8 vs "
        "0.9 s, `prl-actors bench --only heal`); without it a spare skips ~3 s of imports on 2 busy cores. It "
        "costs four idle processes with torch imported (~0.3 GB each); a new spare starts after each restart.",
    )
    fork_server: bool = Field(
        True,
        description="`up` starts its local actors from one fork server that has imported torch, transformers "
        "and the actors once (prl_actors/launch/zygote.py), instead of one new interpreter per actor importing them "
        "again: a faster start on few cores (measured by `prl-actors bench --only startup`). false: one "
        "`python -m prl_actors.cli.main actor ...` process per actor.",
    )
    max_bad_groups: int = Field(
        3,
        ge=1,
        description="A worker whose groups the buffer or trainer refused this many times (bad content: "
        "non-finite numbers, tokens outside the vocabulary, over-long responses, another prompt, wrong "
        "size, rewards that do not re-score) is expelled for the run: its work is requeued and its name "
        "and key are refused from then on (docs/SECURITY.md).",
    )
    max_group_failures: int = Field(
        3,
        ge=1,
        description="A group whose generation or scoring failed this many times (a worker gave it back "
        "with an exception), or that the trainer could not train this many times (its forward/backward "
        "failed on it alone), is given up: see task.on_error.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_tracker(cls, data: Any) -> Any:
        """report_to: tensorboard (a YAML scalar, a dict from Python) reads as [tensorboard]; a,b as [a, b]."""
        if isinstance(data, dict) and isinstance(data.get("report_to"), str):
            data = {**data, "report_to": [t.strip() for t in data["report_to"].split(",") if t.strip()]}
        return data

    def staleness_bound(self) -> int:
        """k in force: max_staleness under mode bounded, 0 (strict on-policy) otherwise."""
        return self.max_staleness if self.mode == "bounded" else 0


"""trainer.micro_batch_tokens auto on the CPU (and on a device where the memory budget is not used)."""


def bounded_refused(cfg: Config) -> str:
    """Why run.mode bounded cannot run with `cfg` ('' if it can): stale samples need the GRPO learner
    and an importance correction; dynamic sampling and trainer rank groups are not pipelined with it
    yet (evaluation is: the pipeline pauses at an evaluated epoch, coordinator/core.py `_bound`)."""
    if cfg.trainer.learner != "grpo":
        return "needs trainer.learner grpo (stale samples are corrected by the GRPO learner)"
    if cfg.trainer.is_correction == "none" and cfg.run.max_staleness > 0:
        return "trains samples up to run.max_staleness versions old: set trainer.is_correction tis (or mis)"
    if cfg.coordinator.dynamic_sampling:
        return "with coordinator.dynamic_sampling is not supported yet"
    if cfg.trainer.strategy != "single":
        return f"with trainer.strategy {cfg.trainer.strategy} is not supported yet: use strategy single"
    return ""


class Config(Section):
    run: RunSection = RunSection()
    transport: TransportSection = TransportSection()
    coordinator: CoordinatorSection = CoordinatorSection()
    worker: WorkerSection = WorkerSection()
    buffer: BufferSection = BufferSection()
    trainer: TrainerSection = TrainerSection()
    publisher: PublisherSection = PublisherSection()
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    sim: SimSection = SimSection()
    eval: EvalSection = EvalSection()
    env: EnvSection | None = Field(
        None, description="Classic RL through env actors (docs/ENVS.md); present = `up` runs the env run."
    )

    @model_validator(mode="after")
    def _bounded_mode(self) -> Config:
        if self.run.staleness_bound() > 0 and "is_correction" not in self.trainer.model_fields_set:
            self.trainer.is_correction = "tis"  # stale samples need a correction: truncated IS, as peers default
        if self.run.mode == "bounded" and (unsupported := bounded_refused(self)):
            raise ValueError(f"run.mode bounded {unsupported}")
        if self.run.max_staleness and self.run.mode != "bounded":
            raise ValueError(f"run.max_staleness ({self.run.max_staleness}) applies to run.mode bounded only")
        return self

    @model_validator(mode="after")
    def _sync_kl_bounded(self) -> Config:
        """worker.sync_kl_threshold decides when a worker may skip versions: only bounded mode with
        k >= 1 lets it hold older weights (periodic, sync and k = 0 load every version, periodic == sync)."""
        if self.worker.sync_kl_threshold is not None and self.run.staleness_bound() == 0:
            where = "run.max_staleness 0" if self.run.mode == "bounded" else f"run.mode {self.run.mode}"
            raise ValueError(
                f"worker.sync_kl_threshold applies to run.mode bounded with run.max_staleness >= 1 only "
                f"(with {where} every worker loads each version at once): leave it out"
            )
        return self

    @model_validator(mode="after")
    def _verify_single_turn(self) -> Config:
        if self.buffer.verify_rewards and self.task.multi_turn:
            raise ValueError(
                "buffer.verify_rewards re-scores a response with the task's reward; a multi-turn episode's "
                "rewards come from its environment, which the buffer cannot replay: turn one of them off"
            )
        return self

    @model_validator(mode="after")
    def _engine_matches_learner(self) -> Config:
        if (self.worker.engine == "sim") != (self.trainer.learner == "sim"):
            raise ValueError("worker.engine 'sim' and trainer.learner 'sim' go together")
        return self

    @model_validator(mode="after")
    def _multi_turn_engine(self) -> Config:
        if self.task.multi_turn and self.worker.engine == "sim":
            raise ValueError("multi-turn tasks (task.environment, task.tools, guess) need worker.engine torch or vllm")
        return self

    @model_validator(mode="after")
    def _trainable_sampling(self) -> Config:
        if self.trainer.learner == "grpo" and self.worker.sampling.temperature == 0:
            raise ValueError(GREEDY_REFUSED)
        return self

    @model_validator(mode="after")
    def _eval_fits_the_engine(self) -> Config:
        rows = max(self.worker.max_batch_rows, self.worker.group_size)
        if self.eval.every_epochs and self.worker.engine == "sim" and self.eval.samples > rows:
            raise ValueError(f"eval.samples ({self.eval.samples}) exceeds the sim engine's batch of {rows} rows")
        multi_turn = bool(self.task.environment or self.task.tools or self.task.name == "guess")
        if self.eval.every_epochs and self.eval.sampling is not None and (self.worker.engine != "torch" or multi_turn):
            raise ValueError(
                "eval.sampling needs worker.engine torch and single-turn episodes (other engines sample with "
                "worker.sampling); leave eval.sampling out to evaluate with worker.sampling"
            )
        return self

    @model_validator(mode="after")
    def _minibatches_fit(self) -> Config:
        steps = self.trainer.num_minibatches * self.trainer.num_iterations
        if steps > 1 and self.trainer.learner != "grpo":
            raise ValueError("trainer.num_minibatches / num_iterations > 1 need trainer.learner grpo")
        if self.trainer.num_minibatches > self.coordinator.groups_per_epoch:
            raise ValueError(
                f"trainer.num_minibatches ({self.trainer.num_minibatches}) exceeds coordinator.groups_per_epoch "
                f"({self.coordinator.groups_per_epoch}): a minibatch needs at least one group"
            )
        return self

    @model_validator(mode="after")
    def _overlong_within_length(self) -> Config:
        if self.task.overlong_buffer > self.worker.sampling.max_new_tokens:
            raise ValueError(
                f"task.overlong_buffer ({self.task.overlong_buffer}) exceeds worker.sampling.max_new_tokens "
                f"({self.worker.sampling.max_new_tokens})"
            )
        return self

    @model_validator(mode="after")
    def _lora_needs_grpo(self) -> Config:
        if self.trainer.lora is not None and self.trainer.learner != "grpo":
            raise ValueError("trainer.lora needs trainer.learner 'grpo' (the sim learner has no model to adapt)")
        return self

    @model_validator(mode="after")
    def _distributed_trainer(self) -> Config:
        if self.trainer.strategy != "single" and self.trainer.learner != "grpo":
            raise ValueError(f"trainer.strategy {self.trainer.strategy} needs trainer.learner grpo")
        if self.trainer.lora is not None and self.trainer.strategy != "single":
            raise ValueError("trainer.lora with trainer.strategy ddp/fsdp2 is not supported yet (untested): use single")
        if self.worker.tensor_parallel_size > 1 and self.worker.engine != "vllm":
            raise ValueError("worker.tensor_parallel_size > 1 needs worker.engine vllm")
        return self

    @model_validator(mode="after")
    def _vllm_dtype(self) -> Config:
        if self.worker.engine == "vllm" and self.model.dtype not in VLLM_DTYPES:
            raise ValueError(
                f"worker.engine 'vllm' runs model.dtype {' or '.join(VLLM_DTYPES)}, not {self.model.dtype}"
            )
        return self

    @model_validator(mode="after")
    def _limits_and_auth(self) -> Config:
        if self.run.workers > self.run.max_workers:
            raise ValueError(f"run.workers ({self.run.workers}) exceeds run.max_workers ({self.run.max_workers})")
        binds = [self.bind_address(r) for r in self.bound_roles()]
        exposed = [f"{r} binds {a}" for r, a in zip(self.bound_roles(), binds, strict=True) if not is_local(a)]
        if self.transport.auth == "none" and exposed:
            raise ValueError(
                "transport.auth 'none' is allowed only when every bound address is loopback or ipc "
                f"({'; '.join(exposed)}); use the default 'curve' (docs/SECURITY.md)"
            )
        return self

    # --- trust and limits (docs/SECURITY.md) -------------------------------------------------

    def authenticated(self) -> bool:
        """CURVE on every socket (not for inproc: one process, no handshake)."""
        return self.transport.auth == "curve" and self.transport.kind != "inproc"

    def bound_roles(self) -> tuple[str, ...]:
        """The roles that bind a socket in this run: the learner only in a classic-RL (env) run."""
        return BINDS if self.env is not None else tuple(r for r in BINDS if r != "learner")

    def keys_path(self) -> Path:
        return Path(self.transport.keys_dir) if self.transport.keys_dir else Path(self.run.run_dir) / "keys"

    def message_limits(self) -> tuple[int, int]:
        """(control, bulk) frame bounds in bytes: control messages, and the weight-chunk sockets."""
        sample = self.worker.sampling.max_new_tokens * 64 + 256  # token id + logprob + text per token
        control = self.transport.max_message_bytes or (1 << 20) + self.worker.group_size * sample
        return control, max(control, self.publisher.chunk_bytes + (64 << 10))

    def address(self, role: str) -> str:
        """The address `role` binds (and others connect to)."""
        if role in self.transport.addresses:
            return self.transport.addresses[role]
        index = _port_offset(role)
        kind = self.transport.kind
        if kind == "tcp":
            base = DEFAULT_BASE_PORT if self.transport.base_port is None else self.transport.base_port
            return f"tcp://{self.transport.host}:{base + index}"
        if kind == "ipc":
            return f"ipc://{Path(self.run.run_dir).resolve() / 'sockets' / role}"
        return f"inproc://prl-{self.run.name}-{role}"

    def bind_address(self, role: str) -> str:
        """The address `role` binds: its connect address, with the host replaced by * if bind_all."""
        addr = self.address(role)
        if self.transport.bind_all and addr.startswith("tcp://"):
            return "tcp://*:" + addr.rsplit(":", 1)[1]
        return addr

    def dump(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _port_offset(role: str) -> int:
    """`role`'s tcp port offset; a ValueError names the roles that have an address."""
    offset = Role(role).port_offset if role in ROLES else None
    if offset is None:
        raise ValueError(f"{role!r} has no address of its own (roles with one: {', '.join(ROLES)})")
    return offset


def is_local(address: str) -> bool:
    """Can only this host reach `address`? inproc, ipc, or tcp on a loopback address."""
    if not address.startswith("tcp://"):
        return address.startswith(("inproc://", "ipc://"))
    host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def safe_on_resume(field: str) -> bool:
    return any(field == safe or (safe.endswith(".") and field.startswith(safe)) for safe in SAFE_ON_RESUME)


def leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'run.epochs': 5, ...}: every field of a dumped config by its dotted name (a dict field, such
    as transport.addresses, is one value)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and f"{prefix}{key}" != "transport.addresses":
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resume(run: Config, asked: Config) -> None:
    """Refuse (ConfigError, one line naming the fields) a resumed config that would train another
    run than `run`, the one in RUN_DIR/config.yaml; SAFE_ON_RESUME lists what may change."""
    old, new = leaves(run.model_dump(mode="json")), leaves(asked.model_dump(mode="json"))
    keys = list(old) + [k for k in new if k not in old]  # a section set or unset (trainer.lora) changes keys
    changed = [k for k in keys if old.get(k) != new.get(k) and not safe_on_resume(k)]
    if changed:
        what = ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in changed)
        raise ConfigError(
            f"--resume continues the run in RUN_DIR/config.yaml and cannot change {what}; "
            "safe to change: epochs, workers, ports and timeouts, threads, devices (README: Resume)"
        )


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """data[a][b][c] = value for 'a.b.c', making the sections on the way."""
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted}: {key} is not a section")
    node[leaf] = value


def parse_override(item: str) -> tuple[str, Any]:
    """'trainer.lr=3e-4' -> ('trainer.lr', 3e-4): the value is read as YAML, except for a string
    field (`task.system_prompt=... End with #### ...`), whose value is kept exactly as written (YAML
    would cut it at ' #' or refuse 'Answer: give a number')."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if is_text_field(key):
        return key, None if raw.strip() in ("null", "~") and accepts_none(key) else raw
    try:
        if is_list_field(key) and not raw.strip().startswith(("[", "-")) and raw.strip() not in ("null", "~"):
            return key, [yaml.safe_load(part) for part in raw.split(",") if part.strip()]  # a,b = [a, b]
        return key, yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "config"
        hint = nearest_field(where) if err["type"] == "extra_forbidden" else ""
        lines.append(f"{where}: {err['msg']}" + (f" (did you mean {hint}?)" if hint else ""))
    return "; ".join(lines)


# --- field types, for --set values and typo hints ------------------------------------------------


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(T, True) for `T | None`; (annotation, False) otherwise."""
    args = get_args(annotation)
    if type(None) in args and len(args) == 2 and get_origin(annotation) in (Union, types.UnionType):
        return next(a for a in args if a is not type(None)), True
    return annotation, False


def _field(dotted: str) -> Any:
    """The pydantic FieldInfo of a dotted config field, or None (no such field)."""
    model: Any = Config
    info = None
    for part in dotted.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        model = _unwrap_optional(info.annotation)[0]
    return info


def is_text_field(dotted: str) -> bool:
    """Is the field a string (str, str | None, or a Literal of strings)?"""
    info = _field(dotted)
    if info is None:
        return False
    annotation = _unwrap_optional(info.annotation)[0]
    if get_origin(annotation) is Literal:
        return all(isinstance(a, str) for a in get_args(annotation))
    return annotation is str


def is_list_field(dotted: str) -> bool:
    """Is the field a list (`--set run.report_to=tensorboard,wandb` gives one value per comma)?"""
    info = _field(dotted)
    return info is not None and get_origin(_unwrap_optional(info.annotation)[0]) is list


def accepts_none(dotted: str) -> bool:
    info = _field(dotted)
    return info is not None and _unwrap_optional(info.annotation)[1]


# What users of other frameworks call a field (TRL, verl, OpenRLHF): the suggestion by meaning, where
# spelling alone would point elsewhere (`trainer.learning_rate` is closest in spelling to `learner`).
SYNONYMS = {
    "learning_rate": "lr",
    "num_generations": "group_size",
    "n_samples": "group_size",
    "num_samples": "group_size",
    "kl_coef": "beta",
    "kl_beta": "beta",
    "epsilon": "eps_low",
    "clip_range": "eps_low",
    "epsilon_high": "eps_high",
    "clip_grad_norm": "max_grad_norm",
    "grad_clip": "max_grad_norm",
    "max_completion_length": "max_new_tokens",
    "max_tokens": "max_new_tokens",
    "max_response_length": "max_new_tokens",
    "num_epochs": "epochs",
    "num_train_epochs": "epochs",
    "max_steps": "epochs",
    "batch_size": "groups_per_epoch",
    "num_prompts": "groups_per_epoch",
    "model_name_or_path": "path",
    "model_name": "path",
    "dataset": "prompts_file",
    "dataset_path": "prompts_file",
    "output_dir": "run_dir",
    "reward_funcs": "rewards",
    "reward_fn": "reward",
    "num_workers": "workers",
    "logging": "report_to",
}


def nearest_field(dotted: str) -> str:
    """The existing field an unknown dotted name most likely means ('' when none is close): by
    meaning first (SYNONYMS, in this section or another), then by spelling."""
    by_meaning = _synonym(dotted)
    if by_meaning:
        return by_meaning
    *parents, leaf = dotted.split(".")
    model: Any = Config
    if parents:
        info = _field(".".join(parents))
        model = None if info is None else _unwrap_optional(info.annotation)[0]
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    close = difflib.get_close_matches(leaf, list(model.model_fields), n=1, cutoff=0.6)
    return ".".join([*parents, close[0]]) if close else ""


def _synonym(dotted: str) -> str:
    """The field SYNONYMS names for the last part of `dotted`, in its section if it is there, else in
    the one section that has it ('' when none)."""
    *parents, leaf = dotted.split(".")
    meant = SYNONYMS.get(leaf)
    if meant is None:
        return ""
    if parents and _field(".".join([*parents, meant])) is not None:
        return ".".join([*parents, meant])
    sections = [name for name in Config.model_fields if _field(f"{name}.{meant}") is not None]
    if len(sections) != 1:
        sections = [name for name in ("worker.sampling",) if _field(f"{name}.{meant}") is not None] or sections
    return f"{sections[0]}.{meant}" if sections else ""


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML config file's mapping of sections ({} when empty); ConfigError when it is missing or
    holds no mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections")
    return loaded or {}


def validate_config(data: dict[str, Any]) -> Config:
    """A mapping of sections as a Config; ConfigError with one line per problem (as the CLI says it)."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {format_validation_error(exc)}") from None


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config (or the defaults), apply dotted overrides, validate."""
    data = read_config_file(path) if path is not None else {}
    for key, value in (overrides or {}).items():
        set_path(data, key, value)
    return validate_config(data)

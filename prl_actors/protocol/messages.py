"""Every wire message of prl-actors, in one module.

A message is one MessagePack map (frame 0 of a ZeroMQ multipart message), optionally followed by raw
binary frames (tensor bytes). Every message carries the common header fields as typed fields:

    proto    protocol version (int), must equal PROTOCOL_VERSION
    type     the type tag (str), e.g. "register"
    id       message id (str), unique per sender
    sender   the sending actor's name (str), e.g. "worker-3"
    epoch    the iteration-epoch this message belongs to (int, -1 when none)
    version  the policy weight version it belongs to (int, -1 when none)

Replies carry `reply_to` = the id of the request they answer. docs/PROTOCOL.md is the reference.
"""

from __future__ import annotations

import itertools
import os
import secrets
from enum import StrEnum

import msgspec

PROTOCOL_VERSION = 4  # 4: a worker's `register` carries its generation contract (refused without it)
NONE = -1  # epoch / version "not applicable"


# --- the closed vocabularies of the protocol (decoded as enums: an unknown value is `malformed`) --


class DocEnum(StrEnum):
    """A str enum whose members carry a one-line description (docs/PROTOCOL.md is generated from it)."""

    description: str

    def __new__(cls, value: str, description: str = "") -> DocEnum:
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.description = description
        return obj


class Role(DocEnum):
    """What a peer is. Every actor registers with its role; the CLI speaks as `operator`."""

    COORDINATOR = "coordinator", "epoch state machine, membership, the epoch's work queue"
    PUBLISHER = "publisher", "stores the newest weights, serves snapshots"
    BUFFER = "buffer", "admits each group of the open epoch once, streams it to the trainer"
    TRAINER = "trainer", "accumulates gradients, one optimizer step per epoch"
    WORKER = "worker", "generates and scores groups with one weight version"
    ENV = "env", "runs N Gymnasium environments: batched reset/step, or acts on them with a policy copy"
    LEARNER = "learner", "classic RL: owns a vector env's slots on env actors, trains (PPO), serves its policy"
    OPERATOR = "operator", "the CLI: status, scale, stop"

    @property
    def port_offset(self) -> int | None:
        """The tcp port `base_port + offset` this role's address uses; None: it has no address of its own
        (an env actor connects to the learner; the operator connects to the coordinator)."""
        return _PORT_OFFSETS.get(self)

    @property
    def binds(self) -> bool:
        """Does this role bind a socket (the others connect)? The learner binds only in a classic-RL run."""
        return self in _BINDING

    @classmethod
    def of_name(cls, name: str) -> Role | None:
        """The role an actor or key name belongs to ("worker-3" -> WORKER), or None if its prefix is no role."""
        return _BY_VALUE.get(role_prefix(name))


def role_prefix(name: str) -> str:
    """The role part of an actor or key name: everything before the first '-' ("worker-h-12" -> "worker").
    The one place that parses names; `Role.of_name` turns it into a role."""
    return name.split("-", 1)[0]


# index = tcp port offset: fixed forever (a run's addresses are derived from base_port and these).
_PORT_OFFSETS = {
    r: i for i, r in enumerate((Role.COORDINATOR, Role.PUBLISHER, Role.BUFFER, Role.TRAINER, Role.WORKER, Role.LEARNER))
}
_BINDING = frozenset({Role.COORDINATOR, Role.PUBLISHER, Role.BUFFER, Role.LEARNER})
_BY_VALUE = {r.value: r for r in Role}
ADDRESSED_ROLES = tuple(sorted(_PORT_OFFSETS, key=_PORT_OFFSETS.__getitem__))  # the roles with an address, by offset
BINDING_ROLES = tuple(r for r in ADDRESSED_ROLES if r.binds)  # the roles that bind a socket, by port offset


class ErrorCode(DocEnum):
    """`error.code`: why a message was not handled."""

    MALFORMED = "malformed", "not MessagePack / missing fields / wrong types"
    BAD_PROTOCOL = "bad_protocol", "wrong protocol version"
    UNKNOWN_TYPE = "unknown_type", "type tag not in this protocol"
    UNEXPECTED = "unexpected", "valid message, but not one this actor handles"
    REJECTED = "rejected", "valid and handled, but refused (see detail)"
    FORBIDDEN = "forbidden", "the sender's key may not send this (role, a name it does not cover, unassigned)"
    OVER_LIMIT = "over_limit", "exceeds a configured limit (e.g. `scale` above run.max_workers)"


class RejectReason(DocEnum):
    """`group_ack.reason`: why the buffer refused a group (checked in this order)."""

    WRONG_EPOCH = "wrong_epoch", "no epoch open, or the group's epoch is ahead of the open one"
    EPOCH_CLOSED = "epoch_closed", "the group's epoch is over"
    STALE_VERSION = "stale_version", "generated with other weights than the epoch's (off-policy)"
    UNKNOWN_GROUP = "unknown_group", "group id outside 0..B-1"
    BAD_GROUP_SIZE = "bad_group_size", "not exactly G samples"
    DUPLICATE = "duplicate", "(epoch, group id) was already accepted"
    BUFFER_FULL = "buffer_full", "buffer.max_groups groups already wait for the trainer"
    EXPELLED = "expelled", "the sender was expelled for refused groups (run.max_bad_groups)"
    NON_FINITE = "non_finite", "a reward or log-prob is NaN or infinite"
    BAD_TOKENS = "bad_tokens", "a token id outside the vocabulary, or log-probs not one per token"
    TOO_LONG = "too_long", "a response longer than the run's max_new_tokens"
    WRONG_PROMPT = "wrong_prompt", "the prompt (text or token ids) is not the one assigned"
    BAD_TEXT = "bad_text", "a sample's text is not what its token ids decode to"
    REWARD_MISMATCH = "reward_mismatch", "buffer.verify_rewards: a reported reward differs from the re-scored one"
    TRAIN_FAILED = "train_failed", "the trainer's forward/backward failed on this group alone"
    DROPPED = "dropped", "the coordinator gave up on this group (task.on_error skip): the epoch trains without it"


class NoWorkReason(DocEnum):
    """`no_work.reason`: why a work request got nothing."""

    NO_EPOCH = "no_epoch", "no epoch is open (wait for epoch_start)"
    STALE_VERSION = "stale_version", "fetch the epoch's weights (header version) first"
    QUEUE_EMPTY = "queue_empty", "every group is handed out; you will be nudged if one returns"
    FAIR_SHARE = "fair_share", "you hold your share of the epoch's work; ask again when one of yours is done"
    DONE = "done", "the run is over"


class Phase(DocEnum):
    """The coordinator's epoch state machine (`status.state`); transitions in coordinator/phase.py."""

    WAITING_WEIGHTS = "waiting_weights", "no weights for the next epoch yet (or no buffer)"
    OPENING = "opening", "epoch_open sent, waiting for the buffer's ack"
    RUNNING = "running", "handing out the epoch's groups"
    TRAINING = "training", "every group accepted; waiting for the step's weights"
    DONE = "done", "the run is over"


def _id_prefix() -> str:
    return f"{os.getpid():x}.{secrets.token_hex(3)}"  # pids repeat across hosts and containers


_counter = itertools.count()
_PREFIX = _id_prefix()


def _reset_ids() -> None:
    """A forked process (`up`'s fork server forks every actor) draws its own prefix: else every
    actor forked from one parent would number its messages alike."""
    global _counter, _PREFIX
    _counter, _PREFIX = itertools.count(), _id_prefix()


os.register_at_fork(after_in_child=_reset_ids)


def new_id() -> str:
    """A message id unique across processes, also on other hosts and in containers, where pids repeat
    (pid + 24 random bits + counter, a fresh prefix in a forked child): replies and `prl-actors
    replay` match ids across actors."""
    return f"{_PREFIX}-{next(_counter)}"


class Msg(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=False):
    proto: int = PROTOCOL_VERSION
    id: str = msgspec.field(default_factory=new_id)
    sender: str = ""
    epoch: int = NONE
    version: int = NONE


# --- membership (any actor -> Coordinator) -------------------------------------------------------


class GenerationContract(msgspec.Struct, kw_only=True):
    """What a worker generates under (runtime/contract.py): its sampling settings, group size and token
    limits, and the identities of its model and task. A worker registers with its own; the coordinator
    refuses one that differs from the run's in any field and sends the run's in Welcome."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    stop: list[str]
    max_new_tokens: int
    group_size: int
    max_turns: int
    max_turn_tokens: int
    model: str  # "hf:<sha256 of config.json + tokenizer files, 16 hex>", "builtin:<key>" or "sim:<key>"
    model_dtype: str
    task: str  # "<task.name>:<items>:<sha256 of every (prompt, answer), 16 hex>"


class Register(Msg, tag="register", kw_only=True):
    """Join the run as a member of `role` (not operator). Reply: Welcome; Error (rejected) when a
    live member of another process holds the name, or when a worker's `contract` is missing or
    differs from the run's; Shutdown when the run is over."""

    role: Role
    pid: int = 0
    host: str = ""
    contract: GenerationContract | None = None  # a worker's own (required of workers); other roles: none


class Welcome(Msg, tag="welcome", kw_only=True):
    """Reply to Register: the run's current state and the addresses to talk to."""

    reply_to: str
    run_id: str
    mode: str
    group_size: int
    groups_per_epoch: int
    heartbeat_interval_s: float
    publisher_addr: str
    buffer_addr: str
    contract: GenerationContract | None = None  # the run's generation contract (None: a run that has none)


class Heartbeat(Msg, tag="heartbeat", kw_only=True):
    """Liveness; `version` is the weight version the sender holds; `refused`: how many peers and
    frames the sender has refused so far (failed handshakes, forbidden, malformed). Reply: HeartbeatAck."""

    busy_groups: list[int] = []
    refused: int = 0


class HeartbeatAck(Msg, tag="heartbeat_ack", kw_only=True):
    """Reply to Heartbeat; `epoch`/`version` are the open epoch and its version. `known` is False
    when the coordinator does not know the sender (e.g. it timed out): the sender must Register again.
    `newest` / `step_kls`: the weights news of run.mode bounded (as in EpochStart)."""

    reply_to: str
    known: bool = True
    newest: int = NONE
    step_kls: list[float] = []


class Leave(Msg, tag="leave", kw_only=True):
    """Graceful leave; the sender's outstanding groups go back to the queue. Reply: Ack."""

    reason: str = ""


class GiveBack(Msg, tag="give_back", kw_only=True):
    """Worker -> Coordinator: generating or scoring these held groups failed (`error`: the exception
    in one line); requeue them now. A group given back run.max_group_failures times is given up
    (task.on_error). Reply: Ack."""

    groups: list[int]
    error: str = ""


class Ack(Msg, tag="ack", kw_only=True):
    """Generic positive reply."""

    reply_to: str


class Error(Msg, tag="error", kw_only=True):
    """Reply to a message that could not be decoded or handled."""

    reply_to: str = ""
    code: ErrorCode
    detail: str


# --- epochs and work (Coordinator <-> workers, Coordinator <-> Buffer) ----------------------------


class EpochStart(Msg, tag="epoch_start", kw_only=True):
    """Coordinator -> every member: epoch `epoch` is open and bound to weights `version`.
    Under run.mode bounded (k >= 1; -1 and [] otherwise): `newest` is the newest published version and
    `step_kls` the trainer's KL(v_i || v_{i+1}) of the steps that made the versions after the floor up
    to `newest` (the last one made `newest`; -1.0 where not known yet): a worker's divergence estimate
    for `worker.sync_kl_threshold` (weights/pulls.py)."""

    groups: int
    newest: int = NONE
    step_kls: list[float] = []


class WorkRequest(Msg, tag="work_request", kw_only=True):
    """Worker -> Coordinator: give me up to `max_groups` groups. `version` is the version the worker
    holds; work of epoch e is given only to a worker that holds v_e. Reply: WorkAssign or NoWork."""

    max_groups: int = 1
    eval_ok: bool = False  # the engine is idle and may take eval prompts (EvalAssign) if no training work is left


class Prompt(msgspec.Struct, kw_only=True):
    """One group to generate. In a WorkAssign, `ticket` is the coordinator's proof that this group of
    this epoch was assigned to this worker (protocol/tickets.py); the worker returns it with the group."""

    group_id: int
    prompt: str
    answer: str = ""
    ticket: bytes = b""
    item: int = -1  # the row's index in the task's data (rewards read its columns there); -1: unknown


class WorkAssign(Msg, tag="work_assign", kw_only=True):
    """Reply to WorkRequest: generate these groups with weights `version` for `epoch`."""

    reply_to: str
    prompts: list[Prompt]


class NoWork(Msg, tag="no_work", kw_only=True):
    """Reply to WorkRequest: nothing for you now. Retry after `retry_after_s`, or on EpochStart."""

    reply_to: str
    reason: NoWorkReason
    retry_after_s: float = 0.05


class EvalAssign(Msg, tag="eval_assign", kw_only=True):
    """Reply to a WorkRequest with `eval_ok` when the epoch's training queue is empty: generate `samples`
    completions for each of these eval prompts with weights `version` (the header's `epoch` names the
    evaluation) and send them back as EvalResult. Never trained (docs/OBSERVE.md)."""

    reply_to: str
    prompts: list[Prompt]
    samples: int


# eval prompt ids (Prompt.group_id, EvalGroup.prompt_id): EVAL_ID_BASE + index, apart from training group ids
EVAL_ID_BASE = 1 << 20


class EvalGroup(msgspec.Struct, kw_only=True):
    """One eval prompt's k completions and their rewards (the task's reward)."""

    prompt_id: int
    prompt: str
    answer: str
    completions: list[str]
    rewards: list[float]
    error: str = ""  # the engine failed on this prompt (no completions; counted as not passed)


class EvalResult(Msg, tag="eval_result", kw_only=True):
    """Worker -> Coordinator: the finished eval prompts of an EvalAssign of `epoch`/`version`; any eval
    prompt the sender held for it and did not return goes back to the eval queue. Reply: Ack."""

    groups: list[EvalGroup]


class EpisodeStats(msgspec.Struct, kw_only=True):
    """A multi-turn episode's counts (the trainer's `episode/*` metrics, docs/OBSERVE.md): its model
    turns, the tool calls it made and how many of them were answered with an error."""

    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0


class Sample(msgspec.Struct, kw_only=True):
    """One generated response. Token ids exclude the prompt; logprobs are per response token.

    Multi-turn episodes (docs/TASKS.md, "Writing an environment"): `token_ids` is the whole episode
    after the shared prompt, the model's turns and the environment's / tools' observation tokens
    interleaved, and `loss_mask` has one entry per token: 1 = the model sampled it (trained, and it
    has a behaviour log-prob), 0 = the environment wrote it (in the context, never in the loss).
    `logprobs` then holds one entry per model token only (len = sum(loss_mask)). An empty
    `loss_mask` means every token is the model's (single-turn). Checked at decode (the codec's
    bound): a mask of another length than `token_ids`, or a value other than 0/1, is `malformed`.
    `reward` is the weighted sum of `reward_parts` when the task has several rewards (task.rewards);
    `reward_parts` is empty for a task with its one default reward."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    reward: float
    finished: bool = True
    loss_mask: list[int] = msgspec.field(default_factory=list)
    reward_parts: dict[str, float] = msgspec.field(default_factory=dict)  # name -> value (task.rewards), unweighted
    episode: EpisodeStats | None = None  # multi-turn: the episode's turns and tool calls (None: single-turn)

    def __post_init__(self) -> None:
        if self.loss_mask and len(self.loss_mask) != len(self.token_ids):
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {len(self.token_ids)} tokens")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask entries must be 0 (environment token) or 1 (model token)")

    def model_mask(self) -> list[int]:
        """One 0/1 per token of `token_ids` (all 1 for a single-turn sample)."""
        return self.loss_mask or [1] * len(self.token_ids)


class Group(msgspec.Struct, kw_only=True):
    """G samples for one prompt, all generated with one weight version."""

    group_id: int
    prompt: str
    prompt_ids: list[int]
    samples: list[Sample]
    worker: str
    gen_s: float = 0.0


class GroupResult(Msg, tag="group_result", kw_only=True):
    """Worker -> Buffer: a finished, scored group of `epoch` generated with `version`, with the
    assignment's `ticket` (the buffer admits only groups the coordinator assigned to the sender).
    Reply: GroupAck (or Error `forbidden` without a valid ticket). `follows`: how many more groups
    the sender finished together with this one and sends right after it (a fact about its burst,
    used only to tell the trainer early that the epoch is generated: TrainGroup.generated)."""

    group: Group
    ticket: bytes = b""
    follows: int = 0


class GroupAck(Msg, tag="group_ack", kw_only=True):
    """Buffer -> worker: `accepted`, or refused with `reason`."""

    reply_to: str
    group_id: int
    accepted: bool
    reason: RejectReason | None = None


class EpochOpen(Msg, tag="epoch_open", kw_only=True):
    """Coordinator -> Buffer: accept groups 0..groups-1 of `epoch` generated with `version`; the
    assignment tickets of this run are keyed with `ticket_key` (empty on the buffer -> trainer stream).
    Reply: Ack."""

    groups: int
    ticket_key: bytes = b""
    id_bound: int = 0
    """Dynamic sampling (coordinator -> buffer only; 0 = off): group ids run over 0..id_bound-1, the
    epoch closes with EpochClose, and a group whose rewards are all equal is accepted, not streamed."""


class GroupAccepted(Msg, tag="group_accepted", kw_only=True):
    """Buffer -> Coordinator: group `group_id` of `epoch` was accepted (so it is never reassigned).
    `informative`: its rewards are not all equal (dynamic sampling trains only those)."""

    group_id: int
    worker: str
    informative: bool = True


class EpochClose(Msg, tag="epoch_close", kw_only=True):
    """Coordinator -> Buffer, dynamic sampling only: the epoch's sampling is over; `groups` groups
    (its informative ones) are to be trained out of `generated` accepted. Reply: Ack. The buffer then
    ends the trainer's stream with EpochComplete(groups)."""

    groups: int
    generated: int


class GroupRefused(Msg, tag="group_refused", kw_only=True):
    """Trainer -> Buffer (its forward/backward failed on this group alone) and Buffer -> Coordinator
    (a group refused for its content, or by the trainer): group `group_id` of `epoch` from `worker`
    is not trained; requeue it for another worker. `expel`: the worker reached run.max_bad_groups
    refusals and is expelled for the run."""

    group_id: int
    worker: str
    reason: RejectReason
    detail: str = ""
    expel: bool = False


class GroupDropped(Msg, tag="group_dropped", kw_only=True):
    """Coordinator -> Buffer: group `group_id` of `epoch` failed generation or scoring
    run.max_group_failures times and task.on_error is skip: the epoch completes without it (the
    buffer's EpochComplete counts the groups actually sent). Reply: Ack."""

    group_id: int
    reason: str = ""


class Shutdown(Msg, tag="shutdown", kw_only=True):
    """Coordinator -> every member: the run is over (or being stopped); exit cleanly."""

    reason: str = ""


# --- Buffer -> Trainer stream (credit-based flow control) -----------------------------------------


class Credit(Msg, tag="credit", kw_only=True):
    """Trainer -> Buffer: the trainer can take `n` more groups (cumulative credit is added)."""

    n: int


class TrainGroup(Msg, tag="train_group", kw_only=True):
    """Buffer -> Trainer: one accepted group of `epoch`/`version`. `seq` is its arrival index.
    `generated`: when it was sent, every group of the epoch was in the buffer or on its way in a
    worker's burst (GroupResult.follows): generation is over, so the trainer trains the rest in
    micro-batches as large as its budget allows, and one sharing the host's cores with its workers
    may take them all (the trainer's schedule: trainer/scheduling.py; docs/PROTOCOL.md says why)."""

    seq: int
    group: Group
    generated: bool = False


class EpochComplete(Msg, tag="epoch_complete", kw_only=True):
    """Buffer -> Trainer: all `groups` groups of `epoch` were sent. `gen_s`: from the buffer's
    EpochOpen to the last accepted group (the epoch's generation phase, as the buffer saw it)."""

    groups: int
    gen_s: float = 0.0
    generated: int = 0  # dynamic sampling: groups generated, kept or not (0: off, = groups)


class StepDone(Msg, tag="step_done", kw_only=True):
    """Trainer -> Coordinator: the optimizer step of `epoch` produced weights `version`, and
    the publisher holds them. Carries the epoch's metrics."""

    metrics: dict[str, float] = {}


# --- weights (Trainer -> Publisher -> workers) ----------------------------------------------------


class TensorMeta(msgspec.Struct, kw_only=True, array_like=True):
    name: str
    dtype: str
    shape: list[int]
    nbytes: int


class WeightsBegin(Msg, tag="weights_begin", kw_only=True):
    """Start of a weight transfer for `version`: the tensors in order, then `chunks` WeightChunk
    messages whose raw bytes (frame 1) concatenate to the tensors' bytes in that order. A fetch reply
    to a worker that proved it shares the publisher's host may instead name `shm_path`, a file in
    /dev/shm holding those bytes (`chunks` 0); the worker validates it (prl_actors/weights/shm.py)."""

    tensors: list[TensorMeta]
    total_bytes: int
    chunks: int
    reply_to: str = ""
    shm_path: str = ""


class WeightChunk(Msg, tag="weight_chunk", kw_only=True):
    """One chunk of a transfer (frame 1 carries `nbytes` raw bytes at `offset`)."""

    transfer: str
    index: int
    offset: int
    nbytes: int


class WeightsEnd(Msg, tag="weights_end", kw_only=True):
    """End of transfer `transfer`. Reply (Trainer's upload): WeightsStored."""

    transfer: str


class WeightsStored(Msg, tag="weights_stored", kw_only=True):
    """Publisher -> Trainer: `version` is stored and served."""

    reply_to: str


class FetchWeights(Msg, tag="fetch_weights", kw_only=True):
    """Worker -> Publisher: send me the current weights (if newer than `version` I hold, or any when
    `version` is -1). Reply: WeightsBegin + chunks + WeightsEnd, or Error (code rejected, none yet).
    `host_proof`: the token of the publisher's host file, when the worker could read it (same host):
    the publisher may then answer with a shared-memory snapshot (WeightsBegin.shm_path)."""

    host_proof: str = ""


class WeightsAvailable(Msg, tag="weights_available", kw_only=True):
    """Publisher -> Coordinator: weights `version` are stored and can be fetched."""


# --- environments (Learner <-> env actors; docs/ENVS.md) --------------------------------------
#
# Arrays travel as raw payload frames: `arrays` lists one TensorMeta (name, numpy dtype name, shape,
# nbytes) per frame, in frame order; the bytes are C-contiguous, little-endian (prl_actors/classic/envkit/arrays.py).
# Header `epoch` is the acting round and `version` the policy version where they apply.


class EnvReset(Msg, tag="env_reset", kw_only=True):
    """Learner -> env actor: from now on own exactly `owned` env slots (drop the others, create the missing
    ones of `env_id`), and reset `slots` now, each with its seed (-1: unseeded). Reply: EnvObs."""

    env_id: str
    owned: list[int]
    slots: list[int]
    seeds: list[int]


class EnvObs(Msg, tag="env_obs", kw_only=True):
    """Reply to EnvReset: array `obs` [len(slots), *obs_shape], the reset observations of `slots`."""

    reply_to: str
    slots: list[int]
    arrays: list[TensorMeta]


class EnvStep(Msg, tag="env_step", kw_only=True):
    """Learner -> env actor: step `slots` with array `actions` [len(slots), *action_shape]; `step` numbers
    the vector step. A slot whose episode ended at the previous step is reset instead and its action
    ignored (Gymnasium's NEXT_STEP autoreset). Reply: EnvStepResult."""

    step: int
    slots: list[int]
    arrays: list[TensorMeta]


class EnvStepResult(Msg, tag="env_step_result", kw_only=True):
    """Reply to EnvStep: arrays `obs` [n, *obs_shape], `reward` float64 [n], `terminated` bool [n],
    `truncated` bool [n] for `slots` (n = len(slots))."""

    reply_to: str
    step: int
    slots: list[int]
    arrays: list[TensorMeta]


class EnvAct(Msg, tag="env_act", kw_only=True):
    """Learner -> env actor (acting mode): from round `epoch` on, act with your policy copy on exactly
    `owned` slots, `steps` steps per segment; create and reset the new `slots` with `seeds` (-1: unseeded)."""

    env_id: str
    owned: list[int]
    slots: list[int]
    seeds: list[int]
    steps: int


class Segment(Msg, tag="segment", kw_only=True):
    """Env actor -> learner: `steps` steps of `slots` acted in round `epoch` with policy `version`.
    Arrays (T = steps, n = len(slots)): obs [T, n, *obs], actions [T, n, *act], logprobs [T, n] (of the
    acting policy), rewards [T, n], terminated [T, n], truncated [T, n], valid [T, n] (False on autoreset
    steps), next_obs [n, *obs]. `sync_kl`: the divergence estimate made before acting (-1: none made);
    `synced`: weights were fetched for it. Reply: Ack, or Error rejected (late round, slots not owned)."""

    slots: list[int]
    steps: int
    episode_returns: list[float] = []
    episode_lengths: list[int] = []
    sync_kl: float = -1.0
    synced: bool = False
    arrays: list[TensorMeta]


class PolicyCheck(Msg, tag="policy_check", kw_only=True):
    """Env actor -> learner, after sending round `epoch`'s segment: array `obs` [K, *obs] holds my recent
    observations; `version` is the policy I hold. Reply, once the update that consumed round `epoch` is
    published: PolicyLogits."""

    arrays: list[TensorMeta]


class PolicyLogits(Msg, tag="policy_logits", kw_only=True):
    """Reply to PolicyCheck: array `logits` [K, n_actions] of the learner's policy `version` on the asked
    observations; `epoch` is the round that version acts in. The env actor decides whether to fetch."""

    reply_to: str
    arrays: list[TensorMeta]


# --- introspection (CLI -> Coordinator) ----------------------------------------------------------


class StatusRequest(Msg, tag="status_request", kw_only=True):
    """Anyone -> Coordinator. Reply: Status."""


class MemberInfo(msgspec.Struct, kw_only=True):
    name: str
    role: Role
    version: int
    outstanding: int
    last_seen_s: float
    refused: int = 0  # refusals the member reported in its last heartbeat


class Status(Msg, tag="status", kw_only=True):
    reply_to: str
    state: Phase
    mode: str
    groups_per_epoch: int
    groups_done: int
    groups_outstanding: int
    epochs_total: int
    members: list[MemberInfo]
    desired_workers: int = -1
    publisher_addr: str = ""
    buffer_addr: str = ""
    waiting_for: str = ""  # why the run is stalled, when it is (empty otherwise)
    refused: dict[str, int] = {}  # the coordinator's own refusals by kind (auth, forbidden, malformed, ...)
    notices: list[str] = []  # the run's last notices (groups given up, workers expelled), oldest first
    notices_total: int = 0  # notices so far (the list holds the last few): a client prints the new ones
    eval: dict[str, float] = {}  # the latest finished evaluation: epoch, version, eval_pass@k, eval_mean@k


class Scale(Msg, tag="scale", kw_only=True):
    """CLI -> Coordinator: the wanted number of workers. `up` (the launcher) polls Status and starts
    or stops worker processes to match. Reply: Ack."""

    workers: int


class RequestStop(Msg, tag="request_stop", kw_only=True):
    """CLI -> Coordinator: stop the run (broadcast Shutdown). Reply: Ack."""

    reason: str = ""


Message = (
    Register
    | Welcome
    | Heartbeat
    | HeartbeatAck
    | Leave
    | GiveBack
    | Ack
    | Error
    | EpochStart
    | WorkRequest
    | WorkAssign
    | NoWork
    | EvalAssign
    | EvalResult
    | GroupResult
    | GroupAck
    | EpochOpen
    | GroupAccepted
    | GroupRefused
    | GroupDropped
    | EpochClose
    | Shutdown
    | Credit
    | TrainGroup
    | EpochComplete
    | StepDone
    | WeightsBegin
    | WeightChunk
    | WeightsEnd
    | WeightsStored
    | FetchWeights
    | WeightsAvailable
    | StatusRequest
    | Status
    | Scale
    | RequestStop
    | EnvReset
    | EnvObs
    | EnvStep
    | EnvStepResult
    | EnvAct
    | Segment
    | PolicyCheck
    | PolicyLogits
)

MESSAGE_TYPES: dict[str, type[Msg]] = {t.__struct_config__.tag: t for t in Message.__args__}
TAGS: dict[type[Msg], str] = {t: name for name, t in MESSAGE_TYPES.items()}


def tag_of(msg: Msg | type[Msg]) -> str:
    """The wire type tag of a message or message class, e.g. "work_request"."""
    return TAGS[msg if isinstance(msg, type) else type(msg)]

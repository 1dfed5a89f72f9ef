"""One trainer rank's GRPO learner: its share of each round, the epoch's sums over the group, one step.

Rank 0 splits each round of arriving groups into one share per rank (`partition`, balanced by token
count, a group's samples split across ranks where whole groups cannot balance the round); every rank
forward/backwards its share as one micro-batch (`run_round`), gradients summed, never normalised.
At the step (`_synchronise`, called by GRPOLearner.step before it scales):
* the epoch's stats (token count included) are all-reduced, so every rank divides by the same total
  and the update equals world_size 1's, up to float summation order;
* ddp: the summed gradients are all-reduced (SUM) once, in flat buckets. DDP's Reducer is not used:
  it syncs in every backward, and ranks here run different numbers of micro-batches, with one sync
  per epoch instead (the same collective);
* fsdp2: parameters are `fully_shard`ed (one unit per decoder layer plus the root); each round's
  backward reduce-scatters (SUM: divide factor 1) into the sharded gradients, so nothing is left.
  Every forward all-gathers, so every rank runs exactly one forward/backward per round: a rank whose
  share is empty runs a zero-loss pass (`_idle_pass`).
Then every rank clips (the norm over the whole model) and steps once: the replicas (ddp) or the shards
(fsdp2) stay equal to one process's weights.

Checkpoints: ddp and single write the ordinary checkpoint (rank 0). fsdp2 writes DIR/sharded (every
rank's shards and optimizer state, torch.distributed.checkpoint, reshardable on load) and a
consolidated Hugging Face export in DIR/model gathered on rank 0.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import torch
import torch.distributed as dist

from prl_actors.data import position
from prl_actors.model.builtin import quiet_progress
from prl_actors.sections import ConfigError
from prl_actors.trainer.rank_group import Joined, Piece, RankEnv
from prl_actors.training import checkpoint
from prl_actors.training.grpo import EpochStats, GRPOLearner, Norm, published
from prl_actors.training.lora import TOKENIZER_FILES

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group
    from prl_actors.training.settings import LearnerSettings

SUMS = (
    *("groups", "samples", "tokens", "reward_sum", "correct"),
    *("loss_sum", "kl_sum", "clipped", "diff_tokens", "diff_sum", "trained_tokens", "ratio_sum"),
    *("is_tokens", "is_sum", "is_corrected"),
    *("clipped_low", "clipped_high", "entropy_sum", "entropy_tokens"),
)
NORM = ("tokens", "sequences", "samples")
BUCKET_BYTES = 32 << 20
SHARDED = "sharded"


def group_cost(g: Group) -> int:
    """What a group costs to train, in tokens: its prompt (once, shared) and every response."""
    return len(g.prompt_ids) + sum(len(s.token_ids) for s in g.samples)


def whole(g: Group) -> Piece:
    """All of `g` as one piece."""
    return Piece(group=g, rewards=[s.reward for s in g.samples])


def partition(groups: list[Group], n: int) -> list[list[Piece]]:
    """n shares of `groups`, balanced by `group_cost`: whole groups first (longest first onto the
    least-loaded rank, ties to the lowest rank), then, while that pays (at most 2 (n - 1) times), the
    busiest rank hands the last samples of one of its groups to the least busy one: where that cuts
    the larger of the two loads by more than the prompt the second piece encodes again (a round of one
    group on two ranks; three groups, one long). Deterministic; each share keeps arrival order, a split
    group's pieces in sample order."""
    loads = [0] * n
    shares: list[list[tuple[int, Piece]]] = [[] for _ in range(n)]  # (arrival index, piece)
    for i in sorted(range(len(groups)), key=lambda i: (-group_cost(groups[i]), i)):
        r = min(range(n), key=lambda r: (loads[r], r))
        loads[r] += group_cost(groups[i])
        shares[r].append((i, whole(groups[i])))
    for _ in range(2 * (n - 1)):
        heavy = max(range(n), key=lambda r: (loads[r], -r))
        light = min(range(n), key=lambda r: (loads[r], r))
        split = _best_split(shares[heavy], loads[heavy], loads[light])
        if split is None:
            break
        j, keep, moved = split
        i, piece = shares[heavy][j]
        head, tail = _cut(piece, keep)
        shares[heavy][j] = (i, head)
        shares[light].append((i, tail))
        loads[heavy] -= moved
        loads[light] += moved + len(piece.group.prompt_ids)
    return [[p for _, p in sorted(share, key=lambda x: (x[0], x[1].first))] for share in shares]


def _best_split(share: list[tuple[int, Piece]], heavy: int, light: int) -> tuple[int, int, int] | None:
    """(piece index in `share`, samples it keeps, response tokens it hands over) of the cut that leaves
    the smaller larger-load of the two ranks, if that is below `heavy` by more than the prompt repeated
    (ties: the first piece, the most samples kept)."""
    best: tuple[int, int, int, int] | None = None  # (larger load after, j, keep, moved)
    for j, (_, piece) in enumerate(share):
        lens = [len(s.token_ids) for s in piece.group.samples]
        prompt, moved = len(piece.group.prompt_ids), 0
        for keep in range(len(lens) - 1, 0, -1):
            moved += lens[keep]  # the response tokens of samples keep.. (the cut hands them over)
            span = max(heavy - moved, light + moved + prompt)
            if heavy - span > prompt and (best is None or span < best[0]):
                best = (span, j, keep, moved)
    return None if best is None else best[1:]


def _cut(piece: Piece, keep: int) -> tuple[Piece, Piece]:
    """`piece` as its first `keep` samples and the rest (each with the whole group's rewards)."""
    g = piece.group
    head = msgspec.structs.replace(g, samples=g.samples[:keep])
    tail = msgspec.structs.replace(g, samples=g.samples[keep:])
    return (
        Piece(group=head, rewards=piece.rewards, first=piece.first),
        Piece(group=tail, rewards=piece.rewards, first=piece.first + keep),
    )


def on_rank_device(settings: LearnerSettings, env: RankEnv) -> LearnerSettings:
    """trainer.device `cuda` means cuda:LOCAL_RANK on a rank (one device per rank)."""
    if settings.trainer.device != "cuda":
        return settings
    return settings.with_trainer(device=f"cuda:{env.local_rank}")


def all_reduce_stats(stats: EpochStats, group: Any = None) -> None:
    """Sum every running sum of `stats` over the group (and the max of diff_max), in place."""
    sums = torch.tensor([float(getattr(stats, k)) for k in SUMS], dtype=torch.float64)  # [len(SUMS)]
    dist.all_reduce(sums, group=group)
    peak = torch.tensor(
        [stats.diff_max, stats.ratio_max, -stats.ratio_min, stats.is_max, -stats.is_min], dtype=torch.float64
    )  # [5]
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    for key, value in zip(SUMS, sums.tolist(), strict=True):
        setattr(stats, key, value if isinstance(getattr(stats, key), float) else round(value))
    stats.diff_max, stats.ratio_max, stats.ratio_min = peak[0].item(), peak[1].item(), -peak[2].item()
    stats.is_max, stats.is_min = peak[3].item(), -peak[4].item()


def all_reduce_norm(norm: Norm, group: Any = None) -> None:
    """Sum the minibatch's normaliser counts over the group, in place (every rank divides alike)."""
    counts = torch.tensor([getattr(norm, k) for k in NORM], dtype=torch.float64)  # [3]
    dist.all_reduce(counts, group=group)
    for key, value in zip(NORM, counts.tolist(), strict=True):
        setattr(norm, key, round(value))


def all_reduce_grads(params: list[torch.Tensor], group: Any = None, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Sum every parameter's gradient over the group (a missing one counts as zeros), in flat buckets."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    for p in params:
        grad = p.grad
        assert grad is not None  # every missing one was zeros above
        if bucket and (bucket[0].dtype != grad.dtype or _nbytes(bucket) >= bucket_bytes):
            _reduce_bucket(bucket, group)
            bucket = []
        bucket.append(grad)
    if bucket:
        _reduce_bucket(bucket, group)


def _nbytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _reduce_bucket(grads: list[torch.Tensor], group: Any) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])  # [sum of numels]
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


class RankLearner(GRPOLearner):
    """GRPOLearner on one rank of the trainer's group (`strategy` ddp or fsdp2); rank 0's commands
    drive it (trainer/distributed.py)."""

    def __init__(self, settings: LearnerSettings, model_dir: Path | str | None, joined: Joined) -> None:
        super().__init__(on_rank_device(settings, joined.env), model_dir)
        self.rank, self.world_size, self.group = joined.env.rank, joined.env.world_size, joined.compute
        self.strategy = settings.trainer.strategy
        self._pieces: dict[int, Piece] = {}  # id(piece.group) -> piece, during run_round
        if self.strategy not in ("ddp", "fsdp2"):
            raise ConfigError(f"a trainer rank needs strategy ddp or fsdp2, not {self.strategy}")
        self._broadcast_initial()
        if self.strategy == "fsdp2":
            self._shard()

    def _broadcast_initial(self) -> None:
        """Every rank starts from rank 0's weights (a model built on each host may differ in the last bit)."""
        for t in self.policy.state_dict().values():
            dist.broadcast(t.data, src=0, group=self.group)
        if self.tri.reference is not None:
            self.tri.reference.load_state_dict(self.policy.state_dict())

    def _shard(self) -> None:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(self.group, self.device.type)
        units = [*decoder_layers(self.policy), self.policy]
        for unit in units:
            fully_shard(unit, mesh=mesh)
        for unit in units:  # per unit (the root's setting does not reach its children): sums, not means,
            unit.set_gradient_divide_factor(1.0)  # type: ignore[operator]
            unit.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]  # as plain SUM (gloo: no PREMUL_SUM)
        self.optimizer = _rebuilt(self.optimizer, self.policy.parameters())

    # --- the epoch -----------------------------------------------------------------------------

    def run_round(self, share: list[Piece]) -> None:
        """Forward/backward this rank's share of a round as one micro-batch (fsdp2: exactly one pass).
        A group split across ranks counts once (on the rank holding its first sample); its samples'
        advantages come from the whole group's rewards (`_group_rewards`)."""
        for p in share:
            self.stats.add_rewards([s.reward for s in p.group.samples], whole=p.first == 0)
        self._pieces = {id(p.group): p for p in share}
        try:
            if any(s.token_ids for p in share for s in p.group.samples):
                self._pending = [p.group for p in share]
                self._flush()
            elif self.strategy == "fsdp2":
                self._idle_pass()
        finally:
            self._pieces = {}

    def _group_rewards(self, group: Group) -> tuple[list[float], int]:
        """A piece's k samples take their slice of the whole group's advantages (both impls)."""
        piece = self._pieces.get(id(group))
        if piece is None:
            return super()._group_rewards(group)
        return piece.rewards, piece.first

    def _idle_pass(self) -> None:
        """A zero-loss forward/backward: joins the round's all-gathers and reduce-scatters, adds nothing."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)  # [1, 1]
        with self._autocast():
            logits = self.policy(input_ids=ids).logits  # [1, 1, V]
        (logits.float().sum() * 0.0).backward()

    def _synchronise(self) -> None:
        """Once per epoch: a rank group runs num_minibatches = num_iterations = 1 (config.py refuses more)."""
        self._fold_stats()
        all_reduce_stats(self.stats, self.group)
        all_reduce_norm(self.norm, self.group)
        if self.strategy == "ddp":
            all_reduce_grads([p for p in self.policy.parameters() if p.requires_grad], self.group)

    # --- state out and in ------------------------------------------------------------------------

    def weights(self) -> dict[str, torch.Tensor]:
        """Rank 0: the full policy (gathered under fsdp2: every rank must call); others: {}."""
        if self.strategy == "ddp":
            return super().weights() if self.rank == 0 else {}
        full = self._full_state()
        return {name: published(t, self.dtype) for name, t in full.items()}

    def _full_state(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full: dict[str, torch.Tensor] = get_model_state_dict(self.policy, options=options)  # type: ignore[assignment]
        return full

    def save_checkpoint(self, path: Path) -> None:
        """ddp: rank 0 writes the ordinary checkpoint. fsdp2 (every rank must call): DIR/sharded from
        every rank, then rank 0 writes the consolidated model and, last, trainer_state.pt."""
        path = Path(path)
        if self.strategy == "ddp":
            if self.rank == 0:
                super().save_checkpoint(path)
            return
        import torch.distributed.checkpoint as dcp

        dcp.save(self._sharded_state(), checkpoint_id=str(path / SHARDED))
        full = self._full_state()
        if self.rank == 0:
            self._export(path, full)

    def _sharded_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.policy, self.optimizer)
        return {"model": model, "optim": optim}

    def _export(self, path: Path, full: dict[str, torch.Tensor]) -> None:
        (path / checkpoint.STATE_FILE).unlink(missing_ok=True)
        with quiet_progress():
            self.policy.save_pretrained(path / checkpoint.MODEL_DIR, state_dict=full)
        for name in TOKENIZER_FILES:
            if (self.model_dir / name).is_file():
                shutil.copy2(self.model_dir / name, path / checkpoint.MODEL_DIR / name)
        position.save(path, self.data_identity, self.version)
        extra = {"lr_horizon": self.horizon}
        torch.save({"version": self.version, "strategy": "fsdp2", "extra": extra}, path / checkpoint.STATE_FILE)

    def load_checkpoint(self, path: Path) -> None:
        """Every rank reads the checkpoint at `path` (one filesystem, or one shared by the hosts)."""
        path = Path(path)
        if not (path / checkpoint.STATE_FILE).is_file():
            raise FileNotFoundError(f"{path} is not a complete checkpoint (no {checkpoint.STATE_FILE})")
        state = torch.load(path / checkpoint.STATE_FILE, map_location="cpu", weights_only=True)
        kind = state.get("strategy", "single")
        if (kind == "fsdp2") != (self.strategy == "fsdp2"):
            raise ConfigError(f"checkpoint {path} was written by strategy {kind}, this run is {self.strategy}")
        if self.strategy == "ddp":
            super().load_checkpoint(path)
            return
        self._load_sharded(path / SHARDED)
        self.version = int(state["version"])
        self.horizon = int(state.get("extra", {}).get("lr_horizon", self.horizon))

    def _load_sharded(self, where: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._sharded_state()
        dcp.load(state, checkpoint_id=str(where))
        set_state_dict(self.policy, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _rebuilt(old: torch.optim.Optimizer, params: Any) -> torch.optim.Optimizer:
    """The same optimizer class and settings over `params` (the old one held the unsharded ones)."""
    import inspect

    accepted = inspect.signature(type(old)).parameters
    return type(old)(params, **{k: v for k, v in old.defaults.items() if k in accepted})


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (Hugging Face names their class in `_no_split_modules`)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]

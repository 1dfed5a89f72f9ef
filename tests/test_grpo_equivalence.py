"""Arrival order and micro-batching do not change the update (the periodic == sync invariant)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from msgspec.structs import replace

from prl_actors.config import Config
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.model.builtin import load_model
from prl_actors.protocol.messages import Group
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import prompts, random_rewards, tiny_model

pytestmark = pytest.mark.fast

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0=", "20+1=", "9+9="]


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path, list[Group]]:
    cfg, model_dir = tiny_model(tmp_path_factory.mktemp("grpo"), trainer__beta=0.05)
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    return cfg, model_dir, random_rewards(engine.generate(prompts(TEXTS), 4))


def in_dtype(cfg: Config, dtype: str) -> Config:
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": dtype})})


def train_once(cfg: Config, model_dir: Path, groups: list[Group], **trainer: object) -> GRPOLearner:
    cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update=trainer)})
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    learner.step()
    return learner


def master(learner: GRPOLearner) -> dict[str, torch.Tensor]:
    """The learner's own (master) weights, not the copy cast to model.dtype for the workers."""
    return {name: t.detach().clone() for name, t in learner.policy.state_dict().items()}


def assert_same_weights(a: GRPOLearner, b: GRPOLearner, atol: float) -> None:
    wa, wb = master(a), master(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.allclose(wa[name], wb[name], atol=atol, rtol=0), name


@pytest.mark.parametrize(("dtype", "atol"), [("float64", 1e-9), ("float32", 1e-5), ("bfloat16", 1e-5)])
def test_arrival_order_and_micro_batches_give_the_same_weights(rollouts, dtype: str, atol: float) -> None:
    """Exact in float64. In float32 only summation-order rounding differs; AdamW's first step,
    g / (|g| + 1e-8), can magnify it for near-zero gradient entries to a few 1e-6 (measured 8e-8
    here), hence 1e-5, 100x below the largest update (~lr = 1e-3).

    bfloat16: the master weights, their gradients and AdamW stay float32 and only the forward runs
    in bfloat16 (autocast). Each group's forward/backward is the same whatever the order, so only
    the float32 sum of the per-group gradients is reordered: the float32 bound (1e-5) holds, and
    was measured 2e-9. A bfloat16 master (the old code) gave 9.8e-4 against an update of 1.2e-3.
    Different micro-batch sizes are not compared in bfloat16: a batch of other shape rounds
    differently in bfloat16 compute (measured 2e-3 = 2 x lr: AdamW's first step flips the sign of
    near-zero entries), a property of bfloat16 arithmetic that periodic == sync does not depend
    on (both modes feed groups one by one when micro_batch_groups is 1, the default)."""
    cfg, model_dir, groups = rollouts
    cfg = in_dtype(cfg, dtype)
    shuffled = groups[:]
    random.Random(1).shuffle(shuffled)
    assert shuffled != groups
    in_order = train_once(cfg, model_dir, groups, micro_batch_groups=1)
    others = [train_once(cfg, model_dir, shuffled, micro_batch_groups=1)]
    if dtype != "bfloat16":
        others.append(train_once(cfg, model_dir, groups, micro_batch_groups=len(groups)))
        others.append(train_once(cfg, model_dir, shuffled, micro_batch_groups=4))  # 4 + a partial 2 flushed by step
        others.append(train_once(cfg, model_dir, shuffled, micro_batch_tokens=60))  # by token budget
    initial, trained = master(GRPOLearner(learner_settings(cfg), model_dir)), master(in_order)
    moved = max((trained[k].double() - initial[k].double()).abs().max().item() for k in initial)
    assert moved > 100 * atol  # it did learn, far beyond the tolerance
    for other in others:
        assert_same_weights(in_order, other, atol=atol)


def test_bfloat16_trains_a_float32_master_and_publishes_bfloat16(rollouts, tmp_path: Path) -> None:
    cfg, model_dir, groups = rollouts
    learner = train_once(in_dtype(cfg, "bfloat16"), model_dir, groups)
    assert {p.dtype for p in learner.policy.parameters()} == {torch.float32}
    assert all(p.grad is None for p in learner.policy.parameters())  # zeroed after the step
    states = [s for s in learner.optimizer.state.values()]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)
    published = learner.weights()
    assert {t.dtype for t in published.values()} == {torch.bfloat16}  # what the engines run in
    for name, t in master(learner).items():
        assert torch.equal(published[name], t.to(torch.bfloat16)), name
    learner.save_checkpoint(tmp_path / "ckpt")  # the checkpoint keeps the float32 master: exact resume
    restored = GRPOLearner(learner_settings(in_dtype(cfg, "bfloat16")), model_dir)
    restored.load_checkpoint(tmp_path / "ckpt")
    assert_same_weights(learner, restored, atol=0)


def epoch_gradient(cfg: Config, model_dir: Path, groups: list[Group], **trainer: object) -> dict[str, torch.Tensor]:
    """The scaled, clipped gradient the epoch's one optimizer step receives (captured at the step)."""
    cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update=trainer)})
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    seen: dict[str, torch.Tensor] = {}
    real_step = learner.optimizer.step

    def capture(*args: object, **kwargs: object) -> object:
        seen.update({n: p.grad.detach().clone() for n, p in learner.policy.named_parameters() if p.grad is not None})
        return real_step(*args, **kwargs)

    learner.optimizer.step = capture  # type: ignore[method-assign]
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    learner.step()
    return seen


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_packed_and_unpacked_layouts_give_the_same_gradient(rollouts, dtype: str) -> None:
    """The shared-prompt layout computes the unpacked layout's gradient. Compared before AdamW: its
    first step, g / (|g| + 1e-8), turns float noise on near-zero entries into update differences of
    up to 1e-5 (measured 1.75e-5 in float32 on this VM; and HF's RMSNorm computes in float32 even
    for a float64 model, so float64 is not exact either). Measured: 7e-8 (float64) and 4e-7 (float32)
    of the largest entry; one prompt token dropped from the packed layout gives 1.07."""
    cfg, model_dir, groups = rollouts
    cfg = in_dtype(cfg, dtype)
    packed = epoch_gradient(cfg, model_dir, groups, shared_prompt=True)
    unpacked = epoch_gradient(cfg, model_dir, groups, shared_prompt=False)
    assert packed.keys() == unpacked.keys() and packed
    scale = max(g.abs().max().item() for g in packed.values())
    assert scale > 0
    worst = max((packed[n] - unpacked[n]).abs().max().item() for n in packed) / scale
    assert worst < 1e-5, worst


def test_step_metrics_and_version(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    learner.begin_epoch(0, len(groups))
    stats = learner.accumulate(groups[0])
    assert stats["tokens"] == sum(len(s.token_ids) for s in groups[0].samples)
    for g in groups[1:]:
        learner.accumulate(g)
    metrics = learner.step()
    rewards = [s.reward for g in groups for s in g.samples]
    assert learner.version == 1 and metrics["version"] == 1
    assert metrics["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert metrics["accuracy"] == pytest.approx(sum(r >= 1 for r in rewards) / len(rewards))
    assert metrics["samples"] == len(rewards)
    assert metrics["tokens"] == sum(len(s.token_ids) for g in groups for s in g.samples)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before the first step
    assert metrics["clip_frac"] == 0.0  # strict on-policy: ratio == 1
    assert 0.0 <= metrics["logprob_diff_mean"] <= metrics["logprob_diff_max"] < 1e-5  # engine == trainer
    assert metrics["grad_norm"] > 0
    for key in ("loss", "response_len", "groups"):
        assert key in metrics


def test_second_epoch_has_kl_and_versions_count_up(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    learner = train_once(cfg, model_dir, groups)
    learner.begin_epoch(1, len(groups))
    for g in groups:
        learner.accumulate(g)
    metrics = learner.step()
    assert learner.version == 2
    assert metrics["kl"] > 0


def test_checkpoint_round_trip(rollouts, tmp_path: Path) -> None:
    cfg, model_dir, groups = rollouts
    learner = train_once(cfg, model_dir, groups)
    learner.save_checkpoint(tmp_path / "ckpt")
    restored = GRPOLearner(learner_settings(cfg), model_dir)
    restored.load_checkpoint(tmp_path / "ckpt")
    assert restored.version == 1
    assert_same_weights(learner, restored, atol=0)
    for lrn in (learner, restored):  # the optimizer state came back too: the next step agrees
        lrn.begin_epoch(1, len(groups))
        for g in groups:
            lrn.accumulate(g)
        lrn.step()
    assert_same_weights(learner, restored, atol=1e-6)
    assert (tmp_path / "ckpt" / "model" / "tokenizer.json").is_file()


def test_incomplete_checkpoint_is_refused(rollouts, tmp_path: Path) -> None:
    cfg, model_dir, _ = rollouts
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        GRPOLearner(learner_settings(cfg), model_dir).load_checkpoint(tmp_path)


# --- the gradient itself, against a full-batch loss written out independently ----------------------


def captured_gradients(learner: GRPOLearner) -> dict[str, torch.Tensor]:
    """Filled with every parameter's .grad as the optimizer is about to step (after the learner's
    normalisation and clipping)."""
    grads: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in learner.policy.named_parameters()}

    def hook(optimizer: torch.optim.Optimizer, *_: object) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grads[names[id(p)]] = p.grad.detach().clone()

    learner.optimizer.register_step_pre_hook(hook)
    return grads


def nucleus_logprob(logits: torch.Tensor, target: int, temperature: float, top_p: float) -> torch.Tensor:
    """log q(target) for one row of logits [V]: softmax(z / T) on the smallest set of tokens (by
    descending probability) whose mass reaches top_p, plus the target; written out by hand."""
    z = logits / temperature
    probs = torch.softmax(z.detach(), dim=-1).tolist()
    keep, mass = [], 0.0
    for k in sorted(range(len(probs)), key=lambda k: -probs[k]):
        if keep and mass >= top_p:
            break
        keep.append(k)
        mass += probs[k]
    idx = torch.tensor(sorted(set(keep) | {target}))
    return z[target] - torch.logsumexp(z[idx], dim=0)


def plain_advantages(rewards: list[float]) -> list[float]:
    if len(set(rewards)) == 1:
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return [(r - mean) / (std + 1e-6) for r in rewards]


def full_batch_loss(policy, reference, groups: list[Group], temperature: float, top_p: float, beta: float):  # type: ignore[no-untyped-def]
    """The GRPO objective of the whole epoch in one forward: one right-padded row [prompt | response]
    per sample, loss = (1 / N) * sum over all N response tokens of -A * ratio + beta * k3 (ratio = 1
    in value, gradient d logp, strict on-policy)."""
    rows = [
        (g.prompt_ids, s.token_ids, a)
        for g in groups
        for s, a in zip(g.samples, plain_advantages([s.reward for s in g.samples]), strict=True)
    ]
    width = max(len(p) + len(r) for p, r, _ in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    for b, (p, r, _) in enumerate(rows):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        mask[b, : len(p) + len(r)] = 1
    logits = policy(input_ids=ids, attention_mask=mask).logits  # [B, T, V]
    with torch.no_grad():
        ref_logits = reference(input_ids=ids, attention_mask=mask).logits  # [B, T, V]
    terms = []
    for b, (p, r, adv) in enumerate(rows):
        for j, token in enumerate(r):
            at = len(p) - 1 + j  # the position whose logits predict r[j]
            logp = nucleus_logprob(logits[b, at], token, temperature, top_p)
            ref = nucleus_logprob(ref_logits[b, at], token, temperature, top_p)
            k3 = torch.exp(ref - logp) - (ref - logp) - 1
            terms.append(-adv * torch.exp(logp - logp.detach()) + beta * k3)
    return torch.stack(terms).sum() / len(terms), len(terms)


def test_epoch_gradient_equals_a_full_batch_token_mean_loss(tmp_path: Path) -> None:
    """The gradient a periodic epoch hands to the optimizer (groups fed one by one, in an arrival
    order of their own) is the gradient of the full-batch token-mean GRPO loss, KL term included,
    in float64. Epoch 0 is stepped first so that policy != reference and the KL term has a gradient.

    Tolerance, 1e-6 relative to the largest gradient entry: Qwen2's RMSNorm computes in float32 even
    in a float64 model, so its backward rounds each token's incoming gradient to float32, and the
    different batch shapes of the two sides (packed groups vs one padded batch) sum those gradients
    in different orders; measured 1e-7 relative. That is 1e4 times below a normalisation off by a
    single token (a 1/(N+1) ~ 1e-2 relative error, asserted below), and dropping the 1/N
    altogether (a factor N ~ 100) misses by ~1e8 times the tolerance."""
    temperature, top_p, beta = 0.7, 0.9, 0.3
    cfg, model_dir = tiny_model(
        tmp_path,
        model__dtype="float64",
        trainer__beta=beta,
        trainer__max_grad_norm=1e12,  # no clipping: the raw gradient reaches the optimizer
        worker__sampling__temperature=temperature,
        worker__sampling__top_p=top_p,
    )
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    groups = random_rewards(engine.generate(prompts(TEXTS), 4))
    groups[0].samples = [replace(s, reward=0.9) for s in groups[0].samples]  # an all-equal group counts too
    learner = train_once(cfg, model_dir, groups)
    policy = load_model(model_dir, dtype="float64")
    policy.load_state_dict(learner.policy.state_dict())  # the weights the second epoch starts from
    reference = load_model(model_dir, dtype="float64")

    grads = captured_gradients(learner)
    learner.begin_epoch(1, len(groups))
    for g in reversed(groups):
        learner.accumulate(g)
    learner.step()

    loss, n_tokens = full_batch_loss(policy, reference, groups, temperature, top_p, beta)
    loss.backward()
    expected = {name: p.grad for name, p in policy.named_parameters() if p.grad is not None}
    assert grads.keys() == expected.keys()
    got = torch.cat([grads[k].flatten() for k in expected])
    want = torch.cat([expected[k].flatten() for k in expected])
    tol = 1e-6 * want.abs().max().item()
    assert tol > 0
    assert (got - want).abs().max().item() < tol
    one_token_off = want * n_tokens / (n_tokens + 1)  # what a normalisation off by one token gives
    assert (one_token_off - want).abs().max().item() > 1000 * tol


@pytest.mark.parametrize(("reward", "size"), [(0.9, 6), (1 / 3, 8)])
def test_an_all_equal_group_gives_exactly_zero_gradient(rollouts, reward: float, size: int) -> None:
    """beta = 0: a group whose rewards are all equal (any value) carries no policy-gradient signal
    (0.9 x 6 and 1/3 x 8 used to leave float residue that became |A| of 0.056 and 0.029)."""
    cfg, model_dir, groups = rollouts
    cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"beta": 0.0})})
    samples = [replace(groups[1].samples[i % len(groups[1].samples)], reward=reward) for i in range(size)]
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    grads = captured_gradients(learner)
    learner.begin_epoch(0, 1)
    learner.accumulate(replace(groups[1], samples=samples))
    learner.step()
    assert grads and all(torch.equal(g, torch.zeros_like(g)) for g in grads.values())


def test_the_token_budget_decides_when_queued_groups_are_trained(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    cost = [len(g.prompt_ids) + sum(len(s.token_ids) for s in g.samples) for g in groups]
    budget = cost[0] + cost[1]  # the first two groups fill one micro-batch exactly
    learner = GRPOLearner(
        learner_settings(
            cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"micro_batch_tokens": budget})})
        ),
        model_dir,
    )
    learner.begin_epoch(0, len(groups))
    learner.accumulate(groups[0])
    assert learner.pending == 1 and learner.stats.tokens == 0  # queued, nothing computed yet
    learner.accumulate(groups[1])
    assert learner.pending == 0 and learner.stats.tokens > 0  # the budget was reached: trained
    learner.accumulate(groups[2])
    assert learner.flush() == 1 and learner.pending == 0  # what the trainer does when nothing else waits

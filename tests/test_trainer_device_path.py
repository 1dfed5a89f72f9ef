"""The accelerator training path (trainer.impl gpu) on CPU: its device-free proxies and its maths.

Proxies (issue 37): on a GPU every dispatched aten op is a kernel launch and every
`_local_scalar_dense` / nonzero / host read a sync, so both are counted on CPU around the trainer's
accumulate + flush (+ step) at the chat-h128-L4 shape (hidden 128, 4 layers), one micro-batch,
responses of up to 48 tokens. The gpu impl must dispatch as many ops for 64 samples as for 16
(ratio <= 1.25, and < 1 op per added sample) and sync at most a constant number of times per
epoch; the cpu impl, measured in the same test, shows what a per-sample loop and per-micro-batch
reads look like to the same counter (its ops grow with the samples, its syncs pass 10).

Maths: impl gpu gives the cpu impl's losses, metrics (clip_frac_low / high and entropy among them)
and weights (float32 / float64) across loss types, beta > 0, shared and unshared prompts, several
minibatches and iterations, engine-mismatch correction, the entropy bonus with top-p (the full-logits
fallback), a clip that acts on both sides, and the periodic == sync invariant (arrival order and
micro-batching do not change the update).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from prl_actors.config import Config, load_config
from prl_actors.launch.topology import learner_settings
from prl_actors.model.builtin import load_model
from prl_actors.model.memory import BUDGET_MAX, BUDGET_MIN, activation_bytes_per_token, token_budget
from prl_actors.protocol.messages import Group, Sample
from prl_actors.training import device_forward
from prl_actors.training.behaviour import Behaviour
from prl_actors.training.device_batch import PAD, allowed_mask, build, pack_rows
from prl_actors.training.device_learner import resolve_impl
from prl_actors.training.dispatch_count import DispatchCount
from prl_actors.training.grpo import GRPOLearner
from prl_actors.training.losses import host_advantages, scaled_advantages
from prl_actors.training.packing import collate_unpacked, response_logprobs
from tests.test_grpo_equivalence import captured_gradients

VOCAB = 384


def qwen2_dir(path: Path, hidden: int, layers: int, heads: int, kv: int) -> Path:
    """A random-init Qwen2 of the chat shape's family (tied embeddings, GQA, vocab 384)."""
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=True, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen2_dir(tmp_path_factory.mktemp("h128L4"), 128, 4, 4, 2)  # chat-h128-L4


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen2_dir(tmp_path_factory.mktemp("h32L2"), 32, 2, 4, 2)


def groups_of(n_samples: int, max_new: int = 48, prompt: int = 40, size: int = 8, seed: int = 0) -> list[Group]:
    """Groups of `size` samples: random prompt and response tokens (lengths 1..max_new), mixed 0/1
    rewards, engine log-probs near a uniform model's, one sample per group unfinished."""
    rng = random.Random(seed)
    out = []
    for g in range(n_samples // size):
        samples = []
        for i in range(size):
            ids = [rng.randrange(VOCAB) for _ in range(rng.randint(1, max_new))]
            logprobs = [-math.log(VOCAB) + rng.uniform(-0.3, 0.3) for _ in ids]
            reward = float(i % 2) if g % 3 else float(rng.random() < 0.5)
            samples.append(Sample(text="", token_ids=ids, logprobs=logprobs, reward=reward, finished=i != 0))
        p = [rng.randrange(VOCAB) for _ in range(prompt + rng.randint(0, 20))]
        out.append(Group(group_id=g, prompt="", prompt_ids=p, samples=samples, worker="w"))
    return out


def config(**trainer: object) -> Config:
    base: dict[str, object] = {
        "worker.group_size": 8,
        "worker.sampling.max_new_tokens": 48,
        "trainer.beta": 0.05,
        "trainer.lr": 1e-3,
        "trainer.micro_batch_tokens": 1 << 20,  # one micro-batch
    }
    base.update({f"trainer.{k}": v for k, v in trainer.items() if not k.startswith("_")})
    base.update({k[1:].replace("__", "."): v for k, v in trainer.items() if k.startswith("_")})
    return load_config(None, base)


def epoch(learner: GRPOLearner, groups: list[Group], index: int = 0) -> dict[str, float]:
    learner.begin_epoch(index, len(groups))
    for g in groups:
        learner.accumulate(g)
    learner.flush()
    return learner.step()


# --- the proxies -----------------------------------------------------------------------------------


def counted(model_dir: Path, impl: str, n_samples: int) -> tuple[DispatchCount, DispatchCount]:
    """(accumulate + flush, the step) of a second epoch (the first warms every lazy path up)."""
    groups = groups_of(n_samples, prompt=124)
    learner = GRPOLearner(learner_settings(config(impl=impl, beta=0.02)), model_dir)
    epoch(learner, groups)
    learner.begin_epoch(1, len(groups))
    with DispatchCount() as train:
        for g in groups:
            learner.accumulate(g)
        learner.flush()
    with DispatchCount() as step:
        learner.step()
    return train, step


def test_gpu_impl_dispatches_a_flat_number_of_ops_and_no_sync_per_micro_batch(chat_dir: Path) -> None:
    """Measured here (CPU, this shape): gpu 1,571 ops and 0 syncs for 16 and for 64 samples (1,546
    before the clip sides and the entropy metric), the step 74 ops and 1 sync (the metrics' one
    read); cpu 3,043 -> 8,830 ops and 32 -> 44 syncs."""
    gpu16, step16 = counted(chat_dir, "gpu", 16)
    gpu64, step64 = counted(chat_dir, "gpu", 64)
    assert gpu64.ops / gpu16.ops <= 1.25, (gpu16.ops, gpu64.ops, gpu64.top())
    assert gpu64.ops - gpu16.ops < 48, (gpu16.by_op - gpu64.by_op, gpu64.by_op - gpu16.by_op)  # < 1 per sample
    assert gpu16.syncs == gpu64.syncs == 0, (gpu16.by_sync, gpu64.by_sync)
    assert gpu64.syncs + step64.syncs <= 10 and step64.syncs == step16.syncs, step64.by_sync
    cpu16, _ = counted(chat_dir, "cpu", 16)
    cpu64, _ = counted(chat_dir, "cpu", 64)
    assert cpu64.ops / cpu16.ops > 1.25 and cpu64.syncs > 10  # what the counter sees in per-sample code


def test_the_counter_sees_syncs_and_host_reads() -> None:
    t = torch.arange(6.0)
    with DispatchCount() as count:
        float(t.sum())
        t[t > 2].tolist()
        _ = t.numpy()
        if t.max() > 1:
            pass
    assert count.syncs == 5, count.by_sync  # _local_scalar_dense x 2, nonzero, tolist, numpy
    assert count.ops >= 5


# --- the gpu impl computes the cpu impl's update ------------------------------------------------------

METRICS = (
    "loss",
    "kl",
    "clip_frac",
    "clip_frac_low",
    "clip_frac_high",
    "entropy",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "grad_norm",
    "logprob_diff_max",
    "logprob_diff_mean",
    "is_ratio_mean",
    "is_ratio_min",
    "is_ratio_max",
    "is_corrected_frac",
    "tokens",
    "optimizer_steps",
)


def assert_same(a: GRPOLearner, b: GRPOLearner, ma: dict[str, float], mb: dict[str, float], atol: float) -> None:
    for key in METRICS:
        assert math.isclose(ma[key], mb[key], rel_tol=1e-5, abs_tol=1e-6) or (
            math.isnan(ma[key]) and math.isnan(mb[key])
        ), (key, ma[key], mb[key])
    wa, wb = a.policy.state_dict(), b.policy.state_dict()
    for name in wa:
        assert torch.allclose(wa[name], wb[name], atol=atol, rtol=0), (name, (wa[name] - wb[name]).abs().max())


CASES: list[dict[str, object]] = [
    {"loss_type": "dapo"},
    {"loss_type": "grpo", "shared_prompt": False},
    {"loss_type": "gspo", "num_minibatches": 2, "num_iterations": 2, "is_correction": "tis"},
    {"loss_type": "cispo", "mask_truncated_completions": True, "kl_estimator": "k1"},
    {"loss_type": "dr_grpo", "is_correction": "mis", "is_cap": 1.2, "scale_rewards": "batch"},
    {"loss_type": "bnpo", "entropy_coef": 0.01, "_worker__sampling__top_p": 0.9, "_model__dtype": "float64"},
    {"loss_type": "dapo", "lora": {"r": 4}, "gradient_checkpointing": True},  # reference = adapter off
    {"loss_type": "dapo", "num_iterations": 3, "eps_low": 0.01, "eps_high": 0.01},  # the clip acts: low and high
]


def case_id(case: dict[str, object]) -> str:
    return str(case["loss_type"]) + ("-lora" if "lora" in case else "-clip" if "eps_low" in case else "")


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_gpu_impl_equals_cpu_impl(small_dir: Path, case: dict[str, object]) -> None:
    """Two epochs (the second has a KL and, with M x mu > 1, a frozen epoch-start policy). Weights
    within 1e-5 (float32: summation order, magnified on near-zero entries by AdamW's first step, as
    in test_grpo_equivalence), 1e-9 in float64."""
    groups = groups_of(32, max_new=12, seed=3)
    learners = {impl: GRPOLearner(learner_settings(config(impl=impl, **case)), small_dir) for impl in ("cpu", "gpu")}
    atol = 1e-9 if case.get("_model__dtype") == "float64" else 1e-5
    for index in range(2):
        metrics = {impl: epoch(learner, groups, index) for impl, learner in learners.items()}
        assert_same(learners["cpu"], learners["gpu"], metrics["cpu"], metrics["gpu"], atol)
    assert metrics["gpu"]["kl"] > 0 and metrics["gpu"]["optimizer_steps"] >= 1
    assert metrics["gpu"]["entropy"] > 0
    if "eps_low" in case:  # measured: low 0.31, high 0.34 of the tokens (each side, not only their sum)
        low, high = metrics["gpu"]["clip_frac_low"], metrics["gpu"]["clip_frac_high"]
        assert low > 0.1 and high > 0.1 and math.isclose(low + high, metrics["gpu"]["clip_frac"], rel_tol=1e-9)


@pytest.mark.parametrize("impl", ["cpu", "gpu"])
def test_the_entropy_metric_is_the_mean_token_entropy_over_trained_tokens(small_dir: Path, impl: str) -> None:
    """entropy = mean over the trained tokens (truncated samples masked out) of -(p log p).sum(-1),
    p = softmax(logits / T) of the epoch-start weights, computed here one sample at a time."""
    groups = groups_of(16, max_new=12, seed=2)
    cfg = config(impl=impl, mask_truncated_completions=True, _worker__sampling__temperature=0.7)
    got = epoch(GRPOLearner(learner_settings(cfg), small_dir), groups)["entropy"]
    model = load_model(small_dir, dtype="float64")
    values = []
    with torch.no_grad():
        for g in groups:
            for smp in (smp for smp in g.samples if smp.finished):
                ids = torch.tensor([g.prompt_ids + smp.token_ids])
                logits = model(input_ids=ids).logits[0, len(g.prompt_ids) - 1 : -1] / 0.7  # [L, V]
                p = torch.softmax(logits, -1)
                values.append(-(p * p.log()).sum(-1))
    want = torch.cat(values).mean().item()
    assert math.isclose(got, want, rel_tol=1e-5), (got, want)


def test_gpu_impl_gradient_equals_cpu_impl_on_long_rows(chat_dir: Path) -> None:
    """Long rows (the cpu impl takes its bucketed block attention there): the gradient the step
    receives, before AdamW, within 1e-5 of its largest entry."""
    groups = groups_of(24, prompt=124)
    grads = {}
    for impl in ("cpu", "gpu"):
        learner = GRPOLearner(learner_settings(config(impl=impl)), chat_dir)
        grads[impl] = captured_gradients(learner)
        epoch(learner, groups)
    scale = max(g.abs().max().item() for g in grads["cpu"].values())
    worst = max((grads["cpu"][n] - grads["gpu"][n]).abs().max().item() for n in grads["cpu"]) / scale
    assert worst < 1e-5, worst


def test_gpu_impl_keeps_periodic_equal_to_sync(small_dir: Path) -> None:
    """Arrival order and micro-batching (one group at a time, by a token budget, all at once) give
    the same weights on the gpu impl, as on the cpu impl (test_grpo_equivalence)."""
    groups = groups_of(48, max_new=12, seed=5)
    shuffled = groups[:]
    random.Random(1).shuffle(shuffled)
    runs = []
    for order, extra in ((groups, {"micro_batch_groups": 1}), (shuffled, {"micro_batch_tokens": 150}), (shuffled, {})):
        learner = GRPOLearner(learner_settings(config(impl="gpu", num_minibatches=2, **extra)), small_dir)
        learner.begin_epoch(0, len(order))
        for g in order:
            learner.accumulate(g)
        learner.step()
        runs.append(learner)
    for other in runs[1:]:
        for name, w in runs[0].policy.state_dict().items():
            assert torch.allclose(w, other.policy.state_dict()[name], atol=1e-5, rtol=0), name


# --- the pieces -------------------------------------------------------------------------------------


def test_chunked_head_equals_log_softmax_with_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four chunks of 100 rows (the last partial) give log_softmax's values and gradients (float64)."""
    monkeypatch.setattr(device_forward, "VOCAB_CHUNK", 100)
    torch.manual_seed(0)
    head = torch.nn.Linear(16, VOCAB, bias=True, dtype=torch.float64)
    hidden = torch.randn(9, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 99, 100, 383, 250, 7, 301, 199, 200])
    upstream = torch.randn(9, dtype=torch.float64)
    got = device_forward.head_logprobs(hidden, head, targets, 0.7)
    (got * upstream).sum().backward()
    mine = [hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()]  # type: ignore[union-attr]
    hidden.grad, head.weight.grad, head.bias.grad = None, None, None
    want = torch.log_softmax(head(hidden) / 0.7, -1).gather(1, targets[:, None])[:, 0]
    (want * upstream).sum().backward()
    assert torch.allclose(got, want, atol=1e-12)
    for a, b in zip(mine, [hidden.grad, head.weight.grad, head.bias.grad], strict=True):
        assert torch.allclose(a, b, atol=1e-12)  # type: ignore[arg-type]


def test_chunked_head_entropy_equals_the_whole_distribution_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four chunks of 100 rows: the entropy from the running chunks is -(p log p).sum(-1) of the whole
    softmax (float64), and asking for it leaves the log-probs and their gradient as they were."""
    monkeypatch.setattr(device_forward, "VOCAB_CHUNK", 100)
    torch.manual_seed(1)
    head = torch.nn.Linear(16, VOCAB, bias=True, dtype=torch.float64)
    hidden = 3 * torch.randn(9, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 99, 100, 383, 250, 7, 301, 199, 200])
    logp, ent = device_forward.head_scores(hidden, head, targets, 0.7, with_entropy=True)
    p = torch.softmax(head(hidden) / 0.7, -1)
    assert ent is not None and not ent.requires_grad
    assert torch.allclose(ent, -(p * p.log()).sum(-1), atol=1e-12)
    assert torch.equal(logp, device_forward.head_logprobs(hidden, head, targets, 0.7))
    assert device_forward.head_scores(hidden, head, targets, 0.7)[1] is None
    (grad_with,) = torch.autograd.grad(logp.sum(), hidden)
    (grad_without,) = torch.autograd.grad(device_forward.head_logprobs(hidden, head, targets, 0.7).sum(), hidden)
    assert torch.equal(grad_with, grad_without)


def test_rows_pack_whole_segments_first_fit_decreasing() -> None:
    width, rows = pack_rows([30, 10, 17, 5, 30, 12])
    assert width == 32
    assert rows == [[0], [4], [2, 5], [1, 3]]  # 30, 30, 17+12, 10+5 (5 fits only in the last)
    assert sorted(i for r in rows for i in r) == list(range(6))


def test_the_block_mask_is_the_shared_prompt_pattern() -> None:
    """Two groups in one row: a response sees its prompt and its own past, nothing across groups;
    padding sees only padding; positions restart after the prompt for every response."""
    g = groups_of(16, max_new=3, prompt=2, size=2, seed=1)[:2]
    batch = build(g, [0.0] * 4, True, False, torch.device("cpu"))
    allowed = allowed_mask(batch.segment, batch.sample)[:, 0]  # [B, T, T]
    seg, smp, pos = batch.segment.flatten(), batch.sample.flatten(), batch.position_ids.flatten()
    flat = torch.block_diag(*allowed)  # rows side by side (no attention across rows)
    for q in range(seg.numel()):
        for k in range(seg.numel()):
            same_row = q // batch.segment.shape[1] == k // batch.segment.shape[1]
            if smp[q] == PAD:
                want = same_row and smp[k] == PAD and k <= q
            else:
                want = same_row and seg[k] == seg[q] and k <= q and smp[k] in (-1, smp[q])
            assert bool(flat[q, k]) == bool(want), (q, k)
    first = [i for i in range(seg.numel()) if smp[i] >= 0 and (i == 0 or smp[i - 1] != smp[i])]
    assert all(int(pos[i]) == sum(1 for j in range(seg.numel()) if seg[j] == seg[i] and smp[j] == -1) for i in first)


@pytest.mark.parametrize(
    ("family", "attn"), [(f, "sdpa") for f in ("qwen2", "llama", "gpt2", "mistral")] + [("qwen2", "eager")]
)
def test_packed_rows_equal_the_dense_reference(family: str, attn: str, family_dirs: dict[str, Path]) -> None:
    """Rotary with GQA and an untied head (llama), absolute positions (gpt2), a sliding window of 8
    (mistral: the window applied to the block mask), eager attention (an additive mask): the packed
    rows' log-probs equal one unpacked row per sample (float64; measured 0 to 9e-16 with SDPA, 8e-7
    with eager, whose softmax runs in float32 in both layouts)."""
    model = load_model(family_dirs[family], dtype="float64", attn_implementation=attn)
    gs = groups_of(24, max_new=12, prompt=10, size=4, seed=4)
    for i, g in enumerate(gs):  # the tiny families' vocabularies; every other group short
        g.prompt_ids = [t % 300 for t in g.prompt_ids][: 30 if i % 2 else 3]
        for smp in g.samples:
            smp.token_ids = [t % 300 for t in smp.token_ids][: 12 if i % 2 else 2]
    batch = build(gs, [0.0] * 24, True, False, torch.device("cpu"))
    assert batch.input_ids.shape[0] < len(gs)  # several groups share a row
    mask = device_forward.attention_mask(model, allowed_mask(batch.segment, batch.sample), batch.position_ids)
    with torch.no_grad():
        packed, _ = device_forward.device_logprobs(model, batch, mask, Behaviour(temperature=0.8))
        pairs = [(g.prompt_ids, [smp.token_ids for smp in g.samples]) for g in gs]
        dense = response_logprobs(model, collate_unpacked(pairs), Behaviour(temperature=0.8))
    tol = 1e-10 if attn == "sdpa" else 1e-5  # HF's eager attention takes its softmax in float32
    assert (packed - dense).abs().max().item() < tol


@pytest.mark.parametrize("scale", ["group", "none", "batch"])
def test_host_advantages_equal_the_tensor_ones(scale: str) -> None:
    for rewards in ([1.0, 0.0, 0.0, 1.0, 0.5], [0.9] * 6, [2.0], [0.0, 1.0]):
        got = host_advantages(rewards, scale, 0.4)
        want = scaled_advantages(torch.tensor(rewards, dtype=torch.float64), scale, 0.4)
        assert torch.allclose(torch.tensor(got, dtype=torch.float64), want, atol=1e-12, rtol=0)
    assert host_advantages([0.9] * 6, scale, 0.4) == [0.0] * 6  # exact zeros for equal rewards


def test_impl_auto_is_by_device_and_the_budget_comes_from_memory() -> None:
    assert resolve_impl("auto", torch.device("cpu")) == "cpu"
    assert resolve_impl("auto", torch.device("cuda", 0)) == "gpu"
    assert resolve_impl("gpu", torch.device("cpu")) == "gpu"
    per_token = activation_bytes_per_token(896, 4864, 24, 2)  # Qwen2.5-0.5B's blocks, bfloat16
    assert 1e6 < per_token < 3e6
    assert 10_000 < token_budget(130 * 2**30, 3 * 4 * 358_000_000, per_token) < 100_000
    assert token_budget(0, 0, per_token) == BUDGET_MIN and token_budget(1 << 60, 0, 1) == BUDGET_MAX
    assert activation_bytes_per_token(896, 4864, 24, 2, checkpointing=True) < per_token / 5


# --- bench --only gpu -------------------------------------------------------------------------------


def test_gpu_bench_skips_without_cuda_and_its_tiny_cpu_path_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CUDA: one skip line and no entries; the smoke preset runs the same trainer code at a
    tiny shape on the CPU (impl gpu and cpu), the single-process loop and `prl-actors up` (2 epochs,
    its logs passing `replay --check`), with finite numbers and the ops it dispatched."""
    from prl_bench import gpu
    from prl_bench.common import BenchContext

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    said: list[str] = []
    assert gpu.run(BenchContext(False, tmp_path, tmp_path / "work", said.append)) == []
    assert said == ["[gpu] skipped: torch sees no CUDA device"]
    entries = gpu.run(BenchContext(False, tmp_path, tmp_path / "work", said.append, smoke=True))
    by = {e.name: e for e in entries}
    assert {"trainer impl gpu tiny cpu", "trainer impl cpu tiny cpu", "single-process loop tiny cpu"} <= set(by)
    assert by["single-process loop tiny cpu"].raw["impl"] == "cpu"  # auto on the CPU
    assert all(math.isfinite(e.measured) and e.measured > 0 for e in entries)
    assert by["trainer impl gpu ops per epoch tiny cpu"].raw["syncs"] <= 10
    up = {"up tiny cpu", "up generation tiny cpu", "up training tiny cpu", "up trainer tokens/s tiny cpu"}
    assert up <= set(by), sorted(by)
    run = by["up tiny cpu"].raw
    assert run["replay_check"] == "ok" and run["epochs"] == 2 and run["peak_gib"] is None  # no peak in up's logs
    assert run["wall_s"] >= run["train_s"] > 0 and run["gen_s"] > 0
    assert by["up trainer tokens/s tiny cpu"].measured == pytest.approx(run["tokens"] / run["train_s"])


def test_the_gpu_bench_samples_ups_peak_memory_over_what_was_in_use_before() -> None:
    """`up` logs no peak memory: the bench samples the device's memory in use while it runs."""
    import threading

    from prl_bench.gpu import sampled_peak

    readings, seen = iter([3.0, 5.0, 9.5, 4.0]), threading.Event()

    def read() -> float:
        value = next(readings, 4.0)
        if value == 4.0:  # every reading is in
            seen.set()
        return value

    with sampled_peak(read, every_s=0.001) as peak:
        assert seen.wait(5.0) and peak == []
    assert peak == [6.5]  # 9.5 GiB at most, 3.0 before
    with sampled_peak(None) as none:
        pass
    assert none == []


def test_the_memory_budget_is_read_from_the_device_and_sets_aside_what_is_not_allocated_yet(
    small_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto with the gpu impl: tokens from the free memory (a fake device here); before the first step
    the gradient and AdamW's m and v are set aside, after it only the gradient; a number set is kept."""
    import prl_actors.training.device_learner as device_learner

    learner = GRPOLearner(learner_settings(config(impl="gpu", micro_batch_tokens="auto")), small_dir)
    assert learner.micro_batch_tokens == 2048  # on the CPU: auto's fixed budget
    trained = sum(p.numel() * p.element_size() for p in learner.policy.parameters())
    monkeypatch.setattr(device_learner, "free_memory", lambda device: 2**30)
    before = learner._micro_batch_tokens()
    epoch(learner, groups_of(8, max_new=4))
    after = learner._micro_batch_tokens()
    c = learner.policy.config
    per_token = activation_bytes_per_token(c.hidden_size, c.intermediate_size, c.num_hidden_layers, 4)
    assert before == token_budget(2**30, 3 * trained, per_token) and after == token_budget(2**30, trained, per_token)
    assert BUDGET_MIN < before < after
    fixed = GRPOLearner(learner_settings(config(impl="gpu", micro_batch_tokens=4096)), small_dir)
    assert fixed._micro_batch_tokens() == 4096


def test_a_model_whose_head_is_more_than_a_linear_runs_whole(small_dir: Path) -> None:
    """Logits scaled after the head (as soft-capping or logit_scale models do): the one-time check finds
    that body + head is not the model, and the model runs whole, with the same log-probs as unpacked."""
    model = load_model(small_dir, dtype="float64")
    model.register_forward_hook(lambda _m, _a, out: out.__setitem__("logits", out.logits * 0.5) or out)
    assert device_forward.head_split(model) is None
    gs = groups_of(8, max_new=6, prompt=5, size=4)
    batch = build(gs, [0.0] * 8, True, False, torch.device("cpu"))
    mask = device_forward.attention_mask(model, allowed_mask(batch.segment, batch.sample), batch.position_ids)
    with torch.no_grad():
        packed, _ = device_forward.device_logprobs(model, batch, mask, Behaviour())
        pairs = [(g.prompt_ids, [smp.token_ids for smp in g.samples]) for g in gs]
        dense = response_logprobs(model, collate_unpacked(pairs))
    assert (packed - dense).abs().max().item() < 1e-10
    assert device_forward.head_split(load_model(small_dir, dtype="float64")) is not None

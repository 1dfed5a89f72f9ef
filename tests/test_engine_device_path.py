"""worker.impl=gpu on the CPU: the accelerator decode path (engines/static_batch.py) measured by its
CPU proxies (aten ops and host syncs per decode step, flat in the rows) and held equal to the running
batch (engines/batching.py): the same tokens, log-probs at float noise, the trainer's log-probs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from prl_actors.engines.base import engine_notes
from prl_actors.engines.batching import RunningBatch
from prl_actors.engines.static_batch import StaticBatch
from prl_actors.engines.torch_engine import TorchEngine, decode_impl
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.training.behaviour import Behaviour
from prl_actors.training.dispatch_count import DispatchCount
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import prompts, random_rewards, tiny_config, tiny_model

pytestmark = pytest.mark.fast

MAX_OPS = 200  # per decode step at 4 layers, sampling included (issue 38; the running batch: ~630)
MAX_SYNCS = 0.25  # host syncs per decode step (the running batch: 1 scalar read + 3 list reads)
EOS = {3, 11, 40}  # with a random model ~3% a step: rows end at different steps, inside chunks
BEHAVIOURS = {
    "greedy": Behaviour(0.0),
    "plain": Behaviour(1.0),
    "every_control": Behaviour(0.7, 0.9, 20, 0.02, 1.3),
}


def lm(family: str = "qwen2", layers: int = 2, hidden: int = 64, heads: int = 4, kv: int = 2) -> Any:
    """A random-init model in memory (weights larger than HF's init: peaked distributions)."""
    torch.manual_seed(0)
    shape = dict(
        vocab_size=96 if hidden < 128 else 384, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        max_position_embeddings=1024, initializer_range=0.1,
    )  # fmt: skip
    config = Qwen2Config(**shape) if family == "qwen2" else LlamaConfig(**shape)
    config._attn_implementation = "sdpa"
    model = (Qwen2ForCausalLM if family == "qwen2" else LlamaForCausalLM)(config)
    return model.eval()


def run(kind: type, model: Any, behaviour: Behaviour, *, rows: int = 12, stopper: Callable | None = None) -> Any:
    """Five groups of 4 with prompts of different lengths through a batch of `rows` rows (so groups
    wait and enter as rows free up); one group is a later multi-turn entry (index, offset)."""
    batch = kind(model, max_rows=rows, eos_ids=EOS, pad_id=0, behaviour=behaviour, max_new_tokens=24, stopper=stopper)
    return drain(fill(batch))


def fill(batch: Any) -> Any:
    for g in range(5):
        prompt = [5 + g, 9, 12, 7, 30][: 2 + g % 4] * (1 + g)
        batch.add(g, prompt, 1000 + g, 4 if g != 3 else 1, index=2 if g == 3 else 0, offset=7 if g == 3 else 0)
    return batch


def drain(batch: Any) -> dict[int, list[tuple[int, list[int], list[float], bool]]]:
    """Step `batch` until idle: group id -> its rows' (index, tokens, log-probs, ended on eos/stop)."""
    out = {}
    while batch.busy:
        out.update((f.group_id, [(r.index, r.tokens, r.logprobs, r.eos) for r in f.rows]) for f in batch.step())
    return out


def assert_same(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert sorted(a) == sorted(b)
    for g in a:
        assert [(i, t, e) for i, t, _, e in a[g]] == [(i, t, e) for i, t, _, e in b[g]], g
        lp_a = torch.tensor([x for _, _, lp, _ in a[g] for x in lp])
        lp_b = torch.tensor([x for _, _, lp, _ in b[g] for x in lp])
        assert torch.allclose(lp_a, lp_b, atol=atol, rtol=0), (g, (lp_a - lp_b).abs().max())


# --- the proxies -------------------------------------------------------------------------------------


def test_the_counter_sees_dispatched_ops_and_every_kind_of_host_read() -> None:
    x = torch.arange(6.0)
    with DispatchCount() as c:
        y = x * 2 + 1
        y.sum().item()
        y.tolist()
        (y > 3).nonzero()
    assert c.by_op["mul"] == 1 and c.by_op["add"] == 1
    assert c.by_sync == {"_local_scalar_dense": 1, "tolist": 1, "nonzero": 1}
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # unpatched after the block


def per_step(kind: type, model: Any, rows: int, behaviour: Behaviour) -> tuple[float, float]:
    """(aten ops, host syncs) per decode step, averaged over 16 steps after the rows were admitted."""
    batch = kind(model, max_rows=rows, eos_ids={-1}, pad_id=0, behaviour=behaviour, max_new_tokens=64)
    for g in range(rows // 8):
        batch.add(g, list(range(1, 130)), 1234 + g, 8)
    batch.step()
    static = isinstance(batch, StaticBatch)
    calls, before = (2 if static else 16), getattr(batch, "steps", 0)  # 16 decode steps either way
    with DispatchCount() as c:
        for _ in range(calls):
            batch.step()
    steps = batch.steps - before if static else calls
    return c.ops / steps, c.syncs / steps


@pytest.fixture(scope="module")
def chat_shape() -> Any:
    """chat-h128-L4's shape (bench/prl_bench/chat_shape.py): hidden 128, 4 layers, 4 heads / 2 kv."""
    return lm("qwen2", layers=4, hidden=128, heads=4, kv=2)


@pytest.mark.parametrize("behaviour", [Behaviour(), Behaviour(0.7, 0.9)], ids=["plain", "T0.7_top_p0.9"])
def test_a_decode_step_dispatches_few_ops_flat_in_the_rows_and_syncs_once_per_chunk(
    chat_shape: Any, behaviour: Behaviour
) -> None:
    ops16, syncs16 = per_step(StaticBatch, chat_shape, 16, behaviour)
    ops64, syncs64 = per_step(StaticBatch, chat_shape, 64, behaviour)
    assert ops16 == ops64, "ops per step grow with the rows: a per-row loop in the step"
    assert ops16 <= MAX_OPS, ops16
    assert syncs16 == syncs64 <= MAX_SYNCS, (syncs16, syncs64)


def test_the_running_batch_is_the_baseline_the_proxies_beat(chat_shape: Any) -> None:
    ops, syncs = per_step(RunningBatch, chat_shape, 16, Behaviour())
    assert ops > 3 * MAX_OPS and syncs >= 1  # ~630 and 4: what the gpu path replaces


# --- equality with the running batch ----------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("name", list(BEHAVIOURS))
def test_tokens_and_logprobs_equal_the_running_batch(family: str, name: str) -> None:
    model = lm(family)
    old, new = run(RunningBatch, model, BEHAVIOURS[name]), run(StaticBatch, model, BEHAVIOURS[name])
    assert_same(old, new)
    ends = [e for g in new.values() for _, t, _, e in g]
    if name != "greedy":  # (greedy rows of a random model cycle through a few tokens: no eos among them)
        assert any(ends) and not all(ends)  # some rows ended on eos inside a chunk, some at the cap


def test_other_sampling_settings_between_batches_sample_as_a_fresh_batch() -> None:
    """An idle batch takes other settings (an evaluation's, and back) without losing its cache."""
    model = lm()
    batch = StaticBatch(model, max_rows=12, eos_ids=EOS, pad_id=0, behaviour=Behaviour(), max_new_tokens=24)
    for name in ("plain", "every_control", "greedy", "plain"):
        batch.behaviour = BEHAVIOURS[name]
        assert_same(run(RunningBatch, model, BEHAVIOURS[name]), drain(fill(batch)))


def test_stop_strings_end_rows_where_the_running_batch_ends_them() -> None:
    model = lm()
    stop = lambda tokens: tokens[-1] % 17 == 0  # noqa: E731 - a stand-in for the engine's text check
    old = run(RunningBatch, model, BEHAVIOURS["plain"], stopper=stop)
    new = run(StaticBatch, model, BEHAVIOURS["plain"], stopper=stop)
    assert_same(old, new)
    assert any(t[-1] % 17 == 0 for g in new.values() for _, t, _, _ in g)


def test_a_group_samples_the_same_whatever_shares_the_batch() -> None:
    """A requeued group regenerates identically: alone, or among others in a fuller batch."""
    model = lm()
    alone = StaticBatch(model, max_rows=4, eos_ids=EOS, pad_id=0, behaviour=Behaviour(), max_new_tokens=24)
    alone.add(3, [8, 9, 12, 7, 8, 9], 1003, 4)
    while alone.busy:
        got = alone.step()
        if got:
            (single,) = got
    crowded = run(StaticBatch, model, Behaviour(), rows=16)
    many = StaticBatch(model, max_rows=16, eos_ids=EOS, pad_id=0, behaviour=Behaviour(), max_new_tokens=24)
    for g in range(6):
        many.add(g, [8, 9, 12, 7, 8, 9] if g == 3 else [g + 1] * (g + 2), 1000 + g, 4)
    found = {}
    while many.busy:
        found.update((f.group_id, f) for f in many.step())
    assert [r.tokens for r in found[3].rows] == [r.tokens for r in single.rows]
    assert crowded  # the crowded batch ran


def test_new_weights_and_lora_hooks_reach_the_decode_step() -> None:
    """The step reads the model's parameter tensors: after new tensors (a CPU weight load assigns
    them) or a forward hook (a LoRA adapter), `weights_changed` makes it read the new ones."""
    model = lm()
    batch = StaticBatch(model, max_rows=12, eos_ids=EOS, pad_id=0, behaviour=Behaviour(), max_new_tokens=24)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(state, assign=True)
    handles = [x.self_attn.q_proj.register_forward_hook(lambda m, a, out: out * 1.5) for x in model.model.layers]
    batch.weights_changed()
    for g in range(3):
        batch.add(g, [4 + g, 9, 12], 1000 + g, 4)
    new = drain(batch)
    ref = RunningBatch(model, max_rows=12, eos_ids=EOS, pad_id=0, behaviour=Behaviour(), max_new_tokens=24)
    for g in range(3):
        ref.add(g, [4 + g, 9, 12], 1000 + g, 4)
    old = drain(ref)
    for h in handles:
        h.remove()
    assert_same(old, new)


# --- the engine ---------------------------------------------------------------------------------------


def test_auto_is_cpu_on_the_cpu_gpu_on_an_accelerator_and_unknown_models_fall_back() -> None:
    qwen = lm()
    assert decode_impl("auto", torch.device("cpu"), qwen)[0] == "cpu"
    assert decode_impl("auto", torch.device("cuda"), qwen)[0] == "gpu"
    assert decode_impl("gpu", torch.device("cpu"), qwen)[0] == "gpu"
    assert decode_impl("cpu", torch.device("cuda"), qwen)[0] == "cpu"
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    impl, why = decode_impl("gpu", torch.device("cuda"), gpt2)
    assert impl == "cpu" and "gpt2" in why
    sliding = Qwen2Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1)
    sliding.use_sliding_window, sliding.sliding_window = True, 8
    assert decode_impl("gpu", torch.device("cuda"), Qwen2ForCausalLM(sliding)) == ("cpu", _why_sliding())


def _why_sliding() -> str:
    return "the gpu path cannot run this model: sliding-window attention"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("device_path"))[1]


def test_the_engine_on_the_gpu_path_agrees_with_the_trainer_and_says_so_once(model_dir: Path) -> None:
    """Behaviour log-probs vs the trainer's (the epoch metric logprob_diff_max), every control on,
    and the same samples as the cpu path."""
    controls = dict(temperature=0.7, top_p=0.9, top_k=20, min_p=0.02, repetition_penalty=1.2, max_new_tokens=8)
    cfg = tiny_config(**{f"worker__sampling__{k}": v for k, v in controls.items()}, worker__impl="gpu")
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    texts = ["3+4=", "12+19=", "7+15=", "0+0="]
    groups = engine.generate(prompts(texts), 8)
    assert isinstance(engine.batch, StaticBatch)
    ((event, fields),) = engine_notes(engine)
    assert event == "decode_path" and fields["impl"] == "gpu"
    cpu = TorchEngine(
        build.engine_settings(cfg.model_copy(update={"worker": cfg.worker.model_copy(update={"impl": "cpu"})})),
        model_dir,
    )
    cpu.version = 0
    same = cpu.generate(prompts(texts), 8)
    assert [[s.token_ids for s in g.samples] for g in groups] == [[s.token_ids for s in g.samples] for g in same]
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    learner.begin_epoch(0, len(groups))
    for g in random_rewards(groups):
        learner.accumulate(g)
    assert learner.step()["logprob_diff_max"] < 1e-5


def test_captured_steps_are_dropped_exactly_when_the_step_would_read_other_tensors() -> None:
    """On CUDA a graph reads the tensors it was captured with: values copied in place keep it valid;
    new tensors (a CPU load assigns them) or LoRA hooks (their A, B swap every version) must drop it."""
    model = lm()
    batch = StaticBatch(model, max_rows=4, eos_ids=EOS, pad_id=0, behaviour=Behaviour(), max_new_tokens=4)
    resets = []
    batch.runner.reset = lambda: resets.append(1)  # type: ignore[method-assign]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    batch.weights_changed()
    assert resets == []
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    batch.weights_changed()
    assert resets == [1]
    handle = model.model.layers[0].mlp.up_proj.register_forward_hook(lambda m, a, out: out)
    batch.weights_changed()
    batch.weights_changed()  # a new adapter version: the same hook dict, other tensors
    handle.remove()
    assert resets == [1, 1, 1]


def test_multi_turn_episodes_play_the_same_on_the_gpu_path(tmp_path: Path) -> None:
    """engines/multiturn.py drives the batch through TorchTurns (later turns re-enter as one-row
    entries with their counters' offset): the same episodes, rewards and masks on either path."""
    from prl_actors.config import Config
    from prl_actors.launch import build
    from prl_actors.model.builtin import load_model
    from tests.test_multiturn import GUESS, rows

    out = {}
    for impl in ("cpu", "gpu"):
        cfg = Config.model_validate({**GUESS, "worker": {**GUESS["worker"], "impl": impl}})
        model_dir = build.model_dir(cfg, tmp_path)
        engine: Any = build.engine(cfg, model_dir)
        engine.load_weights(0, load_model(model_dir).state_dict())
        assert type(engine.turns.engine.batch) is (StaticBatch if impl == "gpu" else RunningBatch)
        out[impl] = [
            (s.token_ids, s.reward, s.loss_mask, s.logprobs) for g in engine.generate(rows(3), 4) for s in g.samples
        ]
    assert [x[:3] for x in out["gpu"]] == [x[:3] for x in out["cpu"]]
    diffs = [abs(p - q) for a, b in zip(out["gpu"], out["cpu"], strict=True) for p, q in zip(a[3], b[3], strict=True)]
    assert max(diffs) < 1e-5
    assert any(sum(m or []) < len(t) for t, _, m, _ in out["gpu"])  # episodes with environment turns


def test_a_lora_adapter_from_the_trainer_generates_on_the_gpu_path_as_on_the_cpu_path(model_dir: Path) -> None:
    from tests.test_lora import sync, train, with_, with_lora

    cfg = with_lora(tiny_config(trainer__beta=0.1, trainer__lr=0.05))
    texts = ["3+4=", "12+19=", "7+15=", "0+0="]
    base = TorchEngine(build.engine_settings(cfg), model_dir)
    base.version = 0
    learner = train(cfg, model_dir, random_rewards(base.generate(prompts(texts), 4)), epochs=2)
    out = {}
    for impl in ("cpu", "gpu"):
        engine = TorchEngine(build.engine_settings(with_(cfg, "worker", impl=impl)), model_dir)
        sync(learner, engine)  # the adapter alone, as a worker receives it
        out[impl] = [(s.token_ids, s.logprobs) for g in engine.generate(prompts(texts), 4) for s in g.samples]
    assert [t for t, _ in out["gpu"]] == [t for t, _ in out["cpu"]]
    pairs = zip(out["gpu"], out["cpu"], strict=True)
    assert max(abs(a - b) for (_, x), (_, y) in pairs for a, b in zip(x, y, strict=True)) < 1e-5
    plain = [(s.token_ids, s.logprobs) for g in base.generate(prompts(texts), 4) for s in g.samples]
    assert plain != out["gpu"]  # the adapter changed what is generated


def test_a_step_that_cannot_be_captured_runs_eagerly_and_says_why_once() -> None:
    model = lm()
    batch = StaticBatch(
        model, max_rows=12, eos_ids=EOS, pad_id=0, behaviour=Behaviour(), max_new_tokens=24, capture=True
    )

    def refuse(fn: Any, state: Any) -> Any:
        raise RuntimeError("operation not permitted when stream is capturing")

    batch.runner._capture = refuse  # type: ignore[method-assign]
    assert_same(run(RunningBatch, model, Behaviour()), drain(fill(batch)))
    assert not batch.runner.capture
    ((event, fields),) = batch.drain_notes()
    assert event == "decode_graphs" and not fields["captured"] and "stream is capturing" in fields["why"]
    drain(fill(batch))
    assert batch.drain_notes() == []


class Replay:
    """A stand-in for a captured CUDA graph on the CPU: `replay` runs the step function as captured
    (the closure and the views of the chunk where it was captured), as a graph replays its kernels."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def replay(self) -> None:
        self.fn()


@pytest.mark.parametrize("name", ["plain", "every_control"])
def test_steps_replayed_as_captured_sample_what_the_running_batch_samples(name: str) -> None:
    """What CUDA graphs rely on, checked on the CPU: a step captured in one chunk and replayed in
    later ones reads and writes only static buffers, and the capture's warm-up leaves no trace."""
    model = lm()
    batch = StaticBatch(
        model, max_rows=12, eos_ids=EOS, pad_id=0, behaviour=BEHAVIOURS[name], max_new_tokens=24, capture=True
    )

    def capture(fn: Any, state: Any) -> Replay:
        batch.runner.warm(fn, state)
        batch.runner.captures += 1
        return Replay(fn)

    batch.runner._capture = capture  # type: ignore[method-assign]
    got = drain(fill(batch))
    assert 0 < batch.runner.captures < batch.runner.replays == batch.steps  # graphs were reused across chunks
    assert_same(run(RunningBatch, model, BEHAVIOURS[name]), got)


def test_abort_drops_everything_and_the_batch_generates_afresh() -> None:
    model = lm()
    batch = fill(StaticBatch(model, max_rows=12, eos_ids=EOS, pad_id=0, behaviour=Behaviour(), max_new_tokens=24))
    batch.step()
    assert sorted(batch.abort()) == [0, 1, 2, 3, 4] and not batch.busy and batch.running_rows == 0
    assert_same(run(RunningBatch, model, Behaviour()), drain(fill(batch)))

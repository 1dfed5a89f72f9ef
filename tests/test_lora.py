"""LoRA without actors: config, the learner (one copy of the model, adapter-only optimizer, the
reference as the adapter switched off), the adapter on the wire and in the torch engine, the base
model check, checkpoints, the merged export."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from prl_actors.config import Config, load_config
from prl_actors.engines.base import IncompatibleWeights
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.model import memory
from prl_actors.model.builtin import load_model
from prl_actors.model.lora import META, parse
from prl_actors.model.tiny import build_family
from prl_actors.protocol.messages import Group
from prl_actors.records.logs import EventLog
from prl_actors.sections import ConfigError
from prl_actors.tasks.base import Task, exact_match
from prl_actors.training import lora
from prl_actors.training.grpo import GRPOLearner
from prl_actors.training.packing import collate, response_logprobs
from prl_actors.transport.port import Inbound
from prl_actors.weights.tensors import unpack
from prl_actors.weights.transfer import Snapshot, transfer_messages
from prl_actors.worker.core import WorkerCore
from tests.learning_utils import prompts, random_rewards, tiny_model

pytestmark = pytest.mark.fast

TEXTS = ["3+4=", "12+19=", "7+15=", "0+0=", "20+1=", "9+9="]
ALL = list(memory.LORA_TARGETS)


def with_lora(cfg: Config, **fields: object) -> Config:
    data = cfg.model_dump(mode="json")
    data["trainer"]["lora"] = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"], **fields}
    return Config.model_validate(data)


def with_(cfg: Config, section: str, **fields: object) -> Config:
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=fields)})


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path, list[Group]]:
    cfg, model_dir = tiny_model(tmp_path_factory.mktemp("lora"), trainer__beta=0.1, trainer__lr=0.05)
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    return with_lora(cfg), model_dir, random_rewards(engine.generate(prompts(TEXTS), 4))


def train(cfg: Config, model_dir: Path, groups: list[Group], epochs: int = 1) -> GRPOLearner:
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    for epoch in range(epochs):
        learner.begin_epoch(epoch, len(groups))
        for g in groups:
            learner.accumulate(g)
        learner.step()
    return learner


def adapter(learner: GRPOLearner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lora.adapter_state(learner.policy).items()}


def sync(learner: GRPOLearner, engine: TorchEngine) -> Snapshot:
    """The trainer -> publisher -> worker path: snapshot, bytes, unpack, engine.load_weights."""
    snap = Snapshot.from_tensors(learner.version, learner.weights())
    engine.load_weights(snap.version, unpack(snap.metas, bytes(snap.data), as_torch=True))
    return snap


def scored(model: torch.nn.Module, groups: list[Group]) -> torch.Tensor:
    batch = collate([(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups], True)
    with torch.no_grad():
        return response_logprobs(model, batch).double()  # [N]


# --- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lora_value", "words"),
    [
        ({"r": 0}, "trainer.lora.r"),
        ({"alpha": 0}, "trainer.lora.alpha"),
        ({"dropout": 1.0}, "trainer.lora.dropout"),
        ({"rank": 8}, "trainer.lora.rank: Extra inputs"),
        ({"target_modules": []}, "target_modules must list"),
        ({"target_modules": ["q proj"]}, "target_modules must list"),
        ({"target_modules": ["q_proj", "q_proj"]}, "lists a name twice"),
        (8, "trainer.lora: Input should be a valid dictionary"),
    ],
)
def test_bad_lora_config_is_one_line(lora_value: object, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {"trainer.lora": lora_value})
    assert words in str(err.value) and "\n" not in str(err.value)


def test_lora_config_defaults_and_sim_refusal() -> None:
    assert load_config(None).trainer.lora is None  # absent: full fine-tuning
    cfg = load_config(None, {"trainer.lora": {}})
    assert cfg.trainer.lora is not None and (cfg.trainer.lora.r, cfg.trainer.lora.alpha) == (16, 32.0)
    with pytest.raises(ConfigError, match="needs trainer.learner 'grpo'"):
        load_config(None, {"trainer.lora": {}, "trainer.learner": "sim", "worker.engine": "sim"})


@pytest.mark.parametrize(
    ("family", "targets", "words"),
    [
        ("qwen2", ["qproj"], "matches no layer; the model's linear layers are named down_proj, gate_proj"),
        ("qwen2", ["embed_tokens"], "is a Embedding, LoRA here adapts linear layers"),
        ("gpt2", ["lm_head"], "shares its weight (tied embeddings)"),
    ],
)
def test_targets_are_checked_against_the_model(family: str, targets: list[str], words: str, tmp_path: Path) -> None:
    model_dir = build_family(family, tmp_path / family)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        lora.check_targets(load_config(None, {"trainer.lora": {"target_modules": targets}}).trainer.lora, model_dir)  # type: ignore[arg-type]


# --- the learner -------------------------------------------------------------------------------


def test_one_copy_of_the_model_and_only_the_adapter_in_the_optimizer(rollouts) -> None:
    """bf16, beta > 0, LoRA on every projection: the parameter and optimizer bytes are those
    docs/MEMORY.md computes (memory.lora_budget) for this very architecture: base 2 bytes/param
    (frozen, bf16), adapter 4 (fp32) + AdamW 8, and no reference copy."""
    cfg, model_dir, groups = rollouts
    cfg = with_lora(with_(cfg, "model", dtype="bfloat16"), r=8, target_modules=ALL)
    learner = train(cfg, model_dir, groups[:2])
    assert learner.tri.reference is None and learner.tri.adapter_reference
    c = learner.policy.config
    arch = memory.Arch("tiny", c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, 4, 4, False, True)
    budget = memory.lora_budget(arch, 8)
    params = list(learner.tri.parameters())
    assert sum(p.numel() * p.element_size() for p in params) == budget.weights
    trained = [p for p in params if p.requires_grad]
    assert sum(p.numel() for p in trained) == memory.lora_param_count(arch, 8)
    assert {p.dtype for p in trained} == {torch.float32}
    assert {p.dtype for p in params if not p.requires_grad} == {torch.bfloat16}
    held = [p for g in learner.optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in held} == {id(p) for p in trained}
    moments = sum(t.numel() * t.element_size() for s in learner.optimizer.state.values() for t in s.values() if t.dim())
    assert moments == budget.adam


def test_only_the_adapter_moves_and_the_reference_is_the_base(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    base_before = {k: v.clone() for k, v in learner.policy.named_parameters() if not v.requires_grad}
    learner = train(cfg, model_dir, groups, epochs=2)
    for name, p in learner.policy.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, base_before[name]), name
    assert max(t.abs().max().item() for k, t in adapter(learner).items() if "lora_B" in k) > 1e-3
    base = load_model(model_dir)
    policy, base_lp = scored(learner.policy, groups), scored(base, groups)
    assert (policy - base_lp).abs().max() > 1e-3  # the adapter changed the policy ...
    batch = collate([(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups], True)
    out = learner.tri(batch)
    assert out.ref is not None
    torch.testing.assert_close(out.ref.double(), base_lp, atol=1e-6, rtol=0)  # ... and the reference did not


def test_arrival_order_and_micro_batches_give_the_same_adapter(rollouts) -> None:
    """periodic == sync for LoRA, at the learner: float64, shuffled arrival and micro-batches."""
    cfg, model_dir, groups = rollouts
    cfg = with_(cfg, "model", dtype="float64")
    shuffled = groups[:]
    random.Random(1).shuffle(shuffled)
    a = adapter(train(cfg, model_dir, groups))
    b = adapter(train(cfg, model_dir, shuffled))
    c = adapter(train(with_(cfg, "trainer", micro_batch_groups=4), model_dir, shuffled))
    assert max(t.abs().max().item() for k, t in a.items() if "lora_B" in k) > 1e-3
    for other in (b, c):
        for k in a:
            torch.testing.assert_close(a[k], other[k], atol=1e-9, rtol=0, msg=k)


def test_dropout_is_applied_while_training(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    learner = train(with_lora(cfg, dropout=0.5), model_dir, groups[:2])
    batch = collate([(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups[:2]], True)
    torch.manual_seed(0)
    first, second = learner.tri(batch).policy, learner.tri(batch).policy
    assert (first - second).abs().max() > 1e-6
    quiet = train(cfg, model_dir, groups[:2])
    assert torch.equal(quiet.tri(batch).policy, quiet.tri(batch).policy)


# --- the adapter on the wire and in the engine -------------------------------------------------


def test_only_the_adapter_travels_and_the_engine_computes_the_trainers_policy(rollouts) -> None:
    cfg, model_dir, groups = rollouts
    learner = train(cfg, model_dir, groups, epochs=2)
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    base_lp = scored(engine.model, groups)
    snap = sync(learner, engine)
    names = {m.name for m in snap.metas}
    assert names == set(adapter(learner)) | {META}
    full = sum(t.numel() * t.element_size() for t in load_model(model_dir).state_dict().values())
    adapter_bytes = sum(t.numel() * 4 for t in adapter(learner).values())
    assert adapter_bytes < snap.nbytes < adapter_bytes + 400 and snap.nbytes < full / 10
    assert engine.version == 2
    torch.testing.assert_close(scored(engine.model, groups), scored(learner.policy, groups), atol=1e-5, rtol=0)
    assert (scored(engine.model, groups) - base_lp).abs().max() > 1e-3
    generated = engine.generate(prompts(TEXTS[:2]), 3)  # generation goes through the adapter too
    assert all(s.logprobs for g in generated for s in g.samples)
    engine.lora.clear()
    assert torch.equal(scored(engine.model, groups), base_lp)  # the base weights were never touched


def test_an_adapter_for_another_base_model_is_refused(rollouts, tmp_path: Path) -> None:
    cfg, model_dir, groups = rollouts
    learner = train(cfg, model_dir, groups[:2])
    tensors = learner.weights()
    other_cfg, other_dir = tiny_model(tmp_path, run__seed=7)  # same architecture, other weights
    engine = TorchEngine(build.engine_settings(other_cfg), other_dir)
    before = scored(engine.model, groups)
    with pytest.raises(IncompatibleWeights, match="trained on another base model .* every worker needs the trainer's"):
        engine.load_weights(1, tensors)
    assert engine.version == -1 and engine.lora.adapter is None and torch.equal(scored(engine.model, groups), before)
    mine = TorchEngine(build.engine_settings(cfg), model_dir)
    wrong_rank = {k: (v[:2] if "lora_A" in k else v) for k, v in tensors.items()}
    with pytest.raises(IncompatibleWeights, match=r"has A \(2, 32\) .* wants A \(4, 32\)"):
        mine.load_weights(1, wrong_rank)
    renamed = {k.replace("q_proj", "x_proj"): v for k, v in tensors.items()}
    with pytest.raises(IncompatibleWeights, match="has no module model.layers.0.self_attn.x_proj"):
        mine.load_weights(1, renamed)
    assert parse(1, tensors).scale == 2.0


def test_a_worker_stops_with_one_line_on_weights_it_cannot_load(rollouts, tmp_path: Path) -> None:
    cfg, model_dir, groups = rollouts
    tensors = train(cfg, model_dir, groups[:1]).weights()
    other_cfg, other_dir = tiny_model(tmp_path, run__seed=7)
    task = Task(items=[("1+1=", "2")], reward=exact_match)
    core = WorkerCore(
        "worker-x",
        EventLog("worker-x", "worker"),
        TorchEngine(build.engine_settings(other_cfg), other_dir),
        task,
        4,
        5.0,
        1.0,
    )
    core.registered, core.now = True, 0.0
    for msg, payloads in transfer_messages(Snapshot.from_tensors(1, tensors), 1 << 12, reply_to="f"):
        msg.sender = "publisher"
        core.handle(0.0, Inbound(msg, list(payloads), peer="publisher"))
    assert core.failure is not None and core.stopped
    assert core.failure.startswith("cannot load the published weights: the adapter of version 1 was trained on")


# --- checkpoints and the merged export ---------------------------------------------------------


def test_adapter_checkpoint_round_trip_and_resume(rollouts, tmp_path: Path) -> None:
    cfg, model_dir, groups = rollouts
    learner = train(cfg, model_dir, groups)
    learner.save_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "ckpt" / "model").exists() and not (tmp_path / "ckpt" / "merged").exists()
    restored = GRPOLearner(learner_settings(cfg), model_dir)
    restored.load_checkpoint(tmp_path / "ckpt")
    assert restored.version == 1
    a, b = adapter(learner), adapter(restored)
    assert all(torch.equal(a[k], b[k]) for k in a)
    for lrn in (learner, restored):  # the optimizer state came back too: the next step agrees
        lrn.begin_epoch(1, len(groups))
        for g in groups:
            lrn.accumulate(g)
        lrn.step()
    a, b = adapter(learner), adapter(restored)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)
    full = GRPOLearner(learner_settings(with_(cfg, "trainer", lora=None)), model_dir)
    with pytest.raises(FileNotFoundError, match="a LoRA checkpoint"):
        full.load_checkpoint(tmp_path / "ckpt")
    full.save_checkpoint(tmp_path / "full")
    with pytest.raises(FileNotFoundError, match="holds no LoRA adapter"):
        GRPOLearner(learner_settings(cfg), model_dir).load_checkpoint(tmp_path / "full")


def test_merged_export_is_a_plain_model_computing_the_policy(rollouts, tmp_path: Path) -> None:
    cfg, model_dir, groups = rollouts
    cfg = with_lora(cfg, export_merged=True)
    learner = train(cfg, model_dir, groups, epochs=2)
    learner.save_checkpoint(tmp_path / "ckpt")
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt" / "merged"), local_files_only=True).eval()
    assert not hasattr(merged, "peft_config") and (tmp_path / "ckpt" / "merged" / "tokenizer.json").is_file()
    torch.testing.assert_close(scored(merged, groups), scored(learner.policy, groups), atol=1e-5, rtol=0)
    assert (scored(merged, groups) - scored(load_model(model_dir), groups)).abs().max() > 1e-3
    again = lora.export_merged(tmp_path / "ckpt", tmp_path / "again")  # the base the adapter records
    assert (again / "config.json").is_file()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_families_train_and_apply_adapters(family: str, tmp_path: Path) -> None:
    """GPT-2's Conv1D layers (stored transposed) and Llama's linear layers: the engine's adapted
    log-probs equal the trainer's."""
    model_dir = build_family(family, tmp_path / family)
    targets = {"gpt2": ["c_attn", "c_fc"], "llama": ["q_proj", "up_proj"]}[family]
    cfg = load_config(
        None,
        {
            "model.path": str(model_dir),
            "worker.group_size": 4,
            "worker.sampling.max_new_tokens": 6,
            "trainer.lr": 0.05,
            "trainer.lora": {"r": 4, "alpha": 4.0, "target_modules": targets},
        },
    )
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    groups = random_rewards(engine.generate(prompts(["a b", "c d e"]), 4))
    learner = train(cfg, model_dir, groups, epochs=2)
    base_lp = scored(engine.model, groups)
    sync(learner, engine)
    torch.testing.assert_close(scored(engine.model, groups), scored(learner.policy, groups), atol=1e-5, rtol=0)
    assert (scored(engine.model, groups) - base_lp).abs().max() > 1e-3


# --- the vLLM engine's adapter directory (vLLM itself: tests/test_vllm_lora.py, `make test-vllm`) -


def test_vllm_adapter_dir_is_a_peft_adapter_of_the_policy(rollouts, tmp_path: Path) -> None:
    """What the vLLM engine hands vLLM's LoRA loader is a peft adapter directory: loaded by peft on
    the base it computes the trainer's policy; a wrong base or shape is refused before writing."""
    from peft import PeftModel

    from prl_actors.engines.vllm_engine import check_adapter, hf_shapes, lora_options, write_adapter
    from prl_actors.model.lora import base_fingerprint

    cfg, model_dir, groups = rollouts
    learner = train(cfg, model_dir, groups, epochs=2)
    tensors = {k: v.float() for k, v in learner.weights().items() if k != META}
    tensors[META] = learner.weights()[META]
    adapter_ = parse(2, tensors)
    check_adapter(adapter_, hf_shapes(model_dir), base_fingerprint(model_dir), model_dir)
    path = write_adapter(tensors, adapter_, model_dir)
    try:
        served = PeftModel.from_pretrained(load_model(model_dir), str(path)).eval()
        torch.testing.assert_close(scored(served, groups), scored(learner.policy, groups), atol=1e-5, rtol=0)
    finally:
        import shutil

        shutil.rmtree(path)
    with pytest.raises(IncompatibleWeights, match="another base model"):
        check_adapter(adapter_, hf_shapes(model_dir), "0" * 16, model_dir)
    assert lora_options(cfg.trainer.lora) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}  # r = 4 -> 8
    assert lora_options(None) == {}


@pytest.mark.parametrize(
    ("before", "after", "words"),
    [
        (None, {"r": 8}, "trainer.lora.r (None -> 8)"),
        ({"r": 8}, None, "trainer.lora.r (8 -> None)"),
        ({"r": 8}, {"r": 16}, "trainer.lora.r (8 -> 16)"),
    ],
)
def test_resume_refuses_a_changed_lora(before: object, after: object, words: str) -> None:
    from prl_actors.config import check_resume

    run, asked = load_config(None, {"trainer.lora": before}), load_config(None, {"trainer.lora": after})
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_resume(run, asked)
    check_resume(run, load_config(None, {"trainer.lora": before, "run.epochs": 9}))  # a safe change passes

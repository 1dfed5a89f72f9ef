"""The gpu decode path on CUDA (marker `gpu`, `make test-gpu`; skipped without a CUDA device): every
decode step is one captured graph launch, and the captured steps give what the eager steps and the
running batch give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prl_actors.engines.batching import RunningBatch
from prl_actors.engines.static_batch import StaticBatch
from prl_actors.engines.torch_engine import TorchEngine
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.training.behaviour import Behaviour
from prl_actors.training.dispatch_count import DispatchCount
from prl_actors.training.grpo import GRPOLearner
from tests.learning_utils import prompts, random_rewards, tiny_config, tiny_model
from tests.test_engine_device_path import BEHAVIOURS, EOS, assert_same, drain, lm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def batch(kind: type, model: Any, behaviour: Behaviour, **kw: Any) -> Any:
    b = kind(model, max_rows=12, eos_ids=EOS, pad_id=0, behaviour=behaviour, max_new_tokens=24, **kw)
    for g in range(5):
        b.add(g, [5 + g, 9, 12, 7, 30][: 2 + g % 4] * (1 + g), 1000 + g, 4)
    return b


@pytest.mark.parametrize("name", list(BEHAVIOURS))
def test_captured_steps_equal_eager_steps_and_the_running_batch(name: str) -> None:
    model = lm("qwen2").cuda()
    b = BEHAVIOURS[name]
    captured = batch(StaticBatch, model, b)
    got = drain(captured)
    assert captured.runner.captures >= 1 and captured.runner.replays == captured.steps
    assert_same(drain(batch(StaticBatch, model, b, capture=False)), got, atol=1e-5)
    assert_same(drain(batch(RunningBatch, model, b)), got, atol=1e-4)


def test_a_decode_step_is_one_graph_launch_and_syncs_once_per_chunk() -> None:
    model = lm("qwen2", layers=4, hidden=128).cuda()
    b = StaticBatch(model, max_rows=64, eos_ids={-1}, pad_id=0, behaviour=Behaviour(), max_new_tokens=64)
    for g in range(8):
        b.add(g, list(range(1, 130)), 1234 + g, 8)
    b.step()  # admission and the first chunk: capture
    before, launches = b.steps, b.runner.replays
    with DispatchCount() as c:
        b.step()
        b.step()
    steps = b.steps - before
    assert b.runner.replays - launches == steps == 16
    assert c.ops / steps < 10  # what dispatches outside the graphs: the chunk's inputs and its one read
    assert c.syncs / steps <= 0.25


def test_weights_loaded_in_place_reach_the_captured_graphs() -> None:
    model = lm("qwen2").cuda()
    static = batch(StaticBatch, model, Behaviour())
    drain(static)
    captures = static.runner.captures
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # in place: what load_weights does on an accelerator
    static.weights_changed()
    for g in range(5):
        static.add(g, [5 + g, 9, 12, 7, 30][: 2 + g % 4] * (1 + g), 1000 + g, 4)
    got = drain(static)
    assert static.runner.captures == captures  # the same tensors: no new capture
    assert_same(drain(batch(RunningBatch, model, Behaviour())), got, atol=1e-4)


def test_the_engine_on_cuda_takes_the_gpu_path_and_agrees_with_the_trainer(tmp_path: Path) -> None:
    _, model_dir = tiny_model(tmp_path)
    cfg = tiny_config(worker__device="cuda", trainer__device="cuda", worker__sampling__temperature=0.7)
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    assert isinstance(engine.batch, StaticBatch)
    groups = engine.generate(prompts(["3+4=", "12+19=", "7+15=", "0+0="]), 8)
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    learner.begin_epoch(0, len(groups))
    for g in random_rewards(groups):
        learner.accumulate(g)
    assert learner.step()["logprob_diff_max"] < 1e-4

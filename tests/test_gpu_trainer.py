"""The trainer on CUDA (`make test-gpu`; every test skips without a CUDA device).

Tolerances, stated: the gradient the step receives on CUDA (impl gpu) against the CPU impl on the
CPU, relative to its largest entry: 1e-4 in float32 (TF32 off: only the kernels' summation order
differs), 5e-2 in bfloat16 autocast (bf16 matmuls round the activations to 8 bits of mantissa on
both devices, in different orders). The packed rows under the block mask against one unpacked row
per sample (the dense reference): log-probs within 1e-4 (float32).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prl_actors.config import load_config
from prl_actors.launch.topology import learner_settings
from prl_actors.model.builtin import load_model
from prl_actors.training.behaviour import Behaviour
from prl_actors.training.device_batch import allowed_mask, build
from prl_actors.training.device_forward import attention_mask, device_logprobs
from prl_actors.training.dispatch_count import DispatchCount
from prl_actors.training.grpo import GRPOLearner
from prl_actors.training.packing import collate_unpacked, response_logprobs
from tests.test_grpo_equivalence import captured_gradients
from tests.test_trainer_device_path import groups_of, qwen2_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu)"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen2_dir(tmp_path_factory.mktemp("h128L4"), 128, 4, 4, 2)


def step_gradient(model_dir: Path, device: str, impl: str, dtype: str) -> dict[str, torch.Tensor]:
    cfg = load_config(
        None,
        {
            "model.path": str(model_dir),
            "model.dtype": dtype,
            "trainer.device": device,
            "trainer.impl": impl,
            "trainer.beta": 0.05,
            "worker.group_size": 8,
            "worker.sampling.max_new_tokens": 48,
        },
    )
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    seen = captured_gradients(learner)
    gs = groups_of(32, prompt=124)
    learner.begin_epoch(0, len(gs))
    for g in gs:
        learner.accumulate(g)
    metrics = learner.step()
    assert metrics["loss"] == metrics["loss"] and seen  # a finite loss, a gradient captured
    return {name: grad.float().cpu() for name, grad in seen.items()}


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-4), ("bfloat16", 5e-2)])
def test_cuda_gradient_equals_the_cpu_path(model_dir: Path, dtype: str, tol: float) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    on_cpu = step_gradient(model_dir, "cpu", "cpu", dtype)
    on_cuda = step_gradient(model_dir, "cuda", "gpu", dtype)
    assert on_cpu.keys() == on_cuda.keys() and on_cpu
    scale = max(g.abs().max().item() for g in on_cpu.values())
    worst = max((on_cpu[n] - on_cuda[n]).abs().max().item() for n in on_cpu) / scale
    assert worst < tol, worst


def test_packed_rows_equal_the_dense_reference_on_cuda(model_dir: Path) -> None:
    device = torch.device("cuda")
    model = load_model(model_dir, device, "float32")
    gs = groups_of(16, prompt=124)
    batch = build(gs, [0.0] * 16, True, False, device)
    mask = attention_mask(model, allowed_mask(batch.segment, batch.sample), batch.position_ids)
    with torch.no_grad():
        packed, _ = device_logprobs(model, batch, mask, Behaviour())
        pairs = [(g.prompt_ids, [s.token_ids for s in g.samples]) for g in gs]
        dense = response_logprobs(model, collate_unpacked(pairs).to(device))
    assert torch.allclose(packed, dense, atol=1e-4, rtol=0), (packed - dense).abs().max()


def test_cuda_ops_stay_flat_and_syncs_per_step_constant(model_dir: Path) -> None:
    """The CPU proxies, on the device itself: device-to-host copies count as syncs here too."""
    counts = {}
    for n in (16, 64):
        cfg = load_config(
            None,
            {
                "model.path": str(model_dir),
                "model.dtype": "bfloat16",
                "trainer.device": "cuda",
                "trainer.beta": 0.02,
                "worker.group_size": 8,
                "worker.sampling.max_new_tokens": 48,
            },
        )
        learner = GRPOLearner(learner_settings(cfg), model_dir)
        assert learner.impl == "gpu" and learner.micro_batch_tokens > 2048  # auto: by device, memory budget
        gs = groups_of(n, prompt=124)
        for index in range(2):
            learner.begin_epoch(index, len(gs))
            with DispatchCount() as count:
                for g in gs:
                    learner.accumulate(g)
                learner.flush()
                learner.step()
        counts[n] = count
    assert counts[64].ops / counts[16].ops <= 1.25, (counts[16].ops, counts[64].ops)
    assert counts[64].syncs <= 10, counts[64].by_sync

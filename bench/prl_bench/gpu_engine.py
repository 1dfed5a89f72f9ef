"""Benchmark: the torch engine's gpu decode path against Hugging Face `generate`, at issue 38's shape.

Shape (bench/prl_bench/gpu.py's model): a random-init Qwen2 of Qwen2.5-0.5B's blocks (358M
parameters with the tiny qwen2 tokenizer), bfloat16, 16 chat prompts (~124 tokens) x G = 8, answers
capped at 256 tokens. The end-of-turn logit is raised along the mean final hidden state until its
average probability is 1/110 per token (as chat_shape.py calibrates its CPU models), so answers are
~geometric with mean ~100 and groups end at different steps.

Measured, each after one warm-up batch (the graphs are captured there), the device synchronised
around each batch:
- engine (worker.impl=gpu): seconds per batch of 128 samples, response tokens/s, ms per decode step
  (batch seconds / decode steps, admission included), graph launches per decode step (1.0 when every
  step is one captured graph), peak memory;
- the same engine with the graphs off (eager): aten ops and host syncs per decode step
  (training/dispatch_count.py);
- the running batch (worker.impl=cpu) on the same device: seconds per batch (the path issue 38
  measured at 10-14 s);
- `model.generate` (sampling, the same 128 rows left-padded, max_new_tokens 256): seconds per batch,
  tokens/s, peak memory.

`run(out_dir, device, quick)` returns the numbers as a dict (bench/prl_bench/gpu.py makes entries of
them; quick: one timed batch each, no running-batch run). Without CUDA it returns {"skipped": "no
CUDA"}, unless quick on the CPU: then the same code runs at a tiny shape (2 prompts x 4, 16 tokens) as
a smoke test, numbers meaningless.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prl_bench.chat_shape import EOS_RATE

FULL = {"prompts": 16, "group": 8, "max_new_tokens": 256, "repeats": 3}
SMOKE = {"prompts": 2, "group": 4, "max_new_tokens": 16, "repeats": 1}


def run(out_dir: Path, device: str, quick: bool) -> dict[str, Any]:
    import torch

    cuda = device.startswith("cuda") and torch.cuda.is_available()
    if not cuda and not (quick and device == "cpu"):
        return {"skipped": "no CUDA"}
    from prl_bench.gpu import build_model

    shape = SMOKE if not cuda else FULL | ({"repeats": 1} if quick else {})
    model_dir = calibrated(build_model(Path(out_dir) / ("tiny" if not cuda else "qwen2-358m"), tiny=not cuda), device)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu"}
    result.update(engine(model_dir, device, shape, "gpu"))
    result.update(eager_counts(model_dir, device, shape))
    if cuda and not quick:
        result.update(engine(model_dir, device, {**shape, "repeats": 1}, "cpu"))
    result.update(hf_generate(model_dir, device, shape))
    if result.get("hf_generate_s_per_batch") and result.get("engine_gpu_s_per_batch"):
        result["speedup_vs_hf_generate"] = result["hf_generate_s_per_batch"] / result["engine_gpu_s_per_batch"]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "gpu_engine.json").write_text(json.dumps(result, indent=2))
    return result


def calibrated(model_dir: Path, device: str) -> Path:
    """The model with its end-of-turn embedding row moved so that mean p(eos) = EOS_RATE (bisection on
    the final hidden states of the chat prompts followed by random tokens); done once per directory."""
    import torch

    from prl_actors.model.builtin import load_model, quiet_progress
    from prl_actors.model.tokenizer import load_tokenizer
    from prl_bench.chat_shape import shift_eos

    stamp = model_dir / "prl_eos_calibrated.json"
    if stamp.is_file():
        return model_dir
    model: Any = load_model(model_dir, device, "float32")
    tok: Any = load_tokenizer(model_dir)
    eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
    gen = torch.Generator().manual_seed(0)
    rows = [p + torch.randint(0, len(tok), (128,), generator=gen).tolist() for p in prompt_ids(model_dir, 16)]
    beta = shift_eos(model, rows, eos, EOS_RATE)
    model.generation_config.eos_token_id = eos
    with quiet_progress():
        model.to(torch.bfloat16).save_pretrained(model_dir)
    stamp.write_text(json.dumps({"eos_rate": EOS_RATE, "beta": beta}))
    return model_dir


def prompt_ids(model_dir: Path, n: int) -> list[list[int]]:
    from prl_bench.gpu import chat_prompts

    return chat_prompts(model_dir, n)


def questions(n: int) -> list[str]:
    from prl_actors.tasks.math_task import sample_path

    lines = [json.loads(x)["question"] for x in Path(sample_path()).read_text().splitlines() if x.strip()]
    return (lines * n)[:n]


def engine_config(model_dir: Path, device: str, shape: dict[str, int], impl: str) -> Any:
    from prl_actors.config import load_config
    from prl_bench.chat_shape import chat_settings

    over = chat_settings(shape["prompts"], shape["max_new_tokens"])
    over.update({"model.path": str(model_dir), "worker.device": device, "worker.impl": impl})
    over.update({"model.dtype": "bfloat16" if device != "cpu" else "float32", "worker.max_batch_rows": 128})
    over["worker.group_size"] = shape["group"]
    return load_config(None, over)


def engine(model_dir: Path, device: str, shape: dict[str, int], impl: str) -> dict[str, Any]:
    """Seconds per batch, tokens/s, ms per step, graph launches per step, peak memory of TorchEngine."""

    from prl_actors.engines.torch_engine import TorchEngine
    from prl_actors.launch import build
    from prl_actors.protocol.messages import Prompt

    eng = TorchEngine(build.engine_settings(engine_config(model_dir, device, shape, impl)), model_dir)
    eng.version = 0
    ps = [Prompt(group_id=i, prompt=q) for i, q in enumerate(questions(shape["prompts"]))]
    eng.generate(ps, shape["group"])  # warm-up: graphs captured here
    _reset_peak(device)
    times, tokens, steps, launches = [], 0, 0, 0
    for _ in range(shape["repeats"]):
        before = _counts(eng)
        t = _clock(device)
        groups = eng.generate(ps, shape["group"])
        times.append(_clock(device) - t)
        after = _counts(eng)
        steps, launches = steps + after[0] - before[0], launches + after[1] - before[1]
        tokens += sum(len(s.token_ids) for g in groups for s in g.samples)
    s = sorted(times)[len(times) // 2]
    out = {
        f"engine_{impl}_s_per_batch": s,
        f"engine_{impl}_tokens_per_s": tokens / sum(times),
        f"engine_{impl}_peak_gib": _peak(device),
    }
    if impl == "gpu":
        out |= {"engine_gpu_ms_per_step": 1000 * sum(times) / max(steps, 1), "engine_gpu_steps": steps / len(times)}
        out["engine_gpu_graph_launches_per_step"] = launches / max(steps, 1)
    eng.close()
    return out


def _counts(eng: Any) -> tuple[int, int]:
    batch = eng.batch
    return getattr(batch, "steps", 0), getattr(getattr(batch, "runner", None), "replays", 0)


def eager_counts(model_dir: Path, device: str, shape: dict[str, int]) -> dict[str, Any]:
    """aten ops and host syncs per decode step of the gpu path with its graphs off (training/dispatch_count.py)."""
    from prl_actors.engines.torch_engine import TorchEngine
    from prl_actors.launch import build
    from prl_actors.protocol.messages import Prompt
    from prl_actors.training.dispatch_count import DispatchCount

    eng = TorchEngine(build.engine_settings(engine_config(model_dir, device, shape, "gpu")), model_dir)
    eng.version = 0
    eng.batch.runner.capture = False  # type: ignore[union-attr]
    eng.admit([Prompt(group_id=i, prompt=q) for i, q in enumerate(questions(shape["prompts"]))], shape["group"])
    eng.step()  # admission
    before = eng.batch.steps  # type: ignore[union-attr]
    with DispatchCount() as c:
        eng.step()
    steps = max(eng.batch.steps - before, 1)  # type: ignore[union-attr]
    eng.close()
    return {"engine_gpu_eager_ops_per_step": c.ops / steps, "engine_gpu_syncs_per_step": c.syncs / steps}


def hf_generate(model_dir: Path, device: str, shape: dict[str, int]) -> dict[str, Any]:
    """`model.generate` on the same rows (left-padded prompts x G, sampling), seconds and tokens/s."""
    import torch

    from prl_actors.engines.sampling import left_pad
    from prl_actors.model.builtin import load_model
    from prl_actors.model.tokenizer import load_tokenizer

    model: Any = load_model(model_dir, device, "bfloat16" if device != "cpu" else "float32")
    tok: Any = load_tokenizer(model_dir)
    rows = [p for p in prompt_ids(model_dir, shape["prompts"]) for _ in range(shape["group"])]
    ids, mask = (t.to(device) for t in left_pad(rows, int(tok.pad_token_id)))
    eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
    kw = dict(max_new_tokens=shape["max_new_tokens"], do_sample=True, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, **kw)  # warm-up
        _reset_peak(device)
        times, tokens = [], 0
        for _ in range(shape["repeats"]):
            t = _clock(device)
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
            times.append(_clock(device) - t)
            new = out[:, ids.shape[1] :]
            tokens += int((new != tok.pad_token_id).sum())
    return {
        "hf_generate_s_per_batch": sorted(times)[len(times) // 2],
        "hf_generate_tokens_per_s": tokens / sum(times),
        "hf_generate_peak_gib": _peak(device),
    }


def _clock(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def _reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0

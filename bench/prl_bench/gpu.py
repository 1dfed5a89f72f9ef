"""Benchmark: the trainer (and, from the engine's own module, generation) on a GPU, at issue 37's shape.

Shape: a random-init Qwen2 of Qwen2.5-0.5B's blocks (hidden 896, 24 layers, 14 / 2 heads,
intermediate 4864, tied embeddings) with the project's tiny qwen2 tokenizer (vocab 384: 358M
parameters), bfloat16, the math task's chat prompts (ChatML and the system prompt of
chat_shape.py, ~124 tokens), 16 prompts x G = 8, beta 0.02. Answers are drawn here, not generated:
lengths ~geometric with mean 100, capped at 256 (as chat_shape.py calibrates its models to give),
random tokens, mixed 0/1 rewards, so the trainer sees the issue's work (~15k tokens a step) without
the engine's share of the time.

Per trainer.impl (gpu, and cpu on the same device for comparison) it reports seconds of training
per step (accumulate every group, flush, step; the device synchronised around it), trainer tokens/s
(response tokens), MFU (useful FLOPs: 6 x non-embedding parameters x packed tokens for the policy,
2 x for the reference, the head per response token and the attention pairs the mask allows, over
the device's dense bf16 peak), peak memory, and the ops and host syncs one epoch dispatches
(training/dispatch_count.py). Then the single-process loop (prl_bench.e2e.Loop, the torch engine
generating on the same GPU) on a copy of the model whose end-of-turn logit is calibrated as in
chat_shape.py: seconds per step, generation tokens/s, training seconds. `prl-actors up` on that
model with the loop's settings (1 worker, worker and trainer on the same GPU; run first, before this
process holds GPU memory, so the trainer's memory budget sees the whole device), a few epochs under
a deadline: from RUN/metrics.jsonl (medians after the first epoch) seconds per step, generation and
training seconds per step (wall_s, gen_s, train_s), generated and trainer tokens/s; whether
`prl-actors replay RUN --check` passes; peak memory from the metrics rows if they carry it (`up`
logs none today), else the device's memory in use (every process, `torch.cuda.mem_get_info`) sampled
on a thread while `up` runs, less what was in use before it started. TRL's GRPOTrainer runs
alongside when `trl` is importable (its whole step: generation and training).
`bench/prl_bench/gpu_engine.py`, when present, adds the engine against HF generate (issue 38).

Without CUDA the benchmark prints one line and returns nothing; the smoke preset (tests) runs the
same code at a tiny shape on the CPU instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prl_bench.common import BenchContext, Entry

BENCH = "gpu"
SHAPE = {"hidden": 896, "layers": 24, "heads": 14, "kv": 2, "intermediate": 4864}
TINY = {"hidden": 64, "layers": 2, "heads": 4, "kv": 2, "intermediate": 128}
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}
"""Dense bf16 tensor-core peak by device name (FLOP/s), for MFU."""
MEAN_LEN, CAP = 100, 256


def run(ctx: BenchContext) -> list[Entry]:
    import torch

    if not torch.cuda.is_available():
        if not ctx.smoke:
            ctx.say("[gpu] skipped: torch sees no CUDA device")
            return []
        entries = trainer_entries(ctx.work_dir, "cpu", tiny=True, say=ctx.say)
        entries += loop_entries(ctx.work_dir, "cpu", tiny=True, iters=2, say=ctx.say)
        return entries + up_entries(ctx, "cpu", tiny=True, epochs=2)
    # `up` first: its trainer sizes micro-batches from the GPU's free memory, which this process's
    # cached blocks would otherwise hold
    entries = up_entries(ctx, "cuda", tiny=ctx.smoke, epochs=ctx.size(5, 3, 2))
    entries += trainer_entries(ctx.work_dir, "cuda", tiny=ctx.smoke, steps=ctx.size(5, 3, 1), say=ctx.say)
    entries += loop_entries(ctx.work_dir, "cuda", tiny=ctx.smoke, iters=ctx.size(3, 2, 2), say=ctx.say)
    entries += trl_entries(ctx)
    entries += engine_entries(ctx)
    return entries


def build_model(out_dir: Path, tiny: bool, calibrate: str = "") -> Path:
    """The random-init Qwen2 of SHAPE (TINY for the smoke run) with the tiny qwen2 tokenizer; with
    `calibrate` (a device) its end-of-turn logit raised as chat_shape.py does, so generated answers
    are ~geometric with mean ~100 (chat_shape.calibrate_eos)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from prl_actors.model.builtin import quiet_progress
    from prl_actors.model.tiny import SPECS, build_tokenizer, token_id

    if (out_dir / "config.json").is_file():
        return out_dir
    s = TINY if tiny else SHAPE
    tok = build_tokenizer(SPECS["qwen2"])
    eos, pad = token_id(tok, "<|im_end|>"), token_id(tok, "<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
        tie_word_embeddings=True, max_position_embeddings=1024, eos_token_id=eos,
        pad_token_id=pad,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    if calibrate:
        from prl_bench.chat_shape import calibrate_eos

        calibrate_eos(model.to(calibrate), tok, eos)
        model.generation_config.eos_token_id = [eos, pad]
        model.generation_config.pad_token_id = pad
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_progress():
        model.to("cpu").save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def chat_prompts(model_dir: Path, n: int) -> list[list[int]]:
    """The math task's first n questions as ChatML prompts with chat_shape's system prompt."""
    from transformers import AutoTokenizer

    return _chat_ids(AutoTokenizer.from_pretrained(str(model_dir)), n)


def _chats() -> list[list[dict[str, str]]]:
    """The math task's sample questions as chat messages under chat_shape's system prompt."""
    from prl_actors.tasks.math_task import sample_path
    from prl_bench.chat_shape import SYSTEM_PROMPT

    lines = [ln for ln in Path(sample_path()).read_text().splitlines() if ln.strip()]
    system = {"role": "system", "content": SYSTEM_PROMPT}
    return [[system, {"role": "user", "content": json.loads(ln)["question"]}] for ln in lines]


def _chat_ids(tok: Any, n: int) -> list[list[int]]:
    out = []
    for msgs in (_chats() * n)[:n]:
        ids: Any = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def groups(prompts: list[list[int]], size: int, cap: int, mean: float, vocab: int, seed: int = 0) -> list[Any]:
    """Groups with ~geometric answer lengths (mean `mean`, cap `cap`), random tokens, mixed rewards."""
    from prl_actors.protocol.messages import Group, Sample

    rng = random.Random(seed)
    out = []
    for g, prompt in enumerate(prompts):
        samples = []
        for i in range(size):
            n = min(cap, 1 + int(rng.expovariate(1 / mean)))
            ids = [rng.randrange(vocab) for _ in range(n)]
            lp = [-math.log(vocab)] * n
            samples.append(Sample(text="", token_ids=ids, logprobs=lp, reward=float(i % 2), finished=n < cap))
        out.append(Group(group_id=g, prompt="", prompt_ids=prompt, samples=samples, worker="bench"))
    return out


def step_flops(cfg: Any, gs: list[Any]) -> float:
    """Useful FLOPs of one step: policy forward + backward (6x) and reference forward (2x) over the
    packed tokens, the head over the response tokens, the attention pairs the block mask allows."""
    h, layers, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * cfg.intermediate_size
    packed = sum(len(g.prompt_ids) + sum(len(s.token_ids) for s in g.samples) for g in gs)
    responses = sum(len(s.token_ids) for g in gs for s in g.samples)
    pairs = 0.0
    for g in gs:
        p = len(g.prompt_ids)
        pairs += p * (p + 1) / 2 + sum(len(s.token_ids) * (p + (len(s.token_ids) + 1) / 2) for s in g.samples)
    return 8.0 * (layers * per_layer * packed + v * h * responses) + 4 * 4.0 * h * layers * pairs


def measure(model_dir: Path, device: str, impl: str, gs: list[Any], steps: int, tiny: bool) -> dict[str, Any]:
    """Seconds per training step (median of `steps` after one warm-up), peak memory, ops and syncs."""
    import torch

    from prl_actors.config import load_config
    from prl_actors.launch.topology import learner_settings
    from prl_actors.training.dispatch_count import DispatchCount
    from prl_actors.training.grpo import GRPOLearner

    overrides = {
        "model.path": str(model_dir),
        "trainer.device": device,
        "trainer.impl": impl,
        "model.dtype": "float32" if tiny else "bfloat16",
        "trainer.beta": 0.02,
        "trainer.lr": 1e-6,
        "worker.group_size": len(gs[0].samples),
        "worker.sampling.max_new_tokens": CAP,
    }
    learner = GRPOLearner(learner_settings(load_config(None, overrides)), model_dir)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def one_step(i: int) -> None:
        learner.begin_epoch(i, len(gs))
        for g in gs:
            learner.accumulate(g)
        learner.flush()
        learner.step()

    times = []
    for i in range(steps + 1):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        one_step(i)
        sync()
        times.append(time.perf_counter() - t0)
    with DispatchCount() as count:
        one_step(steps + 1)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None  # None off CUDA (JSON has no NaN)
    return {
        "s_per_step": statistics.median(times[1:]),
        "times": times,
        "peak_gib": peak,
        "ops": count.ops,
        "syncs": count.syncs,
        "micro_batch_tokens": learner.micro_batch_tokens,
    }


def trainer_entries(
    work: Path, device: str, tiny: bool, steps: int = 1, say: Any = print, prompts_n: int = 16, size: int = 8
) -> list[Entry]:
    """The trainer at SHAPE (or TINY: 4 prompts x 4, answers up to 16 tokens) on `device`, impl gpu and cpu."""
    import torch
    from transformers import AutoConfig

    model_dir = build_model(work / ("tiny" if tiny else "qwen2-358m"), tiny)
    cfg = AutoConfig.from_pretrained(str(model_dir))
    n, g_size, cap, mean = (4, 4, 16, 6.0) if tiny else (prompts_n, size, CAP, float(MEAN_LEN))
    gs = groups(chat_prompts(model_dir, n), g_size, cap, mean, cfg.vocab_size)
    flops = step_flops(cfg, gs)
    responses = sum(len(s.token_ids) for g in gs for s in g.samples)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    # the cpu impl on a GPU is the slow baseline (~20-30 s a step at SHAPE): one timed step is enough
    runs = {impl: measure(model_dir, device, impl, gs, steps if impl == "gpu" else 1, tiny) for impl in ("gpu", "cpu")}
    shape = "tiny" if tiny else "qwen2-358m"
    say(f"[gpu] {name}: " + ", ".join(f"impl {k} {r['s_per_step']:.3f} s/step" for k, r in runs.items()))
    out = []
    for impl, r in runs.items():
        s = r["s_per_step"]
        raw = {**r, "device": name, "flops": flops, "response_tokens": responses, "groups": n, "group_size": g_size}
        goal = 0.2 if (impl == "gpu" and device == "cuda" and not tiny) else None
        out.append(Entry(BENCH, f"trainer impl {impl} {shape} {device}", "training s per step", s, "s", s, goal, "<=",
                         bound=0.1 if goal else None, raw=raw,
                         note="issue 37 goal: <= 0.2 s (>= 3x TRL's training); limit ~0.1 s"))  # fmt: skip
        out.append(Entry(BENCH, f"trainer impl {impl} tokens/s {shape} {device}", "response tokens/s",
                         responses / s, "tok/s", responses / s, None, raw={"s_per_step": s}))  # fmt: skip
        if peak:
            mfu = flops / s / peak
            out.append(Entry(BENCH, f"trainer impl {impl} MFU {shape}", "MFU", mfu, "fraction", mfu, None,
                             raw={"peak_flops": peak, "flops": flops}))  # fmt: skip
        if device == "cuda":
            gib, budget = r["peak_gib"], {"micro_batch_tokens": r["micro_batch_tokens"]}
            out.append(Entry(BENCH, f"trainer impl {impl} peak memory {shape}", "peak allocated", gib, "GiB", gib,
                             None, raw=budget))  # fmt: skip
        out.append(Entry(BENCH, f"trainer impl {impl} ops per epoch {shape} {device}", "dispatched aten ops",
                         r["ops"], "count", r["ops"], None, raw={"syncs": r["syncs"]}))  # fmt: skip
    speedup = runs["cpu"]["s_per_step"] / runs["gpu"]["s_per_step"]
    out.append(Entry(BENCH, f"trainer impl gpu over impl cpu {shape} {device}", "speed-up", speedup, "x", speedup,
                     None, raw={k: r["s_per_step"] for k, r in runs.items()}))  # fmt: skip
    return out


def loop_entries(work: Path, device: str, tiny: bool, iters: int, say: Any = print) -> list[Entry]:
    """The single-process loop (prl_bench.e2e.Loop: the torch engine generates the batch, the learner
    trains it, repeat) on `device`: seconds per step, generation tokens/s, training seconds."""
    from prl_actors.config import load_config
    from prl_bench.e2e import Loop

    shape = "tiny" if tiny else "qwen2-358m"
    model_dir = build_model(work / f"{shape}-chat", tiny, calibrate=device)
    loop = Loop(load_config(None, loop_settings(model_dir, device, tiny)), model_dir)
    rows = [loop.iteration(i) for i in range(iters)]
    steady = rows[1:] or rows
    med = {k: statistics.median(r[k] for r in steady) for k in rows[0]}
    train = med["train_s"] + med["step_s"]
    say(f"[gpu] loop on {device}: {med['wall_s']:.2f} s/step (generation {med['gen_s']:.2f}, training {train:.2f})")
    raw = {"rows": rows, "impl": loop.learner.impl, "micro_batch_tokens": loop.learner.micro_batch_tokens}
    return [
        Entry(BENCH, f"single-process loop {shape} {device}", "s per step", med["wall_s"], "s", med["wall_s"], None,
              raw=raw, note="issue 37: TRL GRPOTrainer 9.6 s/step on an H200 at this shape"),
        Entry(BENCH, f"single-process loop generation {shape} {device}", "generated tokens/s",
              med["tokens"] / med["gen_s"], "tok/s", med["tokens"] / med["gen_s"], None, raw={"gen_s": med["gen_s"]}),
        Entry(BENCH, f"single-process loop training {shape} {device}", "training s per step", train, "s", train,
              None, raw={"train_s": med["train_s"], "step_s": med["step_s"]}),
    ]  # fmt: skip


def up_entries(ctx: BenchContext, device: str, tiny: bool, epochs: int) -> list[Entry]:
    """`prl-actors up` (1 worker; worker and trainer on `device`) on the loop's model and settings,
    for `epochs` under a deadline (prl_bench.e2e.measure_actors): seconds per step, generation and
    training seconds per step (the metrics rows' wall_s, gen_s and train_s, medians after the first
    epoch), generated and trainer tokens/s, and whether `prl-actors replay RUN --check` passes."""
    from prl_bench.e2e import measure_actors

    shape = "tiny" if tiny else "qwen2-358m"
    model_dir = build_model(ctx.work_dir / f"{shape}-chat", tiny, calibrate=device)
    _release_cuda()  # the calibration's cached blocks: `up`'s trainer sizes its micro-batches from free memory
    deadline = 300.0 if tiny else 600.0 + 120.0 * epochs
    with sampled_peak(_device_gib_in_use if device == "cuda" else None) as sampled:
        run = measure_actors(ctx, f"gpu-{shape}-{device}", model_dir, epochs, loop_settings(model_dir, device, tiny),
                             timeout_s=deadline)  # fmt: skip
    steady = [r for r in run["rows"] if "wall_s" in r and not r.get("eval")]
    steady = steady[1:] or steady
    med = {k: statistics.median(float(r[k]) for r in steady) for k in ("wall_s", "gen_s", "train_s", "tokens")}
    check = replay_check(run["run_dir"])
    logged = peak_memory_gib(run["rows"])
    peak = logged if logged is not None else (sampled[0] if sampled else None)
    ctx.say(f"[gpu] up on {device}: {med['wall_s']:.2f} s/step (generation {med['gen_s']:.2f}, training "
            f"{med['train_s']:.2f}); replay --check {check}")  # fmt: skip
    rows = [{k: r.get(k) for k in ("epoch", "wall_s", "gen_s", "train_s", "tokens")} for r in run["rows"]]
    raw = {**med, "epochs": run["epochs"], "replay_check": check, "peak_gib": peak, "deadline": deadline, "rows": rows}
    out = [
        Entry(BENCH, f"up {shape} {device}", "s per step", med["wall_s"], "s", med["wall_s"],
              9.6 if device == "cuda" and not tiny else None, "<=", raw=raw,
              note="issue 37 goal: <= TRL GRPOTrainer's 9.6 s/step on an H200 at this shape; "
                   f"replay --check {check}"),
        Entry(BENCH, f"up generation {shape} {device}", "generation s per step", med["gen_s"], "s", med["gen_s"],
              None, raw={"generated_tokens_per_s": med["tokens"] / med["gen_s"]}),
        Entry(BENCH, f"up training {shape} {device}", "training s per step", med["train_s"], "s", med["train_s"],
              None, raw={"train_s": med["train_s"]}),
        Entry(BENCH, f"up trainer tokens/s {shape} {device}", "response tokens/s of training",
              med["tokens"] / med["train_s"], "tok/s", med["tokens"] / med["train_s"], None,
              raw={"tokens": med["tokens"]}),
    ]  # fmt: skip
    if peak is not None:
        how = "peak allocated (up's metrics)" if logged is not None else "peak device memory in use by up (sampled)"
        note = "" if logged is not None else "4x a second: every process on the device, less what it held before"
        out.append(Entry(BENCH, f"up peak memory {shape}", how, peak, "GiB", peak, None, note=note))
    return out


def loop_settings(model_dir: Path, device: str, tiny: bool) -> dict[str, Any]:
    """The overrides of the single-process loop and of `up`: chat_shape's math task with chat prompts,
    16 prompts x G = 8, up to CAP new tokens (tiny: 4 x 4, 16), bfloat16 (tiny: float32)."""
    from prl_bench.chat_shape import chat_settings

    return {
        **chat_settings(4 if tiny else 16, 16 if tiny else CAP),
        "worker.group_size": 4 if tiny else 8,
        "model.path": str(model_dir),
        "model.dtype": "float32" if tiny else "bfloat16",
        "trainer.device": device,
        "worker.device": device,
    }


def replay_check(run_dir: Path) -> str:
    """'ok', or the tail of what `prl-actors replay RUN --check` said when it failed."""
    out = subprocess.run([sys.executable, "-m", "prl_actors.cli.main", "replay", str(run_dir), "--check"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    return "ok" if out.returncode == 0 else f"FAILED ({out.returncode}): {(out.stdout + out.stderr)[-500:]}"


def peak_memory_gib(rows: list[dict[str, Any]]) -> float | None:
    """The largest peak-memory figure the metrics rows carry (a key naming peak memory in GiB), if any:
    `up` does not log one today, so this is None until it does."""
    found = [float(v) for r in rows for k, v in r.items() if "peak" in k and k.endswith("gib")]
    return max(found) if found else None


@contextlib.contextmanager
def sampled_peak(read: Callable[[], float] | None, every_s: float = 0.25) -> Iterator[list[float]]:
    """While the block runs, `read()` (GiB in use) every `every_s` on a thread; afterwards the list it
    yields holds the peak less the reading at the start (it stays empty without `read`)."""
    out: list[float] = []
    if read is None:
        yield out
        return
    start, seen, stop = read(), [0.0], threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            seen.append(read() - start)

    thread = threading.Thread(target=sample, name="bench-gpu-memory", daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        out.append(max(seen))


def _device_gib_in_use() -> float:
    """Memory in use on the current CUDA device by every process (the driver's count), GiB."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def _release_cuda() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def trl_entries(ctx: BenchContext) -> list[Entry]:
    """TRL's GRPOTrainer at the same shape (its whole step), when `trl` is importable."""
    try:
        import trl  # noqa: F401
    except ImportError:
        ctx.say("[gpu] trl not importable: TRL's GRPOTrainer not run")
        return []
    try:
        raw = _trl_run(ctx, steps=ctx.size(4, 3, 2))
    except Exception as exc:  # a TRL version we do not match: recorded, the rest of the bench stands
        ctx.say(f"[gpu] TRL failed: {type(exc).__name__}: {exc}")
        return []
    s = raw["s_per_step"]
    return [Entry(BENCH, "TRL GRPOTrainer qwen2-358m cuda", "s per step (generation + training)", s, "s", s, None,
                  raw=raw)]  # fmt: skip


def _trl_run(ctx: BenchContext, steps: int) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model_dir = build_model(ctx.work_dir / "qwen2-358m", tiny=False)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    data = Dataset.from_list([{"prompt": msgs} for msgs in _chats()])
    stamps: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=str(ctx.work_dir / "trl"), per_device_train_batch_size=16 * 8, num_generations=8,
        max_completion_length=CAP, beta=0.02, bf16=True, max_steps=steps + 1, logging_steps=1,
        report_to=[], save_strategy="no",
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    trainer = GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [float(len(c) % 2) for c in completions],
        args=args, train_dataset=data, processing_class=tok, callbacks=[Clock()],
    )  # fmt: skip
    trainer.train()
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {"s_per_step": statistics.median(gaps), "steps": gaps, "trl": __import__("trl").__version__}


def engine_entries(ctx: BenchContext) -> list[Entry]:
    """The engine against HF generate (bench/prl_bench/gpu_engine.py, issue 38), when present."""
    try:
        from prl_bench import gpu_engine  # type: ignore[attr-defined]
    except ImportError:
        ctx.say("[gpu] gpu_engine not present: engine vs HF generate not run")
        return []
    result = gpu_engine.run(ctx.work_dir / "engine", "cuda", ctx.quick or ctx.smoke)
    out = []
    for key, value in result.items():
        if isinstance(value, int | float) and math.isfinite(value) and value > 0:
            out.append(Entry(BENCH, f"engine {key}", key, float(value), "", float(value), None, raw=result))
    return out

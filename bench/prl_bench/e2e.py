"""Benchmark: prl-actors end to end against the loop a user would write instead, at equal work.

The baseline is one process (the faster of: every core, one thread): per iteration it generates the
whole batch (B prompts x G samples) in one batch with the same engine code, scores it, trains it (the
same GRPO learner: one accumulate per group, one optimizer step) and generates the next batch with
the updated model, which it shares (no weight copy). prl-actors runs the same config through
`prl-actors up` (periodic, one worker, threads split between trainer and worker). Both report
samples/s of steady-state iterations, side by side in one run, at three model shapes.

The CPU-aware bound (docs/BENCHMARKS.md): no schedule of the same work on C cores can take less than

    E* = max((G1 + T1 + S1) / C,  min(G1, GC) + min(S1, SC)) + W

G1 / T1 / S1: generating the whole batch / its forward + backward / the optimizer step on one thread
(the cheapest way to spend core-seconds; parallel efficiency is at most 1), so the work alone fills
C cores for (G1 + T1 + S1) / C; and generation must end, at its fastest (GC: on C threads), before
the step runs. W: moving the new weights (the run's own median upload + fetch), which the loop never
pays. `bound` is the loop's epoch time over E*: the speed-up over the single-process loop that a
perfect overlap on this machine would give (below 1 where the loop already uses every core well);
`of_bound` = measured / bound.

Also: the engine's tokens/s against Hugging Face `generate` (sampling, same prompts, same batch).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prl_bench.chat_shape import CHAT_MODELS, build_chat_model, chat_settings, measure_hf
from prl_bench.common import BenchContext, Entry, free_port, rounded, run_up, up_argv

DDP2 = {"trainer.world_size": 2, "trainer.strategy": "ddp"}
SHAPES = {  # name -> model settings
    "demo": {"model.hidden_size": 64, "model.layers": 2, "model.heads": 4, "model.warm_start_steps": 100},
    "h128-L4": {"model.hidden_size": 128, "model.layers": 4, "model.heads": 4, "model.warm_start_steps": 0},
    "h512-L8": {"model.hidden_size": 512, "model.layers": 8, "model.heads": 8, "model.warm_start_steps": 0},
}


def settings(ctx: BenchContext, shape: str) -> dict[str, Any]:
    return {
        **SHAPES[shape],
        "coordinator.groups_per_epoch": ctx.size(16, 16, 4),
        "worker.group_size": 8,
        "worker.sampling.max_new_tokens": 8,
        "trainer.beta": 0.02,
        "trainer.checkpoint_every": 0,
        "task.name": "add",
    }


def _config(overrides: dict[str, Any]) -> Any:
    from prl_actors.config import load_config

    return load_config(None, overrides)


def prepare(ctx: BenchContext, shape: str) -> Path:
    from prl_actors.launch import build

    where = ctx.work_dir / f"model-{shape}"
    cfg = _config(
        {"run.run_dir": str(where), **{k: v for k, v in settings(ctx, shape).items() if k.startswith("model")}}
    )
    if ctx.smoke:
        cfg.model.warm_start_steps = 0
    return build.model_dir(cfg, where)


# --- the single-process loop -------------------------------------------------------------------


class Loop:
    """Generate the batch in one batch, train it, repeat: one process, one shared model."""

    def __init__(self, cfg: Any, model_dir: Path) -> None:
        from prl_actors.engines.batching import RunningBatch
        from prl_actors.engines.sampling import seed_for
        from prl_actors.launch import build
        from prl_actors.launch.topology import learner_settings
        from prl_actors.model.tokenizer import load_tokenizer
        from prl_actors.training.behaviour import Behaviour
        from prl_actors.training.grpo import GRPOLearner

        self.cfg, self.seed_for = cfg, seed_for
        self.learner = GRPOLearner(learner_settings(cfg), model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.task = build.task(cfg)
        self.B, self.G = cfg.coordinator.groups_per_epoch, cfg.worker.group_size
        s = cfg.worker.sampling
        eos = {int(self.tokenizer.eos_token_id)}
        stop = self.learner.policy.generation_config.eos_token_id  # e.g. ChatML's <|im_end|> and <|endoftext|>
        eos |= set(stop if isinstance(stop, list) else [] if stop is None else [stop])
        self.batch = RunningBatch(
            self.learner.policy,
            max_rows=self.B * self.G,
            eos_ids=eos,
            pad_id=int(self.tokenizer.pad_token_id),
            behaviour=Behaviour.of(s),
            max_new_tokens=s.max_new_tokens,
        )

    def admit(self, it: int) -> None:
        """Queue iteration `it`'s B prompts, G samples each, in the running batch."""
        from prl_actors.model.tokenizer import encode_prompt

        for p in self.task.prompts_for_epoch(it, self.B):
            key = self.seed_for(self.cfg.run.seed, self.learner.version, p.group_id)
            ids = encode_prompt(self.tokenizer, p.prompt, self.cfg.task.chat_template)
            self.batch.add(p.group_id, ids, key, self.G, tag=p)

    def generate(self, it: int) -> list[Any]:
        from prl_actors.protocol.messages import Group, Sample

        self.admit(it)
        done = []
        while self.batch.busy:
            done += self.batch.step()
        groups = []
        for f in done:
            texts = [str(self.tokenizer.decode(r.tokens, skip_special_tokens=True)) for r in f.rows]
            samples = [
                Sample(
                    text=t,
                    token_ids=r.tokens,
                    logprobs=r.logprobs,
                    reward=self.task.score(f.tag, t) + self.task.length_penalty(len(r.tokens)),
                )
                for t, r in zip(texts, f.rows, strict=True)
            ]
            groups.append(
                Group(group_id=f.group_id, prompt=f.tag.prompt, prompt_ids=f.prompt_ids, samples=samples, worker="loop")
            )
        return groups

    def train(self, it: int, groups: list[Any]) -> tuple[float, float, float]:
        """(seconds accumulating, seconds stepping, CPU seconds accumulating)."""
        t0, c0 = time.perf_counter(), time.process_time()
        self.learner.begin_epoch(it, len(groups))
        for g in groups:
            self.learner.accumulate(g)
        self.learner.flush()  # the last micro-batch: forward/backward here, the optimizer step below
        t1, c1 = time.perf_counter(), time.process_time()
        self.learner.step()
        return t1 - t0, time.perf_counter() - t1, c1 - c0

    def iteration(self, it: int) -> dict[str, float]:
        t0 = time.perf_counter()
        groups = self.generate(it)
        gen = time.perf_counter() - t0
        acc, step, cpu = self.train(it, groups)
        tokens = sum(len(s.token_ids) for g in groups for s in g.samples)
        return {
            "gen_s": gen,
            "train_s": acc,
            "train_cpu_s": cpu,
            "step_s": step,
            "wall_s": gen + acc + step,
            "tokens": tokens,
        }


def loop_worker(cfg_json: str, model_dir: str, threads: int, iters: int) -> dict[str, Any]:
    """One baseline measurement (its own process, so thread settings do not leak)."""
    import torch

    from prl_actors.config import load_config

    torch.set_num_threads(threads)
    loop = Loop(load_config(None, json.loads(cfg_json)), Path(model_dir))
    rows = [loop.iteration(it) for it in range(iters)]
    steady = rows[1:] or rows
    return {"rows": rows, **{k: statistics.median(r[k] for r in steady) for k in rows[0]}}


def measure_loop(settings_: dict[str, Any], model_dir: Path, threads: int, iters: int) -> dict[str, Any]:
    code = (
        "import json, sys; from prl_bench.e2e import loop_worker; "
        "print(json.dumps(loop_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))"
    )
    args = [json.dumps(settings_), str(model_dir), str(threads), str(iters)]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"single-process loop failed: {out.stderr[-1500:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- prl-actors --------------------------------------------------------------------------------


def measure_actors(
    ctx: BenchContext,
    shape: str,
    model_dir: Path,
    epochs: int,
    overrides_: dict[str, Any] | None = None,
    tag: str = "",
    timeout_s: float = 1800.0,
) -> dict[str, Any]:
    """`prl-actors up` (1 worker) for `epochs`: medians of the steady epochs (after the first), and
    the run's dir and metrics rows for the caller (bench gpu reads generation and training from them)."""
    run_dir = ctx.work_dir / f"up-{shape}{tag}"
    chosen = settings(ctx, shape) if overrides_ is None else overrides_
    overrides = {**chosen, "model.path": str(model_dir), "transport.base_port": free_port(5)}
    cmd = up_argv(run_dir, 1, epochs, overrides)
    code, err = run_up(cmd, timeout_s=timeout_s)
    if code != 0:
        raise RuntimeError(f"prl-actors up ({shape}) failed ({code}): {err[-1500:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = rows[1:] or rows
    return {
        "wall_s": statistics.median(r["wall_s"] for r in steady),
        "tokens": statistics.median(r.get("tokens", 0.0) for r in steady),
        "samples": rows[0]["samples"],
        "sync_s": weight_sync_s(run_dir),
        "epochs": len(rows),
        "rows": rows,
        "run_dir": run_dir,
    }


def weight_sync_s(run_dir: Path) -> float:
    """Median per epoch of the trainer's upload plus the worker's fetch (from the run's logs)."""
    from prl_actors.replay.events import load_run

    run = load_run(run_dir)
    spans: dict[str, list[float]] = {"weight_upload": [], "weight_sync": []}
    for e in run.of("span_end"):
        if e.get("span") in spans and "seconds" in e:
            spans[e["span"]].append(float(e["seconds"]))
    return sum(statistics.median(v) if v else 0.0 for v in spans.values())


# --- engine vs Hugging Face generate ------------------------------------------------------------


def engine_vs_hf(cfg: Any, model_dir: Path, threads: int) -> dict[str, float]:
    """Generated tokens/s of the engine and of `model.generate`, same prompts, same batch, sampling."""
    import torch

    from prl_actors.engines.torch_engine import TorchEngine
    from prl_actors.launch import build

    torch.set_num_threads(threads)
    B, G, new = cfg.coordinator.groups_per_epoch, cfg.worker.group_size, cfg.worker.sampling.max_new_tokens
    cfg.worker.max_batch_rows = B * G
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    prompts = build.task(cfg).prompts_for_epoch(0, B)
    calls = {"engine": lambda: _engine_tokens(engine, prompts, G), "hf": lambda: _hf_tokens(engine, prompts, G, new)}
    rates: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        fn()  # warm-up
    for _ in range(5):  # interleaved rounds, the median of each: a busy moment hits both alike
        for name, fn in calls.items():
            t0 = time.perf_counter()
            tokens = fn()
            rates[name].append(tokens / (time.perf_counter() - t0))
    return {f"{name}_tokens_per_s": statistics.median(r) for name, r in rates.items()}


def _engine_tokens(engine: Any, prompts: list[Any], group_size: int) -> int:
    return sum(len(s.token_ids) for g in engine.generate(prompts, group_size) for s in g.samples)


def _hf_tokens(engine: Any, prompts: list[Any], group_size: int, new: int) -> int:
    import torch

    from prl_actors.engines.sampling import left_pad

    rows = [list(engine.tokenizer(p.prompt).input_ids) for p in prompts for _ in range(group_size)]
    ids, mask = left_pad(rows, engine.pad_id)
    with torch.no_grad():
        seqs = engine.model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=new, pad_token_id=engine.pad_id
        )
    eos = engine.batch.eos_ids
    count = 0
    for row in seqs[:, ids.shape[1] :].tolist():
        stop = next((i for i, t in enumerate(row) if t in eos), None)
        count += len(row) if stop is None else stop + 1
    return count


# --- the benchmark ---------------------------------------------------------------------------------


def run(ctx: BenchContext) -> list[Entry]:
    cores = len(os.sched_getaffinity(0))
    entries = []
    for shape in ctx.size(list(SHAPES), ["demo", "h128-L4"], ["demo"]):
        entries += run_shape(ctx, shape, cores)
    for shape in ctx.size(list(CHAT_MODELS), ["chat-h128-L4"], ["chat-h128-L4"]):
        entries += run_chat_shape(ctx, shape, cores)
    return entries


def run_shape(ctx: BenchContext, shape: str, cores: int) -> list[Entry]:
    model_dir = prepare(ctx, shape)
    base = {**settings(ctx, shape), "model.path": str(model_dir), "run.run_dir": str(ctx.work_dir / f"loop-{shape}")}
    iters = ctx.size(6, 4, 2)
    one = measure_loop(base, model_dir, 1, iters)  # the phases on one core
    every = measure_loop(base, model_dir, cores, iters)
    # the baseline is the faster of the two: a user picks the thread count that runs faster (on a busy
    # host OpenMP threads that spin for a core someone else holds can make all cores slower than one)
    loop = every if every["wall_s"] <= one["wall_s"] else one
    actors = measure_actors(ctx, shape, model_dir, ctx.size(8, 5, 2))
    samples = actors["samples"]
    work = (one["gen_s"] + one["train_s"] + one["step_s"]) / cores
    e_star = max(work, min(one["gen_s"], every["gen_s"]) + min(one["step_s"], every["step_s"])) + actors["sync_s"]
    measured = loop["wall_s"] / actors["wall_s"]  # = periodic samples/s over the loop's
    bound = loop["wall_s"] / e_star
    raw = rounded(
        {
            "loop_samples_per_s": samples / loop["wall_s"],
            "prl_actors_samples_per_s": samples / actors["wall_s"],
            "loop_epoch_s": loop["wall_s"],
            "prl_actors_epoch_s": actors["wall_s"],
            "loop_gen_s": loop["gen_s"],
            "loop_train_s": loop["train_s"] + loop["step_s"],
            "loop_threads": float(cores if loop is every else 1),
            "loop_epoch_s_all_cores": every["wall_s"],
            "loop_epoch_s_one_thread": one["wall_s"],
            "g1": one["gen_s"],
            "t1": one["train_s"],
            "s1": one["step_s"],
            "sync_s": actors["sync_s"],
            "e_star": e_star,
            "cores": float(cores),
        }
    )
    ctx.say(
        f"  e2e {shape}: loop {raw['loop_samples_per_s']:.0f} samples/s, "
        f"prl-actors {raw['prl_actors_samples_per_s']:.0f} ({measured:.2f}x; bound {bound:.2f}x)"
    )
    speed = _vs_loop(
        f"{shape}: prl-actors vs single-process loop",
        "samples/s ratio, periodic W=1 over one process on all cores",
        measured,
        bound,
        raw,
    )
    hf = engine_vs_hf(_config({**base}), model_dir, 1)  # one thread: no OpenMP spin on a shared host
    gen = Entry(
        "e2e",
        f"{shape}: engine vs HF generate",
        "generated tokens/s, same prompts and batch, one thread",
        hf["engine_tokens_per_s"],
        "tok/s",
        hf["engine_tokens_per_s"] / hf["hf_tokens_per_s"],
        1.0,
        bound=hf["hf_tokens_per_s"],
        raw=rounded(hf),
    )
    return [speed, gen]


# --- the realistic shape: chat prompts, long varied answers, and the plain HF loop -----------------


def run_chat_shape(ctx: BenchContext, shape: str, cores: int) -> list[Entry]:
    """prl-actors `up` vs the project's loop vs the plain HF loop (chat_shape.py), side by side."""
    load_before = os.getloadavg()[0]
    model_dir = build_chat_model(shape, ctx.work_dir / f"model-{shape}")
    chosen = chat_settings(ctx.size(8, 8, 1), ctx.size(256, 256, 16))
    base = {**chosen, "model.path": str(model_dir), "run.run_dir": str(ctx.work_dir / f"loop-{shape}")}
    iters = ctx.size(4, 3, 2)
    one = measure_loop(base, model_dir, 1, iters)
    hf_one = measure_hf(base, model_dir, 1, iters, checkpointing=False)
    if ctx.smoke:  # the default test tier: the trainer-vs-HF comparison only (no `up`, no thread sweep)
        return [_trainer_vs_hf(shape, one, hf_one, {"load_avg_1m_before": load_before})]
    every = measure_loop(base, model_dir, cores, iters)
    loop = every if every["wall_s"] <= one["wall_s"] else one
    hf_every = measure_hf(base, model_dir, cores, iters, checkpointing=False)
    hf = hf_every if hf_every["wall_s"] <= hf_one["wall_s"] else hf_one
    hf_threads = cores if hf is hf_every else 1
    hf_gc = measure_hf(base, model_dir, hf_threads, iters, checkpointing=True)
    actors = measure_actors(ctx, shape, model_dir, ctx.size(6, 4, 2), chosen)
    # the same run with the trainer as two torch.distributed ranks (ddp, gloo): the groups that arrive
    # after generation are trained on both cores by two single-threaded processes, not two OpenMP threads
    ranks = measure_actors(ctx, shape, model_dir, ctx.size(6, 4, 2), {**chosen, **DDP2}, tag="-ddp2")
    work = (one["gen_s"] + one["train_s"] + one["step_s"]) / cores
    e_star = max(work, min(one["gen_s"], every["gen_s"]) + min(one["step_s"], every["step_s"])) + actors["sync_s"]
    hf_best = min(hf["wall_s"], hf_gc["wall_s"])
    # trainer speed: response tokens per second of forward + backward (reference included), one thread
    # each (CPU seconds: what a busy host does to wall time hits both alike in CPU time)
    ours_tps = one["tokens"] / one["train_cpu_s"]
    hf_tps = hf_one["tokens"] / hf_one["train_cpu_s"]
    raw = rounded(
        {
            "loop_epoch_s": loop["wall_s"],
            "loop_threads": float(cores if loop is every else 1),
            "loop_gen_s": loop["gen_s"],
            "loop_train_s": loop["train_s"] + loop["step_s"],
            "hf_epoch_s": hf["wall_s"],
            "hf_threads": float(hf_threads),
            "hf_gen_s": hf["gen_s"],
            "hf_train_s": hf["train_s"] + hf["step_s"],
            "hf_gc_epoch_s": hf_gc["wall_s"],
            "hf_gc_train_s": hf_gc["train_s"] + hf_gc["step_s"],
            "prl_actors_epoch_s": actors["wall_s"],
            "prl_actors_ddp2_epoch_s": ranks["wall_s"],
            "trainer_tokens_per_cpu_s": ours_tps,
            "hf_train_tokens_per_cpu_s": hf_tps,
            "hf_gc_train_tokens_per_s": hf_gc["tokens"] / hf_gc["train_s"],
            "hf_padded_tokens": hf["padded_tokens"],
            "response_tokens": one["tokens"],
            "prompt_len_mean": hf["prompt_len"],
            "response_len_mean": hf["len_mean"],
            "response_len_p10": hf["len_p10"],
            "response_len_p90": hf["len_p90"],
            "g1": one["gen_s"],
            "t1": one["train_s"],
            "s1": one["step_s"],
            "sync_s": actors["sync_s"],
            "e_star": e_star,
            "cores": float(cores),
            "load_avg_1m_before": load_before,
            "load_avg_1m_after": os.getloadavg()[0],
        }
    )
    vs_hf = hf_best / actors["wall_s"]
    vs_loop = loop["wall_s"] / actors["wall_s"]
    bound = loop["wall_s"] / e_star
    ranks_vs_hf, ranks_vs_loop = hf_best / ranks["wall_s"], loop["wall_s"] / ranks["wall_s"]
    ctx.say(
        f"  e2e {shape}: HF loop {hf['wall_s']:.2f} s (checkpointing {hf_gc['wall_s']:.2f} s), loop "
        f"{loop['wall_s']:.2f} s, prl-actors {actors['wall_s']:.2f} s per step: {vs_hf:.2f}x HF, "
        f"{vs_loop:.2f}x loop (bound {bound:.2f}x); with 2 trainer ranks {ranks['wall_s']:.2f} s: "
        f"{ranks_vs_hf:.2f}x HF, {ranks_vs_loop:.2f}x loop; trainer {ours_tps:.0f} vs HF {hf_tps:.0f} tokens/CPU-s"
    )
    return [
        Entry(
            "e2e",
            f"{shape}: prl-actors vs plain HF loop",
            "step time ratio, HF loop (faster of checkpointing off / on) over periodic W=1",
            vs_hf,
            "x",
            vs_hf,
            3.0,
            raw=raw,
        ),
        _vs_loop(
            f"{shape}: prl-actors vs single-process loop",
            "step time ratio, periodic W=1 over the project's loop",
            vs_loop,
            bound,
            raw,
        ),
        Entry(
            "e2e",
            f"{shape}: prl-actors, 2 trainer ranks, vs plain HF loop",
            "step time ratio, HF loop over periodic W=1 with trainer.world_size 2 (ddp)",
            ranks_vs_hf,
            "x",
            ranks_vs_hf,
            3.0,
            raw=raw,
            note=f"vs the single-process loop: {ranks_vs_loop:.2f}x",
        ),
        _vs_loop(
            f"{shape}: prl-actors, 2 trainer ranks, vs single-process loop",
            "step time ratio, periodic W=1 with trainer.world_size 2 (ddp) over the project's loop",
            ranks_vs_loop,
            bound,
            raw,
        ),
        _trainer_vs_hf(shape, one, hf_one, raw),
    ]


def _vs_loop(name: str, metric: str, ratio: float, bound: float, raw: dict[str, Any]) -> Entry:
    """prl-actors over the project's loop, checked against the CPU-aware bound (goal 0.85 of it)."""
    return Entry(
        "e2e",
        name,
        metric,
        ratio,
        "x",
        ratio / bound if bound > 0 else float("nan"),
        0.85,
        bound=bound,
        raw=raw,
        note=f"faster than the loop: {'yes' if ratio > 1 else 'no'}",
    )


def _trainer_vs_hf(shape: str, one: dict[str, Any], hf_one: dict[str, Any], raw: dict[str, Any]) -> Entry:
    """Response tokens per CPU-second of forward + backward, both on one thread."""
    ours_tps = one["tokens"] / one["train_cpu_s"]
    hf_tps = hf_one["tokens"] / hf_one["train_cpu_s"]
    return Entry(
        "e2e",
        f"{shape}: trainer vs HF padded forward/backward",
        "response tokens per CPU-second of forward + backward (reference included), one thread",
        ours_tps,
        "tok/s",
        ours_tps / hf_tps,
        1.0,
        bound=hf_tps,
        raw=rounded({**raw, "trainer_tokens_per_cpu_s": ours_tps, "hf_train_tokens_per_cpu_s": hf_tps}),
    )

"""Benchmark: multi-turn episodes/s through `prl-actors up`, periodic vs sync, at a tool latency of
0, 10 and 100 ms per environment step.

The episodes are the guess game (configs/guess.yaml's environment: the built-in model, warm-started
on it) behind an environment plugin that sleeps `latency` in every step, like a tool call to a
service. Two workers, each with 2 groups (16 episodes) in flight, so an epoch's 16 groups finish in
rounds; each worker runs its episodes' steps in a thread pool (task.env_threads), so a row waiting on
its tool leaves the running batch. Periodic streams finished episodes to the trainer while
the others still wait on tools; sync trains only after the whole batch. Reported: episodes/s of the
steady epochs (median epoch wall time) for both, and their ratio (informational: no goal).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from prl_actors.envs_llm.guess import GuessEnv
from prl_bench.common import BenchContext, Entry, free_port, rounded, run_up, up_argv

LATENCIES_MS = (0, 10, 100)
MAX_TURNS = 4


class LatencyGuess(GuessEnv):
    """The guess game whose every step takes `latency_s` more (a tool's round trip)."""

    latency_s = 0.0

    def __init__(self) -> None:
        super().__init__(9, MAX_TURNS)

    def step(self, text: str) -> tuple[list[dict[str, str]], float, bool]:
        if self.latency_s:
            time.sleep(self.latency_s)
        return super().step(text)


class Guess0ms(LatencyGuess):
    latency_s = 0.0


class Guess10ms(LatencyGuess):
    latency_s = 0.010


class Guess100ms(LatencyGuess):
    latency_s = 0.100


FACTORIES = {0: "Guess0ms", 10: "Guess10ms", 100: "Guess100ms"}


def settings(ctx: BenchContext) -> dict[str, Any]:
    return {
        "coordinator.groups_per_epoch": ctx.size(16, 8, 2),
        "worker.group_size": 8,
        "worker.max_batch_rows": 16,  # 2 groups in flight per worker: groups finish in rounds, not all at once
        "worker.sampling.max_new_tokens": 3,
        "trainer.checkpoint_every": 0,
        "task.max_turns": MAX_TURNS,
        "task.max_turn_tokens": 3,
        "task.env_threads": 64,
    }


def prepare(ctx: BenchContext) -> tuple[Path, Path]:
    """The guess-warm-started built-in model and the secrets as a JSONL dataset."""
    from prl_actors.config import load_config
    from prl_actors.launch import build

    where = ctx.work_dir / "model-guess"
    steps = ctx.size(600, 300, 0)
    cfg = load_config(
        None,
        {"run.run_dir": str(where), "task.name": "guess", "task.max_turns": MAX_TURNS, "model.warm_start_steps": steps},
    )
    rows = ctx.work_dir / "secrets.jsonl"
    rows.write_text("".join(json.dumps({"prompt": "0-9=", "answer": str(s)}) + "\n" for s in range(10)))
    return build.model_dir(cfg, where), rows


def measure(ctx: BenchContext, mode: str, latency_ms: int, model: Path, rows: Path, epochs: int) -> dict[str, Any]:
    run_dir = ctx.work_dir / f"up-{mode}-{latency_ms}ms"
    workers = str(ctx.size(2, 2, 1))
    overrides = {
        **settings(ctx),
        "run.mode": mode,
        "model.path": str(model),
        "task.name": "jsonl",
        "task.prompts_file": str(rows),
        "task.environment": f"prl_bench.multiturn:{FACTORIES[latency_ms]}",
        "transport.base_port": free_port(5),
        "transport.auth": ctx.auth,
    }
    cmd = up_argv(run_dir, workers, epochs, overrides)
    code, err = run_up(cmd, timeout_s=1200.0)
    if code != 0:
        raise RuntimeError(f"prl-actors up ({mode}, {latency_ms} ms) failed ({code}): {err[-1500:]}")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = metrics[1:] or metrics
    wall = statistics.median(r["wall_s"] for r in steady)
    return {"episodes_per_s": metrics[0]["samples"] / wall, "epoch_s": wall, "episodes": metrics[0]["samples"]}


def run(ctx: BenchContext) -> list[Entry]:
    model, rows = prepare(ctx)
    epochs = ctx.size(4, 3, 1)
    entries = []
    for latency in LATENCIES_MS if not ctx.smoke else (10,):
        sync = measure(ctx, "sync", latency, model, rows, epochs)
        periodic = measure(ctx, "periodic", latency, model, rows, epochs)
        ratio = periodic["episodes_per_s"] / sync["episodes_per_s"]
        raw = {
            "tool_latency_ms": latency,
            "sync_episodes_per_s": sync["episodes_per_s"],
            "periodic_episodes_per_s": periodic["episodes_per_s"],
            "sync_epoch_s": sync["epoch_s"],
            "periodic_epoch_s": periodic["epoch_s"],
            "episodes_per_epoch": sync["episodes"],
            "workers": ctx.size(2, 2, 1),
            "max_turns": MAX_TURNS,
        }
        ctx.say(
            f"  multiturn {latency} ms: sync {sync['episodes_per_s']:.1f} episodes/s, "
            f"periodic {periodic['episodes_per_s']:.1f} ({ratio:.2f}x)"
        )
        entries.append(
            Entry(
                benchmark="multiturn",
                name=f"multi-turn episodes, tool latency {latency} ms",
                metric="periodic episodes/s (ratio: periodic / sync)",
                measured=periodic["episodes_per_s"],
                unit="episodes/s",
                ratio=ratio,
                goal=None,
                raw=rounded(raw),
            )
        )
    return entries

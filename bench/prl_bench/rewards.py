"""Benchmark: what scoring costs on a worker (prl_actors/rewards).

- async concurrency: G samples of an async reward that waits `sleep_s` (an I/O-bound judge); bound
  G x sleep_s sequentially, ideal sleep_s: speed-up (G x sleep_s) / T, goal >= G / 2.
- the code reward: one sandboxed subprocess per sample (rewards/code.py); a group of G scored at
  once (concurrently) against G one-sample groups one after another, and the cost per sample.
  Informational: the cost is the interpreter start, the sandbox (unshare, rlimits) and the tests.
- the scoring overhead of the default single reward per group (the event loop, records, checks).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from prl_bench.common import BenchContext, Entry, rounded

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]


def _timed(fn: Any, repeats: int) -> float:
    """Median seconds of `repeats` calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def async_entry(ctx: BenchContext) -> Entry:
    from prl_actors.rewards import Reward, RewardInput, RewardSet

    group, sleep_s = ctx.size((16, 0.05), (8, 0.05), (4, 0.01))

    async def judge(record: RewardInput) -> float:
        await asyncio.sleep(sleep_s)
        return 1.0

    rs = RewardSet([Reward("judge", judge)])
    records = [RewardInput(prompt="p", completion="c", sample=i) for i in range(group)]
    took = _timed(lambda: rs.score(records), ctx.size(5, 3, 1))
    speedup = group * sleep_s / took
    return Entry(
        "rewards", f"async reward, {group} samples of {sleep_s * 1000:.0f} ms", "sequential time / measured",
        took, "s", speedup, group / 2, bound=float(group), raw=rounded({"group": group, "sleep_s": sleep_s}),
    )  # fmt: skip


def code_entries(ctx: BenchContext) -> list[Entry]:
    from prl_actors.rewards import Reward, RewardInput, RewardSet
    from prl_actors.rewards.builtins import code
    from prl_actors.rewards.code import network_isolation

    group = ctx.size(8, 8, 2)
    rs = RewardSet([Reward("code", code)])
    one = [RewardInput(prompt="p", completion=GOOD, row={"tests": TESTS})]
    many = [RewardInput(prompt="p", completion=GOOD, row={"tests": TESTS}, sample=i) for i in range(group)]
    repeats = ctx.size(5, 3, 1)
    single = _timed(lambda: rs.score(one), repeats)
    together = _timed(lambda: rs.score(many), repeats)
    raw = rounded({"single_s": single, "group_s": together, "group": group, "netns": " ".join(network_isolation())})
    return [
        Entry("rewards", "code reward, one sample", "seconds per sample (subprocess + 3 tests)", single, "s",
              single, None, op="<=", raw=raw),
        Entry("rewards", f"code reward, a group of {group}", "G one-sample groups in a row / one group of G",
              together, "s", group * single / together, None, raw=raw),
    ]  # fmt: skip


def overhead_entry(ctx: BenchContext) -> Entry:
    from prl_actors.config import load_config
    from prl_actors.engines.base import Generated
    from prl_actors.launch import build

    task = build.task(load_config(None, {"worker.engine": "sim", "trainer.learner": "sim"}))
    prompt = task.prompts_for_epoch(0, 1)[0]
    samples = [Generated(text="3", token_ids=[1, 2], logprobs=[0.0, 0.0]) for _ in range(8)]
    n = ctx.size(2000, 500, 20)
    per_group = _timed(lambda: [task.score_group(prompt, [1], samples) for _ in range(n)], 3) / n
    return Entry(
        "rewards", "scoring overhead, default reward, G=8", "microseconds per group", per_group * 1e6, "us",
        per_group * 1e6, None, op="<=", raw=rounded({"groups": n}),
    )  # fmt: skip


def run(ctx: BenchContext) -> list[Entry]:
    ctx.say("rewards: async concurrency, the code sandbox, the scoring overhead")
    return [async_entry(ctx), *code_entries(ctx), overhead_entry(ctx)]

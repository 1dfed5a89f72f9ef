"""The benchmark suite: run the selected benchmarks, save results.json after each, then the report.

A benchmark is a module with `run(ctx) -> list[Entry]`. One that raises is recorded with its error
(and the suite goes on), so a broken benchmark shows up in the report instead of hiding the others.
"""

from __future__ import annotations

import importlib
import json
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prl_bench.common import BenchContext, machine_info
from prl_bench.report import write_report

BENCHMARKS = {
    "e2e": "prl_bench.e2e",
    "pipeline": "prl_bench.pipeline",
    "shared_prompt": "prl_bench.shared_prompt",
    "weight_sync": "prl_bench.weight_sync",
    "lora_sync": "prl_bench.lora_sync",
    "control_plane": "prl_bench.control_plane",
    "envs": "prl_bench.envs",
    "dist_step": "prl_bench.dist_step",
    "eval_cost": "prl_bench.eval_cost",
    "multiturn": "prl_bench.multiturn",
    "group_checks": "prl_bench.group_checks",
    "rewards": "prl_bench.rewards",
    "startup": "prl_bench.startup",
    "minibatch": "prl_bench.minibatch",
    "bounded": "prl_bench.bounded",
    "burst_batching": "prl_bench.burst_batching",
    "heal": "prl_bench.heal",
    "gpu": "prl_bench.gpu",
}
ALIASES = {
    "packing": "shared_prompt",
    "control": "control_plane",
    "weights": "weight_sync",
    "loop": "e2e",
    "lora": "lora_sync",
    "dist": "dist_step",
    "eval": "eval_cost",
    "multi_turn": "multiturn",
    "tools": "multiturn",
    "minibatches": "minibatch",
    "staleness": "bounded",
    "generated": "burst_batching",
    "ettr": "heal",
    "self_healing": "heal",
    "cuda": "gpu",
}


class UnknownBenchmark(ValueError):
    pass


def resolve(names: list[str] | None) -> list[str]:
    """Benchmark names from --only values (comma-separated, '-' or '_', a few aliases)."""
    if not names:
        return list(BENCHMARKS)
    out = []
    for raw in (n.strip() for item in names for n in item.split(",")):
        name = ALIASES.get(raw.replace("-", "_"), raw.replace("-", "_"))
        if name not in BENCHMARKS:
            raise UnknownBenchmark(f"unknown benchmark {raw!r}; choose from {', '.join(BENCHMARKS)}")
        if name not in out:
            out.append(name)
    return out


def run_suite(
    out: Path,
    quick: bool = False,
    only: list[str] | None = None,
    label: str = "",
    smoke: bool = False,
    keep_work: bool = False,
    say: Callable[[str], None] = print,
    auth: str = "curve",
) -> dict[str, Any]:
    """Run the benchmarks into `out` (results.json, results.md, *.png); returns the results."""
    names = resolve(only)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="prl-bench-")) if not keep_work else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "machine": machine_info(label),
        "preset": "smoke" if smoke else ("quick" if quick else "full"),
        "auth": auth,
        "benchmarks": [],
        "entries": [],
    }
    try:
        for name in names:
            results["benchmarks"].append(_run_one(name, BenchContext(quick, out, work / name, say, smoke, auth), say))
            results["entries"] += results["benchmarks"][-1].pop("entries")
            save(out, results)
    finally:
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
    write_report(out, results, say)
    return results


def _run_one(name: str, ctx: BenchContext, say: Callable[[str], None]) -> dict[str, Any]:
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    say(f"[{name}] ...")
    t0 = time.monotonic()
    record: dict[str, Any] = {"name": name, "error": None, "entries": []}
    try:
        module = importlib.import_module(BENCHMARKS[name])
        record["entries"] = [e.to_dict() for e in module.run(ctx)]
    except Exception as exc:  # recorded, reported, and the suite goes on
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
        say(f"[{name}] FAILED: {record['error']}")
    record["seconds"] = round(time.monotonic() - t0, 1)
    say(f"[{name}] done in {record['seconds']:.0f}s")
    return record


def save(out: Path, results: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")

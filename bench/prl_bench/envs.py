"""Benchmark: classic RL through env actors (docs/ENVS.md). Self-contained: `run(ctx) -> list[Entry]`.

1. Env steps/s through remote env actors vs a local `gymnasium.vector.SyncVectorEnv` at the same N
   (random actions, no policy): the learner's `EnvClient` here, `env.actors` env actor processes over
   tcp. The bound comes from two costs measured in the same run: c, one CartPole step in a local loop
   (SyncVectorEnv at N / N), and m, the message round trip of one remote vector step with one env per
   actor (minus c). With A actors stepping in parallel, a remote vector step costs at least
   m + c * ceil(N / A), so remote steps/s <= N / (m + c * ceil(N / A)); remote beats local only when
   N * c > m + c * N / A. Goal: measured >= 50% of that bound.
2. AAPS at three thresholds (0 = always sync, then two KL thresholds): `prl-actors up` with
   configs/cartpole.yaml (acting mode, env actors in separate processes), the same seed and step budget
   each, no early stop. Reported per threshold: weight fetches per update per actor, and the final mean
   return over the last 100 episodes vs always-sync's (informational: one seed on a shared machine).
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from prl_bench.common import BenchContext, Entry, dies_with_us, rounded

NAME = "envs"
ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "configs" / "cartpole.yaml"
THRESHOLDS = (0.0, 0.01, 0.05)
ACTORS = 2


def run(ctx: BenchContext) -> list[Entry]:
    return steps_entries(ctx) + aaps_entries(ctx)


# --- 1. env steps/s ------------------------------------------------------------------------------


def _env_config(work: Path, n: int, port: int, auth: str) -> tuple[Any, Path]:
    """A remote-mode config on tcp, written where the env actor processes read it; with `auth` curve
    the run's keys too (as `prl-actors up` makes them)."""
    from prl_actors.config import load_config
    from prl_actors.transport.auth import create_keys, run_key_names

    overrides = {
        "run.name": f"bench-envs-{n}",
        "run.run_dir": str(work / f"steps-{n}"),
        "transport.kind": "tcp",
        "transport.base_port": port,
        "transport.auth": auth,
        "coordinator.heartbeat_timeout_s": 10.0,
        "env": {"mode": "remote", "actors": ACTORS, "num_envs": n, "wait_actors_s": 120.0},
    }
    cfg = load_config(None, overrides)
    Path(cfg.run.run_dir).mkdir(parents=True, exist_ok=True)
    path = Path(cfg.run.run_dir) / "config.yaml"
    path.write_text(cfg.dump())
    if cfg.authenticated():
        create_keys(cfg.keys_path(), run_key_names())
    return cfg, path


def _spawn_env(config: Path, name: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "prl_actors.cli.main", "actor", "env", "--config", str(config), "--name", name]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=dies_with_us
    )


def _rate(envs: Any, n: int, steps: int, repeats: int) -> float:
    """Vector steps per second (best of `repeats`), random actions, after a warm-up."""
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(steps, n))
    envs.reset(seed=0)
    for a in actions[:20]:
        envs.step(a)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for a in actions:
            envs.step(a)
        best = min(best, time.perf_counter() - t0)
    return steps / best


def local_rate(n: int, steps: int, repeats: int) -> float:
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    try:
        return _rate(envs, n, steps, repeats)
    finally:
        envs.close()


def remote_rate(work: Path, n: int, steps: int, repeats: int, port: int, auth: str) -> float:
    from prl_actors.launch.classic import env_client

    cfg, path = _env_config(work, n, port, auth)
    envs = env_client(cfg)
    procs = [_spawn_env(path, f"env-{i}") for i in range(ACTORS)]
    try:
        return _rate(envs, n, steps, repeats)
    finally:
        envs.close()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def steps_entries(ctx: BenchContext) -> list[Entry]:
    sizes = ctx.size([2, 8, 32, 128, 512], [2, 8, 64, 256], [2])
    steps, repeats = ctx.size(1000, 300, 20), ctx.size(3, 2, 1)
    port = 28800
    c = 1.0 / (local_rate(256, max(20, steps // 8), repeats) * 256) if not ctx.smoke else 1e-5
    rate = functools.partial(remote_rate, ctx.work_dir, steps=steps, repeats=repeats, auth=ctx.auth)
    remote_vec = {n: rate(n, port=port + 10 * i) for i, n in enumerate(sizes)}
    if ACTORS not in remote_vec:
        remote_vec[ACTORS] = rate(ACTORS, port=port + 10 * len(sizes))
    m = max(0.0, 1.0 / remote_vec[ACTORS] - c)
    ctx.say(f"[envs] c = {c * 1e6:.1f} us per env step, m = {m * 1e6:.0f} us per remote round trip")
    entries = []
    for n in sizes:
        local = local_rate(n, steps, repeats) * n
        remote = remote_vec[n] * n
        bound = n / (m + c * math.ceil(n / ACTORS))
        raw = rounded({"n": n, "local_steps_per_s": local, "remote_steps_per_s": remote, "bound": bound,
                       "c_us": c * 1e6, "m_us": m * 1e6, "actors": ACTORS})  # fmt: skip
        ctx.say(f"[envs] N={n}: local {local:.0f} steps/s, remote {remote:.0f} (bound {bound:.0f})")
        entries.append(_steps_entry(n, remote, bound, local, raw))
    crossover = m / (c * (1 - 1 / ACTORS))
    raw = rounded({"c_us": c * 1e6, "m_us": m * 1e6, "crossover_n": crossover})
    note = (
        f"c = {c * 1e6:.1f} us/env step, m = {m * 1e6:.0f} us/round trip; remote beats local above N ~ {crossover:.0f}"
    )
    entries.append(
        Entry(NAME, "message cost in env steps (m / c)", "bound", m / c, "env steps", m / c, None, raw=raw, note=note)
    )
    return entries


def _steps_entry(n: int, remote: float, bound: float, local: float, raw: dict[str, Any]) -> Entry:
    return Entry(
        NAME,
        f"remote env steps/s, N={n}, {ACTORS} env actors",
        "EnvClient over tcp vs its bound m + c*ceil(N/A)",
        remote,
        "steps/s",
        remote / bound,
        None if n == ACTORS else 0.5,  # N = A measures m: its ratio is 1 by construction
        bound=bound,
        raw=raw,
        note=f"local SyncVectorEnv at N={n}: {local:.0f} steps/s (remote/local {remote / local:.2f})"
        + ("; calibrates m" if n == ACTORS else ""),
    )


# --- 2. AAPS at three thresholds -----------------------------------------------------------------


def aaps_run(ctx: BenchContext, threshold: float, port: int) -> list[dict[str, Any]]:
    if ctx.smoke:
        return _aaps_inproc(ctx.work_dir / f"aaps-{threshold:g}", threshold)
    run_dir = ctx.work_dir / f"aaps-{threshold:g}"
    budget = ctx.size(100_000, 40_000, 512)
    sets = {
        "env.sync_kl_threshold": threshold,
        "env.ppo.total_timesteps": budget,
        "env.ppo.stop_when_solved": False,
        "transport.base_port": port,
    }
    cmd = [sys.executable, "-m", "prl_actors.cli.main", "up", "--config", str(CARTPOLE), "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"prl-actors up (threshold {threshold}) failed: {done.stderr[-600:]}")
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _aaps_inproc(run_dir: Path, threshold: float) -> list[dict[str, Any]]:
    """Smoke size: the learner core and two acting env actors in this process (inproc), two updates."""
    import zmq

    from prl_actors.classic.envs.detach import train_acting
    from prl_actors.classic.envs.hub import Hub
    from prl_actors.config import load_config
    from prl_actors.launch.classic import env_section, learner_settings, start_env

    env = {"actors": 2, "num_envs": 4, "sync_kl_threshold": threshold, "ppo": {"num_steps": 8, "total_timesteps": 64}}
    cfg = load_config(
        None, {"run.name": f"aaps{threshold:g}", "run.run_dir": str(run_dir), "transport.kind": "inproc", "env": env}
    )
    ctx = zmq.Context()
    hub = Hub(learner_settings(cfg), ctx)
    hosts = [start_env(f"env-{i}", cfg, ctx) for i in range(2)]
    rows: list[dict[str, Any]] = []
    try:
        train_acting(hub, env_section(cfg), cfg.run.seed, rows.append)
    finally:
        hub.close()
        for h in hosts:
            h.done.wait(5.0)
        ctx.destroy(linger=0)
    return rows


def aaps_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    later = rows[1:] or rows  # round 0's fetches are the initial ones
    solved_at = next((r["global_step"] for r in rows if r["solved"]), None)
    return {
        "updates": len(rows),
        "fetches_per_update_per_actor": float(np.mean([r["weight_fetches"] / max(1, r["actors"]) for r in later])),
        "fetches_total": int(sum(r["weight_fetches"] for r in rows)),
        "final_return": rows[-1]["return_mean"],
        "solved_at_step": solved_at,
        "wall_s": rows[-1]["wall_s"],
        "staleness_max": max(r["staleness_max"] for r in rows),
        "kl_mean": float(np.mean([r["aaps_kl_mean"] for r in later if r["aaps_kl_mean"] is not None] or [0.0])),
    }


def aaps_entries(ctx: BenchContext) -> list[Entry]:
    summaries = {}
    for i, th in enumerate(THRESHOLDS):
        summaries[th] = aaps_summary(aaps_run(ctx, th, 28900 + 10 * i))
        ctx.say(f"[envs] AAPS threshold {th:g}: {summaries[th]}")
    base = summaries[0.0]["final_return"] or math.nan
    entries = []
    for th, s in summaries.items():
        ret = s["final_return"] if s["final_return"] is not None else math.nan
        entries.append(
            Entry(
                NAME,
                f"AAPS threshold {th:g}: weight fetches per update per actor",
                "acting env actors fetch only when KL(own || learner) > threshold",
                s["fetches_per_update_per_actor"],
                "count",
                s["fetches_per_update_per_actor"],
                None,
                "<=",
                raw=rounded({"threshold": th, **s}),
                note=f"final return {ret:.1f} vs always-sync {base:.1f} (ratio {ret / base:.2f}); "
                f"solved at step {s['solved_at_step']}; max staleness {s['staleness_max']} versions",
            )
        )
    return entries

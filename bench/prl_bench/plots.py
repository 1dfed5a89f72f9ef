"""PNG plots of a results dict (matplotlib, Agg backend: no display needed).

Importing this module imports matplotlib: an ImportError here means the `plots` extra is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
from matplotlib.figure import Figure  # noqa: E402


def write_plots(out: Path, results: dict[str, Any]) -> list[Path]:
    by: dict[str, list[dict[str, Any]]] = {}
    for e in results["entries"]:
        by.setdefault(e["benchmark"], []).append(e)
    written = []
    for name, fn in (
        ("e2e", _e2e),
        ("pipeline", _pipeline),
        ("shared_prompt", _shared_prompt),
        ("weight_sync", _weight_sync),
        ("lora_sync", _lora_sync),
        ("control_plane", _control_plane),
        ("envs", _envs),
        ("dist_step", _dist_step),
        ("eval_cost", _eval_cost),
        ("group_checks", _group_checks),
        ("multiturn", _multiturn),
        ("rewards", _rewards),
        ("startup", _startup),
        ("minibatch", _minibatch),
        ("bounded", _bounded),
        ("burst_batching", _burst_batching),
        ("heal", _heal),
        ("gpu", _gpu),
    ):
        if by.get(name):
            path = out / f"{name}.png"
            fig = fn(by[name])
            if fig is not None:
                fig.tight_layout()
                fig.savefig(path, dpi=110)
                written.append(path)
                plt.close(fig)
    return written


def _pipeline(entries: list[dict[str, Any]]) -> Figure:
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(entries) + 2), 4))
    xs = range(len(entries))
    ax.bar(xs, [e["measured"] for e in entries], color="tab:blue", label="measured speed-up")
    for key, style in (("bound_ideal", "k_"), ("bound_overhead", "r_"), ("bound_schedule", "g_")):
        ax.plot(xs, [e["raw"].get(key) for e in entries], style, markersize=22, mew=2, label=key.replace("_", " "))
    ax.set_xticks(
        list(xs),
        [e["name"].replace("sim ", "").replace("torch ", "torch\n") for e in entries],
        rotation=30,
        ha="right",
        fontsize=8,
    )
    ax.set_ylabel("periodic / sync samples/s")
    ax.set_title("Pipeline: periodic vs sync, against the overlap bounds")
    ax.legend(fontsize=8)
    return fig


def _shared_prompt(entries: list[dict[str, Any]]) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for e in entries:
        sweep, main = e["raw"].get("sweep", []), e["raw"]
        for ax, var, fixed in ((axes[0], "G", "P"), (axes[1], "P", "G")):
            rows = sorted((r for r in sweep if r[fixed] == main[fixed]), key=lambda r: r[var])
            if not rows:
                continue
            xs = [r[var] for r in rows]
            line = ax.plot(xs, [r["speedup"] for r in rows], "o-", label=f"{main['model']} measured")[0]
            ax.plot(xs, [r["bound"] for r in rows], "--", color=line.get_color(), label=f"{main['model']} token bound")
            ax.plot(
                xs,
                [r["dense_attention_bound"] for r in rows],
                ":",
                color=line.get_color(),
                label=f"{main['model']} dense-attention bound",
            )
            ax.set_xscale("log", base=2)
            ax.set_xlabel(var)
            ax.set_title(f"speed-up vs {var} ({fixed}={main[fixed]}, R={main['R']})")
    axes[0].set_ylabel("packed / unpacked tokens/s")
    axes[0].legend(fontsize=7)
    return fig


def _weight_sync(entries: list[dict[str, Any]]) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4))
    for e in entries:
        table = e["raw"].get("table")
        if not table or "1 worker" not in e["name"]:
            continue
        kind = e["name"].replace("weight sync ", "").replace(" 1 worker", "")
        ws = [r["workers"] for r in table]
        ax.plot(ws, [r["seconds"] for r in table], "o-", label=f"{kind}")
        if "raw_seconds" in table[0]:
            ax.plot(ws, [r["raw_seconds"] for r in table], "x--", label=f"raw ZeroMQ {kind}")
    ax.set_xlabel("workers fetching at once")
    ax.set_ylabel("seconds until the last worker holds the weights")
    mb = entries[0]["raw"].get("bytes", 0) / 2**20
    ax.set_title(f"Weight sync of {mb:.0f} MiB")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    return fig


def _lora_sync(entries: list[dict[str, Any]]) -> Figure:
    """Per setup (full, LoRA ...): the sync time split into its steps, and the bytes on the wire."""
    setups = entries[0]["raw"]["setups"]
    names = list(setups)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    bottom = [0.0] * len(names)
    for step in ("snapshot_s", "upload_s", "fetch_s", "apply_s"):
        ms = [setups[n][step] * 1e3 for n in names]
        ax.bar(names, ms, bottom=bottom, label=step.removesuffix("_s"))
        bottom = [b + m for b, m in zip(bottom, ms, strict=True)]
    ax.set_ylabel("ms per weight sync")
    ax.set_yscale("log")
    ax.set_title("One weight sync: trainer -> publisher -> worker engine")
    ax.legend(fontsize=8)
    bx.bar(names, [setups[n]["bytes"] / 1e6 for n in names], color="tab:gray")
    bx.set_yscale("log")
    bx.set_ylabel("MB on the wire")
    bx.set_title("Bytes per weight sync")
    return fig


def _control_plane(entries: list[dict[str, Any]]) -> Figure:
    turn = next((e["raw"] for e in entries if "boundaries" in e["raw"]), None)
    scale = next((e["raw"]["scale"] for e in entries if "scale" in e["raw"]), None)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if turn:
        rows = turn["boundaries"]
        xs = [r["epoch"] for r in rows]
        bottom = [0.0] * len(rows)
        for key in ("control_ms", "step_ms", "upload_ms", "fetch_ms"):
            vals = [r[key] for r in rows]
            axes[0].bar(xs, vals, bottom=bottom, label=key.removesuffix("_ms"))
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        axes[0].axhline(20, color="k", ls="--", lw=1, label="goal (control)")
        axes[0].set_xticks(xs)
        axes[0].set_xlabel("epoch boundary")
        axes[0].set_ylabel("ms")
        axes[0].set_title("Epoch turnaround: last group consumed -> first assignment")
        axes[0].legend(fontsize=8)
    if scale:
        ms = [r["members"] for r in scale]
        axes[1].plot(ms, [r["flood_msgs_per_s"] for r in scale], "o-", label="msg/s (flood)")
        axes[1].axhline(20000, color="k", ls="--", lw=1, label="goal")
        axes[1].set_xscale("log")
        axes[1].set_xlabel("members")
        axes[1].set_ylabel("messages/s")
        axes[1].set_ylim(0, 1.25 * max(20000, *(r["flood_msgs_per_s"] for r in scale)))
        ax2 = axes[1].twinx()
        ax2.plot(ms, [r["steady_assign_p99_ms"] for r in scale], "s:", color="tab:red", label="assign p99 ms")
        ax2.set_ylabel("assignment p99 (ms)")
        ax2.set_ylim(bottom=0)
        axes[1].set_title("Coordinator over ZeroMQ")
        lines = axes[1].get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        axes[1].legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="lower left")
    return fig


def _e2e(entries: list[dict[str, Any]]) -> Figure:
    """Per shape: prl-actors over the single-process loop (and the CPU-aware bound); engine over HF."""
    speed = [e for e in entries if "loop_samples_per_s" in e["raw"]]
    engine = [e for e in entries if "engine_tokens_per_s" in e["raw"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    xs = range(len(speed))
    a.bar(xs, [e["measured"] for e in speed], color="tab:blue", label="prl-actors / loop (samples/s)")
    a.plot(xs, [e["bound"] for e in speed], "k_", markersize=30, mew=2, label="CPU-aware bound")
    a.axhline(1.0, color="grey", lw=0.8)
    a.set_xticks(list(xs), [e["name"].split(":")[0] for e in speed])
    a.set_title("End to end vs the single-process loop")
    a.legend(fontsize=8)
    xs = range(len(engine))
    b.bar(xs, [e["ratio"] for e in engine], color="tab:green")
    b.axhline(1.0, color="grey", lw=0.8)
    b.set_xticks(list(xs), [e["name"].split(":")[0] for e in engine])
    b.set_ylabel("engine / HF generate (tokens/s)")
    b.set_title("Engine vs Hugging Face generate")
    return fig


def _envs(entries: list[dict[str, Any]]) -> Figure:
    """Steps/s vs N (local, remote, bound); AAPS fetches per update and final return."""
    steps = [e["raw"] for e in entries if "remote_steps_per_s" in e["raw"]]
    aaps = [e["raw"] for e in entries if "threshold" in e["raw"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ns = [r["n"] for r in steps]
    for key, style in (("local_steps_per_s", "o-"), ("remote_steps_per_s", "s-"), ("bound", "k--")):
        a.plot(ns, [r[key] for r in steps], style, label=key.replace("_steps_per_s", "").replace("_", " "))
    a.set(xscale="log", yscale="log", xlabel="N envs", ylabel="env steps/s", title="remote env actors vs SyncVectorEnv")
    a.legend(fontsize=8)
    xs = range(len(aaps))
    b.bar(xs, [r["fetches_per_update_per_actor"] for r in aaps], color="tab:blue", label="fetches/update/actor")
    b.set_xticks(list(xs), [f"KL > {r['threshold']:g}" for r in aaps])
    b.set_ylabel("weight fetches per update per actor")
    r2 = b.twinx()
    r2.plot(xs, [r["final_return"] or 0.0 for r in aaps], "ro", label="final return (100 ep.)")
    r2.set_ylabel("final mean return")
    b.set_title("AAPS: fetches and return by threshold")
    return fig


def _bar_pairs(
    ax: Any,
    ticks: list[str],
    left: tuple[str, list[float]],
    right: tuple[str, list[float]],
    left_color: str | None = None,
    tick_size: float | None = None,
) -> None:
    """Two bars per tick, `left` and `right` ((legend label, values) each), the ticks named below."""
    xs = range(len(ticks))
    ax.bar([x - 0.2 for x in xs], left[1], 0.4, label=left[0], **({"color": left_color} if left_color else {}))
    ax.bar([x + 0.2 for x in xs], right[1], 0.4, label=right[0])
    ax.set_xticks(list(xs))
    ax.set_xticklabels(ticks, **({"fontsize": tick_size} if tick_size else {}))
    ax.legend(fontsize=8)


def _dist_step(entries: list[dict[str, Any]]) -> Figure:
    """Each case's epoch time next to world size 1's epochs it was paired with."""
    table = entries[0]["raw"]["table"]
    fig, ax = plt.subplots(figsize=(7, 4))
    _bar_pairs(
        ax,
        [f"{r['strategy']} x{r['world_size']}, {r['threads']} thr" for r in table],
        ("1 process, 1 thread (paired)", [r["one_s"] for r in table]),
        ("the case", [r["epoch_s"] for r in table]),
    )
    ax.set_ylabel("seconds per epoch (median)")
    ax.set_title("Trainer epoch vs world size (gloo, CPU)")
    return fig


def _group_checks(entries: list[dict[str, Any]]) -> Figure:
    """The buffer's per-group content checks, without and with re-scoring (buffer.verify_rewards)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([e["name"] for e in entries], [e["measured"] for e in entries], color=["tab:blue", "tab:orange"])
    ax.set(ylabel="microseconds per group (G = 8, 32 tokens each)", title="Buffer checks per group")
    return fig


def _eval_cost(entries: list[dict[str, Any]]) -> Figure:
    """Epoch period without and with evaluation, and the seconds openings waited for an evaluation."""
    cases = {"off": entries[0]["raw"]["off"]}
    for e in entries:
        cases.update({k: v for k, v in e["raw"].items() if k != "off"})
    names = list(cases)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(names, [cases[n]["period_s_median"] for n in names], color="tab:blue")
    a.set(ylabel="s from one epoch_open to the next (median)", title="epoch period by evaluation schedule")
    b.bar(names, [cases[n]["deferred_s_total"] for n in names], color="tab:orange", label="openings waited (s, all)")
    b.bar(names, [cases[n]["eval_s_median"] for n in names], color="tab:green", alpha=0.6, label="one evaluation (s)")
    b.set(ylabel="seconds", title="what evaluation costs")
    b.legend(fontsize=8)
    return fig


def _multiturn(entries: list[dict[str, Any]]) -> Figure:
    """Episodes/s of sync and periodic at each tool latency, side by side."""
    rows = sorted((e["raw"] for e in entries), key=lambda r: r["tool_latency_ms"])
    fig, ax = plt.subplots(figsize=(7, 4))
    _bar_pairs(
        ax,
        [f"{r['tool_latency_ms']} ms" for r in rows],
        ("sync", [r["sync_episodes_per_s"] for r in rows]),
        ("periodic", [r["periodic_episodes_per_s"] for r in rows]),
        left_color="grey",
    )
    ax.set(xlabel="tool latency per environment step", ylabel="episodes/s", title="Multi-turn episodes")
    return fig


def _rewards(entries: list[dict[str, Any]]) -> Figure:
    """An async reward's group against its sequential time; the code sandbox, one by one vs a group."""
    judge = next(e for e in entries if e["name"].startswith("async"))
    code = next(e for e in entries if "group of" in e["name"])["raw"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    sequential = judge["raw"]["group"] * judge["raw"]["sleep_s"]
    a.bar(["sequential (G x wait)", "measured"], [sequential, judge["measured"]], color=["grey", "tab:blue"])
    a.set(ylabel="seconds per group", title=f"async reward, G = {judge['raw']['group']}")
    g = code["group"]
    b.bar(["one sample", f"{g} in a row", f"a group of {g}"], [code["single_s"], g * code["single_s"], code["group_s"]],
          color=["tab:blue", "grey", "tab:green"])  # fmt: skip
    b.set(ylabel="seconds", title="code reward (sandboxed subprocess per sample)")
    return fig


def _startup(entries: list[dict[str, Any]]) -> Figure:
    """Each measured run's seconds from `up` to its first finished epoch, against the goal, and the
    steady epoch for scale."""
    first = entries[0]
    runs = first["raw"]["runs"]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(runs))
    ax.bar(xs, [r["first_epoch_s"] for r in runs], color="tab:blue", label="up -> first finished epoch")
    ax.bar(xs, [r["steady_epoch_s"] for r in runs], color="tab:orange", label="steady epoch")
    if first["goal"] is not None:
        ax.axhline(first["goal"], color="k", linestyle="--", label=f"goal {first['goal']:g} s")
    ax.set_xticks(list(xs), [f"run {i}" for i in xs])
    ax.set_ylabel("seconds")
    ax.set_title("Start-up of the demo (model cached)")
    ax.legend(fontsize=8)
    return fig


def _minibatch(entries: list[dict[str, Any]]) -> Figure:
    """Epoch seconds by case (shape, M): periodic next to sync."""
    rows = [e["raw"] for e in entries]
    fig, ax = plt.subplots(figsize=(8, 4))
    _bar_pairs(
        ax,
        [f"{r['shape']} M={r['M']}" for r in rows],
        ("periodic", [r["periodic_epoch_s"] for r in rows]),
        ("sync", [r["sync_epoch_s"] for r in rows]),
        tick_size=8,
    )
    ax.set_ylabel("seconds per epoch (median)")
    ax.set_title("M minibatch steps per epoch: periodic vs sync")
    return fig


def _burst_batching(entries: list[dict[str, Any]]) -> Figure:
    """CPU seconds per shape: the burst trained knowing it is generated next to its first group alone."""
    rows = [e["raw"] for e in entries]
    fig, ax = plt.subplots(figsize=(7, 4))
    _bar_pairs(
        ax,
        [r["shape"] for r in rows],
        ("generated: together", [r["together_cpu_s"] for r in rows]),
        ("first group alone", [r["first_alone_cpu_s"] for r in rows]),
        tick_size=8,
    )
    ax.set_yscale("log")
    ax.set_ylabel("CPU seconds, one thread (median)")
    ax.set_title("A 16-group burst: train_group.generated vs not")
    return fig


def _heal(entries: list[dict[str, Any]]) -> Figure:
    """Left: ETTR by how the crashed core is restarted, against the goal. Right: the median seconds
    from a crash to a new core's first epoch with every worker back."""
    ettr = [e for e in entries if e["name"].startswith("ETTR")]
    recovery = [e for e in entries if e["name"].startswith("core restart")]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    ax.bar([e["name"].split("restart by ")[-1] for e in ettr], [e["measured"] for e in ettr], color="tab:green")
    if ettr and ettr[0]["goal"] is not None:
        ax.axhline(ettr[0]["goal"], color="k", linestyle="--", label=f"goal {ettr[0]['goal']:g}")
        ax.legend(fontsize=8)
    ax.set(ylim=(0, 1.05), ylabel="ETTR (disturbed / undisturbed epochs/s)", title="An actor SIGKILLed every ~N s")
    bx.bar(
        [e["name"].split("restart by ")[-1].split(":")[0] for e in recovery],
        [e["measured"] for e in recovery],
        color="tab:blue",
    )
    bx.set(ylabel="seconds (median)", title="crash -> a new core runs an epoch")
    for a in (ax, bx):
        a.tick_params(axis="x", labelsize=8)
    return fig


def _bounded(entries: list[dict[str, Any]]) -> Figure:
    """Left: samples/s by case and mode, the single-process loop as a line per case. Right: the
    reward curve (reward_mean per epoch) of each run."""
    rows = [e["raw"] for e in entries]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, (ax, cx) = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        got = {r["case"]: r["samples_per_s"] for r in rows if r["mode"] == mode}
        ax.bar(
            [c + i * width - 0.4 + width / 2 for c in range(len(cases))],
            [got.get(c, 0) for c in cases],
            width,
            label=mode,
        )
    for c, case in enumerate(cases):
        loop = next(r["loop_samples_per_s"] for r in rows if r["case"] == case)
        ax.hlines(loop, c - 0.45, c + 0.45, colors="k", label="single-process loop" if c == 0 else None)
    ax.set_xticks(list(range(len(cases))), cases, fontsize=8)
    ax.set_ylabel("samples/s (steady)")
    ax.set_title("sync, periodic, bounded k = 1, 2 vs the loop")
    ax.legend(fontsize=7)
    for r in rows:
        cx.plot(range(len(r["rewards"])), r["rewards"], marker=".", label=f"{r['case']} {r['mode']}")
    cx.set_xlabel("epoch")
    cx.set_ylabel("reward_mean")
    cx.set_title("reward curves")
    cx.legend(fontsize=6)
    return fig


def _gpu(entries: list[dict[str, Any]]) -> Figure | None:
    """Training seconds per step by case (trainer impl, shape, device), the issue's goal as a line."""
    rows = [e for e in entries if e["metric"] == "training s per step"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(range(len(rows)), [e["measured"] for e in rows], color="tab:blue")
    ax.set_xticks(range(len(rows)), [e["name"].replace("trainer ", "") for e in rows], fontsize=8, rotation=10)
    goals = [e["goal"] for e in rows if e["goal"] is not None]
    if goals:
        ax.axhline(goals[0], color="tab:red", linestyle="--", label="goal")
        ax.legend()
    ax.set_ylabel("training seconds per step (median)")
    ax.set_title("The trainer per step (bench --only gpu)")
    return fig

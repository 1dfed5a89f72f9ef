"""results.json -> results.md (one table, then details per benchmark) and PNG plots.

Everything here reads the results dict only, so a report can be rebuilt from a saved results.json:
`python -m prl_bench.report OUT`. The plots need matplotlib (`pip install 'prl-actors[plots]'`);
without it the report says so in one line and writes results.md alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PLOTS_NEED = "plots skipped: they need matplotlib (pip install 'prl-actors[plots]', or make install)"


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}" if abs(x) < 1 else f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return str(x)


def _verdict(e: dict[str, Any]) -> str:
    if e["passed"] is None:
        return "info"
    return "PASS" if e["passed"] else "MISS"


def summary_table(entries: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| benchmark | case | measured | bound | checked value | goal | result |",
        "| --- | --- | ---: | ---: | ---: | :---: | :---: |",
    ]
    for e in entries:
        goal = "-" if e["goal"] is None else f"{e['op']} {_num(e['goal'])}"
        rows.append(
            f"| {e['benchmark']} | {e['name']} | {_num(e['measured'])} {e['unit']} | {_num(e['bound'])} | "
            f"{_num(e['ratio'])} | {goal} | {_verdict(e)} |"
        )
    return rows


def _table(rows: list[dict[str, Any]], keys: list[str]) -> list[str]:
    if not rows:
        return []
    keys = [k for k in keys if any(k in r for r in rows)]
    out = ["| " + " | ".join(keys) + " |", "|" + " ---: |" * len(keys)]
    out += ["| " + " | ".join(_num(r.get(k)) for k in keys) + " |" for r in rows]
    return out


def details(results: dict[str, Any]) -> list[str]:
    by: dict[str, list[dict[str, Any]]] = {}
    for e in results["entries"]:
        by.setdefault(e["benchmark"], []).append(e)
    lines: list[str] = []
    pipe = by.get("pipeline", [])
    if pipe:
        lines += ["", "### Pipeline: sync vs periodic", ""]
        rows = [{"case": e["name"], **e["raw"]} for e in pipe]
        lines += _table(
            rows,
            [
                "case",
                "sync_samples_per_s",
                "periodic_samples_per_s",
                "speedup",
                "T_gen_s",
                "T_train_s",
                "T_other_s",
                "bound_ideal",
                "bound_overhead",
                "bound_schedule",
                "of_schedule_bound",
                "bound_cpu",
                "of_cpu_bound",
            ],
        )
    for e in by.get("shared_prompt", []):
        lines += ["", f"### Shared prompt sweep ({e['raw']['model']} model, R={e['raw']['R']})", ""]
        lines += _table(
            e["raw"].get("sweep", []),
            [
                "G",
                "P",
                "tokens_packed",
                "tokens_unpacked",
                "tokens_per_s_packed",
                "tokens_per_s_unpacked",
                "speedup",
                "bound",
                "of_bound",
                "dense_attention_bound",
                "max_logprob_diff",
            ],
        )
    for e in by.get("weight_sync", []):
        if "table" in e["raw"] and "1 worker" in e["name"]:
            lines += ["", f"### {e['name'].replace(' 1 worker', '')}: time vs workers", ""]
            lines += _table(
                e["raw"]["table"],
                [
                    "workers",
                    "seconds",
                    "raw_seconds",
                    "aggregate_GBps",
                    "raw_aggregate_GBps",
                    "slowest_worker_s",
                    "write_s",
                    "cold_s",
                    "warm_s",
                ],
            )
    lines += _control_details(by.get("control_plane", []))
    mini = by.get("minibatch", [])
    if mini:
        lines += ["", "### Minibatch steps per epoch (trainer.num_minibatches M): epoch seconds", ""]
        lines += _table(
            [e["raw"] for e in mini],
            ["shape", "M", "periodic_epoch_s", "sync_epoch_s", "speedup", "periodic_train_s", "sync_train_s"],
        )
    burst = by.get("burst_batching", [])
    if burst:
        lines += ["", "### A burst trained knowing it is generated (train_group.generated): CPU seconds", ""]
        lines += _table(
            [e["raw"] for e in burst],
            ["shape", "together_cpu_s", "first_alone_cpu_s", "saved_cpu_s", "saved_min_s", "saved_max_s", "reps"],
        )
    bounded = by.get("bounded", [])
    if bounded:
        lines += ["", "### Bounded staleness (run.mode bounded): samples/s against the single-process loop", ""]
        lines += _table(
            [{**e["raw"], "vs_loop": e["ratio"]} for e in bounded],
            ["case", "mode", "samples_per_s", "loop_samples_per_s", "vs_loop", "stale_groups", "rewards"],
        )
        lines += ["", "Pull policy (weights/pulls.py): the worker's weight loads per epoch (1.0 = every version)", ""]
        lines += _table(
            [e["raw"] for e in bounded],
            [
                "case",
                "mode",
                "weight_loads_per_epoch",
                "loads_saved_per_epoch",
                "versions_skipped",
                "drift_pulls",
                "step_kl_mean",
                "samples_per_s",
            ],
        )
    return lines


def _control_details(entries: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for e in entries:
        if "scale" in e["raw"]:
            lines += ["", "### Control plane over ZeroMQ (tcp), by number of members", ""]
            lines += _table(
                e["raw"]["scale"],
                [
                    "members",
                    "join_s",
                    "steady_hb_per_s",
                    "steady_hb_rtt_p50_ms",
                    "steady_hb_rtt_p99_ms",
                    "steady_assign_p50_ms",
                    "steady_assign_p99_ms",
                    "steady_coordinator_cpu",
                    "flood_msgs_per_s",
                    "flood_coordinator_cpu",
                    "flood_client_cpu",
                    "leave_s",
                    "false_timeouts",
                ],
            )
        if "boundaries" in e["raw"]:
            lines += ["", "### Epoch turnaround, per epoch boundary (ms)", ""]
            lines += _table(
                e["raw"]["boundaries"],
                [
                    "epoch",
                    "total_ms",
                    "step_ms",
                    "upload_ms",
                    "fetch_ms",
                    "control_ms",
                    "done_to_open_ms",
                    "open_to_first_assign_ms",
                ],
            )
    return lines


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"# prl-actors benchmarks ({results['preset']}, transport.auth {results.get('auth', 'curve')})",
        "",
        f"Machine: {m['label']} ({m['cpu_model']}, {m['cpus_usable']} usable CPUs, {m['mem_total_gib']} GiB), "
        f"{m['platform']}; Python {m['python']}, torch {m.get('torch', '-')}, libzmq {m['libzmq']}. "
        f"Date: {m['date']} ({m['time_utc']}); load average at start {m['load_avg_at_start']}.",
        "",
        *summary_table(results["entries"]),
    ]
    errors = [b for b in results["benchmarks"] if b.get("error")]
    if errors:
        lines += ["", "Benchmarks that failed to run:", ""] + [f"- {b['name']}: {b['error']}" for b in errors]
    notes = [f"- {e['name']}: {e['note']}" for e in results["entries"] if e.get("note")]
    if notes:
        lines += ["", "Notes:", "", *notes]
    lines += details(results)
    return "\n".join(lines) + "\n"


def write_report(out: Path, results: dict[str, Any], say: Callable[[str], None] = print) -> None:
    """results.md, then the plots when matplotlib is installed (else one line through `say`)."""
    (out / "results.md").write_text(markdown(results))
    try:
        from prl_bench.plots import write_plots
    except ImportError as exc:
        if not (exc.name or "").startswith("matplotlib"):
            raise
        say(PLOTS_NEED)
        return
    write_plots(out, results)


def main(argv: list[str]) -> int:
    """python -m prl_bench.report OUT: rebuild OUT/results.md and the plots from OUT/results.json."""
    if len(argv) != 1:
        print("usage: python -m prl_bench.report OUT   (OUT holds a results.json)", file=sys.stderr)
        return 2
    source = Path(argv[0]) / "results.json"
    try:
        results = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {source}: {exc}", file=sys.stderr)
        return 2
    write_report(source.parent, results, say=lambda line: print(line, file=sys.stderr))
    print(f"wrote {source.parent / 'results.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

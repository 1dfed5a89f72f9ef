"""Every benchmark at a tiny size, so the suite keeps working. Structure only: no timing is asserted
(the numbers of a smoke run mean nothing; the suite's own report says whether goals are met).
The suite is the `prl_bench` package (bench/prl_bench), installed beside prl_actors.
Running every benchmark, even at smoke size, takes ~4 minutes on 2 cores: those tests are in the slow
tier (`make test-slow`); the CLI and report tests without the suite run stay in `make test`."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.replay import load_run
from prl_actors.replay.epochs import windows
from prl_bench.logspans import epoch_phases, run_phases
from prl_bench.report import main as report_main
from prl_bench.report import write_report
from prl_bench.suite import BENCHMARKS, UnknownBenchmark, resolve, run_suite
from tests.conftest import alive

ENTRY_KEYS = {"benchmark", "name", "metric", "measured", "unit", "ratio", "goal", "op", "bound", "raw", "passed"}


def _finite_positive(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:  # type: ignore[type-arg]
    out = tmp_path_factory.mktemp("bench")
    return out, run_suite(out, smoke=True, keep_work=True, say=lambda line: None)


@pytest.mark.slow  # the whole suite at smoke size: ~3-4 min on 2 cores (make test-slow)
def test_every_benchmark_ran(smoke: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    _, results = smoke
    assert [b["name"] for b in results["benchmarks"]] == list(BENCHMARKS)
    for b in results["benchmarks"]:
        assert b["error"] is None, b.get("traceback")
    assert {e["benchmark"] for e in results["entries"]} == set(BENCHMARKS)


@pytest.mark.slow  # the whole suite at smoke size: ~3-4 min on 2 cores (make test-slow)
def test_entries_have_the_documented_fields(smoke: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    _, results = smoke
    for e in results["entries"]:
        assert set(e) >= ENTRY_KEYS, e["name"]
        assert e["op"] in (">=", "<=")
        assert isinstance(e["ratio"], int | float) and math.isfinite(e["ratio"]), e["name"]
        if e["unit"] != "count":
            assert _finite_positive(e["measured"]), (e["name"], e["measured"])
        if e["bound"] is not None:
            assert _finite_positive(e["bound"]), (e["name"], e["bound"])
        assert e["passed"] in (True, False, None)


@pytest.mark.slow  # the whole suite at smoke size: ~3-4 min on 2 cores (make test-slow)
def test_raw_numbers_are_finite(smoke: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    _, results = smoke
    by = {e["name"]: e["raw"] for e in results["entries"]}
    pipe = next(r for n, r in by.items() if n.startswith("sim "))
    for key in ("sync_samples_per_s", "periodic_samples_per_s", "T_gen_s", "T_train_s", "bound_schedule"):
        assert _finite_positive(pipe[key]), key
    packing = next(r for n, r in by.items() if n.startswith("shared prompt"))
    assert packing["max_logprob_diff"] < 1e-3  # packed and unpacked compute the same log-probs
    assert packing["sweep"] and all(_finite_positive(r["speedup"]) for r in packing["sweep"])
    sync = next(r for n, r in by.items() if n == "weight sync tcp 1 worker")
    assert _finite_positive(sync["memcpy_GBps"]) and all(_finite_positive(r["seconds"]) for r in sync["table"])
    turn = next(r for n, r in by.items() if n.startswith("epoch turnaround"))
    assert turn["boundaries"] and all(math.isfinite(b["control_ms"]) for b in turn["boundaries"])
    auth = next(r for n, r in by.items() if "CurveZMQ" in n)  # the flood with and without auth, paired
    assert len(auth["ratios"]) == auth["pairs"] >= 1 and all(_finite_positive(x) for x in auth["ratios"])
    assert all(_finite_positive(x) for a in ("curve", "none") for x in auth[f"{a}_cpu_us_per_msg"])


@pytest.mark.slow  # the whole suite at smoke size: ~3-4 min on 2 cores (make test-slow)
def test_report_files(smoke: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    out, results = smoke
    assert json.loads((out / "results.json").read_text())["entries"] == results["entries"]
    md = (out / "results.md").read_text()
    assert "| benchmark | case |" in md and results["machine"]["date"] in md
    for name in BENCHMARKS:
        assert (out / f"{name}.png").stat().st_size > 1000


def test_one_cheap_benchmark_runs_through_the_suite_into_a_report_and_a_plot(tmp_path: Path) -> None:
    """The default tier's check of the suite's plumbing (run, results.json, results.md, a PNG); the
    slow tier runs every benchmark."""
    results = run_suite(tmp_path, smoke=True, only=["group_checks"], say=lambda line: None)
    assert [b["name"] for b in results["benchmarks"]] == ["group_checks"]
    assert all(b["error"] is None for b in results["benchmarks"])
    assert results["entries"] and all(_finite_positive(e["measured"]) for e in results["entries"])
    assert json.loads((tmp_path / "results.json").read_text())["entries"] == results["entries"]
    assert (tmp_path / "group_checks.png").stat().st_size > 1000


def test_only_resolves_names_and_aliases() -> None:
    assert resolve(None) == list(BENCHMARKS)
    assert resolve(["weight-sync,control"]) == ["weight_sync", "control_plane"]
    with pytest.raises(UnknownBenchmark):
        resolve(["nope"])


def test_cli_rejects_an_unknown_benchmark(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "--only", "nope", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown benchmark" in result.output


@pytest.mark.slow  # the whole suite at smoke size: ~3-4 min on 2 cores (make test-slow)
def test_an_epoch_is_replays_epoch_window(smoke: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    """The bench's epochs are replay's windows (epoch_open of e -> epoch_open of e+1, the last one to
    its epoch_done): per-epoch times and the measured span are built from them."""
    out, _ = smoke
    for run_dir in (out / "work" / "pipeline" / "sim-w2-r1-sync", out / "work" / "control_plane" / "turnaround-run"):
        run = load_run(run_dir)
        wins = {w.epoch: w for w in windows(run) if w.epoch >= 0}
        phases = epoch_phases(run_dir)
        assert sorted(phases) == sorted(wins)
        for e, p in phases.items():
            assert (p.open, p.end) == (wins[e].start + run.t0, wins[e].end + run.t0)
        measured = run_phases(run_dir)
        assert [r["epoch"] for r in measured.per_epoch] == sorted(wins)[1:]
        assert [r["epoch_s"] for r in measured.per_epoch] == pytest.approx([wins[e].wall for e in sorted(wins)[1:]])
        assert measured.window == pytest.approx((wins[1].start + run.t0, wins[max(wins)].end + run.t0))


def _without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "prl_bench.plots", raising=False)


@pytest.mark.slow  # the whole suite at smoke size: ~3-4 min on 2 cores (make test-slow)
def test_without_matplotlib_the_report_is_written_and_one_line_says_why_no_plots(
    smoke: tuple[Path, dict],  # type: ignore[type-arg]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, results = smoke
    _without_matplotlib(monkeypatch)
    said: list[str] = []
    write_report(tmp_path, results, said.append)
    assert "| benchmark | case |" in (tmp_path / "results.md").read_text()
    assert not list(tmp_path.glob("*.png"))
    assert len(said) == 1 and "prl-actors[plots]" in said[0]


@pytest.mark.slow  # the whole suite at smoke size: ~3-4 min on 2 cores (make test-slow)
def test_the_report_module_rebuilds_a_saved_run(
    smoke: tuple[Path, dict],  # type: ignore[type-arg]
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, _ = smoke
    (tmp_path / "results.json").write_text((out / "results.json").read_text())
    assert report_main([str(tmp_path)]) == 0
    assert (tmp_path / "results.md").read_text() == (out / "results.md").read_text()
    assert all((tmp_path / f"{name}.png").stat().st_size > 1000 for name in BENCHMARKS)
    assert report_main([str(tmp_path / "missing")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_cli_without_the_bench_package_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "prl_bench" or m.startswith("prl_bench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "prl_bench", None)  # as in an install without bench/ (the Docker image)
    result = CliRunner().invoke(app, ["bench", "--only", "nope", "--out", str(tmp_path)])  # runs nothing either way
    assert result.exit_code == 2
    assert "not installed" in result.output and "Traceback" not in result.output


@pytest.mark.slow  # the whole suite at smoke size: ~3-4 min on 2 cores (make test-slow)
def test_replay_timeline_without_matplotlib_is_one_error_line(
    smoke: tuple[Path, dict],  # type: ignore[type-arg]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, _ = smoke
    _without_matplotlib(monkeypatch)
    png = tmp_path / "t.png"
    run_dir = out / "work" / "control_plane" / "turnaround-run"
    result = CliRunner().invoke(app, ["replay", str(run_dir), "--timeline", str(png)])
    assert result.exit_code == 2 and not png.exists()
    assert "prl-actors[plots]" in result.output and "Traceback" not in result.output


HARNESS = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal: a background job ignores it
from prl_bench.common import run_up
pid_file = Path(sys.argv[1])
sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
run_up(sleeper, 120, on_start=lambda proc: pid_file.write_text(str(proc.pid)))
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_a_run_started_by_the_bench_ends_when_the_bench_does(tmp_path: Path, how: signal.Signals) -> None:
    """`up` runs in its own session, out of reach of the terminal's Ctrl-C and of a kill of the bench's
    group: the bench stops it on the way out (Ctrl-C), and the kernel does when the bench is killed
    outright (PR_SET_PDEATHSIG). Before, either left a cluster running after the bench."""
    pid_file = tmp_path / "pid"
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(pid_file)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and harness.poll() is None, "the harness never started its run"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert alive(child)
    harness.send_signal(how)
    harness.wait(timeout=30)
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive(child)
    if left:
        os.kill(child, signal.SIGKILL)
    assert not left, f"the run outlived the bench ({how.name})"

"""Every benchmark at a tiny size, so the suite keeps working. Structure only: no timing is asserted
(the numbers of a smoke run mean nothing; the suite's own report says whether goals are met)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from prl_actors.bench.suite import BENCHMARKS, UnknownBenchmark, resolve, run_suite

ENTRY_KEYS = {"benchmark", "name", "metric", "measured", "unit", "ratio", "goal", "op", "bound", "raw", "passed"}


def _finite_positive(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:  # type: ignore[type-arg]
    out = tmp_path_factory.mktemp("bench")
    return out, run_suite(out, smoke=True, say=lambda line: None)


def test_every_benchmark_ran(smoke: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    _, results = smoke
    assert [b["name"] for b in results["benchmarks"]] == list(BENCHMARKS)
    for b in results["benchmarks"]:
        assert b["error"] is None, b.get("traceback")
    assert {e["benchmark"] for e in results["entries"]} == set(BENCHMARKS)


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


def test_report_files(smoke: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    out, results = smoke
    assert json.loads((out / "results.json").read_text())["entries"] == results["entries"]
    md = (out / "results.md").read_text()
    assert "| benchmark | case |" in md and results["machine"]["date"] in md
    for name in BENCHMARKS:
        assert (out / f"{name}.png").stat().st_size > 1000


def test_only_resolves_names_and_aliases() -> None:
    assert resolve(None) == list(BENCHMARKS)
    assert resolve(["weight-sync,control"]) == ["weight_sync", "control_plane"]
    with pytest.raises(UnknownBenchmark):
        resolve(["nope"])


def test_cli_rejects_an_unknown_benchmark(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "--only", "nope", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown benchmark" in result.output

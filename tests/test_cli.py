"""The CLI: user mistakes get one clear line (exit 2), never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.config import load_config
from prl_actors.sections import ConfigError

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "--config", "/nope.yaml"], "does not exist"),
        (["up", "--mode", "turbo"], "run.mode"),
        (["up", "--set", "trainer.lr=-1"], "trainer.lr"),
        (["up", "--set", "nonsense"], "section.key=value"),
        (["up", "--set", "worker.colour=red"], "worker.colour"),
        (["up", "--set", "worker.engine=sim"], "go together"),
        (["up", "--set", "coordinator.heartbeat_timeout_s=0.1"], "heartbeat_timeout_s"),
        (["actor", "wizard"], "unknown role"),
        (["actor", "worker", "--name", "trainer-1"], "must start with its role"),
        (["status", "--coordinator", "tcp://127.0.0.1:1"], "no reply"),
    ],
)
def test_user_mistakes_get_one_clear_line(args: list[str], needle: str) -> None:
    code, out = run_cli(*args)
    assert code in (1, 2)
    assert needle in out
    assert len([line for line in out.splitlines() if line.startswith("error:")]) == 1


def test_bad_yaml_and_non_mapping(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("run: [unclosed")
    (tmp_path / "b.yaml").write_text("- just a list")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "b.yaml")


def test_up_refuses_to_overwrite_a_run(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    code, out = run_cli("up", "--config", "configs/sim.yaml", "--run-dir", str(tmp_path))
    assert code == 2 and "already holds a run" in out


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path: Path, tmp_path: Path) -> None:
    """A shipped config loads, survives its own dump (what `up` writes to RUN_DIR/config.yaml), gives
    every bound actor its own address, and its task serves a full epoch of valid prompts (a config
    that needs a chat model gets the tiny Qwen2 its header suggests)."""
    from prl_actors.launch import build
    from prl_actors.launch.topology import BINDS
    from prl_actors.model.tiny import build_family

    cfg = load_config(path)
    raw = yaml.safe_load(path.read_text())
    for section, fields in raw.items():  # every value written in the file is the one in effect
        for key, value in fields.items():
            if not isinstance(value, dict):
                assert getattr(getattr(cfg, section), key) == value, f"{section}.{key}"
    assert load_config(None, _flatten(yaml.safe_load(cfg.dump()))) == cfg
    assert cfg.address("coordinator") not in {cfg.address(r) for r in BINDS if r != "coordinator"}
    if cfg.task.chat_template and cfg.model.path is None:
        cfg.model.path = str(build_family("qwen2", tmp_path / "tiny-qwen2"))
    addresses = [cfg.address(role) for role in sorted(BINDS)]
    assert len(set(addresses)) == len(addresses)
    prompts = build.task(cfg).prompts_for_epoch(0, cfg.coordinator.groups_per_epoch)
    assert [p.group_id for p in prompts] == list(range(cfg.coordinator.groups_per_epoch))
    assert all(p.prompt for p in prompts)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value and key != "addresses":
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_help_is_fast_and_lists_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "prl_actors.cli.main", "--help"], capture_output=True, text=True, timeout=10
    )
    assert out.returncode == 0
    for command in ("up", "actor", "scale", "status", "stop"):
        assert command in out.stdout
    probe = "import sys, prl_actors.cli.main; print('torch' in sys.modules, 'transformers' in sys.modules)"
    heavy = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert heavy.stdout.split() == ["False", "False"]


def test_a_busy_port_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    import socket

    from tests.conftest import port_base

    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds: TIME_WAIT is no owner
        for _ in range(20):  # a port some other process holds is no test of ours: take the next one
            base = port_base()
            try:
                busy.bind(("127.0.0.1", base))  # the coordinator's port
                break
            except OSError:
                continue
        busy.listen()
        argv = ["actor", "coordinator", "--set", "worker.engine=sim", "--set", "trainer.learner=sim"]
        argv += ["--set", "transport.auth=none"]  # no keys needed to meet the busy port
        argv += ["--set", f"transport.base_port={base}", "--set", f"run.run_dir={tmp_path}"]
        out = subprocess.run(
            [sys.executable, "-m", "prl_actors.cli.main", *argv], capture_output=True, text=True, timeout=30
        )
    assert out.returncode == 1
    assert "error: coordinator" in out.stderr and "Address already in use" in out.stderr
    assert "Traceback" not in out.stderr

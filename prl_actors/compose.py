"""`prl-actors up --compose`: the same run as docker compose services (docker-compose.yml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from prl_actors.config import Config
from prl_actors.logs import console

COMPOSE_FILE = Path(__file__).resolve().parent.parent / "docker-compose.yml"


def compose_command(cfg: Config, compose_file: Path = COMPOSE_FILE) -> list[str]:
    return [
        "docker", "compose", "-f", str(compose_file), "up", "--build",
        "--scale", f"inference={cfg.run.workers}", "--exit-code-from", "coordinator",
    ]  # fmt: skip


def compose_up(cfg: Config, config_path: Path | None) -> int:
    """Run docker compose; one clear line when docker (or its engine) is missing."""
    if config_path is not None:
        console("note: compose services read configs/compose.yaml inside the image; --config is not passed")
    if shutil.which("docker") is None:
        console("error: `docker` is not installed; use `prl-actors up` for local processes")
        return 2
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        console("error: no Docker engine is reachable (`docker info` failed); use `prl-actors up` instead")
        return 2
    return subprocess.call(compose_command(cfg))

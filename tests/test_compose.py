"""The compose tier (`make test-compose`, marker `compose`; not in `make test`): a real Docker engine.

Builds the image, runs `prl-actors up --compose` (sim engine: the deployment path is under test, not
the model) for 3 epochs with 2 inference replicas, scales to 3 with `prl-actors scale` mid-run, kills
one inference container, and checks the run directory on the volume with `prl-actors replay --check`
(and the log invariants on a copy of it).
`up` reuses the image when the digest of its inputs (prl_actors/launch/compose.py, ImageInputs) is unchanged:
the second build is checked to be none, and `up` to say so. Once per compose CLI found (`docker
compose`, `docker-compose`; PRL_COMPOSE picks one). Also: Ctrl-C on `up --compose` stops the run
cleanly and removes the containers.
Skips, saying why, when no engine is reachable. On the dev VM: ../shared/tools/local-docker.sh, then
export DOCKER_HOST=unix:///tmp/prl-docker/docker.sock.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prl_actors.config import Config
from prl_actors.launch.client import RequestFailed, request
from prl_actors.launch.compose import (
    COMPOSE_FILE,
    ComposeError,
    ImageInputs,
    compose_cli,
    compose_env,
    ensure_image,
    image_id,
    inputs_tag,
    operator_keys_dir,
)
from prl_actors.protocol.messages import StatusRequest
from prl_actors.transport.auth import KeyStore
from tests.conftest import assert_invariants, port_base, read_logs, sim_config

pytestmark = pytest.mark.compose
CLI = [sys.executable, "-m", "prl_actors.cli.main"]
IMAGE = os.environ.get("PRL_IMAGE", "prl-actors:latest")


def _engine_problem() -> str:
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return f"no Docker engine is reachable (DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')})"
    return ""


def _clis() -> list[list[str]]:
    if os.environ.get("PRL_COMPOSE"):
        return [compose_cli()]
    found = []
    if shutil.which("docker"):
        v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if v2.returncode == 0:
            found.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        found.append(["docker-compose"])
    return found


@pytest.fixture(scope="module")
def engine() -> None:
    problem = _engine_problem()
    if problem:
        pytest.skip(f"compose tier: {problem}; on the dev VM run ../shared/tools/local-docker.sh first")


@pytest.fixture(params=[" ".join(c) for c in _clis()] or ["none"])
def cli(request: pytest.FixtureRequest, engine: None) -> list[str]:
    if request.param == "none":
        with pytest.raises(ComposeError):
            compose_cli()
        pytest.skip("compose tier: neither `docker compose` nor `docker-compose` is installed")
    return str(request.param).split()


class Project:
    """One compose project for one test: its own name, port, volume; removed (volume too) after."""

    def __init__(self, cli: list[str], tmp: Path) -> None:
        self.cli, self.tmp = cli, tmp
        self.name = f"prltest{os.getpid()}{port_base()}"
        self.env = {**compose_env(), "COMPOSE_PROJECT_NAME": self.name, "PRL_COMPOSE": " ".join(cli)}

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [*self.base(), *args]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)

    def base(self) -> list[str]:
        return [*self.cli, "-f", str(COMPOSE_FILE), "-p", self.name]

    def output(self, lines: int = 80) -> str:
        """The last lines of `up --compose`'s stdout and stderr (for assertion messages)."""
        text = self.log.read_text() if self.log.exists() else "(no output file)"
        return "\n".join(text.splitlines()[-lines:])

    def containers(self, service: str = "") -> list[str]:
        labels = ["--filter", f"label=com.docker.compose.project={self.name}"]
        if service:
            labels += ["--filter", f"label=com.docker.compose.service={service}"]
        out = subprocess.run(["docker", "ps", "-a", "-q", *labels], capture_output=True, text=True)
        return out.stdout.split()

    def up(self, cfg: Config, *extra: str) -> subprocess.Popen[str]:
        path = self.tmp / "cfg.yaml"
        path.write_text(cfg.dump())
        self.log = self.tmp / "up.log"
        with open(self.log, "w") as out:
            argv = [*CLI, "up", "--compose", "--config", str(path), *extra]
            return subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)

    def copy_run_dir(self, run_dir: str) -> Path:
        """The run directory, copied off the volume (read-only mount) for the log checks."""
        argv = ["docker", "run", "--rm", "-v", f"{self.name}_runs:/runs:ro", IMAGE, "tar", "-C", "/runs", "-c", run_dir]
        data = subprocess.run(argv, capture_output=True, check=True, timeout=120).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(self.tmp / "copy", filter="data")
        return self.tmp / "copy" / run_dir

    def remove(self) -> None:
        shutil.rmtree(operator_keys_dir(self.name), ignore_errors=True)
        self.compose("down", "-v", "--remove-orphans", "-t", "5")
        leftover = self.containers()
        if leftover:
            subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)


@pytest.fixture
def project(cli: list[str], tmp_path: Path) -> Iterator[Project]:
    p = Project(cli, tmp_path)
    try:
        yield p
    finally:
        p.remove()


def compose_sim(name: str, epochs: int, workers: int) -> Config:
    return sim_config(
        Path("runs") / name, transport="tcp", run__epochs=epochs, run__workers=workers,
        coordinator__groups_per_epoch=12, coordinator__heartbeat_interval_s=0.2,
        coordinator__heartbeat_timeout_s=2.0, sim__gen_s_per_token=0.1,
    )  # fmt: skip


def status(cfg: Config, keys: Path) -> Any:
    """The coordinator's Status, asked with the operator key `up --compose` copied to the host."""
    try:
        addr = f"tcp://127.0.0.1:{cfg.transport.base_port}"
        return request(addr, StatusRequest(), timeout_s=2.0, keys=KeyStore(keys))
    except RequestFailed:
        return None


def wait_status(
    project: Project, cfg: Config, pred: Callable[[Any], bool], proc: subprocess.Popen[str], timeout: float
) -> Any:
    deadline = time.monotonic() + timeout
    keys = operator_keys_dir(project.name)  # up --compose copies the operator key there
    while time.monotonic() < deadline:
        code = proc.poll()
        assert code is None, f"up --compose ended early with exit code {code}; its output:\n{project.output()}"
        st = status(cfg, keys)
        if st is not None and pred(st):
            return st
        time.sleep(0.5)
    raise AssertionError(f"no matching status within {timeout}s; up --compose's output:\n{project.output()}")


def workers(st: Any) -> list[Any]:
    return [m for m in st.members if m.role == "worker"]


@pytest.mark.timeout(1800)  # a cold build (no cached layers) installs torch in the image: minutes
def test_image_builds_once_and_holds_exactly_the_hashed_files(project: Project) -> None:
    """`up --compose`'s build step: builds when needed, then (same sources) does not build again; the
    image's /app holds exactly the files whose digest names it, and its torch is the CPU build."""
    t0 = time.monotonic()
    built = ensure_image(project.base(), project.env)
    t_build = time.monotonic() - t0
    image = os.environ.get("PRL_IMAGE") or "prl-actors:latest"
    inputs = ImageInputs(COMPOSE_FILE.parent)
    assert image_id(inputs_tag(image, inputs.digest()), project.env) == image_id(image, project.env)
    assert ensure_image(project.base(), project.env) is False, "an up-to-date image was built again"
    probe = "find /app -type f | sort; python -c 'import torch; print(\"cuda\", torch.version.cuda)'"
    ran = subprocess.run(["docker", "run", "--rm", IMAGE, "sh", "-c", probe], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    files = [line.removeprefix("/app/") for line in ran.stdout.splitlines() if line.startswith("/app/")]
    assert files == inputs.files(), "the digest does not cover exactly what the image holds"
    assert "cuda None" in ran.stdout, ran.stdout[-500:]
    size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", image], capture_output=True, text=True)
    print(
        f"\n[{' '.join(project.cli)}] image {'built' if built else 'up to date'} in {t_build:.1f}s, "
        f"{int(size.stdout) / 1e9:.2f} GB"
    )


@pytest.mark.timeout(1800)  # builds if run alone; under the vfs driver each container start copies the image
def test_elastic_compose_run(project: Project) -> None:
    name = f"elastic-{project.name}"
    cfg = compose_sim(name, epochs=3, workers=2)
    ensure_image(project.base(), project.env)  # built here if this test runs alone; `up` must not build again
    t0 = time.monotonic()
    up = project.up(cfg)
    wait_status(project, cfg, lambda st: st.state == "running" and len(workers(st)) == 2, up, timeout=600)
    t_running = time.monotonic() - t0
    keys = str(operator_keys_dir(project.name))
    scale = [
        *CLI,
        "scale",
        "--workers",
        "3",
        "--config",
        str(project.tmp / "cfg.yaml"),
        "--keys",
        keys,
    ]  # 127.0.0.1:PORT
    scaled = subprocess.run(scale, capture_output=True, text=True)
    assert scaled.returncode == 0, scaled.stderr
    st = wait_status(project, cfg, lambda st: len(workers(st)) == 3 and st.epoch >= 1, up, timeout=300)
    victim = next(m.name for m in sorted(workers(st), key=lambda m: -m.outstanding))
    host = victim.split("-")[1]  # worker-<container hostname = short id>-<pid>
    assert host in [c[:12] for c in project.containers("inference")]
    subprocess.run(["docker", "kill", host], check=True, capture_output=True)
    assert up.wait(600) == 0, project.log.read_text()
    wall = time.monotonic() - t0
    out = project.log.read_text()
    assert "scaling inference 2 -> 3" in out and "done: 3 epochs" in out, out
    assert "is up to date" in out and "building the image" not in out, "up --compose rebuilt the image"
    assert [line.split()[1] for line in out.splitlines() if line.startswith("epoch ")] == ["0", "1", "2"], out
    assert project.containers() == [], "up --compose left containers behind"
    t1 = time.monotonic()
    replay = ["prl-actors", "replay", f"/runs/{name}", "--check"]
    check = project.compose("run", "--rm", "--no-deps", "coordinator", *replay)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "check exactly-once  ok" in check.stdout
    run_dir = project.copy_run_dir(name)
    assert_invariants(run_dir, epochs=3, groups=12)
    events = read_logs(run_dir)
    requeues = [e for e in events if e["event"] == "requeue" and e["worker"] == victim]
    assert requeues and requeues[0]["reason"] == "heartbeat_timeout", "the killed worker's groups were not requeued"
    assert len({e["member"] for e in events if e["event"] == "member_join" and e["member_role"] == "worker"}) == 3
    print(
        f"\n[{' '.join(project.cli)}] up -> epoch 0 running with 2 replicas {t_running:.1f}s, "
        f"whole run incl. teardown {wall:.1f}s, replay --check on the volume {time.monotonic() - t1:.1f}s"
    )


@pytest.mark.timeout(1800)
def test_ctrl_c_stops_the_run_and_removes_the_containers(project: Project) -> None:
    if project.cli != _clis()[0]:
        pytest.skip("Ctrl-C is checked with the first compose CLI only")
    name = f"interrupt-{project.name}"
    cfg = compose_sim(name, epochs=50, workers=1)
    ensure_image(project.base(), project.env)
    up = project.up(cfg)
    wait_status(project, cfg, lambda st: st.state == "running" and bool(workers(st)), up, timeout=600)
    t0 = time.monotonic()
    up.send_signal(signal.SIGINT)
    assert up.wait(120) == 130, project.log.read_text()
    print(f"\n[{' '.join(project.cli)}] Ctrl-C -> containers removed in {time.monotonic() - t0:.1f}s")
    assert "SIGINT: stopping the run" in project.log.read_text()  # up --compose names the signal
    assert project.containers() == []
    done = [e for e in read_logs(project.copy_run_dir(name)) if e["event"] == "run_done"]
    assert done and done[0]["reason"] == "stop requested: SIGINT to prl-actors up --compose", done

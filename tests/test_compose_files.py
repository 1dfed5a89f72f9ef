"""The compose path without an engine: the compose file's commands and healthchecks are valid CLI calls,
the config the services get, compose CLI detection, the health command against a live coordinator."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.config import load_config
from prl_actors.launch.compose import (
    SECRET_PATH,
    ComposeError,
    ComposeRun,
    ImageInputs,
    compose_cli,
    compose_config,
    container_run_dir,
    health_problem,
    inputs_tag,
)
from prl_actors.launch.process import LocalCluster
from prl_actors.protocol.messages import MemberInfo, Status
from tests.conftest import sim_config

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "prl_actors.cli.main"]
SPEC = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def cli_params(argv: list[str]) -> dict[str, Any]:
    """Parse `prl-actors SUB ...` (or `prl-actors GROUP SUB ...`) with the real CLI (raises on an invalid call)."""
    assert argv[0] == "prl-actors"
    command: Any = typer.main.get_command(app)
    args = list(argv[1:])
    while hasattr(command, "commands"):  # a group: descend into its subcommand
        command = command.commands[args[0]]
        name, args = args[0], args[1:]
    return dict(command.make_context(name, args).params)


ACTORS = {"coordinator", "publisher", "buffer", "trainer", "inference"}


def test_every_service_runs_a_valid_actor_call_on_the_mounted_config() -> None:
    services = SPEC["services"]
    assert set(services) == ACTORS | {"keys"}
    roles = {name: cli_params(services[name]["command"])["role"] for name in ACTORS}
    assert roles == {s: s for s in ("coordinator", "publisher", "buffer", "trainer")} | {"inference": "worker"}
    for name, svc in services.items():
        assert str(cli_params(svc["command"])["config"]) == SECRET_PATH, name
        assert svc["secrets"] == ["prl_config"] and "runs:/runs" in svc["volumes"], name
    assert SPEC["secrets"]["prl_config"]["file"] == "${PRL_CONFIG_FILE:-./configs/compose.yaml}"
    load_config(ROOT / "configs/compose.yaml")


def test_the_keys_service_creates_the_run_keys_before_any_actor_starts(tmp_path: Path) -> None:
    """With the default transport.auth curve every actor needs its key in RUN_DIR/keys on the volume:
    the one-shot `keys` service makes them (from the same mounted config), every actor waits for it."""
    keys = SPEC["services"]["keys"]
    assert keys["command"][1:3] == ["keys", "create"] and not cli_params(keys["command"])["names"]
    for name in ACTORS:
        assert SPEC["services"][name]["depends_on"]["keys"] == {"condition": "service_completed_successfully"}, name
    cfg = compose_config(load_config(ROOT / "configs/compose.yaml", {"run.run_dir": "runs/k"}))
    cfg.transport.keys_dir = str(tmp_path / "keys")  # where the service would write /runs/k/keys
    (tmp_path / "cfg.yaml").write_text(cfg.dump())
    argv = [a.replace(SECRET_PATH, str(tmp_path / "cfg.yaml")) for a in keys["command"]]
    made = CliRunner().invoke(app, argv[1:])
    assert made.exit_code == 0, made.output
    assert {p.name for p in (tmp_path / "keys").glob("*.key_secret")} >= {
        f"{r}.key_secret" for r in ("coordinator", "publisher", "buffer", "trainer", "worker", "operator")
    }
    assert load_config(tmp_path / "cfg.yaml").keys_path() == tmp_path / "keys"


def test_compose_refuses_transport_auth_none() -> None:
    with pytest.raises(ComposeError, match="auth none"):
        compose_config(load_config(ROOT / "configs/sim.yaml", {"transport.auth": "none"}))


def test_every_service_has_a_healthcheck_that_is_a_valid_health_call() -> None:
    for name, svc in ((n, s) for n, s in SPEC["services"].items() if n in ACTORS):
        test = svc["healthcheck"]["test"]
        argv = test[1:] if test[0] == "CMD" else shlex.split(test[1].replace("$$HOSTNAME", "abc123"))
        params = cli_params(argv)
        assert argv[1] == "health" and str(params["config"]) == SECRET_PATH, name
        expected = {"coordinator": None, "inference": "worker-abc123"}.get(name, name)
        assert params["member"] == expected, name


def test_compose_config_points_every_actor_at_its_service_and_the_volume() -> None:
    user = load_config(ROOT / "configs/sim.yaml", {"run.run_dir": "runs/exp1", "worker.group_size": 4})
    cfg = compose_config(user)
    assert cfg.run.run_dir == "/runs/exp1" and cfg.transport.bind_all and cfg.transport.kind == "tcp"
    assert cfg.address("buffer") == "tcp://buffer:27502" and cfg.bind_address("coordinator") == "tcp://*:27500"
    assert cfg.worker.group_size == 4 and cfg.worker.engine == "sim"  # the user's settings pass through
    assert user.run.run_dir == "runs/exp1"  # not modified in place


@pytest.mark.parametrize(
    ("given", "expected"),
    [("runs/latest", "/runs/latest"), ("exp", "/runs/exp"), ("/runs/compose", "/runs/compose"), ("a/b", "/runs/a/b")],
)
def test_run_dir_maps_onto_the_volume(given: str, expected: str) -> None:
    assert container_run_dir(given) == expected


@pytest.mark.parametrize("bad", ["/tmp/x", "/runs", "runs", "../up", "runs/../x"])
def test_run_dir_outside_the_volume_is_refused(bad: str) -> None:
    with pytest.raises(ComposeError):
        container_run_dir(bad)


def _status(*members: tuple[str, float]) -> Status:
    infos = [MemberInfo(name=n, role=n.split("-")[0], version=0, outstanding=0, last_seen_s=s) for n, s in members]
    return Status(
        reply_to="x", state="running", mode="periodic", groups_per_epoch=8, groups_done=0,
        groups_outstanding=0, epochs_total=3, members=infos,
    )  # fmt: skip


def test_health_problem() -> None:
    st = _status(("buffer", 0.1), ("trainer", 9.0), ("worker-abc-7", 0.2), ("worker-abcd-8", 30.0))
    assert health_problem(st, None, 2.0) == ""
    assert health_problem(st, "buffer", 2.0) == ""
    assert "last seen 9.0s ago" in health_problem(st, "trainer", 2.0)
    assert "not registered" in health_problem(st, "publisher", 2.0)
    assert health_problem(st, "worker-abc", 2.0) == ""  # prefix: worker-HOST matches worker-HOST-PID
    assert "worker-abcd-8" in health_problem(st, "worker-abcd", 2.0)  # ... but not worker-HOSTX-PID
    assert "not registered" in health_problem(st, "worker-ab", 2.0)


def _fake(bin_dir: Path, name: str, rc: int) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\nexit {rc}\n")
    path.chmod(0o755)


def test_compose_cli_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("PRL_COMPOSE", raising=False)
    with pytest.raises(ComposeError, match="neither"):
        compose_cli()
    _fake(tmp_path, "docker-compose", 0)
    _fake(tmp_path, "docker", 1)  # a docker CLI without the compose plugin
    assert compose_cli() == ["docker-compose"]
    _fake(tmp_path, "docker", 0)
    assert compose_cli() == ["docker", "compose"]
    monkeypatch.setenv("PRL_COMPOSE", "docker-compose --verbose")
    assert compose_cli() == ["docker-compose", "--verbose"]


def test_a_failed_docker_inspect_is_retried_before_the_containers_count_as_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy engine fails an inspect now and then (seen with the vfs driver): that alone must not end
    a run as "the core containers disappeared"; inspects that keep failing still do."""
    calls = tmp_path / "calls"
    docker = tmp_path / "docker"  # fails its first two inspects, then answers for both containers
    docker.write_text(
        f'#!/bin/sh\necho x >> {calls}\n[ "$(wc -l < {calls})" -le 2 ] && exit 1\nprintf "running 0\\nexited 0\\n"\n'
    )
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(time, "sleep", lambda s: None)
    run = ComposeRun(["docker-compose"], load_config(None, {}), tmp_path / "c.yml", tmp_path / "s", 27500)
    run.ids = {"coordinator": "a", "trainer": "b"}
    assert run.states() == {"coordinator": ("running", 0), "trainer": ("exited", 0)}
    calls.unlink()
    with pytest.raises(ComposeError, match="disappeared"):
        run.states(attempts=2)


def test_the_image_inputs_are_the_repo_files_dockerignore_lets_through() -> None:
    files = ImageInputs(ROOT).files()
    for needed in ("pyproject.toml", "constraints.txt", "README.md", "prl_actors/launch/compose.py", "cli/main.py"):
        assert needed in files
    assert any(f.startswith("configs/") for f in files)
    leaked = [f for f in files if f.split("/")[0] in {"tests", "bench", "docs", ".venv", ".git", "runs", "tools"}]
    assert not leaked and not [f for f in files if "__pycache__" in f or f.endswith(".pyc")], leaked


def _context(root: Path) -> Path:
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "Dockerfile").write_text("FROM scratch\n")
    (root / ".dockerignore").write_text("# comment\n**/__pycache__\ntests\n*.egg-info\ndocs\n!docs/keep.md\n")
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (root / "tests" / "t.py").write_text("T = 1\n")
    for d in ("x.egg-info", "pkg/y.egg-info", "docs"):
        (root / d).mkdir()
    (root / "x.egg-info" / "PKG-INFO").write_text("x")
    (root / "pkg" / "y.egg-info" / "PKG-INFO").write_text("y")  # *.egg-info matches at the top only
    (root / "docs" / "drop.md").write_text("d")
    (root / "docs" / "keep.md").write_text("k")  # an exception brings it back
    return root


def test_the_image_digest_follows_exactly_what_the_build_copies(tmp_path: Path) -> None:
    """docker's .dockerignore rules (parents, `**`, top-level `*`, `!` exceptions); the digest moves
    with the Dockerfile, a copied file's bytes, name or executable bit, and with nothing else."""
    ctx = ImageInputs(_context(tmp_path))
    assert ctx.files() == [".dockerignore", "Dockerfile", "docs/keep.md", "pkg/a.py", "pkg/y.egg-info/PKG-INFO"]
    # (docker always sends the Dockerfile and .dockerignore; the repo's .dockerignore excludes them from COPY)
    first = ctx.digest()
    for ignored in ("tests/t.py", "pkg/__pycache__/a.pyc", "x.egg-info/PKG-INFO", "docs/drop.md"):
        (tmp_path / ignored).write_text("changed")
    (tmp_path / "tests" / "new.py").write_text("N = 1\n")
    assert ctx.digest() == first
    changes = [
        lambda: (tmp_path / "pkg" / "a.py").write_text("A = 2\n"),
        lambda: (tmp_path / "pkg" / "a.py").chmod(0o755),
        lambda: (tmp_path / "pkg" / "a.py").rename(tmp_path / "pkg" / "b.py"),
        lambda: (tmp_path / "Dockerfile").write_text("FROM scratch\nRUN true\n"),
        lambda: (tmp_path / "docs" / "keep.md").write_text("k2"),
    ]
    seen = {first}
    for change in changes:
        change()
        seen.add(ctx.digest())
    assert len(seen) == len(changes) + 1, "a change to what the image is built from left the digest as it was"


def test_inputs_tag_keeps_the_repository() -> None:
    d = "0123456789abcdef0123456789"
    assert inputs_tag("prl-actors:latest", d) == "prl-actors:inputs-0123456789abcdef0123"
    assert inputs_tag("prl-actors", d) == "prl-actors:inputs-0123456789abcdef0123"
    assert inputs_tag("reg.example:5000/team/prl", d) == "reg.example:5000/team/prl:inputs-0123456789abcdef0123"
    assert inputs_tag("reg.example:5000/team/prl:v2", d) == "reg.example:5000/team/prl:inputs-0123456789abcdef0123"


def test_up_compose_without_docker_is_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["up", "--compose", "--epochs", "1"], env={"PATH": str(tmp_path)})
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "`docker` CLI is not installed" in result.output


def test_health_command_against_a_live_coordinator(run_dir: Path) -> None:
    cfg = sim_config(run_dir, transport="tcp", run__workers=1, run__epochs=50, sim__gen_s_per_token=0.01)
    cluster = LocalCluster(cfg)
    keys = str(cfg.keys_path())  # the run's keys: health asks as the member (its role's key) or the operator
    try:
        addr = cfg.address("coordinator")
        for member in ("buffer", "worker"):  # the worker is worker-0: a prefix match
            ok = _health(addr, "--member", member, "--keys", keys, wait=True)
            assert ok.returncode == 0 and "healthy" in ok.stdout, ok.stderr
        bad = _health(addr, "--member", "worker-elsewhere", "--keys", keys)
        assert bad.returncode == 1 and "not registered" in bad.stderr
        stranger = _health(addr, "--keys", str(run_dir / "no-keys"))
        assert stranger.returncode == 1 and "no secret key" in stranger.stderr
        keyless = _health(addr, "--config", str(run_dir / "none.yaml"))
        assert keyless.returncode == 1 and "refused our handshake" in keyless.stderr
    finally:
        cluster.close()
    gone = _health(addr, "--keys", keys)
    assert gone.returncode == 1 and "no reply" in gone.stderr


def _health(addr: str, *args: str, wait: bool = False) -> subprocess.CompletedProcess[str]:
    """`prl-actors health`; `wait`: ask again until healthy (members register a moment after starting)."""
    if "--config" in args:  # a config without keys of this run (auth none), as a stray client would be
        Path(args[args.index("--config") + 1]).write_text("transport:\n  auth: none\n")
    argv = [*CLI, "health", "--coordinator", addr, *args]
    deadline = time.monotonic() + 10
    while True:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if out.returncode == 0 or not wait or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def test_a_standalone_coordinator_writes_config_and_refuses_a_used_run_dir(tmp_path: Path, run_dir: Path) -> None:
    cfg = sim_config(run_dir, transport="tcp")
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(cfg.dump())
    assert load_config(cfg_path).dump() == cfg.dump()  # `up` writes it, the coordinator rewrites nothing
    keyless = subprocess.run([*CLI, "actor", "coordinator", "--config", str(cfg_path)], capture_output=True, text=True)
    assert keyless.returncode == 1 and "no secret key for 'coordinator'" in keyless.stderr  # keys come first
    made = subprocess.run([*CLI, "keys", "create", "--config", str(cfg_path)], capture_output=True, text=True)
    assert made.returncode == 0 and (run_dir / "keys" / "coordinator.key_secret").exists(), made.stderr
    proc = subprocess.Popen([*CLI, "actor", "coordinator", "--config", str(cfg_path)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not (run_dir / "config.yaml").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (run_dir / "config.yaml").read_text() == cfg.dump()
    finally:
        # config.yaml is written before the coordinator's imports (~3 s here) and before it binds: ask
        # until it answers (`stop` waits 3 s for a reply), as an operator would after "is the run up?"
        stop = [*CLI, "stop", "--coordinator", cfg.address("coordinator"), "--keys", str(run_dir / "keys")]
        deadline = time.monotonic() + 30
        while subprocess.run(stop, capture_output=True, timeout=30).returncode != 0 and time.monotonic() < deadline:
            assert proc.poll() is None, "the coordinator exited before it was asked to stop"
        assert proc.wait(20) == 0
    (run_dir / "metrics.jsonl").write_text("{}\n")
    again = subprocess.run([*CLI, "actor", "coordinator", "--config", str(cfg_path)], capture_output=True, text=True)
    assert again.returncode == 2 and "already holds a run" in again.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_message_ids_differ_between_processes_with_the_same_pid() -> None:
    """Containers (and hosts) reuse pids: every actor under compose's init has pid 7 or 8. Message
    ids are matched across actors (replies, replay), so a pid alone must not make them."""
    probe = "from prl_actors.protocol.messages import new_id; import os; print(os.getpid(), new_id())"
    argv = ["unshare", "--pid", "--fork", sys.executable, "-c", probe]
    outs = [subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split() for _ in range(2)]
    assert outs[0][0] == outs[1][0] == "1"  # the same pid in both
    assert outs[0][1] != outs[1][1]

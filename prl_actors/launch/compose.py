"""`prl-actors up --compose`: the run as docker compose services (docker-compose.yml), supervised.

What `up --compose` does, with `docker compose` (v2) or `docker-compose` (v1), whichever answers:
1. resolves the user's config and rewrites what containers need (`compose_config`): tcp, every actor
   bound on all interfaces of its container, addresses by service name, the run directory on the
   `runs` volume; writes it to a private file that compose mounts as the secret /run/secrets/prl_config;
2. builds the image unless it is up to date (`ImageInputs`: the image is tagged with a digest of what
   it is built from; a second `up` with the same sources starts at once), starts the services with
   `--scale inference=N` (the one-shot `keys` service first: it creates the run's CurveZMQ keys in
   RUN_DIR/keys on the volume), streams the core services' output (the trainer's per-epoch lines);
   copies the operator key (and the coordinator's public key) out of the coordinator's container to
   `operator_keys_dir(project)` on the host, for itself and for `prl-actors status/scale/stop --keys DIR`;
3. follows the coordinator's Status through its published port (127.0.0.1:PORT): `prl-actors scale`
   asks the coordinator, and this loop scales the `inference` service to match;
4. ends with the coordinator's exit status (not the first service's to exit); a core service that dies
   ends the run with an error; Ctrl-C (SIGTERM, SIGHUP) asks the coordinator to stop, then tears down
   (`up` exits 128 + the signal).
The volume (the run directory) is kept; `compose down` removes the containers and the network.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath

from prl_actors.config import DEFAULT_BASE_PORT, Config
from prl_actors.launch.client import RequestFailed, request
from prl_actors.launch.supervisor import STOP_SIGNALS, Interrupted, Signals
from prl_actors.protocol.messages import RequestStop, Status, StatusRequest
from prl_actors.records.logs import console
from prl_actors.transport.auth import PUBLIC, SECRET, KeyStore

ROOT = Path(__file__).resolve().parents[2]  # the repository (prl_actors/launch/compose.py)
COMPOSE_FILE = ROOT / "docker-compose.yml"
DEFAULT_CONFIG = ROOT / "configs" / "compose.yaml"
SECRET_PATH = "/run/secrets/prl_config"
RUNS_MOUNT = PurePosixPath("/runs")
SERVICES = {"coordinator": 27500, "publisher": 27501, "buffer": 27502, "trainer": 27503}
CORE = tuple(SERVICES)
DEFAULT_PROJECT = "prl-actors"
DEFAULT_IMAGE = "prl-actors:latest"  # docker-compose.yml: ${PRL_IMAGE:-prl-actors:latest}
INPUTS_TAG = "inputs-"  # the tag REPO:inputs-<digest> marks the image built from those inputs


class ComposeError(Exception):
    """Something the user must fix (no compose CLI, no engine, a bad run dir); the message says what."""


def compose_env() -> dict[str, str]:
    """The environment for compose calls: os.environ, with docker-compose v1's API read timeout raised
    from 60 s to 600 s unless set (COMPOSE_HTTP_TIMEOUT): creating a container copies the whole image
    under the vfs storage driver, which takes minutes on a loaded host and failed `up -d` at 60 s."""
    return {"COMPOSE_HTTP_TIMEOUT": "600", **os.environ}


def compose_cli(env: dict[str, str] | None = None) -> list[str]:
    """`docker compose` (v2 plugin) if it answers, else `docker-compose` (v1, or v2 standalone).
    PRL_COMPOSE (e.g. "docker-compose") overrides the detection."""
    env = dict(os.environ if env is None else env)
    if env.get("PRL_COMPOSE"):
        return shlex.split(env["PRL_COMPOSE"])
    if shutil.which("docker") and _ok(["docker", "compose", "version"], env):
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise ComposeError(
        "neither `docker compose` nor `docker-compose` is installed; `prl-actors up` runs local processes"
    )


def _ok(argv: list[str], env: dict[str, str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, env=env, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def container_run_dir(run_dir: str) -> str:
    """Where the run directory lives on the volume: /runs/X stays; a relative runs/X or X -> /runs/X."""
    p = PurePosixPath(run_dir)
    parts = p.parts[2:] if p.is_absolute() and p.parts[:2] == ("/", "runs") else p.parts
    if p.is_absolute() and p.parts[:2] != ("/", "runs"):
        raise ComposeError(f"run dir {run_dir!r}: with --compose the run directory is on the volume, under /runs")
    if parts[:1] == ("runs",) and not p.is_absolute():
        parts = parts[1:]
    if not parts or ".." in parts:
        raise ComposeError(f"run dir {run_dir!r}: name a directory under /runs (e.g. runs/my-run)")
    return str(RUNS_MOUNT.joinpath(*parts))


def operator_keys_dir(project: str) -> Path:
    """Where `up --compose` puts the operator key on the host (for status/scale/stop --keys)."""
    return Path("runs") / f"{project}-operator-keys"


def compose_config(cfg: Config) -> Config:
    """The user's config as the services need it (every other setting is passed on unchanged)."""
    if not cfg.authenticated():
        raise ComposeError(
            "transport.auth none is for a single host (loopback or ipc); compose services talk over a "
            "network, so they authenticate with the run's keys (the default, transport.auth curve)"
        )
    out = cfg.model_copy(deep=True)
    out.transport.kind = "tcp"
    out.transport.bind_all = True
    out.transport.addresses = {svc: f"tcp://{svc}:{port}" for svc, port in SERVICES.items()}
    out.run.run_dir = container_run_dir(cfg.run.run_dir)
    return out


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as docker reads it (moby's patternmatcher): `*` and `?` stay inside one
    path element, `**` spans any number of them, `[...]` is a class; the pattern matches whole paths."""
    pattern = os.path.normpath(pattern).lstrip("/")
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
            continue
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out += re.escape(c)
            else:
                out, i = out + "[" + pattern[i + 1 : end].replace("!", "^", 1) + "]", end
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


class ImageInputs:
    """Exactly what the image is built from: the Dockerfile and every file of the build context that
    .dockerignore lets through (path, executable bit, bytes). Its digest names the image: `up
    --compose` skips the build when REPO:inputs-<digest> is the image it would run (the torch index,
    TORCH_INDEX_URL, is where torch comes from, not what: constraints.txt pins it, so it is no input).
    Invariant: a change to any file `COPY . /app` copies, to constraints.txt, pyproject.toml or the
    Dockerfile changes the digest; a change to an ignored file (tests/, docs/, caches) does not."""

    def __init__(self, context: Path) -> None:
        self.context = context
        lines = (context / ".dockerignore").read_text().splitlines() if (context / ".dockerignore").exists() else []
        patterns = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        self.rules = [(p.startswith("!"), _dockerignore_regex(p.removeprefix("!"))) for p in patterns]
        self.has_exceptions = any(keep for keep, _ in self.rules)

    def excluded(self, rel: str) -> bool:
        """docker's rule: the last pattern that matches the path or one of its parent directories wins."""
        parents = [rel] + ["/".join(rel.split("/")[:n]) for n in range(1, rel.count("/") + 1)]
        verdict = False
        for keep, rx in self.rules:
            if any(rx.match(p) for p in parents):
                verdict = not keep
        return verdict

    def files(self) -> list[str]:
        """The context's files (posix paths relative to it, sorted) that reach the image."""
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.context):
            rel_dir = Path(dirpath).relative_to(self.context).as_posix()
            prefix = "" if rel_dir == "." else rel_dir + "/"
            if not self.has_exceptions:  # nothing under an excluded directory can come back
                dirnames[:] = [d for d in dirnames if not self.excluded(prefix + d)]
            found += [prefix + f for f in filenames if not self.excluded(prefix + f)]
        return sorted(found)

    def digest(self) -> str:
        """sha256 (hex) of the Dockerfile and of each context file's path, executable bit and bytes."""
        h = hashlib.sha256(b"Dockerfile\0" + (self.context / "Dockerfile").read_bytes())
        for rel in self.files():
            path = self.context / rel
            h.update(f"\0{rel}\0".encode())
            if path.is_symlink():
                h.update(b"link:" + os.readlink(path).encode())
            else:
                h.update(b"x" if os.access(path, os.X_OK) else b"-")
                h.update(path.read_bytes())
        return h.hexdigest()


def inputs_tag(image: str, digest: str) -> str:
    """REPO:inputs-<first 20 hex of the digest> for an image REPO[:TAG] (REPO may hold a registry port)."""
    name, _, tag = image.rpartition(":")
    repo = name if name and "/" not in tag else image
    return f"{repo}:{INPUTS_TAG}{digest[:20]}"


def image_id(ref: str, env: dict[str, str]) -> str:
    """The local image id of `ref` ('' when there is none)."""
    done = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", ref], env=env, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def image_up_to_date(image: str, digest: str, env: dict[str, str]) -> bool:
    """`image` exists and is the one built from the inputs with this digest."""
    current = image_id(image, env)
    return bool(current) and current == image_id(inputs_tag(image, digest), env)


def mark_image(image: str, digest: str, env: dict[str, str]) -> str:
    """Tag `image` as built from `digest`; untag the repository's older inputs-* tags (else each would
    keep an outdated image alive). Returns the new tag."""
    tag = inputs_tag(image, digest)
    subprocess.run(["docker", "tag", image, tag], env=env, capture_output=True, check=True)
    repo = tag.rpartition(":")[0]
    listed = subprocess.run(["docker", "image", "ls", repo, "--format", "{{.Repository}}:{{.Tag}}"],
                            env=env, capture_output=True, text=True).stdout.split()  # fmt: skip
    stale = [t for t in listed if t.rpartition(":")[2].startswith(INPUTS_TAG) and t != tag]
    if stale:
        subprocess.run(["docker", "image", "rm", *stale], env=env, capture_output=True)
    return tag


def ensure_image(compose: list[str], env: dict[str, str], compose_file: Path = COMPOSE_FILE) -> bool:
    """Build the image with `compose` (the CLI with -f/-p) unless the image tagged with the digest of
    its inputs is already it; returns whether it built. Raises ComposeError when the build fails."""
    image = env.get("PRL_IMAGE") or DEFAULT_IMAGE
    digest = ImageInputs(compose_file.parent).digest()
    if image_up_to_date(image, digest, env):
        console(f"compose: image {image} is up to date ({inputs_tag(image, digest)}), not rebuilt")
        return False
    console(f"compose: building the image with {shlex.join(compose[: compose.index('-f')])} ...")
    t0 = time.monotonic()
    code, tail = _build(compose, env)
    if code != 0:
        raise ComposeError("image build failed:\n" + "\n".join(tail))
    tag = mark_image(image, digest, env)
    console(f"compose: image built in {time.monotonic() - t0:.0f}s, tagged {tag}")
    return True


BUILD_STEP = re.compile(r"^(Step \d+/\d+ :|#\d+ \[[^\]]*\d+/\d+\])")  # classic builder, BuildKit


def _build(compose: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    """`compose build coordinator`, printing each build step as it starts (a cold build takes minutes);
    returns its exit status and its last 30 lines. A signal (supervisor.Signals) kills the build."""
    tail: collections.deque[str] = collections.deque(maxlen=30)
    argv = [*compose, "build", "coordinator"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if BUILD_STEP.match(line):
                console("compose build: " + line.strip()[:110])
        return proc.wait(), list(tail)
    finally:
        if proc.poll() is None:  # cut short (a signal): the engine drops a build whose client is gone
            proc.kill()
        proc.wait()
        proc.stdout.close()


def health_problem(status: Status, member: str | None, max_age_s: float) -> str:
    """Why `member` is not healthy ('' when it is): it must be registered and seen within `max_age_s`.
    `member` is a name or a name prefix (worker-HOST matches worker-HOST-PID)."""
    if not member:
        return ""
    found = [m for m in status.members if m.name == member or m.name.startswith(member + "-")]
    if not found:
        return f"{member} is not registered with the coordinator (state {status.state})"
    best = min(found, key=lambda m: m.last_seen_s)
    if best.last_seen_s > max_age_s:
        return f"{best.name} was last seen {best.last_seen_s:.1f}s ago (more than {max_age_s:g}s)"
    return ""


def compose_up(cfg: Config, compose_file: Path = COMPOSE_FILE) -> int:
    """Run `cfg` as compose services until the coordinator exits; returns its exit status."""
    try:
        if shutil.which("docker") is None:
            raise ComposeError("the `docker` CLI is not installed; `prl-actors up` runs local processes")
        cli = compose_cli()
        if not _ok(["docker", "info"], dict(os.environ)):
            raise ComposeError("no Docker engine is reachable (`docker info` failed); is DOCKER_HOST right?")
        run_cfg = compose_config(cfg)
    except ComposeError as exc:
        console(f"error: {exc}")
        return 2
    with tempfile.TemporaryDirectory(prefix="prl-compose-") as tmp:
        secret = Path(tmp) / "config.yaml"
        secret.write_text(run_cfg.dump())
        secret.chmod(0o644)  # the containers' non-root user reads it through the bind mount
        host_port = cfg.transport.base_port or DEFAULT_BASE_PORT
        return ComposeRun(cli, run_cfg, compose_file, secret, host_port).run()


class ComposeRun:
    def __init__(self, cli: list[str], cfg: Config, compose_file: Path, secret: Path, host_port: int) -> None:
        self.cfg, self.desired, self.compose_file = cfg, cfg.run.workers, compose_file
        self.project = os.environ.get("COMPOSE_PROJECT_NAME") or DEFAULT_PROJECT
        self.base = [*cli, "-f", str(compose_file), "-p", self.project]
        port = int(os.environ.get("PRL_COORDINATOR_PORT") or host_port)
        self.env = {**compose_env(), "PRL_CONFIG_FILE": str(secret), "PRL_COORDINATOR_PORT": str(port)}
        self.coordinator = f"tcp://127.0.0.1:{port}"
        self.ids: dict[str, str] = {}
        self.followers: list[threading.Thread] = []
        self.t0 = time.monotonic()
        self.last_stall = ""
        self.keys: KeyStore | None = None  # the operator key, once copied out of the coordinator

    def compose(self, *args: str, quiet: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.PIPE if quiet else None
        return subprocess.run([*self.base, *args], env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)

    def run(self) -> int:
        """The supervisor's signal handling (supervisor.Signals; a signal cuts a blocking step, the
        image build, short); its members are containers, started and stopped by compose."""
        with Signals(immediate=True).installed():
            try:
                self.build()
                self.start()
                return self.supervise()
            except Interrupted as sig:
                console(f"\n{sig}: stopping the run ...")
                with contextlib.suppress(Interrupted):  # a second signal: stop waiting for the coordinator
                    self.stop_run(f"{sig} to prl-actors up --compose")
                return 128 + sig.signum
            except ComposeError as exc:
                console(f"error: {exc}")
                return 1
            finally:
                self.teardown()

    def build(self) -> None:
        ensure_image(self.base, self.env, self.compose_file)

    def start(self) -> None:
        c = self.cfg
        console(
            f"compose up: {self.desired} inference replicas, {c.run.epochs} epochs, mode {c.run.mode}, "
            f"engine {c.worker.engine}, run dir {c.run.run_dir} on volume {self.project}_runs, "
            f"coordinator {self.coordinator}"
        )
        done = self.compose("up", "-d", "--no-build", "--scale", f"inference={self.desired}")
        if done.returncode != 0:
            raise ComposeError("compose up failed:\n" + "\n".join(done.stdout.splitlines()[-30:]))
        self.ids = self.container_ids()
        missing = [svc for svc in CORE if svc not in self.ids]
        if missing:
            raise ComposeError(f"no container for {', '.join(missing)} after compose up")
        for svc in CORE:
            self.follow(svc)
        self.keys = self.copy_operator_key()
        console(f"compose: operator key for status/scale/stop from this host: --keys {self.keys.directory}")

    def copy_operator_key(self) -> KeyStore:
        """The operator's secret and the coordinator's public key, out of the coordinator's container
        (the `keys` service made them on the volume) into a private directory on this host."""
        out = operator_keys_dir(self.project)
        out.mkdir(parents=True, exist_ok=True)
        out.chmod(0o700)
        keys = PurePosixPath(self.cfg.keys_path().as_posix())
        for f in (f"operator{SECRET}", f"coordinator{PUBLIC}"):
            argv = ["docker", "cp", f"{self.ids['coordinator']}:{keys / f}", str(out / f)]
            done = subprocess.run(argv, env=self.env, capture_output=True, text=True)
            if done.returncode != 0:
                raise ComposeError(f"cannot copy {f} out of the coordinator's container: {done.stderr.strip()}")
            (out / f).chmod(0o600)
        return KeyStore(out)

    def container_ids(self) -> dict[str, str]:
        """service -> container id of the core services (labels set by both compose versions)."""
        fmt = '{{.ID}} {{.Label "com.docker.compose.service"}}'
        argv = ["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}", "--format", fmt]
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True).stdout
        pairs = [line.split() for line in out.splitlines() if len(line.split()) == 2]
        return {svc: cid for cid, svc in pairs if svc in CORE}

    def follow(self, service: str) -> None:
        """Stream a core container's output: the trainer's lines as they are, others tagged."""
        proc = subprocess.Popen(
            ["docker", "logs", "-f", self.ids[service]], env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        tag = "" if service == "trainer" else f"[{service}] "

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                console(tag + line.rstrip("\n"))

        t = threading.Thread(target=pump, name=f"logs-{service}", daemon=True)
        t.start()
        self.followers.append(t)

    def states(self, attempts: int = 5) -> dict[str, tuple[str, int]]:
        """Status and exit code of each core container. A busy engine can fail an inspect now and then
        (seen under load with the vfs driver): only `attempts` failures in a row, a second apart, mean
        the containers are gone."""
        argv = ["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", *self.ids.values()]
        for attempt in range(attempts):
            out = subprocess.run(argv, env=self.env, capture_output=True, text=True).stdout.split()
            if len(out) == 2 * len(self.ids):
                return {svc: (out[2 * i], int(out[2 * i + 1])) for i, svc in enumerate(self.ids)}
            if attempt + 1 < attempts:
                time.sleep(1.0)
        raise ComposeError("the core containers disappeared (removed from outside?)")

    def supervise(self) -> int:
        while True:
            states = self.states()
            status, code = states["coordinator"]
            if status in ("exited", "dead"):
                if code != 0:
                    console(f"error: the coordinator exited with code {code} (its lines are above)")
                    return code
                self.wait_exited(CORE, 20.0)
                self.summary()
                return code
            for svc in CORE[1:]:
                if states[svc][0] in ("exited", "dead") and states[svc][1] != 0:
                    self.stop_run(f"{svc} died")
                    raise ComposeError(f"{svc} exited with code {states[svc][1]}; see the lines above")
            self.poll_status()
            time.sleep(1.0)

    def poll_status(self) -> None:
        try:
            st = request(self.coordinator, StatusRequest(), timeout_s=1.0, keys=self.keys)
        except RequestFailed:
            return
        if not isinstance(st, Status):
            return
        if st.desired_workers >= 0 and st.desired_workers != self.desired:  # `prl-actors scale` was asked
            self.scale(st.desired_workers)
        if st.waiting_for and st.waiting_for != self.last_stall:
            console(f"stalled: {st.waiting_for}")
        self.last_stall = st.waiting_for

    def scale(self, n: int) -> None:
        console(f"scaling inference {self.desired} -> {n}")
        self.desired = n
        scale = ("--scale", f"inference={n}", "inference")
        done = self.compose("up", "-d", "--no-build", "--no-recreate", "--no-deps", *scale)
        if done.returncode != 0:
            console("scale failed:\n" + "\n".join(done.stdout.splitlines()[-10:]))

    def wait_exited(self, services: tuple[str, ...], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(ComposeError):
                if all(s in ("exited", "dead") for s, _ in (self.states()[svc] for svc in services)):
                    return
            time.sleep(0.5)

    def stop_run(self, reason: str) -> None:
        """Ask the coordinator to stop the run (every actor shuts down cleanly), wait for it to exit."""
        with contextlib.suppress(RequestFailed):
            request(self.coordinator, RequestStop(reason=reason), timeout_s=3.0, keys=self.keys)
        if self.ids:
            self.wait_exited(("coordinator",), 15.0)

    def summary(self) -> None:
        from prl_actors.launch.up import summary

        with tempfile.TemporaryDirectory(prefix="prl-metrics-") as tmp:
            src = f"{self.ids['trainer']}:{self.cfg.run.run_dir}/metrics.jsonl"
            subprocess.run(["docker", "cp", src, tmp], env=self.env, capture_output=True)
            lines = summary(Path(tmp), time.monotonic() - self.t0).splitlines()
        console(lines[0])
        console(
            f"run dir: {self.cfg.run.run_dir} on the volume {self.project}_runs; check it with\n"
            f"  {shlex.join(self.base)} run --rm --no-deps coordinator "
            f"prl-actors replay {self.cfg.run.run_dir} --check"
        )

    def teardown(self) -> None:
        """Remove the containers and the network (not the volume); no stop signal cuts this short."""
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
        try:
            done = self.compose("down", "--remove-orphans", "-t", "15")
            if done.returncode != 0:
                console("compose down failed:\n" + "\n".join(done.stdout.splitlines()[-10:]))
            for t in self.followers:
                t.join(5.0)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

"""The hostile-program suite of the code reward's sandbox (rewards/sandbox.py, docs/SECURITY.md).

Every case is a program that attacks the host or its own score, with a wrong `add`: each must score
0/3 and leave no trace outside: no file written, no process alive after the call, no connection
made, no process killed, no secret read. Each runs in three workers: this process (the venv's
interpreter, this user: root on the dev VM and in CI's container), a root worker on a world-readable
system interpreter, and an ordinary user's worker (uid 65534 through `setpriv`, the same interpreter
and source), the worker side of a run started by someone other than root.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prl_actors.rewards import sandbox
from prl_actors.rewards.code import run_tests

if sandbox.launcher()[1] is not None:
    pytest.skip(f"no sandbox here: {sandbox.launcher()[1]}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
WRONG = "\ndef add(a, b):\n    return a - b + 7\n"
NOBODY = 65534
RUNNER = """
import asyncio, json, os, sys
from prl_actors.rewards.code import run_tests
for line in sys.stdin:
    job = json.loads(line)
    code = job["code"].replace("WORKER_PID", str(os.getpid()))
    print(json.dumps(asyncio.run(run_tests(code, job["tests"], timeout_s=job["timeout_s"]))), flush=True)
"""
Score = Callable[..., list[bool]]


def system_python() -> str | None:
    """A world-readable interpreter of this Python's version, or None."""
    for path in (f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}", "/usr/local/bin/python3"):
        if os.path.exists(path) and os.stat(path).st_mode & 0o005 == 0o005:
            return path
    return None


def site_imports() -> set[Path]:
    """The files of the top-level site packages that importing prl_actors.rewards.code loads (a
    package's __init__.py, or a module's own file; extension modules included)."""
    probe = (
        "import json, sys; before = set(sys.modules); import prl_actors.rewards.code; "
        "tops = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(json.dumps([getattr(sys.modules[t], '__file__', None) for t in sorted(tops) if t in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    files = [Path(f) for f in json.loads(out.stdout) if f and "site-packages" in f]
    return {f for f in files if f.name == "__init__.py" or f.parent.name == "site-packages"}


def readable_copy(into: Path) -> list[str]:
    """The worker's imports (prl_actors and the site packages prl_actors.rewards.code loads) copied
    into `into`, readable by every uid: a checkout or venv in a 0700 directory (a `mktemp -d` clone)
    cannot be read by another uid's worker. Returns its PYTHONPATH."""
    (into / "prl_actors").parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "prl_actors", into / "prl_actors", ignore=shutil.ignore_patterns("__pycache__"))
    for origin in site_imports():
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, into / origin.parent.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, into / origin.name)
    for path in [into, *into.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return [str(into)]


class Worker:
    """A worker process (another interpreter, maybe another uid) that scores programs sent to it."""

    def __init__(self, prefix: list[str], path: list[str] | None = None) -> None:
        site = [p for p in sys.path if p.endswith("site-packages")]
        path = path or [str(ROOT), *site]
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(path), "HOME": "/nonexistent"}
        self.prefix = prefix  # a neighbour of the worker's uid is started with it
        argv = [*prefix, str(system_python()), "-c", RUNNER]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/")

    def __call__(self, code: str, tests: list[str] = TESTS, timeout_s: float = 2.0) -> list[bool]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"code": code, "tests": tests, "timeout_s": timeout_s}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # bounded: the sandbox's own deadline is timeout_s
        assert line, f"the worker died during the call: rc {self.proc.wait()}"
        result: list[bool] = json.loads(line)
        return result

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module", params=["venv-this-user", "system-python-this-user", "system-python-uid-65534"])
def score(request: pytest.FixtureRequest) -> Iterator[Score]:
    """Scores a program against TESTS (WORKER_PID in it: the worker's pid)."""
    if request.param == "venv-this-user":
        yield lambda code, tests=TESTS, timeout_s=2.0: asyncio.run(
            run_tests(code.replace("WORKER_PID", str(os.getpid())), tests, timeout_s=timeout_s)
        )
        return
    if system_python() is None:
        pytest.skip("no world-readable python of this version")
    prefix, path = [], None
    if request.param.endswith("65534"):
        if os.getuid() != 0 or shutil.which("setpriv") is None:
            pytest.skip("an ordinary user's worker is started with setpriv, as root")
        prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        staged = Path(tempfile.mkdtemp(prefix="prl-sandbox-worker-"))
        staged.chmod(0o755)
        path = readable_copy(staged / "lib")
    worker = Worker(prefix, path)
    yield worker
    worker.close()
    if path:
        shutil.rmtree(Path(path[0]).parent, ignore_errors=True)


def world_writable_dir(tmp_path: Path) -> Path:
    """A host directory anyone may write: only the sandbox, not permissions, keeps the program out."""
    tmp_path.chmod(0o777)
    for parent in tmp_path.parents:
        if parent == Path("/tmp"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)
    return tmp_path


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def gone_within(marker: str, seconds: float = 2.0) -> bool:
    deadline = time.monotonic() + seconds
    while processes_with(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_correct_program_still_passes(score: Score) -> None:
    """The control: the sandbox runs honest code (and these attacks are the only reason for 0/3)."""
    assert score("def add(a, b):\n    return a + b\n") == [True] * 3


FORK_EXEC = (  # `_posixsubprocess.fork_exec` as 3.11's subprocess calls it: it raises no audit event
    "import _posixsubprocess, os\n"
    "def spawn(argv, setsid):\n"
    "    return _posixsubprocess.fork_exec([a.encode() for a in argv], [argv[0].encode()], True, (), None, None,"
    " -1, -1, -1, -1, -1, -1, *os.pipe(), True, setsid, -1, None, None, None, -1, None, False)\n"
)


def spawn_attacks() -> list[tuple[str, str]]:
    """(marker, program): ways to start a process that outlives the call, each `sleep MARKER`."""
    attacks = [
        "import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ARGV)",
        "import subprocess\nsubprocess.Popen(ARGV, start_new_session=True)",
        "import os\nos.posix_spawn('/bin/sleep', ARGV, {}, setsid=True)",
        "import os\nos.system('setsid ' + ' '.join(ARGV) + ' &')",
        FORK_EXEC + "spawn(ARGV, True)",
    ]
    out: list[tuple[str, str]] = []
    for attack in attacks:
        marker = f"{1000 + len(out)}.{uuid.uuid4().int % 10**8}"
        out.append((marker, attack.replace("ARGV", f"['/bin/sleep', {marker!r}]")))
    return out


def test_no_process_outlives_the_call(score: Score) -> None:
    """fork + setsid, subprocess, posix_spawn, os.system, and `_posixsubprocess.fork_exec` (no audit event)."""
    for marker, attack in spawn_attacks():
        assert score(attack + WRONG) == [False] * 3, attack
        assert gone_within(marker, 0.5), f"a process of the program outlived the call: {attack}"


def test_the_spawn_attacks_work_without_the_sandbox() -> None:
    """The control: outside bubblewrap (`unsafe_local`) each attack above does leave its process."""
    for marker, attack in spawn_attacks():
        settle = "\nimport time\ntime.sleep(0.3)\n"  # the child's setsid before the call's group kill
        asyncio.run(run_tests(attack + settle + WRONG, TESTS, timeout_s=2.0, unsafe_local=True))
        deadline = time.monotonic() + 2.0
        while not processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        left = processes_with(marker)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert left, f"the attack started nothing even without the sandbox: {attack}"


KILLS = {
    "os.kill": "import os, signal\nfor pid in ({pids}):\n    os.kill(pid, signal.SIGKILL)\n",
    "pidfd": "import os, signal\nfor pid in ({pids}):\n    signal.pidfd_send_signal(os.pidfd_open(pid), 9)\n",
    "/bin/kill": FORK_EXEC + "os.waitpid(spawn(['/bin/kill', '-9', *map(str, ({pids}))], False), 0)\n",
    "kill -1": "import os\nos.kill(os.getppid(), 9)\nos.kill(-1, 9)\n",
}


@pytest.mark.parametrize("how", ["os.kill", "pidfd", "/bin/kill"])
def test_the_kill_attacks_work_without_the_sandbox(how: str) -> None:
    """The control (kill -1 left out: it would kill everything): outside bubblewrap (`unsafe_local`),
    aimed at the neighbour alone, each kills it."""
    neighbour = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        kill = KILLS[how].format(pids=f"{neighbour.pid},")
        asyncio.run(run_tests(kill + WRONG, TESTS, timeout_s=2.0, unsafe_local=True))
        assert neighbour.wait(timeout=5) == -signal.SIGKILL
    finally:
        neighbour.kill()
        neighbour.wait()


@pytest.mark.parametrize("how", sorted(KILLS))
def test_the_program_cannot_kill_its_worker_or_a_neighbour(score: Score, how: str) -> None:
    """The worker's pid (WORKER_PID) and a neighbour of the worker's uid are passed in; after the
    call both live (the worker is asked for the next call's score; its death fails the call)."""
    prefix: list[str] = getattr(score, "prefix", [])
    neighbour = subprocess.Popen([*prefix, "sleep", "30"], start_new_session=True)
    try:
        kill = KILLS[how].format(pids=f"WORKER_PID, {neighbour.pid}")
        assert score(kill + WRONG) == [False] * 3
        assert neighbour.poll() is None, f"{how} killed a process outside the sandbox"
        assert score("def add(a, b):\n    return a + b\n") == [True] * 3  # the worker is alive
    finally:
        neighbour.kill()
        neighbour.wait()


def test_nothing_is_written_outside_its_private_tmp(score: Score, tmp_path: Path) -> None:
    """Files, directories, fifos, device nodes, sqlite databases, in a world-writable host dir, in
    the host's /tmp, in the repository (/work here) and in HOME: none appears on the host."""
    targets = [world_writable_dir(tmp_path), Path("/tmp"), ROOT, Path.home()]
    for target in targets:
        name = str(target / f"prl-escape-{uuid.uuid4().hex}")
        for attack in (
            f"open({name!r}, 'w').write('x')",
            f"import os\nos.mkdir({name!r})",
            f"import os\nos.mkfifo({name!r})",
            f"import os, stat\nos.mknod({name!r}, 0o600 | stat.S_IFCHR, os.makedev(1, 3))",
            f"import sqlite3\nsqlite3.connect({name!r}).execute('create table t (x)')",
            f"import os\nos.symlink('/etc/passwd', {name!r})",
        ):
            score(attack + WRONG)
            assert not os.path.lexists(name), f"{attack} wrote to the host"


def test_inside_its_tmp_it_may_write(score: Score) -> None:
    work = "open('/tmp/mine.txt', 'w').write('ok')\nassert open('mine.txt').read() == 'ok'\n"
    assert score(work + "def add(a, b):\n    return a + b\n") == [True] * 3


def test_secrets_of_the_host_are_not_readable(score: Score) -> None:
    """A world-readable file in the repository (under /work here) and one in HOME, each read by
    `add`: the test that passes if the program can read it fails (no /work, /home, /root inside)."""
    for folder in (ROOT, Path.home()):
        value = uuid.uuid4().int % 10**9
        secret = folder / f".prl-secret-{value}"
        try:
            secret.write_text(str(value))
            secret.chmod(0o644)
            steal = f"def add(a, b):\n    return int(open({str(secret)!r}).read())\n"
            assert score(steal, [f"assert add(1, 2) == {value}"]) == [False], f"{secret} was read"
        finally:
            secret.unlink(missing_ok=True)


def test_no_network(score: Score) -> None:
    """A tcp port and an abstract unix socket listening on the host: the program connects to both;
    neither sees a connection (new network namespace; seccomp refuses non-unix sockets anyway)."""
    server = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX)
    name = f"\0prl-sandbox-{uuid.uuid4().hex}"
    abstract.bind(name)
    for s in (server, abstract):
        s.listen()
        s.setblocking(False)
    try:
        attacks = [
            f"import socket\nsocket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=1)",
            f"import socket\nsocket.socket(socket.AF_UNIX).connect({name!r})",
        ]
        for attack in attacks:
            assert score(attack + WRONG) == [False] * 3
        for s in (server, abstract):
            with pytest.raises(BlockingIOError):
                s.accept()
    finally:
        server.close()
        abstract.close()


def test_fd_tricks_cannot_forge_passes(score: Score) -> None:
    """The program writes "passed" in every shape it could guess (the old harness's `1`, an encoded
    True) to every fd it holds, to /proc/self/fd and to its parent's fds: the
    verdict is decided outside from its answers, and a wrong `add` still fails all three."""
    forged = "1\\n" * 3 + '[[\\"B\\", true]]\\n' * 3
    attack = (
        "import os, glob\n"
        f"data = b'{forged}'\n"
        "for fd in range(256):\n"
        "    try: os.write(fd, data)\n"
        "    except OSError: pass\n"
        "for path in glob.glob('/proc/*/fd/*'):\n"
        "    try: open(path, 'wb').write(data)\n"
        "    except OSError: pass\n"
    )
    assert score(attack + WRONG) == [False] * 3


def test_the_expected_values_never_enter_the_sandbox(score: Score) -> None:
    """The program collects every number shaped like the expected one from everything it can reach
    (the objects in its memory, every frame of the harness, the environment, its cmdline, the files
    beside it) and answers them all: the expected one is never among them."""
    secret = 700_000_000 + uuid.uuid4().int % 10**8  # 9 digits, starting with 7
    spy = (
        "import gc, glob, os, re, sys\n"
        "def seen():\n"
        "    blobs = [repr(o) for o in gc.get_objects() if isinstance(o, (dict, list, tuple))]\n"
        "    for frame in sys._current_frames().values():\n"
        "        while frame is not None:\n"
        "            blobs.append(repr(frame.f_locals))\n"
        "            frame = frame.f_back\n"
        "    blobs += [repr(dict(os.environ)), open('/proc/self/cmdline', 'rb').read().decode()]\n"
        "    for path in glob.glob('*') + glob.glob('/tmp/*') + glob.glob('/sandbox/*'):\n"
        "        try:\n"
        "            blobs.append(open(path, errors='replace').read())\n"
        "        except OSError:\n"
        "            pass\n"
        "    return ' '.join(blobs)\n"
        "def add(a, b):\n"
        "    return sorted({int(n) for n in re.findall('7' + '[0-9]' * 8, seen())})\n"
    )
    tests = [f"assert {secret} in add(1, 2)", f"assert set(add(1, 2)) & {{{secret}}}"]
    assert score(spy, tests) == [False] * 2
    assert score(spy, [f"assert len(add(1, 2)) < 1000 and {secret} not in add(1, 2)"]) == [True]  # it ran


def test_a_fork_bomb_is_contained(score: Score) -> None:
    t0 = time.monotonic()
    assert score("import os\nwhile True:\n    os.fork()\n" + WRONG) == [False] * 3
    assert time.monotonic() - t0 < 10


def test_memory_and_disk_bombs_are_refused(score: Score) -> None:
    assert score("x = bytearray(8 << 30)\n" + WRONG) == [False] * 3
    fill = "for i in range(1000):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (1 << 20))\n"
    assert score(fill + WRONG) == [False] * 3  # the private tmpfs is 64 MiB
    places = (  # /tmp is the only writable place: every other tmpfs (/dev, /dev/shm) would be unbounded
        "import os\nwritable = []\nfor d in ('/', '/dev', '/dev/shm', '/dev/pts', '/proc', '/sandbox', '/tmp'):\n"
        "    try:\n        open(d + '/f', 'wb').write(b'x')\n        writable.append(d)\n    except OSError:\n"
        "        pass\ndef add(a, b):\n    return writable\n"
    )
    assert score(places, ["assert add(0, 0) == ['/tmp']"]) == [True]


def test_loops_are_killed_at_the_deadline(score: Score) -> None:
    """A busy loop, one that ignores SIGTERM, and threads that spin: all killed at 1 s."""
    for attack in (
        "while True:\n    pass\n",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n",
        "import threading\nfor _ in range(4):\n"
        "    threading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()\n",
    ):
        t0 = time.monotonic()
        assert score(attack + WRONG, timeout_s=1.0) == [False] * 3
        assert time.monotonic() - t0 < 6, attack


@pytest.mark.skipif(os.getuid() != 0, reason="reads the processes of other users in /proc")
def test_without_seccomp_the_pid_namespace_still_kills_every_process() -> None:
    """The second layer alone: seccomp off, a setsid grandchild that sleeps (the program answers
    that it saw it start); when the call ends (its harness exits) the namespace dies, and with it
    the grandchild."""
    marker = f"{2000 + os.getpid() % 1000}.{uuid.uuid4().int % 10**8}"
    program = (
        "import os, time\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    os.setsid()\n"
        f"    os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
        "for _ in range(100):\n"
        f"    started = '{marker}' in open(f'/proc/{{child}}/cmdline').read()\n"
        "    if started:\n"
        "        break\n"
        "    time.sleep(0.01)\n"
    )
    limits = {"as": 1 << 29, "fsize": 1 << 20, "cpu": 3}
    tests = [{"probes": ["started"], "inside": False, "prelude": ""}]
    job = {"mode": "run", "code": program, "setup": "", "limits": limits, "tests": tests}
    lines = asyncio.run(sandbox.run_job(job, 5.0, seccomp=False))
    assert lines[0] == b'[["B", true]]', lines  # the grandchild ran
    assert gone_within(marker, 2.0), "a grandchild outlived the namespace"


def test_seccomp_refuses_what_it_should() -> None:
    """Inside: fork, a tcp socket, mknod, ptrace refused (EPERM / EAFNOSUPPORT); threads work."""
    probe = (
        "import ctypes, errno, os, socket, threading\n"
        "def refused(f):\n"
        "    try:\n        f()\n    except OSError as e:\n        return e.errno\n    return 0\n"
        "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def ptrace():\n"
        "    if libc.ptrace(16, 1, 0, 0) != 0:\n        raise OSError(ctypes.get_errno(), 'ptrace')\n"
        "codes = [refused(os.fork), refused(socket.socket), refused(lambda: os.mkfifo('f')), refused(ptrace)]\n"
    )
    want = f"[{1}, {97}, {1}, {1}]"
    tests = [f"assert codes == {want}"]
    assert asyncio.run(run_tests(probe, tests)) == [True]


def test_the_sandbox_refuses_to_start_without_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """bwrap missing: one line saying what to install (and how to opt out), no traceback; the
    explicit `unsafe_local` still runs (trusted code only)."""
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.launcher.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap .*unsafe_local") as err:
            sandbox.require()
        assert "\n" not in str(err.value)
        good = "def add(a, b):\n    return a + b\n"
        assert asyncio.run(run_tests(good, TESTS, unsafe_local=True)) == [True] * 3
    finally:
        sandbox.launcher.cache_clear()


def test_killing_the_worker_kills_the_sandbox() -> None:
    """`--die-with-parent`: a worker SIGKILLed mid-call leaves no process of the program behind."""
    marker = f"{3000 + os.getpid() % 1000}.{uuid.uuid4().int % 10**8}"
    code = f"import os\nos.execv('/bin/sleep', ['sleep', '{marker}'])\n"  # exec is allowed: it stays inside
    script = (
        "import asyncio, sys\nfrom prl_actors.rewards.code import run_tests\n"
        f"asyncio.run(run_tests({code!r}, ['assert add(1, 2) == 3'], timeout_s=60))\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        deadline = time.monotonic() + 20
        while not any(pid != worker.pid for pid in processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(pid != worker.pid for pid in processes_with(marker)), "the sandbox never started"
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    assert gone_within(marker, 3.0), "the sandbox outlived its worker"

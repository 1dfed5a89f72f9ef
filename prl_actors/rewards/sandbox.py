"""Run one harness job (sandbox_harness.py) in bubblewrap, or, only when asked (`unsafe_local`),
as a plain local subprocess.

The bubblewrap sandbox (docs/SECURITY.md):
- new user, pid, mount, network, IPC, UTS and cgroup namespaces (`--unshare-all`); inside, uid and
  gid 65534; as root, bwrap itself is started as uid 65534 too (`setpriv`) where that works, so even
  the kernel's view of the processes is unprivileged;
- a filesystem of its own: read-only binds of /usr, the /lib* and /bin links, the interpreter's
  prefix and the two harness files; a fresh /proc of its pid namespace; a minimal, read-only /dev
  (its device nodes work); a private 64 MiB tmpfs as /tmp and cwd, the only writable place; the
  root read-only. No /home, /root, /work, /etc (bar ld.so.cache);
- seccomp (sandbox_seccomp.py): no new processes, no sockets but AF_UNIX, no ptrace, mknod, mounts;
- rlimits (set by the harness before it reads the program): address space, CPU, file size, open
  files, processes, no core files; a clean environment;
- a wall-clock deadline: then bwrap is SIGKILLed; its child, pid 1 of the namespace, dies with it
  (`--die-with-parent`), and with pid 1 the kernel kills every process of the namespace.
Stdlib only (an ordinary user's worker on a system interpreter imports it in tests/test_code_sandbox.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prl_actors.rewards import sandbox_seccomp

HERE = Path(__file__).resolve().parent
FILES = ("sandbox_harness.py", "sandbox_values.py")
INSIDE = "/sandbox"
NOBODY = "65534"
TMP_BYTES = 64 << 20
MAX_ANSWER_BYTES = 1 << 20
PROBE_TIMEOUT_S = 20.0
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
HINT = (
    "the code reward needs bubblewrap: apt-get install bubblewrap "
    "(or set task.code_unsafe_local: true, or unsafe_local: true in the code reward's args, for trusted code only)"
)


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot make its namespaces here; the message is one line saying what to do."""


def interpreter() -> str:
    """The interpreter the sandbox runs: this one's real file (a venv's python is a link to it)."""
    return os.path.realpath(sys.executable)


def bwrap_argv(python: str, seccomp_fd: int | None, drop_outside: bool) -> list[str]:
    """The command line that runs the harness in the sandbox (seccomp read from `seccomp_fd`)."""
    bwrap = shutil.which("bwrap") or "bwrap"
    outside = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if drop_outside else []
    # --unshare-all only tries the user and cgroup namespaces: asked outright, bwrap fails without them
    argv = [*outside, bwrap, "--unshare-all", "--unshare-user", "--unshare-cgroup", "--cap-drop", "ALL"]
    argv += ["--die-with-parent", "--new-session", "--uid", NOBODY, "--gid", NOBODY]
    argv += ["--hostname", "sandbox", *_system_binds(python)]
    for name in FILES:
        argv += ["--ro-bind", str(HERE / name), f"{INSIDE}/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--chdir", "/tmp"]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--clearenv", *_env_args()]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return [*argv, "--", python, "-I", "-S", f"{INSIDE}/{FILES[0]}"]


def _system_binds(python: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefixes = {os.path.realpath(sys.base_prefix), str(Path(python).parent.parent)}
    for prefix in sorted(prefixes):
        if not (prefix + "/").startswith("/usr/"):
            args += ["--ro-bind", prefix, prefix]
    return args


def _env_args() -> list[str]:
    env = {**CLEAN_ENV, "HOME": "/tmp", "TMPDIR": "/tmp"}
    return [arg for key, value in env.items() for arg in ("--setenv", key, value)]


@functools.cache
def launcher() -> tuple[bool, str | None]:
    """(drop_outside, None) for the first way of starting bwrap that works here (as root: under
    uid 65534 first), else (False, why not): bwrap missing, or namespaces refused."""
    if shutil.which("bwrap") is None:
        return False, "bwrap is not installed"
    failures = []
    for drop in [True, False] if os.getuid() == 0 and shutil.which("setpriv") else [False]:
        why = _try(drop)
        if why is None:
            return drop, None
        failures.append(why)
    return False, failures[-1]


def _try(drop_outside: bool) -> str | None:
    argv = bwrap_argv(interpreter(), None, drop_outside)
    argv[-1:] = ["-c", "import json, resource; print('ok')"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S, env=CLEAN_ENV, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.stdout.strip() == b"ok":
        return None
    return (done.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {done.returncode}"])[-1]


def require(unsafe_local: bool = False) -> None:
    """Raise SandboxUnavailable (one line: what to install) unless the sandbox works here or the
    caller opted out with `unsafe_local`."""
    if unsafe_local:
        return
    _, why = launcher()
    if why is not None:
        raise SandboxUnavailable(f"{HINT} [{why}]")


async def run_job(
    job: dict[str, Any], timeout_s: float, *, unsafe_local: bool = False, seccomp: bool = True
) -> list[bytes]:
    """The harness's answer lines for `job`; what did not arrive within `timeout_s` is missing.
    `seccomp=False` is for tests of the other layers only."""
    payload = json.dumps(job).encode()
    if unsafe_local:
        with tempfile.TemporaryDirectory(prefix="prl-code-") as workdir:
            argv = [interpreter(), "-I", "-S", str(HERE / FILES[0])]
            return await _spawn(argv, payload, timeout_s, (), workdir)
    require()
    drop, _ = launcher()
    if not (seccomp and sandbox_seccomp.supported()):
        return await _spawn(bwrap_argv(interpreter(), None, drop), payload, timeout_s, (), "/")
    read, write = os.pipe()
    try:
        os.write(write, sandbox_seccomp.build())  # < 1 KiB: fits the pipe's buffer
        os.close(write)
        return await _spawn(bwrap_argv(interpreter(), read, drop), payload, timeout_s, (read,), "/")
    finally:
        os.close(read)


async def _spawn(argv: Sequence[str], payload: bytes, timeout_s: float, fds: Sequence[int], cwd: str) -> list[bytes]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env={**CLEAN_ENV, "HOME": cwd, "TMPDIR": cwd},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        pass_fds=tuple(fds),
    )
    out = bytearray()
    try:
        await asyncio.wait_for(_talk(proc, payload, out), timeout_s)
    except (TimeoutError, BrokenPipeError, ConnectionResetError):
        pass
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap; pid 1 of the namespace dies with it, then the rest
        await proc.wait()
    return bytes(out).split(b"\n")


async def _talk(proc: asyncio.subprocess.Process, payload: bytes, out: bytearray) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(payload)
    await proc.stdin.drain()
    proc.stdin.close()
    while len(out) < MAX_ANSWER_BYTES:
        chunk = await proc.stdout.read(1 << 16)
        if not chunk:
            break
        out.extend(chunk)

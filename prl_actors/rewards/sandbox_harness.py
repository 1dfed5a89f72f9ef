"""Runs INSIDE the sandboxed child (python -I -S sandbox_harness.py): never imported by prl-actors.

Reads job.json ({"code", "tests", "uid", "limits"}) from its cwd, sets the rlimits, sends the
program's own stdout/stderr to output.txt, drops to `uid` when started as root, refuses writes
outside its cwd, process creation, native code loading and sockets (an audit hook), runs the code,
then each test, printing one line per test on the original stdout: "1" passed, "0" failed. Kept to
the stdlib on purpose.
"""

import json
import os
import resource
import sys

PRELOAD = "math collections itertools functools heapq bisect re string typing operator copy fractions"
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
PATH_EVENTS = {
    "os.remove",
    "os.rmdir",
    "os.mkdir",
    "os.rename",
    "os.chmod",
    "os.chown",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.utime",
    "shutil.rmtree",
    "shutil.copyfile",
    "shutil.move",
}
DENIED_EVENTS = {
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "ctypes.dlopen",
    "ctypes.dlsym",
    "ctypes.cdata",
    "socket.connect",
    "socket.bind",
    "socket.__new__",
    "sys.addaudithook",
}


def main() -> None:
    with open("job.json", encoding="utf-8") as f:
        job = json.load(f)
    os.remove("job.json")
    _limit(job["limits"])
    results = os.dup(1)
    sink = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    if job["uid"] and not _world_readable(os.path.dirname(os.__file__)):
        for name in PRELOAD.split():  # after the drop, `nobody` could not import them lazily
            __import__(name)
    _drop_privileges(job["uid"])
    sys.addaudithook(_guard(os.path.realpath(os.getcwd())))
    namespace = {"__name__": "__main__"}
    ran = _run(job["code"], "solution.py", namespace)
    for i, test in enumerate(job["tests"]):
        passed = ran and _run(test, f"test_{i}", namespace)
        os.write(results, b"1\n" if passed else b"0\n")
    sys.stdout.flush()
    os._exit(0)


def _limit(limits: dict) -> None:
    for res, value in (
        (resource.RLIMIT_AS, limits["as"]),
        (resource.RLIMIT_FSIZE, limits["fsize"]),
        (resource.RLIMIT_CPU, limits["cpu"]),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, 256),
    ):
        resource.setrlimit(res, (value, value))


def _world_readable(path: str) -> bool:
    """Every directory from / down to `path` is searchable by others, and `path` readable."""
    import stat

    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        mode = os.stat(os.sep.join(parts[:i]) or os.sep).st_mode
        if not mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def _drop_privileges(uid: int) -> None:
    if os.getuid() == 0 and uid > 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _run(source: str, name: str, namespace: dict) -> bool:
    try:
        exec(compile(source, name, "exec"), namespace)
        return True
    except BaseException:  # noqa: BLE001 - any failure of the program is a failed test
        return False


def _guard(home: str):
    realpath, sep = os.path.realpath, os.sep

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an fd already open (opened under this same hook)
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        full = realpath(str(path))
        return full == home or full.startswith(home + sep)

    def hook(event: str, args: tuple) -> None:
        if event in DENIED_EVENTS:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & WRITE_FLAGS
            )
            if writes and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the working directory")
        elif event in PATH_EVENTS:
            for path in args[:2]:
                if isinstance(path, str | bytes) and not inside(path):
                    raise PermissionError(f"sandbox: {event} on {path!r} outside the working directory")

    return hook


if __name__ == "__main__":
    main()

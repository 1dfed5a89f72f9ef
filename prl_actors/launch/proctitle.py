"""Process titles: `ps` and `top` tell the processes of a run apart (docs/DEBUGGING.md).

`set_title("worker-0", "demo")` makes `ps -o args` and /proc/PID/cmdline read
`prl-actors worker-0 (run demo)`, and the kernel's 15-character name (/proc/PID/comm: what `top`,
`pgrep` and `ps -o comm` show) `prl-worker-0`. Without it every actor forked by the fork server reads
`python -m prl_actors.launch.zygote`.

- The command line is rewritten by `setproctitle`; without it (an ImportError) only the kernel name
  is set, by prctl(PR_SET_NAME) (Linux; elsewhere nothing). A title never fails a process.
- Neither starts a thread: the fork server (prl_actors/launch/zygote.py) sets its own title and still forks
  single-threaded. setproctitle moves the environment's strings to make room for a long title, so
  /proc/PID/environ of a titled process no longer reads as its environment (os.environ is unaffected).
- Called from the main thread: PR_SET_NAME names the calling thread, and the process's name is its
  main thread's.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys

PREFIX = "prl-actors"
COMM_MAX = 15  # the kernel's TASK_COMM_LEN (16) less the terminating NUL
PR_SET_NAME = 15  # prctl(2)


def title(role: str, run: str) -> str:
    """The command line `ps -o args` shows: `prl-actors worker-0 (run demo)` (no run: `prl-actors worker-0`)."""
    return f"{PREFIX} {role} (run {run})" if run else f"{PREFIX} {role}"


def comm(role: str) -> str:
    """The kernel's name for the process, 15 bytes at most: `prl-worker-0`, `prl-coordinator`."""
    return f"prl-{role}".encode()[:COMM_MAX].decode(errors="ignore")


def set_title(role: str, run: str) -> None:
    """Title this process `prl-actors ROLE (run RUN)` and name it `prl-ROLE` (see the module's doc).
    `role` is what the process is: an actor's name (worker-0, trainer), `up`, `fork-server`."""
    try:
        from setproctitle import setproctitle
    except ImportError:  # not installed: the kernel name only
        pass
    else:
        with contextlib.suppress(ValueError):  # a NUL in the run's name: the kernel name still follows
            setproctitle(title(role, run))
    _set_comm(comm(role))  # after setproctitle, which names the process by its title's first 15 bytes


def _set_comm(name: str) -> bool:
    """prctl(PR_SET_NAME, name) on Linux; False where it did not happen."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()), 0, 0, 0)) == 0
    except (OSError, AttributeError, ValueError):  # no libc, no prctl, a NUL in the name
        return False

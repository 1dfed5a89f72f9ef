"""Issue 39 item 6: the fork server forks only while it is single-threaded. OpenBLAS (loaded with numpy)
started cores - 1 threads in the server at import, so every fork copied a multi-threaded process
(Python 3.12: "This process is multi-threaded, use of fork() may lead to deadlocks"); now the server
has exactly one thread at each fork, and one that has others refuses to fork (`up` starts the actor as
a new process instead)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from prl_actors.launch.zygote import CLI, Zygote

ROOT = Path(__file__).resolve().parents[1]


def test_the_fork_server_is_single_threaded_at_each_fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # as in a user's shell (conftest sets OMP's to 1)
        monkeypatch.delenv(var, raising=False)
    z = Zygote()
    try:
        z.wait_ready()
        assert len(os.listdir(f"/proc/{z.proc.pid}/task")) == 1  # idle between forks: as at a fork
        argv = [[*CLI, "keys", "create", "--dir", str(tmp_path / f"k{i}"), "worker-0"] for i in range(3)]
        children = [z.spawn(a, {**os.environ}) for a in argv]
        assert [c.wait(60) for c in children] == [0, 0, 0]
        assert z.fork_threads == [1, 1, 1]
    finally:
        z.close()


SERVER_WITH_A_THREAD = """
import socket, sys, threading, time
from prl_actors.launch import zygote
zygote.PRELOAD = ()  # nothing to import: this test is about the thread
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
zygote.serve(socket.socket(fileno=int(sys.argv[1])))
"""


def test_a_fork_server_with_another_thread_refuses_to_fork() -> None:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER_WITH_A_THREAD, str(theirs.fileno())], pass_fds=(theirs.fileno(),), cwd=ROOT
    )
    theirs.close()
    try:
        ours.settimeout(30)
        lines = ours.makefile("rb")
        assert json.loads(lines.readline()) == {"ready": True}
        ours.sendall(json.dumps({"id": 1, "argv": ["--help"], "env": {}}).encode() + b"\n")
        answer = json.loads(lines.readline())
        assert answer == {"id": 1, "error": "not forking: the fork server has 2 threads"}, answer
    finally:
        ours.shutdown(socket.SHUT_RDWR)  # the server's end reads EOF: it returns
        ours.close()
        proc.wait(10)

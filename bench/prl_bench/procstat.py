"""CPU seconds of a process tree over time, from /proc (Linux): which actor burnt how much, when.

A sampler thread reads utime + stime of every descendant of a root pid every `period_s` and keeps
(t_monotonic, {pid: cpu_s}) samples, so the CPU spent in any time window (e.g. an epoch's generation
phase cut from the logs, whose t_mono is the same clock) can be read back with `cpu_between`.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = children(p)
        found += kids
        todo += kids
    return found


def cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15 of stat)


def actor_name(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    args = [a.decode(errors="replace") for a in argv]
    if "--name" in args[:-1]:
        return args[args.index("--name") + 1]
    title = re.fullmatch(r"prl-actors (\S+) \(run .*\)", args[0]) if args else None  # prl_actors/launch/proctitle.py
    return title.group(1) if title and title.group(1) not in ("up", "fork-server") else "launcher"


def machine_busy_s() -> float:
    """CPU-seconds the whole machine has been busy (all processes, all cores), from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _TICK


class TreeSampler(threading.Thread):
    def __init__(self, root: int, period_s: float = 0.02) -> None:
        super().__init__(daemon=True, name="cpu-sampler")
        self.root, self.period_s = root, period_s
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.machine: list[tuple[float, float]] = []  # (t, machine busy CPU-seconds)
        self.names: dict[int, str] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            snap = {}
            for pid in [self.root, *descendants(self.root)]:
                cpu = cpu_seconds(pid)
                if cpu is not None:
                    snap[pid] = cpu
                    if self.names.get(pid, "launcher") == "launcher" and pid != self.root:
                        self.names[pid] = actor_name(pid)  # again: a fresh fork still shows its parent's argv
            now = time.monotonic()
            self.samples.append((now, snap))
            self.machine.append((now, machine_busy_s()))
            self._halt.wait(self.period_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(5.0)

    def _at(self, t: float) -> dict[int, float]:
        """CPU seconds per pid at the last sample taken at or before t (a pid not yet seen: 0)."""
        best: dict[int, float] = {}
        for ts, snap in self.samples:
            if ts > t:
                break
            best = snap
        return best

    def others_cores(self, t0: float, t1: float) -> float:
        """Cores the rest of the machine (other users' processes) kept busy on average in [t0, t1]."""
        before = [b for t, b in self.machine if t <= t0]
        after = [b for t, b in self.machine if t <= t1]
        if not before or not after or t1 <= t0:
            return 0.0
        return max(0.0, (after[-1] - before[-1] - self.cpu_between(t0, t1)) / (t1 - t0))

    def cpu_between(self, t0: float, t1: float, prefix: str = "") -> float:
        """CPU seconds spent in [t0, t1] by the processes whose actor name starts with `prefix`."""
        a, b = self._at(t0), self._at(t1)
        return sum(cpu - a.get(pid, 0.0) for pid, cpu in b.items() if self.names.get(pid, "").startswith(prefix))

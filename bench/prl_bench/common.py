"""What every benchmark shares: the result record, machine info, timing and statistics helpers.

A benchmark returns a list of `Entry`s: one measured quantity each, with its goal and (where one
exists) the physical bound it is compared with. `ratio` is the number the goal is checked against:
measured / bound for speed-ups, measured / reference for bandwidths, or the raw value (msg/s, ms)
when the goal is absolute. Raw numbers go in `raw`, untouched, so results.json can be re-analysed.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import math
import os
import platform
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Entry:
    """One checked number. `op` is '>=' or '<=': passed = ratio op goal (None goal: informational)."""

    benchmark: str
    name: str
    metric: str
    measured: float
    unit: str
    ratio: float
    goal: float | None
    op: str = ">="
    bound: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def passed(self) -> bool | None:
        if self.goal is None:
            return None
        if not math.isfinite(self.ratio):
            return False
        return self.ratio >= self.goal if self.op == ">=" else self.ratio <= self.goal

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        return d


@dataclass
class BenchContext:
    """What the runner hands every benchmark: the size preset, a scratch dir, a progress printer."""

    quick: bool
    out_dir: Path
    work_dir: Path
    say: Callable[[str], None] = print
    smoke: bool = False  # tiny sizes for tests: numbers meaningless, structure checked
    auth: str = "curve"  # transport.auth of the runs and sockets the benchmarks set up (curve or none)

    def size(self, full: Any, quick: Any, smoke: Any) -> Any:
        return smoke if self.smoke else (quick if self.quick else full)


def machine_info(label: str = "") -> dict[str, Any]:
    """Where and when the numbers were taken (results.json carries it next to every run)."""
    info: dict[str, Any] = {
        "label": label or f"{os.cpu_count()}-core {platform.system()} host",
        "date": datetime.date.today().isoformat(),
        "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    info.update(_versions())
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import zmq

    out = {"pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()}
    for dist in ("msgspec", "pykka", "transformers"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_threads"] = str(torch.get_num_threads())
    except ImportError:
        pass
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


def rounded(d: dict[str, Any], digits: int = 6) -> dict[str, Any]:
    """Round every float of a flat dict (raw numbers stay readable in results.json)."""
    return {k: round(v, digits) if isinstance(v, float) and math.isfinite(v) else v for k, v in d.items()}


def free_port(block: int = 1) -> int:
    """The first of `block` consecutive free tcp ports, below the ephemeral range: a DEALER that
    reconnects to a not-yet-bound ephemeral port can be handed that very port as its source and
    connect to itself (TCP simultaneous open)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - block)
        try:
            for port in range(base, base + block):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise OSError("no free block of tcp ports in 20000-32000")


PR_SET_PDEATHSIG = 1  # prctl(2)


def dies_with_us() -> None:
    """A child's preexec_fn: SIGTERM to the child when this process is gone, however it ends (SIGKILL
    included; Linux prctl, elsewhere nothing). A run started in its own session hears neither the
    terminal's Ctrl-C nor a kill of our group, and would keep its actors busy after the bench."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def up_argv(run_dir: Path, workers: int | str, epochs: int, sets: Mapping[str, Any]) -> list[str]:
    """`prl-actors up` for a bench run in `run_dir`: `workers`, `epochs`, then `--set key=value` each."""
    cmd = [sys.executable, "-m", "prl_actors.cli.main", "up", "--run-dir", str(run_dir)]
    cmd += ["--workers", str(workers), "--epochs", str(epochs)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def run_up(
    cmd: list[str],
    timeout_s: float,
    on_start: Callable[[subprocess.Popen], None] | None = None,  # type: ignore[type-arg]
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run `prl-actors up` in its own session. On timeout, and when the bench itself stops (Ctrl-C, an
    error, a kill), `up` is stopped too: killed with its group here, or by `dies_with_us`; its actors
    follow it (launch/supervisor.py)."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
        preexec_fn=dies_with_us,
    )
    try:
        if on_start is not None:
            on_start(proc)
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s}s"
    finally:
        if proc.poll() is None:  # timed out, or the bench stopped first (Ctrl-C, an error in on_start)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err

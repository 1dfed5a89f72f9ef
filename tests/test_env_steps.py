"""An environment or tool step that never returns: its group fails after the step deadline (an
EnvError the worker answers by handing the group back), and its thread never keeps the worker
process alive at exit (concurrent.futures' pool joined it there: a stopped worker hung until
SIGKILLed)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from prl_actors.engines import multiturn
from prl_actors.engines.multiturn import MultiTurnEngine, Turn, TurnOut
from prl_actors.envs_llm.base import EnvError
from prl_actors.envs_llm.render import Renderer
from prl_actors.protocol.messages import Prompt
from tests import guard_plugins


class Tok:
    """Characters as token ids."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        return type("Enc", (), {"input_ids": [ord(c) for c in text]})()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


class Turns:
    """A TurnBackend whose every turn is 'x' and its end."""

    max_context: int | None = None
    version, max_rows = 0, 8

    def __init__(self) -> None:
        self.queue: list[Turn] = []

    def submit(self, turn: Turn) -> None:
        self.queue.append(turn)

    def poll(self) -> list[TurnOut]:
        out = [TurnOut(t.turn_id, t.index + i, [ord("x")], [-0.1], True) for t in self.queue for i in range(t.size)]
        self.queue = []
        return out

    @property
    def busy(self) -> bool:
        return bool(self.queue)

    def seed_for(self, group_id: int) -> int:
        return group_id

    def abort(self) -> None:
        self.queue = []

    def load_weights(self, version: int, tensors: Any) -> None: ...
    def close(self) -> None: ...


def test_a_hung_step_fails_its_group_after_the_step_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multiturn, "STEP_TIMEOUT_S", 0.3)
    guard_plugins.RELEASE.clear()
    renderer = Renderer(Tok(), False)  # type: ignore[arg-type]
    engine = MultiTurnEngine(Turns(), guard_plugins.HangingEnv, renderer, max_turns=3, max_turn_tokens=4)
    try:
        engine.admit([Prompt(group_id=7, prompt="q", answer="a")], 2)
        t0 = time.monotonic()
        with pytest.raises(EnvError, match="environment step of group 7 did not return within 0.3s"):
            while time.monotonic() - t0 < 5:
                engine.step()
        assert time.monotonic() - t0 < 2
        assert engine.abort() == [7] and not engine.busy
        assert all(t.daemon for t in engine.pool.threads)
    finally:
        engine.close()
        guard_plugins.RELEASE.set()


def test_a_hung_step_never_keeps_the_process_alive() -> None:
    code = (
        "from prl_actors.envs_llm.pool import DaemonPool\n"
        "import threading\n"
        "pool = DaemonPool(2, 'env-step')\n"
        "pool.submit(threading.Event().wait)\n"  # never returns
        "done = pool.submit(sum, [1, 2])\n"
        "assert done.result(timeout=5) == 3\n"
        "pool.shutdown()\n"
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 15  # exits at once (the import is most of it)


def test_the_pool_runs_in_order_and_shutdown_cancels_what_has_not_started() -> None:
    from prl_actors.envs_llm.pool import DaemonPool

    guard_plugins.RELEASE.clear()
    pool = DaemonPool(1, "p")
    first = pool.submit(guard_plugins.RELEASE.wait)
    later = pool.submit(sum, [1])
    deadline = time.monotonic() + 5
    while not first.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.shutdown()
    assert later.cancelled() and not first.done()
    guard_plugins.RELEASE.set()
    assert first.result(timeout=5) is True
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(sum, [1])


class HangingReset:
    def reset(self, row: object) -> list[dict[str, str]]:
        guard_plugins.RELEASE.wait()
        return []

    def step(self, text: str) -> tuple[list[dict[str, str]], float, bool]:
        return [], 0.0, True


def test_the_buffer_prompt_check_never_hangs_on_a_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The buffer renders an environment's reset to check a group's prompt ids: a reset that hangs
    costs one deadline, then every later check fails at once (the buffer's thread is never held)."""
    from prl_actors.config import load_config
    from prl_actors.envs_llm import registry

    guard_plugins.RELEASE.clear()
    monkeypatch.setattr(guard_plugins, "HangingReset", HangingReset, raising=False)
    cfg = load_config(None, {"task.environment": "tests.guard_plugins:HangingReset", "task.name": "add"})
    ids = registry.episode_prompt_ids(cfg.task, Tok(), lambda p, r, a: 0.0, timeout_s=0.3)
    row = Prompt(group_id=0, prompt="1+1=", answer="2")
    try:
        t0 = time.monotonic()
        with pytest.raises(EnvError, match="did not return within 0.3s"):
            ids(row)
        with pytest.raises(EnvError, match="did not return within 0.3s"):
            ids(row)  # at once: the hung thread is not waited for again
        assert time.monotonic() - t0 < 2
    finally:
        guard_plugins.RELEASE.set()
    fine = registry.episode_prompt_ids(load_config(None, {"task.name": "guess"}).task, Tok(), lambda p, r, a: 0.0)
    assert fine(Prompt(group_id=0, prompt="0-9=", answer="3")) == [ord(c) for c in "0-9="]


def test_a_hung_reset_never_holds_the_workers_thread_and_fails_its_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """The factory and reset (user code) run on the pool: `step` returns while a reset hangs (the
    worker's thread stays free to stop), and the group fails after the deadline."""
    monkeypatch.setattr(multiturn, "STEP_TIMEOUT_S", 0.3)
    guard_plugins.RELEASE.clear()
    renderer = Renderer(Tok(), False)  # type: ignore[arg-type]
    engine = MultiTurnEngine(Turns(), HangingReset, renderer, max_turns=3, max_turn_tokens=4)
    try:
        engine.admit([Prompt(group_id=5, prompt="q", answer="a")], 2)
        t0 = time.monotonic()
        assert engine.step() == [] and engine.busy and engine.rows == 2
        assert time.monotonic() - t0 < 0.2  # one step: no longer than ENV_WAIT_S, the reset still hanging
        with pytest.raises(EnvError, match="environments of group 5 did not reset within 0.3s"):
            while time.monotonic() - t0 < 5:
                engine.step()
        assert engine.abort() == [5] and not engine.busy
    finally:
        engine.close()
        guard_plugins.RELEASE.set()

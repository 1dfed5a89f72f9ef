"""Issue 23 (items 0, 2): a group whose generation always fails ends the run within seconds with the
prompt and the exception, and its logs stay small. Before, a failing engine made the worker
re-register forever (16,831 `generate_failed` events, 97 MB of logs). The five actors in one process
(LocalCluster), the torch engine on a tiny GPT-2 whose `step` raises as a broken device would (a
prompt over the model's positions, the issue's case, is now refused at load: tasks/limits.py).
Reward errors have their own policy (task.on_reward_error, tests of the rewards)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prl_actors.config import load_config
from prl_actors.launch.process import LocalCluster
from prl_actors.protocol.messages import Group
from tests.conftest import port_base, read_logs, sim_config


def test_a_group_whose_generation_always_fails_ends_the_run_with_its_cause_and_bounded_logs(
    tmp_path: Path, family_dirs: dict[str, Path]
) -> None:
    run_dir = tmp_path / "run"
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    cfg = load_config(
        None,
        {
            "run.run_dir": str(run_dir),
            "run.name": f"t{port_base()}",
            "run.epochs": 2,
            "run.workers": 1,
            "transport.kind": "inproc",
            "model.path": str(family_dirs["gpt2"]),
            "task.name": "jsonl",
            "task.prompts_file": str(data),
            "coordinator.groups_per_epoch": 2,
            "worker.group_size": 2,
            "worker.sampling.max_new_tokens": 4,
        },
    )
    cluster = LocalCluster(cfg, log_dir=run_dir / "logs")
    engine = cluster.hosts["worker-0"].core.engine  # type: ignore[attr-defined]

    def broken_step() -> list:  # type: ignore[type-arg]
        raise IndexError("index out of range in self")

    engine.step = broken_step
    try:
        assert cluster.wait(60), "a group that always fails hung the run"
    finally:
        cluster.close()
    events = read_logs(run_dir)
    (done,) = [e for e in events if e["event"] == "run_done"]
    assert done["reason"].startswith("failed: group") and "failed 3 times" in done["reason"], done
    assert "IndexError: index out of range in self" in done["reason"] and "+1=" in done["reason"]
    failed = [e for e in events if e["event"] == "generate_failed"]
    assert 1 <= len(failed) <= 6 and not [e for e in events if e["event"] == "re_register"]
    print(f"run ended {done['t_mono'] - failed[0]['t_mono']:.2f}s after the first failure")
    assert done["t_mono"] - failed[0]["t_mono"] < 15.0  # seconds: three tries, not a stall
    assert sum(p.stat().st_size for p in (run_dir / "logs").glob("*.jsonl")) < 2_000_000


@pytest.mark.parametrize("on_error", ["fail_first", "skip"])
def test_a_group_the_trainer_cannot_train_is_the_groups_fault_not_the_workers(tmp_path: Path, on_error: str) -> None:
    """A group whose forward/backward always fails in the trainer (too long for its memory, a loss that
    breaks on it) fails from every worker alike. It is counted against the group (run.max_group_failures,
    task.on_error), never against the workers. Before, each refusal counted against the worker that
    generated it: both workers were expelled and the run stalled ("no worker is registered") for good."""
    run_dir = tmp_path / "run"
    cfg = sim_config(run_dir, task__on_error=on_error)
    cluster = LocalCluster(cfg, log_dir=run_dir / "logs")
    learner = cluster.hosts["trainer"].core.learner  # type: ignore[attr-defined]
    accumulate, train_one = learner.accumulate, learner.train_one

    def untrainable(train: Callable[[Group], Any]) -> Callable[[Group], Any]:
        def run(group: Group) -> Any:
            if group.group_id == 3:
                raise RuntimeError("cannot train group 3")
            return train(group)

        return run

    learner.accumulate, learner.train_one = untrainable(accumulate), untrainable(train_one)
    try:
        assert cluster.wait(60), "a group the trainer cannot train hung the run"
    finally:
        cluster.close()
    events = read_logs(run_dir)
    assert not [e for e in events if e["event"] == "member_expelled"]
    (done,) = [e for e in events if e["event"] == "run_done"]
    given_up = [e for e in events if e["event"] == "group_given_up"]
    assert given_up and all(e["group_id"] == 3 and len(e["causes"]) == 3 for e in given_up)
    assert "the trainer could not train it: RuntimeError: cannot train group 3" in given_up[0]["causes"][-1]
    if on_error == "skip":  # each epoch drops group 3 and trains the rest
        assert len(given_up) == 3 and not done["reason"].startswith("failed"), done
        dropped = {e["msg_epoch"] for e in events if e["event"] == "group_dropped"}
        assert dropped == {0, 1, 2}
    else:  # nothing trained yet: the run ends at once, naming the group and the trainer's error
        assert done["reason"].startswith("failed: group 3 of epoch 0") and "cannot train group 3" in done["reason"]

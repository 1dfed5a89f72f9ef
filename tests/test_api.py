"""The Python API (prl_actors/api.py): configs from a path, dict or Config; reward callables and a
dataset object reach the actors `up` starts; metrics, stop and the final model; the README example."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from prl_actors import api
from prl_actors.config import load_config
from prl_actors.rewards.load import load_function
from prl_actors.sections import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_config_from_a_path_a_dict_or_a_config(tmp_path: Path) -> None:
    from_path = api.Run(ROOT / "configs" / "demo.yaml", run_dir=tmp_path / "a")
    assert from_path.config.run.name == "demo" and from_path.config.run.run_dir == str(tmp_path / "a")
    from_dict = api.Run({"run": {"epochs": 3}}, overrides={"trainer.lr": 3e-4})
    assert (from_dict.config.run.epochs, from_dict.config.trainer.lr) == (3, 3e-4)
    from_obj = api.Run(load_config(None, {"run.epochs": 7}))
    assert from_obj.config.run.epochs == 7


def test_bad_config_is_one_line_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.lrr.*did you mean trainer\.lr"):
        api.Run({"trainer": {"lrr": 1}})
    with pytest.raises(ConfigError, match="does not exist"):
        api.Run(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="weights for rewards that are not given: other"):
        api.Run(rewards=[len], weights={"other": 2.0})


def test_rewards_and_dataset_become_the_task(tmp_path: Path) -> None:
    def exact(record: object) -> float:
        return 1.0

    run = api.Run(rewards=[exact, exact], weights={"exact_2": 0.5}, dataset=[{"prompt": "1+1=", "answer": "2"}])
    specs = run.config.task.rewards
    assert [(s.fn, s.name, s.weight) for s in specs] == [
        ("prl_actors.api:exact", "exact", 1.0),
        ("prl_actors.api:exact_2", "exact_2", 0.5),
    ]
    assert run.config.task.name == "jsonl" and str(run.config.task.prompts_file).endswith("api/dataset.jsonl")
    math = api.Run({"task": {"name": "math"}}, dataset=[{"question": "q", "answer": "1"}])
    assert math.config.task.name == "math"  # a dataset task keeps its name


def test_a_registered_callable_loads_by_its_spec() -> None:
    def mine(record: object) -> float:
        return 0.25

    spec = api.register("mine_for_test", mine)
    assert load_function(spec, "task.rewards[0].fn") is mine
    with pytest.raises(ConfigError, match="has no attribute 'never_registered'"):
        load_function("prl_actors.api:never_registered", "task.rewards[0].fn")


def test_a_trl_style_reward_is_called_once_per_group_with_lists() -> None:
    """fn(prompts, completions, **columns) as TRL's reward_funcs: registered batched, it scores a
    group through the same loader and Reward the workers use."""
    import asyncio

    from prl_actors.rewards.load import build
    from prl_actors.rewards.record import RewardInput
    from prl_actors.tasks.config import RewardSpec

    calls = []

    def length_bonus(prompts: list[str], completions: list[str], answer: list[str], **kw: Any) -> list[float]:
        calls.append((prompts, completions, answer, kw["level"]))
        return [float(len(c)) for c in completions]

    run = api.Run(rewards=[length_bonus])
    spec = run.config.task.rewards[0]
    assert spec.batched and spec.fn == "prl_actors.api:length_bonus"
    api.register("length_bonus", run.rewards["length_bonus"])
    reward = build(RewardSpec(**spec.model_dump()), 0)
    row = {"prompt": "p", "answer": "42", "level": 3}
    texts = ["a", "bcd"]
    records = [RewardInput(prompt="p", completion=c, answer="42", row=row, sample=i) for i, c in enumerate(texts)]
    assert asyncio.run(reward.score(records)) == [1.0, 3.0]
    assert calls == [(["p", "p"], ["a", "bcd"], ["42", "42"], [3, 3])]


def test_another_process_loads_the_callables_from_the_file(tmp_path: Path) -> None:
    """What a forked or new actor process does: PRL_API_CALLABLES names the pickle; a closure over a
    local value travels by value."""
    secret = 0.75

    def closure(record: object) -> float:
        return secret

    path = tmp_path / "callables.pkl"
    path.write_bytes(cloudpickle.dumps({"closure": closure}))
    code = "from prl_actors.rewards.load import load_function as f; print(f('prl_actors.api:closure', 'x')(None))"
    env = {**os.environ, api.CALLABLES_ENV: str(path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.75"


class FakeUp:
    """Stands for `up`'s process in metrics(): each poll() runs the next step on the metrics file."""

    def __init__(self, steps: list[Any]) -> None:
        self.steps, self.stderr = steps, None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.steps:
            self.steps.pop(0)()
            return None
        self.returncode = 0
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def test_metrics_follow_the_file_whole_lines_once_through_a_rewrite(tmp_path: Path) -> None:
    """Rows are yielded once each, only when their line is complete, also when a resume rewrites
    the file shorter (the rows past its checkpoint dropped, then trained again)."""
    path = tmp_path / "metrics.jsonl"

    def write(text: str, mode: str = "a") -> Any:
        return lambda: path.open(mode).write(text)

    steps = [
        write("".join(f'{{"epoch": {e}, "reward_mean": 0.123456}}\n' for e in range(3))),
        write("".join(f'{{"epoch": {e}, "reward_mean": 0.123456}}\n' for e in range(2)), "w"),  # epoch 2 dropped
        write('{"epoch": 2}\n{"epoch": 3'),  # epoch 3's line is not complete yet
        write('}\n{"epoch": 3, "eval": true}\n'),
    ]
    run = api.Run(run_dir=tmp_path)
    run.proc = FakeUp(steps)  # type: ignore[assignment]
    rows = list(run.metrics(poll_s=0))
    assert [(r["epoch"], r.get("eval", False)) for r in rows] == [
        (0, False),
        (1, False),
        (2, False),
        (3, False),
        (3, True),
    ]


@pytest.mark.e2e  # test_readme_example_runs takes the API through `up`
def test_callables_and_dataset_reach_the_workers_then_stop_and_final_model(tmp_path: Path) -> None:
    """The reward scores 1 only for the dataset's one row: every epoch's mean is 1 only if both the
    closure and the dataset reached the worker. Stopped after two epochs, as Ctrl-C."""
    prompt, answer = "7+8=", "15"

    def right_row(record: Any) -> float:
        return float(record.prompt == prompt and record.answer == answer)

    config = {"run": {"epochs": 60, "workers": 1}, "coordinator": {"groups_per_epoch": 2}}
    run = api.Run(config, rewards=[right_row], dataset=[{"prompt": prompt, "answer": answer}], run_dir=tmp_path)
    rows = []
    with run.start():
        for row in run.metrics(timeout_s=120):
            rows.append(row)
            if len(rows) == 2:
                break
    assert run.returncode == 130  # stopped as Ctrl-C stops it
    assert [r["reward/right_row"] for r in rows] == [1.0, 1.0]
    model = run.final_model()  # a stopped run wrote no RUN_DIR/final: its newest checkpoint, exported
    assert (model / "config.json").is_file() and (model / "generation_config.json").is_file()
    assert model == tmp_path / "final" and (model / api.EXPORT_STAMP).is_file()
    done = len((tmp_path / "metrics.jsonl").read_text().splitlines())  # 2 or more: epochs are quick
    config["run"]["epochs"] = done + 2  # resumed for two more: every epoch once, the callables reloaded
    data = [{"prompt": prompt, "answer": answer}]
    again = api.Run(config, rewards=[right_row], dataset=data, run_dir=tmp_path, resume=True)
    rows = list(again.start().metrics(timeout_s=120))
    assert again.returncode == 0
    assert [r["epoch"] for r in rows] == list(range(done + 2)) and all(r["reward/right_row"] == 1.0 for r in rows)
    written = (tmp_path / "final" / "model.safetensors").stat()  # the completed run's own RUN_DIR/final
    assert again.final_model() == tmp_path / "final" and not (tmp_path / "final" / api.EXPORT_STAMP).exists()
    assert (tmp_path / "final" / "model.safetensors").stat().st_mtime_ns == written.st_mtime_ns  # not re-exported
    copy = again.final_model(tmp_path / "copy")
    assert (copy / "model.safetensors").read_bytes() == (tmp_path / "final" / "model.safetensors").read_bytes()


def test_final_model_prefers_the_runs_final_unless_a_newer_checkpoint_came_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RUN_DIR/final as the trainer writes it is returned as is; a checkpoint completed after it (a
    resume stopped early), or our own export's stamp in it, sends final_model() to the checkpoint."""
    from prl_actors.records.rundir import DONE, RunDir

    checkpoint = tmp_path / "checkpoints" / "v3"
    checkpoint.mkdir(parents=True)
    (checkpoint / DONE).write_text("{}")
    final = tmp_path / "final"
    final.mkdir()
    (final / "config.json").write_text("{}")
    os.utime(checkpoint / DONE, ns=(1, 1))  # the checkpoint, then the final model
    monkeypatch.setattr(RunDir, "latest_checkpoint", lambda self, on_skip=None: checkpoint)
    exported: list[tuple[Path, Path]] = []
    monkeypatch.setattr(api, "_export", lambda ckpt, target: exported.append((ckpt, target)) or target)
    run = api.Run(run_dir=tmp_path)
    assert run.final_model() == final and exported == []
    assert (run.final_model(tmp_path / "out") / "config.json").is_file() and exported == []
    os.utime(final / "config.json", ns=(0, 0))  # a newer checkpoint than the final model
    assert run.final_model() == final and exported == [(checkpoint, final)]
    os.utime(final / "config.json")
    (final / api.EXPORT_STAMP).write_text(str(checkpoint))  # an export of ours: its stamp decides
    assert run.final_model() == final and exported[-1] == (checkpoint, final) and len(exported) == 2


def test_readme_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- api-example -->\n```python\n(.*?)```", readme, re.S)
    assert block is not None, "README has no api-example block"
    code = block.group(1)
    assert len([line for line in code.splitlines() if line.strip() and not line.startswith("#")]) <= 10
    (tmp_path / "example.py").write_text(code)
    out = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=240, env=os.environ
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["0", "1", "2"]
    assert lines[-1].startswith("model: runs/api/final")
    assert (tmp_path / "runs" / "api" / "final" / "config.json").is_file()


def test_a_refused_run_raises_run_failed_with_ups_error_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("{}\n")  # the run dir holds a run already
    run = api.Run({"worker": {"engine": "sim"}, "trainer": {"learner": "sim"}}, run_dir=tmp_path, echo=False)
    with pytest.raises(api.RunFailed, match="already holds a run"):
        run.start().wait(timeout_s=60)
    assert run.returncode == 2

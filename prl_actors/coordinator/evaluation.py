"""Evaluation during training: k samples per eval prompt with the epoch's weights v_e, never trained.

Design (docs/OBSERVE.md):
- which weights: v_e for every epoch e with e % eval.every_epochs == 0 (v_0 = the start), and the final
  weights v_E once the last step is done;
- who: the inference workers, with `eval.sampling` (greedy allowed). The coordinator hands eval prompts
  out only to a worker that holds v_e, whose engine is idle (`WorkRequest.eval_ok`) and for which the
  epoch's training queue is empty: the epoch's own groups always go first;
- never trained: results go worker -> coordinator (`EvalResult`), never to the buffer;
- the next epoch opens as soon as its weights exist unless eval of v_e is still out: then it waits for it
  (the workers must still hold v_e to finish it). That wait is the only cost eval can add to training;
- worker loss: its eval prompts go back to the eval queue (like training groups); resume: an epoch whose
  RUN_DIR/eval/epoch-N.jsonl exists is not evaluated again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from prl_actors.protocol.messages import EVAL_ID_BASE as EVAL_ID_BASE  # eval prompt ids in the engine
from prl_actors.protocol.messages import EvalGroup, Prompt
from prl_actors.records.rundir import EVAL, eval_path

PASS_REWARD = 1.0  # a sample "passes" when its reward reaches this (the built-in tasks' exact match)

if TYPE_CHECKING:
    from prl_actors.coordinator.config import EvalSection
    from prl_actors.tasks.config import TaskSection


@dataclass
class EvalPlan:
    """What to evaluate: the prompts (id = index), k, and how often."""

    items: list[tuple[str, str, int]]  # (prompt, answer, row index in the task's data; -1: not the task's)
    samples: int
    every_epochs: int
    done: set[int] = field(default_factory=set)  # epochs already evaluated (resume)

    def due(self, epoch: int, last_epoch: int) -> bool:
        """Is v_epoch to be evaluated? (every N epochs from 0, and the final weights v_E)."""
        if self.every_epochs <= 0 or epoch in self.done:
            return False
        return epoch % self.every_epochs == 0 or epoch == last_epoch

    def prompts(self) -> list[Prompt]:
        return [
            Prompt(group_id=EVAL_ID_BASE + i, prompt=p, answer=a, item=item)
            for i, (p, a, item) in enumerate(self.items)
        ]


class EvalSink(Protocol):
    """Where the coordinator's eval results go (a RunDir in a run; a MemoryEvalSink in tests and replay)."""

    def eval_result(self, epoch: int, version: int, groups: Sequence[EvalGroup], summary: Mapping[str, Any]) -> None:
        """One finished evaluation of weights `version` (epoch `epoch`)."""
        ...


class MemoryEvalSink:
    def __init__(self) -> None:
        self.results: list[tuple[int, int, list[EvalGroup], dict[str, Any]]] = []

    def eval_result(self, epoch: int, version: int, groups: Sequence[EvalGroup], summary: Mapping[str, Any]) -> None:
        self.results.append((epoch, version, list(groups), dict(summary)))


def summarize(groups: Sequence[EvalGroup], k: int) -> dict[str, float]:
    """pass@k: the fraction of prompts with at least one of its k samples passing (reward >= PASS_REWARD);
    mean@k: the mean reward over every sample of every prompt."""
    if not groups:
        return {f"eval_pass@{k}": 0.0, f"eval_mean@{k}": 0.0}
    passed = [any(r >= PASS_REWARD for r in g.rewards) for g in groups]
    rewards = [r for g in groups for r in g.rewards]
    out = {
        f"eval_pass@{k}": round(float(np.mean(passed)), 6),
        f"eval_mean@{k}": round(float(np.mean(rewards)) if rewards else 0.0, 6),
    }
    errors = sum(1 for g in groups if g.error)
    if errors:  # prompts the engine failed on (their error is in eval/epoch-N.jsonl)
        out["eval_errors"] = float(errors)
    return out


def eval_items(
    ev: EvalSection, task: TaskSection, model_path: str | None, seed: int, task_items: list[tuple[str, str]]
) -> list[tuple[str, str, int]]:
    """The eval prompts as (prompt, answer, row index): `eval.prompts_file` (read like a jsonl task; no
    row of the task's data, so rewards that read row columns get none), else `eval.num_prompts` of the
    task's items drawn with a seed of their own, with their row index (deterministic; the training
    sampler is not touched, so enabling eval never changes what is trained)."""
    if ev.prompts_file:
        from prl_actors.sections import ConfigError
        from prl_actors.tasks.dataset import load_items

        try:
            return [(p, a, -1) for p, a in load_items(task, model_path, ev.prompts_file, "prompt")]
        except ConfigError as exc:
            raise ConfigError(f"eval.prompts_file: {exc}") from None
    n = min(ev.num_prompts, len(task_items))
    rng = np.random.default_rng([int(seed), 0xE7A1])
    picks = sorted(rng.choice(len(task_items), size=n, replace=False).tolist())
    return [(task_items[i][0], task_items[i][1], i) for i in picks]


def done_epochs(run_dir: Path | str) -> set[int]:
    """Epochs with a finished evaluation in RUN_DIR/eval/ (resume skips them)."""
    d = Path(run_dir) / EVAL
    if not d.is_dir():
        return set()
    return {int(p.stem.split("-", 1)[1]) for p in d.glob("epoch-*.jsonl") if p.stem.split("-", 1)[1].isdigit()}


def read_eval(run_dir: Path | str, epoch: int) -> list[dict[str, Any]]:
    path = eval_path(run_dir, epoch)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

"""Evaluation, a part of the worker: eval prompts run alone in the idle engine with the eval sampling
settings (coordinator/evaluation.py); finished ones are scored, and once the last is done (or the engine
raised) they are all sent back in one EvalResult and the worker goes back to training.
The state it reads and writes is the worker's (`evaluating`, `eval_groups`, `train_sampling`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prl_actors.protocol.messages import EvalGroup, EvalResult
from prl_actors.transport.port import Dest

if TYPE_CHECKING:
    from prl_actors.engines.base import GeneratedGroup
    from prl_actors.worker.core import WorkerCore


class Evaluation:
    def __init__(self, core: WorkerCore) -> None:
        self.core = core

    def finished(self, finished: list[GeneratedGroup]) -> None:
        """Score finished eval prompts; when the last is done, send them all and go back to training."""
        c = self.core
        ev = c.evaluating
        assert ev is not None
        by_id = {p.group_id: p for p in ev.prompts}
        for g in finished:
            p = by_id.get(g.group_id)
            if p is None:
                continue
            texts = [s.text for s in g.samples]
            try:  # the task's rewards, or the episode's own (multi-turn), exactly as for training groups
                rewards, error = list(c.task.score_generated(p, g.prompt_ids, g.samples).totals), ""
            except Exception as exc:  # a failing reward: this prompt's voice in eval/epoch-N.jsonl, not a crash
                rewards, error = [], f"{type(exc).__name__}: {exc}"
            c.eval_groups.append(
                EvalGroup(
                    prompt_id=p.group_id,
                    prompt=p.prompt,
                    answer=p.answer,
                    completions=texts,
                    rewards=rewards,
                    error=error,
                )
            )
        if len(c.eval_groups) >= len(ev.prompts):
            self.end()

    def failed(self, exc: Exception) -> None:
        """The engine raised on eval prompts: each unfinished one is returned with the error (a voice in
        eval/epoch-N.jsonl, counted as not passed) and the worker goes back to training."""
        c = self.core
        ev = c.evaluating
        assert ev is not None
        error = f"{type(exc).__name__}: {exc}"
        c.count("eval_failed")
        c.log("eval_failed", error=error)
        returned = {g.prompt_id for g in c.eval_groups}
        c.eval_groups += [
            EvalGroup(prompt_id=p.group_id, prompt=p.prompt, answer=p.answer, completions=[], rewards=[], error=error)
            for p in ev.prompts
            if p.group_id not in returned
        ]
        self.end()

    def end(self) -> None:
        c = self.core
        ev, c.evaluating = c.evaluating, None
        assert ev is not None
        if c.engine.busy:
            c.engine.abort()
        self.restore_sampling()
        c.emit(Dest.peer("coordinator"), EvalResult(epoch=ev.epoch, version=ev.version, groups=c.eval_groups))
        c.log("span_end", span="eval", returned=len(c.eval_groups), prompts=len(ev.prompts))
        c.eval_groups = []
        c.hold = None

    def restore_sampling(self) -> None:
        c = self.core
        if c.train_sampling is not None:
            engine: Any = c.engine
            engine.sampling, c.train_sampling = c.train_sampling, None

"""Several weighted rewards scored together: total = sum(weight_i * reward_i), each part kept.

Every reward of a group runs concurrently (one asyncio loop per call; per-sample async rewards also
run concurrently across the G samples). On a RewardError, `on_error` decides:
- "fail": raise it (the worker ends the run with that line);
- "zero": that reward counts 0 for the samples it failed on (the whole group when a batched call
  raises or answers in the wrong shape),
  and each distinct line is returned in `Scored.errors` to be counted and logged (its plugin's
  traceback in `Scored.traces`).
A RewardStopped (the process is stopping while a reward runs) is raised under either policy: a
stop never turns into a made-up 0.
Invariant: every total and part returned is a finite float.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from prl_actors.rewards.errors import RewardError, RewardStopped

if TYPE_CHECKING:
    from prl_actors.rewards.record import RewardInput
    from prl_actors.rewards.reward import Reward

OnError = Literal["fail", "zero"]
_LOOPS = threading.local()  # one event loop per scoring thread (a worker scores on its actor thread)


@dataclass
class Scored:
    """A group's rewards: totals[i] and parts[i][name] for sample i, and the errors met under "zero"."""

    totals: list[float]
    parts: list[dict[str, float]]
    errors: list[str] = field(default_factory=list)
    traces: dict[str, str] = field(default_factory=dict)  # error line -> the plugin's traceback ('' if none)


@dataclass
class RewardSet:
    """The task's rewards (at least one; names unique) and the error policy. `report_parts`: send
    each reward's value with every sample (Sample.reward_parts -> `reward/<name>` metrics); off for
    a task's one default reward, whose value is the total."""

    rewards: list[Reward]
    on_error: OnError = "fail"
    report_parts: bool = False

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rewards]

    def score(self, records: Sequence[RewardInput]) -> Scored:
        """Score one group's records (blocking) on this thread's own event loop, kept between calls
        (a fresh loop per group cost ~0.5 ms; this ~0.05). Not from inside a running loop: use
        score_async there."""
        loop = getattr(_LOOPS, "loop", None)
        if loop is None or loop.is_closed():
            loop = _LOOPS.loop = asyncio.new_event_loop()
        return loop.run_until_complete(self.score_async(records))

    async def score_async(self, records: Sequence[RewardInput]) -> Scored:
        if len(self.rewards) == 1:
            outcomes = [await self.rewards[0].score(records)]
        else:
            outcomes = await asyncio.gather(*(r.score(records) for r in self.rewards))
        traces: dict[str, str] = {}
        columns = [self._settle(outcome, traces) for outcome in outcomes]
        return self._combine(columns, len(records), traces)

    def _settle(self, outcome: list[float | RewardError], traces: dict[str, str]) -> list[float]:
        """The reward's values, a failure raised ("fail", or a stop) or replaced by 0 and noted ("zero")."""
        values = []
        for value in outcome:
            if isinstance(value, RewardError):
                if self.on_error == "fail" or isinstance(value, RewardStopped):
                    raise value
                traces.setdefault(str(value), value.trace)
                value = 0.0
            values.append(value)
        return values

    def _combine(self, columns: list[list[float]], n: int, traces: dict[str, str]) -> Scored:
        totals = [sum(r.weight * col[i] for r, col in zip(self.rewards, columns, strict=True)) for i in range(n)]
        parts = [{r.name: col[i] for r, col in zip(self.rewards, columns, strict=True)} for i in range(n)]
        return Scored(totals, parts, list(traces), traces)

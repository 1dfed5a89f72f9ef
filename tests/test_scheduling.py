"""The trainer's scheduling policy alone (trainer/scheduling.py): facts in, decisions out."""

from __future__ import annotations

import pytest

from prl_actors.buffer.bursts import Bursts
from prl_actors.runtime.threads import ThreadPlan
from prl_actors.trainer.scheduling import TrainerSchedule

pytestmark = pytest.mark.fast


def test_bursts_count_what_is_in_hand_or_announced_and_forget_it_at_a_new_epoch() -> None:
    bursts = Bursts()
    assert not bursts.generated(in_hand=2, groups=4)
    bursts.accepted("worker-0", follows=2, groups=4)  # two more of its burst come right after
    assert bursts.generated(in_hand=2, groups=4)
    bursts.accepted("worker-0", follows=1, groups=4)  # the next of the burst: a newer count replaces the last
    assert not bursts.generated(in_hand=2, groups=4) and bursts.generated(in_hand=3, groups=4)
    bursts.accepted("worker-1", follows=99, groups=4)  # clamped to B; a negative count to 0
    assert bursts.following["worker-1"] == 4
    bursts.accepted("worker-1", follows=-5, groups=4)
    assert bursts.following["worker-1"] == 0
    bursts.reset()
    assert bursts.following == {} and not bursts.generated(in_hand=3, groups=4)


def test_without_a_thread_plan_the_schedule_batches_by_the_generated_fact_only() -> None:
    """Any hardware (no hand-over): early flushes until the epoch is generated, never cut to slices."""
    schedule = TrainerSchedule()
    schedule.open_epoch()
    assert schedule.flush_early() and schedule.flush_limit() is None
    schedule.group_arrived(generated=False)
    assert schedule.flush_early()
    schedule.flush_limit()
    schedule.flushed(None, 3, 1.0)
    assert schedule.group_s is None  # nothing paced, nothing timed
    schedule.group_arrived(generated=True)
    assert not schedule.flush_early()
    schedule.group_arrived(generated=False)  # never back within the epoch
    assert not schedule.flush_early()
    schedule.open_epoch()
    assert schedule.flush_early()


def test_the_hand_over_paces_flushes_until_the_epoch_is_generated_then_takes_every_core() -> None:
    calls: list[int] = []
    schedule = TrainerSchedule(ThreadPlan(1, 2, calls.append), slice_s=0.25)
    schedule.open_epoch()
    assert calls == [1] and schedule.flush_limit() == 1  # untimed: one group per slice
    schedule.flushed(1, 1, 0.05)
    assert schedule.group_s == 0.05 and schedule.flush_limit() == 5  # 0.25 s of work
    schedule.flushed(5, 5, 0.5)  # 0.1 s a group: the mean of the two
    assert abs((schedule.group_s or 0) - 0.075) < 1e-12 and schedule.flush_limit() == 3
    schedule.group_arrived(generated=True)
    assert calls == [1, 2] and schedule.flush_limit() is None and not schedule.flush_early()
    schedule.open_epoch()
    assert calls == [1, 2, 1] and schedule.flush_limit() == 3  # the timing is kept across epochs

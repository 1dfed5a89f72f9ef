"""Failures, a part of the coordinator (issue 23): groups given back, refused or overdue, and the
workers expelled for them.

- an overdue group (held past `deadline_s`) is taken back from its live worker and requeued, not
  counted as a failure (a slow worker is not a broken prompt);
- a group given back or refused for training is requeued and counted; the max_group_failures-th
  failure gives it up under task.on_error (fail the run, or drop the group from its epoch);
- an expelled worker leaves the run, and its name (and its own key) is refused for the rest of it.
The state it reads and writes is the coordinator's (`assigned_at`, `group_times`, `failures`, `expelled`...)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.protocol.messages import GroupDropped, Phase, Role, Shutdown
from prl_actors.transport.port import Dest

if TYPE_CHECKING:
    from prl_actors.coordinator.core import CoordinatorCore


class Recovery:
    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core

    def deadline_s(self) -> float:
        """How long a worker may hold a group: hold_factor x the p95 of the run's observed group times
        (assign -> accepted), at least hold_min_s; before any group was timed, hold_factor x hold_min_s
        (a first group on a slow machine is not a hang)."""
        s, times = self.core.s, sorted(self.core.group_times)
        if not times:
            return s.hold_factor * s.hold_min_s
        p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
        return max(s.hold_min_s, s.hold_factor * p95)

    def hold_expired(self, worker: str, groups: list[int]) -> None:
        """Take the groups back from a live worker (a hung plugin or engine): requeued for anyone, not
        counted as failures (a slow worker is not a broken prompt); if the holder delivers after all,
        the buffer still accepts its group once (exactly-once holds: the first one in wins)."""
        c = self.core
        deadline = self.deadline_s()
        c.log("hold_expired", worker=worker, groups=groups, deadline_s=round(deadline, 3))
        for g in groups:
            c.assigned_at.pop(g, None)
            c.work.give_back(g)
        c.assigner.nudge()

    def requeue_failed(self, groups: list[int], why: str) -> None:
        """Requeue groups whose generation failed; one that failed max_group_failures times is given up."""
        c = self.core
        for g in groups:
            c.assigned_at.pop(g, None)
            c.work.give_back(g)
            if self.group_failed(g, why):
                return
        c.assigner.nudge()

    def group_failed(self, group_id: int, why: str) -> bool:
        """Count a failure of the (given back) group; the max_group_failures-th gives it up under
        on_error. True when that ended the run."""
        c = self.core
        causes = c.failures.setdefault(group_id, [])
        causes.append(why)
        if len(causes) >= c.s.max_group_failures:
            self.give_up(group_id, causes)
        return c.phase.is_(Phase.DONE)

    def give_up(self, group_id: int, causes: list[str]) -> None:
        c = self.core
        prompt = c.prompts.get(group_id)
        text = repr(prompt.prompt[:60]) if prompt is not None else "?"
        line = f"group {group_id} of epoch {c.epoch} (prompt {text}) failed {len(causes)} times; last: {causes[-1]}"
        c.log("group_given_up", group_id=group_id, causes=causes, policy=c.s.on_error)
        c.notice(line)
        fail = c.s.on_error == "fail" or (c.s.on_error == "fail_first" and c.epochs_completed == 0)
        if fail:
            c.shutdown(f"failed: {line} (task.on_error: {c.s.on_error})")
            return
        c.work.drop(group_id)
        c.log("group_dropped", group_id=group_id, msg_epoch=c.epoch)
        c.notice(f"dropped group {group_id} from epoch {c.epoch} (task.on_error: skip)")
        buffer = c.members.first(Role.BUFFER)
        if buffer is not None:
            dropped = GroupDropped(epoch=c.epoch, version=c.version, group_id=group_id, reason=causes[-1])
            c.emit(Dest.reply(buffer.identity), dropped)
        if c.work.complete:
            c.opening.generated()

    def expel(self, name: str, why: str, now: float) -> None:
        c = self.core
        c.expelled.add(name)
        c.expelled_at, c.expelled_why = now, why
        if c.keys_of.get(name) == name:  # its own key (a role-wide key would expel its peers too)
            c.expelled_keys.add(name)
        member = c.members.get(name)
        c.log("member_expelled", member=name, reason=why)
        c.notice(f"expelled {name} for the rest of the run: its groups were refused ({why})")
        if member is not None:
            c.to_member(name, Shutdown(reason=f"expelled: {why}", epoch=c.epoch, version=c.version))
            c.remove(member, "expelled")

"""Dynamic sampling, a part of the coordinator (training/dynamic_sampling.py): an epoch's prompts by
stream position, its rounds of groups, and the EpochClose that ends the trainer's stream.

With dynamic sampling an epoch may use group ids 0..stride-1 (`id_bound`); a round that completes
short of B informative groups hands out the next round (if rounds are left); the last round's end
tells the buffer which groups the trainer gets (EpochClose, retried after each request timeout)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prl_actors.protocol.messages import EpochClose, GroupAccepted, Phase, Prompt, Role
from prl_actors.protocol.versions import version_for
from prl_actors.training.dynamic_sampling import Rounds, epoch_stride
from prl_actors.transport.port import Dest

if TYPE_CHECKING:
    from prl_actors.coordinator.core import CoordinatorCore


class Sampling:
    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core

    def id_bound(self) -> int:
        """Group ids an epoch may use with dynamic sampling (0 = off); sets up the epoch's rounds."""
        s = self.core.s
        if not s.dynamic_sampling:
            self.core.rounds = None
            return 0
        self.core.rounds = Rounds(s.groups_per_epoch, s.max_sampling_rounds)
        return self.stride()

    def stride(self) -> int:
        s = self.core.s
        return epoch_stride(s.groups_per_epoch, s.dynamic_sampling, s.max_sampling_rounds)

    def epoch_prompts(self, epoch: int, ids: range | list[int]) -> list[Prompt]:
        """The prompts of group ids `ids` of `epoch`: stream position epoch * stride + id."""
        c = self.core
        if not c.s.dynamic_sampling:
            return c.task.prompts_for_epoch(epoch, c.s.groups_per_epoch)
        return c.task.prompts_at(epoch * self.stride(), list(ids))

    def another_round(self, msg: GroupAccepted) -> bool:
        """Record an accepted group; when it completes a round short of B informative groups (and
        rounds are left), hand out the next round and say so. True when a round was added."""
        c = self.core
        assert c.rounds is not None
        c.rounds.accept(msg.group_id, msg.informative)
        if not c.work.complete:
            return False
        ids = c.rounds.next_round()
        if not ids:
            return False
        new = self.epoch_prompts(c.epoch, ids)
        c.prompts.update((p.group_id, p) for p in new)
        c.work.extend(ids)
        c.log("sampling_round", round=len(c.rounds.ends) - 1, groups=ids, kept=c.rounds.kept)
        for name in c.work.take_waiting():
            c.to_member(name, c.opening.epoch_start())
        return True

    def close(self) -> None:
        """No more rounds: tell the buffer to end the trainer's stream with the informative groups."""
        c = self.core
        assert c.rounds is not None
        r = c.rounds
        c.log("sampling_done", kept=r.kept, generated=r.handed_out, rounds=len(r.ends), short=r.short)
        self.send_close(c.epoch, r)

    def send_close(self, epoch: int, rounds: Rounds) -> None:
        """EpochClose to the buffer, again after each request timeout while `epoch` is the one training."""
        c = self.core
        buffer = c.members.first(Role.BUFFER)
        if buffer is None or epoch != c.epoch or not c.phase.is_(Phase.TRAINING):
            return
        close = EpochClose(epoch=epoch, version=version_for(epoch), groups=rounds.kept, generated=rounds.handed_out)
        msg = c.emit(Dest.reply(buffer.identity), close)
        retry = lambda now: self.send_close(epoch, rounds)  # noqa: E731
        c.expect(msg, c.s.request_timeout_s, "buffer ack of epoch_close", retry)

"""The coordinator's epoch phase machine: the legal transitions, and nothing else.

    waiting_weights --(weights v_e and a buffer)--> opening --(buffer acks epoch_open)--> running
    running --(every group accepted)--> training --(weights v_{e+1})--> opening ...
    opening --(no ack in time, or no buffer)--> waiting_weights
    training --(no buffer when v_{e+1} arrives)--> waiting_weights
    training --(the trainer refused a group: it is generated again)--> running
    any --(last step done, or a stop)--> done

A transition not in the table is a bug in the coordinator, raised as `IllegalTransition`.
"""

from __future__ import annotations

from prl_actors.protocol.messages import Phase

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.WAITING_WEIGHTS: frozenset({Phase.OPENING, Phase.DONE}),
    Phase.OPENING: frozenset({Phase.RUNNING, Phase.WAITING_WEIGHTS, Phase.DONE}),
    Phase.RUNNING: frozenset({Phase.TRAINING, Phase.DONE}),
    Phase.TRAINING: frozenset({Phase.OPENING, Phase.WAITING_WEIGHTS, Phase.RUNNING, Phase.DONE}),
    Phase.DONE: frozenset(),
}
EPOCH_OPEN = frozenset({Phase.RUNNING, Phase.TRAINING})  # an epoch is open (its work was handed out)


class IllegalTransition(RuntimeError):
    pass


class PhaseMachine:
    def __init__(self) -> None:
        self.current = Phase.WAITING_WEIGHTS

    def to(self, new: Phase) -> None:
        if new not in TRANSITIONS[self.current]:
            raise IllegalTransition(f"coordinator cannot go from {self.current} to {new}")
        self.current = new

    def is_(self, *phases: Phase) -> bool:
        return self.current in phases

    @property
    def epoch_open(self) -> bool:
        return self.current in EPOCH_OPEN

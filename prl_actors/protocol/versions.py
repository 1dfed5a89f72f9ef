"""Epoch <-> weight version and the on-policy rule: the one place that knows them.

One optimizer step per epoch and versions that start at 0 make the weights of epoch e v_e = e: epoch e
generates with v_e and its step produces v_{e+1}, which opens epoch e+1. The header fields `epoch` and
`version` stay separate on the wire, and every actor (and `prl-actors replay`) asks this module instead
of comparing them itself, so a bounded-staleness mode changes one predicate, not five call sites.

Bounded staleness (issue 27, `run.mode: bounded`, `run.max_staleness: k`): a sample generated with
v_{e-j} may be trained in epoch e when 0 <= j <= k (`within_bound`); `staleness` is that j. k = 0 is
exactly `on_policy`. Every actor takes k (0 outside bounded mode) and asks `within_bound`,
`floor_version` (what workers must hold) and `may_open` (when an epoch may open) here.
"""

from __future__ import annotations

INITIAL_VERSION = 0  # the weights before any step; they open epoch 0


def version_for(epoch: int) -> int:
    """The weights that `epoch` generates with (v_e)."""
    return epoch


def epoch_for(version: int) -> int:
    """The epoch that weights `version` open."""
    return version


def next_version(version: int) -> int:
    """The version one optimizer step makes from `version`."""
    return version + 1


def on_policy(epoch: int, version: int) -> bool:
    """May a sample generated with weights `version` be trained in `epoch`? Strict: only v_epoch."""
    return epoch >= 0 and version == version_for(epoch)


def staleness(epoch: int, version: int) -> int:
    """How many versions older than epoch's own (v_epoch) the weights `version` are (j of v_{e-j});
    negative for weights newer than the epoch's (never trainable)."""
    return version_for(epoch) - version


def within_bound(epoch: int, version: int, max_staleness: int) -> bool:
    """May a sample generated with weights `version` be trained in `epoch` when samples may be up to
    `max_staleness` (k >= 0) versions old? 0 <= staleness <= k; k = 0 is exactly `on_policy`."""
    return epoch >= 0 and version >= INITIAL_VERSION and 0 <= staleness(epoch, version) <= max_staleness


def floor_version(epoch: int, max_staleness: int) -> int:
    """The oldest weights that may generate `epoch`'s samples: v_{e-k} (never below the initial
    weights); v_e itself when k = 0. What the coordinator tells workers to hold at least."""
    return max(INITIAL_VERSION, version_for(epoch) - max_staleness)


def may_open(epoch: int, available: int, max_staleness: int) -> bool:
    """May `epoch` open while the newest published weights are `available`? Its floor version must
    exist: strict on-policy (k = 0) waits for v_epoch itself, bounded mode for v_{e-k}."""
    return available >= floor_version(epoch, max_staleness)

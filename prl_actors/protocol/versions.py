"""Epoch <-> weight version and the on-policy rule: the one place that knows them.

One optimizer step per epoch and versions that start at 0 make the weights of epoch e v_e = e: epoch e
generates with v_e and its step produces v_{e+1}, which opens epoch e+1. The header fields `epoch` and
`version` stay separate on the wire, and every actor (and `prl-actors replay`) asks this module instead
of comparing them itself, so a bounded-staleness mode changes one predicate, not five call sites.
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

"""The `buffer:` section: the rollout buffer.

A section lives beside the code that reads it; prl_actors/config.py composes every section into the
run's `Config` and holds the rules that span sections (docs/CONFIG.md lists every field)."""

from __future__ import annotations

from pydantic import Field

from prl_actors.sections import Section


class BufferSection(Section):
    max_groups: int = Field(4096, ge=1, description="Bound on groups held; over it, groups are refused.")
    verify_rewards: bool = Field(
        False,
        description="Re-score every group's texts with the task's reward in the buffer and refuse a group "
        "whose reported rewards differ (reason reward_mismatch): for workers on hosts you do not fully "
        "trust. Costs one reward call per sample in the buffer (docs/SECURITY.md).",
    )
    reward_tolerance: float = Field(
        1e-6, ge=0, description="verify_rewards: the largest |reported - re-scored| reward accepted."
    )

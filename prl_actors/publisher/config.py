"""The `publisher:` section: the weight publisher.

A section lives beside the code that reads it; prl_actors/config.py composes every section into the
run's `Config` and holds the rules that span sections (docs/CONFIG.md lists every field)."""

from __future__ import annotations

from pydantic import Field

from prl_actors.sections import Section


class PublisherSection(Section):
    chunk_bytes: int = Field(4 << 20, ge=1024, description="Weight transfer chunk size.")
    transfer_timeout_s: float = Field(60.0, gt=0)
    shm: bool = Field(
        True,
        description="Write each version once to /dev/shm for workers that prove they share this host "
        "(one copy per host); others get chunks. Off, or /dev/shm too small: chunks for all.",
    )

"""Prompt data: rows from local files (JSONL, parquet, a `datasets` directory), chat formatting,
and the epoch sampler (without replacement, deterministic in (seed, epoch)).

Nothing here ever downloads: `datasets` and the hub are put in offline mode before they are used.
"""

from __future__ import annotations

from prl_actors.data.items import Item, build_items
from prl_actors.data.rows import read_rows
from prl_actors.data.sampler import EpochSampler

__all__ = ["EpochSampler", "Item", "build_items", "read_rows"]

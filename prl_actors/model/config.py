"""The `model:` section: which model (built-in or a local Hugging Face directory), dtype, device.

A section lives beside the code that reads it; prl_actors/config.py composes every section into the
run's `Config` and holds the rules that span sections (docs/CONFIG.md lists every field)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prl_actors.sections import Section


class ModelSection(Section):
    path: str | None = Field(None, description="Local Hugging Face checkpoint dir; None = built-in tiny LM.")
    hidden_size: int = Field(64, ge=8)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    warm_start_steps: int = Field(
        600, ge=0, description="Supervised AdamW steps (batch 64) on `add` for the built-in model."
    )
    warm_start_smoothing: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="Label smoothing of the warm start: an under-confident model whose greedy answer is "
        "mostly right but whose temperature-1 samples are right ~30% of the time, so GRPO has room.",
    )
    dtype: Literal["float32", "bfloat16", "float64"] = Field(
        "float32", description="Weights and compute dtype (float64: exactness tests on CPU)."
    )

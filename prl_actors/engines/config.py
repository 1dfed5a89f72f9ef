"""The generation settings the engines read: `worker.sampling:` (and `eval.sampling:`), and `sim:` (the
simulated engine and learner).

A section lives beside the code that reads it; prl_actors/config.py composes every section into the
run's `Config` and holds the rules that span sections (docs/CONFIG.md lists every field)."""

from __future__ import annotations

from pydantic import Field, model_validator

from prl_actors.sections import Section


class SamplingSection(Section):
    temperature: float = Field(
        1.0, ge=0, description="Sampling temperature; 0 = greedy (refused for GRPO training: no group variance)."
    )
    top_p: float = Field(
        1.0, gt=0, le=1, description="Nucleus: sample from the smallest set of tokens with mass >= top_p."
    )
    max_new_tokens: int = Field(8, ge=1)
    top_k: int = Field(
        0, ge=0, description="Sample from the k most likely tokens only (ties at the k-th included); 0 = off."
    )
    min_p: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Drop tokens whose probability (after the temperature) is below min_p x the top token's; 0 = off.",
    )
    repetition_penalty: float = Field(
        1.0,
        gt=0,
        description="HF/vLLM repetition penalty: the logit of every token already in the prompt or the response "
        "so far is divided by it if positive, multiplied if negative (> 1 discourages repeats); 1 = off.",
    )
    stop: list[str] = Field(
        default_factory=list,
        description="Stop strings: a response ends at the first one (its text cut before it, its tokens up to the "
        "one that completed it) and counts as finished.",
    )

    @model_validator(mode="after")
    def _stop_strings(self) -> SamplingSection:
        if any(not x for x in self.stop):
            raise ValueError("stop: stop strings must be non-empty")
        return self


class SimSection(Section):
    """Simulated engine and learner (control-plane tests and benchmarks)."""

    gen_s_per_token: float = Field(0.001, ge=0, description="Generation cost per token.")
    tokens_per_sample: int = Field(8, ge=1)
    train_s_per_sample: float = Field(0.001, ge=0, description="Training cost per sample.")
    arms: int = Field(8, ge=2, description="Size of the simulated policy's action space.")
    lr: float = Field(0.5, gt=0)
    param_count: int = Field(1024, ge=0, description="Extra parameters, to make weight transfer real.")

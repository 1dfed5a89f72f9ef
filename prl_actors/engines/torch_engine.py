"""The built-in generation engine: a Hugging Face causal LM driven by plain torch (KV cache, batching).

All prompts of a `generate` call and their G samples run as one left-padded batch. Sampling of group
`g` draws from a generator seeded by (run.seed, version, group_id), so the same weights and prompts
give the same samples (a requeued group regenerates identically, up to float noise of batching).

Returned log-probs are those of the behaviour distribution the tokens were drawn from (tempered,
top-p-truncated: training/behaviour.py). With the same weights they equal what the trainer computes
for the same tokens with the same transform (tests check it at T = 0.5, top_p = 0.9), and every
epoch's metrics report the measured difference (logprob_diff_max / logprob_diff_mean).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prl_actors.config import Config
from prl_actors.engines.base import Generated, GeneratedGroup
from prl_actors.engines.sampling import sample, seed_for
from prl_actors.model.builtin import load_model
from prl_actors.model.device import resolve_device
from prl_actors.model.tokenizer import encode_prompt, load_tokenizer
from prl_actors.protocol.messages import Prompt


def to_torch(t: Any) -> torch.Tensor:
    """A torch tensor from a numpy array (copied if read-only, e.g. a view of a received frame)."""
    if isinstance(t, torch.Tensor):
        return t
    a = np.asarray(t)
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def state_mismatch(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor]) -> str:
    """'' when `given` has exactly the names and shapes of `expected`, else a one-line reason."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    if missing or unexpected:
        return f"missing {missing[:5]} (of {len(missing)}), unexpected {unexpected[:5]} (of {len(unexpected)})"
    for name, t in expected.items():
        if tuple(given[name].shape) != tuple(t.shape):
            return f"{name} has shape {tuple(given[name].shape)}, the model wants {tuple(t.shape)}"
    return ""


class TorchEngine:
    """Engine protocol on a local HF model directory; holds exactly one weight version."""

    def __init__(self, cfg: Config, model_dir: Path | str) -> None:
        self.device = resolve_device(cfg.worker.device)
        self.model = load_model(model_dir, self.device, cfg.model.dtype)
        self.tokenizer = load_tokenizer(model_dir)
        self.sampling = cfg.worker.sampling
        self.templated = cfg.task.chat_template
        self.seed = cfg.run.seed
        self.version = -1
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.eos_ids = self._eos_ids()

    def _eos_ids(self) -> set[int]:
        ids = {int(self.tokenizer.eos_token_id)} if self.tokenizer.eos_token_id is not None else set()
        extra = getattr(self.model.generation_config, "eos_token_id", None)
        ids |= set(extra) if isinstance(extra, list) else ({int(extra)} if extra is not None else set())
        if not ids:
            raise ValueError("the model has no eos token: generation could never stop early")
        return ids

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        """Swap every parameter in place. Names and shapes must match the model's state dict exactly;
        they are checked before anything is copied, so a bad update leaves the old version intact."""
        state = {name: to_torch(t) for name, t in tensors.items()}
        problem = state_mismatch(self.model.state_dict(), state)
        if problem:
            raise ValueError(f"weights of version {version} do not fit the engine's model: {problem}")
        self.model.load_state_dict(state, strict=True)
        self.version = version

    def generate(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        """`group_size` samples for each prompt, all in one batch, with the loaded weights."""
        if not prompts:
            return []
        prompt_ids = [encode_prompt(self.tokenizer, p.prompt, self.templated) for p in prompts]
        rows = [ids for ids in prompt_ids for _ in range(group_size)]
        row_group = [g for g in range(len(prompts)) for _ in range(group_size)]
        s = self.sampling
        result = sample(
            self.model,
            rows,
            row_group,
            [self._generator(p.group_id) for p in prompts],
            temperature=s.temperature,
            top_p=s.top_p,
            max_new_tokens=s.max_new_tokens,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
        )
        groups = []
        for g, (p, ids) in enumerate(zip(prompts, prompt_ids, strict=True)):
            group = GeneratedGroup(group_id=p.group_id, prompt=p.prompt, prompt_ids=list(ids))
            for r in range(g * group_size, (g + 1) * group_size):
                text = str(self.tokenizer.decode(result.token_ids[r], skip_special_tokens=True))
                group.samples.append(Generated(text, result.token_ids[r], result.logprobs[r], result.finished[r]))
            groups.append(group)
        return groups

    def _generator(self, group_id: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed_for(self.seed, self.version, group_id))
        return gen

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]

"""engines/multiturn.py's TurnBackend on the vLLM engine: turn by turn, one `LLM.generate` per `poll`
over every turn queued since (each a request on its whole context's token ids, `n` = its rows).

Each turn is sampled with a vLLM per-request seed derived from (the group's key, the first row's
episode index, the episode's token count), so a regenerated episode asks vLLM the same questions
with the same seeds (vLLM's own per-seed determinism then decides; unverified on GPU here). vLLM's
prefix cache reuses the KV blocks of the context a later turn shares with the earlier one, which is
the KV extension the torch engine does not do (it re-prefills). Log-probs: the engine's
`processed_logprobs` (vllm_engine.py), model tokens only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from prl_actors.engines.base import ContextLimited
from prl_actors.engines.batching import _mix64
from prl_actors.engines.multiturn import Turn, TurnOut
from prl_actors.engines.sampling import seed_for
from prl_actors.engines.vllm_engine import sampling_kwargs

SEED_MASK = (1 << 63) - 1


def turn_seed(turn: Turn) -> int:
    """A per-request seed that is a pure function of (group key, episode index, episode offset)."""
    mixed = _mix64(np.asarray([turn.key ^ (turn.index << 32) ^ (turn.offset << 48) ^ turn.offset], dtype=np.uint64))
    return int(mixed[0]) & SEED_MASK


class VllmTurns:
    def __init__(self, engine: Any, max_turn_tokens: int) -> None:
        self.engine, self.max_turn_tokens = engine, max_turn_tokens
        self.queued: list[Turn] = []
        self.max_context: int | None = engine.max_context if isinstance(engine, ContextLimited) else None

    @property
    def version(self) -> int:
        return int(self.engine.version)

    @property
    def max_rows(self) -> int:
        return int(self.engine.max_rows)

    @property
    def busy(self) -> bool:
        return bool(self.queued)

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        self.engine.load_weights(version, tensors)

    def seed_for(self, group_id: int) -> int:
        return seed_for(self.engine.seed, self.engine.version, group_id) & SEED_MASK

    def submit(self, turn: Turn) -> None:
        self.queued.append(turn)

    def params(self, turn: Turn) -> Any:
        kwargs = sampling_kwargs(self.engine.sampling, turn.size)  # every sampling control, as in one-turn runs
        kwargs.update(n=turn.size, max_tokens=self.max_turn_tokens)
        return self.engine._vllm.SamplingParams(**kwargs, seed=turn_seed(turn))

    def poll(self) -> list[TurnOut]:
        """Generate every queued turn in one call; each comes back as `size` TurnOuts."""
        turns, self.queued = self.queued, []
        if not turns:
            return []
        requests = [{"prompt_token_ids": t.ids} for t in turns]
        params = [self.params(t) for t in turns]
        outputs = self.engine.llm.generate(requests, params, use_tqdm=False, lora_request=self.engine.lora_request)
        out = []
        for turn, result in zip(turns, outputs, strict=True):
            for k, c in enumerate(result.outputs):
                tokens = list(c.token_ids)
                logprobs = [float(step[t].logprob) for step, t in zip(c.logprobs, tokens, strict=True)]
                out.append(TurnOut(turn.turn_id, turn.index + k, tokens, logprobs, c.finish_reason == "stop"))
        return out

    def abort(self) -> None:
        self.queued = []

    def close(self) -> None:
        self.engine.close()

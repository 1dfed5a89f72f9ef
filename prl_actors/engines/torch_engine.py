"""The built-in generation engine: a Hugging Face causal LM driven by plain torch, continuously batched.

Groups enter a running KV-cache batch of up to `worker.max_batch_rows` rows as rows free up
(engines/batching.py); each group's prompt is encoded once and its G samples share that prefill.
Sampling is counter-based in (run.seed, version, group_id, sample, position), so the same weights and
prompts give the same samples whatever shares the batch (a requeued group regenerates identically,
up to float noise of batching).

Returned log-probs are those of the behaviour distribution the tokens were drawn from (tempered,
top-p-truncated: training/behaviour.py). With the same weights they equal what the trainer computes
for the same tokens with the same transform (tests check it at T = 0.5, top_p = 0.9), and every
epoch's metrics report the measured difference (logprob_diff_max / logprob_diff_mean).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from prl_actors.engines.base import EngineBusy, Generated, GeneratedGroup, IncompatibleWeights, generate_all
from prl_actors.engines.batching import Finished, RunningBatch
from prl_actors.engines.sampling import seed_for
from prl_actors.engines.static_batch import StaticBatch
from prl_actors.engines.stops import cut_at_stop
from prl_actors.model.builtin import load_model
from prl_actors.model.device import resolve_device
from prl_actors.model.lean import lean_support
from prl_actors.model.lora import AdapterHooks, is_adapter
from prl_actors.model.tokenizer import encode_prompt, load_tokenizer
from prl_actors.training.behaviour import Behaviour

if TYPE_CHECKING:
    from prl_actors.engines.config import SamplingSection
    from prl_actors.engines.settings import EngineSettings
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


def decode_impl(asked: str, device: torch.device, model: torch.nn.Module) -> tuple[str, str]:
    """(impl, why): the decode path `worker.impl` gives on `device` for `model`. auto: gpu on an
    accelerator, cpu on the CPU (the running batch is faster there: docs/ENGINES.md); gpu for a model
    the lean decoder does not know: cpu, saying why."""
    if asked == "cpu" or asked == "auto" and device.type == "cpu":
        return "cpu", f"worker.impl={asked} on {device.type}"
    ok, why = lean_support(model)
    return ("gpu", why) if ok else ("cpu", f"the gpu path cannot run this model: {why}")


class TorchEngine:
    """Engine protocol on a local HF model directory; holds exactly one weight version."""

    def __init__(self, settings: EngineSettings, model_dir: Path | str) -> None:
        w = settings.worker
        self.device = resolve_device(w.device)
        self.model = load_model(model_dir, self.device, settings.dtype)
        self.tokenizer = load_tokenizer(model_dir)
        self.templated = settings.chat_template
        self.seed = settings.seed
        self.version = -1
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.eos_ids = self._eos_ids()
        self.max_rows = max(w.max_batch_rows, w.group_size)
        s = w.sampling
        self.impl, why = decode_impl(w.impl, self.device, self.model)
        kind = StaticBatch if self.impl == "gpu" else RunningBatch
        self.batch: RunningBatch | StaticBatch = kind(
            self.model,
            max_rows=self.max_rows,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            behaviour=Behaviour.of(s),
            max_new_tokens=s.max_new_tokens,
            stopper=self._stopper(s.stop),
        )
        if "gpu" in (self.impl, w.impl):  # the default CPU path says nothing new
            self.batch.notes.append(("decode_path", {"impl": self.impl, "asked": w.impl, "why": why}))
        self._sampling = s
        self.lora = AdapterHooks(self.model, model_dir)  # LoRA runs: adapters on the base (model/lora.py)

    @property
    def sampling(self) -> SamplingSection:
        return self._sampling

    @sampling.setter
    def sampling(self, s: SamplingSection) -> None:
        """New sampling settings, from the next admitted group on (an idle engine only)."""
        if self.busy:
            raise EngineBusy("sampling settings change only between batches")
        self._sampling = s
        self.batch.behaviour, self.batch.max_new_tokens = Behaviour.of(s), s.max_new_tokens
        self.batch.stopper = self._stopper(s.stop)

    def _stopper(self, stop: list[str]) -> Callable[[list[int]], bool] | None:
        """tokens -> has one of `stop` appeared in their text; None without stop strings. Only the
        tail is decoded: the last 4 x len(longest stop) + 2 tokens (a token holds at least one byte,
        a character at most four in UTF-8; earlier tokens were checked at earlier steps)."""
        if not stop:
            return None
        tail = 4 * max(len(x) for x in stop) + 2
        return lambda tokens: any(x in self._text(tokens[-tail:]) for x in stop)

    def _text(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def _eos_ids(self) -> set[int]:
        ids = {int(self.tokenizer.eos_token_id)} if self.tokenizer.eos_token_id is not None else set()
        extra = getattr(self.model.generation_config, "eos_token_id", None)
        ids |= set(extra) if isinstance(extra, list) else ({int(extra)} if extra is not None else set())
        if not ids:
            raise ValueError("the model has no eos token: generation could never stop early")
        return ids

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        """Swap every parameter. Names and shapes must match the model's state dict exactly; they are
        checked before anything changes, so a bad update leaves the old version intact. On CPU, when
        the dtypes match, the model takes the given tensors as its parameters (no copy: a same-host
        snapshot is shared by every worker of the host); otherwise they are copied in.
        A LoRA adapter (trainer.lora) is applied on top of the base weights instead (model/lora.py)."""
        if self.busy:
            raise EngineBusy(f"cannot load version {version} while {self.rows} rows of v{self.version} generate")
        if is_adapter(tensors):
            self.lora.load(version, tensors)
            self.batch.weights_changed()
            self.version = version
            return
        state = {name: to_torch(t) for name, t in tensors.items()}
        current = self.model.state_dict()
        problem = state_mismatch(current, state)
        if problem:
            raise IncompatibleWeights(f"weights of version {version} do not fit the engine's model: {problem}")
        self.lora.clear()
        in_place = self.device.type == "cpu" and all(state[k].dtype == current[k].dtype for k in state)
        # on CPU with the model's dtypes the parameters become the received tensors themselves: no copy,
        # and same-host workers share one snapshot's pages (weights/shm.py maps it copy-on-write)
        self.model.load_state_dict(state, strict=True, assign=in_place)
        self.batch.weights_changed()  # the gpu path reads the parameter tensors themselves
        self.version = version

    # --- streaming -------------------------------------------------------------------------------

    def admit(self, prompts: list[Prompt], group_size: int) -> None:
        for p in prompts:
            ids = encode_prompt(self.tokenizer, p.prompt, self.templated)
            self.batch.add(p.group_id, ids, seed_for(self.seed, self.version, p.group_id), group_size, tag=p)

    def step(self) -> list[GeneratedGroup]:
        return [self._group(f) for f in self.batch.step()]

    def abort(self) -> list[int]:
        return self.batch.abort()

    def drain_notes(self) -> list[tuple[str, dict[str, Any]]]:
        """Facts about the decode path, said once (engines/base.py engine_notes)."""
        return self.batch.drain_notes()

    @property
    def busy(self) -> bool:
        return self.batch.busy

    @property
    def rows(self) -> int:
        return self.batch.running_rows + sum(g.size for g in self.batch.pending)

    def generate(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        """`group_size` samples for each prompt, continuously batched, with the loaded weights."""
        return generate_all(self, prompts, group_size)

    def _group(self, f: Finished) -> GeneratedGroup:
        prompt: Prompt = f.tag
        group = GeneratedGroup(group_id=f.group_id, prompt=prompt.prompt, prompt_ids=f.prompt_ids, gen_s=f.seconds)
        for row in f.rows:
            text = cut_at_stop(self._text(row.tokens), self._sampling.stop)
            group.samples.append(Generated(text, list(row.tokens), list(row.logprobs), finished=row.eos))
        return group

    def close(self) -> None:
        self.batch.abort()
        self.model = None  # type: ignore[assignment]


class TorchTurns:
    """engines/multiturn.py's TurnBackend on a TorchEngine's running batch: a turn is an entry of the
    batch (a group's first turn: G rows sharing one prefill; a later turn: one row re-prefilled with
    its whole context), at most `max_turn_tokens` tokens each, sampled by the episode's counters."""

    def __init__(self, engine: TorchEngine, max_turn_tokens: int) -> None:
        self.engine = engine
        engine.batch.max_new_tokens = max_turn_tokens
        limit = getattr(engine.model.config, "max_position_embeddings", None)
        self.max_context: int | None = int(limit) if limit else None

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def max_rows(self) -> int:
        return self.engine.max_rows

    @property
    def busy(self) -> bool:
        return self.engine.batch.busy

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        self.engine.load_weights(version, tensors)

    def seed_for(self, group_id: int) -> int:
        return seed_for(self.engine.seed, self.engine.version, group_id)

    def submit(self, turn: Any) -> None:
        self.engine.batch.add(
            turn.turn_id, turn.ids, turn.key, turn.size, tag=turn, index=turn.index, offset=turn.offset
        )

    def poll(self) -> list[Any]:
        from prl_actors.engines.multiturn import TurnOut

        return [
            TurnOut(f.group_id, row.index, list(row.tokens), list(row.logprobs), row.eos)
            for f in self.engine.batch.step()
            for row in f.rows
        ]

    def abort(self) -> None:
        self.engine.batch.abort()

    def close(self) -> None:
        self.engine.close()

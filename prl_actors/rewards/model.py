"""A reward model: a local Hugging Face sequence-classification checkpoint scores (prompt, completion).

Batched: one call per group; the G texts go through the model `batch_size` at a time. The reward is
logit `label` of each sequence (num_labels == 1: the single score). The checkpoint loads on first use
(never on the coordinator), from local files only; `device` and `threads` are the spec's.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.rewards.record import RewardInput
    from prl_actors.tasks.config import RewardSpec


@dataclass
class ModelReward:
    """Callable on a group's records -> one float per record. Thread-safe (one forward at a time)."""

    path: Path
    device: str = "cpu"
    threads: int | None = None
    batch_size: int = 16
    max_length: int = 1024
    label: int = 0
    _loaded: tuple[Any, Any] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def from_spec(cls, spec: RewardSpec, option: str) -> ModelReward:
        assert spec.model is not None
        path = check_model_dir(spec.model, option)
        return cls(path, spec.device, spec.threads, spec.batch_size, spec.max_length, spec.label)

    async def __call__(self, records: Sequence[RewardInput]) -> list[float]:
        """Scores in a thread, so other rewards (services, async functions) proceed meanwhile."""
        return await asyncio.to_thread(self.score, records)

    def score(self, records: Sequence[RewardInput]) -> list[float]:
        import torch

        model, tokenizer = self._load()
        out: list[float] = []
        with self._lock, _torch_threads(self.threads), torch.inference_mode():
            for start in range(0, len(records), self.batch_size):
                chunk = records[start : start + self.batch_size]
                batch = tokenizer(
                    [r.prompt for r in chunk],
                    [r.completion for r in chunk],
                    padding=True,
                    truncation="longest_first",
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                logits = model(**batch).logits  # [b, num_labels]
                out.extend(float(x) for x in logits[:, self.label].float().cpu())
        return out

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._loaded is None:
                self._loaded = _load_checkpoint(self.path, self.device, self.label)
            return self._loaded


def _load_checkpoint(path: Path, device: str, label: int) -> tuple[Any, Any]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"reward model {str(path)!r} does not load: {exc}") from None
    if label >= model.config.num_labels:
        raise ConfigError(f"reward model {str(path)!r}: label {label} but the model has {model.config.num_labels}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"
    return model.to(device).eval(), tokenizer


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to n for the block (process-wide: the block holds the lock)."""
    import torch

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_model_dir(path: str, option: str) -> Path:
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ConfigError(f"{option}.model {path!r}: not a Hugging Face checkpoint directory (no config.json)")
    return p

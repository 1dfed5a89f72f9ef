"""The buffer's GroupChecker set up for what the engines produce, so honest groups pass (launch/build.py's
`group_checker` composes it from the run's config):

- sim: vocabulary = sim.arms, a response is sim.tokens_per_sample ids, its text the first id, the
  prompt ids the context index;
- torch / vllm: vocabulary = the model's `vocab_size` (config.json), responses of at most
  worker.sampling.max_new_tokens tokens, prompt ids = the tokenizer's encoding (model/tokenizer.py),
  and (torch only: vLLM detokenizes incrementally) text = the tokenizer's decoding of the ids.
  The buffer starts at once: the tokenizer (a transformers import, seconds) loads in a thread while
  the other actors start; a check that needs it waits for it. Where the model directory is not on the
  buffer's host (model.path elsewhere, RUN_DIR/model not prepared), those checks are skipped.
The epoch's prompts come from the task itself (deterministic per epoch), as the coordinator's do.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prl_actors.engines.stops import cut_at_stop

if TYPE_CHECKING:
    from prl_actors.buffer.group_check import GroupChecker
    from prl_actors.coordinator.config import CoordinatorSection
    from prl_actors.engines.config import SimSection
    from prl_actors.protocol.messages import Prompt
    from prl_actors.tasks.base import Task


def epoch_prompts(task: Task, c: CoordinatorSection) -> Callable[[int, int], Prompt | None]:
    """(epoch, group id) -> the prompt the coordinator assigns, by the coordinator's own rule
    (CoordinatorCore._epoch_prompts: the epoch's B prompts, or with dynamic sampling stream position
    epoch x stride + id); the last epoch's prompts are cached."""
    from prl_actors.training.dynamic_sampling import epoch_stride

    stride = epoch_stride(c.groups_per_epoch, c.dynamic_sampling, c.max_sampling_rounds)
    cache: dict[int, dict[int, Prompt]] = {}

    def prompt_of(epoch: int, group_id: int) -> Prompt | None:
        if epoch not in cache:
            cache.clear()
            cache[epoch] = {}
            if not c.dynamic_sampling:
                cache[epoch] = {p.group_id: p for p in task.prompts_for_epoch(epoch, c.groups_per_epoch)}
        if c.dynamic_sampling and group_id not in cache[epoch] and 0 <= group_id < stride:
            (prompt,) = task.prompts_at(epoch * stride, [group_id])
            cache[epoch][group_id] = prompt
        return cache[epoch].get(group_id)

    return prompt_of


def simulated(checker: GroupChecker, sim: SimSection) -> GroupChecker:
    """`checker` for the sim engine's groups."""
    from prl_actors.training.sim import context_of

    checker.vocab_size, checker.max_response_tokens = sim.arms, sim.tokens_per_sample
    checker.encode = lambda text: [context_of(text)]
    checker.decode = lambda ids: str(ids[0]) if ids else ""
    return checker


def with_model(
    checker: GroupChecker,
    model_dir: Path,
    *,
    templated: bool,
    stop: list[str],
    decode: bool,
    episode_prompt_ids: Callable[[Any], Callable[[Prompt], list[int]]] | None = None,
) -> None:
    """The checks of `model_dir`'s vocabulary and tokenizer (prompt ids encoded with the chat template
    when `templated`; with `decode`, texts as the tokenizer decodes the ids, cut at the `stop`
    strings; `episode_prompt_ids`: tokenizer -> a multi-turn group's prompt ids)."""
    checker.vocab_size = _vocab_size(model_dir)
    _with_tokenizer(checker, model_dir, templated, stop, decode, episode_prompt_ids)


def _vocab_size(model_dir: Path) -> int:
    try:
        return int(json.loads((model_dir / "config.json").read_text()).get("vocab_size", 0))
    except (OSError, ValueError, TypeError):
        return 0


def _with_tokenizer(
    checker: GroupChecker,
    model_dir: Path,
    templated: bool,
    stop: list[str],
    with_decode: bool,
    episode_prompt_ids: Callable[[Any], Callable[[Prompt], list[int]]] | None,
) -> None:
    loaded = threading.Event()
    box: dict[str, object] = {}

    def load() -> None:
        try:
            from prl_actors.model.tokenizer import load_tokenizer

            box["tok"] = load_tokenizer(model_dir)
        except Exception as exc:  # noqa: BLE001 - any failure only limits the checks (logged by the buffer)
            checker.note = (
                f"no tokenizer from {model_dir} ({type(exc).__name__}: {exc}): prompt ids and texts unchecked"
            )
        finally:
            loaded.set()

    threading.Thread(target=load, name="buffer-tokenizer", daemon=True).start()

    def encode(text: str) -> list[int] | None:
        from prl_actors.model.tokenizer import encode_prompt

        loaded.wait()
        tok = box.get("tok")
        return None if tok is None else encode_prompt(tok, text, templated)  # type: ignore[arg-type]

    def decode(ids: list[int]) -> str | None:
        loaded.wait()
        tok = box.get("tok")
        if tok is None:
            return None
        text = str(tok.decode(ids, skip_special_tokens=True))  # type: ignore[attr-defined]
        return cut_at_stop(text, stop)  # the engines cut the text at a stop string, not the tokens

    checker.encode = encode
    if episode_prompt_ids is not None:  # prompt ids are the environment's reset rendered (envs_llm/registry.py)
        checker.encode_row = _episode_prompt(episode_prompt_ids, loaded, box)
    if with_decode:
        checker.decode = decode


def _episode_prompt(
    episode_prompt_ids: Callable[[Any], Callable[[Prompt], list[int]]], loaded: threading.Event, box: dict[str, object]
) -> Callable[[Prompt], list[int] | None]:
    """A multi-turn group's prompt ids as its engine renders them; None (unchecked) without a
    tokenizer or when the environment cannot be reset here."""
    made: dict[str, Callable[[Prompt], list[int]]] = {}

    def encode_row(row: Prompt) -> list[int] | None:
        loaded.wait()
        if box.get("tok") is None:
            return None
        try:
            if "ids" not in made:
                made["ids"] = episode_prompt_ids(box["tok"])
            return made["ids"](row)
        except Exception:  # noqa: BLE001 - an environment that cannot load or reset here (its module elsewhere): unchecked
            return None

    return encode_row

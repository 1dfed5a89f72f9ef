"""The run's generation contract: what every worker must generate under, and the one comparison.

A worker registers with its own contract (`Register.contract`, built from its config by `contract_of`,
which launch/topology.py's `generation_contract` calls with the config's sections);
the coordinator refuses it (one line naming the first differing field and both values) unless it equals
the run's, and sends the run's in `Welcome`. A member built under other settings may also hold
another model or other data, so it is refused, never adapted (docs/PROTOCOL.md, docs/DEPLOY.md).

Identities are cheap: no weights are read (every worker loads the trainer's weights from the publisher).
- model: `hf:` + sha256 of the model directory's config.json and tokenizer files (path-independent:
  the same checkpoint copied elsewhere matches); `builtin:` + the built-in model's cache key (what
  determines its weights: model section, seed, task size); `sim:` + the simulated policy's shape;
- task: `task.name` : the number of items : sha256 of every (prompt, answer) in order (16 hex).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prl_actors.protocol.messages import GenerationContract

if TYPE_CHECKING:
    from collections.abc import Callable

    from prl_actors.engines.config import SimSection
    from prl_actors.model.config import ModelSection
    from prl_actors.tasks.base import Task
    from prl_actors.tasks.config import TaskSection
    from prl_actors.worker.config import WorkerSection

# contract field -> the config setting it comes from (what a refusal names), in comparison order
FIELDS: dict[str, str] = {
    "temperature": "worker.sampling.temperature",
    "top_p": "worker.sampling.top_p",
    "top_k": "worker.sampling.top_k",
    "min_p": "worker.sampling.min_p",
    "repetition_penalty": "worker.sampling.repetition_penalty",
    "stop": "worker.sampling.stop",
    "max_new_tokens": "worker.sampling.max_new_tokens",
    "group_size": "worker.group_size",
    "max_turns": "task.max_turns",
    "max_turn_tokens": "task.max_turn_tokens",
    "model": "model (model.path's config.json and tokenizer files, or the built-in model's settings)",
    "model_dtype": "model.dtype",
    "task": "task (task.name and its prompts)",
}
# the files that say what a Hugging Face checkpoint is without reading its weights
MODEL_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def contract_of(
    worker: WorkerSection, task_cfg: TaskSection, model: str, model_dtype: str, task: Task
) -> GenerationContract:
    """The contract a worker generates under: its sampling settings, the task section (with `task`
    loaded from it), `model` (model_identity) and model.dtype."""
    s = worker.sampling
    return GenerationContract(
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        min_p=s.min_p,
        repetition_penalty=s.repetition_penalty,
        stop=list(s.stop),
        max_new_tokens=s.max_new_tokens,
        group_size=worker.group_size,
        max_turns=task_cfg.max_turns,
        max_turn_tokens=task_cfg.max_turn_tokens or s.max_new_tokens,
        model=model,
        model_dtype=model_dtype,
        task=task_identity(task_cfg.name, task),
    )


def model_identity(engine: str, sim: SimSection, model: ModelSection, builtin_key: Callable[[], str]) -> str:
    """Which model generates (worker.engine, the sim and model sections): see the module docstring.
    `builtin_key` gives the built-in model's cache key (model/dirs.py), asked only without model.path.
    A model directory that cannot be read gets an identity no readable one has (its worker fails
    loading it anyway)."""
    if engine == "sim":
        return f"sim:arms={sim.arms},tokens={sim.tokens_per_sample},params={sim.param_count}"
    if model.path is None:
        return f"builtin:{builtin_key()}"
    return f"hf:{files_digest(Path(model.path).expanduser())}"


def files_digest(root: Path) -> str:
    """sha256 (16 hex digits) of MODEL_FILES present in `root`, each with its name."""
    h = hashlib.sha256()
    try:
        for name in MODEL_FILES:
            f = root / name
            if f.is_file():
                h.update(f"{name}\0".encode())
                h.update(f.read_bytes())
                h.update(b"\0")
    except OSError as exc:
        return f"unreadable({type(exc).__name__})"
    return h.hexdigest()[:16]


def task_identity(name: str, task: Task) -> str:
    return f"{name}:{len(task.items)}:{task.fingerprint()[:16]}"


def first_difference(mine: GenerationContract, run: GenerationContract) -> tuple[str, Any, Any] | None:
    """(the setting, mine, the run's) of the first field in which the contracts differ; None if equal."""
    for field, setting in FIELDS.items():
        a, b = getattr(mine, field), getattr(run, field)
        if a != b:
            return setting, a, b
    return None


def refusal(name: str, mine: GenerationContract | None, run: GenerationContract) -> str | None:
    """The one-line reason to refuse member `name` generating under `mine` in a run under `run`; None: it may."""
    if mine is None:
        return f"{name} sent no generation contract (protocol 4: a worker registers with its settings)"
    diff = first_difference(mine, run)
    if diff is None:
        return None
    setting, a, b = diff
    return (
        f"generation contract: {setting} is {a!r} on {name} but {b!r} in the run "
        f"(start it with the run's config: refused, never adapted)"
    )

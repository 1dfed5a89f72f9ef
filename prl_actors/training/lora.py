"""LoRA on the learner's policy (peft): wrap, what to publish, adapter checkpoints, merged export.

Invariants:
* The base model is frozen in `model.dtype` (bfloat16: 2 bytes per parameter, no gradient, no
  optimizer state); only the adapter's A and B train, in float32 (float64 with a float64 model).
* The reference policy is the same module with the adapter disabled (`PeftModel.disable_adapter`):
  there is no second copy of the model (training/trimodel.py).
* A LoRA checkpoint holds CKPT/adapter (peft's adapter_config.json + adapter_model.safetensors, the
  master float32 adapter) beside trainer_state.pt; the base is `model.path` (or the run's built-in
  model) and never copied. `export_merged` writes base + (alpha / r) B @ A as a plain HF directory.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from prl_actors.model.builtin import from_pretrained, quiet_progress
from prl_actors.model.lora import META, linear_shape, meta_tensor
from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.trainer.config import LoraSection

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
)
ADAPTER_DIR = "adapter"
MERGED_DIR = "merged"
ADAPTER_FILE = "adapter_model.safetensors"


def require_peft() -> None:
    try:
        import peft  # noqa: F401
    except ImportError:
        raise ConfigError("trainer.lora needs peft: pip install 'prl-actors[lora]' (make install has it)") from None


def lora_targets(model: torch.nn.Module, targets: list[str]) -> list[str]:
    """The names of the modules `targets` select (peft's rule: the name, or a suffix after a dot).
    ConfigError when a target selects nothing, or something that is not a linear layer, or a layer
    whose weight is shared (a tied lm_head: adapting it would also change the embedding)."""
    shared = _shared_weights(model)
    chosen = []
    for target in targets:
        hits = [n for n, _ in model.named_modules() if n == target or n.endswith("." + target)]
        if not hits:
            raise ConfigError(f"trainer.lora.target_modules: {target!r} matches no layer; {_linears_hint(model)}")
        for name in hits:
            module = model.get_submodule(name)
            if linear_shape(module) is None:
                kind = type(module).__name__
                raise ConfigError(f"trainer.lora.target_modules: {name} is a {kind}, LoRA here adapts linear layers")
            if id(module.weight) in shared:
                raise ConfigError(f"trainer.lora.target_modules: {name} shares its weight (tied embeddings)")
        chosen += hits
    return sorted(set(chosen))


def _shared_weights(model: torch.nn.Module) -> set[int]:
    seen: dict[int, int] = {}
    for module in model.modules():
        w = getattr(module, "weight", None)
        if isinstance(w, torch.nn.Parameter):
            seen[id(w)] = seen.get(id(w), 0) + 1
    return {k for k, n in seen.items() if n > 1}


def _linears_hint(model: torch.nn.Module) -> str:
    names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if n and linear_shape(m) is not None})
    return f"the model's linear layers are named {', '.join(names)}"


def check_targets(cfg: LoraSection, model_dir: Path | str) -> None:
    """The target check on the model's architecture alone (meta device: no weights loaded), so `up`
    refuses a bad trainer.lora before any actor starts."""
    require_peft()
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device("meta"):
        lora_targets(AutoModelForCausalLM.from_config(config), cfg.target_modules)


def wrap(base: PreTrainedModel, cfg: LoraSection, master: torch.dtype, model_dir: Path, seed: int) -> Any:
    """The policy: `base` (frozen) with a fresh LoRA adapter in `master` dtype: A drawn from `seed`
    (every learner of a run starts from the same adapter), B = 0 (the wrapped model computes exactly
    what `base` does). Eval mode except the adapter's dropout, if any. The adapter records
    `model_dir` (absolute) as its base, for `export_merged`."""
    require_peft()
    from peft import LoraConfig, get_peft_model

    targets = lora_targets(base, cfg.target_modules)
    config = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # typed int, used as a float (alpha / r)
        target_modules=targets,
        lora_dropout=cfg.dropout,
        fan_in_fan_out=type(base.get_submodule(targets[0])).__name__ == "Conv1D",
    )
    with quiet_warnings(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = get_peft_model(base, config)
    policy.peft_config["default"].base_model_name_or_path = str(Path(model_dir).resolve())
    for p in policy.parameters():
        if p.requires_grad:
            p.data = p.data.to(master)
    policy.eval()
    for name, module in policy.named_modules():
        if isinstance(module, torch.nn.Dropout) and ".lora_dropout." in name:
            module.train()
    return policy


@contextmanager
def quiet_warnings() -> Iterator[None]:
    """peft touches transformers attributes that warn (FutureWarning) on every wrap: not the user's to fix."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def adapter_state(policy: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors by peft name (base_model.model.<module>.lora_A.weight, ...)."""
    from peft import get_peft_model_state_dict

    return dict(get_peft_model_state_dict(policy))


def published(policy: Any, cfg: LoraSection, base: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What the workers get: CPU copies of the adapter in `dtype` plus its description (model/lora.py;
    `base`: the base checkpoint's `base_fingerprint`)."""
    out = {name: t.detach().to("cpu", dtype=dtype, copy=True) for name, t in adapter_state(policy).items()}
    targets = list(policy.peft_config["default"].target_modules)
    out[META] = meta_tensor(cfg.r, cfg.alpha, base, sorted(targets))
    return out


def save_adapter(path: Path, policy: Any) -> None:
    """CKPT/adapter: peft's adapter directory (adapter_config.json + adapter_model.safetensors)."""
    with quiet_progress(), quiet_warnings():
        policy.save_pretrained(path / ADAPTER_DIR)


def load_adapter(path: Path, policy: Any) -> None:
    """Restore the adapter's weights from CKPT/adapter in place; names and shapes must match."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = path / ADAPTER_DIR / ADAPTER_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} holds no LoRA adapter ({ADAPTER_DIR}/{ADAPTER_FILE}): not a LoRA checkpoint")
    saved = load_file(str(file))
    expected = adapter_state(policy)
    bad = sorted(set(saved) ^ set(expected)) or [k for k in saved if saved[k].shape != expected[k].shape]
    if bad:
        raise ValueError(f"the adapter in {path} does not fit trainer.lora (e.g. {bad[:3]})")
    set_peft_model_state_dict(policy, saved)


def export_merged(checkpoint: Path, out: Path, base_dir: Path | None = None) -> Path:
    """A plain HF model directory at `out`: the base with the checkpoint's adapter merged in
    (W + (alpha / r) B @ A), loadable by `AutoModelForCausalLM.from_pretrained` without peft.
    The base is `base_dir`, else the one the adapter records (the trainer's model directory)."""
    from peft import PeftModel

    adapter = Path(checkpoint) / ADAPTER_DIR
    if not (adapter / ADAPTER_FILE).is_file():
        raise FileNotFoundError(f"{checkpoint} holds no LoRA adapter ({ADAPTER_DIR}/{ADAPTER_FILE})")
    base_dir = Path(base_dir) if base_dir is not None else _recorded_base(adapter)
    base = from_pretrained(base_dir, dtype="auto")
    with quiet_warnings():
        merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    with quiet_progress():
        merged.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (base_dir / name).is_file():
            shutil.copy2(base_dir / name, Path(out) / name)
    return Path(out)


def _recorded_base(adapter: Path) -> Path:
    import json

    recorded = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not recorded or not (Path(recorded) / "config.json").is_file():
        raise FileNotFoundError(f"the base model the adapter records ({recorded!r}) is not here: pass --base DIR")
    return Path(recorded)

"""Models: the built-in tiny causal LM (char-level tokenizer, warm-started on `add`) and loading helpers.

Nothing here ever downloads: a user model is a local Hugging Face directory (`model.path`).

The names below are imported on first use (module `__getattr__`), not with the package: a submodule
that needs neither torch nor the model classes (`prl_actors.model.tokenizer`, which `up`'s task check
imports before any actor starts) then loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prl_actors.model.builtin import load_model, prepare_model
    from prl_actors.model.tokenizer import load_tokenizer

__all__ = ["load_model", "load_tokenizer", "prepare_model"]
_HOME = {"load_model": "builtin", "prepare_model": "builtin", "load_tokenizer": "tokenizer"}


def __getattr__(name: str) -> Any:
    """`from prl_actors.model import prepare_model`: its module is imported now, once."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value

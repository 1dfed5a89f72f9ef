"""Models: the built-in tiny causal LM (char-level tokenizer, warm-started on `add`) and loading helpers.

Nothing here ever downloads: a user model is a local Hugging Face directory (`model.path`).
"""

from __future__ import annotations

from prl_actors.model.builtin import load_model, prepare_model
from prl_actors.model.tokenizer import load_tokenizer

__all__ = ["load_model", "load_tokenizer", "prepare_model"]

"""An error both the model layer (LoRA adapters) and the engines raise: a leaf, so neither imports the other."""

from __future__ import annotations


class IncompatibleWeights(ValueError):
    """Weights that cannot be this engine's next version (names, shapes, or a LoRA adapter trained on
    another base model): `load_weights` raises it before changing anything, and the worker stops with
    it as its one-line error (retrying the same fetch could never succeed)."""

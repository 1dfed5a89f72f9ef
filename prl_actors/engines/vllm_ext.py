"""The worker extension the vLLM engine registers: runs inside vLLM's worker processes.

`VllmEngine` builds `vllm.LLM(..., worker_extension_cls=EXTENSION)`; vLLM then mixes
`PrlWorkerExtension` into its worker class, so `llm.collective_rpc(LOAD_METHOD, args=(path,))` calls
`prl_load_weights(path)` on every worker by *name*: no Python function is pickled and
VLLM_ALLOW_INSECURE_SERIALIZATION stays off (the pattern of vLLM's RLHF examples,
examples/offline_inference/rlhf_utils.py). The only argument is a file path and the only result an int,
both plain msgpack types.

This module imports neither vLLM nor anything of prl-actors beyond safetensors, so vLLM can import it
in its worker processes cheaply. Method names carry a `prl_` prefix: vLLM refuses an extension
whose attributes collide with the worker's own (vLLM 0.32's worker already has `update_weights`).
"""

from __future__ import annotations

from typing import Any

EXTENSION = "prl_actors.engines.vllm_ext.PrlWorkerExtension"
LOAD_METHOD = "prl_load_weights"


class PrlWorkerExtension:
    """Mixed into vLLM's worker class (`self` is the worker: it has `reload_weights`)."""

    reload_weights: Any

    def prl_load_weights(self, path: str) -> int:
        """Copy every tensor of the safetensors file at `path` into the model, in place, and return
        how many there were. The tensors are in checkpoint format (Hugging Face names); vLLM's own
        in-place reload maps them onto its fused q/k/v and gate/up parameters, casts them to the
        model's dtype and re-runs its post-load processing (vLLM's CPU build repacks linear weights
        into kernel layouts after loading: a plain `model.load_weights` then finds empty parameters)."""
        from safetensors import safe_open

        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())
            self.reload_weights(weights_iterator=((name, f.get_tensor(name)) for name in names))
        return len(names)

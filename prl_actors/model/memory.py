"""What fits where: parameter counts and memory of the trainer and a worker, computed from the real
architectures' config values (written here; nothing is downloaded).

    python -m prl_actors.model.memory            # the tables of docs/MEMORY.md

Bytes per parameter (bf16 compute with fp32 master weights and AdamW, the usual mixed precision):

    policy weights (bf16)            2      the copy forward/backward run on
    gradients (bf16)                 2      of that copy
    fp32 master weights              4      what the optimizer updates (then cast to bf16)
    AdamW moments m, v (fp32)        8
    reference policy (bf16)          2      only with trainer.beta > 0
    = 16 per parameter for full fine-tuning, 18 with a reference copy.

With LoRA the base stays frozen in bf16 (2 bytes/param, no gradient, no optimizer state), only the
adapter trains (fp32 weights, gradients and moments: 16 bytes per adapter parameter), and the
reference is the base with the adapter disabled: no second copy. Activations are not included: they
scale with the tokens of a micro-batch; the logits alone take `vocab x 2` bytes per token in bf16
(and as much again for their gradient), listed per 1k tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
DEVICES_MIB = {"RTX 4090 24GB": 24564, "A100 40GB": 40960, "H100 80GB": 81559, "H200 141GB": 143771}
"""Total memory as nvidia-smi reports it (MiB); the CUDA context and allocator take some of it."""
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Arch:
    """The config values that determine a Qwen2/Llama/Mistral-style decoder's parameter count."""

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    qkv_bias: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each projection of one decoder layer."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, self.intermediate),
            "up_proj": (h, self.intermediate),
            "down_proj": (self.intermediate, h),
        }


# From the checkpoints' config.json (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, tie_word_embeddings; Qwen2 has q/k/v biases).
QWEN25 = {
    "0.5B": Arch("Qwen2.5-0.5B", 151936, 896, 4864, 24, 14, 2, tied=True, qkv_bias=True),
    "1.5B": Arch("Qwen2.5-1.5B", 151936, 1536, 8960, 28, 12, 2, tied=True, qkv_bias=True),
    "7B": Arch("Qwen2.5-7B", 152064, 3584, 18944, 28, 28, 4, tied=False, qkv_bias=True),
}


def param_count(a: Arch) -> int:
    """Embedding + layers (projections, q/k/v biases, two RMSNorms) + final norm + untied head."""
    kv = a.kv_heads * a.head_dim
    projections = sum(i * o for i, o in a.linears().values())
    biases = (a.hidden + 2 * kv) if a.qkv_bias else 0
    per_layer = projections + biases + 2 * a.hidden
    head = 0 if a.tied else a.vocab * a.hidden
    return a.vocab * a.hidden + a.layers * per_layer + a.hidden + head


def lora_param_count(a: Arch, r: int, targets: tuple[str, ...] = LORA_TARGETS) -> int:
    """LoRA adds A [r, in] and B [out, r] to every targeted projection of every layer."""
    return a.layers * sum(r * (i + o) for name, (i, o) in a.linears().items() if name in targets)


@dataclass(frozen=True)
class Budget:
    """Bytes of each trainer component for one setup (None = not present)."""

    setup: str
    weights: int
    grads: int
    master: int
    adam: int
    reference: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.master + self.adam + self.reference


def full_budget(a: Arch, reference: bool) -> Budget:
    p = param_count(a)
    return Budget("full" + (" + reference" if reference else ""), 2 * p, 2 * p, 4 * p, 8 * p, 2 * p if reference else 0)


def lora_budget(a: Arch, r: int) -> Budget:
    """Base frozen in bf16; the adapter's fp32 weights, grads, moments; reference = adapter off."""
    p, n = param_count(a), lora_param_count(a, r)
    return Budget(f"LoRA r={r} (+ reference, free)", 2 * p + 4 * n, 4 * n, 0, 8 * n, 0)


def kv_cache_bytes_per_token(a: Arch) -> int:
    """bf16 K and V of every layer for one token (what a worker needs per generated token)."""
    return 2 * a.layers * a.kv_heads * a.head_dim * 2


VOCAB_CHUNK_TOKEN_BYTES = 3 * 8192 * 4
"""Per token, the chunked head's working set: logits, their exp and their gradient, one 8192-row
chunk in float32 (training/device_forward.py)."""
BUDGET_MIN, BUDGET_MAX = 1024, 1 << 20
"""Bounds of the memory-derived micro-batch (a group always trains whole, whatever the budget)."""


def activation_bytes_per_token(
    hidden: int, intermediate: int, layers: int, compute_bytes: int, checkpointing: bool = False
) -> int:
    """What one token of a micro-batch holds for the backward (an upper estimate).

    Per decoder layer the backward keeps the inputs of the projections and of the MLP's product:
    ~10 x hidden (norms, q/k/v/o inputs and outputs, attention output, residuals) plus 4 x
    intermediate (gate and up outputs, their activation and product) in the compute dtype, and the
    RMSNorms' float32 copies (2 x 2 x hidden x 4 bytes). With gradient checkpointing a layer keeps
    only its input, plus one layer's full set while it is recomputed. Plus the chunked head's set."""
    per_layer = (10 * hidden + 4 * intermediate) * compute_bytes + 16 * hidden
    held = layers * hidden * compute_bytes + per_layer if checkpointing else layers * per_layer
    return held + VOCAB_CHUNK_TOKEN_BYTES


def token_budget(free_bytes: int, reserved_bytes: int, per_token_bytes: int, fraction: float = 0.7) -> int:
    """Tokens of one micro-batch: `fraction` of the device's free memory, less what is still to be
    allocated (`reserved_bytes`: gradients and optimizer state, created at the first backward and
    step), divided by the bytes a token holds; within [BUDGET_MIN, BUDGET_MAX]."""
    usable = fraction * free_bytes - reserved_bytes
    return max(BUDGET_MIN, min(BUDGET_MAX, int(usable // max(per_token_bytes, 1))))


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def params_table() -> str:
    rows = [
        "| model | parameters | bf16 weights GiB | LoRA r=16 params | KV cache MiB / 1k tok | logits MiB / 1k tok |"
    ]
    rows.append("|---|---:|---:|---:|---:|---:|")
    for a in QWEN25.values():
        p = param_count(a)
        kv, logits = kv_cache_bytes_per_token(a) * 1000 / 2**20, a.vocab * 2 * 1000 / 2**20
        rows.append(f"| {a.name} | {p:,} | {gib(2 * p)} | {lora_param_count(a, 16):,} | {kv:.1f} | {logits:.0f} |")
    return "\n".join(rows)


def trainer_table(r: int = 16) -> str:
    head = "| model | setup | weights | grads | fp32 master | AdamW | reference | total | " + " | ".join(DEVICES_MIB)
    rows = [head + " |", "|---|---|" + "---:|" * 6 + ":---:|" * len(DEVICES_MIB)]
    for a in QWEN25.values():
        for b in (full_budget(a, False), full_budget(a, True), lora_budget(a, r)):
            parts = " | ".join(gib(x) for x in (b.weights, b.grads, b.master, b.adam, b.reference))
            fits = " | ".join(_fit(b.total, mib) for mib in DEVICES_MIB.values())
            rows.append(f"| {a.name} | {b.setup} | {parts} | **{gib(b.total)}** | {fits} |")
    return "\n".join(rows)


def _fit(total: int, device_mib: int) -> str:
    """'no', or the GiB left for activations (logits, attention, framework overhead)."""
    left = (device_mib * 2**20 - total) / GIB
    return "no" if left <= 0 else f"{left:.0f} left"


def worker_table() -> str:
    rows = ["| model | weights GiB | KV cache GiB for 64 x 1k tokens |", "|---|---:|---:|"]
    for a in QWEN25.values():
        rows.append(f"| {a.name} | {gib(2 * param_count(a))} | {gib(kv_cache_bytes_per_token(a) * 64 * 1000)} |")
    return "\n".join(rows)


def render() -> str:
    return "\n\n".join(
        [
            "### Parameters\n\n" + params_table(),
            "### Trainer: static memory in GiB, and per device the GiB left for activations\n\n" + trainer_table(),
            "### Inference worker (bf16)\n\n" + worker_table(),
        ]
    )


if __name__ == "__main__":
    print(render())

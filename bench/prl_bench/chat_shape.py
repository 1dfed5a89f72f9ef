"""The realistic shape of the e2e benchmark, and the plain Hugging Face loop it is compared with.

Shape: chat-templated GSM8K-style prompts (the math task's sample, ChatML, a system prompt) of
~100-200 tokens, G = 8, up to 256 new tokens, on random-init Qwen2-family checkpoints built here
(never downloaded): the byte-level BPE tokenizer and ChatML template of `prl_actors.model.tiny`'s
qwen2 family (vocab 384), GQA, tied embeddings, sized by `CHAT_MODELS`.

Varied lengths, honestly: a random-init model almost never samples its end-of-turn token (1 in 384),
so every answer would run to the cap and every group finish together. `build_chat_model` raises
the end-of-turn logit along the mean direction of the model's final hidden states (the tied
embedding row of <|im_end|>), by the amount that makes its average probability `EOS_RATE` per token
on the prompts (bisection, seeded): answer lengths are then roughly geometric, mean ~100, capped at
256, different in every sample, so groups finish at different times. The bench reports the lengths
it got.

The plain HF loop (`HFLoop`) is what a user's own script or a mainstream single-process trainer
does per step: `model.generate` on the left-padded batch (B x G rows, sampling), then one padded
forward/backward over all rows [prompt | completion] (policy with grad, reference under no_grad),
the same GRPO loss (group-normalised advantages, PPO-clip with the strict on-policy ratio, k3 KL,
summed over completion tokens / their count), one AdamW step; gradient checkpointing off or on.
"""

from __future__ import annotations

import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHAT_MODELS = {  # name -> (hidden, layers, heads, kv heads); intermediate 2 x hidden, as the tiny family
    "chat-h128-L4": (128, 4, 4, 2),  # 0.64M parameters
    "chat-h256-L6": (256, 6, 8, 4),  # 2.9M parameters
}
EOS_RATE = 1 / 110
MAX_NEW_TOKENS = 256
SYSTEM_PROMPT = (
    "You are a careful math tutor. Read the problem, reason step by step in short sentences, "
    "and give the final answer as a number after ####."
)


def chat_settings(groups: int, max_new_tokens: int = MAX_NEW_TOKENS) -> dict[str, Any]:
    """Config overrides of the realistic shape (model.path is added by the caller)."""
    return {
        "coordinator.groups_per_epoch": groups,
        "worker.group_size": 8,
        "worker.sampling.max_new_tokens": max_new_tokens,
        "trainer.beta": 0.02,
        "trainer.checkpoint_every": 0,
        "task.name": "math",
        "task.chat_template": True,
        "task.system_prompt": SYSTEM_PROMPT,
    }


def build_chat_model(shape: str, out_dir: Path, seed: int = 0) -> Path:
    """A random-init Qwen2 checkpoint of `shape` with the tiny qwen2 tokenizer and an end-of-turn
    bias calibrated to EOS_RATE (see module docstring). Deterministic in `seed`; reused if present."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from prl_actors.model.builtin import quiet_progress
    from prl_actors.model.tiny import SPECS, build_tokenizer, token_id

    if (out_dir / "prl_chat_shape.json").is_file():
        return out_dir
    hidden, layers, heads, kv = CHAT_MODELS[shape]
    spec = SPECS["qwen2"]
    tok = build_tokenizer(spec)
    eos, pad = token_id(tok, "<|im_end|>"), token_id(tok, "<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=True,
        max_position_embeddings=1024, eos_token_id=eos, pad_token_id=pad,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    calibrate_eos(model, tok, eos)
    model.generation_config.eos_token_id = [eos, pad]
    model.generation_config.pad_token_id = pad
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_progress():
        model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    (out_dir / "prl_chat_shape.json").write_text(json.dumps({"shape": shape, "eos_rate": EOS_RATE, "seed": seed}))
    return out_dir


def calibrate_eos(model: Any, tok: Any, eos: int) -> None:
    """Add beta * u to the end-of-turn embedding row (u: the unit mean final hidden state over the
    prompts followed by random tokens), beta bisected so mean p(eos) = EOS_RATE; on the model's own
    device (shift_eos)."""
    import torch

    from prl_actors.tasks.math_task import sample_path

    gen = torch.Generator().manual_seed(0)
    texts = [json.loads(line)["question"] for line in Path(sample_path()).read_text().splitlines() if line.strip()]
    rows = []
    for text in texts[:16]:
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        rows.append(prompt + torch.randint(0, len(tok), (128,), generator=gen).tolist())
    shift_eos(model, rows, eos)


def shift_eos(model: Any, rows: list[list[int]], eos: int, rate: float = EOS_RATE) -> float:
    """Add beta x u to the LM head's `eos` row (u: the unit mean final hidden state over `rows`), beta
    bisected so the mean p(eos) over those positions is `rate`; on the model's own device. Returns beta."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        hs = torch.cat([model.model(input_ids=torch.tensor([r], device=device)).last_hidden_state[0] for r in rows])
        hs = hs.float()  # [M, h]
        weight = model.get_output_embeddings().weight  # [V, h] (tied to the input embeddings)
        u = hs.mean(0) / hs.mean(0).norm()
        base, along = hs @ weight.float().T, hs @ u  # [M, V], [M]
        lo, hi = -100.0, 100.0
        for _ in range(60):
            beta = (lo + hi) / 2
            logits = base.clone()
            logits[:, eos] += beta * along
            p_eos = float(torch.softmax(logits, -1)[:, eos].mean())
            lo, hi = (beta, hi) if p_eos < rate else (lo, beta)
        beta = (lo + hi) / 2
        weight[eos] += (beta * u).to(weight.dtype)
    return beta


# --- the plain Hugging Face loop ---------------------------------------------------------------------


class HFLoop:
    """generate (HF, padded) -> one padded forward/backward with the GRPO loss -> AdamW step."""

    def __init__(self, cfg: Any, model_dir: Path, checkpointing: bool) -> None:
        import torch

        from prl_actors.launch import build
        from prl_actors.model.builtin import load_model
        from prl_actors.model.tokenizer import load_tokenizer

        self.cfg = cfg
        self.model = load_model(model_dir)
        self.reference = copy.deepcopy(self.model).requires_grad_(False)
        self.checkpointing = checkpointing
        if checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.tok = load_tokenizer(model_dir)
        self.task = build.task(cfg)
        self.B, self.G = cfg.coordinator.groups_per_epoch, cfg.worker.group_size
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.trainer.lr, weight_decay=0.0)
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.pad = int(self.tok.pad_token_id)

    def generate(self, it: int) -> tuple[list[Any], list[list[int]], list[list[int]]]:
        """(prompts, prompt ids per row, completion ids per row incl. the stop token)."""
        import torch

        from prl_actors.engines.sampling import left_pad
        from prl_actors.model.tokenizer import encode_prompt

        prompts = self.task.prompts_for_epoch(it, self.B)
        rows = [encode_prompt(self.tok, p.prompt, self.cfg.task.chat_template) for p in prompts for _ in range(self.G)]
        ids, mask = left_pad(rows, self.pad)
        self.model.eval()
        with torch.no_grad():
            seqs = self.model.generate(  # type: ignore[operator]
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                max_new_tokens=self.cfg.worker.sampling.max_new_tokens,
                pad_token_id=self.pad,
                top_k=0,  # the full distribution, as the engine samples (HF defaults to 50)
            )
        completions = []
        for row in seqs[:, ids.shape[1] :].tolist():
            stop = next((i for i, t in enumerate(row) if t in self.eos), None)
            completions.append(row if stop is None else row[: stop + 1])
        return prompts, rows, completions

    def train(self, prompts: list[Any], rows: list[list[int]], completions: list[list[int]]) -> dict[str, float]:
        """One padded forward/backward over every row (prompt left-padded, completion right-padded),
        the GRPO loss, one optimizer step. Returns seconds and token counts."""
        import torch

        from prl_actors.training.losses import group_advantages, k3_kl, ppo_clip_loss

        t0 = time.perf_counter()
        texts = [str(self.tok.decode(c, skip_special_tokens=True)) for c in completions]
        rewards = [self.task.score(prompts[i // self.G], t) for i, t in enumerate(texts)]
        adv = torch.cat(
            [group_advantages(torch.tensor(rewards[g * self.G : (g + 1) * self.G])) for g in range(self.B)]
        ).float()  # [B*G]
        p_max, c_max = max(map(len, rows)), max(1, max(map(len, completions)))
        n = len(rows)
        ids = torch.full((n, p_max + c_max), self.pad, dtype=torch.long)  # [R, T]
        mask = torch.zeros((n, p_max + c_max), dtype=torch.long)
        comp_mask = torch.zeros((n, c_max))  # [R, C]
        for i, (p, c) in enumerate(zip(rows, completions, strict=True)):
            ids[i, p_max - len(p) : p_max] = torch.tensor(p)
            ids[i, p_max : p_max + len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, p_max - len(p) : p_max + len(c)] = 1
            comp_mask[i, : len(c)] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [R, T]
        targets = ids[:, p_max:]  # [R, C]

        def logp(model: Any) -> torch.Tensor:
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
            logits = logits[:, p_max - 1 : -1]  # [R, C, V]
            return torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).squeeze(-1)  # [R, C]

        t1, c1 = time.perf_counter(), time.process_time()
        self.model.train(self.checkpointing)  # HF checkpoints only in train mode (no dropout in Qwen2)
        with torch.no_grad():
            ref = logp(self.reference)
        policy = logp(self.model)
        pg, _ = ppo_clip_loss(policy, policy.detach(), adv[:, None].expand_as(policy), 0.2, 0.2)
        per_token = pg + self.cfg.trainer.beta * k3_kl(policy, ref)
        loss = (per_token * comp_mask).sum() / comp_mask.sum()
        loss.backward()
        t2, c2 = time.perf_counter(), time.process_time()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        return {
            "prep_s": t1 - t0,
            "train_s": t2 - t1,
            "train_cpu_s": c2 - c1,
            "step_s": t3 - t2,
            "tokens": float(comp_mask.sum()),
            "padded_tokens": float(ids.numel()),
        }

    def iteration(self, it: int) -> dict[str, float]:
        t0 = time.perf_counter()
        prompts, rows, completions = self.generate(it)
        gen = time.perf_counter() - t0
        out = self.train(prompts, rows, completions)
        lengths = [len(c) for c in completions]
        return {
            "gen_s": gen,
            **out,
            "wall_s": time.perf_counter() - t0,
            "prompt_len": statistics.mean(map(len, rows)),
            "len_mean": statistics.mean(lengths),
            "len_p10": sorted(lengths)[len(lengths) // 10],
            "len_p90": sorted(lengths)[9 * len(lengths) // 10],
        }


def hf_worker(cfg_json: str, model_dir: str, threads: int, iters: int, checkpointing: bool) -> dict[str, Any]:
    """One HF-loop measurement in its own process."""
    import torch

    from prl_actors.config import load_config

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    loop = HFLoop(load_config(None, json.loads(cfg_json)), Path(model_dir), checkpointing)
    rows = [loop.iteration(it) for it in range(iters)]
    steady = rows[1:] or rows
    return {"rows": rows, **{k: statistics.median(r[k] for r in steady) for k in rows[0]}}


def measure_hf(
    settings_: dict[str, Any], model_dir: Path, threads: int, iters: int, checkpointing: bool
) -> dict[str, Any]:
    code = (
        "import json, sys; from prl_bench.chat_shape import hf_worker; "
        "print(json.dumps(hf_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == '1')))"
    )
    args = [json.dumps(settings_), str(model_dir), str(threads), str(iters), "1" if checkpointing else "0"]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"HF loop failed: {out.stderr[-1500:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))

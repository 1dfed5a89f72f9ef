"""configs/tools.yaml through the five actors, as its header says to run it (`up`, 2 epochs): the
buffer accepts the episodes (their prompt ids are the environment's reset rendered by the chat
template, not the row's text: before, every group was refused as wrong_prompt and the run failed),
the model's tool calls are answered by the calculator inside the episode, and `replay --check` is
green; the epoch metrics count the episodes' turns and tool calls, and `replay --completions` shows
each turn with its role and whether it was trained. The tiny random checkpoint is first taught to
write one calculator call (a few seconds of supervised steps), so the episodes really call the tool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import port_base

pytestmark = pytest.mark.e2e  # the episodes' prompt ids: test_multiturn (fast); `up` with episodes: test_multiturn_e2e
ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "prl_actors.cli.main"]
ROLES = ["assistant", "environment"]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'


def tool_caller(path: Path) -> Path:
    """A tiny Qwen2 chat checkpoint that answers every prompt of configs/tools.yaml with CALL."""
    from transformers import AutoModelForCausalLM

    from prl_actors.config import load_config
    from prl_actors.envs_llm.registry import episode_prompt_ids
    from prl_actors.launch import build
    from prl_actors.model.tiny import build_family
    from prl_actors.model.tokenizer import load_tokenizer

    build_family("qwen2", path)
    tok, model = load_tokenizer(path), AutoModelForCausalLM.from_pretrained(path)
    cfg = load_config(ROOT / "configs/tools.yaml", {"model.path": str(path)})
    task = build.task(cfg)
    render = episode_prompt_ids(cfg.task, tok, task.reward)
    target = tok(CALL + "<|im_end|>", add_special_tokens=False).input_ids
    rows = [render(p) for p in task.prompts_for_epoch(0, 4)]
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, mask, picks = _batch(rows, target)
    for _ in range(100):
        logits = model(x, attention_mask=mask).logits  # [R, T, V]
        loss = torch.nn.functional.cross_entropy(logits[picks[0], picks[1] - 1], x[picks[0], picks[1]])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.config.max_position_embeddings = 1024  # rotary: room for the ~450-token prompt (tools' schemas) and turns
    model.save_pretrained(path)
    return path


def _batch(rows: list[list[int]], target: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every prompt + target in one right-padded batch: ids [R, T], attention mask [R, T], and the
    (row, position) of every target token [2, R * len(target)]."""
    width = max(len(r) for r in rows) + len(target)
    x = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    picks = []
    for i, prompt in enumerate(rows):
        seq = prompt + target
        x[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
        picks += [(i, len(prompt) + j) for j in range(len(target))]
    return x, mask, torch.tensor(picks).T


def test_tools_config_trains_through_the_actors_with_tool_calls(tmp_path: Path) -> None:
    model, run_dir = tool_caller(tmp_path / "qwen2"), tmp_path / "run"
    sets = {
        "model.path": model,
        "run.run_dir": run_dir,
        "transport.base_port": port_base(),
        "coordinator.groups_per_epoch": 2,
        "worker.group_size": 2,
        "task.max_turns": 2,
        "task.max_turn_tokens": 72,
        "run.log_completions": 4,
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    up = subprocess.run(
        [*CLI, "up", "--config", str(ROOT / "configs/tools.yaml"), "--epochs", "2", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    said = up.stdout + up.stderr
    assert up.returncode == 0, said[-3000:]
    assert "wrong_prompt" not in said and "done: 2 epochs" in said
    check = subprocess.run([*CLI, "replay", str(run_dir), "--check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout[-3000:]
    rows = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    called = [r for r in rows if "calculator" in r["completion"] and "42" in r["completion"]]
    assert called, [r["completion"] for r in rows]  # the model called the tool and read its answer (6*7)
    assert all(r["episode"]["tool_calls"] >= 1 and [t["role"] for t in r["turns"]][:2] == ROLES for r in called)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["episode/tool_calls"] > 0 and m["episode/turns"] >= 1 for m in metrics if "epoch" in m), metrics
    shown = subprocess.run([*CLI, "replay", str(run_dir), "--completions"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "[assistant   trained" in shown.stdout and "[environment not trained" in shown.stdout
    assert r"<|im_start|>tool\n42<|im_end|>" in shown.stdout  # the tool's answer, decoded with its role header

"""run.log_completions: N trained samples per epoch to RUN_DIR/completions.jsonl, for reading what the
model writes (`prl-actors replay RUN --completions [--epoch E]`).

The trainer picks them as groups arrive (a few JSON lines per epoch, no tensor work): from each group
up to max(1, N // B) samples, until the epoch has N. Each row: epoch, version, group_id, sample index,
prompt, completion, reward, advantage (GRPO's group advantage, training/losses.group_advantages), and
the worker that generated it. A multi-turn episode's row also has `episode` (turns, tool_calls,
tool_errors) and `turns`: the episode cut where the loss mask changes, in order, each segment
{"role": "assistant" (the model's tokens, trained) | "environment" (observation / tool tokens, in
the context, never trained), "trained": bool, "ids": [token ids]}. The trainer has no tokenizer, so
`replay --completions` decodes the segments with the run's (the chat template's role headers show
which message each environment segment is).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from prl_actors.records.rundir import COMPLETIONS_FILE
from prl_actors.training.losses import group_advantages

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Group, Sample

FILE = COMPLETIONS_FILE  # RUN_DIR/completions.jsonl (records/rundir.py writes it: RunDir.completions)


class CompletionPicker:
    """Chooses which samples of an epoch to log; `rows(...)` returns the rows to write now."""

    def __init__(self, per_epoch: int) -> None:
        self.per_epoch = per_epoch
        self.epoch, self.taken = -1, 0

    def rows(self, epoch: int, version: int, groups_in_epoch: int, group: Group) -> list[dict[str, Any]]:
        if epoch != self.epoch:
            self.epoch, self.taken = epoch, 0
        left = self.per_epoch - self.taken
        if left <= 0 or not group.samples:
            return []
        n = min(left, max(1, self.per_epoch // max(1, groups_in_epoch)), len(group.samples))
        adv = group_advantages(torch.tensor([s.reward for s in group.samples], dtype=torch.float64))  # [G]
        self.taken += n
        return [
            {
                "epoch": epoch,
                "version": version,
                "group_id": group.group_id,
                "sample": i,
                "prompt": group.prompt,
                "completion": group.samples[i].text,
                "reward": group.samples[i].reward,
                "advantage": round(float(adv[i]), 6),
                "worker": group.worker,
                **_episode(group.samples[i]),
            }
            for i in range(n)
        ]


def _episode(sample: Sample) -> dict[str, Any]:
    """A multi-turn sample's `episode` counts and `turns` (module docstring); {} for a single-turn one."""
    if sample.episode is None and not sample.loss_mask:
        return {}
    out: dict[str, Any] = {"turns": segments(sample.token_ids, sample.model_mask())}
    if sample.episode is not None:
        e = sample.episode
        out["episode"] = {"turns": e.turns, "tool_calls": e.tool_calls, "tool_errors": e.tool_errors}
    return out


def segments(ids: list[int], mask: list[int]) -> list[dict[str, Any]]:
    """`ids` cut into runs of one mask value: the model's (1, trained) and the environment's (0)."""
    out: list[dict[str, Any]] = []
    for token, m in zip(ids, mask, strict=True):
        if not out or out[-1]["trained"] != bool(m):
            out.append({"role": "assistant" if m else "environment", "trained": bool(m), "ids": []})
        out[-1]["ids"].append(token)
    return out


def read(run_dir: Path | str, epoch: int | None = None) -> list[dict[str, Any]]:
    path = Path(run_dir) / FILE
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if epoch is None or r.get("epoch") == epoch]


def render(rows: list[dict[str, Any]], decode: Callable[[list[int]], str] | None = None) -> str:
    """Readable text: one block per epoch, one line per sample; a multi-turn sample's line is followed
    by one line per turn (role, trained or not, tokens, and its text when `decode` is given: the
    run's tokenizer, special tokens kept so the template's role headers show)."""
    out: list[str] = []
    last = None
    for r in rows:
        if r["epoch"] != last:
            last = r["epoch"]
            out.append(f"== epoch {r['epoch']} (v{r['version']})")
        e = r.get("episode")
        counts = f"  turns {e['turns']} tool calls {e['tool_calls']} errors {e['tool_errors']}" if e else ""
        head = f"  group {r['group_id']:>3} #{r['sample']}  reward {r['reward']:+.3f}  adv {r['advantage']:+.3f}"
        if "turns" not in r:
            out.append(f"{head}  {r['prompt']!r} -> {r['completion']!r}")
            continue
        out.append(f"{head}{counts}  {r['prompt']!r}")
        out += [_turn(t, decode) for t in r["turns"]]
    return "\n".join(out)


def _turn(t: dict[str, Any], decode: Callable[[list[int]], str] | None) -> str:
    what = "trained" if t["trained"] else "not trained"
    label = f"      [{t['role']:<11} {what:<11} {len(t['ids']):>4} tokens]"
    return f"{label}  {decode(t['ids'])!r}" if decode is not None else label


def wants_tokenizer(rows: list[dict[str, Any]]) -> bool:
    """Some row holds turns (token ids that `render` shows as text with the run's tokenizer)."""
    return any("turns" in r for r in rows)

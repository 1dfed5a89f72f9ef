"""run.log_completions: N trained samples per epoch to RUN_DIR/completions.jsonl, for reading what the
model writes (`prl-actors replay RUN --completions [--epoch E]`).

The trainer picks them as groups arrive (a few JSON lines per epoch, no tensor work): from each group
up to max(1, N // B) samples, until the epoch has N. Each row: epoch, version, group_id, sample index,
prompt, completion, reward, advantage (GRPO's group advantage, training/losses.group_advantages), and
the worker that generated it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from prl_actors.protocol.messages import Group
from prl_actors.rundir import COMPLETIONS_FILE
from prl_actors.training.losses import group_advantages

FILE = COMPLETIONS_FILE  # RUN_DIR/completions.jsonl (rundir.py writes it: RunDir.completions)


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
            }
            for i in range(n)
        ]


def read(run_dir: Path | str, epoch: int | None = None) -> list[dict[str, Any]]:
    path = Path(run_dir) / FILE
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if epoch is None or r.get("epoch") == epoch]


def render(rows: list[dict[str, Any]]) -> str:
    """Readable text: one block per epoch, one line per sample."""
    out: list[str] = []
    last = None
    for r in rows:
        if r["epoch"] != last:
            last = r["epoch"]
            out.append(f"== epoch {r['epoch']} (v{r['version']})")
        out.append(
            f"  group {r['group_id']:>3} #{r['sample']}  reward {r['reward']:+.3f}  adv {r['advantage']:+.3f}  "
            f"{r['prompt']!r} -> {r['completion']!r}"
        )
    return "\n".join(out)

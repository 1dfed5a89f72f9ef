"""The console of `up` (issue 40, item 4): a first line before any heavy import, the epoch line's
learning metrics, progress inside a long epoch without a terminal, and the curves' panels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prl_actors.launch.up import LongEpochNotes
from prl_actors.records.curves import draw_curves
from prl_actors.records.rundir import epoch_line

ROW = {
    "epoch": 3,
    "version": 4,
    "reward_mean": 0.4375,
    "accuracy": 0.4375,
    "loss": 0.0605,
    "kl": 0.0012,
    "grad_norm": 2.38,
    "clip_frac": 0.01,
    "response_len": 3.06,
    "zero_adv_share": 0.125,
    "gen_s": 0.088,
    "train_s": 0.033,
    "wall_s": 0.110,
    "samples_per_s": 584.4,
}

# What `up` has imported when it prints its first line: up's _config (its first step after the line)
# is replaced by a probe that prints whether torch / transformers are loaded, then stops the command.
PROBE = """
import sys
import prl_actors.cli.main
import prl_actors.cli.up_cmd as up
def probe(*a, **k):
    print("heavy:", "torch" in sys.modules, "transformers" in sys.modules, file=sys.stderr, flush=True)
    raise SystemExit(0)
up._config = probe
sys.argv = ["prl-actors", "up"]
prl_actors.cli.main.main()
"""


def test_first_line_comes_before_any_heavy_import() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=30)
    lines = out.stderr.splitlines()
    assert lines[0].startswith("up: starting from the built-in defaults"), out.stderr
    assert lines[1] == "heavy: False False", out.stderr


def test_epoch_line_carries_the_learning_metrics_and_the_time() -> None:
    line = epoch_line(ROW)
    for part in ("reward=0.438", "loss=0.0605", "kl=0.0012", "grad=2.380", "clip=0.010", "len=3.1", "zero_adv=0.125"):
        assert part in line, line
    assert line.endswith("| 0.11s (gen 0.09 train 0.03) 584 samples/s")
    more = epoch_line(ROW | {"clip_frac_low": 0.002, "clip_frac_high": 0.03, "entropy": 1.25})
    assert "clip_lo=0.002" in more and "clip_hi=0.030" in more and "ent=1.250" in more
    assert epoch_line({"epoch": 0, "version": 1}).startswith("epoch   0  v1")  # nothing else: no error
    turns = epoch_line(ROW | {"episode/turns": 2.5, "episode/tool_calls": 1.25, "episode/tool_errors": 0.5})
    assert "turns=2.50" in turns and "tools=1.25" in turns and "tool_err=0.50" in turns  # multi-turn runs


def test_long_epoch_notes_only_for_long_epochs() -> None:
    notes = LongEpochNotes(every_s=10.0)
    assert notes.line(0.0, 0, 5, 0, 8, 2) is None  # a new epoch: nothing yet
    assert notes.line(4.0, 0, 5, 3, 8, 2) is None
    assert notes.line(11.0, 0, 5, 5, 8, 2) == "  epoch 0/5: 5/8 groups done, 2 workers, 11s in"
    assert notes.line(15.0, 0, 5, 6, 8, 2) is None  # not again before every_s more
    assert notes.line(15.5, 1, 5, 0, 8, 2) is None  # the next epoch starts its own clock
    assert notes.line(22.0, 1, 5, 8, 8, 2) is None


def test_curves_draw_loss_grad_norm_and_length(tmp_path: Path) -> None:
    rows = [ROW | {"epoch": e} for e in range(3)]
    panels = draw_curves(rows, tmp_path / "c.png")
    assert {"loss", "grad norm", "response length (tokens)"} <= set(panels)
    assert (tmp_path / "c.png").stat().st_size > 0

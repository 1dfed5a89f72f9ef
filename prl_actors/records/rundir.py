"""The run directory: its layout, and the one object that writes a run's files besides the logs.

    RUN_DIR/config.yaml          the resolved config
    RUN_DIR/logs/<actor>.jsonl   one structlog JSON-lines file per actor (docs/LOGS.md); gzipped into
                                 <actor>.jsonl.gz when `up` ends, past 16 MB in all (compress_logs)
    RUN_DIR/metrics.jsonl        one JSON object per epoch (and one per evaluation, with "eval": true)
    RUN_DIR/eval/epoch-<N>.jsonl each eval prompt of the evaluation of v_N: completions, rewards
    RUN_DIR/completions.jsonl    run.log_completions samples per epoch (prompt, completion, reward, advantage)
    RUN_DIR/checkpoints/v<N>/    learner state after the step that made version N (DONE marks complete)
    RUN_DIR/model/               the built-in tiny model (an ordinary Hugging Face directory)
    RUN_DIR/final/               the final model of a completed run, in the model's dtype (final_model)

A checkpoint's DONE marker is written last and lists the sha256 of every file the checkpoint holds, so
a checkpoint that was cut short, truncated or partly deleted later is detected when a run resumes,
and the newest intact one is used instead (with a warning).

Actor cores never touch the disk or the console themselves: the trainer is handed a `TrainerSink`
(a `RunDir` in a run, a `MemorySink` in tests) and calls it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from prl_actors.protocol.messages import EVAL_ID_BASE, EvalGroup
from prl_actors.records.logs import console

CONFIG = "config.yaml"
LOGS = "logs"
COMPRESS_LOGS_ABOVE = 16 << 20  # an ended run's logs past this size are gzipped (RunDir.compress_logs)
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
MODEL = "model"
DONE = "DONE"
FINAL = "final"  # RUN_DIR/final: the final model, in the model's dtype (final_model)
OPTIMIZER_STATE = "optimizer.pt"  # a checkpoint's optimizer state (training/checkpoint.py): the newest only
LOCK = ".up.lock"
COMPLETIONS_FILE = "completions.jsonl"  # run.log_completions rows (prl_actors/trainer/completions.py)
EVAL = "eval"  # eval/epoch-<N>.jsonl: one evaluation each (write_eval)
# The epoch line's learning part: (metrics key, label, decimals), each shown when the row has it.
EPOCH_LINE_KEYS = (
    ("reward_mean", "reward", 3),
    ("accuracy", "acc", 3),
    ("loss", "loss", 4),
    ("kl", "kl", 4),
    ("grad_norm", "grad", 3),
    ("clip_frac", "clip", 3),
    ("clip_frac_low", "clip_lo", 3),
    ("clip_frac_high", "clip_hi", 3),
    ("response_len", "len", 1),
    ("entropy", "ent", 3),
    ("zero_adv_share", "zero_adv", 3),
    ("episode/turns", "turns", 2),  # multi-turn runs (rewards/metrics.py): per episode
    ("episode/tool_calls", "tools", 2),
    ("episode/tool_errors", "tool_err", 2),
)
SkipFn = Callable[[Path, str], None]


class RunDirBusy(Exception):
    """Another `up` holds the run directory (the message is for the user)."""


class CheckpointError(Exception):
    """Checkpoints exist but none is usable; the message names each one and why (for the user)."""


class TrainerSink(Protocol):
    """Where the trainer's durable outputs go."""

    def epoch_metrics(self, row: Mapping[str, Any]) -> None:
        """One finished epoch's metrics (has `epoch` and `version`)."""
        ...

    def save_checkpoint(self, version: int, write: Callable[[Path], None]) -> Path | None:
        """Let `write(dir)` fill the checkpoint of `version`, then mark it complete (None: not kept)."""
        ...

    def latest_checkpoint(self, on_skip: SkipFn | None = None) -> Path | None:
        """The newest complete, intact checkpoint, if any; `on_skip(path, why)` hears of each newer
        one that is damaged. Raises CheckpointError when there are checkpoints but none is intact."""
        ...


@runtime_checkable
class WarningSink(Protocol):
    """A sink that shows the user a warning line (the run directory: the console and a log)."""

    def warn(self, line: str) -> None: ...


@runtime_checkable
class RollbackSink(Protocol):
    """A sink that can drop what it recorded past a resumed version (metrics rows of redone epochs)."""

    def rollback(self, version: int) -> None: ...


@runtime_checkable
class FinalModelSink(Protocol):
    """A sink that keeps the run's final model: `write(out, model_dir)` fills it; None: none kept."""

    def final_model(self, write: Callable[[Path, Path], None]) -> Path | None: ...


@runtime_checkable
class CompletionSink(Protocol):
    """A sink that records sampled completions (run.log_completions)."""

    def completions(self, rows: list[dict[str, Any]]) -> None: ...


def epoch_line(row: Mapping[str, Any]) -> str:
    """The one console line per finished epoch: what it learned (reward, loss, kl, grad norm, clip
    fraction, response length, ...), then what it took (`0.11s (gen 0.09 train 0.03) 584 samples/s`)."""
    shown = "  ".join(f"{label}={float(row[k]):.{d}f}" for k, label, d in EPOCH_LINE_KEYS if k in row)
    took = f"  | {float(row['wall_s']):.2f}s" if "wall_s" in row else ""
    if took and "gen_s" in row and "train_s" in row:
        took += f" (gen {float(row['gen_s']):.2f} train {float(row['train_s']):.2f})"
    if "samples_per_s" in row:
        took += f" {float(row['samples_per_s']):.0f} samples/s"
    return f"epoch {row['epoch']:>3}  v{row['version']:<3} {shown}{took}{dynamic_sampling_note(row)}"


def dynamic_sampling_note(row: Mapping[str, Any]) -> str:
    """Dynamic sampling's part of the epoch line: groups kept of generated, and a short epoch."""
    if "groups_generated" not in row:
        return ""
    kept, made, want = int(row.get("groups_kept", 0)), int(row["groups_generated"]), int(row.get("groups_target", 0))
    short = f" (short of B={want}: sampling rounds ran out)" if kept < want else ""
    return f"  kept {kept}/{made} groups{short}"


class RunDir:
    """A run directory on disk. As a `TrainerSink` it appends metrics.jsonl, writes checkpoints and,
    with `echo`, prints one line per epoch."""

    def __init__(self, root: Path | str, echo: bool = False, keep_checkpoints: int = 0) -> None:
        self.root, self.echo = Path(root), echo
        self.keep_checkpoints = keep_checkpoints  # 0: keep every checkpoint
        self.protected: set[Path] = set()  # the checkpoint this run resumed from: never pruned

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def model(self) -> Path:
        return self.root / MODEL

    def log_path(self, actor: str) -> Path:
        return self.logs / f"{actor}.jsonl"

    def compress_logs(self, above: int = COMPRESS_LOGS_ABOVE) -> int:
        """When `up` ends: logs/<actor>.jsonl moved into logs/<actor>.jsonl.gz (appended as a gzip
        member: a resumed run's logs follow the earlier ones) if the logs hold more than `above`
        bytes in all (JSON lines compress ~9x; a 200-epoch demo writes 30 MB). replay reads both.
        The bytes compressed (0: left as they are)."""
        import gzip
        import shutil

        plain = sorted(self.logs.glob("*.jsonl")) if self.logs.is_dir() else []
        total = sum(p.stat().st_size for p in plain)
        if total <= above:
            return 0
        for path in plain:
            with open(path, "rb") as src, open(path.with_suffix(".jsonl.gz"), "ab") as raw:
                with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                raw.flush()
                os.fsync(raw.fileno())
            path.unlink()
        return total

    def has_run(self) -> bool:
        return self.metrics.exists() or self.has_checkpoint()

    def has_checkpoint(self) -> bool:
        """Some checkpoint is marked complete (whether it is intact is checked on resume)."""
        return self.checkpoints.exists() and any((p / DONE).exists() for p in self.checkpoints.glob("v*"))

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Held by `up` while it runs the run: a second `up` on this run dir fails at once
        (RunDirBusy) instead of overwriting config.yaml or stealing its ipc sockets. The OS releases
        the lock when `up` exits, however it exits."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                raise RunDirBusy(
                    f"run dir {self.root} is in use by a running `prl-actors up` (pid {f.read().strip() or '?'})"
                ) from None
            f.truncate(0)
            f.write(str(os.getpid()))
            f.flush()
            yield

    def metrics_rows(self) -> list[dict[str, Any]]:
        """The training epochs' rows (evaluation rows left out: see eval_rows)."""
        return [r for r in self.all_rows() if not r.get("eval")]

    def eval_rows(self) -> list[dict[str, Any]]:
        """One row per finished evaluation: epoch, version, eval_pass@k, eval_mean@k, eval_s."""
        return [r for r in self.all_rows() if r.get("eval")]

    def all_rows(self) -> list[dict[str, Any]]:
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    # --- EvalSink (the coordinator's; prl_actors/coordinator/evaluation.py) ------------------------------------

    def eval_result(self, epoch: int, version: int, groups: Sequence[EvalGroup], summary: Mapping[str, Any]) -> None:
        write_eval(self.root, epoch, version, groups, summary)
        row = {"eval": True, **summary}
        if self.echo:
            console("eval    " + "  ".join(f"{k}={v}" for k, v in row.items() if k != "eval"))
        with open(self.metrics, "a") as f:  # one short line in one write: appends of two processes don't mix
            f.write(json.dumps(row) + "\n")

    # --- TrainerSink --------------------------------------------------------------------------

    def warn(self, line: str) -> None:
        """A console line from the trainer (e.g. no learning signal), with `echo`."""
        if self.echo:
            console(line)

    def rollback(self, version: int) -> None:
        """Resumed from the checkpoint of `version` (maybe older than the last: a damaged one was
        skipped): the rows of epochs >= version are redone, so they leave metrics.jsonl (one row
        per trained epoch of the surviving line)."""
        rows = self.metrics_rows()
        kept = [r for r in rows if int(r.get("epoch", -1)) < version]
        if len(kept) == len(rows):
            return
        tmp = self.metrics.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(self.metrics)

    def epoch_metrics(self, row: Mapping[str, Any]) -> None:
        if self.echo:
            console(epoch_line(row))
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.metrics, "a") as f:
            f.write(json.dumps(dict(row)) + "\n")

    def save_checkpoint(self, version: int, write: Callable[[Path], None]) -> Path:
        path = self.checkpoints / f"v{version}"
        path.mkdir(parents=True, exist_ok=True)
        (path / DONE).unlink(missing_ok=True)
        write(path)
        marker = {"version": version, "sha256": {str(f.relative_to(path)): _sha256(f) for f in _files(path)}}
        (path / DONE).write_text(json.dumps(marker, indent=1))
        self.prune_checkpoints()
        for older in self._complete()[1:]:
            drop_optimizer_state(older)
        return path

    def final_model(self, write: Callable[[Path, Path], None]) -> Path | None:
        """RUN_DIR/final, the end of a completed run: `write(dir, model_dir)` fills a new directory
        from the newest checkpoint's model/ (its config and tokenizer files), then it replaces
        RUN_DIR/final whole. None (nothing written) without a full-model checkpoint (a LoRA run keeps
        its adapter in its final checkpoint; `prl-actors export` merges it)."""
        import shutil

        newest = next((p / MODEL for p in self._complete() if (p / MODEL).is_dir()), None)
        if newest is None:
            return None
        final, tmp = self.root / FINAL, self.root / (FINAL + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp, newest)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return final

    def _complete(self) -> list[Path]:
        """The checkpoints marked complete, newest first."""
        if not self.checkpoints.exists():
            return []
        done = [p for p in self.checkpoints.glob("v*") if p.name[1:].isdigit() and (p / DONE).exists()]
        return sorted(done, key=lambda p: int(p.name[1:]), reverse=True)

    def best_by_eval(self) -> Path | None:
        """The checkpoint of the weights that scored best in an evaluation (eval_mean@k, else
        eval_pass@k; the newest of equals), if it exists."""
        rows = [r for r in self.eval_rows() if isinstance(r.get("version"), int)]
        key = next((k for r in rows for k in sorted(r) if k.startswith(("eval_mean@", "eval_pass@"))), None)
        if key is None:
            return None
        scored = [(float(r[key]), int(r["version"])) for r in rows if isinstance(r.get(key), int | float)]
        path = self.checkpoints / f"v{max(scored)[1]}" if scored else None
        return path if path is not None and (path / DONE).exists() else None

    def prune_checkpoints(self) -> list[Path]:
        """trainer.keep_checkpoints: delete complete checkpoints older than the newest N, never the one
        this run resumed from (`protected`), never the best by evaluation (`best_by_eval`), and never
        one without its DONE marker (being written). The DONE marker goes first, so a prune cut short
        leaves an incomplete, ignored directory."""
        import shutil

        if self.keep_checkpoints <= 0 or not self.checkpoints.exists():
            return []
        done = self._complete()
        best = self.best_by_eval()
        removed = []
        for path in done[self.keep_checkpoints :]:
            if path.resolve() in self.protected or path == best:
                continue
            (path / DONE).unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        return removed

    def completions(self, rows: list[dict[str, Any]]) -> None:
        """run.log_completions rows (prl_actors/trainer/completions.py picks them) appended to completions.jsonl."""
        lines = "".join(json.dumps(r) + "\n" for r in rows)
        if lines:
            with open(self.root / COMPLETIONS_FILE, "a") as f:
                f.write(lines)

    def latest_checkpoint(self, on_skip: SkipFn | None = None) -> Path | None:
        """The newest `checkpoints/v<version>` directory that is complete (has its DONE marker) and
        intact (every file the marker lists has its sha256). A damaged one is reported through
        `on_skip` (and on the console with `echo`) and the one before it is tried."""
        problems: list[str] = []
        for path in self._complete():
            why = checkpoint_damage(path)
            if why is None:
                self.protected.add(path.resolve())
                if problems and self.echo:
                    console(f"warning: resuming from {path.name}: {'; '.join(problems)}")
                return path
            problems.append(f"{path.name} is damaged ({why})")
            if on_skip is not None:
                on_skip(path, why)
        if problems:
            raise CheckpointError(f"no intact checkpoint in {self.checkpoints}: {'; '.join(problems)}")
        return None


def eval_path(run_dir: Path | str, epoch: int) -> Path:
    """RUN_DIR/eval/epoch-N.jsonl: the evaluation of the weights at epoch N."""
    return Path(run_dir) / EVAL / f"epoch-{epoch}.jsonl"


def write_eval(
    run_dir: Path | str, epoch: int, version: int, groups: Sequence[EvalGroup], summary: Mapping[str, Any]
) -> Path:
    """RUN_DIR/eval/epoch-N.jsonl: one line per prompt (prompt, answer, completions, rewards), written
    whole then renamed (a file that exists is complete). `prompt_id` is the prompt's index in the eval
    set (prl_actors/coordinator/evaluation.py)."""
    path = eval_path(run_dir, epoch)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for g in sorted(groups, key=lambda g: g.prompt_id):
            row = {
                "epoch": epoch,
                "version": version,
                "prompt_id": g.prompt_id - EVAL_ID_BASE,
                "prompt": g.prompt,
                "answer": g.answer,
                "completions": g.completions,
                "rewards": g.rewards,
                **({"error": g.error} if g.error else {}),
            }
            f.write(json.dumps(row) + "\n")
    tmp.rename(path)
    return path


def checkpoint_damage(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be trusted, or None. A marker from before checksums (the
    version alone) cannot be checked and is trusted."""
    try:
        marker = json.loads((path / DONE).read_text())
    except (OSError, ValueError):
        return "unreadable DONE marker"
    if not isinstance(marker, dict):
        return None if isinstance(marker, int) else "unreadable DONE marker"
    sums = marker.get("sha256")
    if not isinstance(sums, dict) or not sums:
        return "DONE marker lists no files"
    for name, digest in sorted(sums.items()):
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if _sha256(f) != digest:
            return f"{name} does not match its checksum"
    return None


def drop_optimizer_state(path: Path) -> bool:
    """Remove the optimizer state from the checkpoint at `path` (only the newest keeps it): its DONE
    marker first forgets the file (written whole, then renamed), then the file goes, so a drop cut
    short leaves an intact checkpoint either way. True when there was one to drop."""
    state = path / OPTIMIZER_STATE
    if not state.exists():
        return False
    try:
        marker = json.loads((path / DONE).read_text())
    except (OSError, ValueError):
        return False  # unreadable: left alone (a resume reports it)
    if isinstance(marker, dict) and isinstance(marker.get("sha256"), dict):
        marker["sha256"].pop(OPTIMIZER_STATE, None)
        tmp = path / (DONE + ".tmp")
        tmp.write_text(json.dumps(marker, indent=1))
        tmp.replace(path / DONE)
    state.unlink(missing_ok=True)
    return True


def _files(path: Path) -> list[Path]:
    return sorted(f for f in path.rglob("*") if f.is_file() and f.name != DONE)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class MemorySink:
    """A `TrainerSink` that keeps metrics in memory and no checkpoints (unit tests, benchmarks)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def epoch_metrics(self, row: Mapping[str, Any]) -> None:
        self.rows.append(dict(row))

    def save_checkpoint(self, version: int, write: Callable[[Path], None]) -> Path | None:
        return None

    def latest_checkpoint(self, on_skip: SkipFn | None = None) -> Path | None:
        return None


# --- the run registry: which runs were started on this machine (for status/scale/stop/health) ------

REGISTRY = "runs"  # under the cache dir: one small JSON file per run directory
REGISTRY_KEPT = 64


def registry_dir() -> Path | None:
    """$PRL_CACHE_DIR/runs, else $XDG_CACHE_HOME/prl-actors/runs, else ~/.cache/prl-actors/runs (the
    model cache's root, model/builtin.cache_dir); None when PRL_CACHE_DIR is empty (caching off)."""
    env = os.environ.get("PRL_CACHE_DIR")
    if env == "":
        return None
    root = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prl-actors"
    return root / REGISTRY


def register_run(root: Path) -> None:
    """Note that `up` (this process) runs the run in `root`: the newest live one is what `status`,
    `scale`, `stop` and `health` reach without --config. Best effort: a cache that cannot be written
    only loses the discovery."""
    where = registry_dir()
    if where is None:
        return
    run_dir = str(Path(root).resolve())
    record = {"run_dir": run_dir, "pid": os.getpid(), "started": time.time()}
    try:
        where.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(run_dir.encode()).hexdigest()[:16] + ".json"
        tmp = where / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps(record))
        tmp.replace(where / name)
        for old in registered_runs()[REGISTRY_KEPT:]:
            (where / (hashlib.sha256(str(old).encode()).hexdigest()[:16] + ".json")).unlink(missing_ok=True)
    except OSError:
        return


def unregister_run(root: Path) -> None:
    """`up` of the run in `root` has ended: it is no longer one that `status` & co. may pick."""
    where = registry_dir()
    if where is not None:
        name = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:16] + ".json"
        try:
            (where / name).unlink(missing_ok=True)
        except OSError:
            return


def registered_runs() -> list[Path]:
    """The run directories `up` started on this machine, newest first (those that still exist)."""
    where = registry_dir()
    records: list[tuple[float, Path]] = []
    for f in where.glob("*.json") if where is not None and where.is_dir() else []:
        try:
            record = json.loads(f.read_text())
            records.append((float(record["started"]), Path(record["run_dir"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return [p for _, p in sorted(records, key=lambda r: r[0], reverse=True) if (p / CONFIG).is_file()]


def is_live(root: Path) -> bool:
    """A `prl-actors up` holds this run directory's lock right now."""
    try:
        with open(Path(root) / LOCK) as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def live_run() -> Path | None:
    """The newest run started on this machine that an `up` still runs."""
    return next((p for p in registered_runs() if is_live(p)), None)

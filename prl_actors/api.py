"""The Python API beside the CLI: a run from a config (file, dict or Config), reward callables and a
dataset object, started, followed epoch by epoch, stopped, and its final model.

    from prl_actors.api import Run

    def exact(record):                     # a RewardInput (prl_actors/rewards/record.py)
        return float(record.completion.strip() == record.answer)

    run = Run("configs/demo.yaml", rewards=[exact], dataset=[{"prompt": "2+3=", "answer": "5"}])
    for row in run.start().metrics():      # one dict per finished epoch (metrics.jsonl)
        print(row["epoch"], row["reward_mean"])
    print(run.final_model())               # a Hugging Face directory

How the callables reach the actors: `start()` runs `prl-actors up` as a child process on this
machine. The callables are pickled by value (cloudpickle: a function of a script or notebook
travels with its code) to RUN_DIR/api/callables.pkl, and the config names them as
`prl_actors.api:<name>` in `task.rewards`; a process started with PRL_API_CALLABLES (every actor
`up` starts here inherits it) resolves such a name from that file through this module's
`__getattr__`. A worker on another host has no such file: it loads rewards by import path
(`task.rewards: [{fn: mypackage.rewards:exact}]`, installed there), as with the CLI. Trust: the
file is unpickled only by processes this run started, from the path this process gave them.

The dataset (a list of dicts, or any iterable of mappings) is written to RUN_DIR/api/dataset.jsonl
and read as the `jsonl` task's prompts_file (or the configured dataset task's: jsonl, math, code).

Every wait has a deadline or is bounded by `up`'s own (it never hangs silently: docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

CALLABLES_ENV = "PRL_API_CALLABLES"  # the pickled callables of this run, for the processes it starts
MODULE = "prl_actors.api"  # what task.rewards names a registered callable by: prl_actors.api:<name>
DATASET_TASKS = ("jsonl", "math", "code")
EXPORT_STAMP = ".from"  # in a directory final_model() exported: the checkpoint it came from
_REGISTERED: dict[str, Callable[..., Any]] = {}  # this process's callables, by name
_LOADED: dict[str, Callable[..., Any]] | None = None  # the ones unpickled from CALLABLES_ENV


class RunFailed(Exception):
    """The run ended with a nonzero exit code; the message holds `up`'s last error lines."""


def register(name: str, fn: Callable[..., Any]) -> str:
    """Make `fn` loadable as `prl_actors.api:<name>` in this process; returns that spec."""
    if not callable(fn):
        raise TypeError(f"{name}: {fn!r} is not callable")
    _REGISTERED[name] = fn
    return f"{MODULE}:{name}"


def __getattr__(name: str) -> Callable[..., Any]:
    """`prl_actors.api:<name>`: a callable registered here, or one of CALLABLES_ENV's file."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    loaded = _load_env_callables()
    if name in loaded:
        return loaded[name]
    raise AttributeError(
        f"{MODULE} has no callable {name!r}: it is registered by prl_actors.api.Run in the process that "
        "started the run (a worker on another host loads rewards by import path: module:function)"
    )


def _load_env_callables() -> dict[str, Callable[..., Any]]:
    global _LOADED
    if _LOADED is None:
        path = os.environ.get(CALLABLES_ENV)
        _LOADED = {}
        if path and Path(path).is_file():
            import cloudpickle

            _LOADED = cloudpickle.loads(Path(path).read_bytes())
    return _LOADED


# --- building the config -------------------------------------------------------------------------


def _as_dict(config: Any) -> dict[str, Any]:
    """A config file path, a dict of sections, a Config or None (the defaults) -> a dict of sections."""
    from prl_actors.config import Config, read_config_file
    from prl_actors.sections import ConfigError

    if config is None:
        return {}
    if isinstance(config, Config):
        return config.model_dump(mode="json")
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    if isinstance(config, str | os.PathLike):
        return read_config_file(config)
    raise ConfigError(f"config must be a file path, a dict or a Config, not {type(config).__name__}")


def _named(rewards: Iterable[Callable[..., Any]] | Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """{name: fn}: a mapping as given, a list by each function's __name__ (made unique)."""
    if isinstance(rewards, Mapping):
        return dict(rewards)
    out: dict[str, Callable[..., Any]] = {}
    for fn in rewards:
        base = getattr(fn, "__name__", "reward")
        base = base if base.isidentifier() and base != "<lambda>" else "reward"
        name, n = base, 1
        while name in out:
            n += 1
            name = f"{base}_{n}"
        out[name] = fn
    return out


class TrlStyle:
    """A TRL-style reward, `fn(prompts, completions, **columns) -> list[float]`, called once per group
    with lists (the dataset row's other columns as keyword lists, as GRPOTrainer passes them), as a
    batched reward of `task.rewards` (it receives the group's RewardInput records)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "reward")

    def __call__(self, records: Any) -> Any:
        columns = sorted({k for r in records for k in r.row if k not in ("prompt", "completion", "completions")})
        extra = {k: [r.row.get(k) for r in records] for k in columns}
        extra.setdefault("answer", [r.answer for r in records])
        extra["completion_ids"] = [list(r.completion_ids) for r in records]
        return self.fn(prompts=[r.prompt for r in records], completions=[r.completion for r in records], **extra)


def trl_style(fn: Callable[..., Any]) -> bool:
    """Does `fn` take `completions` (TRL's reward_funcs signature) rather than one record?"""
    import inspect

    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class Run:
    """One training run driven from Python. `start()` launches `prl-actors up` on this machine;
    `metrics()` yields each finished epoch's row; `stop()` stops it (resumable, as Ctrl-C);
    `final_model()` is the final model as a Hugging Face directory (RUN_DIR/final, or the newest
    checkpoint exported).

    config: a YAML path, a dict of sections ({"run": {"epochs": 3}}) or a Config; None = defaults.
    rewards: callables `fn(record) -> float` (or a {name: fn} mapping), summed with weight 1, reported
      as `reward/<name>`; they replace the task's own reward. `weights` gives other weights by name.
      A function that takes `completions` is called as TRL's reward_funcs are: once per group,
      `fn(prompts=[...], completions=[...], answer=[...], **other_columns) -> list[float]`.
    dataset: mappings with the prompt and answer fields (task.prompt_field / task.answer_field).
    overrides: dotted fields, as `--set` ({"trainer.lr": 3e-4}); run_dir: where the run goes.
    resume: continue the run in run_dir from its last checkpoint (`up --resume`: only epochs, workers
      and other safe fields may differ; give run.epochs above the epochs done).
    echo: print `up`'s console lines to this process's stderr.
    """

    def __init__(
        self,
        config: Any = None,
        *,
        rewards: Iterable[Callable[..., Any]] | Mapping[str, Callable[..., Any]] = (),
        dataset: Iterable[Mapping[str, Any]] | None = None,
        overrides: Mapping[str, Any] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        weights: Mapping[str, float] | None = None,
        echo: bool = True,
        resume: bool = False,
    ) -> None:
        from prl_actors.config import set_path, validate_config
        from prl_actors.sections import ConfigError

        data = _as_dict(config)
        for key, value in (overrides or {}).items():
            set_path(data, key, value)
        if run_dir is not None:
            set_path(data, "run.run_dir", str(run_dir))
        named = _named(rewards)
        self.rewards = {n: TrlStyle(fn) if trl_style(fn) else fn for n, fn in named.items()}
        unknown = sorted(set(weights or {}) - set(self.rewards))
        if unknown:
            raise ConfigError(f"weights for rewards that are not given: {', '.join(unknown)}")
        if self.rewards:
            w = weights or {}
            specs = [
                {"fn": f"{MODULE}:{n}", "name": n, "weight": w.get(n, 1.0), "batched": trl_style(named[n])}
                for n in self.rewards
            ]
            set_path(data, "task.rewards", specs)
            set_path(data, "task.reward", None)
        self.dataset = None if dataset is None else [dict(row) for row in dataset]
        run = data.get("run")
        self.run_dir = Path((run.get("run_dir") if isinstance(run, dict) else None) or "runs/latest")
        if self.dataset is not None:
            task = data.setdefault("task", {})
            task["name"] = task.get("name") if task.get("name") in DATASET_TASKS else "jsonl"
            task["prompts_file"] = str((self.run_dir / "api" / "dataset.jsonl").resolve())
        self.config = validate_config(data)
        self.echo, self.resume = echo, resume
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._tail: list[str] = []
        self._reader: threading.Thread | None = None

    # --- running -------------------------------------------------------------------------------

    def start(self) -> Run:
        """Write RUN_DIR/api/ (config, callables, dataset) and start `prl-actors up` on it; returns
        self. Refused (RuntimeError) when already started; `up`'s own refusals (a run dir that holds
        a run, a bad dataset row) surface as RunFailed from metrics() / wait()."""
        if self.proc is not None:
            raise RuntimeError("this Run was started already")
        api = self.run_dir / "api"
        api.mkdir(parents=True, exist_ok=True)
        for name, fn in self.rewards.items():
            register(name, fn)
        env = {**os.environ, CALLABLES_ENV: str((api / "callables.pkl").resolve())}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*_user_paths(), env.get("PYTHONPATH", "")) if p)
        if self.rewards:
            import cloudpickle

            (api / "callables.pkl").write_bytes(cloudpickle.dumps(self.rewards))
        if self.dataset is not None:
            with open(api / "dataset.jsonl", "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in self.dataset)
        (api / "config.yaml").write_text(self.config.dump())
        argv = [sys.executable, "-m", "prl_actors.cli.main", "up", "--config", str(api / "config.yaml")]
        if self.resume:  # as `up --resume`: the run's checkpoint and data must be this config's
            argv += ["--resume", "--run-dir", str(self.run_dir)]
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read_console, name="prl-api-console", daemon=True)
        self._reader.start()
        return self

    def _read_console(self) -> None:
        """`up`'s console (stderr) -> this process's sys.stderr (a notebook shows it), last lines kept."""
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            self._tail = [*self._tail[-19:], line]
            if self.echo:
                print(line, file=sys.stderr, flush=True)

    def metrics(self, timeout_s: float | None = None, poll_s: float = 0.2) -> Iterator[dict[str, Any]]:
        """Each finished epoch's metrics row (and eval rows: `eval` true), in order, as they are
        written, until the run ends; RunFailed when it failed. `timeout_s` bounds the whole wait
        (TimeoutError, the run left running); None: as long as `up` runs (it has deadlines of its own)."""
        if self.proc is None:
            raise RuntimeError("start() the run first")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        path, offset, pending = self.run_dir / "metrics.jsonl", 0, ""
        seen: set[tuple[Any, bool]] = set()  # (epoch, eval): a resume may rewrite the file (rows past its checkpoint)
        while True:
            done = self.proc.poll() is not None
            if path.is_file():
                if path.stat().st_size < offset:  # rewritten shorter: read it again, rows seen are skipped
                    offset, pending = 0, ""
                with open(path) as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    row = json.loads(line) if line.strip() else None
                    if row is not None and (key := (row.get("epoch"), bool(row.get("eval")))) not in seen:
                        seen.add(key)
                        yield row
            if done:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no end of the run in {self.run_dir} within {timeout_s:g}s (still running)")
            time.sleep(poll_s)
        self._finish()

    def wait(self, timeout_s: float | None = None) -> int:
        """Until the run ends; its exit code (0: every epoch done). RunFailed when it failed."""
        for _ in self.metrics(timeout_s):
            pass
        return self.returncode if self.returncode is not None else -1

    def stop(self, timeout_s: float = 60.0) -> int:
        """Stop the run as Ctrl-C does (every actor stops; `up --resume` continues it); its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10.0)
        if self._reader is not None:
            self._reader.join(5.0)
        self.returncode = self.proc.returncode
        return self.returncode

    def _finish(self) -> None:
        assert self.proc is not None
        self.returncode = self.proc.wait(10.0)
        if self._reader is not None:
            self._reader.join(5.0)
        if self.returncode != 0:
            errors = [line for line in self._tail if line.startswith("error")] or self._tail[-3:]
            raise RunFailed(f"the run in {self.run_dir} ended with exit code {self.returncode}: " + " | ".join(errors))

    def final_model(self, out: str | os.PathLike[str] | None = None) -> Path:
        """The run's final model as a Hugging Face directory (default RUN_DIR/final). A completed run
        wrote RUN_DIR/final itself (in the model's dtype, as the workers ran it): that directory, copied
        to `out` when given, unless a newer checkpoint came after it (a resume stopped early). Otherwise
        (a stopped run, a LoRA run) the newest intact checkpoint is exported; an existing export of that
        checkpoint is reused."""
        from prl_actors.records.rundir import FINAL, RunDir

        checkpoint = RunDir(self.run_dir).latest_checkpoint()
        written = self.run_dir / FINAL
        if _is_current_final(written, checkpoint):
            if out is None or Path(out).resolve() == written.resolve():
                return written
            return _copy_dir(written, Path(out))
        if checkpoint is None:
            raise FileNotFoundError(f"{self.run_dir} holds no complete checkpoint")
        return _export(checkpoint, Path(out) if out is not None else written)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _is_current_final(final: Path, checkpoint: Path | None) -> bool:
    """RUN_DIR/final as the trainer wrote it at the end of a completed run (not an export of ours: no
    `.from` stamp), written after the newest checkpoint was complete."""
    from prl_actors.records.rundir import DONE

    if not (final / "config.json").is_file() or (final / EXPORT_STAMP).exists():
        return False
    if checkpoint is None:
        return True
    written = max(f.stat().st_mtime for f in final.iterdir() if f.is_file())
    return written >= (checkpoint / DONE).stat().st_mtime


def _copy_dir(source: Path, target: Path) -> Path:
    import shutil

    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    return target


def _export(checkpoint: Path, target: Path) -> Path:
    """`checkpoint` exported to `target` (reused when `target` is already its export)."""
    import shutil

    from prl_actors.cli.export_cmd import export_checkpoint

    stamp = target / EXPORT_STAMP
    if stamp.is_file() and stamp.read_text() == str(checkpoint.resolve()):
        return target
    if target.exists():
        shutil.rmtree(target)
    export_checkpoint(checkpoint, target)
    stamp.write_text(str(checkpoint.resolve()))
    return target


def _user_paths() -> list[str]:
    """Where this process found the user's own modules (a script's folder, the working directory):
    the actors import a reward pickled by reference (a function of an importable module) from there."""
    return [str(Path(sys.path[0] or ".").resolve()), os.getcwd()] if sys.path else [os.getcwd()]


def train(config: Any = None, **kwargs: Any) -> Path:
    """Run to the end (Run(config, **kwargs).start().wait()) and return the final model's directory."""
    run = Run(config, **kwargs).start()
    run.wait()
    return run.final_model()

"""`prl-actors export RUN_DIR --out DIR [--version N] [--adapter] [--base DIR]`: a trained model as a
standard Hugging Face directory (config.json, model.safetensors, tokenizer files, generation_config.json)
that `transformers` loads as is (docs/OBSERVE.md). RUN_DIR may also be one checkpoint (RUN_DIR/checkpoints/vN).

- a full-model run: the checkpoint's `model/` (single, ddp; under fsdp2 the consolidated export that
  rank 0 gathers at every checkpoint, docs/DISTRIBUTED.md), copied;
- a LoRA run: the base with the adapter merged in (peft's merge_and_unload; `--base` names another
  base than the one the adapter records), or with `--adapter` the peft adapter directory alone (plus
  the tokenizer files), for `PeftModel.from_pretrained`.
`export-merged` (the older name of the LoRA merge) is a hidden alias of this command.
Imports only typer at module level; torch and transformers are imported when it runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from prl_actors.cli.common import fail as _fail


def export(
    run_dir: Annotated[
        Path, typer.Argument(help="A run directory (its checkpoints/v<N>), or one checkpoint directory.")
    ],
    out: Annotated[Path, typer.Option("--out", help="The directory to write (must not exist).")],
    version: Annotated[
        int | None, typer.Option("--version", help="The checkpoint of weights vN; default: the newest intact one.")
    ] = None,
    adapter: Annotated[
        bool, typer.Option("--adapter", help="LoRA runs: export the adapter alone (default: merged into the base).")
    ] = False,
    base: Annotated[
        Path | None,
        typer.Option("--base", help="LoRA runs: the base model directory; default: the one the adapter records."),
    ] = None,
) -> None:
    """Export a checkpoint as a Hugging Face model directory loadable by transformers (a LoRA run's
    adapter merged into its base)."""
    from prl_actors.runtime.core import one_line

    if out.exists():
        _fail(f"{out} exists: choose a new directory")
    checkpoint = checkpoint_to_export(run_dir, version)
    typer.echo(f"exporting {checkpoint} ...", err=True)
    try:
        kind = export_checkpoint(checkpoint, out, adapter, base)
    except FileNotFoundError as exc:
        shutil.rmtree(out, ignore_errors=True)
        _fail(str(exc))
    except Exception as exc:  # a damaged checkpoint, a missing base: one line, no traceback
        shutil.rmtree(out, ignore_errors=True)
        _fail(f"cannot export {checkpoint}: {one_line(exc)}", code=1)
    typer.echo(f"exported {kind} of {checkpoint} to {out}")


def _is_checkpoint(path: Path) -> bool:
    """One checkpoint directory (v<N>, marked complete), rather than a run directory (which also holds
    a model/ of its own: the model every actor loaded)."""
    from prl_actors.records.rundir import DONE

    return (path / DONE).is_file() and not (path / "checkpoints").is_dir()


def checkpoint_to_export(path: Path, version: int | None) -> Path:
    """`path` itself when it is one checkpoint, else the run directory's v<version> or newest intact one."""
    return _one_checkpoint(path) if _is_checkpoint(path) else _checkpoint(path, version)


def _one_checkpoint(path: Path) -> Path:
    """A checkpoint directory given as is: refused when damaged (as the newest intact one would be)."""
    from prl_actors.records.rundir import checkpoint_damage

    why = checkpoint_damage(path)
    if why is not None:
        _fail(f"checkpoint {path} is damaged ({why})")
    return path


def _checkpoint(run_dir: Path, version: int | None) -> Path:
    """The checkpoint directory to export: v<version>, or the newest intact one."""
    from prl_actors.records.rundir import DONE, CheckpointError, RunDir, checkpoint_damage

    rd = RunDir(run_dir)
    if not rd.checkpoints.is_dir():
        _fail(f"{run_dir} holds no checkpoints/ (is it a run directory?)")
    if version is not None:
        path = rd.checkpoints / f"v{version}"
        if not (path / DONE).exists():
            kept = sorted(int(p.name[1:]) for p in rd.checkpoints.glob("v*") if (p / DONE).exists())
            _fail(f"no complete checkpoint v{version} in {rd.checkpoints} (complete: {kept or 'none'})")
        why = checkpoint_damage(path)
        if why is not None:
            _fail(f"checkpoint {path} is damaged ({why})")
        return path
    try:
        found = rd.latest_checkpoint()
    except CheckpointError as exc:
        _fail(str(exc))
    if found is None:
        _fail(f"{run_dir} holds no complete checkpoint")
    return found


def export_checkpoint(checkpoint: Path, out: Path, adapter: bool = False, base: Path | None = None) -> str:
    """Write `out` from `checkpoint`; returns what was written ("model", "merged LoRA model", "LoRA adapter")."""
    from prl_actors.training import lora
    from prl_actors.training.checkpoint import MODEL_DIR

    if (checkpoint / lora.ADAPTER_DIR).is_dir():
        if adapter:
            shutil.copytree(checkpoint / lora.ADAPTER_DIR, out)
            base = lora._recorded_base(checkpoint / lora.ADAPTER_DIR)
            for name in lora.TOKENIZER_FILES:
                if (base / name).is_file():
                    shutil.copy2(base / name, out / name)
            return "LoRA adapter"
        if base is None and (checkpoint / lora.MERGED_DIR / "config.json").is_file():
            shutil.copytree(checkpoint / lora.MERGED_DIR, out)
        else:
            lora.export_merged(checkpoint, out, base)
        write_generation_config(out)
        return "merged LoRA model"
    if adapter or base is not None:
        flag = "--adapter" if adapter else "--base"
        raise FileNotFoundError(f"{checkpoint} holds no LoRA adapter (the run has no trainer.lora): drop {flag}")
    if not (checkpoint / MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(f"{checkpoint} holds no {MODEL_DIR}/config.json (not a model checkpoint)")
    shutil.copytree(checkpoint / MODEL_DIR, out)
    write_generation_config(out)
    return "model"


def write_generation_config(out: Path) -> None:
    """generation_config.json from the model's config (eos, pad, bos ids) unless there is one."""
    if (out / "generation_config.json").is_file():
        return
    from transformers import AutoConfig, GenerationConfig

    GenerationConfig.from_model_config(AutoConfig.from_pretrained(out)).save_pretrained(out)

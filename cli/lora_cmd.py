"""`prl-actors export-merged`: a LoRA checkpoint as one plain Hugging Face model directory.

Imports only typer at module level; the heavy parts (torch, peft) are imported when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def export_merged(
    source: Annotated[
        Path, typer.Argument(help="A run directory (its newest intact checkpoint) or one checkpoint (CKPT/adapter).")
    ],
    out: Annotated[Path, typer.Option("--out", help="The directory to write (must not exist).")],
    base: Annotated[
        Path | None,
        typer.Option("--base", help="The base model directory; default: the one the adapter records."),
    ] = None,
) -> None:
    """Merge a LoRA checkpoint into its base model: a plain HF directory (weights, config, tokenizer)
    that `AutoModelForCausalLM.from_pretrained` loads without peft (docs/LORA.md)."""
    from prl_actors.actors.runtime import one_line
    from prl_actors.config import ConfigError
    from prl_actors.rundir import CheckpointError, RunDir
    from prl_actors.training.lora import export_merged as export

    if out.exists():
        _fail(f"{out} exists: choose a new directory")
    checkpoint = source
    if (source / "checkpoints").is_dir():
        try:
            found = RunDir(source).latest_checkpoint()
        except CheckpointError as exc:
            _fail(str(exc))
        if found is None:
            _fail(f"{source} holds no complete checkpoint")
        checkpoint = found
    try:
        export(checkpoint, out, base)
    except (FileNotFoundError, ConfigError) as exc:
        _fail(str(exc))
    except Exception as exc:  # a damaged adapter, a base of another shape: one line, no traceback
        _fail(f"cannot export {checkpoint}: {one_line(exc)}", code=1)
    typer.echo(f"merged model written to {out} (from {checkpoint})")

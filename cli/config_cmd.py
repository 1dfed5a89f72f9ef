"""`prl-actors config show`: the resolved config (every default filled in) that `up` would write to
RUN_DIR/config.yaml; `prl-actors config fields`: the options reference (docs/CONFIG.md is its output,
kept equal by tests/test_cli_config.py). Imports only typer at module level.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer

from prl_actors.cli.common import ConfigOpt, SetOpt, _config

config_app = typer.Typer(
    name="config",
    help="The resolved config (`show`) and the reference of every option (`fields`).",
    no_args_is_help=True,
)

HEADER = """# Configuration reference

Generated from the field descriptions in `prl_actors/config.py` by `prl-actors config fields`
(tests/test_cli_config.py checks it is current). Set a field in a YAML file (`section: {field: value}`)
or on the command line (`--set section.field=value`; a list takes `a,b` or `[a, b]`).
`prl-actors config show --config FILE` prints every value a run would use, defaults included.
"""


@config_app.command()
def show(config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Print the resolved config: the file with --set applied and every default filled in (YAML)."""
    typer.echo(_config(config, set_).dump().rstrip())


@config_app.command()
def fields() -> None:
    """Print the reference of every config field (type, default, description) as Markdown."""
    typer.echo(reference().rstrip())


def reference() -> str:
    """Markdown: one table per section, a row per field (nested sections get their own table)."""
    from pydantic import BaseModel

    from prl_actors.config import Config

    out = [HEADER]
    todo: list[tuple[str, type[BaseModel]]] = [(name, _model(info.annotation)) for name, info in _fields(Config)]
    todo = [(n, m) for n, m in todo if m is not None]
    while todo:
        prefix, model = todo.pop(0)
        out.append(f"\n## `{prefix}`\n")
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(("!!!", "Usage docs")):
            out.append(" ".join(doc.split()) + "\n")
        out.append("| field | type | default | description |\n| --- | --- | --- | --- |")
        nested = []
        for name, info in _fields(model):
            sub = _model(info.annotation)
            if sub is not None:
                nested.append((f"{prefix}.{name}", sub))
            desc = " ".join((info.description or "").split()).replace("|", "\\|")
            out.append(f"| `{name}` | {_type(info.annotation)} | {_default(info)} | {desc} |")
        todo = nested + todo
    return "\n".join(out) + "\n"


def _fields(model: Any) -> list[tuple[str, Any]]:
    return list(model.model_fields.items())


def _model(annotation: Any) -> Any:
    """The section model inside `annotation` (`X`, `X | None`, `list[X]`), or None."""
    from pydantic import BaseModel

    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _type(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(_type(a) for a in get_args(annotation))
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin is list:
        return f"list of {_type(get_args(annotation)[0])}"
    if origin is dict:
        return "mapping"
    if origin is Annotated:
        return _type(get_args(annotation)[0])
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: Any) -> str:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    if info.default_factory is not None:
        value = info.default_factory()
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{value!r}`"

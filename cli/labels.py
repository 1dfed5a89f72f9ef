"""Readable value labels in `--help`: `N`, `PATH`, `TEXT`, a Literal's choices `periodic|sync|bounded`,
no label on a flag, an argument by its name (`RUN_DIR`), instead of typer's `<int range>`, `<bool>`,
`<list[str]>`. Applied once to every command's options before typer builds them (`label(app)`).
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import typer
from typer.models import ArgumentInfo, OptionInfo, ParameterInfo


def metavar(annotation: Any) -> str:
    """The label of a value of `annotation` ('' for a flag)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return metavar(args[0]) if len(args) == 1 else "VALUE"
    if origin is list:
        return metavar(get_args(annotation)[0])
    if origin is Literal:
        return "|".join(str(a) for a in get_args(annotation))
    labels: dict[Any, str] = {bool: "", int: "N", float: "NUM", str: "TEXT", Path: "PATH"}
    return labels.get(annotation, "VALUE")


def _infos(fn: Any) -> list[tuple[str, Any, ParameterInfo]]:
    """(name, type, its typer ParameterInfo) of each Annotated parameter of a command function. The
    function keeps the evaluated annotations: a string annotation (`from __future__ import
    annotations`) would build a new, unlabelled typer.Option each time typer evaluates it."""
    try:
        hints = get_type_hints(fn, include_extras=True)
    except NameError:  # an annotation only a type checker resolves: leave typer's own labels
        return []
    fn.__annotations__ = hints
    out = []
    for name in inspect.signature(fn).parameters:
        hint = hints.get(name)
        if get_origin(hint) is not Annotated:
            continue
        base, *extras = get_args(hint)
        info = next((e for e in extras if isinstance(e, ParameterInfo)), None)
        if info is not None:
            out.append((name, base, info))
    return out


def label(app: typer.Typer) -> None:
    """Set a readable metavar on every option and argument of `app`'s commands (and sub-apps')
    that has none of its own."""
    for command in app.registered_commands:
        for name, base, info in _infos(command.callback):
            if info.metavar is not None:
                continue
            if isinstance(info, ArgumentInfo):
                info.metavar = name.upper()
            elif isinstance(info, OptionInfo):
                info.metavar = metavar(base)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            label(group.typer_instance)

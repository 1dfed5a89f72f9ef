"""Rows of a prompt file: JSONL, parquet, or a local `datasets` directory (never the hub).

`read_rows(path, fields, split)` returns every row as `(where, fields)`, where `where` names the file
and the row for error messages: `data.jsonl:7` (1-based line) or `data.parquet: row 6` (0-based, as
pandas and `datasets` count). Only the asked-for fields are read. A missing file, a missing column,
an unreadable file or an absent extra is a one-line `ConfigError`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prl_actors.sections import ConfigError

Row = tuple[str, Mapping[str, Any]]
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
EXTRA_HINT = "pip install 'prl-actors[data]'"


def read_rows(path: str, fields: Sequence[str], split: str = "train", all_columns: bool = False) -> list[Row]:
    """Every row of `path` (in file order), restricted to `fields` unless `all_columns` (every column
    is kept, for rewards that read the row; `fields` must still exist). JSONL rows always keep all."""
    p = Path(path).expanduser()
    if p.is_dir():
        return _dataset_dir_rows(p, fields, split, all_columns)
    if not p.is_file():
        raise ConfigError(
            f"task.prompts_file {str(p)!r} does not exist (a local JSONL or parquet file, or a `datasets` "
            "directory; prl-actors never downloads data)"
        )
    suffix = p.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return _jsonl_rows(p, fields)
    if suffix == ".parquet":
        return _parquet_rows(p, fields, all_columns)
    raise ConfigError(f"task.prompts_file {str(p)!r}: unknown format {suffix!r} (use .jsonl, .parquet or a directory)")


def _jsonl_rows(p: Path, fields: Sequence[str]) -> list[Row]:
    rows: list[Row] = []
    with p.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                rows.append((f"{p}:{number}", _parse_json_line(line, f"{p}:{number}", fields)))
    return rows


def _parse_json_line(line: str, where: str, fields: Sequence[str]) -> Mapping[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        names = " and ".join(repr(f) for f in fields)
        raise ConfigError(f"{where}: expected a JSON object with {names}")
    return obj


def _parquet_rows(p: Path, fields: Sequence[str], all_columns: bool = False) -> list[Row]:
    pq = _import("pyarrow.parquet", "reading parquet")
    try:
        columns = pq.read_schema(p).names
        _check_columns(str(p), fields, columns)
        fields = list(columns) if all_columns else fields
        table = pq.read_table(p, columns=list(fields))
    except ConfigError:
        raise
    except Exception as exc:  # pyarrow raises several types for a corrupt or non-parquet file
        raise ConfigError(f"task.prompts_file {str(p)!r} is not a readable parquet file ({exc})") from None
    return _columns_to_rows(str(p), {f: table.column(f).to_pylist() for f in fields})


def _dataset_dir_rows(p: Path, fields: Sequence[str], split: str, all_columns: bool = False) -> list[Row]:
    """A `save_to_disk` directory (load_from_disk) or a folder of data files (load_dataset, local)."""
    datasets = import_datasets()
    try:
        if (p / "dataset_dict.json").is_file() or (p / "state.json").is_file():
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(str(p))
    except Exception as exc:  # datasets raises many types for a bad directory
        raise ConfigError(f"task.prompts_file {str(p)!r} is not a readable `datasets` directory ({exc})") from None
    where = str(p)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ConfigError(f"{p}: no split {split!r} (splits: {', '.join(ds)}); set task.split")
        ds, where = ds[split], f"{p}[{split}]"
    _check_columns(where, fields, ds.column_names)
    fields = list(ds.column_names) if all_columns else fields
    return _columns_to_rows(where, {f: list(ds[f]) for f in fields})


def _check_columns(where: str, fields: Sequence[str], columns: Sequence[str]) -> None:
    missing = [f for f in fields if f not in columns]
    if missing:
        raise ConfigError(
            f"{where}: no column {missing[0]!r} (columns: {', '.join(columns)}); "
            "set task.prompt_field / task.answer_field"
        )


def _columns_to_rows(where: str, columns: Mapping[str, list[Any]]) -> list[Row]:
    n = len(next(iter(columns.values()))) if columns else 0
    return [(f"{where}: row {i}", {f: col[i] for f, col in columns.items()}) for i in range(n)]


def import_datasets() -> Any:
    """The `datasets` package, forced offline (local files only; the hub is never contacted)."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    datasets = _import("datasets", "reading a `datasets` directory")
    import huggingface_hub.constants as hub_constants

    hub_constants.HF_HUB_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    datasets.config.HF_DATASETS_OFFLINE = True
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _import(module: str, purpose: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{purpose} needs the optional `data` dependencies: {EXTRA_HINT}") from None

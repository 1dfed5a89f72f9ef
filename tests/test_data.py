"""Prompt data: file formats, field mapping, bad rows, chat template, sampling, data position."""

from __future__ import annotations

import ast
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from prl_actors.config import load_config
from prl_actors.data import position
from prl_actors.data.sampler import EpochSampler
from prl_actors.launch import build
from prl_actors.model.tokenizer import encode_prompt, load_tokenizer
from prl_actors.sections import ConfigError
from tests.learning_utils import tiny_config

pytestmark = pytest.mark.fast

ROWS = [{"q": f"question {i}?", "a": str(i), "extra": i} for i in range(10)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def jsonl_cfg(path: Path, **overrides: object):  # type: ignore[no-untyped-def]
    return tiny_config(task__name="jsonl", task__prompts_file=str(path), **overrides)


# --- sampling --------------------------------------------------------------------------------------


def test_sampler_uses_every_item_once_per_pass() -> None:
    s = EpochSampler(seed=3, size=10)
    stream = [i for e in range(5) for i in s.indices(e, 4)]  # 20 draws = exactly two passes
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert stream[:10] != stream[10:]  # a fresh permutation per pass
    assert EpochSampler(seed=3, size=10).indices(3, 4) == s.indices(3, 4)  # pure in (seed, epoch)
    assert EpochSampler(seed=4, size=10).indices(0, 4) != s.indices(0, 4)
    assert s.position(3, 4) == (1, 2)


def test_task_epochs_cover_the_dataset_without_replacement(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    task = build.task(jsonl_cfg(path, task__prompt_field="q", task__answer_field="a"))
    seen = [p.prompt for e in range(2) for p in task.prompts_for_epoch(e, 5)]
    assert Counter(seen) == Counter(r["q"] for r in ROWS)  # 2 epochs x 5 = every prompt exactly once
    again = build.task(jsonl_cfg(tmp_path / "p.jsonl", task__prompt_field="q", task__answer_field="a"))
    assert again.prompts_for_epoch(1, 5) == task.prompts_for_epoch(1, 5)  # what a resumed run sees


def test_add_task_without_replacement() -> None:
    task = build.task(tiny_config(task__max_operand=2))  # 9 items
    prompts = [p.prompt for e in range(3) for p in task.prompts_for_epoch(e, 3)]
    assert sorted(prompts) == sorted(p for p, _ in task.items)


# --- formats and field mapping ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "save_to_disk", "data_dir"])
def test_formats_give_the_same_items(tmp_path: Path, fmt: str) -> None:
    path = write_any(tmp_path, fmt, ROWS)
    task = build.task(jsonl_cfg(path, task__prompt_field="q", task__answer_field="a"))
    assert task.items == [(r["q"], r["a"]) for r in ROWS]


def write_any(tmp_path: Path, fmt: str, rows: list[dict]) -> Path:
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "p.jsonl", rows)
    if fmt == "parquet":
        return write_parquet(tmp_path / "p.parquet", rows)
    if fmt == "data_dir":  # a folder of data files, as a hub dataset snapshot holds them
        (tmp_path / "ds" / "data").mkdir(parents=True)
        write_parquet(tmp_path / "ds" / "data" / "train-00000.parquet", rows)
        return tmp_path / "ds"
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    return tmp_path / "saved"


def test_dataset_dict_split(tmp_path: Path) -> None:
    import datasets

    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:6]), "test": datasets.Dataset.from_list(ROWS[6:])}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    cfg = jsonl_cfg(tmp_path / "dd", task__prompt_field="q", task__answer_field="a", task__split="test")
    assert [a for _, a in build.task(cfg).items] == ["6", "7", "8", "9"]
    with pytest.raises(ConfigError, match=r"no split 'validation' \(splits: train, test\); set task.split"):
        build.task(jsonl_cfg(tmp_path / "dd", task__prompt_field="q", task__answer_field="a", task__split="validation"))


def test_datasets_is_forced_offline(tmp_path: Path) -> None:
    build.task(jsonl_cfg(write_any(tmp_path, "save_to_disk", ROWS), task__prompt_field="q", task__answer_field="a"))
    import datasets
    import huggingface_hub.constants

    assert datasets.config.HF_HUB_OFFLINE and huggingface_hub.constants.HF_HUB_OFFLINE


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "save_to_disk"])
def test_bad_row_names_file_and_row(tmp_path: Path, fmt: str) -> None:
    rows = [dict(r) for r in ROWS]
    rows[7]["q"] = ""  # row 7 (0-based), line 8 of the JSONL
    path = write_any(tmp_path, fmt, rows)
    with pytest.raises(ConfigError, match="'q' must be a non-empty string") as info:
        build.task(jsonl_cfg(path, task__prompt_field="q", task__answer_field="a"))
    assert (f"{path}:8:" if fmt == "jsonl" else f"{path}: row 7:") in str(info.value)


def test_null_answer_in_parquet(tmp_path: Path) -> None:
    rows = [dict(r) for r in ROWS]
    rows[2]["a"] = None
    path = write_parquet(tmp_path / "p.parquet", rows)
    with pytest.raises(ConfigError, match=r"p.parquet: row 2: 'a' must be a string or a number"):
        build.task(jsonl_cfg(path, task__prompt_field="q", task__answer_field="a"))


@pytest.mark.parametrize("fmt", ["parquet", "save_to_disk"])
def test_missing_column(tmp_path: Path, fmt: str) -> None:
    path = write_any(tmp_path, fmt, ROWS)
    with pytest.raises(ConfigError, match=r"no column 'prompt' \(columns: .*q.*\); set task.prompt_field"):
        build.task(jsonl_cfg(path, task__answer_field="a"))


def test_unreadable_and_unknown_files(tmp_path: Path) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ConfigError, match="is not a readable parquet file"):
        build.task(jsonl_cfg(tmp_path / "bad.parquet"))
    (tmp_path / "p.csv").write_text("prompt,answer\n")
    with pytest.raises(ConfigError, match="unknown format '.csv'"):
        build.task(jsonl_cfg(tmp_path / "p.csv"))
    with pytest.raises(ConfigError, match="never downloads data"):
        build.task(jsonl_cfg(Path("openai/gsm8k")))


def test_missing_extra_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_parquet(tmp_path / "p.parquet", ROWS)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if pyarrow were not installed
    with pytest.raises(ConfigError, match=r"pip install 'prl-actors\[data\]'"):
        build.task(jsonl_cfg(path, task__prompt_field="q", task__answer_field="a"))


def test_task_options_that_do_not_apply() -> None:
    with pytest.raises(ConfigError, match="task.chat_template applies to the jsonl, math and code tasks"):
        build.task(tiny_config(task__chat_template=True))
    with pytest.raises(ConfigError, match="format_reward applies to the math task only"):
        build.task(tiny_config(task__format_reward=0.1))
    with pytest.raises(ConfigError, match="system_prompt needs chat_template: true"):
        load_config(None, {"task.system_prompt": "Be brief."})


def test_base_imports_no_task_module() -> None:
    """The registry imports the tasks; base.py (which they import) imports none of them."""
    tree = ast.parse((Path(__file__).resolve().parent.parent / "prl_actors/tasks/base.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("prl_actors.tasks")}


# --- chat template ---------------------------------------------------------------------------------


def test_chat_template_with_system_prompt(tmp_path: Path, family_dirs: dict[str, Path]) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2+3?", "answer": 5}])
    cfg = jsonl_cfg(
        path, model__path=str(family_dirs["qwen2"]), task__chat_template=True, task__system_prompt="Be brief."
    )
    ((prompt, answer),) = build.task(cfg).items
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert answer == "5"


@pytest.mark.parametrize(("family", "bos"), [("llama", "<|begin_of_text|>"), ("mistral", "<s>"), ("qwen2", None)])
def test_templated_prompt_has_one_bos(
    tmp_path: Path, family_dirs: dict[str, Path], family: str, bos: str | None
) -> None:
    """The template writes the BOS and the tokenizer would add another: encode_prompt adds none."""
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2+3?", "answer": 5}])
    cfg = jsonl_cfg(path, model__path=str(family_dirs[family]), task__chat_template=True)
    ((prompt, _),) = build.task(cfg).items
    tok = load_tokenizer(family_dirs[family])
    ids = encode_prompt(tok, prompt, templated=True)
    if bos is None:
        assert tok.bos_token_id is None or tok.bos_token_id not in ids
    else:
        assert ids[0] == tok.convert_tokens_to_ids(bos) and ids.count(ids[0]) == 1
        assert tok(prompt).input_ids[:2] == [ids[0], ids[0]]  # what tokenising with special tokens gives


def test_chat_template_errors(tmp_path: Path, family_dirs: dict[str, Path]) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi", "answer": 1}, {"prompt": "FAIL", "answer": 2}])
    with pytest.raises(ConfigError, match="needs model.path: the built-in tiny model's tokenizer has no chat template"):
        build.task(jsonl_cfg(path, task__chat_template=True))
    plain = tmp_path / "plain"
    import shutil

    shutil.copytree(family_dirs["gpt2"], plain)
    conf = json.loads((plain / "tokenizer_config.json").read_text())
    conf.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(conf))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="has no chat template"):
        build.task(jsonl_cfg(path, model__path=str(plain), task__chat_template=True))
    (plain / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['content'] == 'FAIL' %}{{ raise_exception('no FAIL please') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(ConfigError, match=r"p.jsonl:2: the chat template failed on this row \(no FAIL please\)"):
        build.task(jsonl_cfg(path, model__path=str(plain), task__chat_template=True))


# --- data position in checkpoints ------------------------------------------------------------------


def test_position_record_and_resume_check(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "p.jsonl", ROWS)
    run_dir = tmp_path / "run"
    cfg = jsonl_cfg(data, task__prompt_field="q", task__answer_field="a", run__run_dir=str(run_dir))
    ident = build.task(cfg).data_identity(cfg.coordinator.groups_per_epoch)
    ckpt = run_dir / "checkpoints" / "v3"
    ckpt.mkdir(parents=True)
    position.save(ckpt, ident, 3)
    (ckpt / "DONE").write_text("3")
    stored = json.loads((ckpt / "data.json").read_text())
    assert (stored["epoch"], stored["pass"], stored["offset"], stored["rows"]) == (3, 2, 4, 10)  # 3 x 8 = 24
    resumed = jsonl_cfg(
        data, task__prompt_field="q", task__answer_field="a", run__run_dir=str(run_dir), run__resume=True
    )
    build.task(resumed)  # same data: fine
    write_jsonl(data, ROWS[:9] + [{"q": "changed?", "a": "9"}])
    with pytest.raises(ConfigError, match=r"run.resume: the prompt data differ .*sha256"):
        build.task(resumed)
    write_jsonl(data, ROWS)
    other_b = jsonl_cfg(
        data, task__prompt_field="q", task__answer_field="a", run__run_dir=str(run_dir), run__resume=True,
        coordinator__groups_per_epoch=4,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"groups_per_epoch: 8 -> 4"):
        build.task(other_b)

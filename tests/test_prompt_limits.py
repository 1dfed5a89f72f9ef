"""Prompt limits at load: task.max_prompt_tokens leaves long prompts out with one line; prompts that
cannot fit the model's positions with max_new_tokens are refused with one line (a real tiny model
directory: its tokenizer counts the tokens, its config.json gives the positions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prl_actors.config import load_config
from prl_actors.launch import build
from prl_actors.model.tiny import build_family
from prl_actors.sections import ConfigError
from prl_actors.tasks.limits import prompt_lengths
from tests.test_cli import run_cli

pytestmark = pytest.mark.fast

POSITIONS = 512  # model/tiny.py's families


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family("qwen2", tmp_path_factory.mktemp("qwen2"))


def dataset(path: Path, words: list[int]) -> Path:
    """One row per entry: a prompt of that many repeated words."""
    rows = [{"prompt": " ".join(["seven"] * n) + " =", "answer": "7"} for n in words]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def config(model: Path, prompts: Path, **extra: object):  # type: ignore[no-untyped-def]
    return load_config(
        None,
        {
            "task.name": "jsonl",
            "task.prompts_file": str(prompts),
            "model.path": str(model),
            "worker.sampling.max_new_tokens": 16,
            **extra,
        },
    )


def test_long_prompts_are_left_out_with_one_line(model: Path, tmp_path: Path) -> None:
    cfg = config(model, dataset(tmp_path / "d.jsonl", [2, 40, 3, 60, 4]))
    rows = [json.loads(x)["prompt"] for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    lengths = prompt_lengths(cfg.model.path, cfg.task.chat_template, rows)
    limit = max(lengths[0::2])  # rows 0, 2, 4 fit; 1 and 3 do not
    assert limit < min(lengths[1], lengths[3])
    task = build.task(cfg.model_copy(update={"task": cfg.task.model_copy(update={"max_prompt_tokens": limit})}))
    assert [p for p, _ in task.items] == rows[::2]
    assert task.note == (
        f"task.max_prompt_tokens {limit}: left out 2 of 5 prompts longer than that "
        f"(first: {tmp_path / 'd.jsonl'}:2, {lengths[1]} tokens)"
    )
    assert build.task(cfg).note == ""  # no limit: nothing left out


def test_prompts_past_the_model_positions_are_refused_at_load(model: Path, tmp_path: Path) -> None:
    cfg = config(model, dataset(tmp_path / "d.jsonl", [2, 600, 3, 700]))
    with pytest.raises(ConfigError) as err:
        build.task(cfg)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"2 prompts are longer than the model's {POSITIONS} positions minus")
    assert f"= {POSITIONS - 16} tokens (first: {tmp_path / 'd.jsonl'}:2," in line
    # max_prompt_tokens leaves them out instead
    ok = build.task(cfg.model_copy(update={"task": cfg.task.model_copy(update={"max_prompt_tokens": 100})}))
    assert len(ok.items) == 2 and "left out 2 of 4" in ok.note


def test_up_says_it_in_one_line(model: Path, tmp_path: Path) -> None:
    data = dataset(tmp_path / "d.jsonl", [2, 600])
    code, out = run_cli(
        "up",
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        "task.name=jsonl",
        "--set",
        f"task.prompts_file={data}",
        "--set",
        f"model.path={model}",
    )
    assert code == 2
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "1 prompts are longer than the model's 512 positions" in errors[0]
    assert "Traceback" not in out


def test_the_builtin_model_has_256_positions(tmp_path: Path) -> None:
    cfg = load_config(None, {"task.name": "jsonl", "task.prompts_file": str(dataset(tmp_path / "d.jsonl", [1]))})
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "1+" * 130 + "1=", "answer": "131"}) + "\n")
    with pytest.raises(ConfigError, match="256 positions minus worker.sampling.max_new_tokens 8 = 248 tokens"):
        build.task(cfg.model_copy(update={"task": cfg.task.model_copy(update={"prompts_file": str(long)})}))


def test_a_refused_prompt_is_named_by_its_files_line_1_based(model: Path, tmp_path: Path) -> None:
    """Blank lines count as lines: the long prompt on the file's 4th line is named ':4', not by its
    index among the prompts (issue 40: 'row 1' named the 2nd line)."""
    path = dataset(tmp_path / "d.jsonl", [2, 600])
    path.write_text("\n" + path.read_text().replace("\n", "\n\n", 1))  # lines: blank, short, blank, long
    with pytest.raises(ConfigError, match=rf"\(first: {path}:4, \d+ tokens\)"):
        build.task(config(model, path))

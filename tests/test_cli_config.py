"""Config ergonomics (issue 40, item 8 and part of 6): `config show`, `up --dry-run`, the generated
reference docs/CONFIG.md, suggestions by meaning, list values with commas, bounded mode's defaults,
help text that says what an epoch is."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prl_actors.cli.config_cmd import reference
from prl_actors.config import RunSection, load_config, nearest_field, parse_override
from prl_actors.sections import ConfigError
from tests.test_cli_commands import ROOT, run_cli

pytestmark = pytest.mark.fast


def test_config_md_is_the_generated_reference() -> None:
    text = (ROOT / "docs" / "CONFIG.md").read_text()
    assert text == reference(), "docs/CONFIG.md is stale: prl-actors config fields > docs/CONFIG.md"


def test_reference_lists_every_field_with_its_default() -> None:
    ref = reference()
    for section, name, default in (("run", "epochs", "`5`"), ("trainer", "lr", "`0.001`")):
        assert f"## `{section}`" in ref
        assert any(line.startswith(f"| `{name}` |") and default in line for line in ref.splitlines())
    assert "## `worker.sampling`" in ref and "## `task.rewards`" in ref  # nested sections too


def test_config_show_prints_the_resolved_config_with_defaults() -> None:
    code, out = run_cli("config", "show", "--config", str(ROOT / "configs/demo.yaml"), "--set", "trainer.lr=2e-4")
    assert code == 0, out
    shown = yaml.safe_load(out)
    assert shown["trainer"]["lr"] == 2e-4 and shown["run"]["name"] == "demo"
    assert shown["run"]["max_restarts"] == RunSection().max_restarts  # a default the file does not set
    code, out = run_cli("config", "show", "--set", "trainer.learning_rate=1")
    assert code == 2 and "did you mean trainer.lr?" in out


def test_up_dry_run_checks_and_prints_and_starts_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code, out = run_cli("up", "--config", str(ROOT / "configs/sim.yaml"), "--run-dir", str(run_dir), "--dry-run")
    assert code == 0, out
    assert f"run_dir: {run_dir}" in out and "dry run:" in out
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"answer": "3"}\n')
    code, out = run_cli("up", "--dry-run", "--set", "task.name=jsonl", "--set", f"task.prompts_file={bad}")
    assert code == 2 and "error:" in out  # the task's data are checked too


@pytest.mark.parametrize(
    ("unknown", "meant"),
    [
        ("trainer.learning_rate", "trainer.lr"),
        ("worker.num_generations", "worker.group_size"),
        ("trainer.kl_coef", "trainer.beta"),
        ("trainer.max_completion_length", "worker.sampling.max_new_tokens"),
        ("run.learning_rate", "trainer.lr"),  # in the section that has it
        ("model.model_name_or_path", "model.path"),
        ("trainer.lrr", "trainer.lr"),  # spelling still works
    ],
)
def test_suggestions_by_meaning_as_well_as_spelling(unknown: str, meant: str) -> None:
    assert nearest_field(unknown) == meant
    with pytest.raises(ConfigError, match=f"did you mean {meant}"):
        load_config(None, {unknown: 1})


def test_list_values_with_commas() -> None:
    assert parse_override("run.report_to=tensorboard,wandb") == ("run.report_to", ["tensorboard", "wandb"])
    assert parse_override("run.report_to=tensorboard") == ("run.report_to", ["tensorboard"])
    assert parse_override("trainer.lora.target_modules=[q_proj, v_proj]")[1] == ["q_proj", "v_proj"]
    assert parse_override("trainer.lr=0.5") == ("trainer.lr", 0.5)  # not a list: as before
    cfg = load_config(None, dict([parse_override("run.report_to=tensorboard")]))
    assert cfg.run.report_to == ["tensorboard"]
    assert load_config(None, {"run": {"report_to": "tensorboard"}}).run.report_to == ["tensorboard"]  # YAML scalar


def test_bounded_mode_defaults_to_truncated_is() -> None:
    cfg = load_config(None, {"run.mode": "bounded", "run.max_staleness": 1})
    assert cfg.trainer.is_correction == "tis"
    assert load_config(None, {"run.mode": "bounded"}).trainer.is_correction == "none"  # k = 0: on-policy
    with pytest.raises(ConfigError, match="is_correction"):  # an explicit none is the user's, and refused
        load_config(None, {"run.mode": "bounded", "run.max_staleness": 1, "trainer.is_correction": "none"})
    assert load_config(None, {}).trainer.is_correction == "none"  # other modes: unchanged
    for extra in ([], ["--set", "run.max_staleness=1"]):  # with its evaluation on (the pipeline pauses there)
        demo = ("up", "--config", str(ROOT / "configs/demo.yaml"), "--set", "run.mode=bounded", *extra, "--dry-run")
        code, out = run_cli(*demo)
        assert code == 0 and "dry run: the config checks out" in out, out
    demo_k1 = load_config(ROOT / "configs/demo.yaml", {"run.mode": "bounded", "run.max_staleness": 1})
    assert demo_k1.eval.every_epochs == 10 and demo_k1.trainer.is_correction == "tis"


def test_help_says_what_an_epoch_is_and_the_defaults() -> None:
    code, out = run_cli("up", "-h")
    assert code == 0
    flat = " ".join(out.split())
    assert "num_minibatches" in flat and "optimizer step" in flat
    defaults = RunSection()
    assert f"run.workers, {defaults.workers})" in flat and f"run.epochs, {defaults.epochs})" in flat
    assert f"run.mode, {defaults.mode})" in flat
    assert "--mode periodic|sync|bounded" in flat

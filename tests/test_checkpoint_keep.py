"""Issue 40 item 5: checkpoints by default keep a run dir small. trainer.keep_checkpoints defaults to 2
(the newest two) and the best by evaluation is kept beside them; only the newest checkpoint holds the
optimizer's state (twice the weights under Adam), dropped from older ones with their DONE marker
still intact; a resume from one without it starts the optimizer afresh, with a warning; a completed
run's final model is RUN_DIR/final, a Hugging Face directory in the model's dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prl_actors.config import load_config
from prl_actors.records.rundir import DONE, OPTIMIZER_STATE, RunDir, checkpoint_damage

pytestmark = pytest.mark.fast


def fake_checkpoint(path: Path) -> None:
    """What training/checkpoint.save writes, in miniature: weights, optimizer state, then the state file."""
    (path / "weights.bin").write_bytes(b"w" * 100)
    (path / OPTIMIZER_STATE).write_bytes(b"o" * 200)
    (path / "trainer_state.pt").write_bytes(b"s")


def test_keep_checkpoints_defaults_to_a_small_number() -> None:
    assert load_config(None, {}).trainer.keep_checkpoints == 2


def test_only_the_newest_checkpoint_keeps_the_optimizer_state_and_every_one_stays_intact(tmp_path: Path) -> None:
    rd = RunDir(tmp_path, keep_checkpoints=0)  # keep all: the optimizer state still goes from the older ones
    for v in range(1, 5):
        rd.save_checkpoint(v, fake_checkpoint)
    ckpts = [tmp_path / "checkpoints" / f"v{v}" for v in range(1, 5)]
    assert [(p / OPTIMIZER_STATE).exists() for p in ckpts] == [False, False, False, True]
    assert [checkpoint_damage(p) for p in ckpts] == [None] * 4  # their DONE markers forgot the file
    assert OPTIMIZER_STATE not in json.loads((ckpts[0] / DONE).read_text())["sha256"]
    assert rd.latest_checkpoint() == ckpts[-1]


def test_the_best_checkpoint_by_evaluation_is_kept_beside_the_newest(tmp_path: Path) -> None:
    rd = RunDir(tmp_path, keep_checkpoints=2)
    scores = {0: 0.1, 1: 0.2, 2: 0.9, 3: 0.3, 4: 0.5, 5: 0.4}  # v2 scored best
    for v in range(1, 7):
        rd.save_checkpoint(v, fake_checkpoint)
        rd.eval_result(v - 1, v - 1, [], {"epoch": v - 1, "version": v - 1, "eval_mean@4": scores[v - 1]})
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["v2", "v5", "v6"], kept
    assert rd.best_by_eval() == tmp_path / "checkpoints" / "v2"


def test_no_evaluation_means_the_newest_n_only(tmp_path: Path) -> None:
    rd = RunDir(tmp_path, keep_checkpoints=2)
    for v in range(1, 6):
        rd.save_checkpoint(v, fake_checkpoint)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["v4", "v5"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prl_actors.model.tiny import build_family

    return build_family("qwen2", tmp_path_factory.mktemp("tiny"))


def test_checkpoint_save_splits_the_optimizer_and_load_without_it_warns(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from prl_actors.model.builtin import from_pretrained
    from prl_actors.training import checkpoint

    policy = from_pretrained(tiny_model, dtype=torch.float32)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    policy(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    checkpoint.save(tmp_path / "v1", policy, optimizer, 1, tiny_model)
    assert (tmp_path / "v1" / OPTIMIZER_STATE).is_file()
    assert "optimizer" not in torch.load(tmp_path / "v1" / checkpoint.STATE_FILE, weights_only=True)
    fresh = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    assert checkpoint.load(tmp_path / "v1", policy, fresh) == 1
    assert fresh.state_dict()["state"], "the optimizer state was not restored"
    (tmp_path / "v1" / OPTIMIZER_STATE).unlink()
    fresh = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    assert checkpoint.load(tmp_path / "v1", policy, fresh) == 1
    assert not fresh.state_dict()["state"]
    assert "holds no optimizer state" in capsys.readouterr().err


def test_the_final_model_is_exported_in_the_model_dtype(tiny_model: Path, tmp_path: Path) -> None:
    import torch

    from prl_actors.model.builtin import from_pretrained
    from prl_actors.training import checkpoint

    policy = from_pretrained(tiny_model, dtype=torch.float32)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    rd = RunDir(tmp_path / "run")
    rd.save_checkpoint(3, lambda p: checkpoint.save(p, policy, optimizer, 3, tiny_model))
    weights = {k: v.detach().to(torch.bfloat16) for k, v in policy.state_dict().items()}  # as the learner publishes
    final = rd.final_model(lambda out, src: checkpoint.export_final(out, weights, src))
    assert final == tmp_path / "run" / "final"
    loaded = from_pretrained(final)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    assert (final / "tokenizer.json").is_file() or (final / "tokenizer_config.json").is_file()
    size = sum(f.stat().st_size for f in final.iterdir())
    master = sum(f.stat().st_size for f in (tmp_path / "run" / "checkpoints" / "v3" / "model").iterdir())
    assert size < 0.75 * master  # half the bytes of the float32 master weights, plus the same small files


def log_event(actor: str, t: float, name: str) -> str:
    return json.dumps({"actor": actor, "event": name, "t_mono": t, "t_wall": t, "epoch": 0, "version": 0}) + "\n"


def test_an_ended_runs_large_logs_are_gzipped_and_replay_reads_them_with_a_resumes_logs(tmp_path: Path) -> None:
    """A 200-epoch demo writes ~30 MB of logs (JSON lines: ~9x smaller gzipped); past the threshold
    `up` gzips them when a run completes; a resume appends plain logs, compressed after the earlier ones."""
    from prl_actors.replay.events import load_run

    rd = RunDir(tmp_path)
    rd.logs.mkdir()
    (rd.logs / "trainer.jsonl").write_text("".join(log_event("trainer", t, f"e{t}") for t in range(3)))
    assert rd.compress_logs(above=10_000) == 0 and (rd.logs / "trainer.jsonl").exists()  # small: left alone
    assert rd.compress_logs(above=10) > 0
    assert not (rd.logs / "trainer.jsonl").exists() and (rd.logs / "trainer.jsonl.gz").exists()
    (rd.logs / "trainer.jsonl").write_text(log_event("trainer", 5, "resumed"))  # the resumed run's
    assert [e["event"] for e in load_run(tmp_path).events] == ["e0", "e1", "e2", "resumed"]
    rd.compress_logs(above=10)
    assert [p.name for p in rd.logs.iterdir()] == ["trainer.jsonl.gz"]
    assert [e["event"] for e in load_run(tmp_path).events] == ["e0", "e1", "e2", "resumed"]

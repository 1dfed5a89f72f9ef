"""Each model family through the five actors: chat-formatted math prompts from a different data
format per family, generation, shared-prompt GRPO steps, weight transfer, and a resumed epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from prl_actors.config import Config, load_config
from prl_actors.launch.process import LocalCluster
from prl_actors.model.builtin import load_model
from prl_actors.model.tiny import FAMILIES
from prl_actors.tasks.math_task import sample_path
from tests.conftest import assert_invariants, port_base, read_logs

pytestmark = pytest.mark.integration
GROUPS = 4
FORMATS = {"qwen2": "save_to_disk", "llama": "parquet", "gpt2": "jsonl", "mistral": "shipped sample"}


def char_variety(prompt: str, response: str, answer: str) -> float:
    """A reward that differs within a group even for a random-init model (math would be all 0)."""
    return len(set(response)) / 10.0


def write_data(fmt: str, where: Path) -> str | None:
    rows = [json.loads(line) for line in Path(sample_path()).read_text().splitlines()][:12]
    rows = [{"problem": r["question"], "solution": r["answer"]} for r in rows]  # GSM8K-like, renamed fields
    if fmt == "jsonl":
        (where / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(where / "math.jsonl")
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), where / "math.parquet")
        return str(where / "math.parquet")
    if fmt == "save_to_disk":
        import datasets

        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(where / "math_ds"))
        return str(where / "math_ds")
    return None


def run_config(run_dir: Path, model_dir: Path, data: str | None, epochs: int, resume: bool) -> Config:
    fields = {"task.prompts_file": data, "task.prompt_field": "problem", "task.answer_field": "solution"}
    return load_config(
        None,
        {
            "run.name": f"fam{port_base()}",
            "run.run_dir": str(run_dir),
            "run.epochs": epochs,
            "run.resume": resume,
            "transport.kind": "inproc",
            "coordinator.groups_per_epoch": GROUPS,
            "worker.group_size": 4,
            "worker.sampling.max_new_tokens": 8,
            "trainer.lr": 1e-2,
            "model.path": str(model_dir),
            "task.name": "math",
            "task.chat_template": True,
            "task.system_prompt": "Answer with a number.",
            "task.reward": "tests.test_families_e2e:char_variety",
            **(fields if data else {}),
        },
    )


def run(cfg: Config, log_dir: Path) -> torch.nn.Module:
    """Run to the end; returns the worker's engine model (kept open past the worker's exit)."""
    cluster = LocalCluster(cfg, workers=1, log_dir=log_dir)
    engine = cluster.hosts["worker-0"].core.engine  # type: ignore[attr-defined]
    engine.close = lambda: None  # keep its weights for the comparison below
    try:
        assert cluster.wait(240), "the run did not finish"
    finally:
        cluster.close()
    assert engine.version >= 1
    return engine


def events(log_dir: Path, name: str) -> list[dict]:
    found = []
    for path in log_dir.glob("*.jsonl"):
        found += [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == name]
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_and_resumes_through_the_actors(
    family: str, family_dirs: dict[str, Path], tmp_path: Path
) -> None:
    model_dir, run_dir = family_dirs[family], tmp_path / "run"
    data = write_data(FORMATS[family], tmp_path)
    engine = run(run_config(run_dir, model_dir, data, epochs=2, resume=False), run_dir / "logs")
    assert_invariants(run_dir, epochs=2, groups=GROUPS)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1] and all(r["response_len"] > 0 for r in rows)

    # weight transfer: the worker holds exactly the trainer's weights of its version, and they moved
    trained = load_model(run_dir / "checkpoints" / f"v{engine.version}" / "model").state_dict()
    held = engine.model.state_dict()
    assert held.keys() == trained.keys()
    for name, t in trained.items():
        assert torch.equal(held[name], t), name
    init = load_file(str(model_dir / "model.safetensors"))
    assert max((trained[k] - init[k]).abs().max().item() for k in init) > 1e-4

    # resume: one more epoch from checkpoint v2, at the data position recorded there
    recorded = json.loads((run_dir / "checkpoints" / "v2" / "data.json").read_text())
    assert (recorded["epoch"], recorded["pass"], recorded["offset"]) == (2, *divmod(2 * GROUPS, recorded["rows"]))
    run(run_config(run_dir, model_dir, data, epochs=3, resume=True), tmp_path / "logs-resumed")
    resumed = events(tmp_path / "logs-resumed", "train_group")
    assert sorted((e["msg_epoch"], e["group_id"]) for e in resumed) == [(2, g) for g in range(GROUPS)]
    assert [e["new_version"] for e in events(tmp_path / "logs-resumed", "resumed")] == [2]
    assert json.loads((run_dir / "checkpoints" / "v3" / "data.json").read_text())["epoch"] == 3
    assert len(read_logs(run_dir)) > 0

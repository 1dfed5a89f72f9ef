"""Seeing a run (docs/OBSERVE.md): evaluation during training, logged completions, trackers, curves,
checkpoint retention, export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from prl_actors.cli.main import app
from prl_actors.coordinator.evaluation import EVAL_ID_BASE, EvalPlan, MemoryEvalSink, summarize
from prl_actors.launch import build
from prl_actors.launch.process import LocalCluster
from prl_actors.protocol import messages as m
from prl_actors.records.rundir import RunDir
from tests.conftest import assert_invariants
from tests.test_epoch_protocol import B, coordinator, drive, open_epoch
from tests.test_real_path import real_config

K = 2


def eval_coordinator(epochs: int = 2, prompts: int = 3) -> tuple[object, MemoryEvalSink]:
    core = coordinator(epochs=epochs)
    sink = MemoryEvalSink()
    core.eval_plan = EvalPlan([(f"e{i}", str(i), -1) for i in range(prompts)], samples=K, every_epochs=1)
    core.eval_sink = sink
    return core, sink


def ask(core, worker: str, version: int, eval_ok: bool = True) -> m.Msg:  # type: ignore[no-untyped-def]
    (_, reply), *_ = drive(core, 0.1, m.WorkRequest(version=version, eval_ok=eval_ok, max_groups=8), worker)
    return reply


def answer(core, worker: str, assign: m.EvalAssign, rewards: float = 1.0) -> list:  # type: ignore[no-untyped-def]
    groups = [
        m.EvalGroup(
            prompt_id=p.group_id, prompt=p.prompt, answer=p.answer, completions=["x"] * K, rewards=[rewards] * K
        )
        for p in assign.prompts
    ]
    return drive(core, 0.2, m.EvalResult(epoch=assign.epoch, version=assign.version, groups=groups), worker)


def drain(core) -> None:  # type: ignore[no-untyped-def]
    """Hand out every training group of the epoch (to engines that are busy: no eval)."""
    while any([isinstance(ask(core, w, core.epoch, eval_ok=False), m.WorkAssign) for w in ("worker-a", "worker-b")]):
        pass


def finish_epoch(core, epoch: int) -> None:  # type: ignore[no-untyped-def]
    for g in range(B):
        drive(core, 0.2, m.GroupAccepted(epoch=epoch, version=epoch, group_id=g, worker="worker-a"), "buffer")


def test_eval_work_only_after_the_epochs_queue_is_empty_and_never_to_a_busy_engine() -> None:
    core, sink = eval_coordinator()
    open_epoch(core)
    first = ask(core, "worker-a", 0)
    assert isinstance(first, m.WorkAssign)  # training groups first, even to a worker that could evaluate
    drain(core)  # a busy engine (eval_ok False) gets no eval prompts: queue_empty
    assert isinstance(ask(core, "worker-a", 0, eval_ok=False), m.NoWork)
    ev = ask(core, "worker-b", 0)
    assert isinstance(ev, m.EvalAssign) and ev.version == 0 and ev.samples == K
    assert [p.group_id for p in ev.prompts] == [EVAL_ID_BASE + i for i in range(3)][: len(ev.prompts)]


def test_eval_of_a_lost_worker_is_requeued_and_the_next_epoch_waits_for_it() -> None:
    core, sink = eval_coordinator(prompts=2)
    open_epoch(core)
    drain(core)
    held = ask(core, "worker-b", 0)
    assert isinstance(held, m.EvalAssign)
    finish_epoch(core, 0)
    assert core.phase.current == m.Phase.TRAINING
    drive(core, 0.3, m.Leave(reason="gone"), "worker-b")  # its eval prompts go back to the queue
    out = drive(core, 0.3, m.WeightsAvailable(version=1), "publisher")
    assert not any(isinstance(msg, m.EpochOpen) for _, msg in out)  # v0's evaluation is still out
    again = ask(core, "worker-a", 0)  # phase training: only eval work
    assert isinstance(again, m.EvalAssign) and {p.group_id for p in again.prompts} == {p.group_id for p in held.prompts}
    out = answer(core, "worker-a", again, rewards=1.0)
    assert not any(isinstance(msg, m.EpochOpen) for _, msg in out)  # one eval prompt is still queued
    last = ask(core, "worker-a", 0)  # (max_groups_per_request is 1 here)
    assert isinstance(last, m.EvalAssign)
    out = answer(core, "worker-a", last, rewards=1.0)
    assert any(isinstance(msg, m.EpochOpen) and msg.epoch == 1 for _, msg in out)  # now the epoch opens
    ((epoch, version, groups, summary),) = sink.results
    assert (epoch, version, len(groups)) == (0, 0, 2)
    assert summary[f"eval_pass@{K}"] == 1.0 and summary[f"eval_mean@{K}"] == 1.0
    ((_, status),) = drive(core, 0.5, m.StatusRequest(), "operator")  # `prl-actors status` shows it
    assert isinstance(status, m.Status) and status.eval[f"eval_pass@{K}"] == 1.0 and status.eval["version"] == 0


def test_the_final_weights_are_evaluated_before_the_run_ends() -> None:
    core, sink = eval_coordinator(epochs=1, prompts=1)
    core.eval_plan.done.add(0)  # type: ignore[attr-defined]  # resumed: v0 was evaluated before
    open_epoch(core)
    assert core.eval_epoch == -1
    finish_epoch(core, 0)
    out = drive(core, 0.4, m.StepDone(epoch=0, version=1), "trainer")
    assert not core.stopped
    assert {d for d, msg in out if isinstance(msg, m.EpochStart) and msg.version == 1} == {"id:worker-a", "id:worker-b"}
    ev = ask(core, "worker-a", 1)
    assert isinstance(ev, m.EvalAssign) and ev.version == 1
    answer(core, "worker-a", ev, rewards=0.0)
    assert core.stopped and [r[0] for r in sink.results] == [1]


def test_pass_and_mean_at_k() -> None:
    g = [
        m.EvalGroup(prompt_id=0, prompt="", answer="", completions=[], rewards=[0.0, 1.0]),
        m.EvalGroup(prompt_id=1, prompt="", answer="", completions=[], rewards=[0.0, 0.0]),
    ]
    assert summarize(g, 2) == {"eval_pass@2": 0.5, "eval_mean@2": 0.25}


def test_keep_checkpoints_prunes_old_ones_but_never_the_resumed_one(tmp_path: Path) -> None:
    rd = RunDir(tmp_path, keep_checkpoints=2)
    for v in (1, 2, 3):
        rd.save_checkpoint(v, lambda p: (p / "w").write_text("x"))
    assert sorted(p.name for p in rd.checkpoints.iterdir()) == ["v2", "v3"]
    resumed = RunDir(tmp_path, keep_checkpoints=1)
    assert resumed.latest_checkpoint() == rd.checkpoints / "v3"
    for v in (4, 5):
        resumed.save_checkpoint(v, lambda p: (p / "w").write_text("y"))
    assert sorted(p.name for p in rd.checkpoints.iterdir()) == ["v3", "v5"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same 2-epoch real run without and with evaluation (+ completions, retention, trackers)."""
    from prl_actors.launch import build

    root = tmp_path_factory.mktemp("observe")
    model = build.model_dir(real_config(root / "m", "periodic", None, **{"eval.every_epochs": 0}), root / "m")
    out = []
    for name, extra in (
        ("plain", {"eval.every_epochs": 0}),
        (
            "eval",
            {
                "eval.every_epochs": 1,
                "eval.samples": 3,
                "eval.num_prompts": 5,
                "eval.sampling": {"temperature": 0.0, "max_new_tokens": 4},
                "run.log_completions": 3,
                "trainer.keep_checkpoints": 1,
            },
        ),
    ):
        cfg = real_config(root / name, "periodic", model, **extra)
        cluster = LocalCluster(cfg, workers=2, log_dir=root / name / "logs")
        try:
            assert cluster.wait(120), f"the {name} run did not finish"
        finally:
            cluster.close()
        out.append(root / name)
    return out[0], out[1]


@pytest.mark.integration
def test_evaluation_never_changes_what_is_trained(runs: tuple[Path, Path]) -> None:
    plain, evald = runs
    assert_invariants(evald, epochs=2, groups=4)
    a = load_file(str(plain / "checkpoints/v2/model/model.safetensors"))
    b = load_file(str(evald / "checkpoints/v2/model/model.safetensors"))
    for k in a:  # same groups, same weights: eval samples never reached the trainer
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4, msg=k)
    rows = RunDir(evald).eval_rows()
    assert [(r["epoch"], r["version"]) for r in rows] == [(0, 0), (1, 1), (2, 2)]  # every epoch + final
    for r in rows:
        assert 0.0 <= r["eval_mean@3"] <= r["eval_pass@3"] <= 1.0
    per_prompt = [json.loads(x) for x in (evald / "eval/epoch-2.jsonl").read_text().splitlines()]
    assert len(per_prompt) == 5 and all(len(p["completions"]) == 3 == len(p["rewards"]) for p in per_prompt)
    assert all(len(set(p["completions"])) == 1 for p in per_prompt)  # eval.sampling: greedy
    assert [r["epoch"] for r in RunDir(evald).metrics_rows()] == [0, 1]  # training rows unchanged
    assert sorted(p.name for p in (evald / "checkpoints").iterdir()) == ["v2"]  # keep_checkpoints: 1
    from prl_actors.launch.up import summary

    lines = summary(evald, 1.0)  # what `up` prints at the end
    assert "eval v0 -> v2: eval_pass@3" in lines and f"final model: {evald}/final (" in lines  # model.dtype


@pytest.mark.integration
def test_completions_replay_and_curves(runs: tuple[Path, Path], tmp_path: Path) -> None:
    _, evald = runs
    rows = [json.loads(x) for x in (evald / "completions.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 0, 0, 1, 1, 1]
    assert {"prompt", "completion", "reward", "advantage", "version"} <= set(rows[0])
    res = CliRunner().invoke(app, ["replay", str(evald), "--completions", "--epoch", "1"])
    assert res.exit_code == 0 and "== epoch 1 (v1)" in res.output and "epoch 0" not in res.output
    res = CliRunner().invoke(app, ["replay", str(evald), "--curves", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    for panel in ("loss", "grad norm", "response length", "entropy", "clip fraction"):  # the learner reports them
        assert panel in res.output, (panel, res.output)
    for row in RunDir(evald).metrics_rows():
        assert {"clip_frac_low", "clip_frac_high", "entropy", "grad_norm", "response_len"} <= set(row)
        assert row["entropy"] > 0 and row["clip_frac_low"] == row["clip_frac_high"] == 0  # M x mu = 1: ratio 1
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    res = CliRunner().invoke(app, ["replay", str(tmp_path), "--completions"])
    assert res.exit_code == 2 and "log_completions" in res.output


@pytest.mark.integration
def test_export_loads_with_transformers_and_generates(runs: tuple[Path, Path], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plain, _ = runs
    res = CliRunner().invoke(app, ["export", str(plain), "--out", str(tmp_path / "hf"), "--version", "1"])
    assert res.exit_code == 0, res.output
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (tmp_path / "hf" / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    ids = tok("3+4=", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    saved = load_file(str(plain / "checkpoints/v1/model/model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in load_file(str(tmp_path / "hf/model.safetensors")).items())
    res = CliRunner().invoke(app, ["export", str(plain), "--out", str(tmp_path / "x"), "--version", "9"])
    assert res.exit_code == 2 and "no complete checkpoint v9" in res.output


def _wandb_history(run_file: Path) -> list[dict[str, object]]:
    """The history rows of a wandb offline run file (its LevelDB-log records, wandb's own protobuf)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf, rows = run_file.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_trackers_read_back_with_each_librarys_own_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from prl_actors.records.tracking import MetricsFollower

    monkeypatch.delenv("WANDB_MODE", raising=False)  # the default must be offline
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"epoch": 0, "version": 1, "reward_mean": 9.0}) + "\n")
    follower = MetricsFollower(tmp_path, ["tensorboard", "wandb", "mlflow"], "t", {"run": {"epochs": 2}})
    assert len(follower.trackers) == 3  # the rows before it started (a resumed run's) are not sent again
    follower.start()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"epoch": 0, "version": 1, "reward_mean": 0.25, "kl": 0.0}) + "\n")
        f.write(json.dumps({"eval": True, "epoch": 0, "version": 0, "eval_pass@4": 0.5}) + "\n")
        f.write(json.dumps({"epoch": 1, "version": 2, "reward_mean": 0.5}) + "\n")
    follower.stop()
    assert follower.rows == 3

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward_mean")] == [(0, 0.25), (1, 0.5)]
    assert [(e.step, e.value) for e in acc.Scalars("eval_pass@4")] == [(0, 0.5)]

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (exp,) = [e for e in client.search_experiments() if e.name == "t"]
    (run,) = client.search_runs([exp.experiment_id])
    hist = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [(h.step, h.value) for h in hist] == [(0, 0.25), (1, 0.5)]
    assert client.get_metric_history(run.info.run_id, "eval_pass_at_4")[0].value == 0.5
    assert run.data.params["run.epochs"] == "2"

    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")  # offline: no network
    history = _wandb_history(run_file)
    assert [(h["_step"], h["reward_mean"]) for h in history] == [(0, 0.25), (1, 0.5)]
    assert history[0]["eval_pass@4"] == 0.5


def test_the_classic_rl_policy_is_saved_and_loads_back(tmp_path: Path) -> None:
    from prl_actors.classic.envkit.policy import Agent
    from prl_actors.classic.envkit.ppo import save_policy

    agent = Agent(4, 2, 16)
    path = save_policy(tmp_path / "final", agent, "CartPole-v1", 16)
    saved = torch.load(path, weights_only=True)
    assert saved["meta"] == {"env_id": "CartPole-v1", "obs_dim": 4, "n_actions": 2, "hidden": 16}
    again = Agent(saved["meta"]["obs_dim"], saved["meta"]["n_actions"], saved["meta"]["hidden"])
    again.load_state_dict(saved["state_dict"])
    x = torch.randn(3, 4)
    assert torch.equal(again.actor(x), agent.actor(x))


@pytest.mark.slow  # ~25 s on 2 shared cores (a warm start, a LoRA step, three model loads)
def test_lora_export_merged_and_adapter_load_with_transformers(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prl_actors.engines.torch_engine import TorchEngine
    from prl_actors.launch.topology import learner_settings
    from prl_actors.training.grpo import GRPOLearner
    from tests.learning_utils import prompts, random_rewards, tiny_model
    from tests.test_lora import with_lora

    cfg, model_dir = tiny_model(tmp_path / "m")
    engine = TorchEngine(build.engine_settings(cfg), model_dir)
    engine.version = 0
    groups = random_rewards(engine.generate(prompts(["3+4=", "7+15=", "9+9="]), 4))
    cfg = with_lora(cfg, dropout=0.0)
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    learner.begin_epoch(0, len(groups))
    for g in groups:
        learner.accumulate(g)
    learner.step()
    RunDir(tmp_path / "run").save_checkpoint(learner.version, learner.save_checkpoint)
    runner = CliRunner()
    res = runner.invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "merged")])
    assert res.exit_code == 0 and "merged LoRA model" in res.output, res.output
    res = runner.invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "adapter"), "--adapter"])
    assert res.exit_code == 0 and "LoRA adapter" in res.output, res.output

    tok = AutoTokenizer.from_pretrained(str(tmp_path / "merged"), local_files_only=True)
    ids = tok("3+4=", return_tensors="pt").input_ids
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), local_files_only=True).eval()
    assert not hasattr(merged, "peft_config") and (tmp_path / "merged/generation_config.json").is_file()
    assert merged.generate(ids, max_new_tokens=3, do_sample=False).shape[1] > ids.shape[1]
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    adapted = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    with torch.no_grad():  # the adapter export on its base computes the merged export's logits
        torch.testing.assert_close(adapted(ids).logits, merged(ids).logits, atol=1e-5, rtol=0)
    assert AutoTokenizer.from_pretrained(str(tmp_path / "adapter"), local_files_only=True)("1+1=").input_ids


def test_evaluation_survives_resume_and_replays(tmp_path: Path) -> None:
    from prl_actors.replay.checks import run_checks
    from prl_actors.replay.events import load_run
    from tests.conftest import sim_config

    run_dir = tmp_path / "run"
    for epochs, resume in ((2, False), (4, True)):
        cfg = sim_config(run_dir, run__epochs=epochs, run__resume=resume, eval__every_epochs=2, eval__num_prompts=3)
        cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
        try:
            assert cluster.wait(30), "run did not finish"
        finally:
            cluster.close()
    rd = RunDir(run_dir)
    assert [r["epoch"] for r in rd.metrics_rows()] == [0, 1, 2, 3]
    assert [r["epoch"] for r in rd.eval_rows()] == [0, 2, 4]  # v2 (the first run's final) is not redone
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == ["epoch-0.jsonl", "epoch-2.jsonl", "epoch-4.jsonl"]
    results = run_checks(load_run(run_dir))
    assert all(r.ok for r in results), [r.summary for r in results]


def _eval_on(core, engine_idle: bool = True) -> list[m.Msg]:  # type: ignore[no-untyped-def]
    from tests.test_epoch_protocol import inbound

    msg = m.EvalAssign(
        reply_to="r",
        epoch=0,
        version=0,
        samples=2,
        prompts=[m.Prompt(group_id=EVAL_ID_BASE, prompt="ctx 1", answer="4")],
    )
    core.handle(0.0, inbound(msg, "coordinator", peer="coordinator"))
    while core.deferred:
        core.deferred.pop(0)(0.0)
    out, core.outbox = core.outbox, []
    return [x for _, x, _ in out]


def test_a_worker_runs_eval_alone_and_returns_every_prompt_even_when_the_engine_fails() -> None:
    import numpy as np

    from prl_actors.engines.sim import SimEngine
    from tests.test_epoch_protocol import FailingEngine, sim_config_for_cores, worker

    engine = SimEngine(build.engine_settings(sim_config_for_cores()))
    engine.load_weights(0, {"theta": np.zeros((8, 8), dtype=np.float32)})
    core = worker(engine)
    core.eval_sampling = object()  # this run evaluates
    out = _eval_on(core)
    (result,) = [x for x in out if isinstance(x, m.EvalResult)]
    assert not any(isinstance(x, m.GroupResult) for x in out)  # eval samples never go to the buffer
    ((g),) = result.groups
    assert (g.prompt_id, len(g.completions), len(g.rewards), g.error) == (EVAL_ID_BASE, 2, 2, "")
    assert core.evaluating is None and isinstance(out[-1], m.WorkRequest)  # back to training work

    class IdleUntilAdmitted(FailingEngine):
        busy = False

        def admit(self, prompts: list[m.Prompt], group_size: int) -> None:
            self.busy = True

    failing = worker(IdleUntilAdmitted())
    failing.eval_sampling = object()
    out = _eval_on(failing)
    (result,) = [x for x in out if isinstance(x, m.EvalResult)]
    assert result.groups[0].error == "RuntimeError: device lost" and result.groups[0].rewards == []
    assert failing.registered and failing.counters["eval_failed"] == 1  # no re-register: no endless retry


def test_a_retried_epoch_open_does_not_wait_for_its_own_evaluation() -> None:
    core, _ = eval_coordinator()
    drive(core, 0.0, m.Register(role=m.Role.BUFFER), "buffer")
    drive(core, 0.0, m.WeightsAvailable(version=0), "publisher")  # epoch 0 opening, its eval queued
    assert core.eval_epoch == 0 and core.phase.current == m.Phase.OPENING
    core.now = 20.0
    core.tick(20.0)  # the buffer never acked: the open is retried
    out = core.outbox
    assert any(isinstance(msg, m.EpochOpen) and msg.epoch == 0 for _, msg, _ in out)
    assert core.phase.current == m.Phase.OPENING


def test_the_last_step_done_before_its_weights_are_announced_still_gets_the_final_evaluation() -> None:
    core, sink = eval_coordinator(epochs=1, prompts=1)
    open_epoch(core)
    drain(core)
    finish_epoch(core, 0)
    ev0 = ask(core, "worker-b", 0)
    assert isinstance(ev0, m.EvalAssign)
    drive(core, 0.4, m.StepDone(epoch=0, version=1), "trainer")  # before the publisher's weights_available
    assert not core.stopped  # v0's evaluation is still out
    answer(core, "worker-b", ev0)
    assert not core.stopped and core.eval_epoch == 1  # the final weights v1 are evaluated next
    ev1 = ask(core, "worker-a", 1)
    assert isinstance(ev1, m.EvalAssign) and ev1.version == 1
    answer(core, "worker-a", ev1)
    assert core.stopped and [r[0] for r in sink.results] == [0, 1]


def test_eval_config_mistakes_are_one_line(tmp_path: Path) -> None:
    from prl_actors.config import load_config
    from prl_actors.sections import ConfigError

    repo = Path(__file__).resolve().parent.parent
    with pytest.raises(ConfigError, match=r"eval.samples \(20\) exceeds the sim engine's batch"):
        load_config(repo / "configs/sim.yaml", {"eval.every_epochs": 1, "eval.samples": 20})
    with pytest.raises(ConfigError, match="eval.every_epochs"):
        load_config(None, {"eval.every_epochs": -1})
    cfg = load_config(None, {"eval.every_epochs": 1, "eval.sampling": {"temperature": 0.0}})
    assert cfg.eval.sampling is not None and cfg.eval.sampling.temperature == 0.0  # greedy is fine for eval
    with pytest.raises(ConfigError, match="eval.sampling needs worker.engine torch"):
        load_config(repo / "configs/sim.yaml", {"eval.every_epochs": 1, "eval.sampling": {"temperature": 0.0}})
    res = CliRunner().invoke(
        app,
        ["up", "--config", str(repo / "configs/sim.yaml"), "--run-dir", str(tmp_path / "r"), "--set",
         "eval.every_epochs=1", "--set", f"eval.prompts_file={tmp_path / 'missing.jsonl'}"],
    )  # fmt: skip
    assert res.exit_code == 2 and "eval.prompts_file:" in res.output and "Traceback" not in res.output


def test_evaluation_with_dynamic_sampling(tmp_path: Path) -> None:
    from prl_actors.replay.checks import run_checks
    from prl_actors.replay.events import load_run
    from tests.test_dynamic_sampling import dynamic_config

    run_dir = tmp_path / "run"
    cfg = dynamic_config(run_dir, eval__every_epochs=1, eval__num_prompts=3)
    cluster = LocalCluster(cfg, workers=2, log_dir=run_dir / "logs")
    try:
        assert cluster.wait(60), "run did not finish"
    finally:
        cluster.close()
    epochs = cfg.run.epochs
    assert [r["epoch"] for r in RunDir(run_dir).eval_rows()] == list(range(epochs + 1))
    results = run_checks(load_run(run_dir))
    assert all(r.ok for r in results), [r.summary for r in results]

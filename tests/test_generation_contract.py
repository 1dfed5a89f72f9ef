"""The run's generation contract (runtime/contract.py): a worker whose sampling settings, group size,
token limits, model or task differ from the run's is refused at Register with one line naming the
setting; a matching one joins. The same with a hand-started worker against `prl-actors up`:
tests/test_generation_contract_live.py."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from prl_actors.coordinator.core import CoordinatorCore
from prl_actors.engines.sim import SimEngine
from prl_actors.launch import build
from prl_actors.launch.topology import generation_contract
from prl_actors.protocol import messages as m
from prl_actors.records.logs import EventLog
from prl_actors.runtime import contract
from prl_actors.tasks.base import Task, exact_match
from prl_actors.transport.port import Inbound
from prl_actors.worker.core import WorkerCore
from tests.conftest import sim_config

pytestmark = pytest.mark.fast

RUN = m.GenerationContract(
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    min_p=0.0,
    repetition_penalty=1.0,
    stop=[],
    max_new_tokens=8,
    group_size=4,
    max_turns=4,
    max_turn_tokens=8,
    model="builtin:0123456789abcdef",
    model_dtype="float32",
    task="add:400:0123456789abcdef",
)
OTHER: dict[str, object] = {  # a value other than RUN's, per field
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 20,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "stop": ["\n"],
    "max_new_tokens": 16,
    "group_size": 8,
    "max_turns": 2,
    "max_turn_tokens": 4,
    "model": "hf:fedcba9876543210",
    "model_dtype": "bfloat16",
    "task": "add:400:fedcba9876543210",
}


def test_every_field_is_in_the_contract_and_compared() -> None:
    assert set(OTHER) == set(contract.FIELDS) == set(m.GenerationContract.__struct_fields__)
    assert contract.refusal("worker-x", RUN, RUN) is None


@pytest.mark.parametrize("field", list(contract.FIELDS))
def test_a_contract_differing_in_one_field_is_refused_naming_it(field: str) -> None:
    mine = msgspec.structs.replace(RUN, **{field: OTHER[field]})
    why = contract.refusal("worker-x", mine, RUN)
    assert why is not None and "\n" not in why
    assert f"{contract.FIELDS[field]} is {OTHER[field]!r} on worker-x but {getattr(RUN, field)!r} in the run" in why


def test_the_contract_comes_from_the_config(tmp_path: Path) -> None:
    task = Task(items=[("ctx 1", "4")], reward=exact_match)
    base = generation_contract(sim_config(tmp_path), task)
    hot = generation_contract(sim_config(tmp_path, worker__sampling__temperature=0.5), task)
    assert (
        base.group_size == 4 and base.model.startswith("sim:") and base.task.endswith(f":1:{task.fingerprint()[:16]}")
    )
    assert contract.first_difference(hot, base) == ("worker.sampling.temperature", 0.5, 1.0)
    other_task = Task(items=[("ctx 2", "4")], reward=exact_match)
    assert contract.first_difference(generation_contract(sim_config(tmp_path), other_task), base)[0].startswith("task")


def test_a_model_directory_is_known_by_its_config_and_tokenizer_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "config.json").write_text('{"hidden_size": 8}')
        (d / "tokenizer.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"weights are not read")
    (b / "model.safetensors").write_bytes(b"other weights")
    assert contract.files_digest(a) == contract.files_digest(b)  # the same checkpoint, elsewhere
    (b / "tokenizer.json").write_text('{"other": 1}')
    assert contract.files_digest(a) != contract.files_digest(b)


# --- the coordinator and the worker cores ---------------------------------------------------------


def coordinator() -> CoordinatorCore:
    from tests.test_epoch_protocol import coordinator as plain

    core = plain()
    core.s.contract = RUN
    return core


def register(core: CoordinatorCore, name: str, sent: m.GenerationContract | None) -> m.Msg:
    core.now = 0.0
    core.handle(0.0, Inbound(m.Register(role=m.Role.WORKER, sender=name, contract=sent), [], identity=name.encode()))
    (reply,) = [msg for _, msg, _ in core.outbox]
    core.outbox = []
    return reply


def test_the_coordinator_refuses_a_worker_with_another_temperature_and_welcomes_a_matching_one() -> None:
    core = coordinator()
    reply = register(core, "worker-hot", msgspec.structs.replace(RUN, temperature=0.5))
    assert isinstance(reply, m.Error) and reply.code == m.ErrorCode.REJECTED
    assert "worker.sampling.temperature is 0.5 on worker-hot but 1.0 in the run" in reply.detail
    assert "worker-hot" not in core.members and any("worker.sampling.temperature" in n for n in core.notices)
    missing = register(core, "worker-old", None)
    assert isinstance(missing, m.Error) and "sent no generation contract" in missing.detail
    welcome = register(core, "worker-ok", RUN)
    assert isinstance(welcome, m.Welcome) and welcome.contract == RUN and "worker-ok" in core.members


def test_a_worker_sends_its_contract_and_will_not_join_a_run_under_another() -> None:
    task = Task(items=[("ctx 1", "4")], reward=exact_match)
    engine = SimEngine(build.engine_settings(sim_config(Path("/nonexistent"))))
    core = WorkerCore("worker-x", EventLog("worker-x", "worker"), engine, task, 4, 5.0, 1.0, contract=RUN)
    core.start(0.0)
    (register_msg,) = [msg for _, msg, _ in core.outbox]
    assert isinstance(register_msg, m.Register) and register_msg.contract == RUN
    welcome = m.Welcome(
        reply_to=register_msg.id,
        run_id="r",
        mode="periodic",
        group_size=4,
        groups_per_epoch=4,
        heartbeat_interval_s=0.1,
        publisher_addr="p",
        buffer_addr="b",
        contract=msgspec.structs.replace(RUN, top_p=0.9),
        sender="coordinator",
    )
    core.handle(0.0, Inbound(welcome, [], peer="coordinator", identity=b""))
    assert core.failure is not None and "worker.sampling.top_p is 1.0 on worker-x but 0.9 in the run" in core.failure

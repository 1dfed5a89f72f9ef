"""threads: auto splits a host's cores between the trainer and the local workers, never oversubscribing
more than the one-thread-per-process floor forces."""

from __future__ import annotations

import pytest

from prl_actors.config import load_config
from prl_actors.runtime.threads import rank_threads, threads_for
from prl_actors.sections import ConfigError

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("cores", "workers", "trainer", "worker"),
    [(2, 1, 1, 1), (2, 2, 1, 1), (16, 1, 8, 8), (16, 3, 8, 2), (8, 0, 8, 1), (1, 1, 1, 1)],
)
def test_auto_threads_split_the_cores(cores: int, workers: int, trainer: int, worker: int) -> None:
    cfg = load_config(None, {})
    assert threads_for(cfg.worker, cfg.trainer, "trainer", workers, cores) == trainer
    if workers:
        assert threads_for(cfg.worker, cfg.trainer, "worker", workers, cores) == worker
        assert trainer + worker * workers <= max(cores, 1 + workers)


def test_a_standalone_actor_takes_every_core_and_numbers_win() -> None:
    cfg = load_config(None, {})
    assert threads_for(cfg.worker, cfg.trainer, "worker", None, cores=12) == 12
    fixed = load_config(None, {"worker.threads": 3, "trainer.threads": 5})
    assert (
        threads_for(fixed.worker, fixed.trainer, "worker", 2, cores=2) == 3
        and threads_for(fixed.worker, fixed.trainer, "trainer", 2, cores=2) == 5
    )


@pytest.mark.parametrize(("cores", "world", "threads"), [(2, 2, 1), (16, 2, 8), (16, 3, 5), (1, 4, 1)])
def test_auto_rank_threads_split_the_cores_across_ranks(cores: int, world: int, threads: int) -> None:
    cfg = load_config(None, {"trainer.world_size": world, "trainer.strategy": "ddp"})
    assert rank_threads(cfg.trainer, cores) == threads
    fixed = load_config(None, {"trainer.world_size": world, "trainer.strategy": "ddp", "trainer.threads": 3})
    assert rank_threads(fixed.trainer, cores) == 3


def test_threads_must_be_positive_or_auto() -> None:
    for bad in (0, "many"):
        with pytest.raises(ConfigError, match="trainer.threads"):
            load_config(None, {"trainer.threads": bad})


class _Model:
    def __init__(self, n: int) -> None:
        import torch

        self.weight = torch.nn.Parameter(torch.zeros(n))

    def parameters(self) -> list:  # type: ignore[type-arg]
        return [self.weight]


class _Holder:
    def __init__(self, n: int) -> None:
        self.model = self.policy = _Model(n)


def test_hand_over_plans_only_where_one_side_can_use_the_others_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's plan needs local workers; the worker's plan needs to be the host's only worker
    (several split the cores) and the torch engine; both need a model worth more threads; sync
    mode gives both every core throughout (the other side waits)."""
    from prl_actors.launch import topology
    from prl_actors.runtime.threads import LOCAL_WORKERS_ENV

    cfg = load_config(None, {"worker.engine": "torch"})
    big, small = _Holder(topology.BOOST_MIN_PARAMS), _Holder(1000)
    monkeypatch.delenv(LOCAL_WORKERS_ENV, raising=False)
    assert topology._trainer_threads(cfg, big) is None and topology._worker_threads(cfg, big) is None
    monkeypatch.setenv(LOCAL_WORKERS_ENV, "1")
    plan = topology._worker_threads(cfg, big)
    assert plan is not None and plan.full >= plan.share >= 1
    assert topology._trainer_threads(cfg, big) is not None
    assert topology._worker_threads(cfg, small) is None and topology._trainer_threads(cfg, small) is None
    sim = load_config(None, {"worker.engine": "sim", "trainer.learner": "sim"})
    assert topology._worker_threads(sim, big) is None and topology._trainer_threads(sim, big) is None
    assert topology._worker_threads(load_config(None, {"worker.engine": "torch", "worker.threads": 1}), big) is None
    sync = topology._worker_threads(load_config(None, {"worker.engine": "torch", "run.mode": "sync"}), big)
    assert sync is not None and sync.share == sync.full
    monkeypatch.setenv(LOCAL_WORKERS_ENV, "2")
    assert topology._worker_threads(cfg, big) is None and topology._trainer_threads(cfg, big) is not None

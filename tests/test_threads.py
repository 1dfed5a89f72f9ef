"""threads: auto splits a host's cores between the trainer and the local workers, never oversubscribing
more than the one-thread-per-process floor forces."""

from __future__ import annotations

import pytest

from prl_actors.config import ConfigError, load_config
from prl_actors.process import threads_for


@pytest.mark.parametrize(
    ("cores", "workers", "trainer", "worker"),
    [(2, 1, 1, 1), (2, 2, 1, 1), (16, 1, 8, 8), (16, 3, 8, 2), (8, 0, 8, 1), (1, 1, 1, 1)],
)
def test_auto_threads_split_the_cores(cores: int, workers: int, trainer: int, worker: int) -> None:
    cfg = load_config(None, {})
    assert threads_for(cfg, "trainer", workers, cores) == trainer
    if workers:
        assert threads_for(cfg, "worker", workers, cores) == worker
        assert trainer + worker * workers <= max(cores, 1 + workers)


def test_a_standalone_actor_takes_every_core_and_numbers_win() -> None:
    cfg = load_config(None, {})
    assert threads_for(cfg, "worker", None, cores=12) == 12
    fixed = load_config(None, {"worker.threads": 3, "trainer.threads": 5})
    assert threads_for(fixed, "worker", 2, cores=2) == 3 and threads_for(fixed, "trainer", 2, cores=2) == 5


def test_threads_must_be_positive_or_auto() -> None:
    for bad in (0, "many"):
        with pytest.raises(ConfigError, match="trainer.threads"):
            load_config(None, {"trainer.threads": bad})

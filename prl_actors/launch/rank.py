"""A trainer rank other than 0, as a process: `python -m prl_actors.launch.rank` (rank 0 starts ranks
1..N-1 so, trainer/rank_group.py, with its resolved config in PRL_RANK_CONFIG; or `--config FILE`).
The rank itself is trainer/distributed.py's `run_rank`; this module only reads its config, hands the
rank its sections (`follow_rank`, also `actor trainer`'s under torchrun) and exits.
"""

from __future__ import annotations

import os
import sys

from prl_actors.config import Config, load_config
from prl_actors.sections import ConfigError
from prl_actors.trainer.distributed import run_rank
from prl_actors.trainer.rank_group import RANK_CONFIG_ENV, RankEnv


def main() -> None:
    env = RankEnv.from_environ()
    if env is None:
        print("error: a trainer rank needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT", file=sys.stderr)
        raise SystemExit(2)
    text = os.environ.get(RANK_CONFIG_ENV)
    path = sys.argv[sys.argv.index("--config") + 1] if "--config" in sys.argv else None
    try:
        cfg = load_config_text(text) if text else load_config(path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    code = follow_rank(cfg, env)
    sys.stdout.flush()
    os._exit(code)


def follow_rank(cfg: Config, env: RankEnv) -> int:
    """Run rank `env.rank` (not 0) of the trainer group under `cfg`: trainer/distributed.py's run_rank,
    with the model directory rank 0's `up` built (read once the rank has joined)."""
    from prl_actors.launch.topology import learner_settings, model_dir

    return run_rank(
        learner_settings(cfg),
        lambda: model_dir(cfg),
        env,
        join_timeout_s=cfg.transport.join_timeout_s,
        run_dir=cfg.run.run_dir,
    )


def load_config_text(text: str) -> Config:
    """The config rank 0 handed over (its own resolved config, dumped)."""
    import yaml
    from pydantic import ValidationError

    try:
        return Config.model_validate(yaml.safe_load(text))
    except ValidationError as exc:
        raise ConfigError(f"invalid config from rank 0: {exc}") from None


if __name__ == "__main__":
    main()

"""Rewards: what a reward function receives (record.py), named weighted rewards (reward.py, combine.py),
the built-ins (builtins.py), reward models (model.py), remote services (http.py), the code sandbox
(code.py), and the loader from `task.rewards` (load.py). See docs/TASKS.md."""

from prl_actors.rewards.combine import RewardSet, Scored
from prl_actors.rewards.errors import RewardError
from prl_actors.rewards.record import RewardInput
from prl_actors.rewards.reward import Reward

__all__ = ["Reward", "RewardError", "RewardInput", "RewardSet", "Scored"]

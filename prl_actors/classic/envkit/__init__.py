"""The classic-RL env runtime's parts, below the actors and the config (docs/ENVS.md): the `env` config
section (settings), env slots and their owners (slots), VectorEnv calls and rounds (calls, rounds),
local Gymnasium envs (local), array frames (arrays), the acting policy and PPO (acting, policy, ppo).
No sockets and no actors here: the env actors (classic/env_actor.py, classic/learner.py) use these parts, and
prl_actors/classic/envs/ composes a classic-RL run from them (hub, run, remote client, DETACH acting)."""

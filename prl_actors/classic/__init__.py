"""Classic RL (Gymnasium): the learner and env actor processes, the environments (envs) and the
learner's PPO kit (envkit); docs/ENVS.md."""

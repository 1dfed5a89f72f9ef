"""Multi-turn environments and tool calling for language models (docs/TASKS.md, "Writing an
environment", "Writing a tool"). Not the classic-RL stack (prl_actors/classic/envs/, Gymnasium)."""

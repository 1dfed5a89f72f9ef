"""Classic RL through env actors: remote Gymnasium envs, DETACH acting, AAPS (docs/ENVS.md)."""

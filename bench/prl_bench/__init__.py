"""`prl-actors bench`: the speed-ups measured against their physical limits (see bench/README.md)."""

"""Learners: GRPO (real model) and a simulated learner for control-plane tests."""

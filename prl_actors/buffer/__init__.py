"""The RolloutBuffer process: admits each group of the open epoch exactly once and streams it to the Trainer."""

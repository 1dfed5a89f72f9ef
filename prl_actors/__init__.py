"""prl-actors: periodic-asynchronous GRPO with five ZeroMQ actors."""

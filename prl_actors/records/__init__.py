"""The run's records on disk: the run directory, one JSON-lines log per actor, completions, curves, trackers."""

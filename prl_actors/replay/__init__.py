"""Debugging a run from its directory alone: `prl-actors replay RUN_DIR`.

    events      load and merge RUN_DIR/logs/*.jsonl into one timeline (ReplayError on bad input)
    spans       span_begin/span_end pairs, interval arithmetic (idle, overlap)
    epochs      per-epoch windows and numbers; summary renders them
    invariants  on-policy, exactly-once, M x mu steps and one version per epoch;  replies  every request answered
    coordinator_replay  feed the recorded inputs to a fresh CoordinatorCore, compare decisions
    checks      all of the above as one --check report
    trace       Chrome/Perfetto trace-event JSON;  gantt  the same as a PNG Gantt chart
    follow      --filter and --follow
docs/DEBUGGING.md is the user guide, docs/LOGS.md the list of events.
"""

from __future__ import annotations

from prl_actors.replay.events import ReplayError, Run, Violation, load_run

__all__ = ["ReplayError", "Run", "Violation", "load_run"]

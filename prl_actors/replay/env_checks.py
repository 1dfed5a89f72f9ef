"""The classic-RL invariants (docs/ENVS.md), checked from a run's logs alone.

- env-steps (remote mode): every slot of every vector step was stepped by its env actor, reset on a new
  owner, or truncated because its actor was lost (the learner's `env_steps` accounting adds up); every
  `slot_lost` became exactly one truncation; an env actor that was never lost and stopped cleanly served
  exactly the slot-steps the learner counted from it (two processes' logs agree);
- env-rounds (acting mode): each round's slots are the slots it opened with, each in exactly one
  received segment or listed lost, never both; each round is trained once, rounds follow 0, 1, 2, ...;
  no segment acted with a version newer than its round's, and with `sync_kl_threshold` 0 every segment
  acted with its round's own version (`versions.on_policy`);
- env-lost: a lost slot is reset on another env actor afterwards (remote: an `env_reset` of the slot by
  a different actor; acting: the slot is expected from another actor in a later round), unless the
  run ended first;
- aaps: an env actor that decided to fetch loaded a version at least the offered one before its next
  segment, one that decided not to acted its next segment with the version it held; with threshold 0
  it fetched whenever the learner offered another version.
"""

from __future__ import annotations

from collections import defaultdict

from prl_actors.protocol.versions import on_policy, version_for
from prl_actors.replay.events import Event, Run, Violation, at, run_config


def is_env_run(run: Run) -> bool:
    return any(run.role(a) == "learner" for a in run.actors)


def threshold(run: Run) -> float | None:
    try:
        cfg = run_config(run.run_dir)
    except Exception:  # noqa: BLE001 - no readable config: the threshold-0 rules are skipped
        return None
    return cfg.env.sync_kl_threshold if cfg is not None and cfg.env is not None else None


def check_env_steps(run: Run) -> list[Violation]:
    totals = run.of("env_steps", actor="learner")
    if not totals:
        return []
    last = totals[-1]
    out = []
    parts = sum(int(last.get(k, 0)) for k in ("stepped", "reset", "truncated"))
    if parts != last.get("slot_steps"):
        out.append(Violation("env-steps", f"{at(last)}: {last.get('slot_steps')} slot-steps but {parts} accounted"))
    lost = len(run.of("slot_lost", actor="learner"))
    if int(last.get("truncated", 0)) + int(last.get("pending", 0)) != lost:
        msg = f"{lost} slot_lost events but {last.get('truncated')} truncations (+{last.get('pending')} pending)"
        out.append(Violation("env-steps", msg))
    return out + _served_agrees(run, last)


def _served_agrees(run: Run, last: Event) -> list[Violation]:
    lost_actors = {e.get("member") for e in run.of("member_leave", actor="learner")}
    by = last.get("stepped_by") or {}
    out = []
    for stop in run.of("actor_stopped"):
        actor = stop["actor"]
        if run.role(actor) != "env" or actor in lost_actors:
            continue
        served = int((stop.get("counters") or {}).get("slot_steps_served", 0))
        if served != int(by.get(actor, 0)):
            msg = f"{actor} served {served} slot-steps ({at(stop)}), the learner counted {by.get(actor, 0)}"
            out.append(Violation("env-steps", msg))
    return out


def check_env_rounds(run: Run) -> list[Violation]:
    opened: dict[int, Event] = {}
    for e in run.of("round_open", actor="learner"):
        opened[int(e["round"])] = e  # a round reopened after losing every actor: the last opening counts
    done = run.of("round_done", actor="learner")
    out = []
    if [int(d["round"]) for d in done] != list(range(len(done))):
        out.append(Violation("env-rounds", f"rounds trained {[d['round'] for d in done]}, not 0, 1, 2, ..."))
    zero = threshold(run) == 0.0
    for d in done:
        out += _round_problems(d, opened.get(int(d["round"])), zero)
    return out


def _round_problems(d: Event, opening: Event | None, zero: bool) -> list[Violation]:
    r, version = int(d["round"]), int(d["round_version"])
    if opening is None:
        return [Violation("env-rounds", f"round {r} trained ({at(d)}) but never opened")]
    out = []
    expected = sorted(s for slots in opening["expected"].values() for s in slots)
    got = sorted([s for seg in d["segments"] for s in seg["slots"]] + list(d["lost_slots"]))
    if got != expected:
        out.append(
            Violation("env-rounds", f"round {r} ({at(d)}): slots {got} received or lost, opened with {expected}")
        )
    for seg in d["segments"]:
        v = int(seg["version"])
        if v > version_for(r) or v < 0:
            out.append(Violation("env-rounds", f"round {r}: {seg['actor']} acted with v{v}, the round's is v{version}"))
        elif zero and not on_policy(r, v):
            out.append(
                Violation("env-rounds", f"round {r}: {seg['actor']} acted with v{v} at threshold 0 (v{version})")
            )
    return out


def check_env_lost(run: Run) -> list[Violation]:
    out = []
    resets = defaultdict(list)  # slot -> [(t, actor)]
    for e in run.of("env_reset", "env_act"):
        for s in e.get("slots", e.get("new_slots", [])) or []:
            resets[s].append((e["t"], e["actor"]))
    end = run.events[-1]["t"] if run.events else 0.0
    later_steps = [e["t"] for e in run.of("env_steps", "round_open", actor="learner")]
    for lost in run.of("slot_lost", actor="learner"):
        slot, t = lost["slot"], lost["t"]
        gone = {e.get("member") for e in run.of("member_leave", actor="learner") if e["t"] <= t}
        again = [a for (tr, a) in resets[slot] if tr > t and a not in gone]
        if not again and any(ts > t for ts in later_steps) and end - t > 1.0:
            out.append(Violation("env-lost", f"slot {slot} lost ({at(lost)}) was never reset on another env actor"))
    return out


def check_aaps(run: Run) -> list[Violation]:
    zero = threshold(run) == 0.0
    out = []
    for actor in [a for a in run.actors if run.role(a) == "env"]:
        events = run.of("aaps_check", "segment_sent", "span_end", actor=actor)
        for i, check in enumerate(events):
            if check["event"] != "aaps_check":
                continue
            nxt = next((e for e in events[i + 1 :] if e["event"] == "segment_sent"), None)
            loads = [e for e in events[i + 1 :] if e["event"] == "span_end" and (nxt is None or e["t"] <= nxt["t"])]
            out += _aaps_problems(check, nxt, loads, zero)
    return out


def _aaps_problems(check: Event, nxt: Event | None, loads: list[Event], zero: bool) -> list[Violation]:
    held, offered, fetch = check.get("held"), check.get("offered"), check.get("fetch")
    out = []
    if zero and fetch != (offered != held):
        out.append(Violation("aaps", f"{at(check)}: threshold 0 but fetch={fetch} (held v{held}, offered v{offered})"))
    if nxt is None:
        return out
    if fetch and not any(int(e.get("new_version", -1)) >= int(offered or 0) for e in loads):
        out.append(Violation("aaps", f"{at(check)} decided to fetch v{offered}, acted {at(nxt)} without loading it"))
    if not fetch and nxt.get("version") != held:
        out.append(Violation("aaps", f"{at(check)} kept v{held} but acted {at(nxt)} with v{nxt.get('version')}"))
    return out

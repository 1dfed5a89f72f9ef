"""The training invariants, checked from the logs alone (DESIGN.md "Invariants").

- on-policy: every trainer `train_group` passes `protocol.versions.on_policy` (the rule every actor
  applies; under run.mode bounded `within_bound`: generated with v_{e-k} .. v_e), its epoch was
  opened bound to that same version (coordinator `epoch_open`), it belongs to
  the epoch the trainer is in, and the group the buffer accepted for it was generated (worker
  `group_sent`) with that version;
- exactly-once: no (epoch, group id) is trained twice (nor accepted twice by the buffer), and every
  epoch that has an `optimizer_step` trained all of its groups 0..B-1; in a completed run every
  opened epoch was stepped (an epoch cut short by a stop and redone after `--resume` counts once);
  with dynamic sampling (training/dynamic_sampling.py) an epoch's groups are those the buffer
  accepted: each one it filtered (`group_filtered`: rewards all equal) is never trained, every other
  is trained once, and no more than B are trained;
- one-step (one published version per epoch): at most one `optimizer_step` event per epoch, each
  from the epoch's version to version + 1, and each starts from the version the previous one
  produced; inside it the trainer took exactly M x mu optimizer steps (its `optimizer_steps` field;
  trainer.num_minibatches x trainer.num_iterations of RUN_DIR/config.yaml, 1 x 1 by default).
Each check returns Violations naming the offending events (actor, time, message id).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from prl_actors.protocol.versions import version_for, within_bound
from prl_actors.replay.events import Event, Run, Violation, at, run_config
from prl_actors.replay.staleness import max_staleness


def epoch_versions(run: Run) -> dict[int, int]:
    """epoch -> the weight version it is bound to, from the coordinator's `epoch_open` events."""
    out: dict[int, int] = {}
    for e in run.of("epoch_open", actor="coordinator"):
        out.setdefault(int(e["epoch"]), int(e["version"]))
    return out


def _trained(run: Run) -> list[Event]:
    """The trainer's received groups, less those it refused (`train_refused`: generated again)."""
    refused = {e.get("msg_id") for e in run.of("train_refused")}
    return [e for e in run.of("train_group") if e.get("role") == "trainer" and e.get("msg_id") not in refused]


def check_trained_tokens(run: Run) -> list[Violation]:
    """Exactly-once in tokens: every stepped epoch trained (`groups_trained`) the tokens of every group it
    kept (`train_group`): a forward that failed and silently dropped its micro-batch shows up here.
    Runs whose trainer logs no `groups_trained` (older logs) are not checked."""
    if not run.of("groups_trained"):
        return []
    received: dict[int, dict[int, int]] = defaultdict(dict)
    for t in _kept(run, _trained(run)):
        received[int(t.get("msg_epoch", -1))][int(t.get("group_id", -1))] = int(t.get("received_tokens", 0) or 0)
    trained: dict[int, dict[int, int]] = defaultdict(dict)
    for e in run.of("groups_trained"):
        for g, n in zip(e.get("groups", []), e.get("tokens", []), strict=False):
            trained[int(e.get("msg_epoch") or e.get("epoch") or 0)][int(g)] = int(n)
    out = []
    for s in run.of("optimizer_step"):
        epoch = int(s.get("epoch", -1))
        want, got = received.get(epoch, {}), trained.get(epoch, {})
        lost = sorted(set(want) - set(got))
        if lost or sum(want.values()) != sum(got[g] for g in want if g in got):
            msg = (
                f"epoch {epoch} stepped ({at(s)}) after training {sum(got.values())} of {sum(want.values())} "
                f"received tokens (groups never trained: {lost})"
            )
            out.append(Violation("exactly-once", msg))
    return out


def _kept(run: Run, events: list[Event], key: str = "msg_epoch") -> list[Event]:
    """Drop the events of epochs a run was stopped in before their step (a `--resume` redoes them:
    the accumulated gradients died with the process), and of epochs a later `--resume` rolled back
    (it resumed from an older checkpoint than the last, e.g. past a damaged one: those epochs are
    legitimately redone). A run segment starts at each coordinator start."""
    starts = [e["t"] for e in run.of("actor_start", actor="coordinator")]
    if len(starts) <= 1:
        return events
    segment = lambda e: bisect_right(starts, e["t"]) - 1  # noqa: E731
    stepped = {(segment(s), s.get("epoch")) for s in run.of("optimizer_step") if s.get("role") == "trainer"}
    resumed = [(segment(r), int(r.get("new_version", 0))) for r in run.of("resumed") if r.get("role") == "trainer"]
    last = len(starts) - 1

    def rolled_back(e: Event) -> bool:
        epoch = e.get(key)
        return isinstance(epoch, int) and any(seg > segment(e) and epoch >= v for seg, v in resumed)

    kept = [e for e in events if segment(e) == last or (segment(e), e.get(key)) in stepped]
    return [e for e in kept if not rolled_back(e)]


def check_on_policy(run: Run) -> list[Violation]:
    """Strict on-policy; under run.mode bounded (k = run.max_staleness) every trained group was
    generated with v_{e-k} .. v_e, with the version it carries (`versions.within_bound`)."""
    k = max_staleness(run)
    versions = epoch_versions(run)
    accepted = {(e.get("msg_epoch"), e.get("group_id")): e for e in run.of("group_accepted") if e["role"] == "buffer"}
    sent = {str(e.get("msg_id")): e for e in run.of("group_sent")}
    out = []
    for t in _trained(run):
        epoch, gid, version = int(t.get("msg_epoch", -1)), t.get("group_id"), int(t.get("msg_version", -1))
        want = version_for(epoch)
        what = f"group {gid} of epoch {epoch} ({at(t)})"
        if not within_bound(epoch, version, k):
            bound = f"v{want}" if k == 0 else f"v{want - k}..v{want}"
            out.append(
                Violation("on-policy", f"{what} trained with version {version}, epoch {epoch} is bound to {bound}")
            )
        elif versions.get(epoch, want) != want:
            opened = versions[epoch]
            out.append(Violation("on-policy", f"{what}: the coordinator opened epoch {epoch} with v{opened}"))
        if t.get("epoch") != epoch:
            out.append(Violation("on-policy", f"{what} trained while the trainer was in epoch {t.get('epoch')}"))
        out += _generated_with(want if k == 0 else version, what, accepted.get((epoch, gid)), sent, run, t)
    return out


def _generated_with(
    want: int, what: str, acc: Event | None, sent: dict[str, Event], run: Run, t: Event
) -> list[Violation]:
    """The accepted GroupResult of the trained group must have been generated with version `want`."""
    gen = sent.get(acc.get("msg_id", "")) if acc is not None else None
    if gen is None:  # no buffer record (or its sender's log): any group_sent of that worker, epoch and id
        same = [
            e
            for e in run.of("group_sent", actor=t.get("worker"))
            if (e.get("msg_epoch"), e.get("group_id")) == (t.get("msg_epoch"), t.get("group_id"))
        ]
        if not same:
            return [Violation("on-policy", f"{what}: no worker logged generating it (group_sent)")]
        gen = next((e for e in same if e.get("msg_version") == want), same[-1])
    if gen.get("msg_version") != want:
        return [
            Violation(
                "on-policy", f"{what} was generated with version {gen.get('msg_version')} ({at(gen)}), not v{want}"
            )
        ]
    return []


def check_exactly_once(run: Run) -> list[Violation]:
    trained_events = _kept(run, _trained(run))
    out = _duplicates(trained_events, "trained")
    accepted = _kept(run, [e for e in run.of("group_accepted") if e["role"] == "buffer"])
    out += _duplicates(accepted, "accepted by the buffer")
    trained: dict[int, set[int]] = defaultdict(set)
    for t in trained_events:
        trained[t.get("msg_epoch", -1)].add(t.get("group_id", -1))
    sizes = _epoch_sizes(run)
    dropped: dict[int, set[int]] = defaultdict(set)  # given up by the coordinator (task.on_error skip)
    for e in run.of("group_dropped", actor="coordinator"):
        dropped[int(e.get("msg_epoch", -1))].add(int(e.get("group_id", -1)))
    dynamic = _dynamic_epochs(run, accepted)
    out += _dynamic_violations(dynamic, trained, sizes)
    stepped = set()
    for s in run.of("optimizer_step"):
        epoch = s.get("epoch", -1)
        stepped.add(epoch)
        every = set(range(sizes.get(epoch, int(s.get("groups") or 0)))) - dropped.get(epoch, set())
        wanted = dynamic[epoch][0] - dynamic[epoch][1] if epoch in dynamic else every
        missing = sorted(wanted - trained[epoch])
        if missing:
            msg = f"epoch {epoch} stepped ({at(s)}) but groups {missing} were never trained"
            out.append(Violation("exactly-once", msg))
    for epoch, groups in sorted(trained.items()):
        if epoch in dynamic:
            continue  # checked against the accepted groups (_dynamic_violations)
        stray = sorted(g for g in groups if not 0 <= g < sizes.get(epoch, len(groups)))
        if stray:
            out.append(Violation("exactly-once", f"epoch {epoch} trained groups {stray} outside 0..B-1"))
    if any(e.get("reason") == "completed" for e in run.of("run_done", actor="coordinator")):
        for epoch in sorted(set(epoch_versions(run)) - stepped):
            out.append(Violation("exactly-once", f"epoch {epoch} was opened but never stepped in a completed run"))
    return out


def _dynamic_epochs(run: Run, accepted: list[Event]) -> dict[int, tuple[set[int], set[int]]]:
    """Epochs run with dynamic sampling (a coordinator `sampling_done`, or a buffer `group_filtered`)
    -> (group ids the buffer accepted, those it filtered)."""
    filtered: dict[int, set[int]] = defaultdict(set)
    for e in _kept(run, [e for e in run.of("group_filtered") if e.get("role") == "buffer"]):
        filtered[e.get("msg_epoch", -1)].add(e.get("group_id", -1))
    epochs = set(filtered) | {e.get("epoch", -1) for e in run.of("sampling_done", actor="coordinator")}
    out: dict[int, tuple[set[int], set[int]]] = {ep: (set(), filtered[ep]) for ep in epochs}
    for e in accepted:
        if e.get("msg_epoch", -1) in out:
            out[e["msg_epoch"]][0].add(e.get("group_id", -1))
    return out


def _dynamic_violations(
    dynamic: dict[int, tuple[set[int], set[int]]], trained: dict[int, set[int]], sizes: dict[int, int]
) -> list[Violation]:
    out = []
    for epoch, (accepted, filtered) in sorted(dynamic.items()):
        wrong = sorted(trained[epoch] & filtered)
        if wrong:
            out.append(Violation("exactly-once", f"epoch {epoch} trained groups {wrong} its buffer filtered out"))
        stray = sorted(trained[epoch] - accepted)
        if stray:
            out.append(Violation("exactly-once", f"epoch {epoch} trained groups {stray} the buffer never accepted"))
        if epoch in sizes and len(trained[epoch]) > sizes[epoch]:
            out.append(
                Violation("exactly-once", f"epoch {epoch} trained {len(trained[epoch])} groups, B is {sizes[epoch]}")
            )
    return out


def _duplicates(events: list[Event], how: str) -> list[Violation]:
    seen: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for e in events:
        seen[(e.get("msg_epoch", -1), e.get("group_id", -1))].append(e)
    return [
        Violation("exactly-once", f"group {g} of epoch {ep} {how} {len(es)} times: {'; '.join(at(e) for e in es)}")
        for (ep, g), es in sorted(seen.items())
        if len(es) > 1
    ]


def _epoch_sizes(run: Run) -> dict[int, int]:
    """epoch -> B, from the coordinator's epoch_open (else the trainer's train_epoch_begin)."""
    out: dict[int, int] = {}
    for e in run.of("train_epoch_begin") + run.of("epoch_open", actor="coordinator"):
        if isinstance(e.get("groups"), int):
            out[int(e["epoch"])] = int(e["groups"])
    return out


def check_one_step(run: Run) -> list[Violation]:
    steps = _kept(run, [s for s in run.of("optimizer_step") if s.get("role") == "trainer"], key="epoch")
    per_epoch: dict[int, list[Event]] = defaultdict(list)
    for s in steps:
        per_epoch[s.get("epoch", -1)].append(s)
    out = [Violation("one-step", m) for s in steps for m in _step_problems(s, epoch_versions(run))]
    out += [Violation("one-step", m) for s in steps for m in _inner_steps(s, _steps_per_epoch(run))]
    for prev, nxt in zip(steps, steps[1:], strict=False):
        if nxt.get("version_before") != prev.get("version_after"):
            made = f"the previous step ({at(prev)}) made v{prev.get('version_after')}"
            out.append(
                Violation("one-step", f"optimizer step {at(nxt)} started from v{nxt.get('version_before')}, {made}")
            )
    for epoch, es in sorted(per_epoch.items()):
        if len(es) > 1:
            steps_at = "; ".join(at(e) for e in es)
            out.append(Violation("one-step", f"epoch {epoch} has {len(es)} optimizer steps: {steps_at}"))
    return out


def _step_problems(s: Event, versions: dict[int, int]) -> list[str]:
    """A step must go from its epoch's version to that version + 1."""
    before, after, epoch = s.get("version_before"), s.get("version_after"), s.get("epoch", -1)
    out = []
    if not isinstance(before, int) or after != before + 1:
        out.append(f"optimizer step {at(s)} went from v{before} to v{after}, not +1")
    want = versions.get(epoch, epoch)
    if before != want:
        out.append(f"optimizer step {at(s)} of epoch {epoch} started from v{before}, the epoch is bound to v{want}")
    return out


def _steps_per_epoch(run: Run) -> int | None:
    """M x mu from the run's config (None without RUN_DIR/config.yaml)."""
    cfg = run_config(run.run_dir)
    return None if cfg is None else cfg.trainer.num_minibatches * cfg.trainer.num_iterations


def _inner_steps(s: Event, expected: int | None) -> list[str]:
    """The event's optimizer steps must be M x mu (a log without the field, from before it, passes)."""
    taken = s.get("optimizer_steps")
    if expected is None or taken is None or taken == expected:
        return []
    return [f"optimizer step {at(s)} took {taken} optimizer steps inside the epoch, not M x mu = {expected}"]

"""`prl-actors replay --check`: every invariant check, and the coordinator replay, as one report.

A check passes when it found no Violation; the report lists each check with one line saying what was
verified, then every violation under it. `--check` exits non-zero when any check fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prl_actors.replay.coordinator_replay import replay_coordinator
from prl_actors.replay.events import ReplayError, Run, Violation, run_config
from prl_actors.replay.invariants import check_exactly_once, check_on_policy, check_one_step, check_trained_tokens
from prl_actors.replay.replies import check_replies
from prl_actors.replay.staleness import check_staleness, histogram, max_staleness, render, total


@dataclass
class CheckResult:
    name: str
    summary: str
    violations: list[Violation] = field(default_factory=list)
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations


def invariant_checks(run: Run) -> list[CheckResult]:
    trained = len(run.of("train_group"))
    steps = run.of("optimizer_step")
    epochs = sorted({int(s["epoch"]) for s in steps if isinstance(s.get("epoch"), int)})
    versions = f"v{steps[0].get('version_before')} -> v{steps[-1].get('version_after')}" if steps else "none"
    k = max_staleness(run)
    on_policy = f"{trained} trained groups, each generated and trained with its epoch's version"
    if k:
        on_policy = f"{trained} trained groups, each generated at most {k} version(s) before its epoch's"
    return [
        CheckResult("on-policy", on_policy, check_on_policy(run)),
        CheckResult("exactly-once", f"{len(epochs)} stepped epochs, every group trained once", check_exactly_once(run)),
        CheckResult("trained-tokens", "every received token trained", check_trained_tokens(run)),
        CheckResult("one-step", f"{len(steps)} optimizer steps, versions {versions} by +1", check_one_step(run)),
        staleness_check(run),
    ]


def staleness_check(run: Run) -> CheckResult:
    """No trained sample older than k versions (k = 0 unless run.mode is bounded); the summary is
    the run's staleness histogram."""
    k = max_staleness(run)
    summary = f"no trained group older than {k} version(s); staleness {render(total(histogram(run)))}"
    return CheckResult("staleness", summary, check_staleness(run, k))


def replies_check(run: Run) -> CheckResult:
    r = check_replies(run)
    summary = (
        f"{r.requests} requests: {r.answered} answered, {r.timed_out} timed out (logged), "
        f"{r.cut_off} cut off by the end of the run"
    )
    if r.refusers:  # refusals logged only in `refusals` summaries: who sent them, and the requests they answered
        top = ", ".join(f"{who} {n}" for who, n in r.refusers.most_common(3))
        summary += f"; refusals in rate-limited summaries: {top} ({r.refused} of them answered requests here)"
    return CheckResult("replies", summary, r.violations)


def coordinator_check(run: Run) -> CheckResult:
    """The deterministic replay as a check (skipped without RUN_DIR/config.yaml)."""
    try:
        if run_config(run.run_dir) is None:
            why = f"no config.yaml in {str(run.run_dir)!r}: the coordinator replay needs the run's config"
            return CheckResult("coordinator", f"skipped: {why}", skipped=True)
        r = replay_coordinator(run)
    except ReplayError as exc:
        return CheckResult("coordinator", f"skipped: {exc}", skipped=True)
    if r.divergence is not None:
        return CheckResult("coordinator", "replay diverged", [Violation("coordinator", str(r.divergence))])
    return CheckResult("coordinator", f"{r.inputs} inputs replayed, {r.decisions} decisions identical")


def env_checks(run: Run) -> list[CheckResult]:
    """The classic-RL invariants (replay/env_checks.py), for runs with a learner."""
    from prl_actors.replay import env_checks as ec

    if not ec.is_env_run(run):
        return []
    steps, rounds = len(run.of("env_steps")), len(run.of("round_done"))
    return [
        CheckResult("env-steps", f"remote accounting ({steps} summaries) adds up", ec.check_env_steps(run)),
        CheckResult("env-rounds", f"{rounds} acting rounds: slots received or lost once", ec.check_env_rounds(run)),
        CheckResult("env-lost", f"{len(run.of('slot_lost'))} lost slots reset elsewhere", ec.check_env_lost(run)),
        CheckResult("aaps", f"{len(run.of('aaps_check'))} AAPS decisions kept", ec.check_aaps(run)),
    ]


def run_checks(run: Run, replay: bool = True) -> list[CheckResult]:
    """The checks that apply to this run: a classic-RL run (a learner, no coordinator) gets its own
    checks and the replies check, not GRPO's epoch invariants or the coordinator replay."""
    env = env_checks(run)
    if env and "coordinator" not in run.actors:
        return [replies_check(run), *env]
    out = [*invariant_checks(run), replies_check(run), *env]
    return [*out, coordinator_check(run)] if replay else out


def render_checks(results: list[CheckResult]) -> str:
    lines = []
    for r in results:
        status = "skip" if r.skipped else "ok" if r.ok else "FAIL"
        text = r.summary.removeprefix("skipped: ") if r.ok else f"{len(r.violations)} violation(s)"
        lines.append(f"check {r.name:<13} {status:<4}  {text}")
        lines += [f"  - {v.message}" for v in r.violations]
    return "\n".join(lines)

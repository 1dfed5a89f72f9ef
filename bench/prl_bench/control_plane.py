"""Benchmark 4: the control plane. Coordinator messages/s, assignment latency, membership at scale,
and the epoch turnaround.

  core     CoordinatorCore driven directly (no sockets): a realistic mix per group of WorkRequest,
           GroupAccepted and a Heartbeat, epochs closing and reopening; logging to a real file.
  zmq      the coordinator in its real ActorHost, bound on tcp with CurveZMQ as in a run (every
           member authenticates with the run's keys; `--auth none`: plain tcp); one other OS process holds N DEALER
           members (swarm.py): join, heartbeats every 0.2 s with a work-request prober (assignment
           latency p50/p99 under that load), a heartbeat flood (messages/s), leave.
  auth     the zmq flood with CurveZMQ and without (`transport.auth` curve / none), N members, in
           interleaved pairs so that the machine's drift hits both alike: the median ratio of the
           pairs (issue 12: "within 10% with auth on"), and the coordinator's CPU per message.
  turnaround  from the logs of a `prl-actors up` sim run (one process per actor, tcp, transport.auth
           as `--auth`): last group
           consumed -> first assignment of the next epoch, minus the optimizer step, the weight
           upload and the first-assigned worker's weight fetch (weight transfer excluded).
Goals: >= 20,000 msg/s; turnaround <= 20 ms; CURVE / plain >= 0.9.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

from prl_bench import internals
from prl_bench.common import BenchContext, Entry, free_port, percentile, rounded, run_up, up_argv
from prl_bench.logspans import epoch_phases
from prl_bench.swarm import serve

MSG_GOAL = 20_000.0
TURNAROUND_GOAL_MS = 20.0
AUTH_RATIO_GOAL = 0.9  # CurveZMQ costs at most 10% of the coordinator's plain throughput


class CoreDriver:
    """Feeds a CoordinatorCore typed messages as the actor host would (minus the sockets)."""

    def __init__(self, core: Any, workers: int) -> None:
        from prl_actors.protocol.messages import Register, Role

        self.core, self.now, self.fed = core, 1000.0, 0
        self.workers = [f"worker-{i}" for i in range(workers)]
        for name, role in [("buffer", "buffer"), ("trainer", "trainer"), *[(w, "worker") for w in self.workers]]:
            self.feed(Register(role=Role(role), sender=name))

    def feed(self, msg: Any) -> list[Any]:
        self.now += 1e-5
        self.fed += 1
        return internals.feed(self.core, self.now, msg)

    def open_epoch(self, version: int) -> None:
        from prl_actors.protocol.messages import Ack, EpochOpen, WeightsAvailable

        for m in self.feed(WeightsAvailable(version=version, sender="publisher")):
            if isinstance(m, EpochOpen):
                self.feed(Ack(reply_to=m.id, sender="buffer"))

    def epoch(self, e: int, groups: int, heartbeats: bool) -> None:
        """One epoch's traffic: per group a WorkRequest, its GroupAccepted, and a heartbeat."""
        from prl_actors.protocol.messages import GroupAccepted, Heartbeat, StepDone, WorkAssign, WorkRequest

        n = len(self.workers)
        for g in range(groups):
            w = self.workers[g % n]
            for m in self.feed(WorkRequest(sender=w, epoch=e, version=e)):
                if isinstance(m, WorkAssign):
                    gid = m.prompts[0].group_id
                    self.feed(GroupAccepted(sender="buffer", epoch=e, version=e, group_id=gid, worker=w))
            if heartbeats:
                self.feed(Heartbeat(sender=w, epoch=e, version=e))
        self.feed(StepDone(sender="trainer", epoch=e, version=e + 1))
        self.open_epoch(e + 1)


def core_direct(ctx: BenchContext, log_dir: Path) -> dict[str, Any]:
    """Messages/s of CoordinatorCore alone, for the group mix and for heartbeats only."""
    workers, groups, epochs = ctx.size((256, 2048, 6), (256, 1024, 4), (8, 32, 2))
    core = internals.coordinator_core(log_dir / "core-mix.jsonl", groups, epochs + 2, timeout_s=1e9)
    drv = CoreDriver(core, workers)
    drv.open_epoch(0)
    t0, fed0 = time.perf_counter(), drv.fed
    for e in range(epochs):
        drv.epoch(e, groups, heartbeats=True)
    mix = (drv.fed - fed0) / (time.perf_counter() - t0)
    assert internals.epochs_completed(core) == epochs, "the driver must complete every epoch"
    from prl_actors.protocol.messages import Heartbeat

    hbs = [Heartbeat(sender=w, epoch=epochs, version=epochs) for w in drv.workers]
    t0, fed0 = time.perf_counter(), drv.fed
    for _ in range(max(1, groups // workers)):
        for hb in hbs:
            drv.feed(hb)
    hb_rate = (drv.fed - fed0) / (time.perf_counter() - t0)
    return {"mix_msgs_per_s": mix, "heartbeat_msgs_per_s": hb_rate, "workers": workers, "groups": groups}


def start_coordinator(addr: str, log_path: Path, groups: int, keys: Path | None):  # type: ignore[no-untyped-def]
    import zmq

    zctx = zmq.Context()
    core = internals.coordinator_core(log_path, groups, epochs=1, timeout_s=3.0)  # 15 heartbeat intervals
    host = internals.start_host(core, zctx, addr, {}, security=internals.security(keys, "coordinator"))
    return zctx, host


class SwarmProc:
    def __init__(self) -> None:
        mpc = mp.get_context("spawn")
        self.conn, child = mpc.Pipe()
        self.proc = mpc.Process(target=serve, args=(child,), daemon=True)
        self.proc.start()

    def __call__(self, *cmd: Any, timeout_s: float = 300.0) -> dict[str, Any]:
        self.conn.send(cmd)
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"swarm: no reply to {cmd[0]} in {timeout_s}s")
        reply: dict[str, Any] = self.conn.recv()
        if "error" in reply:
            raise RuntimeError(f"swarm {cmd[0]}: {reply['error']}")
        return reply

    def close(self) -> None:
        self.conn.send(("exit",))
        self.proc.join(10.0)
        if self.proc.is_alive():
            self.proc.kill()


def over_sockets(ctx: BenchContext, n: int, swarm: SwarmProc, log_dir: Path) -> dict[str, Any]:
    """One coordinator, n members: idle latency, join, steady heartbeats + latency, flood, leave."""
    seconds = ctx.size(4.0, 2.0, 0.5)
    addr = f"tcp://127.0.0.1:{free_port()}"
    keys = log_dir / "keys" if ctx.auth == "curve" else None
    zctx, host = start_coordinator(addr, log_dir / f"coordinator-{n}.jsonl", groups=200_000, keys=keys)
    out: dict[str, Any] = {}
    try:
        swarm("start", addr, str(keys) if keys else None)
        swarm("open_epoch")
        idle = swarm("steady", seconds / 2, 0.2, 0.005)
        out.update(idle_assign_p50_ms=idle["assign_p50_ms"], idle_assign_p99_ms=idle["assign_p99_ms"])
        out.update(swarm("join", n))
        out["members"] = n
        c0, t0 = time.process_time(), time.monotonic()
        steady = swarm("steady", seconds, 0.2, 0.01)
        out["steady_coordinator_cpu"] = (time.process_time() - c0) / (time.monotonic() - t0)
        out.update({f"steady_{k}": v for k, v in steady.items()})
        c0, t0 = time.process_time(), time.monotonic()
        flood = swarm("flood", seconds, 4)
        out["flood_coordinator_cpu"] = (time.process_time() - c0) / (time.monotonic() - t0)
        out.update({f"flood_{k}": v for k, v in flood.items()})
        out.update(swarm("leave"))
        out["members_left_in_coordinator"] = (
            sum(m.startswith("worker-") for m in internals.member_names(host.core)) - 1
        )  # prober
        out["false_timeouts"] = _timeouts(log_dir / f"coordinator-{n}.jsonl")
    finally:
        internals.stop_host(host, 10.0)
        internals.close_context(zctx)
    return rounded(out, 4)


def auth_pairs(ctx: BenchContext, swarm: SwarmProc, log_dir: Path) -> dict[str, Any]:
    """The flood with and without CurveZMQ, alternating which goes first; per pair curve / plain."""
    n, pairs = ctx.size((100, 5), (100, 3), (20, 1))
    runs: list[dict[str, dict[str, Any]]] = []
    for i in range(pairs):
        order = ("none", "curve") if i % 2 == 0 else ("curve", "none")
        runs.append({a: _flood(dataclasses.replace(ctx, auth=a), n, swarm, log_dir / f"auth-{i}-{a}") for a in order})
    ratios = [r["curve"]["msgs_per_s"] / r["none"]["msgs_per_s"] for r in runs]
    out = {"members": n, "pairs": pairs, "ratio_median": statistics.median(ratios), "ratios": ratios}
    for a in ("curve", "none"):
        out[f"{a}_msgs_per_s"] = [r[a]["msgs_per_s"] for r in runs]
        out[f"{a}_cpu_us_per_msg"] = [r[a]["cpu_us_per_msg"] for r in runs]
    return out


def _flood(ctx: BenchContext, n: int, swarm: SwarmProc, log_dir: Path) -> dict[str, float]:
    log_dir.mkdir(parents=True, exist_ok=True)
    r = over_sockets(ctx, n, swarm, log_dir)
    cpu = r["flood_coordinator_cpu"] / max(r["flood_msgs_per_s"], 1e-9) * 1e6
    return {"msgs_per_s": r["flood_msgs_per_s"], "cpu_us_per_msg": cpu}


def _timeouts(log_path: Path) -> int:
    if not log_path.exists():
        return 0
    return sum('"reason":"heartbeat_timeout"' in line for line in log_path.read_text().splitlines())


def turnaround(ctx: BenchContext, run_dir: Path) -> dict[str, Any]:
    """A `prl-actors up` sim run (processes, tcp); per epoch boundary, the turnaround and its parts."""
    epochs = ctx.size(12, 6, 3)
    sets = {
        "worker.engine": "sim",
        "trainer.learner": "sim",
        "trainer.checkpoint_every": 0,
        "transport.kind": "tcp",
        "transport.auth": ctx.auth,
        "transport.base_port": free_port() + 7,
        "coordinator.groups_per_epoch": 16,
        "sim.gen_s_per_token": 0.0005,
        "sim.train_s_per_sample": 0.001,
        "sim.tokens_per_sample": 8,
        "sim.param_count": 262144,
    }
    cmd = up_argv(run_dir, 3, epochs, sets)
    code, err = run_up(cmd, timeout_s=300.0)
    if code != 0:
        raise RuntimeError(f"prl-actors up failed ({code}): {err[-2000:]}")
    ph = epoch_phases(run_dir)
    rows = [_boundary(ph[e], ph[e + 1]) for e in sorted(ph) if e >= 0 and e + 1 in ph]
    return {"epochs": epochs, "boundaries": rows}


def _boundary(cur: Any, nxt: Any) -> dict[str, float]:
    total = nxt.first_assign - cur.last_train_end
    fetch = nxt.worker_fetch_s.get(nxt.first_assign_worker, 0.0)
    return rounded(
        {
            "epoch": cur.epoch,
            "total_ms": 1e3 * total,
            "step_ms": 1e3 * cur.step_s,
            "upload_ms": 1e3 * cur.upload_s,
            "fetch_ms": 1e3 * fetch,
            "control_ms": 1e3 * (total - cur.step_s - cur.upload_s - fetch),
            "done_to_open_ms": 1e3 * (nxt.open - cur.done),
            "open_to_first_assign_ms": 1e3 * (nxt.first_assign - nxt.open),
        },
        3,
    )


def run(ctx: BenchContext) -> list[Entry]:
    log_dir = ctx.work_dir / "control"
    log_dir.mkdir(parents=True, exist_ok=True)
    core = rounded(core_direct(ctx, log_dir), 1)
    ctx.say(
        f"  control core: {core['mix_msgs_per_s']:.0f} msg/s (mix), {core['heartbeat_msgs_per_s']:.0f} (heartbeats)"
    )
    swarm = SwarmProc()
    try:
        scale = [over_sockets(ctx, n, swarm, log_dir) for n in ctx.size([100, 300, 1000], [100, 1000], [20])]
        auth = rounded(auth_pairs(ctx, swarm, log_dir), 4)
    finally:
        swarm.close()
    for r in scale:
        ctx.say(
            f"  control zmq {r['members']:>4} members: flood {r['flood_msgs_per_s']:.0f} msg/s, assign p50/p99 "
            f"{r['steady_assign_p50_ms']:.2f}/{r['steady_assign_p99_ms']:.2f} ms, join {r['join_s']:.2f}s"
        )
    ctx.say(
        f"  control auth: curve / plain flood {auth['ratio_median']:.3f} (median of {auth['pairs']} pairs: "
        f"{', '.join(f'{x:.2f}' for x in auth['ratios'])})"
    )
    turn = turnaround(ctx, ctx.work_dir / "turnaround-run")
    control = [b["control_ms"] for b in turn["boundaries"]]
    med = statistics.median(control)
    ctx.say(f"  control turnaround: median {med:.2f} ms (max {max(control):.2f}) over {len(control)} epochs")
    return [*_entries(core, scale, turn, med), _auth_entry(ctx, auth)]


def _auth_entry(ctx: BenchContext, auth: dict[str, Any]) -> Entry:
    cpu = {a: statistics.median(auth[f"{a}_cpu_us_per_msg"]) for a in ("curve", "none")}
    rate = {a: statistics.median(auth[f"{a}_msgs_per_s"]) for a in ("curve", "none")}
    return Entry(
        "control_plane",
        f"coordinator flood with CurveZMQ / without ({auth['members']} members)",
        "heartbeat flood msg/s, transport.auth curve / none, median of interleaved pairs",
        auth["ratio_median"],
        "x",
        auth["ratio_median"],
        AUTH_RATIO_GOAL,
        raw=auth,
        note=f"curve {rate['curve']:.0f} / none {rate['none']:.0f} msg/s, coordinator CPU {cpu['curve']:.1f} / "
        f"{cpu['none']:.1f} us per message (medians); pairs {', '.join(f'{x:.2f}' for x in auth['ratios'])}",
    )


def _entries(core: dict, scale: list[dict], turn: dict, med: float) -> list[Entry]:  # type: ignore[type-arg]
    top = scale[-1]
    control = [b["control_ms"] for b in turn["boundaries"]]
    e = "control_plane"
    return [
        Entry(
            e,
            "coordinator core msg/s",
            "CoordinatorCore alone: WorkRequest+GroupAccepted+Heartbeat mix",
            core["mix_msgs_per_s"],
            "msg/s",
            core["mix_msgs_per_s"],
            MSG_GOAL,
            raw=core,
        ),
        Entry(
            e,
            f"coordinator over zmq msg/s ({top['members']} members)",
            "heartbeat flood through ROUTER+ActorHost",
            top["flood_msgs_per_s"],
            "msg/s",
            top["flood_msgs_per_s"],
            MSG_GOAL,
            raw={"scale": scale},
        ),
        Entry(
            e,
            f"assignment latency p99 ({top['members']} members)",
            "WorkRequest -> WorkAssign round trip, tcp",
            top["steady_assign_p99_ms"],
            "ms",
            top["steady_assign_p99_ms"],
            None,
            "<=",
            note=f"p50 {top['steady_assign_p50_ms']:.2f} ms; idle p50/p99 {top['idle_assign_p50_ms']:.2f}/"
            f"{top['idle_assign_p99_ms']:.2f} ms",
        ),
        Entry(
            e,
            f"membership {top['members']} members, false timeouts",
            "heartbeat timeouts of live members",
            float(top["false_timeouts"]),
            "count",
            float(top["false_timeouts"]),
            0.0,
            "<=",
            note=f"connect {top['connect_s']:.2f}s, join {top['join_s']:.2f}s, leave {top['leave_s']:.2f}s, "
            f"hb p99 {top['steady_hb_rtt_p99_ms']:.1f} ms",
        ),
        Entry(
            e,
            "epoch turnaround (median)",
            "last group consumed -> next first assignment, weight transfer excluded",
            med,
            "ms",
            med,
            TURNAROUND_GOAL_MS,
            "<=",
            raw=turn,
            note=f"max {max(control):.2f} ms, p90 {percentile(control, 90):.2f} ms",
        ),
    ]

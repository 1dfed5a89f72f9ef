"""A model, not a measurement: how much of the trainer's work one epoch could overlap with generation
at the chat shape, when groups are trained as they finish (what `up` does) and when each sample's
forwards would run as the sample finishes (a design not built: docs/BENCHMARKS.md section 11).

It measures, on this machine and one thread, what both schedules are made of:
* when each of the batch's samples and groups finishes, generating the batch as one running batch
  (the engine's continuous batching, as a worker does);
* each group's policy forward, reference forward and backward, in the trainer's own code.
Then it schedules that work on the trainer's core while generation runs and on `tail` times the speed
once it is over (1: one rank on one thread; 2: two ranks, the worker's core too):
* group level: a group's whole training is released when its last sample is done;
* sample level: a sample's share of its group's two forwards is released when it is done, the group's
  backward when the group is (its advantages need every reward), so nothing changes what is trained;
* reference early: only the reference's forward of a sample is released when the sample is done (it
  needs no graph and no advantages), at EARLY_COST times its share of the packed group's (a sample's
  forward against the group's kept prompt, measured by sample_forwards.py); the policy's forward and
  the backward when the group is.
Jobs run in release order, one at a time. The group-level figure is checked against `up`'s measured
epoch (the e2e benchmark): the model leaves out messages, the step and weight sync.

    python -m prl_bench.schedule_model [chat-h128-L4|chat-h256-L6] [iterations]
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prl_bench.chat_shape import build_chat_model, chat_settings
from prl_bench.e2e import Loop

TAILS = (1.0, 1.4, 2.0)  # the trainer's speed after generation: one thread, two threads (measured ~1.4x), two ranks
EARLY_COST = 1.10  # a sample forwarded with others against kept prompts, vs its share of the packed group's


@dataclass
class Epoch:
    gen_s: float
    sample_done: dict[tuple[int, int], float]  # (group, sample) -> seconds into generation
    group_done: dict[int, float]
    forward_s: dict[tuple[int, int], float]  # (group, sample) -> its share of the group's two forwards
    backward_s: dict[int, float]
    reference_s: dict[tuple[int, int], float] | None = None  # the reference forward's part of forward_s

    @property
    def train_s(self) -> float:
        return sum(self.forward_s.values()) + sum(self.backward_s.values())


def generate(loop: Any, it: int) -> tuple[float, dict[tuple[int, int], float], dict[int, float], list[Any]]:
    """The batch as the engine generates it, with when each row and each group finished."""
    batch = loop.batch
    loop.admit(it)
    running: dict[int, Any] = {}
    sample_done: dict[tuple[int, int], float] = {}
    group_done: dict[int, float] = {}
    finished = []
    t0 = time.perf_counter()
    while batch.busy:
        before = {g.group_id: g for g in batch.groups}
        out = batch.step()
        now = time.perf_counter() - t0
        running.update(before)
        running.update({g.group_id: g for g in batch.groups})
        for gid, g in running.items():
            for i, row in enumerate(g.rows):
                if (gid, i) not in sample_done and batch.row_done(row):
                    sample_done[(gid, i)] = now
        for f in out:
            group_done[f.group_id] = now
        finished += out
    return time.perf_counter() - t0, sample_done, group_done, finished


def train_costs(
    loop: Any, finished: list[Any]
) -> tuple[dict[tuple[int, int], float], dict[int, float], dict[tuple[int, int], float]]:
    """Per group, one thread: its policy and reference forwards (split over its samples by their share
    of the group's tokens, the prompt's shared equally), its backward, and the reference's part of
    the forwards (split alike)."""
    from prl_actors.training.behaviour import behaviour_logprobs
    from prl_actors.training.packing import collate, response_logits, response_logprobs

    tri = loop.learner.tri
    forward: dict[tuple[int, int], float] = {}
    backward: dict[int, float] = {}
    reference: dict[tuple[int, int], float] = {}
    for f in finished:
        responses = [r.tokens for r in f.rows]
        batch = collate([(f.prompt_ids, responses)], True)
        t0 = time.perf_counter()
        logp = behaviour_logprobs(response_logits(tri.policy, batch), batch.targets, tri.transform)
        ref = torch.zeros_like(logp)
        t_ref = time.perf_counter()
        if tri.reference is not None:
            with torch.no_grad():
                ref = response_logprobs(tri.reference, batch, tri.transform)
        t1 = time.perf_counter()
        (logp - ref).sum().backward()
        backward[f.group_id] = time.perf_counter() - t1
        total = len(f.prompt_ids) + sum(len(r) for r in responses)
        for i, r in enumerate(responses):
            share = (len(r) + len(f.prompt_ids) / len(responses)) / total
            forward[(f.group_id, i)] = (t1 - t0) * share
            reference[(f.group_id, i)] = (t1 - t_ref) * share
    loop.learner.optimizer.zero_grad(set_to_none=True)
    return forward, backward, reference


def schedule(
    epoch: Epoch, sample_level: bool, tail: float, reference_early: bool = False, early_cost: float = EARLY_COST
) -> float:
    """When the epoch's training ends: its jobs in release order on one core until generation ends,
    `tail` times as fast after (`reference_early`: that schedule, needs epoch.reference_s)."""
    jobs: list[tuple[float, float]] = []
    for gid, done in epoch.group_done.items():
        forwards = [(epoch.sample_done[k], s) for k, s in epoch.forward_s.items() if k[0] == gid]
        if sample_level:
            jobs += forwards
            jobs.append((done, epoch.backward_s[gid]))
        elif reference_early:
            assert epoch.reference_s is not None
            refs = [(epoch.sample_done[k], s) for k, s in epoch.reference_s.items() if k[0] == gid]
            jobs += [(t, s * early_cost) for t, s in refs]
            policy = sum(s for _, s in forwards) - sum(s for _, s in refs)
            jobs.append((done, policy + epoch.backward_s[gid]))
        else:
            jobs.append((done, sum(s for _, s in forwards) + epoch.backward_s[gid]))
    t = 0.0
    for release, work in sorted(jobs):
        t = max(t, release)
        before_end = max(0.0, min(work, epoch.gen_s - t))
        t += before_end + (work - before_end) / tail
    return t


def main(argv: list[str]) -> None:
    shape = argv[0] if argv else "chat-h128-L4"
    iters = int(argv[1]) if len(argv) > 1 else 3
    torch.set_num_threads(1)
    from prl_actors.config import load_config

    model_dir = build_chat_model(shape, Path(f"/tmp/prl-schedule-model/{shape}"))
    cfg = load_config(None, {**chat_settings(8, 256), "model.path": str(model_dir)})
    loop = Loop(cfg, model_dir)
    generate(loop, 0)  # warm-up
    print(f"{shape}, one thread; seconds per epoch (E*: (G1 + T1) / 2, at least G1)")
    print("gen   train  groups done (s)                          tail  group  sample  ref-early  E*    of E* (g/s/r)")
    for it in range(1, iters + 1):
        gen_s, sample_done, group_done, finished = generate(loop, it)
        forward_s, backward_s, reference_s = train_costs(loop, finished)
        epoch = Epoch(gen_s, sample_done, group_done, forward_s, backward_s, reference_s)
        e_star = max((gen_s + epoch.train_s) / 2, gen_s)
        done = " ".join(f"{t:.2f}" for t in sorted(group_done.values()))
        for tail in TAILS:
            grouped, streamed = schedule(epoch, False, tail), schedule(epoch, True, tail)
            early = schedule(epoch, False, tail, reference_early=True)
            head = f"{gen_s:.2f}  {epoch.train_s:.2f}   {done:<40}" if tail == TAILS[0] else " " * 54
            print(
                f"{head} {tail:.1f}   {grouped:.2f}   {streamed:.2f}    {early:.2f}       {e_star:.2f}  "
                f"{e_star / grouped:.2f} / {e_star / streamed:.2f} / {e_star / early:.2f}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])

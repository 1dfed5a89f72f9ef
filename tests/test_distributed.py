"""The trainer as a torch.distributed group, fast tier: shares balanced by tokens, configs refused with
one line, and one 2-rank gloo group (DDP) that gives world size 1's weights. The FSDP2, checkpoint,
hung-rank and whole-run cases are in test_distributed_slow.py (`make test-dist`)."""

from __future__ import annotations

import contextlib
import gc
import os
import random
from pathlib import Path

import pytest

from prl_actors.config import check_resume, load_config, safe_on_resume
from prl_actors.protocol.messages import Group, Sample
from prl_actors.sections import ConfigError
from prl_actors.trainer.rank_group import Command, Piece, RankEnv
from prl_actors.trainer.rank_learner import group_cost, partition, whole
from tests.dist_utils import group_of, max_diff, rollouts, side_by_side, single, train_epoch


def group(gid: int, prompt: int, *responses: int) -> Group:
    samples = [Sample(text="", token_ids=[1] * n, logprobs=[], reward=0.0, finished=True) for n in responses]
    return Group(group_id=gid, prompt="", prompt_ids=[1] * prompt, samples=samples, worker="w")


def ids(share: list[Piece]) -> list[tuple[int, int, int]]:
    """(group, first sample, samples) of each piece."""
    return [(p.group.group_id, p.first, len(p.group.samples)) for p in share]


def test_partition_balances_tokens_and_keeps_arrival_order() -> None:
    groups = [group(0, 2, 1, 1), group(1, 2, 30, 30), group(2, 2, 5, 5), group(3, 2, 20, 20), group(4, 2, 9, 9)]
    shares = partition(groups, 2)
    assert sorted(p.group.group_id for s in shares for p in s) == [0, 1, 2, 3, 4]  # each group exactly once
    assert all(p.first == 0 and p.group is groups[p.group.group_id] for s in shares for p in s)  # whole groups
    loads = [sum(group_cost(p.group) for p in s) for s in shares]
    assert max(loads) - min(loads) <= max(group_cost(g) for g in groups[2:])  # LPT: within the largest
    assert [p.group.group_id for p in shares[0]] == sorted(p.group.group_id for p in shares[0])  # arrival order
    assert [p.group.group_id for p in shares[1]] == sorted(p.group.group_id for p in shares[1])
    # 1 (62) -> r0, 3 (42) -> r1, 4 (20) -> r1, 2 (12) -> r0 (tie), 0 (4) -> r1; no cut of r0's groups
    # shortens the round by more than the 2-token prompt it would repeat, so none is split
    assert loads == [74, 66]


def test_partition_splits_a_group_where_whole_groups_leave_a_rank_idle() -> None:
    """One group on two ranks: each takes half its samples (the second piece repeats the prompt);
    three ranks and one group: three pieces. Every sample is in exactly one piece, each piece carries
    the whole group's rewards, and a short group is not split for less than the prompt it repeats."""
    g = group(7, 10, 40, 40, 40, 40)
    for i, s in enumerate(g.samples):
        s.reward = float(i)
    two = partition([g], 2)
    assert [ids(s) for s in two] == [[(7, 0, 2)], [(7, 2, 2)]]
    assert all(p.rewards == [0.0, 1.0, 2.0, 3.0] for s in two for p in s)
    assert [s.reward for s in two[1][0].group.samples] == [2.0, 3.0]
    three = partition([g], 3)  # 4 samples on 3 ranks: one holds 2 (90 tokens), a third cut cannot pay
    assert sorted(x for s in three for x in ids(s)) == [(7, 0, 1), (7, 1, 1), (7, 2, 2)]
    six = partition([group(8, 10, *[40] * 6)], 3)  # 250 tokens: 90 / 90 / 90 is best
    assert sorted(x for s in six for x in ids(s)) == [(8, 0, 2), (8, 2, 1), (8, 3, 2), (8, 5, 1)]
    assert [sum(group_cost(p.group) for p in s) for s in six] == [90, 90, 100]  # a piece per cut: 4 prompts
    # three groups on two ranks, one long: whole groups give 170 / 100, a cut 130 / 150 (the long
    # group's last sample and its prompt again)
    long, a, b = group(0, 10, 40, 40, 40, 40), group(1, 10, 20, 20), group(2, 10, 20, 20)
    cut = partition([long, a, b], 2)
    assert [ids(s) for s in cut] == [[(0, 0, 3)], [(0, 3, 1), (1, 0, 2), (2, 0, 2)]]
    assert [sum(group_cost(p.group) for p in s) for s in cut] == [130, 150]
    assert partition([group(3, 10, 3, 3)], 2) == [[whole(group(3, 10, 3, 3))], []]  # 16 tokens: not worth it


def test_partition_of_random_rounds_keeps_every_sample_once_and_never_lengthens_the_round() -> None:
    """500 random rounds (1-6 groups of 1-8 samples, 1-300 tokens each, prompts 1-200) on 2-4 ranks:
    every sample in exactly one piece, pieces in arrival and sample order, each carrying its group's
    rewards; the busiest rank never above whole groups' LPT, and the result deterministic."""
    rng = random.Random(0)
    for trial in range(500):
        n = rng.randint(2, 4)
        groups = [
            group(gid, rng.randint(1, 200), *(rng.randint(1, 300) for _ in range(rng.randint(1, 8))))
            for gid in range(rng.randint(1, 6))
        ]
        for g in groups:
            for s in g.samples:
                s.reward = float(rng.random() < 0.5)
        shares = partition(groups, n)
        assert shares == partition(groups, n), trial
        pieces = sorted((p.group.group_id, p.first, len(p.group.samples)) for s in shares for p in s)
        for g in groups:
            mine = [(first, k) for gid, first, k in pieces if gid == g.group_id]
            assert [f for f, _ in mine] == [sum(k for _, k in mine[:i]) for i in range(len(mine))], trial
            assert sum(k for _, k in mine) == len(g.samples), trial
        for share in shares:
            assert [(p.group.group_id, p.first) for p in share] == sorted((p.group.group_id, p.first) for p in share)
            for p in share:
                g = groups[p.group.group_id]
                assert p.rewards == [s.reward for s in g.samples]
                assert p.group.samples == g.samples[p.first : p.first + len(p.group.samples)]
        lpt = [0] * n
        for g in sorted(groups, key=lambda g: -group_cost(g)):
            lpt[lpt.index(min(lpt))] += group_cost(g)
        assert max(sum(group_cost(p.group) for p in s) for s in shares) <= max(lpt), trial


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"trainer.world_size": 2}, "world_size > 1 needs strategy ddp or fsdp2"),
        (
            {"trainer.strategy": "ddp", "worker.engine": "sim", "trainer.learner": "sim"},
            "trainer.strategy ddp needs trainer.learner grpo",
        ),
        ({"worker.tensor_parallel_size": 2}, "tensor_parallel_size > 1 needs worker.engine vllm"),
    ],
)
def test_configs_that_cannot_work_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_rank_environment_is_torchruns() -> None:
    assert RankEnv.from_environ({}) is None
    env = RankEnv.from_environ(
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    )
    assert env == RankEnv(1, 2, 1, "10.0.0.1", 29500)
    assert RankEnv.from_environ(env.variables()) == env
    with pytest.raises(ConfigError, match="torchrun environment incomplete"):
        RankEnv.from_environ({"RANK": "1"})


def test_two_ddp_ranks_give_the_weights_of_one_process(tmp_path: Path) -> None:
    """float64: summation order is the only difference (measured 8e-16); the steps move weights by
    ~lr = 1e-3, so atol 1e-9 is 1e6 times below the effect. 5 groups in rounds of 2: the last round
    leaves rank 1 idle, and the shares hold different token counts. Clipping off and a second epoch
    of other groups: AdamW's first step and a clipped gradient are blind to a wrong normalisation
    (they are scale-free), the second unclipped step is not."""
    cfg, model_dir, groups = rollouts(tmp_path, trainer__max_grad_norm=1e6)
    run = side_by_side(cfg, model_dir, groups, "ddp")
    two = run.learner
    assert max_diff(run.one, run.initial) > 1e-4  # it learned: the effect
    assert max_diff(run.one, run.group) < 1e-9
    for a, b in zip(run.one_metrics, run.group_metrics, strict=True):
        for key in ("tokens", "samples", "groups", "reward_mean"):
            assert b[key] == a[key], key
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-9)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-9)
        assert b["entropy"] == pytest.approx(a["entropy"], rel=1e-9)  # summed with its token count
        assert (b["clip_frac_low"], b["clip_frac_high"]) == (a["clip_frac_low"], a["clip_frac_high"])
    assert two.version == 2
    assert two.pending == 0 and two.flush() == 0  # the Learner interface's flush: nothing queued


def test_a_group_split_across_two_ranks_trains_as_in_one_process(tmp_path: Path) -> None:
    """One group per epoch: each rank trains half its samples, with advantages from the whole group's
    rewards and the group counted once. Advantages from a piece's own rewards, or a group counted on
    both ranks, give other weights or metrics. Tolerance: the prompt is encoded by both ranks and its
    gradient goes through each piece's RMSNorm separately, which Hugging Face computes in float32 even
    in a float64 model (measured 5e-8 apart; the steps move weights by ~1e-3)."""
    cfg, model_dir, groups = rollouts(tmp_path, trainer__max_grad_norm=1e6)
    epochs = [groups[:1], groups[3:4]]
    for (g,) in epochs:
        assert len({s.reward for s in g.samples}) > 1  # advantages that a split could get wrong
        assert [len(s) for s in partition([g], 2)] == [1, 1]  # split: a piece on each rank
    run = side_by_side(cfg, model_dir, groups, "ddp", epochs)
    assert max_diff(run.one, run.initial) > 1e-4
    assert max_diff(run.one, run.group) < 1e-6
    for a, b in zip(run.one_metrics, run.group_metrics, strict=True):
        for key in ("tokens", "samples", "groups", "reward_mean"):
            assert b[key] == a[key], key
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-9)


def test_a_round_goes_out_at_every_ranks_token_budget(tmp_path: Path) -> None:
    """trainer.micro_batch_tokens bounds a rank's forward as it bounds one process's: a round goes out
    once it holds world_size x micro_batch_tokens tokens, not only at world_size x micro_batch_groups
    groups (512 by default: a burst of groups would be one forward per rank, however long)."""
    cfg, model_dir, groups = rollouts(tmp_path, trainer__max_grad_norm=1e6, trainer__micro_batch_tokens=20)
    one = single(cfg, model_dir)
    train_epoch(one, groups)
    two = group_of(cfg, model_dir, "ddp")
    rounds: list[list[int]] = []  # per round, each rank's tokens
    send = two.channel.send

    def spy(cmd: Command) -> None:
        if cmd.op == "round":
            rounds.append([sum(group_cost(p.group) for p in share) for share in cmd.shares])
        send(cmd)

    two.channel.send = spy  # type: ignore[method-assign]
    try:
        train_epoch(two, groups)  # no flush between groups: only the budget cuts rounds
        weights = two.weights()
    finally:
        two.close()
    assert len(rounds) >= 3  # 5 groups of 19-23 tokens, rounds of >= 40
    assert max(max(r) for r in rounds) <= 20 + max(group_cost(g) for g in groups)  # a share: the budget + one group
    assert max_diff(one.weights(), weights) < 1e-6  # the same update (split groups: see above)


def test_a_closed_group_closes_no_fd_of_someone_else(tmp_path: Path) -> None:
    """The rendezvous store owns its listening socket and closes it when the group goes; Python must
    not close that number a second time later. It did (the socket object outlived the store): the
    number, reused meanwhile, was here a pipe; in a full test run, a zmq context's eventfd, and libzmq
    aborted the whole pytest process at the next Context.destroy."""
    cfg, model_dir, _ = rollouts(tmp_path)
    learner = group_of(cfg, model_dir, "ddp", world_size=1)  # rank 0's own store, no other process
    learner.close()
    pipes = [fd for _ in range(16) for fd in os.pipe()]  # take the numbers the store freed
    try:
        del learner
        gc.collect()
        closed = []
        for fd in pipes:
            try:
                os.fstat(fd)
            except OSError:
                closed.append(fd)
        assert closed == []
    finally:
        for fd in pipes:
            with contextlib.suppress(OSError):
                os.close(fd)


def test_resume_may_change_the_number_of_ranks_not_the_strategy() -> None:
    """ddp and single write the same checkpoint and fsdp2's sharded one reshards on load (tested in
    test_distributed_slow.py), so world_size may change on --resume; strategy may not."""
    assert safe_on_resume("trainer.world_size") and safe_on_resume("trainer.dist_timeout_s")
    assert not safe_on_resume("trainer.strategy")
    run = load_config(None, {"trainer.world_size": 2, "trainer.strategy": "fsdp2"})
    check_resume(run, load_config(None, {"trainer.world_size": 4, "trainer.strategy": "fsdp2"}))
    with pytest.raises(ConfigError, match=r"trainer\.strategy \('fsdp2' -> 'ddp'\)"):
        check_resume(run, load_config(None, {"trainer.world_size": 2, "trainer.strategy": "ddp"}))


def test_two_ddp_ranks_with_a_recipe_loss_give_the_weights_of_one_process(tmp_path: Path) -> None:
    """loss_type grpo (per-sequence weights, divided by the all-reduced sequence count), k2 KL,
    truncated samples masked, a cosine schedule: the rank group still equals one process."""
    cfg, model_dir, groups = rollouts(
        tmp_path,
        trainer__max_grad_norm=1e6,
        trainer__beta=0.1,
        trainer__loss_type="grpo",
        trainer__kl_estimator="k2",
        trainer__mask_truncated_completions=True,
        trainer__lr_scheduler="cosine",
        trainer__weight_decay=0.01,
    )
    run = side_by_side(cfg, model_dir, groups, "ddp")
    assert max_diff(run.one, run.initial) > 1e-4
    assert max_diff(run.one, run.group) < 1e-9
    for a, b in zip(run.one_metrics, run.group_metrics, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-9)
        assert b["lr"] == a["lr"]

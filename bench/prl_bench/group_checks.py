"""The buffer's content checks per group (issue 23): what validating every group costs, and what
`buffer.verify_rewards` (re-scoring each sample with the task's reward) adds.

Groups of G=8 samples x 32 tokens with math-style texts, checked by the buffer's own GroupChecker:
- structure: finite numbers, vocabulary, lengths, the assigned prompt's tokenisation and the texts'
  decoding with the built-in character tokenizer (a BPE tokenizer costs more per call);
- verify_rewards: the same plus the math task's reward (answer extraction) per sample.
Informational (no goal): the numbers go in docs/SECURITY.md next to the option.
"""

from __future__ import annotations

import time

from prl_bench.common import BenchContext, Entry


def _groups(n: int, tok, reward):  # type: ignore[no-untyped-def]
    from prl_actors.protocol.messages import Group, Prompt, Sample

    prompt = Prompt(group_id=0, prompt="Tom has 3 apples and buys 4 more. How many? ", answer="7")
    ids = list(tok(prompt.prompt).input_ids)
    texts = [f"He has 3 + 4 = {7 + (i % 2)} apples. #### {7 + (i % 2)}"[:32] for i in range(8)]
    samples = []
    for t in texts:
        toks = list(tok(t, add_special_tokens=False).input_ids)
        text = str(tok.decode(toks, skip_special_tokens=True))
        samples.append(
            Sample(text=text, token_ids=toks, logprobs=[-1.0] * len(toks), reward=reward(prompt.prompt, text, "7"))
        )
    group = Group(group_id=0, prompt=prompt.prompt, prompt_ids=ids, samples=samples, worker="w")
    return prompt, [group] * n


def _checker(tok, prompt, score):  # type: ignore[no-untyped-def]
    from prl_actors.buffer.group_check import GroupChecker

    return GroupChecker(
        vocab_size=len(tok),
        max_response_tokens=64,
        prompt_of=lambda epoch, gid: prompt,
        encode=lambda text: list(tok(text).input_ids),
        decode=lambda ids: str(tok.decode(ids, skip_special_tokens=True)),
        score=score,
    )


def run(ctx: BenchContext) -> list[Entry]:
    from prl_actors.model.tokenizer import build_tokenizer
    from prl_actors.tasks.base import Task
    from prl_actors.tasks.math_task import math_reward

    tok = build_tokenizer()
    prompt, groups = _groups(ctx.size(2000, 500, 20), tok, math_reward)
    task = Task(items=[(prompt.prompt, "7")], reward=math_reward)
    out = []
    for name, score in (("structure", None), ("verify_rewards", task.score)):
        checker = _checker(tok, prompt, score)
        t0 = time.perf_counter()
        refused = [checker.check(0, g) for g in groups]
        per_group_us = (time.perf_counter() - t0) / len(groups) * 1e6
        assert not any(refused), refused[:1]
        ctx.say(f"[group_checks] {name}: {per_group_us:.0f} us per group of 8 x 32 tokens")
        out.append(
            Entry(
                "group_checks",
                name,
                "check time per group",
                per_group_us,
                "us",
                per_group_us,
                None,
                raw={"groups": len(groups)},
            )
        )
    return out

"""The shipped multi-turn game, `guess`: the model guesses a secret number in 0..N, the environment
answers "+" (the secret is higher) or "-" (lower) after each wrong guess, and the episode ends on the
right guess (reward (max_turns + 1 - turns) / max_turns: fewer turns, more reward), on an invalid
guess (reward 0) or after `task.max_turns` turns (reward 0, not finished).

It is written for the built-in character-level model (digits, "+", "-", "="): the prompt is
"0-N=", each model turn is a number and <eos>, each observation one character, e.g. for secret 6:

    <bos>0-9=  4<eos>  +  7<eos>  -  6<eos>        (tokens the model wrote: 4 <eos> 7 <eos> 6 <eos>)

`warm_start_examples` are transcripts of a player that guesses uniformly among the numbers still
possible (it uses the feedback, but not by halving): the warm-started model plays the game's format
and partly its logic, and GRPO has room to make it win in fewer turns (docs/TASKS.md has the curve).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from prl_actors.data.builtin import IGNORE

if TYPE_CHECKING:
    from prl_actors.envs_llm.base import Message
    from prl_actors.protocol.messages import Prompt

HIGHER, LOWER = "+", "-"


def guess_prompt(top: int) -> str:
    return f"0-{top}="


def guess_items(top: int, copies: int = 4) -> list[tuple[str, str]]:
    """Every secret 0..top, `copies` times (one pass of the sampler sees each secret as often)."""
    return [(guess_prompt(top), str(s)) for _ in range(copies) for s in range(top + 1)]


def guess_reward(turns: int, max_turns: int) -> float:
    """The reward of a win after `turns` guesses."""
    return (max_turns + 1 - turns) / max_turns


class GuessEnv:
    """One episode of the game (see the module docstring)."""

    def __init__(self, top: int, max_turns: int) -> None:
        self.top, self.max_turns = top, max_turns
        self.secret, self.turns = -1, 0

    def reset(self, row: Prompt) -> list[Message]:
        self.secret, self.turns = int(row.answer), 0
        return [{"role": "user", "content": row.prompt}]

    def step(self, text: str) -> tuple[list[Message], float, bool]:
        self.turns += 1
        guess = text.strip()
        if not guess.isdigit() or int(guess) > self.top:
            return [], 0.0, True
        if int(guess) == self.secret:
            return [], guess_reward(self.turns, self.max_turns), True
        hint = HIGHER if self.secret > int(guess) else LOWER
        return [{"role": "user", "content": hint}], 0.0, False


def play_uniform(secret: int, top: int, max_turns: int, rng: random.Random) -> list[tuple[str, str]]:
    """A transcript of the warm-start player: [(guess, feedback)], feedback "" on the last turn."""
    lo, hi, turns = 0, top, []
    for _ in range(max_turns):
        g = rng.randint(lo, hi)
        if g == secret:
            turns.append((str(g), ""))
            break
        turns.append((str(g), HIGHER if secret > g else LOWER))
        lo, hi = (g + 1, hi) if secret > g else (lo, g - 1)
    return turns


def warm_start_examples(
    tok: object, top: int, max_turns: int, count: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) of `count` transcripts; labels only on the model's tokens (guesses, <eos>)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        secret = rng.randint(0, top)
        ids = list(tok(guess_prompt(top)).input_ids)  # type: ignore[operator]
        labels = [IGNORE] * len(ids)
        for g, feedback in play_uniform(secret, top, max_turns, rng):
            turn = list(tok(g, add_special_tokens=False).input_ids) + [tok.eos_token_id]  # type: ignore[operator, attr-defined]
            ids += turn
            labels += turn
            if feedback:
                fb = list(tok(feedback, add_special_tokens=False).input_ids)  # type: ignore[operator]
                ids += fb
                labels += [IGNORE] * len(fb)
        out.append((ids, labels))
    return out

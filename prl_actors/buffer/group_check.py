"""What a group must be before the buffer accepts it: well-formed content (plain code, no sockets).

The buffer runs `GroupChecker.check` on every group that passed the protocol rules (epoch, version,
ticket, size, duplicate). The first failing rule is the refusal (a RejectReason and a one-line detail);
a refused group is requeued for another worker and counted against its sender (buffer/core.py):
  non_finite       a reward or engine log-prob is NaN or infinite
  bad_tokens       a token id outside 0..vocab-1, or not one log-prob per token (when log-probs are sent)
  too_long         a response of more than `max_response_tokens` sampled tokens (a multi-turn
                   episode: its model tokens, loss_mask 1; the environment's are not bounded here)
  wrong_prompt     the prompt text is not the assigned one, or its ids are not that text's tokenisation
  bad_text         a sample's text is not what its token ids decode to (where decoding is exact)
  reward_mismatch  buffer.verify_rewards: a reported reward differs from the task's re-scored one
Every rule needs only the group and what the run's config fixes (vocabulary size, lengths, the
epoch's prompts, the tokenizer): the verdict is the same in every mode (periodic == sync).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from prl_actors.protocol.messages import Group, Prompt, RejectReason

Refusal = tuple[RejectReason, str]


@dataclass
class GroupChecker:
    vocab_size: int = 0  # 0: unknown (token ids are only checked for >= 0)
    max_response_tokens: int = 0  # 0: unbounded
    prompt_of: Callable[[int, int], Prompt | None] | None = None  # (epoch, group id) -> the assigned prompt
    encode: Callable[[str], list[int] | None] | None = None  # a prompt's ids as the engines encode it (None: unknown)
    encode_row: Callable[[Prompt], list[int] | None] | None = None  # multi-turn: the episode's rendered prompt ids
    decode: Callable[[list[int]], str | None] | None = None  # a response's text as the engines decode it
    score: Callable[[Prompt, str], float] | None = None  # buffer.verify_rewards: the task's reward
    length_penalty: Callable[[int], float] | None = None  # what the worker adds for a response's length
    reward_tolerance: float = 1e-6
    note: str = ""  # why some checks cannot run (e.g. no tokenizer on this host); the buffer logs it once

    def check(self, epoch: int, group: Group) -> Refusal | None:
        """The first rule `group` breaks, or None when it is well-formed."""
        for rule in (self._numbers, self._tokens, self._prompt, self._texts, self._rewards):
            why = rule(epoch, group)
            if why is not None:
                return why
        return None

    def _numbers(self, epoch: int, group: Group) -> Refusal | None:
        for i, s in enumerate(group.samples):
            if not math.isfinite(s.reward):
                return RejectReason.NON_FINITE, f"sample {i}: reward {s.reward}"
            bad = next((x for x in s.logprobs if not math.isfinite(x)), None)
            if bad is not None:
                return RejectReason.NON_FINITE, f"sample {i}: log-prob {bad}"
        return None

    def _tokens(self, epoch: int, group: Group) -> Refusal | None:
        limit = self.vocab_size or None
        for i, s in enumerate(group.samples):
            sampled = sum(s.model_mask())  # the model's tokens (a multi-turn sample also holds the env's)
            if self.max_response_tokens and sampled > self.max_response_tokens:
                return RejectReason.TOO_LONG, f"sample {i}: {sampled} sampled tokens > {self.max_response_tokens}"
            if s.logprobs and len(s.logprobs) != sampled:
                return RejectReason.BAD_TOKENS, f"sample {i}: {len(s.logprobs)} log-probs for {sampled} sampled tokens"
            bad = _out_of_range(s.token_ids, limit)
            if bad is not None:
                return RejectReason.BAD_TOKENS, f"sample {i}: token id {bad} outside the vocabulary ({limit})"
        bad = _out_of_range(group.prompt_ids, limit)
        if bad is not None:
            return RejectReason.BAD_TOKENS, f"prompt token id {bad} outside the vocabulary ({limit})"
        return None

    def _prompt(self, epoch: int, group: Group) -> Refusal | None:
        assigned = self.prompt_of(epoch, group.group_id) if self.prompt_of is not None else None
        if assigned is None:
            return None
        if group.prompt != assigned.prompt:
            return (
                RejectReason.WRONG_PROMPT,
                f"prompt {_short(group.prompt)} is not the assigned {_short(assigned.prompt)}",
            )
        if self.encode_row is not None:  # multi-turn: the rendered reset, not the plain prompt
            want = self.encode_row(assigned)
        else:
            want = self.encode(assigned.prompt) if self.encode is not None else None
        if want is not None and group.prompt_ids != want:
            return RejectReason.WRONG_PROMPT, "prompt_ids are not the assigned prompt's tokenisation"
        return None

    def _texts(self, epoch: int, group: Group) -> Refusal | None:
        if self.decode is None:
            return None
        for i, s in enumerate(group.samples):
            text = self.decode(s.token_ids)
            if text is not None and s.text != text:
                return RejectReason.BAD_TEXT, f"sample {i}: text {_short(s.text)} is not its tokens' text"
        return None

    def _rewards(self, epoch: int, group: Group) -> Refusal | None:
        if self.score is None:
            return None
        assigned = self.prompt_of(epoch, group.group_id) if self.prompt_of is not None else None
        prompt = assigned or Prompt(group_id=group.group_id, prompt=group.prompt)
        for i, s in enumerate(group.samples):
            want = self.score(prompt, s.text)
            if self.length_penalty is not None:  # as the worker scores (tasks/shaping.py: overlong)
                want += self.length_penalty(len(s.token_ids))
            if not abs(want - s.reward) <= self.reward_tolerance:
                return RejectReason.REWARD_MISMATCH, f"sample {i}: reported reward {s.reward}, re-scored {want}"
        return None


def _out_of_range(ids: list[int], limit: int | None) -> int | None:
    """The first id < 0 or >= limit (None: all in range)."""
    if not ids:
        return None
    lo, hi = min(ids), max(ids)
    if lo < 0:
        return lo
    if limit is not None and hi >= limit:
        return hi
    return None


def _short(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")

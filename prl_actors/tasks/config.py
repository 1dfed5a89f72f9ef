"""The `task:` section: the prompts, the rewards (`task.rewards:`), episodes and tools.

A section lives beside the code that reads it; prl_actors/config.py composes every section into the
run's `Config` and holds the rules that span sections (docs/CONFIG.md lists every field)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from prl_actors.sections import Section

REWARD_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class RewardSpec(Section):
    """One reward of `task.rewards`: exactly one of `fn`, `model`, `url` (docs/TASKS.md)."""

    fn: str | None = Field(
        None, description="A built-in (math, format, length, add, code) or 'module:function' (per sample or batched)."
    )
    model: str | None = Field(None, description="A local Hugging Face sequence-classification checkpoint directory.")
    url: str | None = Field(None, description="An http(s) reward service (JSON contract in docs/TASKS.md).")
    name: str | None = Field(
        None, description="Metrics key reward/<name> (default: the builtin or function name, 'model', 'service')."
    )
    weight: float = Field(1.0, allow_inf_nan=False, description="Its weight in the total (sum of weight * value).")
    batched: bool = Field(False, description="fn: called once per group with its G records instead of per sample.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments bound to fn (length: max_tokens)."
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="url: seconds per request (default 30); fn: bound on a plugin's (or async reward's) wait per group "
        "(default 300).",
    )
    retries: int = Field(2, ge=0, le=10, description="url: extra attempts after a failed or timed-out request.")
    concurrency: int = Field(4, ge=1, le=256, description="url: requests in flight at once (per worker).")
    device: str = Field("cpu", description="model: torch device of the reward model (cpu, cuda, cuda:1, ...).")
    threads: int | None = Field(None, ge=1, description="model: torch CPU threads while scoring (default: unchanged).")
    batch_size: int = Field(16, ge=1, description="model: sequences per forward pass.")
    max_length: int = Field(1024, ge=8, description="model: prompt+completion tokens kept (truncated from the left).")
    label: int = Field(0, ge=0, description="model: the logit used as the reward (num_labels > 1).")

    @model_validator(mode="after")
    def _one_source(self) -> RewardSpec:
        given = [k for k in ("fn", "model", "url") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"a reward needs exactly one of fn, model, url (got {', '.join(given) or 'none'})")
        if self.batched and not self.fn:
            raise ValueError("batched applies to fn rewards (model and url rewards always score a group at once)")
        if self.args and not self.fn:
            raise ValueError("args applies to fn rewards (keyword arguments bound to the function)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        if self.name is not None and not REWARD_NAME.fullmatch(self.name):
            raise ValueError(f"reward name {self.name!r}: use letters, digits, '_', '.', '-'")
        return self

    def default_name(self) -> str:
        if self.name:
            return self.name
        if self.fn:
            return self.fn.rpartition(":")[2] or self.fn
        return "model" if self.model else "service"


class TaskSection(Section):
    name: str = Field(
        "add",
        description="add (a+b=, the default), jsonl (prompts_file), math (word problems), code (programs vs "
        "tests) or guess (a game).",
    )
    prompts_file: str | None = Field(
        None, description="JSONL or parquet file, or a local `datasets` directory (math: the shipped sample if unset)."
    )
    prompt_field: str | None = Field(
        None, description="Column/key of the prompt (default: jsonl 'prompt', math 'question')."
    )
    answer_field: str = Field("answer", description="Column/key of the reference answer.")
    split: str = Field("train", description="The split to read from a `datasets` directory holding several.")
    chat_template: bool = Field(False, description="Wrap each prompt in the tokenizer's chat template (model.path).")
    system_prompt: str | None = Field(None, description="System message of the chat template (needs chat_template).")
    format_reward: float = Field(
        0.0, ge=0, lt=1, description="math: bonus for a \\boxed{} or #### final answer (added to the 0/1 correctness)."
    )
    reward: str | None = Field(None, description="module:function reward plugin (see docs).")
    on_error: Literal["fail", "skip", "fail_first"] = Field(
        "fail_first",
        description="A group that failed generation, scoring or training run.max_group_failures times: fail = the "
        "run fails naming the prompt and exception; skip = the group is dropped from its epoch (the step "
        "trains the rest; logged and on the console); fail_first = fail while no epoch has been trained "
        "yet (a broken config or plugin is caught at once), skip afterwards.",
    )
    rewards: list[RewardSpec] = Field(
        default_factory=list,
        description="Weighted rewards (fn / model / url), summed by weight; replaces the task's own reward.",
    )
    on_reward_error: Literal["fail", "zero"] = Field(
        "fail",
        description="A reward that raises or returns a non-finite number: fail the run (one line), or score 0, warn.",
    )
    tests_field: str = Field("tests", description="code: column holding the row's tests (a list of Python asserts).")
    code_timeout_s: float = Field(5.0, gt=0, le=600, description="code: seconds a sample's program may run.")
    code_memory_mb: int = Field(512, ge=16, description="code: address-space limit (RLIMIT_AS) of the program.")
    code_unsafe_local: bool = Field(
        False,
        description="code: run programs as plain local subprocesses (rlimits only, no isolation) where bubblewrap "
        "is missing; for trusted code only. Default: refuse to start without bubblewrap (docs/SECURITY.md).",
    )
    max_operand: int = Field(20, ge=1)
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="Prompts longer than this (in tokens, after templating) are left out at load, with one line "
        "giving their count and the first one's row; None = no limit. Prompts that cannot fit the model's "
        "positions with max_new_tokens are refused at load either way.",
    )
    overlong_buffer: int = Field(
        0,
        ge=0,
        description="DAPO soft overlong penalty: a response longer than max_new_tokens - overlong_buffer tokens "
        "gets a reward penalty growing linearly to overlong_penalty at max_new_tokens; 0 = off.",
    )
    overlong_penalty: float = Field(1.0, ge=0, description="The overlong penalty's size at max_new_tokens.")
    environment: str | None = Field(
        None,
        description="Multi-turn: module:factory of an environment (reset/step, docs/TASKS.md); "
        "the factory is called once per episode. The `guess` task has its own.",
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Multi-turn tool calling: tool names (`calculator`) or module:function; the model calls "
        "them as <tool_call>{...}</tool_call>, its first turn without a call is scored by the task's reward.",
    )
    max_turns: int = Field(4, ge=1, le=64, description="Multi-turn: model turns per episode at most.")
    max_turn_tokens: int | None = Field(
        None, ge=1, description="Multi-turn: tokens per model turn at most (default worker.sampling.max_new_tokens)."
    )
    guess_max: int = Field(9, ge=1, le=99, description="guess: the secret is a number in 0..guess_max.")
    env_threads: int = Field(8, ge=1, le=256, description="Multi-turn: threads running environment / tool steps.")

    @model_validator(mode="after")
    def _one_kind_of_episode(self) -> TaskSection:
        kinds = [
            k
            for k, on in (
                ("task.environment", self.environment),
                ("task.tools", self.tools),
                ("the guess task", self.name == "guess"),
            )
            if on
        ]
        if len(kinds) > 1:
            raise ValueError(f"{' and '.join(kinds)} exclude each other (one kind of episode per run)")
        return self

    @model_validator(mode="after")
    def _tools_need_template(self) -> TaskSection:
        if self.tools and not self.chat_template:
            raise ValueError("task.tools needs chat_template: true (the template shows the model the tools' schemas)")
        return self

    @property
    def multi_turn(self) -> bool:
        """Episodes of several turns (an environment or tools) instead of one response per sample."""
        return bool(self.environment or self.tools or self.name == "guess")

    @model_validator(mode="after")
    def _rewards(self) -> TaskSection:
        if self.reward and self.rewards:
            raise ValueError("set task.reward or task.rewards, not both (task.rewards: [{fn: module:function}])")
        names = [r.default_name() for r in self.rewards]
        if "env" in names:
            raise ValueError("task.rewards: the name 'env' is the multi-turn environment's own reward: pick another")
        doubles = sorted({n for n in names if names.count(n) > 1})
        if doubles:
            raise ValueError(f"task.rewards: two rewards named {doubles[0]!r}: give each a distinct name")
        return self

    @model_validator(mode="after")
    def _system_needs_template(self) -> TaskSection:
        if self.system_prompt is not None and not self.chat_template:
            raise ValueError("system_prompt needs chat_template: true (the system message goes into the template)")
        return self

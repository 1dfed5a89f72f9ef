"""Multi-turn episodes on any turn backend: the Engine protocol for environments and tools.

A group is G episodes of one row. Each episode alternates model turns and environment steps:

    context = initial prompt (shared by the G episodes)
    repeat up to task.max_turns:  model turn (<= task.max_turn_tokens tokens, up to its eos)
                                  env.step(turn text) -> observation, reward, done
                                  context += turn tokens (mask 1) + observation tokens (mask 0)

The group leaves (`step` returns it) once its G episodes are over; each sample is the episode after
the prompt: its tokens, a loss mask (1 = model, 0 = environment) and the model tokens' behaviour
log-probs only (protocol Sample.loss_mask).

Not blocking the batch: an environment step, and the G factory calls + resets that start a group,
run in a pool of daemon threads (`async def` ones on a private loop in that thread), never on the
worker's thread, each under STEP_TIMEOUT_S (past it the group fails with an EnvError, and a thread
that never returns keeps nothing alive: envs_llm/pool.py); the episode leaves the running batch while
it waits, so the other rows go on decoding, and re-enters as a new one-row entry once its observation
is back.

Re-entry re-prefills the whole context rather than extending the row's old KV cache. Why: the
running batch is a left-padded rectangle; appending a different number of observation tokens to one
row would mean re-padding every row's cache (or a paged cache this engine does not have), and the
row's slot would be held idle for the whole tool latency. A re-prefill costs one forward over the
context (tens to a few hundred tokens here, batched with the other admissions), frees the slot
while the tool runs, and needs no change to the batch's cache layout. (vLLM, with a prefix cache,
gets the same effect for free: engines/vllm_turns.py.)

Sampling stays counter-based per (group key, episode index, token position in the episode), so an
episode regenerated with the same weights (a requeue after a worker loss) replays identically,
whatever else shared the batch and however long the tools took. Episodes are generated whole with
one weight version: `load_weights` is refused while any episode runs, and `abort` drops them all
(a requeued group starts its episodes from scratch).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from prl_actors.engines.base import EngineBusy, Generated, GeneratedGroup, generate_all
from prl_actors.envs_llm.base import (
    EnvError,
    EnvFactory,
    Environment,
    Message,
    StepResult,
    reset_messages,
    step_result,
)
from prl_actors.envs_llm.pool import DaemonPool
from prl_actors.protocol.messages import EpisodeStats, Prompt

if TYPE_CHECKING:
    from prl_actors.envs_llm.render import Renderer

ENV_WAIT_S = 0.05  # longest wait for a tool inside one `step` when no row decodes (the worker's inbox runs between)
STEP_TIMEOUT_S = 300.0  # one environment step (a tool call) at most: past it the group fails (EnvError)


@dataclass
class Turn:
    """A model turn to generate: `size` rows (G for a group's first turn, else 1) on context `ids`."""

    turn_id: int
    ids: list[int]
    key: int
    index: int  # the first row's episode index in its group
    size: int
    offset: int  # tokens of the episode before this turn (the sampling counter's start)


@dataclass
class TurnOut:
    turn_id: int
    index: int
    tokens: list[int]
    logprobs: list[float]
    eos: bool


class TurnBackend(Protocol):
    """What an engine offers the episode loop: generate turns, one weight version at a time."""

    max_context: int | None  # the longest context the model takes (None: no limit known)

    @property
    def version(self) -> int: ...
    @property
    def max_rows(self) -> int: ...

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None: ...
    def submit(self, turn: Turn) -> None: ...
    def poll(self) -> list[TurnOut]: ...
    def abort(self) -> None: ...
    def seed_for(self, group_id: int) -> int: ...
    def close(self) -> None: ...

    @property
    def busy(self) -> bool: ...


@dataclass
class Episode:
    index: int
    env: Environment
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    over: bool = False
    done: bool = False  # the environment ended it (else max_turns or the context limit did)


def _make_envs(factory: EnvFactory, p: Prompt, size: int) -> list[tuple[Environment, list[Message]]]:
    """G environments and their reset messages (on a pool thread: user code). EnvError for any failure."""
    try:
        envs = [factory() for _ in range(size)]
        return [(env, reset_messages(env, p)) for env in envs]
    except EnvError:
        raise
    except BaseException as exc:  # noqa: BLE001 - a SystemExit of the plugin's is its error, not the worker's exit
        raise EnvError(f"environment factory or reset raised {type(exc).__name__}: {exc}") from exc


@dataclass
class EpisodeSample(Generated):
    """A finished episode: a Generated sample with its counts (the worker sends them as Sample.episode)."""

    episode: EpisodeStats | None = None


def episode_stats(e: Episode) -> EpisodeStats:
    """The episode's turns, and its tool calls / errors as its environment counts them (`tool_calls`,
    `tool_errors` attributes, e.g. ToolEnv's; 0 for an environment without them)."""
    return EpisodeStats(turns=e.turns, tool_calls=_count(e.env, "tool_calls"), tool_errors=_count(e.env, "tool_errors"))


def _count(env: Any, name: str) -> int:
    value = getattr(env, name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass
class EpisodeGroup:
    prompt: Prompt
    prompt_ids: list[int]
    key: int
    episodes: list[Episode]
    t_admit: float


class MultiTurnEngine:
    """The Engine protocol over a TurnBackend and an environment factory (one env per episode)."""

    def __init__(
        self,
        turns: TurnBackend,
        factory: EnvFactory,
        renderer: Renderer,
        *,
        max_turns: int,
        max_turn_tokens: int,
        env_threads: int = 8,
    ) -> None:
        self.turns, self.factory, self.renderer = turns, factory, renderer
        self.max_turns, self.max_turn_tokens = max_turns, max_turn_tokens
        self.pool = DaemonPool(env_threads, "env-step")  # daemons: a hung step never holds the process
        self.starting: list[tuple[Prompt, int]] = []  # admitted, environments not made yet
        self.groups: dict[int, EpisodeGroup] = {}
        self.in_turn: dict[int, tuple[EpisodeGroup, int]] = {}  # turn id -> (group, first episode index)
        self.waiting: dict[cf.Future[StepResult], tuple[EpisodeGroup, Episode, float]] = {}
        self.resetting: dict[cf.Future[Any], tuple[Prompt, int, float]] = {}  # G resets on the pool
        self._next_turn = 0

    # --- the Engine protocol ---------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self.turns.version

    @property
    def max_rows(self) -> int:
        return self.turns.max_rows

    def load_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        if self.busy:
            raise EngineBusy(f"cannot load version {version} while {len(self.groups)} groups play episodes")
        self.turns.load_weights(version, tensors)

    def admit(self, prompts: list[Prompt], group_size: int) -> None:
        """Queue groups; their environments are made and reset on the pool from the next `step` (a
        plugin that raises or hangs fails inside `step`, where the worker hands the groups back and
        says why)."""
        self.starting += [(p, group_size) for p in prompts]

    def _start(self, p: Prompt, group_size: int) -> None:
        """Make and reset G environments on the pool (user code: never on the caller's thread)."""
        future = self.pool.submit(_make_envs, self.factory, p, group_size)
        self.resetting[future] = (p, group_size, time.monotonic())

    def _started(self, p: Prompt, made: list[tuple[Environment, list[Message]]]) -> None:
        """The G environments are reset: render their prompt (here: one thread uses the tokenizer)
        and queue the group's first turn."""
        firsts = [self.renderer.initial(messages) for _, messages in made]
        if any(ids != firsts[0] for ids in firsts):
            raise EnvError(f"reset gave different prompts to the episodes of group {p.group_id}")
        episodes = [Episode(i, env) for i, (env, _) in enumerate(made)]
        group = EpisodeGroup(p, firsts[0], self.turns.seed_for(p.group_id), episodes, time.monotonic())
        self.groups[p.group_id] = group
        self._submit(group, 0, len(made), firsts[0], 0)

    def step(self) -> list[GeneratedGroup]:
        """Start queued groups, take back finished resets and environment steps, advance the turns
        one step, return the finished groups."""
        starting, self.starting = self.starting, []
        for p, size in starting:
            self._start(p, size)
        self._collect(block=False)
        if self.turns.busy:
            for out in self.turns.poll():
                self._turn_done(out)
        elif self.waiting or self.resetting:
            self._collect(block=True)
        return self._finished()

    def abort(self) -> list[int]:
        """Drop every episode (the environment steps and resets still running finish unseen)."""
        resetting = (p.group_id for p, _, _ in self.resetting.values())
        dropped = sorted([*self.groups, *(p.group_id for p, _ in self.starting), *resetting])
        self.starting = []
        self.resetting.clear()
        self.turns.abort()
        self.groups.clear()
        self.in_turn.clear()
        self.waiting.clear()
        return dropped

    @property
    def busy(self) -> bool:
        return bool(self.groups or self.starting or self.resetting)

    @property
    def rows(self) -> int:
        """Episodes still playing (to start, resetting, running, queued or waiting on their environment)."""
        playing = sum(1 for g in self.groups.values() for e in g.episodes if not e.over)
        waiting = sum(size for _, size in self.starting) + sum(size for _, size, _ in self.resetting.values())
        return playing + waiting

    def generate(self, prompts: list[Prompt], group_size: int) -> list[GeneratedGroup]:
        return generate_all(self, prompts, group_size)  # type: ignore[arg-type]

    def close(self) -> None:
        self.abort()
        self.pool.shutdown()
        self.turns.close()

    # --- the episode loop ------------------------------------------------------------------------

    def _submit(self, group: EpisodeGroup, index: int, size: int, ids: list[int], offset: int) -> None:
        turn = Turn(self._next_turn, ids, group.key, index, size, offset)
        self._next_turn += 1
        self.in_turn[turn.turn_id] = (group, index)
        self.turns.submit(turn)

    def _turn_done(self, out: TurnOut) -> None:
        """A model turn is over: record it, hand its text to the episode's environment (pool)."""
        group, _ = self.in_turn[out.turn_id]
        episode = group.episodes[out.index]
        episode.tokens += out.tokens
        episode.mask += [1] * len(out.tokens)
        episode.logprobs += out.logprobs
        episode.turns += 1
        text = str(self.renderer.tok.decode(out.tokens, skip_special_tokens=True))
        self.waiting[self.pool.submit(step_result, episode.env, text)] = (group, episode, time.monotonic())

    def _collect(self, block: bool) -> None:
        """Apply the resets and environment steps that are done (waiting up to ENV_WAIT_S for one if
        `block`)."""
        if not (self.waiting or self.resetting):
            return
        if block:
            pending: list[cf.Future[Any]] = [*self.waiting, *self.resetting]
            cf.wait(pending, timeout=ENV_WAIT_S, return_when=cf.FIRST_COMPLETED)
        self._overdue()
        for future in [f for f in self.resetting if f.done()]:
            p, _, _ = self.resetting.pop(future)
            self._started(p, future.result())  # an EnvError propagates: the worker hands the groups back
        for future in [f for f in self.waiting if f.done()]:
            group, episode, _ = self.waiting.pop(future)
            if self.groups.get(group.prompt.group_id) is not group:
                continue  # aborted meanwhile
            self._observe(group, episode, future.result())  # an EnvError propagates: the worker hands the groups back

    def _overdue(self) -> None:
        """An environment step running past STEP_TIMEOUT_S fails its group (EnvError: the worker
        hands it back and says why); its thread is abandoned (a daemon)."""
        now = time.monotonic()
        for reset, (p, _, t0) in self.resetting.items():
            if not reset.done() and now - t0 > STEP_TIMEOUT_S:
                raise EnvError(f"the environments of group {p.group_id} did not reset within {STEP_TIMEOUT_S:g}s")
        for future, (group, _, t0) in list(self.waiting.items()):
            if not future.done() and now - t0 > STEP_TIMEOUT_S and self.groups.get(group.prompt.group_id) is group:
                raise EnvError(
                    f"an environment step of group {group.prompt.group_id} did not return within {STEP_TIMEOUT_S:g}s"
                )

    def _observe(self, group: EpisodeGroup, episode: Episode, result: StepResult) -> None:
        episode.reward += result.reward
        if result.done or episode.turns >= self.max_turns:
            episode.over, episode.done = True, result.done
            return
        obs = self.renderer.observation(result.observation)
        context = len(group.prompt_ids) + len(episode.tokens) + len(obs) + self.max_turn_tokens
        limit = self.turns.max_context
        if limit is not None and context > limit:
            episode.over = True  # no room for another full turn: truncated, like a single turn at max_new_tokens
            return
        episode.tokens += obs
        episode.mask += [0] * len(obs)
        self._submit(group, episode.index, 1, group.prompt_ids + episode.tokens, len(episode.tokens))

    def _finished(self) -> list[GeneratedGroup]:
        done = [g for g in self.groups.values() if all(e.over for e in g.episodes)]
        now = time.monotonic()
        out = []
        for g in done:
            del self.groups[g.prompt.group_id]
            out.append(self._group(g, now - g.t_admit))
        if done:
            alive = {id(g) for g in self.groups.values()}
            self.in_turn = {t: v for t, v in self.in_turn.items() if id(v[0]) in alive}
        return out

    def _group(self, g: EpisodeGroup, seconds: float) -> GeneratedGroup:
        group = GeneratedGroup(g.prompt.group_id, g.prompt.prompt, g.prompt_ids, gen_s=seconds)
        for e in g.episodes:
            text = str(self.renderer.tok.decode(e.tokens, skip_special_tokens=True))
            group.samples.append(
                EpisodeSample(
                    text,
                    e.tokens,
                    e.logprobs,
                    finished=e.done,
                    reward=e.reward,
                    loss_mask=e.mask,
                    episode=episode_stats(e),
                )
            )
        return group

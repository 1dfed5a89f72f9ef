"""Multi-turn episodes: the environment API, tool calling, the loss mask (by gradient), the episode
loop on the torch engine's running batch (a tool wait does not block the batch; a regenerated episode
is the same), and the mask's bound at the protocol edge."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from prl_actors.config import Config
from prl_actors.envs_llm.base import EnvError
from prl_actors.envs_llm.calculator import calculator
from prl_actors.envs_llm.guess import GuessEnv, guess_reward
from prl_actors.envs_llm.render import Renderer
from prl_actors.envs_llm.tools import ToolEnv, parse_tool_calls, tool
from prl_actors.launch import build
from prl_actors.launch.topology import learner_settings
from prl_actors.protocol import codec
from prl_actors.protocol.messages import Group, GroupResult, Prompt, Sample
from prl_actors.sections import ConfigError
from prl_actors.training.grpo import GRPOLearner

pytestmark = pytest.mark.fast

GUESS: dict[str, Any] = {
    "task": {"name": "guess", "max_turns": 4, "max_turn_tokens": 3},
    "model": {"warm_start_steps": 300},
    "worker": {"group_size": 4, "max_batch_rows": 16, "sampling": {"max_new_tokens": 3}},
    "coordinator": {"groups_per_epoch": 4},
}


def guess_config(**task: Any) -> Config:
    raw = {**GUESS, "task": {**GUESS["task"], **task}}
    return Config.model_validate(raw)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prl_actors.launch import build

    root = tmp_path_factory.mktemp("guess-model")
    return build.model_dir(guess_config(), root)


def rows(n: int) -> list[Prompt]:
    return [Prompt(group_id=i, prompt="0-9=", answer=str((3 * i + 2) % 10)) for i in range(n)]


def as_group(g: Any) -> Group:
    samples = [
        Sample(
            text=s.text,
            token_ids=s.token_ids,
            logprobs=s.logprobs,
            reward=s.reward,
            finished=s.finished,
            loss_mask=s.loss_mask or [],
        )
        for s in g.samples
    ]
    return Group(group_id=g.group_id, prompt=g.prompt, prompt_ids=g.prompt_ids, samples=samples, worker="w")


# --- the environment API and tools ---------------------------------------------------------------


def test_guess_env_answers_higher_lower_and_pays_fewer_turns_more() -> None:
    env = GuessEnv(9, 5)
    assert env.reset(Prompt(group_id=0, prompt="0-9=", answer="6")) == [{"role": "user", "content": "0-9="}]
    assert env.step("4") == ([{"role": "user", "content": "+"}], 0.0, False)
    assert env.step("8") == ([{"role": "user", "content": "-"}], 0.0, False)
    assert env.step("6") == ([], guess_reward(3, 5), True)
    assert guess_reward(1, 5) == 1.0 > guess_reward(3, 5) > guess_reward(5, 5) > 0
    env.reset(Prompt(group_id=0, prompt="0-9=", answer="6"))
    assert env.step("1+") == ([], 0.0, True)  # not a number: lost


def test_tool_calls_parse_run_and_report_errors_as_tool_messages() -> None:
    calc = tool(calculator)
    assert calc.schema["function"]["parameters"]["properties"] == {"expression": {"type": "string"}}
    text = 'x <tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}</tool_call>'
    assert parse_tool_calls(text) == [("calculator", {"expression": "3*(4+5)"})]
    env = ToolEnv([calc], lambda p, r, a: float(r.strip() == a))
    env.reset(Prompt(group_id=0, prompt="3*(4+5)?", answer="27"))
    bad = '<tool_call>{"name": "calculator"</tool_call><tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    out, reward, done = env.step(text + bad)
    assert [m["content"] for m in out][0] == "27" and not done and reward == 0.0
    assert out[1]["content"].startswith("error: the tool call is not JSON")
    assert out[2]["content"].startswith("error: unknown tool 'nope'")
    assert env.step("27") == ([], 1.0, True)  # no call: the answer, scored by the task's reward
    for evil in ("__import__('os')", "9**9**9", "1" * 300):
        with pytest.raises(ValueError):
            calculator(evil)


def test_async_environments_and_broken_ones(model_dir: Path) -> None:
    class AsyncGuess(GuessEnv):
        async def step(self, text: str) -> tuple[list[dict[str, str]], float, bool]:  # type: ignore[override]
            return super().step(text)

    class Broken(GuessEnv):
        def step(self, text: str) -> Any:
            return "not a tuple"

    engine = build.engine(guess_config(), model_dir)
    engine.load_weights(0, _weights(model_dir))
    engine.factory = lambda: AsyncGuess(9, 4)  # type: ignore[attr-defined]
    groups = engine.generate(rows(2), 4)
    assert all(s.loss_mask for g in groups for s in g.samples)
    engine.factory = lambda: Broken(9, 4)  # type: ignore[attr-defined]
    with pytest.raises(EnvError, match=r"must return \(messages, reward, done\)"):
        engine.generate(rows(1), 4)
    engine.abort()

    def no_env() -> GuessEnv:
        raise KeyError("no such game")

    engine.factory = no_env  # type: ignore[attr-defined]
    engine.admit(rows(1), 4)  # admission never raises (the worker's assign handler does not guard it) ...
    with pytest.raises(EnvError, match="factory or reset raised KeyError"):
        engine.step()  # ... the step does, and the worker hands the groups back
    assert engine.abort() == [] and not engine.busy


def test_config_refuses_two_kinds_of_episode_and_unknown_tools() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        guess_config(tools=["calculator"], chat_template=True)
    with pytest.raises(ValueError, match="task.tools needs chat_template"):
        Config.model_validate({"task": {"name": "math", "tools": ["calculator"]}})
    with pytest.raises(ValueError, match="need worker.engine torch or vllm"):
        Config.model_validate({"task": {"name": "guess"}, "worker": {"engine": "sim"}, "trainer": {"learner": "sim"}})
    from prl_actors.envs_llm.registry import load_tools

    with pytest.raises(ConfigError, match="unknown tool 'abacus'"):
        load_tools(["abacus"])


def test_chat_template_renders_observations_as_the_conversation_goes_on(tmp_path: Path) -> None:
    from prl_actors.model.tiny import build_family
    from prl_actors.model.tokenizer import load_tokenizer

    build_family("qwen2", tmp_path / "q")
    tok = load_tokenizer(tmp_path / "q")
    r = Renderer(tok, templated=True)
    first = r.initial([{"role": "user", "content": "hi"}])
    obs = r.observation([{"role": "tool", "content": "42"}])
    assert tok.decode(first) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(obs) == "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


# --- the protocol's bound ------------------------------------------------------------------------


def test_a_mask_that_does_not_fit_its_tokens_is_malformed_at_the_socket_edge() -> None:
    good = Sample(text="", token_ids=[5, 6, 7], logprobs=[-1.0, -1.0], reward=1.0, loss_mask=[1, 0, 1])
    msg = GroupResult(
        epoch=0, version=0, group=Group(group_id=0, prompt="p", prompt_ids=[1], samples=[good], worker="w")
    )
    frames = codec.encode(msg)
    decoded = codec.decode(frames)[0]
    assert isinstance(decoded, GroupResult) and decoded.group.samples[0].loss_mask == [1, 0, 1]
    for mask in ([1, 0], [1, 2, 1]):
        bad = msgspec.structs.replace(good, loss_mask=[1, 1, 1])
        raw = msgspec.msgpack.encode(bad)
        with pytest.raises(msgspec.ValidationError):
            msgspec.msgpack.decode(
                raw.replace(msgspec.msgpack.encode([1, 1, 1]), msgspec.msgpack.encode(mask)), type=Sample
            )
        with pytest.raises(ValueError):
            Sample(text="", token_ids=[5, 6, 7], logprobs=[], reward=0.0, loss_mask=mask)


# --- the loss mask, by gradient ------------------------------------------------------------------


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _logit_grads(learner: GRPOLearner, groups: list[Group]) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient of the summed loss w.r.t. the policy's logits [B, T, V], and the batch's predict index."""
    from prl_actors.training.packing import collate

    captured: list[torch.Tensor] = []

    def keep(_module: Any, _inputs: Any, out: torch.Tensor) -> None:
        if out.requires_grad:
            out.retain_grad()
            captured.append(out)

    hook = learner.policy.lm_head.register_forward_hook(keep)
    try:
        learner.begin_epoch(0, len(groups))
        for g in groups:
            learner.accumulate(g)
        learner.flush()
    finally:
        hook.remove()
    assert len(captured) == 1
    batch = collate([(g.prompt_ids, [s.token_ids for s in g.samples]) for g in groups], True)
    grad = captured[0].grad
    assert grad is not None
    return grad.flatten(0, 1), batch.predict_index


def test_environment_tokens_get_no_gradient(model_dir: Path) -> None:
    """Episodes really generated by the engine; the logits predicting environment tokens get exactly
    zero gradient, those predicting model tokens do not. Without the mask (all 1) the same positions
    do get gradient, so the check can fail."""
    cfg = guess_config()
    engine = build.engine(cfg, model_dir)
    engine.load_weights(0, _weights(model_dir))
    groups = [as_group(g) for g in engine.generate(rows(4), 4)]
    mask = torch.tensor([m for g in groups for s in g.samples for m in s.loss_mask], dtype=torch.bool)
    assert (~mask).any() and mask.any(), "the episodes need both model and environment tokens"
    assert len({s.reward for g in groups for s in g.samples}) > 1, "no advantage, no gradient at all"
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    grads, predict = _logit_grads(learner, groups)
    per_token = grads[predict].abs().sum(-1)  # [N]
    assert torch.all(per_token[~mask] == 0)
    assert torch.all(per_token[mask & (per_token > 0)] > 0) and (per_token[mask] > 0).sum() > mask.sum() // 2
    unmasked = [
        msgspec.structs.replace(g, samples=[msgspec.structs.replace(s, loss_mask=[]) for s in g.samples])
        for g in groups
    ]
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    grads, predict = _logit_grads(learner, unmasked)
    assert (grads[predict].abs().sum(-1)[~mask] > 0).any()


def test_the_epoch_normalises_by_model_tokens_only(model_dir: Path) -> None:
    cfg = guess_config()
    engine = build.engine(cfg, model_dir)
    engine.load_weights(0, _weights(model_dir))
    groups = [as_group(g) for g in engine.generate(rows(2), 4)]
    learner = GRPOLearner(learner_settings(cfg), model_dir)
    learner.begin_epoch(0, 2)
    for g in groups:
        learner.accumulate(g)
    metrics = learner.step()
    assert metrics["tokens"] == sum(sum(s.loss_mask) for g in groups for s in g.samples)
    assert metrics["logprob_diff_max"] < 1e-4  # engine and trainer agree on the model tokens (re-prefilled turns)


# --- the episode loop on the running batch -------------------------------------------------------


def test_episodes_regenerate_identically_alone_or_in_a_crowd(model_dir: Path) -> None:
    """Counter-based sampling per (group, episode, position): a requeued group (alone, later, with
    other groups around it, its tools answering at other times) replays the same episodes."""
    engine = build.engine(guess_config(), model_dir)
    engine.load_weights(0, _weights(model_dir))
    crowd = {g.group_id: g for g in engine.generate(rows(4), 4)}
    alone = engine.generate(rows(4)[2:3], 4)[0]
    assert [s.token_ids for s in alone.samples] == [s.token_ids for s in crowd[2].samples]
    assert [s.reward for s in alone.samples] == [s.reward for s in crowd[2].samples]
    assert sum(len(s.token_ids) for s in alone.samples) > sum(sum(s.loss_mask or []) for s in alone.samples)


def test_a_slow_tool_does_not_block_the_batch(model_dir: Path) -> None:
    """Group 0's environment sleeps on every step; group 1's answers at once. Group 1 finishes all
    its episodes while group 0 still waits on its first step."""
    release = threading.Event()

    class Slow(GuessEnv):
        def step(self, text: str) -> tuple[list[dict[str, str]], float, bool]:
            if self.secret == 2:  # group 0's secret
                release.wait(10)
            return super().step(text)

    engine = build.engine(guess_config(), model_dir)
    engine.load_weights(0, _weights(model_dir))
    engine.factory = lambda: Slow(9, 4)  # type: ignore[attr-defined]
    engine.admit(rows(2), 4)
    done: list[int] = []
    deadline = time.monotonic() + 30
    while 1 not in done and time.monotonic() < deadline:
        done += [g.group_id for g in engine.step()]
    assert done == [1], "group 1 waited for group 0's tool"
    release.set()
    while engine.busy and time.monotonic() < deadline:
        done += [g.group_id for g in engine.step()]
    assert done == [1, 0]


# --- the vLLM turn loop, without vLLM ------------------------------------------------------------


class _Params:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class _FakeLLM:
    """Stands in for vllm.LLM.generate: records the requests, answers each with `n` completions."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, Any]], list[_Params]]] = []

    def generate(self, requests: list[dict[str, Any]], params: list[_Params], **_: Any) -> list[Any]:
        self.calls.append((requests, params))
        out = []
        for p in params:
            step = {5: _Params(logprob=-0.5), 2: _Params(logprob=-0.25)}
            completions = [_Params(token_ids=[5, 2], logprobs=[step, step], finish_reason="stop") for _ in range(p.n)]
            out.append(_Params(outputs=completions))
        return out


def test_vllm_turns_generate_every_waiting_turn_in_one_call_with_episode_seeds() -> None:
    from prl_actors.engines.config import SamplingSection
    from prl_actors.engines.multiturn import Turn
    from prl_actors.engines.vllm_turns import VllmTurns, turn_seed

    fake = _Params(
        version=3, max_rows=64, seed=0, sampling=SamplingSection(), llm=_FakeLLM(), lora_request=None,
        _vllm=_Params(SamplingParams=_Params),
    )  # fmt: skip
    turns = VllmTurns(fake, max_turn_tokens=7)
    turns.submit(Turn(0, [1, 4], key=11, index=0, size=4, offset=0))
    turns.submit(Turn(1, [1, 4, 5, 2, 9], key=11, index=2, size=1, offset=3))
    assert turns.busy
    outs = turns.poll()
    assert not turns.busy and len(fake.llm.calls) == 1  # one generate call for both turns
    requests, params = fake.llm.calls[0]
    assert requests == [{"prompt_token_ids": [1, 4]}, {"prompt_token_ids": [1, 4, 5, 2, 9]}]
    assert [p.n for p in params] == [4, 1] and all(p.max_tokens == 7 and p.logprobs == 0 for p in params)
    assert [(o.turn_id, o.index, o.tokens, o.logprobs, o.eos) for o in outs][3:] == [
        (0, 3, [5, 2], [-0.5, -0.25], True),
        (1, 2, [5, 2], [-0.5, -0.25], True),
    ]
    a, b = Turn(0, [1], 11, 2, 1, 3), Turn(9, [1, 7], 11, 2, 1, 3)
    assert turn_seed(a) == turn_seed(b)  # a pure function of (key, episode, offset): a replay asks the same
    assert len({turn_seed(Turn(0, [1], 11, i, 1, o)) for i in range(4) for o in range(4)}) == 16


def test_tools_config_plays_templated_tool_turns_on_a_chat_model(tmp_path: Path) -> None:
    """configs/tools.yaml on a tiny random Qwen2 chat checkpoint: the tool result comes back through
    the chat template as environment tokens (masked), and the episode's tokens decode to the
    conversation. The random model never writes a tool call, so the environment here answers every
    turn as if it had called the calculator (the real ToolEnv, with a call appended to the turn)."""
    from prl_actors.config import load_config
    from prl_actors.envs_llm.calculator import BUILTIN_TOOLS
    from prl_actors.model.tiny import build_family

    model = build_family("qwen2", tmp_path / "qwen2")
    root = Path(__file__).resolve().parent.parent
    overrides = {"model.path": str(model), "task.max_turn_tokens": 6, "task.max_turns": 2, "worker.group_size": 2}
    cfg = load_config(root / "configs/tools.yaml", overrides)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'

    class Calling(ToolEnv):
        def step(self, text: str) -> tuple[list[dict[str, Any]], float, bool]:
            return super().step(text + call)

    engine = build.engine(cfg, model)
    own = engine.turns.engine.model.state_dict()  # type: ignore[attr-defined]  # tied: no lm_head in the file
    engine.load_weights(0, {k: v.clone() for k, v in own.items()})
    engine.factory = lambda: Calling([BUILTIN_TOOLS["calculator"]], lambda p, r, a: 1.0)  # type: ignore[attr-defined]

    (group,) = engine.generate(build.task(cfg).prompts_for_epoch(0, 1), 2)
    assert "<|im_start|>user" in engine.renderer.tok.decode(group.prompt_ids)  # type: ignore[attr-defined]
    assert "calculator" in engine.renderer.tok.decode(group.prompt_ids)  # the tools' schemas are shown
    for s in group.samples:
        mask = s.loss_mask or []
        env_ids = [t for t, m in zip(s.token_ids, mask, strict=True) if m == 0]
        assert "<|im_start|>tool\n42<|im_end|>" in engine.renderer.tok.decode(env_ids)  # type: ignore[attr-defined]
        assert len(s.logprobs) == sum(mask) and not s.finished  # max_turns reached: not done

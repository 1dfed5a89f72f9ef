"""Which environment a run's episodes play, from the `task` section (multi-turn runs only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prl_actors.envs_llm.calculator import BUILTIN_TOOLS
from prl_actors.envs_llm.guess import GuessEnv
from prl_actors.envs_llm.tools import Tool, ToolEnv, tool
from prl_actors.plugins import load_callable
from prl_actors.sections import ConfigError

if TYPE_CHECKING:
    from prl_actors.envs_llm.base import EnvFactory
    from prl_actors.tasks.config import TaskSection

RESET_TIMEOUT_S = 30.0  # episode_prompt_ids: an environment's factory + reset at most


def load_object(spec: str, option: str) -> Any:
    """Import `module:name`; any failure is a one-line ConfigError naming `option`."""
    return load_callable(spec, option, "'module:name'")


def load_tools(specs: list[str]) -> list[Tool]:
    """The `task.tools`: built-in names or module:function (a Tool, or a function given a schema here)."""
    tools = []
    for spec in specs:
        if spec in BUILTIN_TOOLS:
            tools.append(BUILTIN_TOOLS[spec])
            continue
        if ":" not in spec:
            raise ConfigError(
                f"task.tools: unknown tool {spec!r} (built-in: {', '.join(BUILTIN_TOOLS)}; or module:function)"
            )
        obj = load_object(spec, "task.tools")
        tools.append(obj if isinstance(obj, Tool) else tool(obj))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ConfigError(f"task.tools: two tools share a name ({names})")
    return tools


def env_factory(t: TaskSection, reward: Callable[[str, str, str], float]) -> EnvFactory:
    """A new environment per call, for the run's kind of episode (`reward`: the task's, for tools)."""
    if t.name == "guess":
        return lambda: GuessEnv(t.guess_max, t.max_turns)
    if t.tools:
        tools = load_tools(t.tools)
        return lambda: ToolEnv(tools, reward, t.system_prompt)
    if t.environment:
        factory: EnvFactory = load_object(t.environment, "task.environment")
        return factory
    raise ConfigError("not a multi-turn task (set task.environment or task.tools, or use the guess task)")


def tool_schemas(t: TaskSection) -> list[dict[str, Any]]:
    """The JSON schemas the chat template shows the model (empty without `task.tools`)."""
    return [x.schema for x in load_tools(t.tools)] if t.tools else []


def episode_prompt_ids(
    t: TaskSection, tokenizer: Any, reward: Callable[[str, str, str], float], timeout_s: float = RESET_TIMEOUT_S
) -> Callable[[Any], list[int]]:
    """row (a Prompt) -> the token ids of its episodes' shared initial prompt, exactly as the
    multi-turn engine renders them (a fresh environment's `reset`, then the Renderer): what the
    buffer checks a group's prompt_ids against. The factory and `reset` (user code) run on a daemon
    thread under `timeout_s`, so a reset that hangs cannot hold the caller (the buffer); after one
    such hang every later call fails at once. A reset that raises or hangs is an EnvError."""
    from prl_actors.envs_llm.base import EnvError, reset_messages
    from prl_actors.envs_llm.pool import DaemonPool
    from prl_actors.envs_llm.render import Renderer

    renderer = Renderer(tokenizer, t.chat_template, tool_schemas(t))
    factory = env_factory(t, reward)
    pool = DaemonPool(1, "env-reset")
    hung: list[str] = []

    def ids(row: Any) -> list[int]:
        if hung:
            raise EnvError(hung[0])
        future = pool.submit(lambda: reset_messages(factory(), row))
        try:
            messages = future.result(timeout=timeout_s)
        except TimeoutError:
            hung.append(f"environment factory or reset did not return within {timeout_s:g}s")
            raise EnvError(hung[0]) from None
        except EnvError:
            raise
        except Exception as exc:  # noqa: BLE001 - a plugin's reset may raise anything
            raise EnvError(f"environment factory or reset raised {type(exc).__name__}: {exc}") from exc
        return renderer.initial(messages)  # the tokenizer in the caller's thread only

    return ids

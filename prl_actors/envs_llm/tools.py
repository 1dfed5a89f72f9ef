"""Tool calling (docs/TASKS.md, "Writing a tool"): tools are Python functions with a JSON schema;
the model calls them in the Qwen / Hermes chat-template format

    <tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}</tool_call>

and each result comes back as a `{"role": "tool", "name": ..., "content": ...}` message.

`ToolEnv` turns any single-turn task into a multi-turn one: the model may call tools for up to
`task.max_turns - 1` turns; its first turn without a tool call is its answer, scored by the task's
reward (done). A malformed call, an unknown tool or a tool that raises gives an error message back as
the tool's result (the model sees it and may try again), never a crash: the tool's text is data.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prl_actors.envs_llm.base import Message, resolve
from prl_actors.protocol.messages import Prompt

CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
MAX_RESULT_CHARS = 2000  # a tool's answer is cut to this (the context is the model's, not the tool's)
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


@dataclass
class Tool:
    """A callable with its OpenAI-style function schema ({"type": "function", "function": {...}})."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]

    def __call__(self, arguments: dict[str, Any]) -> str:
        return str(resolve(self.fn(**arguments)))


def tool(fn: Callable[..., Any], schema: dict[str, Any] | None = None) -> Tool:
    """A Tool from a function: its schema from the signature's annotations (int, float, str, bool,
    list, dict) and the docstring's first line, unless `schema` (the "function" part) is given."""
    if schema is None:
        sig = inspect.signature(fn)
        props = {
            name: {"type": _JSON_TYPES.get(p.annotation if isinstance(p.annotation, type) else str, "string")}
            for name, p in sig.parameters.items()
        }
        required = [n for n, p in sig.parameters.items() if p.default is inspect.Parameter.empty]
        doc = (inspect.getdoc(fn) or "").split("\n")[0]
        schema = {
            "name": fn.__name__,
            "description": doc,
            "parameters": {"type": "object", "properties": props, "required": required},
        }
    return Tool(str(schema["name"]), fn, {"type": "function", "function": schema})


def parse_tool_calls(text: str) -> list[tuple[str, dict[str, Any]] | str]:
    """Every <tool_call> of `text`, in order: (name, arguments), or an error string for a call that
    is not {"name": str, "arguments": object} JSON."""
    calls: list[tuple[str, dict[str, Any]] | str] = []
    for body in CALL.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(f"error: the tool call is not JSON ({exc.msg})")
            continue
        args = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(args, str):  # some templates serialise the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(args, dict):
            calls.append('error: a tool call must be {"name": ..., "arguments": {...}}')
            continue
        calls.append((call["name"], args))
    return calls


def run_calls(text: str, tools: dict[str, Tool]) -> list[Message]:
    """The tool messages answering every call in `text` (empty: the turn called no tool)."""
    out: list[Message] = []
    for call in parse_tool_calls(text):
        if isinstance(call, str):
            out.append({"role": "tool", "name": "error", "content": call})
            continue
        name, args = call
        out.append({"role": "tool", "name": name, "content": _call(tools, name, args)[:MAX_RESULT_CHARS]})
    return out


def _call(tools: dict[str, Tool], name: str, args: dict[str, Any]) -> str:
    if name not in tools:
        return f"error: unknown tool {name!r} (tools: {', '.join(sorted(tools))})"
    try:
        return tools[name](args)
    except Exception as exc:  # a tool's failure is the model's information, not the run's
        return f"error: {type(exc).__name__}: {exc}"


class ToolEnv:
    """A single-turn task with tools: tool calls are answered, the first turn without one is scored."""

    def __init__(self, tools: list[Tool], reward: Callable[[str, str, str], float], system: str | None = None):
        self.tools = {t.name: t for t in tools}
        self.reward, self.system = reward, system
        self.row: Prompt | None = None

    def reset(self, row: Prompt) -> list[Message]:
        self.row = row
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": row.prompt}]

    def step(self, text: str) -> tuple[list[Message], float, bool]:
        results = run_calls(text, self.tools)
        if results:
            return results, 0.0, False
        assert self.row is not None, "step before reset"
        return [], float(self.reward(self.row.prompt, text, self.row.answer)), True

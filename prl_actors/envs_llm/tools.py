"""Tool calling (docs/TASKS.md, "Writing a tool"): tools are Python functions with a JSON schema;
the model calls them in the Qwen / Hermes chat-template format

    <tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}</tool_call>

and each result comes back as a `{"role": "tool", "name": ..., "content": ...}` message.

`ToolEnv` turns any single-turn task into a multi-turn one: the model may call tools for up to
`task.max_turns - 1` turns; its first turn without a tool call is its answer, scored by the task's
reward (done). A malformed call (not JSON, too long, nested too deep, too many), an unknown tool or a
tool that raises anything gives an error message back as the tool's result (the model sees it and
may try again), never a failed group or run: the model's text is data. Every result is bounded
(MAX_RESULT_CHARS) and valid UTF-8 (lone surrogates replaced), so the renderer can tokenise it.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prl_actors.envs_llm.base import Message, resolve

if TYPE_CHECKING:
    from prl_actors.protocol.messages import Prompt

CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
MAX_RESULT_CHARS = 2000  # a tool's answer is cut to this (the context is the model's, not the tool's)
MAX_CALLS = 8  # tool calls answered per turn; more get one error message
MAX_CALL_CHARS = 16_000  # one <tool_call> body at most (a turn is bounded by max_turn_tokens anyway)
MAX_DEPTH = 32  # bracket nesting of a call: the JSON parser recurses (1000 levels raise RecursionError)
MAX_NAME_CHARS = 64
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


@dataclass
class Tool:
    """A callable with its OpenAI-style function schema ({"type": "function", "function": {...}})."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]

    def __call__(self, arguments: dict[str, Any]) -> str:
        return str(resolve(self.fn(**arguments)))  # str() of a huge int may raise too: the caller catches it


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
    """Every <tool_call> of `text`, in order (at most MAX_CALLS): (name, arguments), or an error
    string for a call that is not {"name": str, "arguments": object} JSON within the bounds (size,
    nesting depth). Never raises: whatever the model wrote is data."""
    calls: list[tuple[str, dict[str, Any]] | str] = []
    for n, body in enumerate(CALL.findall(text)):
        if n == MAX_CALLS:
            calls.append(f"error: at most {MAX_CALLS} tool calls per turn (the rest were not run)")
            break
        try:
            calls.append(_parse_call(body))
        except Exception as exc:  # noqa: BLE001 - a parser failure of any kind is the model's error
            calls.append(f"error: the tool call could not be read ({type(exc).__name__})")
    return calls


def _parse_call(body: str) -> tuple[str, dict[str, Any]] | str:
    if len(body) > MAX_CALL_CHARS:
        return f"error: a tool call longer than {MAX_CALL_CHARS} characters"
    if _depth(body) > MAX_DEPTH:
        return f"error: a tool call nested deeper than {MAX_DEPTH} levels"
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"error: the tool call is not JSON ({exc.msg})"
    args = call.get("arguments", {}) if isinstance(call, dict) else None
    if isinstance(args, str):  # some templates serialise the arguments as a JSON string
        try:
            args = json.loads(args) if _depth(args) <= MAX_DEPTH else None
        except json.JSONDecodeError:
            args = None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(args, dict):
        return 'error: a tool call must be {"name": ..., "arguments": {...}}'
    return call["name"], args


def _depth(text: str) -> int:
    """The deepest bracket nesting of JSON `text` (brackets inside strings count too: an upper
    bound, enough to refuse a call before the recursive parser sees it)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def clean(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """`text` cut to `limit` characters with lone surrogates replaced (a tokenizer cannot encode them)."""
    return text[:limit].encode("utf-8", "replace").decode("utf-8")


def run_calls(text: str, tools: dict[str, Tool]) -> list[Message]:
    """The tool messages answering every call in `text` (empty: the turn called no tool). Never
    raises; every content is clean and bounded."""
    return [message for message, _ in answer_calls(text, tools)]


def answer_calls(text: str, tools: dict[str, Tool]) -> list[tuple[Message, bool]]:
    """run_calls, each message with whether the call failed (malformed, unknown tool, the tool raised)."""
    out: list[tuple[Message, bool]] = []
    for call in parse_tool_calls(text):
        if isinstance(call, str):
            out.append(({"role": "tool", "name": "error", "content": call}, True))
            continue
        name, args = call
        content, failed = _call(tools, name, args)
        out.append(({"role": "tool", "name": clean(name, MAX_NAME_CHARS), "content": clean(content)}, failed))
    return out


def _call(tools: dict[str, Tool], name: str, args: dict[str, Any]) -> tuple[str, bool]:
    if name not in tools:
        return f"error: unknown tool {clean(name, MAX_NAME_CHARS)!r} (tools: {', '.join(sorted(tools))})", True
    try:
        return tools[name](args), False
    except BaseException as exc:  # noqa: BLE001 - a tool's failure (SystemExit too) is the model's information
        return f"error: {type(exc).__name__}: {_text(exc)}", True


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - an exception whose str() raises still has a type
        return "(unprintable)"


class ToolEnv:
    """A single-turn task with tools: tool calls are answered, the first turn without one is scored.
    `tool_calls` / `tool_errors` count the episode's calls and failed calls (the engine reports them:
    Sample.episode, the trainer's episode/* metrics)."""

    def __init__(self, tools: list[Tool], reward: Callable[[str, str, str], float], system: str | None = None):
        self.tools = {t.name: t for t in tools}
        self.reward, self.system = reward, system
        self.row: Prompt | None = None
        self.tool_calls = self.tool_errors = 0

    def reset(self, row: Prompt) -> list[Message]:
        self.row = row
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": row.prompt}]

    def step(self, text: str) -> tuple[list[Message], Any, bool]:
        answered = answer_calls(text, self.tools)
        if answered:
            self.tool_calls += len(answered)
            self.tool_errors += sum(failed for _, failed in answered)
            return [message for message, _ in answered], 0.0, False
        assert self.row is not None, "step before reset"
        return [], self.reward(self.row.prompt, text, self.row.answer), True  # a real number: step_result checks

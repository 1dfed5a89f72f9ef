"""The shipped `calculator` tool: arithmetic on numbers (+ - * / // % **, parentheses, unary minus),
evaluated on the parsed syntax tree (never `eval`), with bounded operands and exponents."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from prl_actors.envs_llm.tools import Tool, tool

MAX_CHARS, MAX_ABS, MAX_POW = 200, 1e15, 64
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. 3*(4+5)/2."""
    if len(expression) > MAX_CHARS:
        raise ValueError(f"expression longer than {MAX_CHARS} characters")
    value = _eval(ast.parse(expression.strip(), mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_POW:
            raise ValueError(f"exponent larger than {MAX_POW}")
        return _bounded(_BINARY[type(node.op)](left, right))
    raise ValueError("only numbers, + - * / // % ** and parentheses")


def _bounded(v: int | float) -> int | float:
    if abs(v) > MAX_ABS:
        raise ValueError("number too large")
    return v


BUILTIN_TOOLS: dict[str, Tool] = {"calculator": tool(calculator)}

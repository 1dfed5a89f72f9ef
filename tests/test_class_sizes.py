"""No class in prl_actors/ has more than MAX_METHODS methods (issue 41 item 3): a big core is split
into plain parts it owns (see prl_actors/coordinator/ and prl_actors/runtime/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

MAX_METHODS = 30
ROOT = Path(__file__).resolve().parent.parent / "prl_actors"


def class_sizes() -> list[tuple[int, str]]:
    """(methods, 'path:Class') for every class in prl_actors/, counting the defs in its body."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                n = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                out.append((n, f"{path.relative_to(ROOT.parent)}:{node.name}"))
    return out


def test_class_sizes_are_counted() -> None:
    sizes = dict((name, n) for n, name in class_sizes())
    assert sizes["prl_actors/coordinator/core.py:CoordinatorCore"] <= MAX_METHODS
    assert sizes["prl_actors/runtime/core.py:Core"] <= MAX_METHODS
    assert sizes["prl_actors/worker/core.py:WorkerCore"] <= MAX_METHODS


def test_no_class_has_more_than_max_methods() -> None:
    over = sorted((f"{name} ({n})" for n, name in class_sizes() if n > MAX_METHODS))
    assert not over, f"classes with more than {MAX_METHODS} methods: {', '.join(over)}"
